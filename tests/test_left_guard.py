"""The left guard (`delta_low`, `delta_low_mode`) and the early drift warning (`left_drift_warning`).

Loss tests in the torchtune style of tests/test_loss.py: log-probs chosen so that r is exactly ``e^-2``, ``e^-1``...,
the expected value and gradient derived in a comment, the gradient taken with `torch.autograd.grad`. Unless a test
says otherwise: ``epsilon = 0.2`` on both sides (clip range [0.8, 1.2]), ``beta1 = 0.5``, ``beta2 = 0.75``,
``delta_low = 0.25``.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from helpers.batches import base_config_kwargs, loss_and_grads, make_offpolicy_batch
from helpers.reference import random_inputs, reference_per_token_loss, trl_clip_loss
from torch.testing import assert_close

from cegppo_trl import CEGPPOConfig
from cegppo_trl.loss import cegppo_objective, cegppo_regions
from cegppo_trl.monitoring import STATISTICS, LeftDriftAlarm, left_drift_message, loss_statistics, statistics_metrics

KWARGS = dict(epsilon_low=0.2, epsilon_high=0.2, beta1=0.5, beta2=0.75)
MODES = ["cutoff", "decay"]


def loss_and_grad(logp, old_logp, advantages, fn=cegppo_objective, grad_out=None, **kwargs):
    logp = logp.detach().clone().requires_grad_()
    loss = fn(logp, old_logp, advantages, **{**KWARGS, **kwargs})
    (grad,) = torch.autograd.grad(loss, logp, torch.ones_like(loss) if grad_out is None else grad_out)
    return loss.detach(), grad


# ---------------------------------------------------------------------------------------------------------------------
# Value and gradient in every region, both modes
# ---------------------------------------------------------------------------------------------------------------------
def test_cutoff_keeps_the_left_clipped_value_and_drops_the_gradient_below_delta_low():
    # A = -2. Columns: log r = -200 (r = 0 in fp32), -2 (r = e^-2 ~ 0.135 < 0.25: guarded), -1 (r = 1/e ~ 0.368,
    # left-clipped above delta_low: unguarded), 0.1 (inside), 3 (r = e^3 > delta = 10: dual clip).
    # Left-clipped value -beta1 (1 - eps) A = -0.5 * 0.8 * -2 = 0.8 everywhere below 0.8; gradient 0 below 0.25,
    # 0.8 above it. Inside: value = gradient = 2 e^0.1. Dual: value -10 * -2 = 20, gradient 0.
    logp = torch.tensor([[-200.0, -2.0, -1.0, 0.1, 3.0]])
    loss, grad = loss_and_grad(logp, torch.zeros(1, 5), torch.tensor([-2.0]), delta=10.0, delta_low=0.25)
    assert_close(loss, torch.tensor([[0.8, 0.8, 0.8, 2 * math.exp(0.1), 20.0]]))
    assert_close(grad, torch.tensor([[0.0, 0.0, 0.8, 2 * math.exp(0.1), 0.0]]))


def test_decay_scales_the_left_clipped_gradient_by_r_over_delta_low():
    # Same tokens, "decay": below delta_low the gradient is 0.8 * r / 0.25 = 3.2 r: 0 for r = 0, 3.2 e^-2 ~ 0.433
    # for r = e^-2. The value is unchanged (0.8); above delta_low nothing changes.
    logp = torch.tensor([[-200.0, -2.0, -1.0, 0.1, 3.0]])
    kw = dict(delta=10.0, delta_low=0.25, delta_low_mode="decay")
    loss, grad = loss_and_grad(logp, torch.zeros(1, 5), torch.tensor([-2.0]), **kw)
    assert_close(loss, torch.tensor([[0.8, 0.8, 0.8, 2 * math.exp(0.1), 20.0]]))
    assert_close(grad, torch.tensor([[0.0, 3.2 * math.exp(-2), 0.8, 2 * math.exp(0.1), 0.0]]))


@pytest.mark.parametrize("mode", MODES)
def test_guard_never_touches_positive_or_zero_advantages(mode):
    # r = e^-2 < delta_low but A = +2: PPO's min picks r A, the plain surrogate: value = gradient = -2 e^-2. A = +2,
    # r = e and e^3 (right clip): -0.75 * 1.2 * 2 = -1.8. A = 0: 0.
    logp = torch.tensor([[-2.0, 1.0, 3.0]]).expand(2, 3)
    loss, grad = loss_and_grad(logp, torch.zeros(2, 3), torch.tensor([2.0, 0.0]), delta_low=0.25, delta_low_mode=mode)
    expected = torch.tensor([[-2 * math.exp(-2), -1.8, -1.8], [0.0, 0.0, 0.0]])
    assert_close(loss, expected)
    assert_close(grad, expected)


def test_decay_at_one_minus_epsilon_is_the_soft_variant_beta1_r_a():
    # delta_low = 1 - eps = 0.8, "decay": every left-clipped token's gradient is beta1 (1 - eps) A r / (1 - eps) =
    # beta1 r A: for A = -2, r = 1/e: -0.5 * e^-1 * -2 = e^-1 ~ 0.368, and r = 0.5 (log r = log 0.5): 0.5.
    # The value stays the left-clipped constant 0.8.
    logp = torch.tensor([[-1.0, math.log(0.5)]], dtype=torch.float64)
    adv = torch.tensor([-2.0], dtype=torch.float64)
    loss, grad = loss_and_grad(logp, torch.zeros_like(logp), adv, delta_low=0.8, delta_low_mode="decay")
    assert_close(loss, torch.tensor([[0.8, 0.8]], dtype=torch.float64))
    assert_close(grad, -0.5 * torch.exp(logp) * -2.0)


def test_ratio_exactly_on_delta_low_is_not_guarded_and_decay_is_continuous_there():
    # The inequality is strict: with delta_low the fp32 value of e^-1.5, the token at log r = -1.5 keeps the full
    # left-clipped gradient 0.8. "decay" just below it gives 0.8 * r / delta_low -> 0.8: continuous at delta_low.
    r = torch.exp(torch.tensor(-1.5))
    kw = dict(delta_low=r.item(), delta_low_mode="decay")
    logp = torch.tensor([[-1.5, -1.5 - 1e-6]])
    loss, grad = loss_and_grad(logp, torch.zeros(1, 2), torch.tensor([-2.0]), **kw)
    assert_close(loss, torch.tensor([[0.8, 0.8]]))
    assert grad[0, 0] == torch.tensor(0.8)
    assert_close(grad[0, 1], torch.tensor(0.8), rtol=1e-5, atol=0)
    regions = cegppo_regions(logp, torch.tensor([-2.0]), epsilon_low=0.2, epsilon_high=0.2, delta_low=r.item())
    assert regions.guard.tolist() == [[False, True]]


def kw_regions(kw):
    return {k: kw[k] for k in ("delta", "delta_low")}


# ---------------------------------------------------------------------------------------------------------------------
# Bit-identical to the unguarded objective whenever no token crosses delta_low
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("delta", [None, 2.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_guard_is_bit_identical_to_the_unguarded_loss_when_no_token_crosses_it(mode, delta, dtype):
    # Log-ratios in [-0.6, 0.6]: r >= e^-0.6 ~ 0.55 > delta_low = 0.25, yet many tokens are left-clipped (r < 0.8).
    logp, old, adv = random_inputs(spread=0.6, dtype=dtype)
    adv = adv.float()
    regions = cegppo_regions(logp - old, adv, epsilon_low=0.2, epsilon_high=0.2, delta=delta, delta_low=0.25)
    assert regions.left.any() and not regions.guard.any()
    grad_out = torch.rand(logp.shape, generator=torch.Generator().manual_seed(1))
    loss, grad = loss_and_grad(logp, old, adv, grad_out=grad_out, delta=delta)
    guarded_loss, guarded_grad = loss_and_grad(
        logp, old, adv, grad_out=grad_out, delta=delta, delta_low=0.25, delta_low_mode=mode
    )
    assert torch.equal(loss, guarded_loss) and torch.equal(grad, guarded_grad)


@pytest.mark.parametrize("mode", MODES)
def test_guarded_value_equals_the_unguarded_value_everywhere(mode):
    # Only the gradient changes: with tokens deep below delta_low, the forward values are still identical.
    logp, old, adv = random_inputs(spread=3.0)
    loss, grad = loss_and_grad(logp, old, adv, delta=2.5)
    guarded_loss, guarded_grad = loss_and_grad(logp, old, adv, delta=2.5, delta_low=0.25, delta_low_mode=mode)
    assert torch.equal(loss, guarded_loss) and not torch.equal(grad, guarded_grad)


# ---------------------------------------------------------------------------------------------------------------------
# Composition: sequence-level ratio, validation, diagnostics
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_sequence_level_ratio_with_the_guard_sums_the_guarded_gradient_per_sequence(mode):
    # GSPO-style (B, 1) log-ratios e^-2 (guarded), 1/e (left-clipped), inside, e^3 (dual) against (B, T) advantages:
    # the (B, 1) gradient is the per-token gradient of the expanded ratio summed over T. Row 0, A = -1 on every
    # token: value 0.4 each; gradient 0 ("cutoff") or 0.4 * e^-2 / 0.25 per token ("decay"), summed over 6 tokens.
    seq_logp = torch.tensor([[-2.0], [-1.0], [0.1], [3.0]], dtype=torch.float64)
    adv = torch.randn(4, 6, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    adv[0] = -1.0
    zeros = torch.zeros(4, 6, dtype=torch.float64)
    kw = dict(delta=10.0, delta_low=0.25, delta_low_mode=mode)
    loss, grad = loss_and_grad(seq_logp, zeros[:, :1], adv, **kw)
    token_loss, token_grad = loss_and_grad(seq_logp.expand(4, 6), zeros, adv, **kw)
    assert_close(loss, token_loss)
    assert_close(grad, token_grad.sum(-1, keepdim=True))
    assert_close(loss[0], torch.full((6,), 0.4, dtype=torch.float64))
    expected_row0 = 0.0 if mode == "cutoff" else 6 * 0.4 * math.exp(-2) / 0.25
    assert_close(grad[0, 0], torch.tensor(expected_row0, dtype=torch.float64))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(delta_low=0.9), r"`delta_low` .* \(0, 0\.8\], got 0\.9"),
        (dict(delta_low=0.0), r"`delta_low` .* \(0, 0\.8\], got 0\.0"),
        (dict(delta_low=0.25, delta_low_mode="soft"), r"`delta_low_mode` must be one of \['cutoff', 'decay'\]"),
    ],
)
def test_loss_and_config_refuse_a_guard_outside_its_range(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        cegppo_objective(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), **KWARGS, **kwargs)
    with pytest.raises(ValueError, match=message):
        CEGPPOConfig(**base_config_kwargs(tmp_path, **kwargs))


def test_config_refuses_a_guard_on_a_passthrough_loss_type_and_a_warning_threshold_that_always_fires(tmp_path):
    with pytest.raises(ValueError, match=r"`delta_low` .* applies to the CE-GPPO loss types"):
        CEGPPOConfig(**base_config_kwargs(tmp_path, loss_type="cispo", delta_low=0.25))
    with pytest.raises(ValueError, match=r"`left_drift_warning` must be a finite log-ratio below log\(1 - epsilon\)"):
        CEGPPOConfig(**base_config_kwargs(tmp_path, left_drift_warning=-0.1))
    assert CEGPPOConfig(**base_config_kwargs(tmp_path, left_drift_warning=None)).left_drift_warning is None


def test_statistics_count_the_guarded_tokens():
    # A = -1: log r -2 (guarded), -1 (left-clipped), 0 (inside); the padding token (log r -3) is masked out.
    log_ratio = torch.tensor([[-2.0, -1.0, 0.0, -3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    regions = cegppo_regions(log_ratio, torch.tensor([-1.0]), epsilon_low=0.2, epsilon_high=0.2, delta_low=0.25)
    values = loss_statistics(log_ratio, mask, regions).tolist()
    metrics, sums = statistics_metrics(values, dual=False, left_guard=True), dict(zip(STATISTICS, values))
    assert (sums["guard"], sums["left"], sums["tokens"]) == (1.0, 2.0, 3.0)
    assert metrics["cegppo/preserved/left_guard_frac"] == pytest.approx(1 / 3)
    assert metrics["cegppo/preserved/left_log_ratio"] == pytest.approx(-1.5)  # (-2 - 1) / 2
    assert metrics["cegppo/ratio/min"] == pytest.approx(math.exp(-2)) and metrics["cegppo/ratio/max"] == 1.0


# ---------------------------------------------------------------------------------------------------------------------
# Through the trainer: the step's beta, the gradient, the metric, the model card
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_trainer_gradient_is_the_guarded_formula_with_the_step_beta1(make_trainer, mode):
    # beta1 of the step: 0.8 from a schedule at step 0. The guard at 0.7 acts on part of the batch's left-clipped
    # tokens and scales that beta1.
    guard = dict(gppo_beta2=1.0, delta=1.5, delta_low=0.7, delta_low_mode=mode)
    trainer = make_trainer(gppo_beta1_schedule="linear:0.8->0.1", **guard)
    assert trainer.current_gppo_betas() == (pytest.approx(0.8), 1.0)
    inputs = make_offpolicy_batch(trainer)
    loss, grads = loss_and_grads(trainer, inputs)
    model = trainer.model
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    att = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(model, ids, att, 7)
    old, adv, mask = inputs["old_per_token_logps"], inputs["advantages"], inputs["completion_mask"]
    guard = dict(delta_low=0.7, delta_low_mode=mode)
    per_token, left, _ = reference_per_token_loss(logp, old, adv, 0.8, 1.0, delta=1.5, **guard)
    guarded = left & (torch.exp(logp.detach() - old) < 0.7) & mask.bool()
    assert guarded.any() and (left & mask.bool() & ~guarded).any()
    expected = (per_token * mask).sum() / mask.sum()  # dapo, one process, no accumulation
    expected_grads = torch.autograd.grad(expected, [p for p in model.parameters() if p.requires_grad])
    trl_value = (trl_clip_loss(logp.detach(), old, adv, delta=1.5) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, trl_value)  # the value is TRL's; the gradient the definition's
    for a, b in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert metrics["cegppo/preserved/left_guard_frac"] == pytest.approx(guarded.sum().item() / mask.sum().item())


def test_guard_shows_on_the_model_card_settings(make_trainer):
    settings = make_trainer(delta_low=0.25, delta_low_mode="decay").cegppo_settings()
    assert settings["delta_low"] == 0.25 and settings["delta_low_mode"] == "decay"
    assert make_trainer().cegppo_settings()["delta_low"] is None  # the paper's objective, said so


def test_no_guard_metric_without_a_guard(make_trainer):
    trainer = make_trainer()
    loss_and_grads(trainer, make_offpolicy_batch(trainer))
    assert "cegppo/preserved/left_guard_frac" not in trainer._metrics["train"]


# ---------------------------------------------------------------------------------------------------------------------
# The early warning
# ---------------------------------------------------------------------------------------------------------------------
def test_alarm_fires_once_per_episode_and_rearms_above_the_threshold():
    alarm = LeftDriftAlarm(-1.5)
    # An episode: -1.6 fires, -3 and -2 stay silent; no left-clipped token (None) changes nothing; -1.5 (not below)
    # re-arms; the next drift fires again.
    trace = [-1.0, -1.6, -3.0, None, -2.0, -1.5, -1.7, -1.4, None, -1.51]
    assert [alarm.update(x) for x in trace] == [False, True, False, False, False, False, True, False, False, True]


def test_left_drift_message_names_the_value_and_each_fix_with_the_runs_values():
    args = CEGPPOConfig(output_dir="unused", use_cpu=True, report_to="none", learning_rate=0.01, steps_per_generation=4,
                        gradient_accumulation_steps=2, num_iterations=3)  # fmt: skip
    message = left_drift_message(-2.345, 7, -1.5, args, beta1=0.5)
    assert message.startswith("cegppo/preserved/left_log_ratio = -2.35 at step 7 is below `left_drift_warning` = -1.5")
    for fix in ("fewer optimizer steps per rollout batch (now 6)", "a lower learning rate (now 0.01)",
                "a smaller `gppo_beta1` (now 0.5)", "the left guard `delta_low` (e.g. 0.5)"):  # fmt: skip
        assert fix in message, fix
    args.delta_low = 0.25
    assert "a larger `delta_low` (now 0.25; with the guard on" in left_drift_message(-2, 7, -1.5, args, 0.5)


def _drift_batch(trainer, depth: float):
    """The off-policy batch with every A < 0 token's log-ratio `depth` below its current log-prob."""
    inputs = make_offpolicy_batch(trainer)
    old = inputs["old_per_token_logps"]
    inputs["old_per_token_logps"] = torch.where(inputs["advantages"][:, None] < 0, old + depth, old)
    return inputs


