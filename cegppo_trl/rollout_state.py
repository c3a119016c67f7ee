"""The rollout batch a checkpoint falls inside, saved with it: what TRL keeps only in memory, as tensors.

TRL generates a rollout batch every `steps_per_generation * num_iterations` micro-batches (its counter `_step`) and
serves the buffered micro-batches (`_buffered_inputs`) in between; a checkpoint holds neither. The protocol:

1. Save. At a checkpoint inside a rollout batch each process writes `rollout_batch_<rank>.safetensors` before the
   commit: every tensor of every buffered micro-batch, and in the metadata (JSON) TRL's counter, the batch layout and
   the kind of each value. Values that are no tensor, None, list of ints or list of tensors (none in TRL 1.16's
   batch) cannot be saved: the file then names them instead, and a resume generates (rule 3).
2. Data only. The file is read with `safetensors` (tensor bytes and a JSON header: no code); a file that is not such
   a file, or does not describe the micro-batches it holds, is refused naming it.
3. Restore as saved or not at all. A file whose layout differs from the resumed run's is not used: TRL generates.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import torch

ROLLOUT_BATCH_FORMAT = 1
_METADATA_KEY = "cegppo_rollout_batch"


def rollout_batch_file(folder: str, rank: int) -> str:
    """The path of process `rank`'s rollout-batch file in checkpoint `folder`."""
    return os.path.join(folder, f"rollout_batch_{rank}.safetensors")


class RolloutBatchError(ValueError):
    """A rollout-batch file that is not one this module wrote (rule 2): nothing of it is used."""


@dataclass
class RolloutBatch:
    """What a rollout-batch file holds: TRL's counter, the buffered micro-batches, the layout, what rule 1 left out."""

    step: int
    layout: dict[str, Any]
    micro_batches: list[dict[str, Any]] = field(default_factory=list)
    unsaved: list[str] = field(default_factory=list)


def _encode(micro_batches: list[dict[str, Any]]) -> tuple[dict[str, torch.Tensor], list[dict[str, str]], list[str]]:
    tensors: dict[str, torch.Tensor] = {}
    kinds: list[dict[str, str]] = []
    unsaved: list[str] = []

    def put(name: str, value: torch.Tensor) -> None:
        # a copy of its own: safetensors refuses tensors that share memory (the micro-batches are views of one batch)
        tensors[name] = value.detach().to("cpu", copy=True).contiguous()

    for i, batch in enumerate(micro_batches):
        kind = {}
        for key, value in batch.items():
            if value is None:
                kind[key] = "none"
            elif isinstance(value, torch.Tensor):
                kind[key] = "tensor"
                put(f"{i}/{key}", value)
            elif isinstance(value, list) and all(type(v) is int for v in value):
                kind[key] = "ints"
                put(f"{i}/{key}", torch.tensor(value, dtype=torch.int64))
            elif isinstance(value, list) and all(isinstance(v, torch.Tensor) for v in value):
                kind[key] = f"tensors:{len(value)}"
                for j, v in enumerate(value):
                    put(f"{i}/{key}/{j}", v)
            else:
                unsaved.append(f"{key} ({type(value).__name__})")
        kinds.append(kind)
    return tensors, kinds, sorted(set(unsaved))


def save_rollout_batch(path: str, micro_batches: list[dict[str, Any]], step: int, layout: dict[str, Any]) -> None:
    """Rule 1: `micro_batches` (TRL's `_buffered_inputs`), the counter `step` and `layout` (JSON) to `path`, written
    under a temporary name and renamed (a process killed meanwhile leaves no file of that name)."""
    from safetensors.torch import save_file

    tensors, kinds, unsaved = _encode(micro_batches)
    record = {"format": ROLLOUT_BATCH_FORMAT, "step": step, "layout": layout, "kinds": kinds, "unsaved": unsaved}
    if unsaved:
        tensors, record["kinds"] = {}, []
    save_file(tensors, tmp := f"{path}.{os.getpid()}.tmp", metadata={_METADATA_KEY: json.dumps(record)})
    os.replace(tmp, path)


def load_rollout_batch(path: str, device: torch.device | str = "cpu") -> RolloutBatch:
    """Rule 2: the rollout batch of `path`, its tensors on `device`; `RolloutBatchError` for anything else."""
    from safetensors import safe_open

    def refuse(why: str) -> RolloutBatchError:
        return RolloutBatchError(
            f"{path} is not a rollout batch cegppo-trl wrote ({why}), so nothing of it was used or run. Resume an "
            "earlier checkpoint of the run, or this one from a copy of the checkpoint as it was saved."
        )

    try:
        with safe_open(path, framework="pt", device="cpu") as f:  # then moved (safetensors refuses e.g. "cpu:0")
            names = set(f.keys())
            metadata = f.metadata() or {}
            record = json.loads(metadata[_METADATA_KEY])
            tensors = {name: f.get_tensor(name) for name in names}
    except Exception as error:  # safetensors' own error types differ between releases
        raise refuse(f"not a safetensors file with its record: {type(error).__name__}: {error}") from None
    tensors = {name: tensor.to(device) for name, tensor in tensors.items()}
    types = {"step": int, "layout": dict, "kinds": list, "unsaved": list}
    if not isinstance(record, dict) or record.get("format") != ROLLOUT_BATCH_FORMAT or not all(
        type(record.get(key)) is kind for key, kind in types.items()
    ) or not all(isinstance(k, dict) for k in record["kinds"]):  # fmt: skip
        raise refuse(f"its record is not format {ROLLOUT_BATCH_FORMAT}'s")
    micro_batches, used = [], set()
    for i, kinds in enumerate(record["kinds"]):
        batch = {}
        for key, kind in kinds.items():
            kind = str(kind)
            if kind == "none":
                batch[key] = None
            elif kind in ("tensor", "ints") and (name := f"{i}/{key}") in tensors:
                batch[key] = tensors[name] if kind == "tensor" else tensors[name].tolist()
                used.add(name)
            elif kind.startswith("tensors:") and kind[8:].isdigit():
                parts = [f"{i}/{key}/{j}" for j in range(int(kind[8:]))]
                if not all(name in tensors for name in parts):
                    raise refuse(f"micro-batch {i} lacks a tensor of `{key}`")
                batch[key] = [tensors[name] for name in parts]
                used.update(parts)
            else:
                raise refuse(f"micro-batch {i}: `{key}` is {kind!r} without its tensor")
        micro_batches.append(batch)
    if used != names:
        raise refuse(f"tensors no micro-batch names: {sorted(names - used)[:3]}")
    return RolloutBatch(record["step"], record["layout"], micro_batches, [str(u) for u in record["unsaved"]])
