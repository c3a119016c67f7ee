"""CE-GPPO for TRL: gradient-preserving clipping policy optimization (Su et al., ACL 2026, arXiv:2509.20712)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.5.0"

# Imported on first use: `cegppo --help` and `cegppo rewards` must not pay for importing TRL and torch (~10 s).
_LAZY = dict(CEGPPOConfig=".config", CEGPPOTrainer=".trainer", cegppo_objective=".loss", cegppo_regions=".loss")
__all__ = ["CEGPPOConfig", "CEGPPOTrainer", "__version__", "cegppo_objective", "cegppo_regions"]

if TYPE_CHECKING:
    from .config import CEGPPOConfig
    from .loss import cegppo_objective, cegppo_regions
    from .trainer import CEGPPOTrainer


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return globals().setdefault(name, getattr(importlib.import_module(_LAZY[name], __name__), name))


def __dir__() -> list[str]:
    return sorted([*globals(), *_LAZY])
