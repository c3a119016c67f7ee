"""CE-GPPO for TRL: gradient-preserving clipping policy optimization (Su et al., ACL 2026, arXiv:2509.20712)."""

from .config import CEGPPOConfig
from .loss import cegppo_per_token_loss, cegppo_regions
from .trainer import CEGPPOTrainer

__version__ = "0.1.0"

__all__ = ["CEGPPOConfig", "CEGPPOTrainer", "cegppo_per_token_loss", "cegppo_regions", "__version__"]
