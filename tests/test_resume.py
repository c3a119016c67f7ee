"""Resuming from checkpoints: nothing unpickled, settings compared from plain JSON, the controller state restored.

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
from cegppo_trl.checkpoints import CEGPPO_STATE_FILE, COMMIT_FILE, commit, plan_resume, read_state
from cegppo_trl.config import changed_settings, run_settings
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
    state = json.loads((checkpoint / CEGPPO_STATE_FILE).read_text())  # every checkpoint has it, controller or not
    assert set(state) == {"format", "settings", "run_state"} and state["format"] == 2
    # every field that changes the run, as the launch's plan saw them (before `cegppo train` fills in
    # `model_init_kwargs` from the model arguments)
    script = state["settings"].pop("script")
    assert state["settings"] == {**run_settings(first.args), "model_init_kwargs": None}
    assert script["reward_funcs"] == ["format"]  # and the script's arguments
    assert state["run_state"]["left_drift_alarm"] == {"armed": True}
    assert state["run_state"]["reward_monitor"]["unscorable_batches"] == 0
    assert state["settings"]["gppo_beta1"] == 0.5 and state["settings"]["max_steps"] == 1
    marker = tmp_path / "PWNED"
    (checkpoint / "training_args.bin").write_bytes(pickle.dumps(_RunsCodeWhenUnpickled(marker)))
    pickle.loads((checkpoint / "training_args.bin").read_bytes()).close()  # the file really runs code when unpickled
    assert marker.exists()
    marker.unlink()
    run = json.loads((checkpoint / COMMIT_FILE).read_text())["run"]
    commit(str(checkpoint), True, run, lambda: None)  # the planter marked it as it is now

    resumed_args = smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2")
    with caplog.at_level(logging.WARNING, logger="cegppo_trl.scripts"):
        trainer = train(*resumed_args)
    assert not marker.exists(), "resuming unpickled the checkpoint's training_args.bin"
    assert trainer.state.global_step == 2  # resumed at step 1, one more step
    assert "max_steps: 1 -> 2" in caplog.text  # the settings were still compared, from cegppo_state.json


def _fake_checkpoint(output_dir: Path, step: int, run: str = "old-run") -> Path:
    folder = output_dir / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.5, "max_steps": step}))
    (folder / CEGPPO_STATE_FILE).write_text(json.dumps({"format": 2, "settings": {}}))
    commit(str(folder), True, run, lambda: None)
    return folder


def _checkpoint(tmp_path, settings: dict | None = None, controller: dict | None = None) -> Path:
    folder = tmp_path / "checkpoint-4"
    folder.mkdir()
    if settings is not None or controller is not None:
        state = {"format": 2}
        if settings is not None:
            state["settings"] = settings
        if controller is not None:
            state["controller"] = controller
        (folder / CEGPPO_STATE_FILE).write_text(json.dumps(state))
    return folder


def _resume_message(checkpoint: Path, args: CEGPPOConfig) -> str:
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    commit(str(checkpoint), True, "run", lambda: None)
    plan, _ = plan_resume(str(checkpoint.parent), str(checkpoint), args)
    assert len(plan.messages) == 1
    return plan.messages[0]


def test_changed_settings_are_named_from_cegppo_state_json(tmp_path):
    controller = "band=0.3-0.6,step=0.05"
    before = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_controller=controller)
    checkpoint = _checkpoint(tmp_path, run_settings(before), controller={"offset1": 0.0})
    now = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, gppo_beta1=0.75)
    assert changed_settings(read_state(str(checkpoint)), now) == {
        "gppo_beta1": [0.5, 0.75], "entropy_controller": [controller, None]
    }  # fmt: skip
    assert "Settings that differ from the checkpoint's (the run follows the new ones): gppo_beta1: 0.5 -> 0.75; " \
        f"entropy_controller: {controller!r} -> None." in _resume_message(checkpoint, now)  # fmt: skip


def test_every_field_that_changes_the_objective_or_the_batch_is_named_on_resume(tmp_path):
    before = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True)
    checkpoint = _checkpoint(tmp_path, run_settings(before))
    changes = dict(loss_type="grpo", epsilon=0.3, delta=2.0, num_generations=4, steps_per_generation=4,
                   gradient_accumulation_steps=2, per_device_train_batch_size=4, num_iterations=2,
                   importance_sampling_level="sequence", learning_rate=1e-5, beta=0.01)  # fmt: skip
    now = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, **changes)
    differing = changed_settings(read_state(str(checkpoint)), now)
    assert changes.items() <= {name: new for name, (_, new) in differing.items()}.items()
    message = _resume_message(checkpoint, now)
    assert f"loss_type: {before.loss_type!r} -> 'grpo'" in message and "num_generations: 8 -> 4" in message


def test_dropped_controller_state_counts_as_a_change_without_recorded_settings(tmp_path):
    checkpoint = _checkpoint(tmp_path, controller={"offset1": 0.0})
    now = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True)
    assert changed_settings(read_state(str(checkpoint)), now) == {
        "entropy_controller": ["(state in the checkpoint)", None]
    }


def test_a_marked_checkpoint_without_cegppo_state_has_nothing_to_compare_and_one_message(tmp_path):
    checkpoint = _checkpoint(tmp_path)
    (checkpoint / "training_args.bin").write_bytes(pickle.dumps(_RunsCodeWhenUnpickled(tmp_path / "PWNED")))
    message = _resume_message(checkpoint, CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True))
    assert not (tmp_path / "PWNED").exists()
    assert message == f"Resuming from {checkpoint} (global step 4)."


def test_another_trainers_checkpoint_resumes_with_one_line_and_a_begun_one_of_this_library_does_not(tmp_path):
    checkpoint = _checkpoint(tmp_path)  # as GRPOTrainer writes it: no cegppo_commit.json, no cegppo_state.json
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    args = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True)
    for requested in (str(checkpoint), "last"):
        plan, blocking = plan_resume(str(tmp_path), requested, args)
        assert (plan.checkpoint, blocking) == (str(checkpoint), [])
        assert plan.messages == [f"Resuming from {checkpoint} (global step 4). It carries no commit record (another "
                                 "trainer wrote it): only transformers' own checks apply."]  # fmt: skip
    (checkpoint / CEGPPO_STATE_FILE).write_text("{}")  # a run of this library began it: not committed
    with pytest.raises(ValueError, match=r"cannot be resumed \(it has no cegppo_commit.json: a run of this library"):
        plan_resume(str(tmp_path), str(checkpoint), args)


@pytest.mark.slow
def test_a_resume_that_changes_settings_is_recorded_and_the_model_card_says_at_which_step(make_trainer, tmp_path):
    make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2).train()
    resumed = make_trainer(num_iterations=2, max_steps=4, save_strategy="steps", save_steps=2, epsilon=0.3)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.settings_history == [{"step": 2, "changes": {"epsilon": [0.2, 0.3], "max_steps": [2, 4]}}]
    assert read_state(str(tmp_path / "checkpoint-4"))["history"] == resumed.settings_history  # carried on
    resumed.save_model()
    card = (tmp_path / "README.md").read_text()
    assert "| `settings_changed` | `at step 2: max_steps 2 -> 4, epsilon 0.2 -> 0.3` |" in card


# ----------------------------------------------------------------------------------------------------------------
# A controller set now, none in the checkpoint: it starts fresh, with one warning given before loading
# ----------------------------------------------------------------------------------------------------------------
def _fresh_controller_warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "holds no entropy-controller state" in r.getMessage()]


@pytest.mark.slow
def test_cli_resume_adding_a_controller_warns_once_before_loading_and_starts_it_fresh(
    model_dir, data_file, tmp_path, caplog, monkeypatch
):
    from cegppo_trl.trainer import CEGPPOTrainer

    train(*smoke_args(model_dir, data_file, tmp_path))  # no controller
    warned_before_loading = []
    original_init = CEGPPOTrainer.__init__

    def init(self, *args, **kwargs):
        warned_before_loading.append(len(_fresh_controller_warnings(caplog)))
        original_init(self, *args, **kwargs)

    monkeypatch.setattr(CEGPPOTrainer, "__init__", init)
    controller = "band=0-0.1,step=0.1,mode=beta1,beta1=0-1,every=1,damping=0,raise_beta1=true"
    with caplog.at_level(logging.WARNING):
        trainer = train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last",
                                    "--max_steps", "2", "--entropy_controller", controller))  # fmt: skip
    warnings = _fresh_controller_warnings(caplog)
    assert warned_before_loading == [1] and len(warnings) == 1, warnings
    assert f"entropy_controller: None -> {controller!r}" in warnings[0]  # the same, single message
    assert "the controller starts fresh at the resumed step" in warnings[0]
    assert trainer.state.global_step == 2
    # Fresh: the one update (step 2) is its first, one step of 0.1 up from the nominal beta1 (entropy above band).
    state = trainer.entropy_controller.state_dict()
    assert state["num_updates"] == 1 and state["offset_beta1"] == pytest.approx(0.1)


@pytest.mark.slow
def test_api_resume_adding_a_controller_warns_once_and_starts_it_fresh(make_trainer, tmp_path, caplog):
    make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2).train()
    with_controller = make_trainer(num_iterations=2, max_steps=4, entropy_controller="band=1-2")
    with caplog.at_level(logging.WARNING):
        with_controller.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))
    assert len(_fresh_controller_warnings(caplog)) == 1
    assert with_controller.state.global_step == 4


# ----------------------------------------------------------------------------------------------------------------
# Overwriting leaves nothing of the old run for `last`; a resume that would train 0 steps is refused
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if `main` gets as far as building the trainer (which loads the model)."""
    from cegppo_trl.trainer import CEGPPOTrainer

    def refuse(*args, **kwargs):
        raise AssertionError("the model started loading before the refusal")

    monkeypatch.setattr(CEGPPOTrainer, "__init__", refuse)


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
    assert (
        f"`overwrite_output_dir`: deleted checkpoint-2, checkpoint-20, checkpoint-184 from {tmp_path}" in caplog.text
    )

    trainer = train(
        *smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2")
    )
    assert trainer.args.resume_from_checkpoint == str(tmp_path / "checkpoint-1")
    assert trainer.state.global_step == 2


