"""A run whose every group has zero reward spread trains on nothing: the trainer says which kind (all top, all lowest,
all equal) at the first such batch and stops after `max_zero_signal_batches` in a row; dynamic sampling agrees."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.demos.tiny import build_tiny_llama
from cegppo_trl.monitoring import RewardSignalMonitor


def _constant(value: float, declared: bool = True):
    def reward(completions, **kwargs):
        return [value] * len(completions)

    reward.__name__ = f"constant_{value}"
    if declared:
        reward.reward_range = (0.0, 1.0)
    return reward


@pytest.mark.parametrize(
    ("value", "declared", "kind"),
    [
        (1.0, True, "every completion got the top reward (1)"),
        (0.0, True, "every completion got the lowest reward (0)"),
        (0.5, True, "not all the lowest or all the top one (0 to 1): the reward is constant"),
        (1.0, False, "declare no score range"),  # unknown range, one value seen: cannot tell top from lowest
    ],
)
def test_each_kind_of_zero_signal_batch_warns_once_per_streak_naming_it(make_trainer, caplog, value, declared, kind):
    trainer = make_trainer(reward_funcs=_constant(value, declared), max_steps=2)
    with caplog.at_level(logging.WARNING):
        trainer.train()  # the default limit (100) does not stop a 2-batch run
    messages = [r.getMessage() for r in caplog.records if "No learning signal" in r.getMessage()]
    assert len(messages) == 1, messages  # the first batch of the streak, not every batch
    assert kind in messages[0]
    assert "training stops after 100 such batches in a row" in messages[0]
    assert trainer.reward_monitor.zero_signal_batches == 2


def test_a_streak_of_zero_signal_batches_stops_cleanly_at_max_zero_signal_batches(make_trainer, caplog):
    # A solved task: every completion gets the top reward. The stop is transformers' `should_training_stop`: the
    # step finishes, `train()` returns and `on_train_end` runs (no exception).
    trainer = make_trainer(reward_funcs=_constant(1.0), max_steps=5, max_zero_signal_batches=2)
    ended = []
    trainer.add_callback(type("Ended", (TrainerCallback,), {"on_train_end": lambda self, *a, **k: ended.append(1)}))
    with caplog.at_level(logging.WARNING):
        output = trainer.train()
    assert output.global_step == trainer.state.global_step == 2  # the 2nd zero-signal batch's step, then stop
    assert ended == [1]
    assert trainer.stop_reason == "zero_signal"
    message = trainer.reward_monitor.stop_message
    assert message.startswith("No learning signal in the last 2 rollout batch(es)")
    assert "every completion got the top reward (1): the task is solved" in message
    assert "Training stops after this step (`max_zero_signal_batches=2`, 0 never stops)." in message
    assert message in caplog.text


def test_the_stop_waits_for_the_end_of_the_optimizer_step_and_saves_per_the_save_strategy(make_trainer, tmp_path):
    # Two micro-batches per step and two steps per rollout batch: the stop is decided in the first micro-batch of
    # step 1 (generation) and taken when that step ends; `save_steps=2` (the rollout batch's end) saves nothing.
    trainer = make_trainer(
        reward_funcs=_constant(0.0), max_steps=6, max_zero_signal_batches=1, per_device_train_batch_size=4,
        gradient_accumulation_steps=2, steps_per_generation=4, save_strategy="steps", save_steps=2,
    )  # fmt: skip
    trainer.train()
    assert trainer.state.global_step == 1 and trainer.stop_reason == "zero_signal"
    assert trainer.reward_monitor.zero_signal_kind == "lowest"
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == []  # step 1 is inside its rollout batch


@pytest.mark.slow
def test_a_second_train_starts_without_the_previous_stop(make_trainer):
    trainer = make_trainer(reward_funcs=_constant(1.0), max_steps=2, max_zero_signal_batches=1)
    trainer.train()
    assert trainer.stop_reason == "zero_signal"
    trainer.reward_monitor.max_zero_signal_batches = 0
    trainer.train()
    assert trainer.state.global_step == 2  # not stopped at step 1 again; a run without signal still says so at its end
    assert trainer.reward_monitor.stop_message.startswith("No optimizer step of this run had a learning signal")


def test_a_batch_without_a_trained_token_or_with_an_infinite_reward_has_no_signal_and_says_which():
    monitor = RewardSignalMonitor(max_zero_signal_batches=0, reward_range=(0.0, 1.0))
    rewards, advantages = torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.tensor([-1.0, 1.0, 1.0, -1.0])
    assert monitor.observe_signal(rewards, advantages, 2, trained=torch.tensor([True, False, True, True])) is None
    warning = monitor.observe_signal(rewards, advantages, 2, trained=torch.zeros(4, dtype=torch.bool))
    assert monitor.zero_signal_kind == "masked" and "`mask_truncated_completions=True`" in warning
    infinite = torch.tensor([math.inf, 1.0, -math.inf, 0.0])  # TRL's advantages of such groups are NaN
    warning = monitor.observe_signal(infinite, torch.full((4,), math.nan), 2)
    assert monitor.zero_signal_kind == "nonfinite" and "a reward is infinite (-inf, inf)" in warning
    assert monitor.zero_signal_batches == 2 and monitor.observed_max == 1.0  # inf does not become the top


def test_every_completion_masked_out_of_the_loss_counts_as_no_signal(make_trainer):
    # `mask_truncated_completions` with a completion length no completion ends within: nothing is trained.
    def spread(completions, **kwargs):
        return [float(i % 2) for i in range(len(completions))]

    trainer = make_trainer(
        reward_funcs=spread, max_steps=3, max_zero_signal_batches=2, mask_truncated_completions=True,
        max_completion_length=1,
    )  # fmt: skip
    trainer.train()
    assert trainer.stop_reason == "zero_signal" and trainer.reward_monitor.zero_signal_kind == "masked"
    assert trainer.state.global_step == 2


@pytest.mark.slow
def test_a_batch_with_signal_resets_the_streak_and_0_never_stops(make_trainer):
    calls = []

    def signal_every_other_batch(completions, **kwargs):
        calls.append(1)
        return [1.0] * len(completions) if len(calls) % 2 else [float(i % 2) for i in range(len(completions))]

    trainer = make_trainer(reward_funcs=signal_every_other_batch, max_steps=4, max_zero_signal_batches=2)
    assert calls == []  # the pre-flight calls no reward of yours: every call is a training batch's
    trainer.train()  # constant, signal, constant, signal: never two in a row
    assert trainer.state.global_step == 4
    assert make_trainer(reward_funcs=_constant(1.0), max_steps=3, max_zero_signal_batches=0).train().global_step == 3


def test_zero_signal_batches_are_exactly_those_dynamic_sampling_empties(make_trainer):
    calls = []

    def constant_then_spread(completions, **kwargs):
        calls.append(1)
        return [0.0] * len(completions) if len(calls) <= 2 else [float(i % 2) for i in range(len(completions))]

    trainer = make_trainer(
        reward_funcs=constant_then_spread, max_steps=3, dynamic_sampling=True, gradient_accumulation_steps=1
    )
    assert calls == []  # the pre-flight calls no reward of yours: every call is a training batch's
    counts = []
    original = trainer.reward_monitor.observe_signal

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        counts.append(trainer.reward_monitor.zero_signal_batches)
        return out

    trainer.reward_monitor.observe_signal = spy
    trainer.train()
    kept = [log["cegppo/dynamic_sampling/kept_groups"] for log in trainer.state.log_history if "epoch" in log
            and "cegppo/dynamic_sampling/kept_groups" in log]  # fmt: skip
    assert counts == [1, 2, 0]
    assert [k == 0 for k in kept] == [c > 0 for c in counts]


def test_monitor_state_is_json_and_round_trips():
    monitor = RewardSignalMonitor(max_zero_signal_batches=5, reward_range=(-1.0, 1.0), reward_names=["gsm8k"])
    rewards = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    assert "lowest reward (-1)" in monitor.observe_signal(rewards, torch.zeros(4), 2)
    state = json.loads(json.dumps(monitor.state_dict()))
    fresh = RewardSignalMonitor(max_zero_signal_batches=5, reward_range=(-1.0, 1.0))
    fresh.load_state_dict(state)
    assert fresh.state_dict() == monitor.state_dict() and fresh.zero_signal_batches == 1
    # a resumed streak continues: the 5th batch in a row stops
    for _ in range(3):
        fresh.observe_signal(rewards, torch.zeros(4), 2)
    assert fresh.stop_reason is None
    assert "last 5 rollout batch" in fresh.observe_signal(rewards, torch.zeros(4), 2)
    assert fresh.stop_reason == "zero_signal" and "stop_reason" not in fresh.state_dict()


def test_kinds_from_the_runs_extremes_when_the_rewards_declare_no_range():
    monitor = RewardSignalMonitor(max_zero_signal_batches=0)
    # a batch with signal shows the run's range 0..2
    assert monitor.observe_signal(torch.tensor([0.0, 2.0, 1.0, 1.0]), torch.tensor([-1.0, 1.0, 0.0, 0.0]), 2) is None
    assert monitor.classify(torch.tensor([2.0, 2.0, 2.0, 2.0]), 2)[0] == "top"
    assert monitor.classify(torch.tensor([0.0, 0.0, 0.0, 0.0]), 2)[0] == "lowest"
    assert monitor.classify(torch.tensor([0.0, 0.0, 2.0, 2.0]), 2)[0] == "mixed"
    assert monitor.classify(torch.tensor([1.0, 1.0, 1.0, 1.0]), 2)[0] == "equal"


def test_the_total_rewards_range_is_the_weighted_sum_of_declared_ranges_or_unknown(tmp_path):
    from types import SimpleNamespace

    def ranged(low, high):
        return SimpleNamespace(reward_range=(low, high))

    args = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")

    def total_range(funcs, weights):
        trainer = SimpleNamespace(args=args, reward_funcs=funcs, reward_weights=torch.tensor(weights),
                                  reward_func_names=[f"r{i}" for i in range(len(funcs))])  # fmt: skip
        return RewardSignalMonitor.for_trainer(trainer).reward_range

    assert total_range([ranged(-1.0, 1.0), ranged(0.0, 1.0)], [1.0, -0.5]) == (-1.5, 1.0)
    assert total_range([ranged(-1.0, 1.0), SimpleNamespace()], [1.0, 1.0]) is None  # one reward declares none
    assert total_range([], []) is None  # no reward function (an environment's own reward): the run's extremes


def test_unscorable_batches_count_in_the_monitor_and_do_not_count_as_zero_signal(make_trainer):
    def none_reward(completions, **kwargs):
        return [None] * len(completions)

    trainer = make_trainer(reward_funcs=none_reward, max_steps=2, max_zero_signal_batches=1)
    trainer.train()  # two unscorable batches: `max_unscorable_batches` (10) decides, not the zero-signal limit
    assert trainer.reward_monitor.unscorable_batches == 2 and trainer.reward_monitor.zero_signal_batches == 0


@pytest.mark.slow
def test_the_default_does_not_stop_trls_own_constant_reward_test_layout(tmp_path, tokenizer):
    # TRL's `test_reward_metric_reflects_reward_weights` (tests/test_grpo_trainer.py, TRL 1.16): two constant rewards
    # weighted 0.7/0.3 on the 17 training prompts of `trl-internal-testing/zen`, 3 prompt completions per batch, 3
    # epochs (the default): 51 rollout batches in a row without any spread. A drop-in CEGPPOTrainer must finish it.
    dataset = Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(17)]})
    args = CEGPPOConfig(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no", learning_rate=0.1,
        per_device_train_batch_size=3, num_generations=3, max_completion_length=8, reward_weights=[0.7, 0.3],
        disable_tqdm=True, logging_steps=100,
    )  # fmt: skip
    trainer = CEGPPOTrainer(
        model=build_tiny_llama(tokenizer, seed=0),
        reward_funcs=[_constant(1.0, declared=False), _constant(0.0, declared=False)],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()
    assert trainer.state.global_step == 51
    assert trainer.reward_monitor.zero_signal_batches == 51 < args.max_zero_signal_batches


def test_a_reward_with_spread_never_warns(make_trainer, caplog):
    def spread(completions, **kwargs):
        return [float(i % 2) for i in range(len(completions))]

    with caplog.at_level(logging.WARNING):
        make_trainer(reward_funcs=spread, max_steps=2).train()
    assert "No learning signal" not in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize(
    ("reward", "limit", "status", "needle"),
    [
        ("helpers.stops.solved", "--max_zero_signal_batches", 3, "every completion got the top reward (1)"),
        ("helpers.stops.cannot_score", "--max_unscorable_batches", 4, "returned None or NaN for all"),
    ],
)
def test_cegppo_train_stopped_saves_the_final_model_and_card_and_exits_with_the_reasons_status(
    model_dir, data_file, tmp_path, capsys, reward, limit, status, needle
):
    # A solved task and an unscorable reward each end with the final model and model card saved,
    # one message naming why, and an exit status that tells them apart (3: nothing left to learn; 4: cannot score).
    from cegppo_trl.cli import _build_parser
    from cegppo_trl.cli import main as cli
    from cegppo_trl.monitoring import STOP_EXIT_STATUS

    assert STOP_EXIT_STATUS == {"zero_signal": 3, "unscorable": 4}
    epilog = _build_parser().epilog
    assert "3  nothing to learn" in epilog and "4  the reward cannot score this data" in epilog
    out = tmp_path / "run"
    code = cli(["train", "--config", "cpu_smoke", "--model_name_or_path", model_dir, "--dataset_name", data_file,
                "--output_dir", str(out), "--reward_funcs", reward, limit, "2", "--max_steps", "6",
                "--disable_tqdm", "true"])  # fmt: skip
    assert code == status
    stderr = capsys.readouterr().err
    assert "cegppo train: stopped at step 3: " in stderr and needle in stderr  # 2 steps per rollout batch
    card = (out / "README.md").read_text()
    assert (out / "model.safetensors").exists() and "CE-GPPO" in card
    # The card says the run was stopped, and why (it read like a finished run's).
    assert "**Stopped early, for lack of a learning signal**, at step 3: " in card and needle in card


@pytest.mark.parametrize(
    ("reward", "reason"),
    [(_constant(1.0), "zero_signal"), (_constant(float("inf")), "zero_signal"), (_constant(None), "unscorable")],
)
def test_a_run_too_short_for_either_limit_without_any_signal_does_not_end_as_a_success(make_trainer, reward, reason):
    """Two steps, far below both limits: no optimizer step had a learning signal, so the run ends with a reason."""
    trainer = make_trainer(reward_funcs=reward, max_steps=2)
    trainer.train()
    assert trainer.state.global_step == 2 and trainer.stop_reason == reason
    assert "this run" in trainer.reward_monitor.stop_message


def test_one_batch_with_signal_makes_the_run_a_success_and_a_resume_keeps_what_it_saw():
    monitor = RewardSignalMonitor(reward_range=(0.0, 1.0))
    flat, spread = torch.tensor([1.0, 1.0, 1.0, 1.0]), torch.tensor([0.0, 1.0, 1.0, 0.0])
    monitor.observe_rewards(flat.unsqueeze(1))  # scored, every group flat
    monitor.observe_signal(flat, torch.zeros(4), 2)
    assert monitor.end_of_run(steps=1) is not None and monitor.stop_reason == "zero_signal"
    monitor = RewardSignalMonitor(reward_range=(0.0, 1.0))
    monitor.observe_signal(spread, torch.tensor([-1.0, 1.0, 1.0, -1.0]), 2)
    monitor.observe_signal(flat, torch.zeros(4), 2)
    resumed = RewardSignalMonitor(reward_range=(0.0, 1.0))
    resumed.load_state_dict(json.loads(json.dumps(monitor.state_dict())))
    assert resumed.end_of_run(steps=2) is None and resumed.stop_reason is None
