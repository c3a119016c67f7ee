"""Reward-derived masks (SFT term, dynamic sampling), pure and through the trainer."""

from __future__ import annotations

import math

import pytest
import torch

from cegppo_trl.rollouts import correct_completions, informative_groups
from conftest import make_offpolicy_batch
from test_trainer import loss_and_grads, reference_per_token_loss

nan = math.nan


def test_correct_is_best_in_group_and_positive():
    rewards = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, -1.0, 0.2, 0.7, 0.7, nan, 0.0, 0.0])
    correct = correct_completions(rewards, num_generations=3)
    # group 1: the two +1 answers; group 2: none (best is -1, not positive); group 3: both 0.7;
    # group 4: best is 0.0, not positive, NaN is never correct.
    expected = [True, False, True, False, False, False, False, True, True, False, False, False]
    assert correct.tolist() == expected


def test_correct_with_threshold():
    rewards = torch.tensor([1.0, 0.5, nan, -1.0])
    assert correct_completions(rewards, 2, threshold=0.5).tolist() == [True, True, False, False]


def test_informative_groups_drop_all_equal_rewards():
    rewards = torch.tensor([1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 0.3, nan, 0.3, nan, nan, 2.0])
    # all-equal; mixed; equal once NaN is ignored; a single scorable completion
    assert informative_groups(rewards, 3).tolist() == [False] * 3 + [True] * 3 + [False] * 3 + [False] * 3


def test_group_size_mismatch_raises():
    with pytest.raises(ValueError, match="multiple of num_generations=4"):
        informative_groups(torch.zeros(6), 4)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_sft_term_adds_coef_times_nll_of_correct_completions(make_trainer, loss_type):
    trainer = make_trainer(loss_type=loss_type, sft_loss_coef=0.1)
    inputs = make_offpolicy_batch(trainer, seed=7)
    sft_mask = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0])
    inputs["sft_mask"] = sft_mask
    cmask = inputs["completion_mask"]
    inputs["num_sft_items_in_batch"] = (cmask * sft_mask[:, None]).sum()
    loss, grads = loss_and_grads(trainer, inputs)

    model = trainer.model
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], cmask], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, 7)
    per_token, _, _ = reference_per_token_loss(logp, inputs["old_per_token_logps"], inputs["advantages"], 0.5, 1.0)
    sft_tokens = cmask * sft_mask[:, None]
    if loss_type == "dapo":  # token-means over the batch
        policy = (per_token * cmask).sum() / cmask.sum()
        nll = (-logp * sft_tokens).sum() / sft_tokens.sum()
    else:  # sequence-mean, then mean over the (correct) sequences
        policy = ((per_token * cmask).sum(-1) / cmask.sum(-1)).mean()
        nll = ((-logp * sft_tokens).sum(-1) / cmask.sum(-1)).sum() / sft_mask.sum()
    expected = policy + 0.1 * nll
    expected_grads = torch.autograd.grad(expected, list(model.parameters()))
    torch.testing.assert_close(loss, expected.detach())
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert trainer._metrics["train"]["cegppo/sft_loss"][-1] == pytest.approx(nll.item(), rel=1e-5)


def test_dynamic_sampling_excludes_dropped_groups_from_loss_and_normaliser(make_trainer):
    trainer = make_trainer(dynamic_sampling=True)
    inputs = make_offpolicy_batch(trainer, seed=8)
    keep = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    cmask = inputs["completion_mask"]
    inputs["keep_mask"] = keep
    inputs["num_items_in_batch"] = (cmask * keep[:, None]).sum()
    loss, _ = loss_and_grads(trainer, inputs)

    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], cmask], 1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, 7)
    per_token, _, _ = reference_per_token_loss(logp, inputs["old_per_token_logps"], inputs["advantages"], 0.5, 1.0)
    kept_tokens = cmask * keep[:, None]
    torch.testing.assert_close(loss, (per_token * kept_tokens).sum() / kept_tokens.sum())


def test_generation_marks_constant_groups_and_correct_completions(make_trainer):
    def reward(completions, prompts, **kwargs):
        # Prompts starting with "0" get a constant reward (a zero-advantage group); the others get -1.5 .. 1.5 by
        # position in the group, so only the last completion of each group is "correct".
        return [1.0 if p.startswith("0") else (i % 4) - 1.5 for i, p in enumerate(prompts)]

    trainer = make_trainer(reward_funcs=reward, dynamic_sampling=True, sft_loss_coef=0.1, num_generations=4)
    trainer.model.train()
    prompts = ["0+0=", "1+1=", "0+5=", "7+2="]
    batch = [{"prompt": p} for p in prompts for _ in range(4)]
    torch.manual_seed(0)
    out = trainer._generate_and_score_completions(batch)
    assert out["keep_mask"].tolist() == [0.0] * 4 + [1.0] * 4 + [0.0] * 4 + [1.0] * 4
    kept_tokens = (out["completion_mask"] * out["keep_mask"][:, None]).sum()
    assert out["num_items_in_batch"].item() == kept_tokens.item()
    # Correct = best positive reward in its group, within kept groups only (the constant-1.0 groups are dropped).
    expected = torch.tensor([False] * 7 + [True] + [False] * 7 + [True])
    assert out["sft_mask"].bool().tolist() == expected.tolist()
    metrics = trainer._metrics["train"]
    assert metrics["cegppo/dynamic_sampling/kept_groups"][-1] == 2
    assert metrics["cegppo/dynamic_sampling/dropped_groups"][-1] == 2
    assert metrics["cegppo/sft_frac"][-1] == pytest.approx(2 / 16)


def test_training_with_the_full_authors_recipe_logs_its_terms(make_trainer):
    trainer = make_trainer(
        dynamic_sampling=True, sft_loss_coef=0.1, delta=10.0, steps_per_generation=2, max_steps=4,
        per_device_train_batch_size=4,
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "cegppo/beta1" in h]
    assert len(logs) == 4
    generation_logs = [h for h in logs if "cegppo/dynamic_sampling/kept_groups" in h]
    assert generation_logs, "dynamic sampling counts are logged once per generation batch"
    for h in generation_logs:
        assert h["cegppo/dynamic_sampling/kept_groups"] + h["cegppo/dynamic_sampling/dropped_groups"] == 2
        assert 0.0 <= h["cegppo/sft_frac"] <= 1.0
    assert all(math.isfinite(h["loss"]) for h in logs)
