"""CEGPPOTrainer through a real (tiny) model: the training gradient is the CE-GPPO gradient (`cegppo_objective`, the
definition) under every aggregation, the loss value is TRL's, TRL's machinery around the surrogate is untouched, and
training runs, changes parameters and logs metrics."""

from __future__ import annotations

import logging
import math

import pytest
import torch
import trl
from helpers.batches import loss_and_grads, make_offpolicy_batch
from helpers.reference import reference_per_token_loss, trl_clip_loss
from packaging.version import Version
from trl import GRPOTrainer

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.demos.tiny import build_tiny_llama
from cegppo_trl.schedules import parse_schedule

EPS = 0.2


def aggregate(per_token_loss, mask, loss_type, max_completion_length):
    if loss_type == "grpo":
        return ((per_token_loss * mask).sum(-1) / mask.sum(-1)).mean()
    if loss_type in ("bnpo", "dapo"):  # one process, no accumulation: both are the batch token-mean
        return (per_token_loss * mask).sum() / mask.sum()
    if loss_type == "dr_grpo":
        return (per_token_loss * mask).sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "luspo":
        return (per_token_loss * mask).sum(-1).mean()
    raise AssertionError(loss_type)


def assert_grads_close(grads_a, grads_b, **kw):
    for a, b in zip(grads_a, grads_b, strict=True):
        torch.testing.assert_close(a, b, **kw)


# float32: the definition and TRL's surrogate plus the term may round differently; float64: the same mathematics, where
# TRL computes the log-probabilities in float64 (1.16; 1.10-1.14 lose float32's precision on the way: 4e-9 measured).
FP64_LOGPS = Version(trl.__version__) >= Version("1.16.0")
TOLERANCE = {
    torch.float32: dict(rtol=1e-5, atol=1e-7),
    torch.float64: dict(rtol=1e-12, atol=1e-15) if FP64_LOGPS else dict(rtol=1e-5, atol=1e-7),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
@pytest.mark.parametrize("delta", [None, 1.3])
def test_training_gradient_equals_cegppo_formula(make_trainer, loss_type, delta, dtype):
    trainer = make_trainer(loss_type=loss_type, gppo_beta1=0.5, gppo_beta2=1.0, delta=delta)
    trainer.model.to(dtype)
    inputs = make_offpolicy_batch(trainer)
    loss, grads = loss_and_grads(trainer, inputs)

    model = trainer.model
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, input_ids.size(1) - 4)
    per_token, left, right = reference_per_token_loss(
        logp, inputs["old_per_token_logps"], inputs["advantages"], 0.5, 1.0, delta=delta
    )
    mask = inputs["completion_mask"].bool()
    assert (left & mask).any() and (right & mask).any(), "the batch must hit both preserved regions"
    expected = aggregate(per_token, inputs["completion_mask"], loss_type, trainer.max_completion_length)
    expected_grads = torch.autograd.grad(expected, [p for p in model.parameters() if p.requires_grad])

    trl_per_token = trl_clip_loss(logp.detach(), inputs["old_per_token_logps"], inputs["advantages"], delta=delta)
    value = aggregate(trl_per_token, inputs["completion_mask"], loss_type, trainer.max_completion_length)
    torch.testing.assert_close(loss, value.to(loss.dtype))  # TRL's value: the term adds 0
    assert_grads_close(grads, expected_grads, **TOLERANCE[dtype])


def test_sequence_level_ratio_gradient_equals_formula(make_trainer):
    trainer = make_trainer(loss_type="grpo", importance_sampling_level="sequence", epsilon=0.05, gppo_beta1=0.5)
    inputs = make_offpolicy_batch(trainer, seed=3)
    loss, grads = loss_and_grads(trainer, inputs)

    model = trainer.model
    input_ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
    attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(model, input_ids, attention_mask, 7)
    mask = inputs["completion_mask"]
    seq_log_ratio = ((logp - inputs["old_per_token_logps"]) * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True)
    per_seq, left, right = reference_per_token_loss(
        seq_log_ratio, torch.zeros_like(seq_log_ratio), inputs["advantages"], 0.5, 1.0, 0.05, 0.05
    )
    assert left.any() or right.any(), "at least one sequence must be clipped"
    expected = ((per_seq * mask).sum(-1) / mask.sum(-1)).mean()
    expected_grads = torch.autograd.grad(expected, [p for p in model.parameters() if p.requires_grad])
    trl_per_seq = trl_clip_loss(seq_log_ratio.detach(), 0.0, inputs["advantages"], epsilon_low=0.05, epsilon_high=0.05)
    torch.testing.assert_close(loss, ((trl_per_seq * mask).sum(-1) / mask.sum(-1)).mean())
    assert_grads_close(grads, expected_grads, rtol=1e-5, atol=1e-7)


