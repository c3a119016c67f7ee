"""Quickstart: watch CE-GPPO improve a small model on CPU in a couple of minutes (`python -m cegppo_trl.quickstart`).

The demo script is `run.py`; the models, tasks and run harness it uses are in `cegppo_trl.offline`.
"""

from .run import main

__all__ = ["main"]
