"""The trainer reads checkpoints as data: DeepSpeed's pickles through `torch.load(weights_only=True)` and an allowlist.

transformers hands a DeepSpeed resume, and the best-model load of `load_best_model_at_end`, to
`deepspeed_load_checkpoint`, and DeepSpeed 0.19 reads every file of its checkpoint (`mp_rank_*_model_states.pt`,
`*_optim_states.pt`) with `torch.load(path, weights_only=False)`: unpickling such a file runs whatever code it names.
`CEGPPOTrainer` enters `safe_resume_loads(folder)` around each of transformers' methods that reads a checkpoint
folder (`_prepare_for_training` and `_load_from_checkpoint`: the resume; `_load_rng_state`, called inside the training
loop; `_load_best_model`, at the end of training, whose folder a resumed `trainer_state.json` names), and nowhere
else: a reward function's or callback's own `torch.load` is left as it is. For each such window:

- DeepSpeed's checkpoint engine (`TorchCheckpointEngine.load`, the engine of every shipped config) reads through
  `load_checkpoint_file`: `torch.load(..., weights_only=True)` that accepts tensors, plain containers and exactly the
  DeepSpeed classes of `DEEPSPEED_CHECKPOINT_GLOBALS`, and refuses anything else naming the global and the file;
- `TORCH_FORCE_WEIGHTS_ONLY_LOAD=1` (torch's own switch) turns every other `torch.load(weights_only=False)` into a
  weights-only load with the same allowlist (DeepSpeed's universal-checkpoint and other checkpoint engines' loads).

transformers reads the plain, DDP and FSDP (`FULL_STATE_DICT`, the shipped `fsdp2.yaml`) checkpoint files with
`weights_only=True` itself. A checkpoint in torch's distributed-checkpoint format (FSDP's `SHARDED_STATE_DICT`, the
FSDP2 default when `fsdp_state_dict_type` is not set) is refused: its index, `<folder>/.metadata`, is read with plain
`pickle.load`, which no allowlist reaches. `CEGPPO_TRUST_CHECKPOINT_PICKLES=1` turns all of this off, for a checkpoint
you wrote yourself.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pickle
import re
from collections.abc import Iterator
from typing import Any

import torch

TRUST_ENV = "CEGPPO_TRUST_CHECKPOINT_PICKLES"
_FORCE_WEIGHTS_ONLY_ENV = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
_TORCH_LOAD_ENVS = (_FORCE_WEIGHTS_ONLY_ENV, "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
# The classes DeepSpeed pickles into its own ZeRO checkpoints (found with `torch.serialization.
# get_unsafe_globals_in_checkpoint` on the ZeRO-2/3 checkpoints of tests/helpers/mp_train.py), and why each is data.
# torch's weights-only unpickler rebuilds each from its saved fields or value without calling any of its methods.
DEEPSPEED_CHECKPOINT_GLOBALS: dict[str, str] = {
    "deepspeed.runtime.fp16.loss_scaler.LossScaler": "the static loss scaler of bf16/fp32 ZeRO optimizers "
    "(`optimizer_state_dict.loss_scaler`, ZeRO-2 and ZeRO-3): two fields, `cur_scale` and `dynamic`",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler": "the loss scaler of fp16 runs with dynamic loss scaling "
    "(DeepSpeed's `CreateLossScaler`; not produced by the bf16/fp32 jobs measured here): numbers and a torch dtype",
    "deepspeed.runtime.zero.config.ZeroStageEnum": "the ZeRO stage (`optimizer_state_dict.zero_stage`, ZeRO-2 and "
    "ZeRO-3): an int enum rebuilt from its value",
    "deepspeed.utils.tensor_fragment.fragment_address": "where each parameter sits in the flat fp32 partition "
    "(`optimizer_state_dict.param_slice_mappings`, ZeRO-2): a named tuple of two ints, `numel` and `start`",
}


class UnsafeCheckpointError(pickle.UnpicklingError):
    """A checkpoint file needs a global outside the allowlist to be unpickled: loading it could run code."""


def allowed_globals() -> list[Any]:
    """The classes of `DEEPSPEED_CHECKPOINT_GLOBALS` (imported from DeepSpeed, which must be installed)."""
    import importlib

    classes = []
    for name in DEEPSPEED_CHECKPOINT_GLOBALS:
        module, _, attribute = name.rpartition(".")
        classes.append(getattr(importlib.import_module(module), attribute))
    return classes


def refusal_message(path: object, error: BaseException) -> str:
    """Why `path` is refused: the globals it needs beyond the allowlist (or torch's reason), and the way out."""
    unsafe = re.findall(r"GLOBAL (\S+) was not an allowed global", str(error))
    with contextlib.suppress(Exception):  # zip-format files (torch.save) list all of them
        unsafe = [g for g in torch.serialization.get_unsafe_globals_in_checkpoint(path) if g not in _ALLOWED_NAMES]
    lines = [line.strip() for line in str(error).split("WeightsUnpickler error:")[-1].splitlines() if line.strip()]
    reason = lines[0] if lines else type(error).__name__
    what = (
        f"the global(s) {', '.join(unsafe)}" if unsafe else f"something torch's weights-only loader refuses ({reason})"
    )
    return (
        f"Refusing to load {path}: unpickling it needs {what}, which is not among the classes DeepSpeed's own "
        f"checkpoints hold ({', '.join(DEEPSPEED_CHECKPOINT_GLOBALS)}). Unpickling a global can run arbitrary code, so "
        "a checkpoint that needs one may have been tampered with or written by other code. Resume only checkpoints "
        f"you trust; to resume this one anyway because you wrote it yourself, set {TRUST_ENV}=1."
    )


_ALLOWED_NAMES = frozenset(DEEPSPEED_CHECKPOINT_GLOBALS)


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


def _engine_load(self, path: str, map_location: Any = None) -> Any:
    """`TorchCheckpointEngine.load` during a resume (the same signature)."""
    return load_checkpoint_file(path, map_location=map_location)


@contextlib.contextmanager
def safe_resume_loads(checkpoint: str | None) -> Iterator[None]:
    """While reading the checkpoint folder `checkpoint`, every `torch.load` reads data only (see the module
    docstring); a no-op when `checkpoint` is None or `CEGPPO_TRUST_CHECKPOINT_PICKLES=1`.

    Raises:
        UnsafeCheckpointError: a file of the checkpoint needs a global outside `DEEPSPEED_CHECKPOINT_GLOBALS`, or
            the checkpoint has a pickled distributed-checkpoint index (`*/.metadata`).
    """
    if checkpoint is None or os.environ.get(TRUST_ENV) == "1":
        yield
        return
    pickled_index = sorted(glob.glob(os.path.join(glob.escape(checkpoint), "*", ".metadata")))
    if pickled_index:
        raise UnsafeCheckpointError(
            f"Refusing to load {checkpoint}: {', '.join(pickled_index)} is the index of a torch distributed "
            "checkpoint (FSDP `SHARDED_STATE_DICT`), which torch reads with plain `pickle.load`: a tampered file would "
            "run code, and no allowlist can stop it. Save with `fsdp_state_dict_type: FULL_STATE_DICT` (as the shipped "
            f"accelerate_configs/fsdp2.yaml does), or, for a checkpoint you wrote yourself, set {TRUST_ENV}=1."
        )
    try:
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
    except ImportError:  # without DeepSpeed there is no DeepSpeed checkpoint to read
        TorchCheckpointEngine = None
    # torch refuses every load while both of its switches are set: the opposite one is lifted for the window.
    saved_env = {name: os.environ.pop(name, None) for name in _TORCH_LOAD_ENVS}
    if TorchCheckpointEngine is not None:
        original = TorchCheckpointEngine.load
        TorchCheckpointEngine.load = _engine_load
    os.environ[_FORCE_WEIGHTS_ONLY_ENV] = "1"
    try:
        with torch.serialization.safe_globals(allowed_globals() if TorchCheckpointEngine is not None else []):
            yield
    except UnsafeCheckpointError:
        raise
    except pickle.UnpicklingError as error:  # a load outside the engine (torch's message names the global)
        raise UnsafeCheckpointError(refusal_message(checkpoint, error)) from error
    finally:
        if TorchCheckpointEngine is not None:
            TorchCheckpointEngine.load = original
        for name, value in saved_env.items():
            os.environ.pop(name, None)
            if value is not None:
                os.environ[name] = value
