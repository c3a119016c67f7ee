"""The β-response probe (`cegppo_trl.research.probe`) and its statistics (`cegppo_trl.research.stats`).

The statistics are checked against values derived by hand (sign vectors enumerated in the comments, t quantiles from
printed tables). The probe is checked off-policy (4 optimizer steps per rollout batch) on the tiny Llama: every arm
trains on the same rollout batch, the probe set is fixed, the reference arm's path is the plain `trainer.train()`
run, two runs of the same arm are bit-identical, and on a toy whose sign is known β1 > 0 lowers entropy against GRPO.
"""

from __future__ import annotations

import json
import logging
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from datasets import Dataset
from helpers.batches import base_config_kwargs, count_ones_reward

from cegppo_trl.demos.tiny import build_tiny_llama
from cegppo_trl.research.probe import (
    ProbeSettings,
    _batch_digest,
    _restore,
    _rng_state,
    _set_betas,
    _snapshot,
    _train_rollout_batch,
    _VllmRequestSeed,
    build_probe_set,
    parse_arms,
    probe_entropy,
    probe_generation_config,
    run_probe,
    summarize_probe,
)
from cegppo_trl.research.stats import holm, sign_flip_p, t_interval, t_quantile
from cegppo_trl.research.trainer import ResearchCEGPPOConfig, ResearchCEGPPOTrainer


# ----------------------------------------------------------------------------------------------------------------
# Statistics, by hand
# ----------------------------------------------------------------------------------------------------------------
def test_sign_flip_p_three_positive_differences_is_one_eighth_one_sided_two_eighths_two_sided():
    # 8 sign vectors; only (+,+,+) reaches the observed sum 6 (and only (-,-,-) its mirror).
    assert sign_flip_p([1.0, 2.0, 3.0], "greater") == 1 / 8
    assert sign_flip_p([1.0, 2.0, 3.0], "two-sided") == 2 / 8
    assert sign_flip_p([1.0, 2.0, 3.0], "less") == 1.0


def test_sign_flip_p_mixed_signs_enumerated_by_hand():
    # d = (1, -2, 3), observed sum 2. The 8 signed sums ±1±2±3: 6, 0, 2, -4, 4, -2, 0, -6.
    d = [1.0, -2.0, 3.0]
    assert sign_flip_p(d, "greater") == 3 / 8  # 6, 2, 4
    assert sign_flip_p(d, "less") == 6 / 8  # 0, 2, -4, -2, 0, -6
    assert sign_flip_p(d, "two-sided") == 6 / 8  # |s| >= 2: 6, 2, -4, 4, -2, -6
    # Ties count: (1, 1) has sums 2, 0, 0, -2.
    assert sign_flip_p([1.0, 1.0], "greater") == 1 / 4
    assert sign_flip_p([], "greater") == 1.0


def test_sign_flip_p_smallest_value_is_two_to_the_minus_k_and_refuses_monte_carlo_sizes():
    assert sign_flip_p([0.1] * 12, "greater") == 2**-12
    assert sign_flip_p([0.1] * 12, "two-sided") == 2**-11
    with pytest.raises(ValueError, match="too many"):
        sign_flip_p([0.1] * 21)
    with pytest.raises(ValueError, match="alternative"):
        sign_flip_p([1.0], "bigger")


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_sign_flip_p_past_max_exact_with_samples_estimates_the_binomial_tail(alternative):
    # 24 differences of size 1, 18 positive: a signed sum is 2B - 24 with B ~ Bin(24, 1/2) terms positive, the
    # observed one B = 18, so the exact p-values are P(B >= 18) ("greater"), P(B <= 18) ("less"), P(|2B - 24| >= 12).
    n, k = 24, 18
    d = [1.0] * k + [-1.0] * (n - k)
    upper = sum(math.comb(n, j) for j in range(k, n + 1)) / 2**n
    exact = {"greater": upper, "less": 1 - upper + math.comb(n, k) / 2**n, "two-sided": 2 * upper}[alternative]
    p = sign_flip_p(d, alternative, samples=20_000)
    assert p == sign_flip_p(d, alternative, samples=20_000)  # seeded
    assert abs(p - exact) < 4 * math.sqrt(exact * (1 - exact) / 20_000) + 1e-4, (p, exact)