def test_trainer_warns_once_per_episode_of_drift_naming_the_fixes(make_trainer, caplog):
    trainer = make_trainer(gppo_beta1=0.5, steps_per_generation=4, gradient_accumulation_steps=1)
    drift, calm = _drift_batch(trainer, 3.0), make_offpolicy_batch(trainer)  # mean log r ~ -3 vs ~ -0.4

    def warnings_after(batch) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            loss_and_grads(trainer, batch)
        return [r.getMessage() for r in caplog.records if "left_drift_warning" in r.getMessage()]

    first = warnings_after(drift)
    assert len(first) == 1
    assert trainer._metrics["train"]["cegppo/preserved/left_log_ratio"][-1] < -1.5
    for fix in ("fewer optimizer steps per rollout batch (now 4)", "a lower learning rate (now 0.01)",
                "a smaller `gppo_beta1` (now 0.5)", "`delta_low`"):  # fmt: skip
        assert fix in first[0], fix
    assert warnings_after(drift) == []  # the same episode
    assert warnings_after(calm) == []  # back above the threshold: re-armed
    assert len(warnings_after(drift)) == 1  # a new episode


@pytest.mark.parametrize("deep_last", [False, True])
def test_drift_warning_uses_the_optimizer_step_value_over_accumulated_micro_batches(make_trainer, caplog, deep_last):
    # Two micro-batches per optimizer step: one alone is far below the threshold, the step's token-weighted mean over
    # both is not, so nothing is said at the step's end. The deep one comes first, then last: a window that kept only
    # the first micro-batch's sums, or only the last's, would warn in one of the two orders.
    trainer = make_trainer(gppo_beta1=0.5, gradient_accumulation_steps=2, steps_per_generation=4)
    mask = torch.ones(1, 4)
    deep = torch.tensor([[-3.0, 0.0, 0.0, 0.0]])  # one left-clipped token, log r = -3
    calm = torch.full((1, 4), -0.5)  # four left-clipped tokens, log r = -0.5
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        for sync, log_ratio in zip((False, True), (calm, deep) if deep_last else (deep, calm)):
            trainer.accelerator.gradient_state._set_sync_gradients(sync)
            regions = cegppo_regions(log_ratio, torch.tensor([-1.0]), epsilon_low=0.2, epsilon_high=0.2)
            trainer._log_step("train", 0.5, 1.0, loss_statistics(log_ratio, mask, regions))
    # (-3 + 4 * -0.5) / 5 = -1.0 > -1.5
    assert not [r for r in caplog.records if "left_drift_warning" in r.getMessage()]
    assert trainer.left_drift_alarm.armed


