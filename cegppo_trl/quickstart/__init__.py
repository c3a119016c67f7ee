"""Quickstart: watch CE-GPPO improve a small model on CPU in a couple of minutes (`python -m cegppo_trl.quickstart`)."""

from ..offline.runs import main

__all__ = ["main"]
