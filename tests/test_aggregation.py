"""`cegppo_trl.aggregation`: TRL's aggregation rule per `loss_type`, the SFT term's, and the gradient share logged.

`trl_weights` is held to TRL's own `GRPOTrainer._compute_loss` (a TRL release that changes its rule fails here, naming
the loss type), and `cegppo/preserved/grad_share` to autograd through the trainer's `_compute_loss` (the share of
|d loss / d logp| on preserved tokens), for every loss type and both importance-sampling levels.
"""

from __future__ import annotations

import pytest
import torch
from helpers.batches import make_offpolicy_batch
from helpers.reference import trl_clip_loss
from torch.testing import assert_close
from trl import GRPOTrainer

from cegppo_trl.aggregation import AGGREGATION_LOSS_TYPES, sft_loss, trl_weights
from cegppo_trl.config import CEGPPO_LOSS_TYPES
from cegppo_trl.loss import cegppo_diagnostics, cegppo_regions, preserved_coefficient, preserved_gradient_term

LEVELS = ["token", "sequence"]
KWARGS = dict(epsilon_low=0.2, epsilon_high=0.2, beta1=0.5, beta2=1.0)
LAYOUT = dict(
    num_processes=2, steps_per_generation=3, gradient_accumulation_steps=2, max_completion_length=6, train=True
)


def _mask() -> torch.Tensor:
    mask = torch.ones(4, 6)
    mask[1, 2:] = 0  # a short completion: 1 / |o_i| differs between rows under grpo
    mask[2, 5:] = 0
    mask[3] = 0  # a masked-out row: weight 0 everywhere
    return mask


def test_the_aggregation_covers_the_cegppo_loss_types():
    assert AGGREGATION_LOSS_TYPES == CEGPPO_LOSS_TYPES


