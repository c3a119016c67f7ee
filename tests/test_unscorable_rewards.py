"""A run whose rewards are all None/NaN (unscorable task, broken reward function) stops instead of training nothing;
a shorter run of such batches warns and goes on, as TRL's `GRPOTrainer` does."""

from __future__ import annotations

import logging
import math

import pytest

from cegppo_trl import CEGPPOConfig


def no_reward(completions, **kwargs):
    return [None] * len(completions)


def nan_reward(completions, **kwargs):
    return [math.nan] * len(completions)


def test_all_none_and_nan_rewards_stop_cleanly_with_a_message_naming_the_reward_functions(make_trainer, caplog):
    trainer = make_trainer(reward_funcs=[no_reward, nan_reward], max_steps=2, max_unscorable_batches=1)
    with caplog.at_level(logging.WARNING):
        output = trainer.train()  # returns: a stop, not an exception
    assert output.global_step == 1 and trainer.stop_reason == "unscorable"  # the step finished, then the stop
    message = trainer.reward_monitor.stop_message
    assert "every reward function (no_reward, nan_reward) returned None or NaN for all 8 completions" in message
    assert "Training stops after this step (`max_unscorable_batches=1`, 0 never stops)" in message
    assert message in caplog.text


@pytest.mark.slow
def test_max_unscorable_batches_counts_consecutive_unscorable_batches(make_trainer):
    calls = []

    def first_batch_unscorable(completions, **kwargs):
        calls.append(len(completions))
        return [None] * len(completions) if len(calls) == 1 else [float(c.count("1")) for c in completions]

    trainer = make_trainer(reward_funcs=first_batch_unscorable, max_steps=2, max_unscorable_batches=2)
    assert calls == []  # the pre-flight calls no reward of yours: every call is a training batch's
    trainer.train()  # one unscorable batch, then a scorable one: no stop
    assert trainer.state.global_step == 2

    trainer = make_trainer(reward_funcs=no_reward, max_steps=3, max_unscorable_batches=2)
    trainer.train()
    assert trainer.stop_reason == "unscorable" and "last 2 rollout batch" in trainer.reward_monitor.stop_message
    assert trainer.state.global_step == 2  # both unscorable batches took their (zero-gradient) steps


@pytest.mark.slow
def test_partially_scorable_batches_and_max_unscorable_batches_0_keep_training(make_trainer):
    def half(completions, **kwargs):
        return [None if i % 2 else float(c.count("1")) for i, c in enumerate(completions)]

    assert make_trainer(reward_funcs=half, max_steps=1).train().global_step == 1
    assert make_trainer(reward_funcs=no_reward, max_steps=1, max_unscorable_batches=0).train().global_step == 1


def test_one_unscorable_batch_warns_as_trl_does_and_training_goes_on(make_trainer, caplog):
    # TRL's own test (`test_warning_raised_all_rewards_none`) asserts this warning; with the default limit a single
    # unscorable batch must not stop the run.
    assert CEGPPOConfig.__dataclass_fields__["max_unscorable_batches"].default == 10
    calls = []

    def first_batch_unscorable(completions, **kwargs):
        calls.append(1)
        return [None] * len(completions) if len(calls) == 1 else [float(c.count("1")) for c in completions]

    trainer = make_trainer(reward_funcs=first_batch_unscorable, max_steps=2)
    assert calls == []  # the pre-flight calls no reward of yours: every call is a training batch's
    with caplog.at_level(logging.WARNING):
        trainer.train()
    assert trainer.state.global_step == 2
    assert "All reward functions returned None for the following kwargs:" in caplog.text  # TRL's warning
    assert "1 consecutive unscorable batch(es); training stops at 10 (`max_unscorable_batches`)" in caplog.text


def test_a_sustained_run_of_unscorable_batches_stops_with_the_message(make_trainer):
    trainer = make_trainer(reward_funcs=no_reward, max_steps=5, max_unscorable_batches=3)
    trainer.train()
    assert trainer.state.global_step == 3  # batches 1 and 2 warned, the 3rd stopped after its step
    assert trainer.reward_monitor.stop_message.startswith("No completion of the last 3 rollout batch(es) got a reward")


def _score(trainer, rewards_per_func):
    """The trainer's `_calculate_rewards` hook on a batch whose rewards TRL computed as `rewards_per_func`."""
    from unittest import mock

    from trl import GRPOTrainer

    with mock.patch.object(GRPOTrainer, "_calculate_rewards", lambda *args: rewards_per_func):
        trainer._calculate_rewards(None, None, None, None)


def test_evaluation_batches_neither_count_nor_reset_the_run_of_unscorable_training_batches(make_trainer):
    import torch

    trainer = make_trainer(max_unscorable_batches=2)
    unscorable, scorable = torch.full((8, 1), math.nan), torch.ones(8, 1)
    trainer.model.train()
    _score(trainer, unscorable)  # 1 of 2
    trainer.model.eval()
    _score(trainer, unscorable)  # an unscorable evaluation batch does not add to the count
    _score(trainer, scorable)  # nor does a scorable one reset it
    trainer.model.train()
    assert trainer.stop_reason is None
    _score(trainer, unscorable)
    assert trainer.stop_reason == "unscorable" and "last 2 rollout batch" in trainer.reward_monitor.stop_message