@pytest.mark.parametrize(("df", "table"), [(1, 12.706), (2, 4.303), (5, 2.571), (11, 2.201), (30, 2.042)])
def test_t_quantile_matches_the_printed_table(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, abs=5e-4)


def test_t_interval_of_one_two_three():
    # mean 2, sd 1, t_{0.975, 2} = 4.3027: half-width 4.3027 / sqrt(3) = 2.4842.
    mean, low, high = t_interval([1.0, 2.0, 3.0])
    assert mean == 2.0
    assert (low, high) == pytest.approx((2 - 2.4842, 2 + 2.4842), abs=1e-4)


def test_holm_adjusts_step_down_and_keeps_input_order():
    # sorted: 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> max(0.06, 0.04) = 0.06.
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])


def test_parse_arms():
    assert parse_arms("0,0; 0.5,1") == ((0.0, 0.0), (0.5, 1.0))
    for bad in ("0,0", "0,0;1", "0,0;0,0", "0,0;-1,0", "0,0;a,b"):
        with pytest.raises(ValueError):
            parse_arms(bad)


# ----------------------------------------------------------------------------------------------------------------
# The probe on the tiny Llama, off-policy
# ----------------------------------------------------------------------------------------------------------------
PROMPTS = [f"{i % 4}+{i % 4}=" for i in range(32)]


def _trainer(tmp_path, tokenizer, model=None, reward=count_ones_reward, **kw):
    settings = dict(per_device_train_batch_size=4, num_generations=4, steps_per_generation=4, loss_type="dapo",
                    lr_scheduler_type="constant", learning_rate=1e-2)  # fmt: skip
    settings.update(kw)
    # the probe's trainer, as `cegppo probe` builds it: the research trainer with the per-step predictor on
    args = ResearchCEGPPOConfig(**base_config_kwargs(tmp_path, **settings), log_predictor=True)
    return ResearchCEGPPOTrainer(
        model=model if model is not None else build_tiny_llama(tokenizer, seed=0),
        reward_funcs=reward,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}),
        processing_class=tokenizer,
    )


def test_probe_set_is_fixed_and_leaves_the_training_rng_alone(tokenizer):
    model = build_tiny_llama(tokenizer, seed=0)
    before = torch.get_rng_state()
    first = build_probe_set(model, tokenizer, PROMPTS[:6], max_new_tokens=6, seed=3)
    assert torch.equal(torch.get_rng_state(), before)
    again = build_probe_set(model, tokenizer, PROMPTS[:6], max_new_tokens=6, seed=3)
    other = build_probe_set(model, tokenizer, PROMPTS[:6], max_new_tokens=6, seed=4)
    assert first.digest() == again.digest() != other.digest()
    assert probe_entropy(model, first) == probe_entropy(model, again)
    # The entropy of a near-uniform random model over ~100 characters is near log(vocab).
    assert 3.5 < probe_entropy(model, first) <= math.log(len(tokenizer)) + 1e-6


# ----------------------------------------------------------------------------------------------------------------
# Exact on any device and sampling setting: generators, the sampling settings, the temperature, the drift warning
# ----------------------------------------------------------------------------------------------------------------
def _generators() -> tuple:
    """Every global generator on this machine, comparable with ==."""
    cuda = tuple(bytes(s.numpy()) for s in torch.cuda.get_rng_state_all()) if torch.cuda.is_available() else None
    return bytes(torch.get_rng_state().numpy()), cuda, random.getstate(), repr(np.random.get_state())