# TRL features around the surrogate. With beta1 = beta2 = 1 (GPPO) the forward value equals PPO's, and with
# beta1 = beta2 = 0 the gradient equals PPO's: comparing with GRPOTrainer under both pins every feature's wiring.
FEATURES = {
    "plain": {},
    "kl": {"beta": 0.04},
    "kl_bias_corrected": {"beta": 0.04, "use_bias_correction_kl": True},
    "entropy_mask": {"top_entropy_quantile": 0.5},
    "off_policy_mask": {"off_policy_mask_threshold": 0.05},
    "entropy_bonus": {"entropy_coef": 0.01},
    "grpo_aggregation": {"loss_type": "grpo"},
    "dual_clip": {"delta": 1.5},  # TRL's two-sided clamp is the authors' dual clip when delta > 1 + epsilon_high
}


def _feature_inputs(trainer, features):
    inputs = make_offpolicy_batch(trainer, seed=1)
    if features.get("beta"):
        g = torch.Generator().manual_seed(5)
        inputs["ref_per_token_logps"] = (
            inputs["old_per_token_logps"] + torch.rand(inputs["old_per_token_logps"].shape, generator=g) * 0.2
        )
    return inputs


@pytest.mark.parametrize("feature", list(FEATURES))
def test_trl_features_match_grpo(make_trainer, tokenizer, tmp_path, feature):
    features = FEATURES[feature]
    model = None
    if features.get("beta"):  # the reference model is loaded from the policy's path
        model = str(tmp_path / "tiny")
        build_tiny_llama(tokenizer, seed=0).save_pretrained(model)
        tokenizer.save_pretrained(model)
    trainer = make_trainer(model=model, gppo_beta1=1.0, gppo_beta2=1.0, **features)
    inputs = _feature_inputs(trainer, features)
    grpo_compute_loss = lambda model, inp: GRPOTrainer._compute_loss(trainer, model, inp)  # noqa: E731
    loss_gppo, _ = loss_and_grads(trainer, inputs)
    loss_trl, grads_trl = loss_and_grads(trainer, inputs, grpo_compute_loss)
    torch.testing.assert_close(loss_gppo, loss_trl)  # GPPO (beta = 1) forward == PPO forward

    trainer.beta1_schedule = trainer.beta2_schedule = parse_schedule(0.0)
    _, grads_zero = loss_and_grads(trainer, inputs)
    assert_grads_close(grads_zero, grads_trl, rtol=1e-5, atol=1e-7)  # beta = 0 gradient == PPO gradient


def test_vllm_importance_sampling_correction_is_applied_like_trl(make_trainer):
    trainer = make_trainer(gppo_beta1=0.0, gppo_beta2=0.0)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # the loss path only; no vLLM needed
    inputs = make_offpolicy_batch(trainer, seed=2)
    inputs["importance_sampling_ratio"] = torch.rand(inputs["old_per_token_logps"].shape) + 0.5
    _, grads = loss_and_grads(trainer, inputs)
    _, grads_trl = loss_and_grads(trainer, inputs, lambda m, i: GRPOTrainer._compute_loss(trainer, m, i))
    assert_grads_close(grads, grads_trl, rtol=1e-5, atol=1e-7)


