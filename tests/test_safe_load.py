"""Nothing in a checkpoint runs code on resume, under every engine: plain, DDP, DeepSpeed ZeRO-2 and ZeRO-3.

Each engine's checkpoint gets one file replaced by a pickle whose `__reduce__` creates a marker file
(tests/helpers/crafted.py, the same size as the file it replaces). Resuming it must create no marker and stop with a
refusal naming the global. DeepSpeed reads its files with `torch.load(weights_only=False)`: `cegppo_trl.safe_load`
makes those loads weights-only with an allowlist for the duration of the resume (the ZeRO-2 and ZeRO-3 cases are in
tests/test_deepspeed.py, beside the exact ZeRO-2/3 resumes, whose saves they share).
"""

from __future__ import annotations

import contextlib
import os
import pickle

import pytest
import torch
from helpers.crafted import RunsCodeWhenUnpickled, crafted_copy, hostile_bytes
from helpers.mp_launch import TORCHRUN, free_port, run, start

from cegppo_trl.safe_load import (
    DEEPSPEED_CHECKPOINT_GLOBALS,
    TRUST_ENV,
    UnsafeCheckpointError,
    load_checkpoint_file,
    safe_resume_loads,
)

deepspeed = pytest.importorskip("deepspeed")
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine  # noqa: E402
from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler  # noqa: E402
from deepspeed.runtime.zero.config import ZeroStageEnum  # noqa: E402
from deepspeed.utils.tensor_fragment import fragment_address  # noqa: E402

REFUSED = r"(?s)Refusing to load .*io\.open.*not among the classes DeepSpeed's own checkpoints hold.*" + TRUST_ENV


# ----------------------------------------------------------------------------------------------------------------
# The loader and the resume window
# ----------------------------------------------------------------------------------------------------------------
def test_deepspeeds_own_classes_load_weights_only_and_nothing_else_is_needed(tmp_path):
    state = {
        "optimizer_state_dict": {
            "loss_scaler": LossScaler(1.0),
            "zero_stage": ZeroStageEnum.gradients,
            "param_slice_mappings": [{"w": fragment_address(numel=3, start=0)}],
            "fp16_scaler": DynamicLossScaler(2.0**16, 1000, 1, 2, False, dtype=torch.half),
            "flat": torch.arange(3.0),
        },
        "ds_version": "0.19.8",
    }
    torch.save(state, tmp_path / "optim_states.pt")
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "optim_states.pt")) == set(
        DEEPSPEED_CHECKPOINT_GLOBALS
    )
    loaded = load_checkpoint_file(str(tmp_path / "optim_states.pt"), map_location="cpu")["optimizer_state_dict"]
    assert vars(loaded["loss_scaler"]) == {"cur_scale": 1.0, "dynamic": False}
    assert loaded["zero_stage"] is ZeroStageEnum.gradients
    assert loaded["param_slice_mappings"][0]["w"] == fragment_address(numel=3, start=0)
    assert vars(loaded["fp16_scaler"]) == vars(state["optimizer_state_dict"]["fp16_scaler"])
    assert torch.equal(loaded["flat"], torch.arange(3.0))


@pytest.mark.parametrize("fmt", ["raw pickle", "torch.save"])
def test_a_crafted_file_runs_nothing_and_is_refused_naming_the_global_and_the_file(tmp_path, fmt):
    marker, path = tmp_path / "PWNED", tmp_path / "mp_rank_00_model_states.pt"
    if fmt == "torch.save":
        torch.save({"module": RunsCodeWhenUnpickled(marker)}, path)
    else:
        path.write_bytes(hostile_bytes(marker, 4096))
    with contextlib.suppress(RuntimeError):  # a raw pickle fails torch's legacy format check, after it ran
        TorchCheckpointEngine().load(str(path))  # DeepSpeed's own load runs the file's code ...
    assert marker.exists()
    marker.unlink()
    with pytest.raises(UnsafeCheckpointError, match=REFUSED) as refused:
        load_checkpoint_file(str(path))
    assert str(path) in str(refused.value)
    assert not marker.exists()  # ... the weights-only load refuses before it runs