@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
def test_trl_weights_follow_the_hand_derived_table(loss_type):
    # 4 rows, accumulation 2; dapo: 37 tokens over 2 processes, 2 accumulation steps of 3: 37 / 2 * 2 / 3.
    mask = _mask()
    weights = trl_weights(loss_type, mask, num_items_in_batch=torch.tensor(37.0), **LAYOUT)
    lengths = mask.sum(-1)
    expected_per_row = {
        "grpo": 1 / lengths.clamp(min=1) / 4 / 2,
        "bnpo": torch.full((4,), 1 / mask.sum() / 2),
        "dr_grpo": torch.full((4,), 1 / (4 * 6) / 2),
        "dapo": torch.full((4,), 1 / (37 / 2 * 2 / 3)),
        "luspo": torch.full((4,), 1 / 4 / 2),
    }[loss_type]
    assert_close(weights, expected_per_row[:, None] * mask)


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
def test_trl_weights_are_the_weights_of_trls_own_loss(make_trainer, loss_type, train):
    # TRL's `_compute_loss` itself on a batch that nothing clips (ratios within e^+-0.1): its loss is the weighted sum
    # of -r * A with `trl_weights`, in value and in gradient (a rule changed by a factor, e.g. another count, is off by
    # far more than float32 rounding); accumulation 2 of 3 micro-batches per rollout batch.
    trainer = make_trainer(loss_type=loss_type, steps_per_generation=3, gradient_accumulation_steps=1)
    batch = make_offpolicy_batch(trainer, seed=5)
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, 7)
    shift = torch.rand(logp.shape, generator=torch.Generator().manual_seed(0), dtype=logp.dtype) * 0.2 - 0.1
    batch["old_per_token_logps"] = logp + shift
    trainer.model.train(train)
    trainer.current_gradient_accumulation_steps = 2
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    loss = GRPOTrainer._compute_loss(trainer, trainer.model, batch)  # TRL's method, not the override
    grads = torch.autograd.grad(loss, params)

    logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, 7)
    mask = batch["completion_mask"]
    layout = dict(num_processes=1, steps_per_generation=3, gradient_accumulation_steps=2,
                  max_completion_length=trainer.max_completion_length, train=train)  # fmt: skip
    weights = trl_weights(loss_type, mask, num_items_in_batch=batch["num_items_in_batch"], **layout)
    expected = (trl_clip_loss(logp, batch["old_per_token_logps"], batch["advantages"]) * weights).sum()
    assert_close(loss, expected.to(loss.dtype), rtol=1e-5, atol=1e-7, msg=f"TRL's {loss_type} rule changed")
    for a, b in zip(grads, torch.autograd.grad(expected, params), strict=True):
        assert_close(a, b, rtol=1e-5, atol=1e-7, msg=f"TRL's {loss_type} rule changed")


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


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("loss_type", AGGREGATION_LOSS_TYPES)
def test_diagnostics_grad_share_is_autograds_with_the_aggregation_weights(loss_type, level):
    # Pure functions: TRL's surrogate plus the term on a (sequence-level) log-ratio of leaf log-probs, weighted by
    # `trl_weights` and a factor TRL multiplies the loss by; the share of |d loss / d logp| on preserved tokens
    # against `cegppo_diagnostics` given the same weights.
    g = torch.Generator().manual_seed(1)
    mask = _mask()
    logp = (torch.randn(4, 6, generator=g) * 0.5).requires_grad_()
    advantages = torch.tensor([1.0, -1.0, -0.5, 0.7])
    log_ratio = logp - 0.0
    if level == "sequence":
        log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    entropy_mask = (torch.rand(4, 6, generator=g) > 0.3).float()
    weights = trl_weights(loss_type, mask, num_items_in_batch=torch.tensor(37.0), **LAYOUT) * entropy_mask
    coefficient = preserved_coefficient(log_ratio.detach(), advantages, **KWARGS)
    per_token = trl_clip_loss(log_ratio, 0.0, advantages) + preserved_gradient_term(log_ratio, advantages, coefficient)
    (grad,) = torch.autograd.grad((per_token * weights).sum(), logp)
    regions = cegppo_regions(log_ratio.detach(), advantages, epsilon_low=0.2, epsilon_high=0.2)
    preserved = (regions.left | regions.right).expand_as(mask) & mask.bool()
    assert 0 < preserved.sum() < mask.sum()
    expected = grad.abs()[preserved].sum() / grad.abs()[mask.bool()].sum()
    diag = cegppo_diagnostics(log_ratio.detach(), advantages, mask, **KWARGS, weights=weights)
    assert_close(diag.sums["preserved_grad_weight"] / diag.sums["grad_weight"], expected)


def _logged_and_autograd_share(trainer, batch, monkeypatch) -> tuple[float, float]:
    """`cegppo/preserved/grad_share` logged by one `_compute_loss` call, and the share autograd gives for the loss it
    returns: TRL's log-probs are made a leaf, so d loss / d logp is exactly what the model receives."""
    original = GRPOTrainer._get_per_token_logps_and_entropies
    leaf = {}

    def leaf_logps(*args, **kwargs):
        logp, entropies, aux = original(*args, **kwargs)
        leaf["logp"] = logp.detach().requires_grad_()
        return leaf["logp"], entropies, aux

    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", leaf_logps)
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
def test_trainer_grad_share_is_that_of_the_gradient_the_model_receives(make_trainer, loss_type, level, monkeypatch):
    # Before the aggregation weights reached the diagnostics, grpo at token level (1 / |o_i| per sequence) and every
    # other rule at sequence level (a sequence's tokens each carry its weight) logged another share.
    trainer = make_trainer(loss_type=loss_type, importance_sampling_level=level, gppo_beta1=0.5, gppo_beta2=1.0)
    batch = make_offpolicy_batch(trainer, seed=3)
    if level == "sequence":  # whole sequences off-policy, so that some sequences are clipped and some are not
        shift = torch.tensor([-0.5, 0.5, 0.05, 0.4, 0.3, -0.05])[:, None]
        batch["old_per_token_logps"] = batch["old_per_token_logps"] + shift
    logged, share = _logged_and_autograd_share(trainer, batch, monkeypatch)
    assert logged == pytest.approx(share, rel=1e-5)
