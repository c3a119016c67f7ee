"""A resumed DeepSpeed or FSDP run reads its checkpoint as data: every `torch.load` weights-only, with an allowlist.

transformers reads its own files weights-only, but DeepSpeed 0.19 unpickles every file it resumes (and the best
model's): a tampered file would run code. An FSDP `SHARDED_STATE_DICT` checkpoint, whose `.metadata` index torch reads
with plain `pickle.load`, is refused. `CEGPPO_TRUST_CHECKPOINT_PICKLES=1` turns both guards off.
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
# What DeepSpeed pickles into its ZeRO checkpoints (`torch.serialization.get_unsafe_globals_in_checkpoint`): a loss
# scale, the ZeRO stage (an int enum), a parameter's place in a flat partition; each rebuilt from its fields alone
DEEPSPEED_CHECKPOINT_GLOBALS = ("deepspeed.runtime.fp16.loss_scaler.LossScaler", "deepspeed.utils.tensor_fragment."
                                "fragment_address", "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
                                "deepspeed.runtime.zero.config.ZeroStageEnum")  # fmt: skip


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file needs a global outside the allowlist to be unpickled: loading it could run code."""


def _allowed() -> list[Any]:  # the classes of `DEEPSPEED_CHECKPOINT_GLOBALS` (DeepSpeed must be installed)
    names = (name.rpartition(".") for name in DEEPSPEED_CHECKPOINT_GLOBALS)
    return [getattr(importlib.import_module(module), attribute) for module, _, attribute in names]


def _refusal(path: object, error: BaseException) -> UnsafeCheckpointError:
    unsafe = re.findall(r"GLOBAL (\S+) was not an allowed global", str(error)) or str(error).strip().splitlines()[:1]
    return UnsafeCheckpointError(
        f"Refusing to load {path}: unpickling it needs {', '.join(unsafe)}, which is not among the classes DeepSpeed's "
        f"own checkpoints hold ({', '.join(DEEPSPEED_CHECKPOINT_GLOBALS)}), and could run any code. Resume checkpoints "
        f"you trust; for one you wrote yourself, set {TRUST_ENV}=1."
    )


def load_checkpoint_file(path: str, map_location: Any = None) -> Any:
    """`torch.load(path, weights_only=True)` allowing DeepSpeed's classes; `UnsafeCheckpointError` naming the file and
    the global for any other."""
    with torch.serialization.safe_globals(_allowed()):
        try:
            return torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as error:
            raise _refusal(path, error) from error


@contextlib.contextmanager
def safe_resume_loads(checkpoint: str | None) -> Iterator[None]:
    """Every `torch.load` weights-only (`TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`, DeepSpeed's classes allowed) while
    `checkpoint` is resumed; `UnsafeCheckpointError` for a file that needs another global, or a pickled `*/.metadata`
    index of a torch distributed checkpoint. A no-op for None."""
    if checkpoint is None or os.environ.get(TRUST_ENV) == "1":
        yield
        return
    if index := sorted(glob.glob(os.path.join(glob.escape(checkpoint), "*", ".metadata"))):
        raise UnsafeCheckpointError(
            f"Refusing to load {checkpoint}: {', '.join(index)} is the index of a torch "
            "distributed checkpoint (FSDP `SHARDED_STATE_DICT`), which torch reads with plain "
            "`pickle.load`: a tampered file would run code. Save with `fsdp_state_dict_type: "
            f"FULL_STATE_DICT`, or, for a checkpoint you wrote yourself, set {TRUST_ENV}=1."
        )
    try:  # DeepSpeed's engine loads through `load_checkpoint_file`, whose refusal names the file
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine as engine
    except ImportError:  # without DeepSpeed there is no DeepSpeed checkpoint to read
        engine = None
    saved = {name: os.environ.pop(name, None) for name in (_FORCE, _NO_FORCE)}  # torch refuses both set at once
    original, os.environ[_FORCE] = getattr(engine, "load", None), "1"
    if engine is not None:
        engine.load = lambda self, path, map_location=None: load_checkpoint_file(path, map_location)
    try:
        with torch.serialization.safe_globals(_allowed() if engine is not None else []):
            yield
    except UnsafeCheckpointError:
        raise
    except pickle.UnpicklingError as error:  # a load outside the engine (torch's message names the global)
        raise _refusal(checkpoint, error) from error
    finally:
        if engine is not None:
            engine.load = original
        for name, value in saved.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