def test_the_resume_window_guards_every_load_and_restores_everything_after(tmp_path, monkeypatch):
    monkeypatch.delenv(TRUST_ENV, raising=False)
    monkeypatch.delenv("TORCH_FORCE_WEIGHTS_ONLY_LOAD", raising=False)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")  # a user's unsafe default: lifted for the window
    marker, path = tmp_path / "PWNED", tmp_path / "file.pt"
    path.write_bytes(hostile_bytes(marker, 512))
    original = TorchCheckpointEngine.load
    with pytest.raises(UnsafeCheckpointError, match=REFUSED), safe_resume_loads(str(tmp_path)):
        TorchCheckpointEngine().load(str(path))
    with pytest.raises(UnsafeCheckpointError, match=REFUSED), safe_resume_loads(str(tmp_path)):
        torch.load(path, weights_only=False)  # DeepSpeed's loads outside the engine (universal checkpoints)
    assert not marker.exists()
    assert TorchCheckpointEngine.load is original and "TORCH_FORCE_WEIGHTS_ONLY_LOAD" not in os.environ
    assert os.environ["TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"] == "1"
    with safe_resume_loads(None):  # not resuming: nothing changes
        assert TorchCheckpointEngine.load is original
    monkeypatch.setenv(TRUST_ENV, "1")  # the documented opt-out for a checkpoint one trusts
    with safe_resume_loads(str(tmp_path)):
        assert TorchCheckpointEngine.load is original


def test_a_sharded_fsdp_checkpoint_with_a_pickled_index_is_refused_before_anything_is_read(tmp_path, monkeypatch):
    # FSDP's SHARDED_STATE_DICT (not the shipped fsdp2.yaml, which saves FULL_STATE_DICT) is torch's distributed
    # checkpoint format: its `.metadata` index is read with plain `pickle.load`. FSDP cannot run on CPU here; the
    # folder is what accelerate's `save_fsdp_model` writes for it (`dist_cp.save` into `pytorch_model_fsdp_0/`).
    import torch.distributed.checkpoint as dist_cp

    monkeypatch.delenv(TRUST_ENV, raising=False)
    dist_cp.save({"model": {"w": torch.ones(2)}}, checkpoint_id=str(tmp_path / "pytorch_model_fsdp_0"))
    index = tmp_path / "pytorch_model_fsdp_0" / ".metadata"
    pickle.loads(index.read_bytes())  # a plain pickle
    with pytest.raises(UnsafeCheckpointError, match=r"(?s)\.metadata indexes a torch distributed checkpoint.*"
                       r"read by pickle.*would run code.*FULL_STATE_DICT.*" + TRUST_ENV):  # fmt: skip
        with safe_resume_loads(str(tmp_path)):
            pytest.fail("entered the resume")
    monkeypatch.setenv(TRUST_ENV, "1")
    with safe_resume_loads(str(tmp_path)):
        pass


class _EngineReadingThroughDeepSpeed:
    """Stands in for a DeepSpeed engine in one process: `load_checkpoint` reads the tag's model states through
    DeepSpeed's own `TorchCheckpointEngine.load` (`torch.load(weights_only=False)`), as `DeepSpeedEngine` does."""

    def load_checkpoint(self, folder, **kwargs):
        tag = open(os.path.join(folder, "latest")).read().strip()
        TorchCheckpointEngine().load(os.path.join(folder, tag, "mp_rank_00_model_states.pt"))
        return folder, {}


def _decoy(folder, marker):
    (folder / "global_step1").mkdir(parents=True)
    (folder / "latest").write_text("global_step1")
    (folder / "global_step1" / "mp_rank_00_model_states.pt").write_bytes(hostile_bytes(marker))
    return folder


