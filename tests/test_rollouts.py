"""Reward-derived masks (SFT term, dynamic sampling), pure and through the trainer."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.batches import loss_and_grads, make_offpolicy_batch
from helpers.reference import reference_per_token_loss, trl_clip_loss

from cegppo_trl.rollouts import correct_completions, informative_groups, rollout_batch_masks, total_rewards

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


def test_total_rewards_sum_the_weighted_scorable_rewards_and_mark_the_unscorable():
    # [1, None] -> 1; [None, None] -> unscorable (NaN, not nansum's 0); [2, 3] with weights (1, 0.5) -> 3.5.
    rewards, unscorable = total_rewards(torch.tensor([[1.0, nan], [nan, nan], [2.0, 3.0]]), torch.tensor([1.0, 0.5]))
    assert rewards[0].item() == 1.0 and math.isnan(rewards[1].item()) and rewards[2].item() == 3.5
    assert unscorable.tolist() == [False, True, False]


def _two_process_gather(other_process_values):
    """`accelerator.gather` as process 1 of 2 sees it: process 0's values (given, in call order), then its own."""
    queue = list(other_process_values)
    return lambda local: torch.cat([queue.pop(0).reshape(-1), local.reshape(-1)])


def _masks_of_process_1(**settings):
    # Two groups of two, one per process. Group 0 (process 0): rewards 1, 1, zero spread; group 1 (process 1): 1, -1.
    rewards_per_func = torch.tensor([[1.0], [1.0], [1.0], [-1.0]])
    loss_mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])  # process 1's completions: 5 tokens
    rewards, _ = total_rewards(rewards_per_func, torch.tensor([1.0]))
    advantages = torch.tensor([0.0, 0.0, 1.0, -1.0])  # all processes' (TRL's: 0 in the flat group of process 0)
    # Process 0's gathered values, in the order the function gathers: its kept tokens (none: its group is dropped, or
    # 3 when nothing is dropped); its correct completions' tokens.
    others = settings.pop("others")
    return rollout_batch_masks(
        rewards, advantages, loss_mask, process_index=1, num_generations=2, gather=_two_process_gather(others),
        **settings,
    )  # fmt: skip


def test_rollout_batch_masks_drop_the_flat_group_and_count_only_the_kept_groups():
    zero = torch.tensor(0.0)
    outputs, metrics = _masks_of_process_1(
        dynamic_sampling=True, sft_loss_coef=0.1, sft_reward_threshold=None, others=[zero, zero]
    )
    # keep = [0, 0, 1, 1]: process 1 keeps both of its completions, 2 sequences and 0 + 5 tokens in the batch.
    assert outputs["keep_mask"].tolist() == [1.0, 1.0]
    assert outputs["num_items_in_batch"].item() == 5.0
    # Correct: the best positive reward of its group: [1, 1, 1, 0], of the kept groups only: [0, 0, 1, 0].
    assert outputs["sft_mask"].tolist() == [1.0, 0.0]
    assert outputs["num_sft_items_in_batch"].item() == 3.0
    assert metrics == {
        "cegppo/dynamic_sampling/kept_groups": 1, "cegppo/dynamic_sampling/dropped_groups": 1, "cegppo/sft_frac": 0.25
    }  # fmt: skip


def test_rollout_batch_masks_without_dynamic_sampling_keep_every_group():
    outputs, metrics = _masks_of_process_1(
        dynamic_sampling=False, sft_loss_coef=0.1, sft_reward_threshold=None, others=[torch.tensor(3.0)]
    )
    # No keep mask; correct [1, 1, 1, 0]: process 1's first completion, 3 + 3 tokens.
    assert "keep_mask" not in outputs and "num_items_in_batch" not in outputs
    assert outputs["sft_mask"].tolist() == [1.0, 0.0] and outputs["num_sft_items_in_batch"].item() == 6.0
    assert metrics == {"cegppo/sft_frac": 0.75}
    outputs, metrics = _masks_of_process_1(
        dynamic_sampling=False, sft_loss_coef=0.0, sft_reward_threshold=None, others=[]
    )
    assert outputs == {}
    assert metrics == {}


def test_group_size_mismatch_raises():
    with pytest.raises(ValueError, match="multiple of num_generations=4"):
        informative_groups(torch.zeros(6), 4)


