"""`python -m cegppo_trl.quickstart`: see `cegppo_trl.quickstart.run.main`."""

import psutil

from .run import main

if __name__ == "__main__":
    main(started_at=psutil.Process().create_time())  # the wall time reported includes the imports