def test_probe_rng_handling_leaves_every_global_generator_as_it_was_and_a_repeated_arm_is_bit_identical(
    tmp_path, tokenizer
):
    trainer = _trainer(tmp_path, tokenizer)
    before = _generators()
    build_probe_set(trainer.model, tokenizer, PROMPTS[:4], max_new_tokens=4, seed=7)
    assert _generators() == before  # the probe set's seed reached no generator of training's

    trainer.create_optimizer_and_scheduler(num_training_steps=8)
    trainer.state.max_steps = 8
    batches = list(trainer.get_train_dataloader())[:4]  # (the sampler draws from the CPU generator)
    at_branch = _generators()
    snap = _snapshot(trainer)
    ends = []
    for _ in range(2):
        _restore(trainer, snap)
        assert _generators() == at_branch  # restored exactly, whatever the previous arm drew
        _set_betas(trainer, (1.0, 1.0))
        _train_rollout_batch(trainer, batches, 1)
        ends.append(({k: v.clone() for k, v in trainer.model.state_dict().items()}, _generators()))
    assert ends[0][1] == ends[1][1] != at_branch  # the arm drew from them (its rollouts), the same draws both times
    assert all(torch.equal(ends[0][0][k], ends[1][0][k]) for k in ends[0][0])


class _FakeCudaGenerators:
    """Two CUDA devices' generators as torch.cuda's functions see them, for a machine without CUDA."""

    def __init__(self, monkeypatch):
        self.states = [torch.tensor([1], dtype=torch.uint8), torch.tensor([2], dtype=torch.uint8)]
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: [s.clone() for s in self.states])
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: setattr(self, "states", list(states)))
        # torch.manual_seed calls torch.cuda.manual_seed_all: seeding every device is what must be undone.
        monkeypatch.setattr(torch.cuda, "manual_seed_all", lambda seed: setattr(self, "states", [
            torch.tensor([seed % 251], dtype=torch.uint8)] * 2))  # fmt: skip

    def values(self) -> list[int]:
        return [int(s[0]) for s in self.states]