def rollout_batch_expected(loss_type, per_token, nll, cmask, sft, max_len):
    """Policy loss and SFT NLL of a whole rollout batch split into two micro-batches (rows 0-2, 3-5), written from
    each rule's definition (TRL's docs for the policy term; the SFT term is the correct completions' token-mean NLL
    over the rollout batch for every loss type, as in the authors' recipe)."""
    sft_tokens = cmask * sft[:, None]
    halves = (slice(0, 3), slice(3, 6))
    if loss_type == "grpo":  # mean over each micro-batch's sequences of each sequence's token-mean
        policy = sum(((per_token[h] * cmask[h]).sum(-1) / cmask[h].sum(-1)).mean() for h in halves) / 2
    elif loss_type == "dr_grpo":  # token sum / (sequences x max_completion_length)
        policy = (per_token * cmask).sum() / (cmask.size(0) * max_len)
    elif loss_type == "luspo":  # mean over sequences of each sequence's token sum
        policy = (per_token * cmask).sum(-1).mean()
    elif loss_type == "dapo":  # token-mean over the batch
        policy = (per_token * cmask).sum() / cmask.sum()
    else:  # bnpo, TRL's rule: token-mean of each micro-batch, averaged over the two
        policy = sum((per_token[h] * cmask[h]).sum() / cmask[h].sum() for h in halves) / 2
    return policy, (nll * sft_tokens).sum() / sft_tokens.sum()


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "luspo", "dapo", "bnpo"])
def test_sft_term_over_several_micro_batches_is_the_rollout_batch_nll(make_trainer, loss_type):
    # One rollout batch of 6 completions in 2 micro-batches of 3 (one optimizer step): the first micro-batch holds
    # one correct completion, the second two. The accumulated loss must be the rollout batch's, derived by hand.
    trainer = make_trainer(
        loss_type=loss_type, sft_loss_coef=0.1, per_device_train_batch_size=3, gradient_accumulation_steps=2,
        num_generations=3,
    )  # fmt: skip
    assert trainer.args.steps_per_generation == 2
    trainer.model.double()  # float64: micro-batch and whole-batch gradients then agree far below the tolerance
    batch = make_offpolicy_batch(trainer, seed=7)
    cmask = batch["completion_mask"]
    sft = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 1.0])
    counts = {  # what `_generate_and_score_completions` attaches: counts over the whole rollout batch
        "num_items_in_batch": cmask.sum(),
        "num_sft_items_in_batch": (cmask * sft[:, None]).sum(),
    }
    model = trainer.model
    model.train()
    trainer.current_gradient_accumulation_steps = 2
    loss = 0.0
    for step_end, rows in ((False, slice(0, 3)), (True, slice(3, 6))):
        trainer.accelerator.gradient_state._set_sync_gradients(step_end)  # as inside `accelerator.accumulate`
        micro = {k: v[rows] for k, v in batch.items() if v.dim() > 0}
        loss = loss + trainer._compute_loss(model, {**micro, **counts, "sft_mask": sft[rows]})
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], cmask], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, 7)
    per_token, _, _ = reference_per_token_loss(logp, batch["old_per_token_logps"], batch["advantages"], 0.5, 1.0)
    policy, sft_nll = rollout_batch_expected(loss_type, per_token, -logp, cmask, sft, trainer.max_completion_length)
    expected = policy + 0.1 * sft_nll
    expected_grads = torch.autograd.grad(expected, params)
    trl_per_token = trl_clip_loss(logp.detach(), batch["old_per_token_logps"], batch["advantages"])
    trl_policy, _ = rollout_batch_expected(loss_type, trl_per_token, -logp, cmask, sft, trainer.max_completion_length)
    torch.testing.assert_close(loss.detach(), (trl_policy + 0.1 * sft_nll).detach())  # the policy's value is TRL's
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    # Logged once for the optimizer step: the token-mean NLL of its correct completions for every loss type,
    # unscaled by gradient accumulation.
    sft_tokens = cmask * sft[:, None]
    token_mean_nll = (-logp * sft_tokens).sum() / sft_tokens.sum()
    assert trainer._metrics["train"]["cegppo/sft_loss"] == [pytest.approx(token_mean_nll.item(), rel=1e-6)]


