"""The rollout batch a checkpoint falls inside, which TRL keeps only in memory, saved with it as data.

TRL generates a rollout batch every `steps_per_generation * num_iterations` micro-batches (its counter `_step`) and
serves the buffered micro-batches (`_buffered_inputs`) in between. Each process saves them as
`rollout_batch_<rank>.safetensors`: the tensors (a list of ints as one), and as JSON metadata TRL's counter, the batch
layout and each value's kind; a value of another kind is named in `unsaved` instead, and no micro-batch is saved.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

ROLLOUT_BATCH_FORMAT = 1
_METADATA_KEY = "cegppo_rollout_batch"


class RolloutBatchError(ValueError):
    """A rollout-batch file that is not one this module wrote: nothing of it is used."""


def rollout_batch_file(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rollout_batch_{rank}.safetensors")


def save_rollout_batch(path: str, micro_batches: list[dict[str, Any]], step: int, layout: dict[str, Any]) -> None:
    """TRL's `_buffered_inputs`, its counter `step` and `layout` to `path` (by rename: a kill leaves no such file)."""
    tensors, kinds, unsaved = {}, [], set()
    for i, batch in enumerate(micro_batches):
        kinds.append({})
        for key, value in batch.items():
            name, parts = f"{i}/{key}", {}
            if value is None:
                kinds[i][key] = "none"
            elif isinstance(value, torch.Tensor):
                kinds[i][key], parts = "tensor", {name: value}
            elif isinstance(value, list) and all(type(v) is int for v in value):
                kinds[i][key], parts = "ints", {name: torch.tensor(value, dtype=torch.int64)}
            elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
                kinds[i][key], parts = f"tensors:{len(value)}", {f"{name}/{j}": v for j, v in enumerate(value)}
            else:
                unsaved.add(f"{key} ({type(value).__name__})")
            # copies of their own: safetensors refuses tensors that share memory (the micro-batches are views)
            tensors.update({n: t.detach().to("cpu", copy=True).contiguous() for n, t in parts.items()})
    record = {"format": ROLLOUT_BATCH_FORMAT, "step": step, "layout": layout, "kinds": [] if unsaved else kinds,
              "unsaved": sorted(unsaved)}  # fmt: skip
    save_file({} if unsaved else tensors, tmp := f"{path}.{os.getpid()}.tmp", {_METADATA_KEY: json.dumps(record)})
    os.replace(tmp, path)


def load_rollout_batch(path: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The record `save_rollout_batch` wrote to `path` (`step`, `layout`, `unsaved`), its `micro_batches` rebuilt on
    `device`. Raises `RolloutBatchError` for a file that is not one (safetensors reads tensor bytes: no code runs)."""

    def value(i: int, key: str, kind: str) -> Any:
        name = f"{i}/{key}"
        if kind in ("none", "tensor", "ints"):
            return None if kind == "none" else tensors[name] if kind == "tensor" else tensors[name].tolist()
        return [tensors[f"{name}/{j}"] for j in range(int(kind.removeprefix("tensors:")))]

    try:
        with safe_open(path, framework="pt", device="cpu") as f:  # then moved (safetensors refuses e.g. "cpu:0")
            record = json.loads(f.metadata()[_METADATA_KEY])
            tensors = {name: f.get_tensor(name).to(device) for name in f.keys()}
        if record["format"] != ROLLOUT_BATCH_FORMAT:
            raise ValueError(f"format {record['format']!r}")
        record["micro_batches"] = [{k: value(i, k, kind) for k, kind in kinds.items()}
                                   for i, kinds in enumerate(record["kinds"])]  # fmt: skip
        record.update(step=int(record["step"]), layout=dict(record["layout"]), unsaved=[*map(str, record["unsaved"])])
    except Exception as error:  # safetensors' error types differ between releases; KeyError: a tensor missing
        raise RolloutBatchError(f"{path} is not a rollout batch cegppo-trl wrote ({type(error).__name__}: {error}), "
                                "so nothing of it was used or run. Resume an earlier checkpoint of the run, or this "
                                "one from a copy of the checkpoint as it was saved.") from None  # fmt: skip
    return record
