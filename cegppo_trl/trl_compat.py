"""The TRL releases CE-GPPO trains on, and the one refusal the pin cannot express.

The pin is pyproject.toml's; tests/test_trl_seam.py holds it to `TESTED_TRL` and `GPU_ONLY_LOG_PROBS`. The private TRL
names the trainer touches are listed in docs/maintaining.md, each held by a test there.
"""

from __future__ import annotations

from typing import Any

import trl
from packaging.version import Version

TESTED_TRL = ("1.10.0", "1.16.0")  # the pin's ends, the releases CI runs (.ci/trl_oldest.sh, the main suite)
GPU_ONLY_LOG_PROBS = "1.15"  # left out of the pin: it computes every log-probability with a triton kernel (no CPU)
LIGER_FUSED_LOSS_BEFORE = "1.14.0"  # before it, `compute_loss` sends `use_liger_kernel` to Liger's fused GRPO loss


def check_trl_compatibility(args: Any) -> None:
    """Raise `ValueError` before the model loads where the installed TRL would train `args` as plain GRPO: Liger's
    fused GRPO loss never calls the `_compute_loss` the trainer hooks into."""
    if getattr(args, "use_liger_kernel", False) and Version(trl.__version__) < Version(LIGER_FUSED_LOSS_BEFORE):
        raise ValueError(
            f"`use_liger_kernel=True` with trl {trl.__version__}: before trl {LIGER_FUSED_LOSS_BEFORE}, "
            "`GRPOTrainer.compute_loss` sends it to Liger's fused GRPO loss, which never calls the CE-GPPO loss and "
            f"would train plain GRPO. Set `use_liger_kernel=False`, or install trl>={LIGER_FUSED_LOSS_BEFORE}."
        )
