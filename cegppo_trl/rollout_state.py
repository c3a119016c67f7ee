"""The rollout batch a checkpoint falls inside, which TRL keeps only in memory: its buffered micro-batches
(`_buffered_inputs`) and counter (`_step`), saved by each process with the batch layout (`rollout_batch_<rank>.pt`)
and read back weights-only. A value torch cannot read so is named in `unsaved` instead of any micro-batch saved.
"""

from __future__ import annotations

import os
from typing import Any

import torch

ROLLOUT_BATCH_FORMAT = 2  # 1: cegppo-trl 0.5's `rollout_batch_<rank>.safetensors`, not read


class RolloutBatchError(ValueError):
    """A rollout-batch file that is not one this module wrote: nothing of it is used."""


def rollout_batch_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rollout_batch_{rank}.pt")


def _plain(value: Any) -> bool:  # what `torch.load(weights_only=True)` reads back
    return value is None or isinstance(value, (torch.Tensor, bool, int, float, str)) or (
        isinstance(value, (list, tuple)) and all(map(_plain, value)))  # fmt: skip


def save_rollout_batch(path: str, micro_batches: list[dict[str, Any]], step: int, layout: dict[str, Any]) -> None:
    """TRL's `_buffered_inputs`, its counter `step` and `layout` to `path` (by rename: a kill leaves no such file)."""
    unsaved = sorted({f"{k} ({type(v).__name__})" for b in micro_batches for k, v in b.items() if not _plain(v)})
    record = {"format": ROLLOUT_BATCH_FORMAT, "step": step, "layout": layout, "unsaved": unsaved,
              "micro_batches": [] if unsaved else micro_batches}  # fmt: skip
    torch.save(record, tmp := f"{path}.{os.getpid()}.tmp")
    os.replace(tmp, path)


def load_rollout_batch(path: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The record `save_rollout_batch` wrote to `path`, its tensors on `device`; `RolloutBatchError` for any other
    file (read weights-only: a pickle naming code is refused, not run)."""
    try:
        cpu = torch.device(device).type == "cpu"  # torch knows no "cpu:0", a DDP process's device on CPU
        record = torch.load(path, map_location="cpu" if cpu else device, weights_only=True)
        if record["format"] != ROLLOUT_BATCH_FORMAT or not isinstance(record["layout"], dict) or not all(
                isinstance(batch, dict) for batch in record["micro_batches"]):  # fmt: skip
            raise ValueError(f"its record is not format {ROLLOUT_BATCH_FORMAT}'s")
    except Exception as error:
        raise RolloutBatchError(f"{path} is not a rollout batch cegppo-trl wrote ({type(error).__name__}), so nothing "
                                "of it was used or run. Resume an earlier checkpoint of the run, or this one from a "
                                "copy of the checkpoint as it was saved.") from error  # fmt: skip
    return record
