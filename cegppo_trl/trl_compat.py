"""What a TRL release must be for CE-GPPO to train on it, and the one refusal a user needs.

The trainer adds a term to what TRL's `GRPOTrainer._compute_loss` returns (`cegppo_trl.trainer`). The private names
the seam touches are listed in docs/maintaining.md and held by tests/test_trl_seam.py. Before TRL 1.14,
`use_liger_kernel=True` sends the loss to Liger's fused GRPO loss, which never calls `_compute_loss`: plain GRPO under
the CE-GPPO name, refused before the model loads.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

TESTED_TRL = ("1.10.0", "1.16.0")  # the releases CI runs (.ci/trl_oldest.sh, main suite): the pin's ends
GPU_ONLY_LOG_PROBS = "1.15"  # TRL 1.15 computes every log-probability with a triton kernel: no CPU run
LIGER_FUSED_LOSS_BEFORE = "1.14.0"  # before it, `compute_loss` sends `use_liger_kernel` to Liger's fused GRPO loss


def supported_trl_requirement() -> str:
    """The `pip install` requirement for a supported TRL: the package's own pin (pyproject.toml, the one place it is
    stated), read from the installed package's metadata; plain "trl" for a source tree that is not installed."""
    from importlib.metadata import PackageNotFoundError, requires

    from packaging.requirements import Requirement

    try:
        pins = [r for r in map(Requirement, requires("cegppo-trl") or ()) if r.name == "trl" and r.marker is None]
    except PackageNotFoundError:
        pins = []
    return f"trl{pins[0].specifier}" if pins else "trl"


def liger_bypass(args: Any) -> str | None:
    """Why `use_liger_kernel` would train plain GRPO on the installed TRL (its fused loss skips `_compute_loss`)."""
    import trl

    if getattr(args, "use_liger_kernel", False) and Version(trl.__version__) < Version(LIGER_FUSED_LOSS_BEFORE):
        return (
            f"`use_liger_kernel=True` with trl {trl.__version__}: before trl {LIGER_FUSED_LOSS_BEFORE}, "
            "`GRPOTrainer.compute_loss` sends it to Liger's fused GRPO loss, which never calls the CE-GPPO loss and "
            f"would train plain GRPO. Set `use_liger_kernel=False`, or install trl>={LIGER_FUSED_LOSS_BEFORE}."
        )
    return None


def check_trl_compatibility(args: Any = None) -> None:
    """Raise `ValueError` before the model loads where the installed TRL cannot train `args` with CE-GPPO."""
    refusal = None if args is None else liger_bypass(args)
    if refusal is not None:
        raise ValueError(refusal)
