"""`cegppo_trl.aggregation`: TRL's aggregation rules, their per-token weights, and the gradient share the trainer logs.

The weights are checked against autograd on `aggregate`, and `cegppo/preserved/grad_share` against autograd through
the trainer's own `_compute_loss` (the share of |d loss / d logp| on preserved tokens), for every loss type and both
importance-sampling levels.
"""

from __future__ import annotations

import pytest
import torch
from helpers.batches import make_offpolicy_batch
from torch.testing import assert_close

from cegppo_trl.aggregation import (
    AGGREGATION_LOSS_TYPES,
    aggregate,
    aggregation_weights,
    normaliser,
    policy_normaliser,
    sft_loss,
)
from cegppo_trl.config import CEGPPO_LOSS_TYPES
from cegppo_trl.loss import cegppo_diagnostics, cegppo_per_token_loss, cegppo_regions

LEVELS = ["token", "sequence"]
KWARGS = dict(epsilon_low=0.2, epsilon_high=0.2, beta1=0.5, beta2=1.0)


def _mask() -> torch.Tensor:
    mask = torch.ones(4, 6)
    mask[1, 2:] = 0  # a short completion: 1 / |o_i| differs between rows under grpo
    mask[2, 5:] = 0
    mask[3] = 0  # a dropped group: weight 0 everywhere
    return mask


def _normaliser(loss_type: str, mask: torch.Tensor, train: bool = True):
    return normaliser(
        loss_type,
        mask,
        num_items_in_batch=torch.tensor(37.0),
        num_sequences_in_batch=torch.tensor(12.0),
        num_processes=2,
        steps_per_generation=3,
        gradient_accumulation_steps=2,
        max_completion_length=6,
        train=train,
    )


LAYOUT = dict(
    num_processes=2, steps_per_generation=3, gradient_accumulation_steps=2, max_completion_length=6, train=True
)


def test_a_batch_without_rollout_counts_is_normalised_by_its_kept_sequences():
    # luspo's total is num_sequences / share (share = 2 processes * 3 steps = 6). Without a rollout-batch count the
    # micro-batch's own (kept) sequences stand for it, scaled by the share: the total is that local count.
    mask, per_token, items = _mask(), torch.ones(4, 6), torch.tensor(37.0)
    kept = torch.tensor([1.0, 1.0, 1.0, 0.0])
    assert policy_normaliser("luspo", per_token, mask, items, None, kept, **LAYOUT).total.item() == 3.0
    assert policy_normaliser("luspo", per_token, mask, items, None, **LAYOUT).total.item() == 4.0
    assert policy_normaliser("luspo", per_token, mask, items, torch.tensor(12.0), kept, **LAYOUT).total.item() == 2.0


def test_sft_loss_is_the_correct_completions_nll_by_the_rollout_batch_rule_and_a_token_mean_under_bnpo():
    logps = torch.full((4, 6), -2.0)
    logps[0] = -1.0
    correct = torch.tensor([1.0, 1.0, 0.0, 0.0])  # rows 0 (6 tokens, NLL 1 each) and 1 (2 tokens, NLL 2 each)
    loss, totals = sft_loss("bnpo", logps, _mask(), correct, torch.tensor(48.0), None, **LAYOUT)
    assert totals.tolist() == [10.0, 8.0]
    # bnpo -> dapo's rule: 48 tokens / 2 processes * 2 accumulation / 3 steps = 16
    assert loss.item() == pytest.approx(10 / 16)
    # grpo: sequence means 1 + 2 over 2 correct sequences (2 local * share 6 / share), halved for accumulation
    loss, _ = sft_loss("grpo", logps, _mask(), correct, torch.tensor(48.0), None, **LAYOUT)
    assert loss.item() == pytest.approx(0.75)


