"""Rewards as TRL takes them, through both trainers (the differential harness of tests/test_drop_in.py): a sync and
an async reward together (TRL's own `test_train_sync_and_async_reward_funcs`), a reward that parses JSON, and a
reward with a side effect, which `CEGPPOTrainer` must not call before training (its pre-flight reads signatures).
Off-policy and clipping (learning rate 0.2, four optimizer steps on one rollout batch), so that beta = 0 being
GRPO is tested where CE-GPPO's surrogate differs from PPO's."""

from __future__ import annotations

import json

import pytest
from datasets import Dataset
from test_drop_in import PAIR, _text, assert_same, ones_reward, run_script

CLIPPING = dict(learning_rate=0.2, steps_per_generation=4, gradient_accumulation_steps=1, max_steps=4)
CALLS: list[int] = []  # the side effect: one entry per call of `counting_reward`


async def async_twos_reward(completions, **kwargs):
    """An async reward, as TRL's test writes one: TRL awaits it beside the sync ones."""
    return [float(_text(c).count("2")) for c in completions]


def json_reward(completions, spec, **kwargs):
    """Reads its target from a JSON column, and a completion as JSON when it is one (the tiny model's rarely are)."""
    scores = []
    for completion, raw in zip(completions, spec, strict=True):
        target = json.loads(raw)["digit"]
        try:
            answer = str(json.loads(_text(completion)))
        except ValueError:
            answer = _text(completion)
        scores.append(float(answer.count(target)))
    return scores


def counting_reward(completions, **kwargs):
    """A reward with a side effect (a judge's bill, a remote verifier, a counter): called only during training."""
    CALLS.append(len(completions))
    return [float(_text(c).count("3")) for c in completions]


def json_prompts(n: int = 8) -> Dataset:
    return Dataset.from_dict(
        {"prompt": [f"{i}+{i % 7}=" for i in range(n)], "spec": [json.dumps({"digit": str(i % 3)}) for i in range(n)]}
    )


@pytest.mark.slow  # 4 s: two trainers, four rewards
def test_sync_async_json_and_side_effect_rewards_have_the_same_outcome_with_both_trainers(tmp_path):
    rewards = [ones_reward, async_twos_reward, json_reward, counting_reward]
    calls = lambda trainer: len(CALLS)  # noqa: E731 (a script step: the side effects so far)
    outcomes = []
    for trainer_cls, config_cls in PAIR:
        CALLS.clear()
        outcome = run_script(trainer_cls, config_cls, tmp_path, script=(calls, "train", calls), reward_funcs=rewards,
                             train_dataset=json_prompts(), **CLIPPING)  # fmt: skip
        assert outcome.error is None, outcome.message
        before, _, after = outcome.results
        assert before == 0 and after > 0, (trainer_cls.__name__, outcome.results)  # only training calls it
        outcomes.append(outcome)
    grpo, cegppo = outcomes
    assert grpo.results[2] == cegppo.results[2]  # the same calls, in number
    assert any(entry.get("clip_ratio/region_mean", 0) > 0 for entry in grpo.log_history)  # it did clip
    for name in ("ones_reward", "async_twos_reward", "json_reward", "counting_reward"):
        assert f"rewards/{name}/mean" in grpo.metric_keys
    assert_same(grpo, cegppo)