def test_sft_loss_metric_is_each_optimizer_steps_nll_and_absent_without_correct_completions(make_trainer):
    # One rollout batch, three optimizer steps of one micro-batch each (rows 0-1, 2-3, 4-5); the correct completions
    # are rows 0, 4 and 5, so the second step has none. Each step must log its own token-mean NLL, the second none.
    trainer = make_trainer(
        sft_loss_coef=0.1, per_device_train_batch_size=2, num_generations=2, steps_per_generation=3
    )  # fmt: skip
    batch = make_offpolicy_batch(trainer, seed=3)
    cmask = batch["completion_mask"]  # row 1 has 4 tokens, row 2 six, the others 7
    sft = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    counts = {
        "num_items_in_batch": cmask.sum(),
        "num_sft_items_in_batch": (cmask * sft[:, None]).sum(),
    }
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    with torch.no_grad():
        for rows in (slice(0, 2), slice(2, 4), slice(4, 6)):
            micro = {k: v[rows] for k, v in batch.items() if v.dim() > 0}
            trainer._compute_loss(trainer.model, {**micro, **counts, "sft_mask": sft[rows]})
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        att = torch.cat([batch["prompt_mask"], cmask], 1)
        logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, 7)
    nll_row0 = -logp[0].sum() / 7  # row 0: 7 tokens
    nll_rows45 = -(logp[4].sum() + logp[5].sum()) / 14  # rows 4 and 5: 7 tokens each
    logged = trainer._metrics["train"]["cegppo/sft_loss"]
    assert logged == [pytest.approx(nll_row0.item(), rel=1e-6), pytest.approx(nll_rows45.item(), rel=1e-6)]


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


def test_dynamic_sampling_decides_from_trl_advantages_not_the_raw_reward_sum(make_trainer):
    # normalize_then_sum with weights [1, 2]: in the "1+1=" group the weighted raw sum is 1.0 for every completion,
    # but TRL normalises each function inside the group first, so the advantages are not zero: the group is kept.
    # The "0+0=" group is constant in both functions: zero advantages, dropped.
    def f1(prompts, completions, **kwargs):
        return [(1.0, 0.0, 0.0, 1.0)[i % 4] if p.startswith("1") else 0.5 for i, p in enumerate(prompts)]

    def f2(prompts, completions, **kwargs):
        return [(0.0, 0.5, 0.5, 0.0)[i % 4] if p.startswith("1") else 0.5 for i, p in enumerate(prompts)]

    trainer = make_trainer(
        reward_funcs=[f1, f2], reward_weights=[1.0, 2.0], multi_objective_aggregation="normalize_then_sum",
        dynamic_sampling=True,
    )  # fmt: skip
    trainer.model.train()
    out = trainer._generate_and_score_completions([{"prompt": p} for p in ("1+1=", "0+0=") for _ in range(4)])
    assert out["advantages"][:4].abs().min() > 0.5  # TRL's advantages: the first group is informative
    assert out["advantages"][4:].abs().max() < 1e-6
    assert out["keep_mask"].tolist() == [1.0] * 4 + [0.0] * 4


def test_dropped_groups_leave_the_metrics_and_entropy_bonus(make_trainer):
    # Rows 0 and 3 (advantages 1.0 and -0.7, both with clipped tokens) are dropped: every metric and the entropy
    # bonus must be those of the kept rows, computed here from the batch.
    trainer = make_trainer(dynamic_sampling=True, delta=1.3, entropy_coef=0.01)
    batch = make_offpolicy_batch(trainer, seed=1)
    keep = torch.tensor([0.0, 1.0, 1.0, 0.0, 1.0, 1.0])
    cmask = batch["completion_mask"]
    kept = cmask * keep[:, None]
    batch.update(keep_mask=keep, num_items_in_batch=kept.sum())
    loss, _ = loss_and_grads(trainer, batch)

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], cmask], 1)
    with torch.no_grad():
        logp, entropies, _ = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, att, 7, compute_entropy=True
        )
    entropy = ((entropies * kept).sum() / kept.sum()).item()
    entropy_all = ((entropies * cmask).sum() / cmask.sum()).item()
    assert abs(entropy - entropy_all) > 2e-5, "the dropped rows must matter for this check (rel. tolerance 1e-6)"
    metrics = trainer._metrics["train"]
    assert metrics["entropy"][-1] == pytest.approx(entropy, rel=1e-6)
    ratio = torch.exp(logp - batch["old_per_token_logps"])
    left = (batch["advantages"][:, None] < 0) & (ratio < 0.8)
    assert (left * cmask * (1 - keep[:, None])).sum() > 0, "a dropped row has left-clipped tokens"
    assert metrics["clip_ratio/low_mean"][-1] == pytest.approx(((left * kept).sum() / kept.sum()).item())
    assert metrics["cegppo/ratio/max"][-1] == pytest.approx(ratio[kept.bool()].max().item())
    # Entropy bonus: loss - bonus, the bonus on the kept tokens only.
    trainer.entropy_coef = 0.0
    loss_without_bonus, _ = loss_and_grads(trainer, batch)
    assert (loss - loss_without_bonus).item() == pytest.approx(-0.01 * entropy, rel=1e-5)


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
