"""`python -m cegppo_trl.quickstart`: see `cegppo_trl.quickstart.run.main`."""

from . import STARTED_AT
from .run import main

if __name__ == "__main__":
    main(started_at=STARTED_AT)  # the wall time reported includes the quickstart's imports, not what ran before it
