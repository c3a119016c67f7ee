"""Noise a CE-GPPO run would print that the user can do nothing about, kept out of the output.

Each item is narrow (one message, one place) and leaves every other warning, TRL's own included, as it is:

- DeepSpeed's "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." on
  runs that do not use DeepSpeed: accelerate's `extract_model_from_parallel` (every `unwrap_model`, so every
  generation and save) imports `deepspeed` whenever it is installed, and DeepSpeed's accelerator detection logs the
  line on a machine without a GPU. When DeepSpeed does run, the line stays: it says which device DeepSpeed chose.
- transformers' FutureWarnings for the deprecated `is_gradient_checkpointing`, `gradient_checkpointing_disable` and
  `gradient_checkpointing_enable`, which TRL 1.16 calls around every generation (`trl.models.utils`); they were
  printed into the progress bar's line at the first step.
- The package's own warnings during training (zero learning signal, drift, unscorable batches): with no logging
  configured, Python prints them through its last-resort handler into the progress bar's line; a command-line run
  sends them through `tqdm.write` instead, which prints them on a line of their own above the bar.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator

__all__ = ["DEEPSPEED_CPU_NOTICE", "log_above_progress_bars", "quiet_unused_deepspeed", "trl_deprecated_model_calls"]

DEEPSPEED_CPU_NOTICE = "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it."
_DEPRECATED_MODEL_CALLS = r"`(is_gradient_checkpointing|gradient_checkpointing_(enable|disable))` is deprecated"


class _DropDeepSpeedCpuNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != DEEPSPEED_CPU_NOTICE


def quiet_unused_deepspeed() -> None:
    """Drop DeepSpeed's CPU-detection notice for the rest of the process (call it when DeepSpeed will not run).

    A filter on DeepSpeed's logger (`"DeepSpeed"`), which survives DeepSpeed's own set-up of that logger when it
    is imported later; installed once however often it is called.
    """
    deepspeed_logger = logging.getLogger("DeepSpeed")
    if not any(isinstance(f, _DropDeepSpeedCpuNotice) for f in deepspeed_logger.filters):
        deepspeed_logger.addFilter(_DropDeepSpeedCpuNotice())


@contextlib.contextmanager
def trl_deprecated_model_calls() -> Iterator[None]:
    """Within the block, transformers' deprecation warnings for the three `*gradient_checkpointing*` model methods
    TRL calls are not shown (other warnings are)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_DEPRECATED_MODEL_CALLS, category=FutureWarning)
        yield


class _TqdmWriteHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:  # a broken stream must not stop training; logging's own rule
            self.handleError(record)


def log_above_progress_bars() -> None:
    """Print the package's warnings on lines of their own above a progress bar, where nothing else is configured.

    Only when neither the package's logger nor the root logger has a handler, i.e. when Python would fall back to
    its last-resort handler (same level and bare message); a user's own logging set-up is left as it is.
    """
    package_logger = logging.getLogger("cegppo_trl")
    if package_logger.handlers or logging.getLogger().handlers:
        return
    handler = _TqdmWriteHandler(level=logging.WARNING)
    handler.setFormatter(logging.Formatter("%(message)s"))
    package_logger.addHandler(handler)