def test_drift_warning_can_be_disabled(make_trainer, caplog):
    trainer = make_trainer(left_drift_warning=None)
    assert trainer.left_drift_alarm is None
    with caplog.at_level(logging.WARNING):
        loss_and_grads(trainer, _drift_batch(trainer, 3.0))
    assert not [r for r in caplog.records if "left_drift_warning" in r.getMessage()]


def test_config_docstring_gives_the_decay_weight_the_loss_applies():
    # The documented decay weight, evaluated as written, is the gradient of the loss below delta_low (it had lost its
    # minus sign). A = -2, r = e^-2 < 0.25: -0.5 * 0.8 * -2 * e^-2 / 0.25 = 3.2 e^-2.
    import re

    formula = re.search(r'`"decay"`: weight `([^`]+)`', " ".join(CEGPPOConfig.__doc__.split())).group(1)
    r, A = math.exp(-2.0), -2.0
    documented = eval(formula, {}, dict(beta1=0.5, epsilon=0.2, A=A, r=r, delta_low=0.25))  # noqa: S307
    _, grad = loss_and_grad(torch.tensor([[-2.0]], dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
                            torch.tensor([A], dtype=torch.float64), delta_low=0.25, delta_low_mode="decay")  # fmt: skip
    assert documented == pytest.approx(grad.item()) == pytest.approx(3.2 * r)