def test_on_policy_equals_grpo_and_off_policy_differs(make_trainer):
    trainer = make_trainer()  # paper defaults beta1 = 0.5, beta2 = 1
    inputs = make_offpolicy_batch(trainer, seed=4)
    trl_loss = lambda m, i: GRPOTrainer._compute_loss(trainer, m, i)  # noqa: E731

    on_policy = {k: v for k, v in inputs.items() if k != "old_per_token_logps"}  # TRL's r == 1 path
    loss_on, grads_on = loss_and_grads(trainer, on_policy)
    logged = {name: values[-1] for name, values in trainer._metrics["train"].items()}
    assert logged["cegppo/ratio/min"] == logged["cegppo/ratio/max"] == 1.0  # TRL's ratio, exactly 1 on-policy
    loss_on_trl, grads_on_trl = loss_and_grads(trainer, on_policy, trl_loss)
    torch.testing.assert_close(loss_on, loss_on_trl)
    assert_grads_close(grads_on, grads_on_trl)

    _, grads_off = loss_and_grads(trainer, inputs)
    _, grads_off_trl = loss_and_grads(trainer, inputs, trl_loss)
    max_diff = max((a - b).abs().max().item() for a, b in zip(grads_off, grads_off_trl))
    assert max_diff > 1e-4, "off-policy, the preserved gradients must change the update"


@pytest.mark.parametrize("loss_type", ["cispo", "sapo", "vespo"])
def test_other_trl_objectives_run_unchanged(make_trainer, loss_type):
    extra = {"epsilon_high": 5.0} if loss_type == "cispo" else {}
    trainer = make_trainer(loss_type=loss_type, **extra)
    inputs = make_offpolicy_batch(trainer, seed=6)
    loss, grads = loss_and_grads(trainer, inputs)
    loss_trl, grads_trl = loss_and_grads(trainer, inputs, lambda m, i: GRPOTrainer._compute_loss(trainer, m, i))
    torch.testing.assert_close(loss, loss_trl)
    assert_grads_close(grads, grads_trl)
    assert not any(k.startswith("cegppo/") for k in trainer._metrics["train"])


CEGPPO_METRICS = ["cegppo/beta1", "cegppo/beta2", "cegppo/dual_clip_frac", "cegppo/ratio/min", "cegppo/ratio/max"]


def test_training_steps_change_parameters_and_log_metrics(make_trainer):
    trainer = make_trainer(num_iterations=2, max_steps=6, gppo_beta1=0.75, delta=10.0)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert len(changed) == len(before), "every parameter should receive an update"

    logs = [h for h in trainer.state.log_history if "cegppo/beta1" in h]
    assert len(logs) == 6
    for h in logs:
        assert set(CEGPPO_METRICS) <= set(h)
        assert not any(
            k.startswith(
                (
                    "cegppo/predictor",
                    "cegppo/preserved/grad_share",
                    "cegppo/preserved/left_frac",
                    "cegppo/preserved/right_frac",
                )
            )
            for k in h
        ), "research metrics stay opt-in"
        assert h["cegppo/beta1"] == 0.75 and h["cegppo/beta2"] == 1.0
        assert 0 < h["cegppo/ratio/min"] <= h["cegppo/ratio/max"]
    # num_iterations = 2: the first pass over each batch is on-policy (r == 1), the second is not.
    assert logs[0]["cegppo/ratio/min"] == logs[0]["cegppo/ratio/max"] == 1.0
    second_passes = logs[1::2]
    assert any(h["cegppo/ratio/max"] > 1.0 for h in second_passes)
    assert any(h["clip_ratio/low_mean"] + h["clip_ratio/high_mean"] > 0 for h in second_passes)
    # The left-clipped tokens' mean log r is logged only when there are some, and is then below log(1 - ε).
    assert "cegppo/preserved/left_log_ratio" not in logs[0]
    assert all((h["clip_ratio/low_mean"] > 0) == ("cegppo/preserved/left_log_ratio" in h) for h in logs)
    drift = [h["cegppo/preserved/left_log_ratio"] for h in logs if "cegppo/preserved/left_log_ratio" in h]
    assert drift and all(x < math.log(0.8) for x in drift)


