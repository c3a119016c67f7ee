"""A run whose every group has zero reward spread trains on nothing: the trainer says which kind (all top, all lowest,
all equal) at the first such batch and stops after `max_zero_signal_batches` in a row; dynamic sampling agrees."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from datasets import Dataset

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.monitoring import RewardSignalMonitor, total_reward_range
from cegppo_trl.offline.tiny import build_tiny_llama


def _constant(value: float, declared: bool = True):
    def reward(completions, **kwargs):
        return [value] * len(completions)

    reward.__name__ = f"constant_{value:g}"
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


def test_a_streak_of_zero_signal_batches_stops_at_max_zero_signal_batches(make_trainer):
    trainer = make_trainer(reward_funcs=_constant(0.0), max_steps=5, max_zero_signal_batches=2)
    with pytest.raises(RuntimeError, match=r"No learning signal in the last 2 rollout batch.*lowest reward.*"
                       r"`cegppo check`.*`max_zero_signal_batches=2`"):  # fmt: skip
        trainer.train()
    assert trainer.state.global_step == 1  # the first zero-signal batch still took its (zero-gradient) step


def test_a_batch_with_signal_resets_the_streak_and_0_never_stops(make_trainer):
    calls = []

    def signal_every_other_batch(completions, **kwargs):
        calls.append(1)
        return [1.0] * len(completions) if len(calls) % 2 else [float(i % 2) for i in range(len(completions))]

    trainer = make_trainer(reward_funcs=signal_every_other_batch, max_steps=4, max_zero_signal_batches=2)
    calls.clear()  # the pre-flight's dry call: count the training calls only
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
    calls.clear()  # the pre-flight's dry call: count the training calls only
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
    with pytest.raises(RuntimeError, match="last 5 rollout batch"):
        fresh.observe_signal(rewards, torch.zeros(4), 2)


def test_kinds_from_the_runs_extremes_when_the_rewards_declare_no_range():
    monitor = RewardSignalMonitor(max_zero_signal_batches=0)
    # a batch with signal shows the run's range 0..2
    assert monitor.observe_signal(torch.tensor([0.0, 2.0, 1.0, 1.0]), torch.tensor([-1.0, 1.0, 0.0, 0.0]), 2) is None
    assert monitor.classify(torch.tensor([2.0, 2.0, 2.0, 2.0]), 2)[0] == "top"
    assert monitor.classify(torch.tensor([0.0, 0.0, 0.0, 0.0]), 2)[0] == "lowest"
    assert monitor.classify(torch.tensor([0.0, 0.0, 2.0, 2.0]), 2)[0] == "mixed"
    assert monitor.classify(torch.tensor([1.0, 1.0, 1.0, 1.0]), 2)[0] == "equal"
    assert total_reward_range([(-1.0, 1.0), (0.0, 1.0)], [1.0, -0.5]) == (-1.5, 1.0)
    assert total_reward_range([(-1.0, 1.0), None], [1.0, 1.0]) is None


def test_unscorable_batches_count_in_the_monitor_and_do_not_count_as_zero_signal(make_trainer):
    def none_reward(completions, **kwargs):
        return [None] * len(completions)

    trainer = make_trainer(reward_funcs=none_reward, max_steps=2, max_zero_signal_batches=1)
    trainer.train()  # two unscorable batches: `max_unscorable_batches` (10) decides, not the zero-signal limit
    assert trainer.reward_monitor.unscorable_batches == 2 and trainer.reward_monitor.zero_signal_batches == 0


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
