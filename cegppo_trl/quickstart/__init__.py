"""Quickstart: watch CE-GPPO improve a small model on CPU in a couple of minutes (`python -m cegppo_trl.quickstart`).

The demo script is `run.py`; the models, tasks and run harness it uses are in `cegppo_trl.offline`.
"""

import time

# When the quickstart started (before its imports): the summary's "total wall time" counts from here. Not the
# process's creation time: `bash -c "pip install ... && python -m cegppo_trl.quickstart"` execs python in the shell's
# own process, whose creation time is before the install.
STARTED_AT = time.time()

from .run import main  # noqa: E402

__all__ = ["STARTED_AT", "main"]