@pytest.mark.parametrize("keep", [None, [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]])
def test_clip_and_cegppo_metrics_equal_values_computed_from_the_batch(make_trainer, keep):
    # Every metric written out from its definition on the batch (masked tokens and dropped groups excluded): TRL's
    # clip ratios stay TRL's with the preserved gradient on, and the `cegppo/` statistics are one value a step.
    trainer = make_trainer(gppo_beta1=0.5, gppo_beta2=1.0, delta=1.3, dynamic_sampling=keep is not None)
    batch = make_offpolicy_batch(trainer, seed=1)
    cmask = batch["completion_mask"]
    rows = torch.ones(6) if keep is None else torch.tensor(keep)
    if keep is not None:
        kept_tokens = (cmask * rows[:, None]).sum()
        batch.update(keep_mask=rows, num_items_in_batch=kept_tokens)
    loss_and_grads(trainer, batch)
    metrics = {k: v[-1] for k, v in trainer._metrics["train"].items()}
    assert len(trainer._metrics["train"]["cegppo/ratio/min"]) == 1

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    att = torch.cat([batch["prompt_mask"], cmask], 1)
    logp, _, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, att, 7)
    logp = logp.detach()
    old, adv = batch["old_per_token_logps"], batch["advantages"]
    _, left, right = reference_per_token_loss(logp, old, adv, 0.5, 1.0, delta=1.3)
    ratio = torch.exp(logp - batch["old_per_token_logps"])
    dual = (batch["advantages"][:, None] < 0) & (ratio > 1.3)
    valid = (cmask * rows[:, None]).bool()
    n = valid.sum().item()
    assert (left & valid).any() and (right & valid).any() and (dual & valid).any()
    per_seq_left = [(left[i] & valid[i]).sum().item() / valid[i].sum().item() for i in range(6) if rows[i]]
    per_seq_right = [(right[i] & valid[i]).sum().item() / valid[i].sum().item() for i in range(6) if rows[i]]
    expected = {
        "clip_ratio/low_mean": (left & valid).sum().item() / n,
        "clip_ratio/high_mean": (right & valid).sum().item() / n,
        "clip_ratio/region_mean": ((left | right) & valid).sum().item() / n,
        "clip_ratio/low_min": min(per_seq_left),
        "clip_ratio/high_max": max(per_seq_right),
        "cegppo/dual_clip_frac": (dual & valid).sum().item() / n,
        "cegppo/ratio/min": ratio[valid].min().item(),
        "cegppo/ratio/max": ratio[valid].max().item(),
        "cegppo/preserved/left_log_ratio": (logp - old)[left & valid].mean().item(),
    }
    for name, value in expected.items():
        assert metrics[name] == pytest.approx(value, rel=1e-5, abs=1e-7), name


def test_lora_training_updates_only_adapters(make_trainer):
    from peft import LoraConfig

    trainer = make_trainer(num_iterations=2, max_steps=2)
    trainer = CEGPPOTrainer(
        model=trainer.model,
        reward_funcs=trainer.reward_funcs,
        args=trainer.args,
        train_dataset=trainer.train_dataset,
        processing_class=trainer.processing_class,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0),
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    lora_changed = [n for n in before if "lora_B" in n and not torch.equal(before[n], after[n].detach())]
    base_changed = [n for n in before if "lora_" not in n and not torch.equal(before[n], after[n].detach())]
    assert lora_changed and not base_changed
    assert any("cegppo/beta1" in h for h in trainer.state.log_history)


def test_on_policy_configuration_warns_once(make_trainer, caplog):
    with caplog.at_level(logging.WARNING):
        make_trainer()  # gradient_accumulation_steps = steps_per_generation = num_iterations = 1
    messages = [r.getMessage() for r in caplog.records if "identical to GRPO" in r.getMessage()]
    assert len(messages) == 1
    assert "num_iterations=2" in messages[0] and "steps_per_generation" in messages[0]

    caplog.clear()
    with caplog.at_level(logging.WARNING):
        make_trainer(num_iterations=2)
    assert not [r for r in caplog.records if "identical to GRPO" in r.getMessage()]


def test_on_policy_warning_also_applies_with_vllm_importance_sampling_correction(make_trainer, caplog):
    # With vLLM IS correction TRL recomputes the old log-probs with the training model on the same weights, so the
    # ratio is still 1: the configuration is still plain GRPO, and the warning says why the correction is no help.
    trainer = make_trainer()
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True  # the check only; no vLLM needed
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        trainer._warn_if_on_policy()
    messages = [r.getMessage() for r in caplog.records if "identical to GRPO" in r.getMessage()]
    assert len(messages) == 1
    assert "importance-sampling correction does not change this" in messages[0]


def test_a_plain_grpo_config_is_converted_with_cegppo_defaults(make_trainer):
    from trl import GRPOConfig

    trainer = make_trainer(config_cls=GRPOConfig)  # a drop-in user swaps the class, not the config
    assert type(trainer.args) is CEGPPOConfig and (trainer.args.gppo_beta1, trainer.args.gppo_beta2) == (0.5, 1.0)