@pytest.mark.parametrize("trainer_class", ["GRPOTrainer", "CEGPPOTrainer"])
def test_a_resumed_deepspeed_train_reads_every_checkpoint_file_as_data(make_trainer, tmp_path, monkeypatch,
                                                                        trainer_class):  # fmt: skip
    # Under DeepSpeed transformers hands the resume and `load_best_model_at_end`'s folder (which a resumed
    # trainer_state.json names) to DeepSpeed's engine, which unpickles them. GRPOTrainer runs the decoy's pickle; the
    # CE-GPPO trainer's `train()` of a resumed DeepSpeed (or FSDP) run is inside the guard, which refuses it.
    import trl

    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer

    monkeypatch.delenv(TRUST_ENV, raising=False)
    marker, resumed = tmp_path / "PWNED", tmp_path / "out" / "checkpoint-2"
    cls = CEGPPOTrainer if trainer_class == "CEGPPOTrainer" else type("Plain", (trl.GRPOTrainer,), {})
    config_cls = CEGPPOConfig if trainer_class == "CEGPPOTrainer" else trl.GRPOConfig
    trainer = make_trainer(trainer_cls=cls, config_cls=config_cls, output_dir=str(tmp_path / "out"))
    decoy = _decoy(tmp_path / "out" / "checkpoint-1", marker)
    resumed.mkdir()
    (resumed / "trainer_state.json").write_text("{}")
    monkeypatch.setattr(trainer, "is_deepspeed_enabled", True)
    engine = _EngineReadingThroughDeepSpeed()
    monkeypatch.setattr(trl.GRPOTrainer, "train", lambda self, *a, **k: engine.load_checkpoint(decoy))
    if trainer_class == "GRPOTrainer":
        with contextlib.suppress(RuntimeError):  # torch fails on the file after the pickle ran
            trainer.train(resume_from_checkpoint=str(resumed))
        assert marker.exists()  # the hole: TRL and transformers load it as a pickle
        return
    with pytest.raises(UnsafeCheckpointError, match=REFUSED):
        trainer.train(resume_from_checkpoint=str(resumed))
    assert not marker.exists()
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") is None  # the guard ends with `train()`
    monkeypatch.setattr(trainer, "is_deepspeed_enabled", False)  # DDP: transformers reads weights-only itself
    with contextlib.suppress(RuntimeError):
        trainer.train(resume_from_checkpoint=str(resumed))
    assert marker.exists()  # no guard: a reward's or callback's own `torch.load` is left as it is


# ----------------------------------------------------------------------------------------------------------------
# Crafted checkpoints per engine
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plain_checkpoint(tmp_path_factory, model_dir, data_file):
    from test_resume import smoke_args

    from cegppo_trl.scripts import main as train

    out = tmp_path_factory.mktemp("plain")
    train(*smoke_args(model_dir, data_file, out))
    return out / "checkpoint-1"


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_plain_resume_of_a_crafted_checkpoint_runs_nothing(plain_checkpoint, model_dir, data_file, tmp_path, name):
    # transformers reads these with `torch.load(weights_only=True)`: refused by torch's weights-only unpickler.
    from test_resume import smoke_args

    from cegppo_trl.scripts import main as train

    marker = tmp_path / "PWNED"
    crafted = crafted_copy(plain_checkpoint, tmp_path / "crafted" / "checkpoint-1", name, marker)
    args = smoke_args(
        model_dir, data_file, tmp_path / "out", "--resume_from_checkpoint", str(crafted), "--max_steps", "2"
    )
    with pytest.raises(pickle.UnpicklingError, match=r"io\.open"):
        train(*args)
    assert not marker.exists()


def _refused(proc, marker, *needles):
    proc.wait(timeout=600)
    output = proc.log_path.read_text()
    assert proc.returncode != 0, output[-3000:]
    assert not marker.exists(), "resuming ran code from the checkpoint"
    for needle in needles:
        assert needle in output, (needle, output[-3000:])


@pytest.mark.slow
@pytest.mark.campaign
def test_ddp_resume_of_a_crafted_per_rank_rng_file_runs_nothing(tmp_path):
    torchrun = [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", str(free_port())]
    run(torchrun, tmp_path, {"loss_types": ["dapo"], "save_steps": 2}, ACCELERATE_USE_CPU="1")
    marker = tmp_path / "PWNED"
    crafted = crafted_copy(
        tmp_path / "dapo" / "checkpoint-2", tmp_path / "c" / "checkpoint-2", "rng_state_1.pth", marker
    )
    torchrun[-1] = str(free_port())
    spec = {"loss_types": ["dapo"], "resume": str(crafted)}
    _refused(
        start(torchrun, tmp_path / "crafted", spec, ACCELERATE_USE_CPU="1"),
        marker,
        "Weights only load failed",
        "io.open",
    )
