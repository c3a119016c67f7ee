"""Resuming from checkpoints: nothing unpickled, the newest complete checkpoint, another trainer's too.

Runs offline on a tiny local Llama saved to disk (`cegppo_trl.demos.tiny`) and a small `.jsonl` file, through the
same `cegppo_trl.scripts.main` the `cegppo train` command calls.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cegppo_trl import CEGPPOConfig
from cegppo_trl.checkpoints import LEGACY_STATE_FILE, commit, resolve
from cegppo_trl.scripts import main as train
from cegppo_trl.scripts import parse_args

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "examples" / "recipes" / "cpu_smoke.yaml"


def smoke_args(model_dir, data_file, output_dir, *extra):
    return parse_args(
        ["--config", str(SMOKE), "--model_name_or_path", model_dir, "--dataset_name", data_file,
         "--output_dir", str(output_dir), "--max_steps", "1", "--save_strategy", "steps", "--save_steps", "2",
         "--disable_tqdm", "true", *extra]
    )  # fmt: skip


class _RunsCodeWhenUnpickled:
    """Unpickling this creates `marker`: what a hostile `training_args.bin` could do instead of touching a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


# ----------------------------------------------------------------------------------------------------------------
# Resuming never unpickles anything from the checkpoint
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_resuming_never_unpickles_training_args_bin(model_dir, data_file, tmp_path, caplog):
    first = train(*smoke_args(model_dir, data_file, tmp_path))
    checkpoint = tmp_path / "checkpoint-1"
    state = json.loads((checkpoint / "trainer_state.json").read_text())["stateful_callbacks"]  # JSON, as transformers'
    assert state["LeftDriftAlarm"]["attributes"] == {"armed": True} and first.left_drift_alarm.armed
    assert state["StopWhenNothingToLearn"]["attributes"]["unscorable_batches"] == 0
    marker = tmp_path / "PWNED"
    (checkpoint / "training_args.bin").write_bytes(pickle.dumps(_RunsCodeWhenUnpickled(marker)))
    pickle.loads((checkpoint / "training_args.bin").read_bytes()).close()  # the file really runs code when unpickled
    assert marker.exists()
    marker.unlink()
    commit(str(checkpoint), True, lambda: None)  # the planter marked it as it is now

    resumed_args = smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2")
    trainer = train(*resumed_args)
    assert not marker.exists(), "resuming unpickled the checkpoint's training_args.bin"
    assert trainer.state.global_step == 2  # resumed at step 1, one more step


def _fake_checkpoint(output_dir: Path, step: int) -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.5, "max_steps": step}))
    commit(str(folder), True, lambda: None)
    return folder


def test_another_trainers_checkpoint_resumes_with_one_line_and_a_begun_one_of_this_library_does_not(tmp_path):
    checkpoint = tmp_path / "checkpoint-4"  # as GRPOTrainer writes it: no cegppo_commit.json
    checkpoint.mkdir()
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    for requested in (str(checkpoint), "last", True):
        assert resolve(str(tmp_path), requested) == (str(checkpoint), [f"Resuming from {checkpoint} (global step 4)."])
    (checkpoint / LEGACY_STATE_FILE).write_text("{}")  # a run of cegppo-trl 0.5 began it: not committed
    with pytest.raises(ValueError, match=r"cannot be resumed \(it has no cegppo_commit.json: a run of this library"):
        resolve(str(tmp_path), str(checkpoint))


# ----------------------------------------------------------------------------------------------------------------
# Overwriting leaves nothing of the old run for `last`
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_overwrite_removes_the_old_runs_checkpoints_so_last_resumes_the_new_run(
    model_dir, data_file, tmp_path, caplog
):
    for step in (2, 20, 184):  # an earlier, longer run's checkpoints
        _fake_checkpoint(tmp_path, step)
    with pytest.raises(ValueError, match=r"A new run into .*\(checkpoint-2, checkpoint-20, checkpoint-184\)"):
        train(*smoke_args(model_dir, data_file, tmp_path))
    with caplog.at_level(logging.WARNING, logger="cegppo_trl.scripts"):
        train(*smoke_args(model_dir, data_file, tmp_path, "--overwrite_output_dir", "true"))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-1"]  # this run's only
    assert all(f"`overwrite_output_dir`: deleted {tmp_path / f'checkpoint-{s}'}." in caplog.text for s in (2, 20, 184))

    with caplog.at_level(logging.WARNING):
        trainer = train(
            *smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2")
        )
    assert f"Resuming from {tmp_path / 'checkpoint-1'} (global step 1)." in caplog.text
    assert trainer.state.global_step == 2


@pytest.mark.slow
def test_the_cli_says_once_which_checkpoint_it_resumed(model_dir, data_file, tmp_path, caplog):
    train(*smoke_args(model_dir, data_file, tmp_path))
    with caplog.at_level(logging.WARNING):
        train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2"))
    resumed = [r.getMessage() for r in caplog.records if "Resuming from" in r.getMessage()]
    assert resumed == [f"[RANK 0] Resuming from {tmp_path / 'checkpoint-1'} (global step 1)."]