def test_the_aggregation_covers_the_cegppo_loss_types():
    assert AGGREGATION_LOSS_TYPES == CEGPPO_LOSS_TYPES


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
def test_weights_are_the_gradient_of_the_aggregated_loss(loss_type, train):
    # Token-level (B, T) and sequence-level (B, 1) per-token losses: autograd's d loss / d per_token_loss is the
    # weight of each token, summed over the sequence when the loss is one value per sequence.
    mask = _mask()
    norm = _normaliser(loss_type, mask, train)
    weights = aggregation_weights(mask, norm)
    assert (weights[mask == 0] == 0).all()
    for shape in [(4, 6), (4, 1)]:
        per_token_loss = torch.randn(shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        per_token_loss.requires_grad_()
        loss, _ = aggregate(per_token_loss, mask, norm)
        (grad,) = torch.autograd.grad(loss, per_token_loss)
        assert_close(grad, weights.double().sum_to_size(shape))
        assert_close(loss, (per_token_loss * weights).sum())  # the loss is the weighted sum, by value too


@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
def test_weights_of_the_sequence_mean_types_differ_by_sequence_length_only_under_grpo(loss_type):
    # The hand-derived table: grpo weighs a token by 1 / |o_i| / (sequences per micro-batch) / accumulation, the
    # other rules give every token of the micro-batch the same weight. 12 sequences over 2 processes x 3 micro-batches:
    # 2 per micro-batch; accumulation 2. 37 tokens over 2 processes, 2 accumulation steps of 3: 37 / 2 * 2 / 3.
    mask = _mask()
    weights = aggregation_weights(mask, _normaliser(loss_type, mask))
    lengths = mask.sum(-1)
    expected_per_row = {
        "grpo": 1 / lengths.clamp(min=1) / 2 / 2,
        "bnpo": torch.full((4,), 1 / mask.sum() / 2),
        "dr_grpo": torch.full((4,), 1 / (2 * 6) / 2),
        "dapo": torch.full((4,), 1 / (37 / 2 * 2 / 3)),
        "luspo": torch.full((4,), 1 / 2 / 2),
    }[loss_type]
    assert_close(weights, expected_per_row[:, None] * mask)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
def test_diagnostics_grad_share_is_autograds_with_the_aggregation_weights(loss_type, level):
    # Pure functions: the surrogate on a (sequence-level) log-ratio of leaf log-probs, aggregated by `aggregate`;
    # the share of |d loss / d logp| on preserved tokens against `cegppo_diagnostics` given the same normaliser.
    g = torch.Generator().manual_seed(1)
    mask = _mask()
    logp = (torch.randn(4, 6, generator=g) * 0.5).requires_grad_()
    advantages = torch.tensor([1.0, -1.0, -0.5, 0.7])
    log_ratio = logp - 0.0
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    norm = _normaliser(loss_type, mask)
    entropy_mask = (torch.rand(4, 6, generator=g) > 0.3).float()  # a factor TRL multiplies the loss by
    per_token = cegppo_per_token_loss(log_ratio, torch.zeros(()), advantages, **KWARGS) * entropy_mask
    loss, _ = aggregate(per_token, mask, norm)
    (grad,) = torch.autograd.grad(loss, logp)
    regions = cegppo_regions(log_ratio.detach(), advantages, epsilon_low=0.2, epsilon_high=0.2)
    preserved = (regions.left | regions.right).expand_as(mask) & mask.bool()
    assert 0 < preserved.sum() < mask.sum()
    expected = grad.abs()[preserved].sum() / grad.abs()[mask.bool()].sum()

    weights = aggregation_weights(mask, norm) * entropy_mask
    diag = cegppo_diagnostics(log_ratio.detach(), advantages, mask, **KWARGS, weights=weights)
    assert_close(diag.sums["preserved_grad_weight"] / diag.sums["grad_weight"], expected)


def _logged_and_autograd_share(trainer, batch) -> tuple[float, float]:
    """`cegppo/preserved/grad_share` logged by one `_compute_loss` call, and the share autograd gives for the loss it
    returns: the current log-probs are made a leaf, so d loss / d logp is exactly what the model receives."""
    original = trainer._get_per_token_logps_and_entropies
    leaf = {}

    def leaf_logps(*args, **kwargs):
        logp, entropies, aux = original(*args, **kwargs)
        leaf["logp"] = logp.detach().requires_grad_()
        return leaf["logp"], entropies, aux

    trainer._get_per_token_logps_and_entropies = leaf_logps
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    loss = trainer._compute_loss(trainer.model, batch)
    logged = trainer._metrics["train"]["cegppo/preserved/grad_share"][-1]

    logp, mask = leaf["logp"], batch["completion_mask"].bool()
    (grad,) = torch.autograd.grad(loss, logp)
    log_ratio = logp.detach() - batch["old_per_token_logps"]
    if trainer.importance_sampling_level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(-1)
    regions = cegppo_regions(
        log_ratio, batch["advantages"], epsilon_low=trainer.epsilon_low, epsilon_high=trainer.epsilon_high
    )
    preserved = (regions.left | regions.right).expand_as(mask) & mask
    assert 0 < preserved.sum() < mask.sum()  # a share strictly between 0 and 1
    return logged, (grad.abs()[preserved].sum() / grad.abs()[mask].sum()).item()


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
@pytest.mark.slow
def test_trainer_grad_share_is_that_of_the_gradient_the_model_receives(make_trainer, loss_type, level):
    # Before the aggregation weights reached the diagnostics, grpo at token level (1 / |o_i| per sequence) and every
    # other rule at sequence level (a sequence's tokens each carry its weight) logged another share.
    trainer = make_trainer(loss_type=loss_type, importance_sampling_level=level, gppo_beta1=0.5, gppo_beta2=1.0)
    batch = make_offpolicy_batch(trainer, seed=3)
    if level == "sequence":  # whole sequences off-policy, so that some sequences are clipped and some are not
        shift = torch.tensor([-0.5, 0.5, 0.05, 0.4, 0.3, -0.05])[:, None]
        batch["old_per_token_logps"] = batch["old_per_token_logps"] + shift
    logged, share = _logged_and_autograd_share(trainer, batch)
    assert logged == pytest.approx(share, rel=1e-5)
