"""A resumed DeepSpeed or FSDP run reads its checkpoint as data: `torch.load(weights_only=True)` and an allowlist.

transformers reads its own checkpoint files weights-only, but hands a DeepSpeed resume (and the best model of
`load_best_model_at_end`, which a resumed `trainer_state.json` names) to DeepSpeed 0.19, which reads every file with
`torch.load(weights_only=False)`: unpickling runs whatever code the file names. Within `safe_resume_loads(folder)`:
DeepSpeed's `TorchCheckpointEngine.load` accepts tensors, plain containers and exactly the classes of
`DEEPSPEED_CHECKPOINT_GLOBALS`; torch's `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` makes every other load weights-only; a
torch distributed checkpoint (FSDP `SHARDED_STATE_DICT`), whose `.metadata` index is a plain pickle, is refused.
`CEGPPO_TRUST_CHECKPOINT_PICKLES=1` turns it off, for a checkpoint you wrote yourself.
"""

from __future__ import annotations

import contextlib
import glob
import importlib
import os
import pickle
import re
from collections.abc import Iterator
from typing import Any

import torch

TRUST_ENV = "CEGPPO_TRUST_CHECKPOINT_PICKLES"
_FORCE, _NO_FORCE = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
# What DeepSpeed pickles into its ZeRO checkpoints (`torch.serialization.get_unsafe_globals_in_checkpoint` on those of
# tests/helpers/mp_train.py), each rebuilt from its fields without calling a method of it
DEEPSPEED_CHECKPOINT_GLOBALS: dict[str, str] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": "bf16/fp32 loss scale: `cur_scale`, `dynamic`",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": "fp16's dynamic loss scale: numbers and a dtype",
    "deepspeed.runtime.zero.config.ZeroStageEnum": "the ZeRO stage, an int enum",
    "deepspeed.utils.tensor_fragment.fragment_address": "a parameter's place in a flat partition: two ints",
}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file needs a global outside the allowlist to be unpickled: loading it could run code."""


def allowed_globals() -> list[Any]:
    """The classes of `DEEPSPEED_CHECKPOINT_GLOBALS` (DeepSpeed must be installed)."""
    names = (name.rpartition(".") for name in DEEPSPEED_CHECKPOINT_GLOBALS)
    return [getattr(importlib.import_module(module), attribute) for module, _, attribute in names]


def refusal_message(path: object, error: BaseException) -> str:
    """Why `path` is refused: the globals it needs beyond the allowlist (or torch's reason), and the way out."""
    unsafe = re.findall(r"GLOBAL (\S+) was not an allowed global", str(error)) or str(error).strip().splitlines()[:1]
    return (
        f"Refusing to load {path}: unpickling it needs {', '.join(unsafe)}, which is not among the classes DeepSpeed's "
        f"own checkpoints hold ({', '.join(DEEPSPEED_CHECKPOINT_GLOBALS)}). Unpickling a global can run arbitrary code, "
        "so a checkpoint that needs one may have been tampered with or written by other code. Resume only checkpoints "
        f"you trust; to resume this one anyway because you wrote it yourself, set {TRUST_ENV}=1."
    )


def load_checkpoint_file(path: str, map_location: Any = None) -> Any:
    """`torch.load(path, weights_only=True)` accepting exactly DeepSpeed's checkpoint classes.

    Raises:
        UnsafeCheckpointError: the file needs any other global, naming it, the file and the way out.
    """
    with torch.serialization.safe_globals(allowed_globals()):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            raise UnsafeCheckpointError(refusal_message(path, error)) from error


@contextlib.contextmanager
def safe_resume_loads(checkpoint: str | None) -> Iterator[None]:
    """Every `torch.load` reads data only while reading `checkpoint` (the module's rules); a no-op for None.

    Raises:
        UnsafeCheckpointError: a file needs a global outside the allowlist, or the checkpoint has a pickled
            distributed-checkpoint index (`*/.metadata`).
    """
    if checkpoint is None or os.environ.get(TRUST_ENV) == "1":
        yield
        return
    if index := sorted(glob.glob(os.path.join(glob.escape(checkpoint), "*", ".metadata"))):
        raise UnsafeCheckpointError(
            f"Refusing to load {checkpoint}: {', '.join(index)} is the index of a torch distributed checkpoint (FSDP "
            "`SHARDED_STATE_DICT`), which torch reads with plain `pickle.load`: a tampered file would run code. Save "
            "with `fsdp_state_dict_type: FULL_STATE_DICT` (as the shipped accelerate_configs/fsdp2.yaml does), or, for "
            f"a checkpoint you wrote yourself, set {TRUST_ENV}=1."
        )
    try:
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine as Engine
    except ImportError:  # without DeepSpeed there is no DeepSpeed checkpoint to read
        Engine = None
    saved = {name: os.environ.pop(name, None) for name in (_FORCE, _NO_FORCE)}  # torch refuses both set at once
    original, os.environ[_FORCE] = Engine and Engine.load, "1"
    if Engine is not None:
        Engine.load = lambda self, path, map_location=None: load_checkpoint_file(path, map_location)
    try:
        with torch.serialization.safe_globals(allowed_globals() if Engine is not None else []):
            yield
    except pickle.UnpicklingError as error:  # a load outside the engine (torch's message names the global)
        if isinstance(error, UnsafeCheckpointError):
            raise
        raise UnsafeCheckpointError(refusal_message(checkpoint, error)) from error
    finally:
        if Engine is not None:
            Engine.load = original
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