def test_resume_past_max_steps_is_refused_before_the_model_loads(model_dir, data_file, tmp_path, no_model_loading):
    _fake_checkpoint(tmp_path, 184)
    refused = (
        r"`max_steps=4` but .*checkpoint-184 is at global step 184: resuming it would train 0 steps. `max_steps` "
        r"counts the whole run: set it above 184"
    )
    with pytest.raises(ValueError, match=refused):
        train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "4"))


@pytest.mark.parametrize("left", ["nothing", "half of a model"])
def test_a_cli_requeue_after_the_last_checkpoint_exits_cleanly_and_writes_the_final_model(
    model_dir, data_file, tmp_path, caplog, left
):
    """Killed after checkpoint-1 of `max_steps=1` and before the final save: the requeue (the same command with
    `last`) trains nothing, says so, and writes the final model from the checkpoint, whatever `output_dir` held
    (a model cut in half, or another run's)."""
    train(*smoke_args(model_dir, data_file, tmp_path))
    final = tmp_path / "model.safetensors"
    final.write_bytes(final.read_bytes()[: final.stat().st_size // 2]) if left != "nothing" else final.unlink()
    with caplog.at_level(logging.WARNING, logger="cegppo_trl.scripts"):
        trainer = train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last"))
    assert trainer.state.global_step == 1
    assert f"Nothing left to train: {tmp_path / 'checkpoint-1'} is at global step 1" in caplog.text
    final = (tmp_path / "model.safetensors").read_bytes()
    assert final == (tmp_path / "checkpoint-1" / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_the_cli_plans_once_and_says_which_checkpoint_it_resumed(model_dir, data_file, tmp_path, caplog, monkeypatch):
    from cegppo_trl import checkpoints

    train(*smoke_args(model_dir, data_file, tmp_path))
    plans = []
    original = checkpoints.plan_resume
    monkeypatch.setattr(checkpoints, "plan_resume", lambda *a, **k: plans.append(a) or original(*a, **k))
    with caplog.at_level(logging.WARNING):
        train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2"))
    assert len(plans) == 1
    resumed = [r.getMessage() for r in caplog.records if "Resuming from" in r.getMessage()]
    assert resumed == [f"Resuming from {tmp_path / 'checkpoint-1'} (global step 1). Settings that differ from the "
                       "checkpoint's (the run follows the new ones): max_steps: 1 -> 2."]  # fmt: skip
    assert not hasattr(checkpoints, "FRESH_CONTROLLER_ANNOUNCED") and not hasattr(checkpoints, "LEGACY_NOTE_ANNOUNCED")


# ----------------------------------------------------------------------------------------------------------------
# A run killed while saving a checkpoint resumes from the newest complete one
# ----------------------------------------------------------------------------------------------------------------
def _resolve(output_dir: Path, value: str):
    args = CEGPPOConfig(output_dir=str(output_dir), use_cpu=True, resume_from_checkpoint=value)
    plan, _ = plan_resume(str(output_dir), value, args)
    for message in plan.messages:
        logging.getLogger("cegppo_trl.scripts").warning(message)
    return plan.checkpoint


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
    with caplog.at_level(logging.WARNING, logger="cegppo_trl.scripts"):
        trainer = train(*resumed)
    # cpu_smoke saves at rollout-batch ends (every 2 steps): the save before the torn one
    assert trainer.args.resume_from_checkpoint == str(previous) == str(tmp_path / f"checkpoint-{step - 2}")
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
    trainer.args, trainer._run = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, max_steps=10), None
    trainer.callback_handler = CallbackHandler([], None, None, None, None)
    CEGPPOTrainer.train(trainer, resume_from_checkpoint=True)
    assert received == [str(tmp_path / "checkpoint-3")]


def a_resume_names_changed_script_arguments_and_save_only_model(tmp_path):
    before = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True)
    script = {"reward_funcs": ["format"], "dataset_name": "a.jsonl", "max_train_samples": 64}
    checkpoint = _checkpoint(tmp_path, {**run_settings(before), "script": script})
    now = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, save_only_model=True)
    message = _resume_message_with(checkpoint, now, {**script, "reward_funcs": ["gsm8k"], "dataset_name": "b.jsonl"})
    assert message.endswith("Settings that differ from the checkpoint's (the run follows the new ones): "
                            "save_only_model: False -> True; reward_funcs: ['format'] -> ['gsm8k']; dataset_name: "
                            "'a.jsonl' -> 'b.jsonl'.")  # fmt: skip
    assert "reward_funcs" not in _resume_message_with(checkpoint, now, None)  # the API: no script to compare


def _resume_message_with(checkpoint: Path, args: CEGPPOConfig, script) -> str:
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 4}))
    commit(str(checkpoint), True, "run", lambda: None)
    return plan_resume(str(checkpoint.parent), str(checkpoint), args, script=script)[0].messages[0]


@pytest.mark.slow
def the_cli_names_a_changed_script_argument_on_resume(model_dir, data_file, tmp_path, caplog):
    train(*smoke_args(model_dir, data_file, tmp_path, "--max_train_samples", "16"))
    assert read_state(str(tmp_path / "checkpoint-1"))["settings"]["script"]["max_train_samples"] == 16
    with caplog.at_level(logging.WARNING):
        train(*smoke_args(model_dir, data_file, tmp_path, "--resume_from_checkpoint", "last", "--max_steps", "2",
                          "--max_train_samples", "8"))  # fmt: skip
    assert "max_steps: 1 -> 2; max_train_samples: 16 -> 8." in caplog.text