def test_probe_set_and_snapshot_restore_every_cuda_device_generator(tmp_path, tokenizer, monkeypatch):
    # On a GPU, sampling draws from the device's generator: the probe set's `torch.manual_seed` must not leave every
    # device reseeded, and a snapshot must carry each device's state, or every arm samples another rollout batch.
    model = build_tiny_llama(tokenizer, seed=0)
    cuda = _FakeCudaGenerators(monkeypatch)
    build_probe_set(model, tokenizer, PROMPTS[:2], max_new_tokens=2, seed=3)
    assert cuda.values() == [1, 2]
    state = _rng_state()
    torch.cuda.manual_seed_all(99)  # what an arm's sampling does to the devices' generators
    from cegppo_trl.research.probe import _set_rng_state

    _set_rng_state(state)
    assert cuda.values() == [1, 2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (the CPU test above fakes one)")
def test_probe_on_cuda_restores_the_device_generators_and_every_arm_samples_the_same_rollout_batch(
    tmp_path, tokenizer
):
    model = build_tiny_llama(tokenizer, seed=0).to("cuda")
    before = [s.clone() for s in torch.cuda.get_rng_state_all()]
    first = build_probe_set(model, tokenizer, PROMPTS[:4], max_new_tokens=4, seed=3)
    after = torch.cuda.get_rng_state_all()
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert build_probe_set(model, tokenizer, PROMPTS[:4], max_new_tokens=4, seed=3).digest() == first.digest()
    trainer = _trainer(tmp_path, tokenizer, model=model, use_cpu=False, bf16=False)
    settings = ProbeSettings(arms=((0.0, 0.0), (1.0, 1.0), (0.0, 1.0)), branch_points=2, probe_prompts=4)
    result = run_probe(trainer, PROMPTS[:4], settings, log=None)  # raises if two arms sampled different batches
    assert len(result["branches"]) == 2


@pytest.mark.parametrize("sampling", [{"top_k": 1}, {"top_p": 1e-6}, {"min_p": 0.999}])
def test_probe_set_samples_with_the_runs_top_k_top_p_and_min_p(tmp_path, tokenizer, sampling):
    # Each setting leaves only the most likely token: the probe set must be the greedy completions (with the
    # hard-coded top_k=0, top_p=1 it was a sample of the full distribution).
    trainer = _trainer(tmp_path, tokenizer, max_completion_length=6, **sampling)
    config = probe_generation_config(trainer)
    assert config is trainer.generation_config  # TRL's own object
    probe = build_probe_set(trainer.model, tokenizer, PROMPTS[:6], max_new_tokens=6, generation_config=config)
    plain = build_probe_set(trainer.model, tokenizer, PROMPTS[:6], max_new_tokens=6)
    tokenizer.padding_side = "left"
    enc = tokenizer(PROMPTS[:6], return_tensors="pt", padding=True, add_special_tokens=False)
    greedy = trainer.model.generate(**enc, do_sample=False, max_new_tokens=6, pad_token_id=tokenizer.pad_token_id)
    greedy = greedy[:, enc["input_ids"].shape[1] :]
    assert torch.equal(probe.completion_ids, greedy)
    assert not torch.equal(plain.completion_ids, greedy)


def test_probe_generation_config_with_vllm_takes_the_config_fields():
    args = SimpleNamespace(max_completion_length=5, temperature=0.7, top_p=0.9, top_k=20, min_p=0.05,
                           repetition_penalty=1.1)  # fmt: skip
    tokenizer = SimpleNamespace(pad_token_id=0, eos_token_id=2)
    config = probe_generation_config(SimpleNamespace(args=args, processing_class=tokenizer, eos_token_ids=[2, 3]))
    assert (config.temperature, config.top_p, config.top_k, config.min_p, config.repetition_penalty) == (
        0.7, 0.9, 20, 0.05, 1.1)  # fmt: skip
    assert config.do_sample and config.max_new_tokens == 5 and config.eos_token_id == [2, 3]


def test_probe_entropy_is_trls_logged_entropy_at_the_trained_temperature(tmp_path, tokenizer):
    # TRL divides the logits by `temperature` for the loss and its logged `entropy`: at 0.7 the probe must measure
    # that distribution, not the raw logits'.
    model = build_tiny_llama(tokenizer, seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # a peaked distribution (the random model's is near uniform at any T)
    # fp32 (no bf16 autocast), so that the bare model's logits are the numbers TRL's path computes in.
    trainer = _trainer(tmp_path, tokenizer, model=model, temperature=0.7, bf16=False)
    probe = build_probe_set(trainer.model, tokenizer, PROMPTS[:8], max_new_tokens=6,
                            generation_config=probe_generation_config(trainer))  # fmt: skip
    assert probe.completion_mask.sum() > probe.completion_mask.numel() / 2
    inputs = {"prompt_ids": probe.prompt_ids, "prompt_mask": probe.prompt_mask, "completion_ids": probe.completion_ids,
              "completion_mask": probe.completion_mask, "advantages": torch.zeros(8), "old_per_token_logps": None,
              "num_items_in_batch": probe.completion_mask.sum().float()}  # fmt: skip
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    trainer._compute_loss(trainer.model, inputs)
    logged = trainer._metrics["train"]["entropy"][-1]
    assert probe_entropy(trainer, probe, batch_size=8) == pytest.approx(logged, rel=1e-6)
    assert probe_entropy(trainer.model, probe, temperature=0.7) == pytest.approx(logged, rel=1e-5)  # a bare model
    raw = probe_entropy(trainer.model, probe)
    assert abs(raw - logged) > 0.05, (raw, logged)


def test_vllm_server_requests_get_one_seed_per_branch_point_and_the_users_kwargs_come_back():
    # The server samples in its own process, out of a snapshot's reach: every arm of a branch point sends the same
    # request seed. Colocated vLLM samples from this process's (restored) device generator: left alone.
    user = {"max_tokens_hint": 1}
    trainer = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(mode="server", generation_kwargs=user))
    with _VllmRequestSeed(trainer) as seeds:
        seeds.set(11)
        assert trainer.vllm_generation.generation_kwargs == {"max_tokens_hint": 1, "seed": 11}
        seeds.set(12)
        assert trainer.vllm_generation.generation_kwargs["seed"] == 12
    assert trainer.vllm_generation.generation_kwargs is user and user == {"max_tokens_hint": 1}
    for generation in (SimpleNamespace(mode="colocate", generation_kwargs={}),
                       SimpleNamespace(mode="server", generation_kwargs={"seed": 5})):  # fmt: skip
        trainer = SimpleNamespace(use_vllm=True, vllm_generation=generation)
        with _VllmRequestSeed(trainer) as seeds:
            seeds.set(11)
        assert "seed" not in generation.generation_kwargs or generation.generation_kwargs["seed"] == 5


def test_drift_warning_in_a_probe_arm_names_the_arm_and_its_beta(tmp_path, tokenizer, caplog):
    # The run is configured with β1 = 0.25; the arms train at 1 and 0: each warning says which arm it comes from and
    # names that arm's β1 (the value the loss used), never the configured one.
    trainer = _trainer(tmp_path, tokenizer, left_drift_warning=-0.25, gppo_beta1=0.25, gppo_beta2=0.0)
    settings = ProbeSettings(arms=((0.0, 0.0), (1.0, 0.0)), branch_points=1, probe_prompts=2)
    with caplog.at_level(logging.WARNING):
        run_probe(trainer, PROMPTS[:2], settings, log=None)
    warnings = [r.getMessage() for r in caplog.records if "left_drift_warning" in r.getMessage()]
    assert any("[cegppo probe, arm (β1, β2) = (1, 0)]" in w and "`gppo_beta1` (now 1)" in w for w in warnings)
    assert any("[cegppo probe, arm (β1, β2) = (0, 0)]" in w and "`gppo_beta1` (now 0)" in w for w in warnings)
    assert all("cegppo probe, arm" in w and "now 0.25" not in w for w in warnings)
    assert "warning" not in vars(trainer.left_drift_alarm)  # the alarm is the class's again after the probe


@pytest.mark.slow
def test_every_arm_trains_on_the_same_rollout_batch_and_the_output_is_complete(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer)
    settings = ProbeSettings(arms=((0.0, 0.0), (1.0, 0.0), (0.0, 1.0)), branch_points=2, probe_prompts=4)
    result = run_probe(trainer, PROMPTS[:4], settings, log=None)
    json.dumps(result)  # JSON-ready
    assert len(result["branches"]) == 2
    hashes = [b["batch_hash"] for b in result["branches"]]
    assert hashes[0] != hashes[1]  # a new rollout batch at each branch point ...
    for branch in result["branches"]:  # ... the same one for every arm
        assert {a["batch_hash"] for a in branch["arms"].values()} == {branch["batch_hash"]}
        assert all(a["tokens"] > 0 for a in branch["arms"].values())
    # Branch point k starts where the reference arm of branch point k - 1 ended.
    first, second = result["branches"]
    assert second["step"] == first["step"] + 4
    assert second["h0"] == first["arms"]["(0, 0)"]["h_after"]
    # Off-policy: something left the clip range.
    assert sum(result["summary"]["(0, 0)"]["clip"].values()) > 0
    assert set(result["summary"]) == {"(0, 0)", "(1, 0)", "(0, 1)"}
    assert result["summary"]["(1, 0)"]["k"] == 2


@pytest.mark.slow
def test_reference_path_is_the_plain_training_run_and_a_repeated_arm_is_bit_identical(tmp_path, tokenizer):
    # The probe drives the trainer's own training_step / clip / optimizer / scheduler: its reference path over two
    # rollout batches must give the weights of `trainer.train()` for the same 8 steps.
    probe = _trainer(tmp_path / "a", tokenizer)
    settings = ProbeSettings(arms=((0.0, 0.0), (1.0, 0.0)), branch_points=2, probe_prompts=2)
    run_probe(probe, PROMPTS[:2], settings, log=None)
    plain = _trainer(tmp_path / "b", tokenizer, max_steps=8, gppo_beta1=0.0, gppo_beta2=0.0)
    plain.train()
    for (name, a), (_, b) in zip(probe.model.state_dict().items(), plain.model.state_dict().items()):
        assert torch.equal(a, b), name

    # Restoring a snapshot and training the same arm again gives the same bits; another arm does not.
    trainer = _trainer(tmp_path / "c", tokenizer)
    trainer.create_optimizer_and_scheduler(num_training_steps=8)
    trainer.state.max_steps = 8
    batches = list(trainer.get_train_dataloader())[:4]
    snap = _snapshot(trainer)
    ends = []
    for arm in ((1.0, 0.0), (1.0, 0.0), (0.0, 0.0)):
        _restore(trainer, snap)
        _set_betas(trainer, arm)
        _train_rollout_batch(trainer, batches, 1)
        ends.append(({k: v.clone() for k, v in trainer.model.state_dict().items()}, _batch_digest(trainer)))
    assert ends[0][1] == ends[1][1] == ends[2][1]
    assert all(torch.equal(ends[0][0][k], ends[1][0][k]) for k in ends[0][0])
    assert not all(torch.equal(ends[0][0][k], ends[2][0][k]) for k in ends[0][0])


@pytest.mark.slow
def test_beta1_and_beta2_lower_probe_entropy_on_a_toy_with_a_known_sign_and_the_predictor_says_so(tmp_path, tokenizer):
    # One-token completions from a policy that puts ~half its mass on "7" (a bias on the LM head) and spreads the rest
    # over ~100 characters; reward 1 for "7". Every other sampled token has A < 0 and probability ~0.005, far below
    # e^-H: pushing it down lowers entropy (dH ∝ π_a (log π_a + H) < 0). GRPO stops pushing once r < 1 - ε
    # (clipped, no gradient); β1 = 1 keeps pushing: the probe entropy must fall further than GRPO's. Plain SGD, so
    # the extra gradient is not rescaled per parameter as Adam would.
    torch.manual_seed(0)
    model = build_tiny_llama(tokenizer, seed=0)
    seven = tokenizer.convert_tokens_to_ids("7")
    head = torch.nn.Linear(model.lm_head.in_features, model.lm_head.out_features, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[seven] = 4.6  # e^4.6 ≈ 99 ≈ the other characters together
    model.lm_head = head

    def seven_reward(completions, **kwargs):
        return [float(c[:1] == "7") for c in completions]

    trainer = _trainer(tmp_path, tokenizer, model=model, reward=seven_reward, num_generations=8,
                       max_completion_length=1, optim="sgd", learning_rate=0.3)  # fmt: skip
    settings = ProbeSettings(arms=((0.0, 0.0), (1.0, 0.0), (0.0, 1.0)), branch_points=2, probe_prompts=8)
    result = run_probe(trainer, PROMPTS[:8], settings, log=None)
    d = [b["arms"]["(1, 0)"]["delta"] - b["arms"]["(0, 0)"]["delta"] for b in result["branches"]]
    assert all(x < -0.1 for x in d), d
    assert result["summary"]["(0, 0)"]["clip"]["neg_below"] > 0.1  # the left-clipped tokens β1 acts on
    assert result["summary"]["(1, 0)"]["mean"] < 0
    # The trainer's per-step predictor calls the sign from the tokens alone (docs/algorithm.md): pushing rare tokens
    # down lowers entropy; the right-clipped tokens are "7"s (p ~ 0.5, log p > -H), and pushing a likely token up
    # lowers it too, the reverse of the paper's PA&LP picture. Its sign matches D at every branch point.
    for arm in ("(1, 0)", "(0, 1)"):
        assert all(b["arms"][arm]["predicted"] < 0 for b in result["branches"]), arm
        summary = result["summary"][arm]
        assert summary["predictor_agrees"] == summary["predictor_k"] == 2, (arm, summary)
    assert result["summary"]["(0, 1)"]["mean"] < 0


def test_summary_reports_the_exact_two_sided_p_over_branch_points():
    branches = [{"arms": {"(0, 0)": {"delta": 0.0, "clip": dict.fromkeys(("pos_below", "pos_above", "neg_below",
                 "neg_above"), 0.0)}, "(1, 0)": {"delta": x, "clip": dict.fromkeys(("pos_below", "pos_above",
                 "neg_below", "neg_above"), 0.0)}}} for x in (-1.0, -2.0, -3.0)]  # fmt: skip
    summary = summarize_probe(branches, (0.0, 0.0))
    assert summary["(1, 0)"]["p_two_sided"] == 2 / 8
    assert summary["(1, 0)"]["mean"] == -2.0
    assert summary["(1, 0)"]["positive"] == 0
    assert summary["(0, 0)"]["reference"]


def test_probe_refuses_the_entropy_controller(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, entropy_controller={"target_low": 1, "target_high": 2})
    with pytest.raises(ValueError, match="entropy_controller"):
        run_probe(trainer, PROMPTS[:2], ProbeSettings(arms=((0, 0), (1, 0)), branch_points=1), log=None)


@pytest.mark.slow
def test_cegppo_probe_command_writes_its_table_json_and_plot(tmp_path, model_dir, data_file, capsys):
    from cegppo_trl.cli import main

    status = main([
        "probe", "--config", "cpu_smoke", "--model_name_or_path", model_dir, "--dataset_name", data_file,
        "--output_dir", str(tmp_path), "--max_completion_length", "4", "--probe_arms", "0,0;1,1",
        "--probe_branch_points", "2", "--probe_prompts", "3",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert status == 0, out
    assert "(1, 1)" in out and "p (2-sided)" in out
    result = json.loads((tmp_path / "probe.json").read_text())
    assert len(result["branches"]) == 2 and result["probe_set"]["sequences"] == 3
    assert (tmp_path / "probe.png").stat().st_size > 0


# ----------------------------------------------------------------------------------------------------------------
# The study's pre-registered verdict rules (examples/entropy_study/probe_study.py), on made-up branch points
# ----------------------------------------------------------------------------------------------------------------
def _branches(effects: dict[str, list[float]]) -> list[dict]:
    """Branch records whose D(arm) are `effects[arm]` (the reference's change is 0.1 at every branch point)."""
    zero = dict.fromkeys(("pos_below", "pos_above", "neg_below", "neg_above"), 0.0)
    k = len(next(iter(effects.values())))
    return [{"arms": {"(0, 0)": {"delta": 0.1, "clip": zero},
                      **{a: {"delta": 0.1 + d[i], "clip": zero} for a, d in effects.items()}}} for i in range(k)]  # fmt: skip


def test_study_claims_held_failed_and_unresolved_follow_the_preregistered_rules():
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from examples.entropy_study.probe_study import evaluate_claims

    wobble = [0.001 * (i % 3) for i in range(12)]  # distinct magnitudes, no ties
    effects = {
        "(0.5, 0)": [-0.02 - w for w in wobble],  # A1: every branch point on the claimed side, both parts
        "(1, 0)": [-0.05 - w for w in wobble],
        "(0, 1)": [-0.03 - w for w in wobble],  # A2 claims > 0: every branch point reversed -> failed
        "(0.5, 1)": [(-1) ** i * 0.01 for i in range(12)],  # A3's difference alternates in sign -> not resolved
        "(0.75, 1)": [0.0] * 12,
    }
    pooled = _branches(effects)
    rows = {r["id"]: r for r in evaluate_claims(pooled, {0: pooled[:6], 1: pooled[6:]})}
    # One Holm family of seven tests (A1-A4 and the reverses of A1-A3): A1 and A2's reverse share the smallest p,
    # 2^-12, so both adjust to 7 × 2^-12; the pre-registered split families (4 forward, 3 reverse) sit beside it.
    assert rows["A1"]["p"] == 2**-12 and rows["A1"]["p_holm"] == 7 * 2**-12
    assert rows["A1"]["p_holm_split"] == 4 * 2**-12 and rows["A2"]["p_reverse_holm_split"] == 3 * 2**-12
    assert rows["A1"]["verdict"] == "held"
    assert rows["A2"]["verdict"] == "failed (reversed)"
    assert rows["A3"]["verdict"] == "not resolved at this power"
    # A4: I = D(0.5,1) - D(0.5,0) - D(0,1) = ±0.01 + 0.05 + 2w: positive at every branch point -> interaction ≠ 0.
    assert rows["A4"]["verdict"] == "failed (interaction ≠ 0)"
    # Significant pooled but one seed's mean on the other side (2 + 14 branch points): not a held claim.
    d = [0.01, 0.01] + [-0.1 - 0.001 * i for i in range(14)]
    split = _branches({**{a: v[:1] * 16 for a, v in effects.items()}, "(0.5, 0)": d, "(1, 0)": [x - 0.03 for x in d]})
    a1 = evaluate_claims(split, {0: split[:2], 1: split[2:]})[0]
    assert a1["p_holm"] <= 0.05 and not a1["seeds_agree"]
    assert a1["verdict"] == "not resolved (significant pooled, seeds disagree)"


def test_stage_a_in_one_holm_family_leaves_a2s_reversal_unresolved_and_the_split_reading_is_labelled_beside_it():
    # Stage A's own branch records (examples/entropy_study/results/probe-stage-a). A2's reverse test (D(0,1) < 0) has the
    # smallest of the seven p-values, 52/4096 (11 of 12 branch points below zero): Holm multiplies it by 7, 0.089 >
    # 0.05. Only the split reading (3 reverse tests on their own: × 3 = 0.038) called it a failure.
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from examples.entropy_study.probe_study import evaluate_claims, family_tests, load_branches

    pooled, per_seed, _ = load_branches(root / "examples" / "entropy_study" / "results" / "probe-stage-a")
    rows = {r["id"]: r for r in evaluate_claims(pooled, per_seed)}
    a2 = rows["A2"]
    assert a2["p_reverse"] == 52 / 4096
    assert a2["p_reverse_holm"] == pytest.approx(7 * 52 / 4096) and a2["verdict"] == "not resolved at this power"
    assert a2["p_reverse_holm_split"] == pytest.approx(3 * 52 / 4096) and a2["verdict_split"] == "failed (reversed)"
    tests = family_tests(list(rows.values()))
    assert len(tests) == 7 and min(t["p_holm"] for t in tests) == pytest.approx(7 * 52 / 4096)
    assert rows["A4"]["verdict"] == "held" and rows["A4"]["p_holm"] == pytest.approx(6 * rows["A4"]["p"])


def test_stage_b_reports_that_5_of_5_can_no_longer_happen_not_a_reversal_and_three_seeds_as_their_range():
    # Stage B's three finished seed pairs: (0.5, 1) − GRPO = -0.102, -0.294, +0.039 at step 64. Two below GRPO rule
    # out "5/5 above"; (0.5, 1) below GRPO is not shown either (one-sided p 2/8: only the all-minus pattern and
    # the observed one reach the observed sum). A percentile bootstrap of 3 values returns their range.
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    from examples.entropy_study.probe_study import summarize_b

    text, data = summarize_b(root / "examples" / "entropy_study" / "results" / "probe-stage-b")
    assert data["b1"]["p_one_sided_lower"] == 0.25 and data["b1"]["verdict"].startswith("cannot hold: 5/5")
    assert "failed" not in text and "Not a reversal" in text
    greedy = data["greedy_accuracy"]
    assert greedy["bootstrap95"] == pytest.approx(greedy["range"])
    assert "range over [-0.175, -0.050]" in text and "bootstrap interval over seeds" not in text