# ----------------------------------------------------------------------------------------------------------------
# A run killed while saving a checkpoint resumes from the newest complete one
# ----------------------------------------------------------------------------------------------------------------
def _resolve(output_dir: Path, value: str):
    return resolve(str(output_dir), value)[0]


def test_last_passes_over_unmarked_folders_and_an_explicit_one_is_refused(tmp_path, caplog):
    _fake_checkpoint(tmp_path, 3)
    (tmp_path / "checkpoint-4").mkdir()  # killed after the weights, before the marker
    (tmp_path / "checkpoint-4" / "model.safetensors").write_bytes(b"")
    assert _resolve(tmp_path, "last") == str(tmp_path / "checkpoint-3")
    with pytest.raises(ValueError, match=r"checkpoint-4 cannot be resumed \(it has neither cegppo_commit.json nor "
                       r"trainer_state.json: not a checkpoint\)"):  # fmt: skip
        _resolve(tmp_path, str(tmp_path / "checkpoint-4"))


def _weights_but_no_trainer_state(folder: Path) -> bool:
    return (folder / "model.safetensors").exists() and not (folder / "trainer_state.json").exists()


@pytest.mark.slow
def test_a_run_killed_by_sigkill_while_saving_resumes_from_the_newest_complete_checkpoint(
    model_dir, data_file, tmp_path, caplog
):
    """A real SIGKILL in the middle of a checkpoint save, as a preempted cluster job gets. The training process is
    frozen (SIGSTOP) as soon as a `checkpoint-N` folder without `trainer_state.json` is seen, and killed only if
    the folder is still incomplete then, so every run of this test kills a save half-way."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "cegppo_trl.cli", "train", "--config", str(SMOKE), "--model_name_or_path", model_dir,
           "--dataset_name", data_file, "--output_dir", str(tmp_path), "--max_steps", "500", "--save_strategy",
           "steps", "--save_steps", "2", "--disable_tqdm", "true"]  # fmt: skip
    log_path = tmp_path.parent / f"{tmp_path.name}-train.log"
    partial, previous, attempts = None, None, 0
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 240
            while partial is None and time.monotonic() < deadline and process.poll() is None:
                folders = sorted(tmp_path.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
                # A save after the first, past the weights (the case that breaks `get_last_checkpoint`: a folder
                # with model files and no trainer state); each save gives one chance, most are caught.
                if len(folders) >= 2 and _weights_but_no_trainer_state(folders[-1]):
                    process.send_signal(signal.SIGSTOP)
                    attempts += 1
                    if _weights_but_no_trainer_state(folders[-1]):
                        partial, previous = folders[-1], folders[-2]
                        process.kill()
                    else:
                        process.send_signal(signal.SIGCONT)
                time.sleep(0.0005)
        finally:
            process.kill()
            process.wait()
    assert partial is not None, f"no save caught half-way in {attempts} tries: " + log_path.read_text()[-3000:]
    step = int(partial.name.split("-")[1])
    assert _weights_but_no_trainer_state(partial)  # really half-written after the kill

    resumed = smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", str(step))
    with caplog.at_level(logging.WARNING):
        trainer = train(*resumed)
    # cpu_smoke saves at rollout-batch ends (every 2 steps): the save before the torn one
    assert str(previous) == str(tmp_path / f"checkpoint-{step - 2}")
    assert f"Resuming from {previous} (global step {step - 2})." in caplog.text
    assert trainer.state.global_step == step
    assert (partial / "trainer_state.json").exists()  # the resumed run saved that step again, completely


def test_python_api_resume_true_picks_the_newest_complete_checkpoint(tmp_path, monkeypatch):
    # transformers' `train(resume_from_checkpoint=True)` takes the highest-numbered folder, even a half-written one.

    from accelerate import PartialState
    from transformers.trainer_callback import CallbackHandler
    from trl import GRPOTrainer

    from cegppo_trl import CEGPPOTrainer

    PartialState()  # the trainer's accelerate logger needs it
    _fake_checkpoint(tmp_path, 3)
    (tmp_path / "checkpoint-4").mkdir()
    (tmp_path / "checkpoint-4" / "model.safetensors").write_bytes(b"")
    received = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, checkpoint, *rest, **kw: received.append(checkpoint))
    trainer = CEGPPOTrainer.__new__(CEGPPOTrainer)  # only `args` is read before `super().train`
    trainer.args = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=10)
    trainer.callback_handler = CallbackHandler([], None, None, None, None)
    trainer.is_deepspeed_enabled = trainer.is_fsdp_enabled = False
    CEGPPOTrainer.train(trainer, resume_from_checkpoint=True)
    assert received == [str(tmp_path / "checkpoint-3")]
