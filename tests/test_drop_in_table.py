"""docs/drop-in.md's table of deliberate differences, walked: each row names where `CEGPPOTrainer` differs from
`GRPOTrainer`, and `SHOWN_BY` names the test that runs the same script through both and shows the difference is
real. A row without a test, or a test that does not run `GRPOTrainer`, fails here; so does a test listed for a row
the table no longer has.

The table's format (kept for every row, parsed below): a Markdown table under `## Deliberate differences` with the
header `| Where | GRPOTrainer | CEGPPOTrainer | Why | Way out |`, one difference per row; the first cell is the key.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from pathlib import Path

import pytest
import torch
from test_drop_in import PAIR, differential, none_reward, ones_reward, prompts, run_script
from trl import GRPOConfig, GRPOTrainer

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.checkpoints import LOCK_FILE

REPO = Path(__file__).resolve().parents[1]
CLIPPING = dict(learning_rate=0.2, steps_per_generation=4, gradient_accumulation_steps=1, max_steps=4)

# The first cell of each row -> `file::test` that runs the row's script through both trainers.
SHOWN_BY = {
    "`args` is a `GRPOConfig`": "test_drop_in_table.py::test_a_grpo_config",
    "`args=None`": "test_drop_in_table.py::test_args_none_names_the_output_dir_after_the_trainer",
    "On-policy settings": "test_drop_in_table.py::test_on_policy_settings_warn",
    "`epsilon` >= 1 with a CE-GPPO `loss_type`": "test_constructor_drop_in.py::test_an_epsilon_that_empties_the_left_region_warns_in_one_line",
    "A reward returns an infinite score": "test_constructor_drop_in.py::test_an_infinite_reward_trains_as_in_trl_and_warns_once",
    "No completion of a rollout batch gets a reward": "test_drop_in_table.py::test_runs_without_a_learning_signal",
    "Every group of a rollout batch has one reward (zero advantages) and no other term of the loss has a gradient": "test_drop_in_table.py::test_runs_without_a_learning_signal",
    "No rollout batch of a run had a learning signal": "test_drop_in_table.py::test_runs_without_a_learning_signal",
    "Left-clipped tokens drift far below the rollout policy": "test_drop_in_table.py::test_left_clipped_drift_warns",
    "A fresh `train()` into an `output_dir` holding committed checkpoints of another run": "test_drop_in.py::test_fresh_train_into_checkpoints_of_another_run_is_refused",
    "A second live run into the same `output_dir`": "test_drop_in_table.py::test_a_second_live_run_into_the_same_output_dir",
    "`resume_from_checkpoint=True`": "test_drop_in_table.py::test_resume_true_takes_the_newest_committed_checkpoint",
    "Resuming a checkpoint without `cegppo_commit.json`": "test_drop_in_table.py::test_checkpoint_folders_and_resuming_another_trainers_checkpoint",
    "Checkpoint folders": "test_drop_in_table.py::test_checkpoint_folders_and_resuming_another_trainers_checkpoint",
    "transformers' SIGTERM checkpoint (`enable_jit_checkpoint`)": "test_callback_commit.py::test_sigterm_with_enable_jit_checkpoint_commits_the_step_and_ends_the_job_as_sigterm_does",
    "Checkpoint loads": "test_safe_load.py::test_a_resumed_deepspeed_train_reads_every_checkpoint_file_as_data",
    "Loss at β1, β2 > 0 (off-policy)": "test_drop_in.py::test_the_comparison_detects_a_different_objective",
    "Logged metrics": "test_drop_in_table.py::test_the_logged_metric_keys",
    "Model card (`README.md`)": "test_drop_in_table.py::test_the_model_card",
}  # fmt: skip
# Rows whose difference no single-process script through both trainers can show (none now).
PENDING: set[str] = set()


def table_rows() -> list[list[str]]:
    """The cells of each row of the table of deliberate differences in docs/drop-in.md."""
    text = (REPO / "docs" / "drop-in.md").read_text().split("## Deliberate differences", 1)[1]
    lines = [line for line in text.split("\n## ", 1)[0].splitlines() if line.startswith("|")]
    header, rule, *rows = lines
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "Where", "`GRPOTrainer`", "`CEGPPOTrainer`", "Why", "Way out",
    ] and set(rule) <= set("|-")  # fmt: skip
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows]


def _key(where: str) -> str:
    """A row's key: its first cell up to the first colon or parenthesis that lists cases (`Inputs ... late (...)`)."""
    return next((k for k in [*SHOWN_BY, *PENDING] if where == k or where.startswith((k + " ", k + ":"))), where)


