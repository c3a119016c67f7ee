"""`python -m cegppo_trl.quickstart`: see `cegppo_trl.quickstart.run.main`."""

from .run import main

if __name__ == "__main__":
    main()