def test_every_row_of_the_table_is_shown_by_a_test_that_runs_grpo_trainer():
    rows = table_rows()
    assert all(len(r) == 5 for r in rows), [r[0] for r in rows if len(r) != 5]
    keys = [_key(r[0]) for r in rows]
    assert sorted(set(keys)) == sorted({*SHOWN_BY, *PENDING}), set(keys) ^ {*SHOWN_BY, *PENDING}
    for key, node in SHOWN_BY.items():
        path, name = node.split("::")
        module = importlib.import_module(path.removesuffix(".py"))
        source = inspect.getsource(getattr(module, name))
        assert any(s in source for s in ("GRPOTrainer", "differential(", "PAIR")), (key, node)


# ----------------------------------------------------------------------------------------------------------------
# The rows' scripts, each through both trainers
# ----------------------------------------------------------------------------------------------------------------
def test_a_grpo_config(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        grpo = run_script(GRPOTrainer, GRPOConfig, tmp_path, script=())
        cegppo = run_script(CEGPPOTrainer, GRPOConfig, tmp_path, script=())
    assert grpo.error is None and cegppo.error is None and type(cegppo.trainer.args) is CEGPPOConfig
    assert caplog.text.count("`args` is a `GRPOConfig`: converted to a `CEGPPOConfig`") == 1


def test_args_none_names_the_output_dir_after_the_trainer(tmp_path, model_dir, monkeypatch):
    original = GRPOConfig.__post_init__

    def on_cpu(self):  # the default config asks for bf16, which this CPU-only machine refuses
        self.bf16, self.use_cpu = False, True
        original(self)

    monkeypatch.setattr(GRPOConfig, "__post_init__", on_cpu)
    monkeypatch.chdir(tmp_path)
    dirs = [cls(model_dir, ones_reward, train_dataset=prompts()).args.output_dir for cls, _ in PAIR]
    assert [Path(d).name for d in dirs] == [f"{Path(model_dir).name}-GRPO", f"{Path(model_dir).name}-CE-GPPO"]


def test_on_policy_settings_warn(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        run_script(GRPOTrainer, GRPOConfig, tmp_path, script=(), steps_per_generation=1)
        said_by_grpo = "identical to GRPO" in caplog.text
        run_script(CEGPPOTrainer, CEGPPOConfig, tmp_path, script=(), steps_per_generation=1)
    assert not said_by_grpo and "CE-GPPO is identical to GRPO with this configuration" in caplog.text


def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reward", "limits", "reason", "steps"),
    [
        (none_reward, dict(max_unscorable_batches=1), "unscorable", 1),  # a stop at the first batch's first step
        (constant_reward, dict(max_zero_signal_batches=1), "zero_signal", 1),
        (constant_reward, {}, "zero_signal", 4),  # too short for the limits: no stop, a reason at the end
    ],
)
def test_runs_without_a_learning_signal(tmp_path, reward, limits, reason, steps):
    grpo = run_script(GRPOTrainer, GRPOConfig, tmp_path, reward_funcs=reward, max_steps=4)
    cegppo = run_script(CEGPPOTrainer, CEGPPOConfig, tmp_path, reward_funcs=reward, max_steps=4, **limits)
    assert grpo.error is None and cegppo.error is None
    assert grpo.trainer.state.global_step == 4 and not hasattr(grpo.trainer, "stop_reason")
    assert cegppo.trainer.state.global_step == steps and cegppo.trainer.stop_reason == reason


@pytest.mark.slow
def test_left_clipped_drift_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        grpo = run_script(GRPOTrainer, GRPOConfig, tmp_path, **CLIPPING)
        said_by_grpo = "left_drift_warning" in caplog.text
        cegppo = run_script(CEGPPOTrainer, CEGPPOConfig, tmp_path, left_drift_warning=-0.25, gppo_beta1=0.5,
                            gppo_beta2=1.0, **CLIPPING)  # fmt: skip
    assert grpo.error is None and cegppo.error is None
    assert any(entry.get("clip_ratio/low_mean", 0) > 0 for entry in grpo.log_history)  # left-clipped tokens
    assert not said_by_grpo and "left_drift_warning" in caplog.text


def test_the_logged_metric_keys(tmp_path):
    grpo, cegppo = differential(tmp_path)
    assert grpo.metric_keys < cegppo.metric_keys
    assert {k.split("/")[0] for k in cegppo.metric_keys - grpo.metric_keys} == {"cegppo"}


def test_the_model_card(tmp_path):
    grpo, cegppo = differential(
        tmp_path, script=(lambda trainer: trainer.create_model_card() or trainer.save_model(),)
    )
    cards = [Path(o.trainer.args.output_dir) / "README.md" for o in (grpo, cegppo)]
    assert not cards[0].exists() or "## CE-GPPO settings" not in cards[0].read_text()  # TRL's, if any
    assert "## CE-GPPO settings" in cards[1].read_text()


# ----------------------------------------------------------------------------------------------------------------
# The checkpoint rows (docs/usage.md has the protocol; tests/test_preemption.py one test per rule)
# ----------------------------------------------------------------------------------------------------------------
def test_a_second_live_run_into_the_same_output_dir(tmp_path):
    from cegppo_trl.checkpoints import acquire_lock, release_lock

    held = [acquire_lock(str(tmp_path / cls.__name__))[0] for cls, _ in PAIR]  # another live run of each folder
    try:
        grpo, cegppo = differential(tmp_path)
    finally:
        for fd, (cls, _) in zip(held, PAIR):
            release_lock(fd, str(tmp_path / cls.__name__))
    assert grpo.error is None and grpo.trainer.state.global_step == 2
    assert cegppo.error is RuntimeError and "is written by another live run" in cegppo.message


@pytest.mark.slow
def test_resume_true_takes_the_newest_committed_checkpoint(tmp_path):
    def torn_then_resume(trainer):  # killed while writing checkpoint-4: its trainer state never written
        os.remove(os.path.join(trainer.args.output_dir, "checkpoint-4", "trainer_state.json"))
        trainer.args.max_steps = 6
        return trainer.train(resume_from_checkpoint=True)

    saves = dict(save_strategy="steps", save_steps=2, max_steps=4)
    grpo, cegppo = differential(tmp_path, script=("train", torn_then_resume), **saves)
    assert grpo.error is FileNotFoundError and "checkpoint-4" in grpo.message  # the highest-numbered folder
    assert cegppo.error is None and cegppo.trainer.state.global_step == 6  # checkpoint-2, then on to the end


def test_resume_true_with_no_checkpoint_raises_as_transformers_does_and_leaves_nothing(tmp_path):
    grpo, cegppo = differential(tmp_path, script=(lambda trainer: trainer.train(resume_from_checkpoint=True),))
    assert grpo.error is cegppo.error is ValueError
    assert grpo.message.replace("GRPOTrainer", "CEGPPOTrainer") == cegppo.message  # each names its own folder
    assert "No valid checkpoint found" in cegppo.message and not (tmp_path / "CEGPPOTrainer" / LOCK_FILE).exists()


def _resume_at(max_steps: int, checkpoint: str | None = None):
    def resume(trainer):
        trainer.args.max_steps = max_steps
        return trainer.train(resume_from_checkpoint=checkpoint or True)

    return resume


@pytest.mark.slow
def test_resuming_past_the_end_as_transformers_does(tmp_path):
    saves = dict(save_strategy="steps", save_steps=2)
    grpo, cegppo = differential(tmp_path, script=("train", _resume_at(1)), **saves)
    assert grpo.error is None and cegppo.error is None
    assert grpo.trainer.state.global_step == cegppo.trainer.state.global_step == 3  # one step past `max_steps`
    assert all(torch.equal(v, cegppo.params[k]) for k, v in grpo.params.items())


@pytest.mark.slow
def test_checkpoint_folders_and_resuming_another_trainers_checkpoint(tmp_path):
    saves = dict(save_strategy="steps", save_steps=2)
    grpo, cegppo = differential(tmp_path, **saves)
    folders = [tmp_path / cls.__name__ / "checkpoint-2" for cls, _ in PAIR]
    assert not (folders[0] / "cegppo_commit.json").exists() and (folders[1] / "cegppo_commit.json").exists()
    assert not (folders[1] / "cegppo_state.json").exists()  # the run state is in trainer_state.json
    # GRPOTrainer's checkpoint, resumed by each trainer into a folder of its own: both go on
    grpo, cegppo = differential(tmp_path / "again", script=(_resume_at(4, str(folders[0])),), **saves)
    assert grpo.error is None and cegppo.error is None
    assert grpo.trainer.state.global_step == cegppo.trainer.state.global_step == 4
    # a checkpoint CEGPPOTrainer began and did not commit (killed before its marker): GRPOTrainer resumes it
    (folders[1] / "cegppo_commit.json").unlink()
    (folders[1].parent / "_cegppo_pending-checkpoint-2").write_text("")
    grpo, cegppo = differential(tmp_path / "torn", script=(_resume_at(4, str(folders[1])),), **saves)
    assert grpo.error is None and grpo.trainer.state.global_step == 4
    assert cegppo.error is ValueError and "has no cegppo_commit.json: a run of this library began" in cegppo.message


@pytest.mark.slow
def test_the_end_of_train_deletion_is_transformers(tmp_path):
    best = dict(save_strategy="steps", save_steps=2, eval_strategy="steps", eval_steps=2, save_total_limit=1,
                load_best_model_at_end=True, metric_for_best_model="reward", greater_is_better=False, max_steps=6)  # fmt: skip
    grpo, cegppo = differential(tmp_path, trainer_kwargs=dict(eval_dataset=prompts(4)), **best)
    assert grpo.error is None and cegppo.error is None, (grpo.message, cegppo.message)
    kept = [sorted(p.name for p in (tmp_path / cls.__name__).glob("checkpoint-*")) for cls, _ in PAIR]
    best_step = [o.trainer.state.best_model_checkpoint.rsplit("-", 1)[1] for o in (grpo, cegppo)]
    assert kept[0] == kept[1] == [f"checkpoint-{best_step[0]}"]  # transformers keeps only the best


@pytest.mark.slow
def test_three_epochs_off_policy_train_what_grpo_trainer_trains(tmp_path):
    # TRL's default `num_train_epochs`, two optimizer steps per rollout batch: every epoch draws TRL's order, so the
    # weights after 3 epochs (12 steps) are GRPOTrainer's bit for bit (with `seed + epoch` they were 0.02 apart)
    grpo, cegppo = differential(tmp_path, max_steps=-1, num_train_epochs=3)
    assert grpo.error is None and cegppo.error is None, (grpo.message, cegppo.message)
    assert grpo.trainer.state.global_step == cegppo.trainer.state.global_step == 12
    assert grpo.params.keys() == cegppo.params.keys()
    assert all(torch.equal(value, cegppo.params[name]) for name, value in grpo.params.items())
    assert any(not torch.equal(value, grpo.initial[name]) for name, value in grpo.params.items())
