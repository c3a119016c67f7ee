"""The trainer's `preserved_weight` hook, `gppo_beta_rule`, and the mechanism study's token-class arms
(examples/entropy_study/mechanism.py), on the tiny Llama, off-policy (4 optimizer steps per rollout batch).

- The hook is the one the loss reads: a subclass returning zeros trains GRPO's parameters at β = (0.5, 1), bit for bit.
- `gppo_beta_rule="entropy"` at β1 = β2 trains the paper's rule's parameters bit for bit (every preserved token gets
  the same β either way) and others at (0, 1); a sequence-level ratio and an unknown rule are refused by name.
- The study's classes split the right-clipped tokens by log p < -H: the two arms' preserved gradients add up to the
  paper's rule's (the term is linear in the coefficient), each class is non-empty on the batch used, and a labelled
  arm without its `arm_setup` is refused by the probe.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from helpers.batches import base_config_kwargs, count_ones_reward, loss_and_grads, make_offpolicy_batch

from cegppo_trl import CEGPPOTrainer
from cegppo_trl.demos.tiny import build_tiny_llama
from cegppo_trl.loss import cegppo_regions
from cegppo_trl.research.probe import ProbeSettings, run_probe
from cegppo_trl.research.trainer import ResearchCEGPPOConfig, ResearchCEGPPOTrainer
from cegppo_trl.schedules import parse_schedule

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `examples` is a folder beside the package, importable from the repository root
    sys.path.insert(0, str(ROOT))

from examples.entropy_study import mechanism  # noqa: E402

PROMPTS = [f"{i % 4}+{i % 4}=" for i in range(32)]


def _trainer(tmp_path, tokenizer, cls=ResearchCEGPPOTrainer, **kw):
    settings = dict(per_device_train_batch_size=4, num_generations=4, steps_per_generation=4, loss_type="dapo",
                    lr_scheduler_type="constant", learning_rate=1e-2, max_steps=4, bf16=False)  # fmt: skip
    settings.update(kw)
    return cls(model=build_tiny_llama(tokenizer, seed=0), reward_funcs=count_ones_reward,
               args=ResearchCEGPPOConfig(**base_config_kwargs(tmp_path, **settings)),
               train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer)  # fmt: skip


class NothingPreserved(CEGPPOTrainer):
    def preserved_weight(self, log_ratio, advantages, regions, **kwargs):
        return torch.zeros_like(super().preserved_weight(log_ratio, advantages, regions, **kwargs))


@pytest.mark.slow
def test_a_hook_that_preserves_nothing_trains_grpos_parameters_off_policy(tmp_path, tokenizer):
    ends = {}
    for name, cls, betas in (("grpo", CEGPPOTrainer, (0.0, 0.0)), ("hook", NothingPreserved, (0.5, 1.0)),
                             ("cegppo", CEGPPOTrainer, (0.5, 1.0))):  # fmt: skip
        trainer = _trainer(tmp_path / name, tokenizer, cls, gppo_beta1=betas[0], gppo_beta2=betas[1])
        trainer.train()
        ends[name] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        if name == "cegppo":  # the run was off-policy and clipped: β had something to act on
            history = [h for h in trainer.state.log_history if "clip_ratio/region_mean" in h]
            assert max(h["clip_ratio/region_mean"] for h in history) > 0
    assert all(torch.equal(ends["grpo"][k], ends["hook"][k]) for k in ends["grpo"])
    assert not all(torch.equal(ends["grpo"][k], ends["cegppo"][k]) for k in ends["grpo"])


@pytest.mark.slow
def test_the_entropy_rule_is_the_papers_at_equal_betas_and_another_update_otherwise(tmp_path, tokenizer):
    ends = {}
    for name, rule, betas in (("paper", "paper", (0.7, 0.7)), ("entropy", "entropy", (0.7, 0.7)),
                              ("paper01", "paper", (0.0, 1.0)), ("entropy01", "entropy", (0.0, 1.0))):  # fmt: skip
        trainer = _trainer(tmp_path / name, tokenizer, gppo_beta1=betas[0], gppo_beta2=betas[1], gppo_beta_rule=rule)
        trainer.train()
        ends[name] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    assert all(torch.equal(ends["paper"][k], ends["entropy"][k]) for k in ends["paper"])
    assert not all(torch.equal(ends["paper01"][k], ends["entropy01"][k]) for k in ends["paper01"])


def test_the_entropy_rule_is_refused_with_sequence_level_ratios_and_an_unknown_rule_by_name(tmp_path):
    with pytest.raises(ValueError, match="`gppo_beta_rule='entropy'`.*importance_sampling_level='token'"):
        ResearchCEGPPOConfig(output_dir=str(tmp_path), gppo_beta_rule="entropy", importance_sampling_level="sequence")
    with pytest.raises(ValueError, match=r"`gppo_beta_rule` must be 'paper' or 'entropy', got 'side'"):
        ResearchCEGPPOConfig(output_dir=str(tmp_path), gppo_beta_rule="side")


def _preserved_grads(trainer, inputs, right_tokens):
    """Parameter gradient of one micro-batch minus GRPO's (β = 0): the preserved gradient alone."""
    trainer.right_tokens = right_tokens
    trainer.beta2_schedule = parse_schedule(1.0)
    _, with_beta = loss_and_grads(trainer, inputs)
    trainer.beta2_schedule = parse_schedule(0.0)
    _, grpo = loss_and_grads(trainer, inputs)
    return [a - b for a, b in zip(with_beta, grpo, strict=True)]


def test_the_two_token_classes_split_the_right_clipped_gradient(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, mechanism.RightTokenTrainer, gppo_beta1=0.0, gppo_beta2=1.0)
    inputs = make_offpolicy_batch(trainer, seed=3)
    # Both classes are present among the right-clipped tokens of this batch (else the test says nothing).
    with torch.no_grad():
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], 1)
        logps, entropies = trainer._get_per_token_logps_and_entropies(
            trainer.model, ids, mask, inputs["completion_ids"].shape[1], compute_entropy=True)[:2]  # fmt: skip
    right = cegppo_regions(logps - inputs["old_per_token_logps"], inputs["advantages"], epsilon_low=0.2,
                           epsilon_high=0.2).right & inputs["completion_mask"].bool()  # fmt: skip
    raises = logps < -entropies
    assert (right & raises).any() and (right & ~raises).any()

    full, raise_, rest = (_preserved_grads(trainer, inputs, t) for t in ("all", "raise", "rest"))
    assert any(g.abs().max() > 0 for g in raise_) and any(g.abs().max() > 0 for g in rest)
    for f, a, b in zip(full, raise_, rest, strict=True):
        torch.testing.assert_close(a + b, f, atol=1e-7, rtol=1e-5)
    assert not all(torch.allclose(a, f) for a, f in zip(raise_, full, strict=True))
    trainer.right_tokens, trainer.beta2_schedule = "some", parse_schedule(1.0)  # at beta = 0 the hook is not called
    with pytest.raises(ValueError, match="right_tokens must be one of"):
        loss_and_grads(trainer, inputs)


def test_the_probe_refuses_a_labelled_arm_without_its_setup(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, mechanism.RightTokenTrainer)
    settings = ProbeSettings(arms=mechanism.ARMS, branch_points=1, probe_prompts=2)
    assert [a[2:] for a in settings.arms] == [(), (), ("raise",), ("rest",)]
    with pytest.raises(ValueError, match=r"\(β1, β2\) or \(β1, β2, label\)"):
        ProbeSettings(arms=((0, 0), (0, 1, "raise", "more")))
    with pytest.raises(ValueError, match=r"\(0, 1\) raise.*arm_setup"):
        run_probe(trainer, PROMPTS[:2], settings, log=None)


@pytest.mark.slow
def test_the_rule_arms_run_through_the_probe_with_the_rule_each_names(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, mechanism.RightTokenTrainer)
    rules = []
    original = trainer.preserved_weight

    def spy(*args, **kwargs):
        rules.append(trainer.args.gppo_beta_rule)
        return original(*args, **kwargs)

    trainer.preserved_weight = spy
    settings = ProbeSettings(arms=mechanism.RULE_ARMS, branch_points=1, probe_prompts=2)
    result = run_probe(trainer, PROMPTS[:2], settings, log=None, arm_setup=mechanism.set_beta_rule)
    arms = result["branches"][0]["arms"]
    assert list(arms) == [mechanism.B1_PAPER, mechanism.B2_ENTROPY, mechanism.B1_ENTROPY, mechanism.REF]
    # Each arm's 4 micro-batches under its own rule, in the probe's order (the reference, at β = 0, keeps nothing).
    assert rules == ["paper"] * 4 + ["entropy"] * 8
    assert arms[mechanism.B1_ENTROPY]["delta"] != arms[mechanism.B1_PAPER]["delta"]


@pytest.mark.slow
def test_the_study_arms_run_through_the_probe_and_the_summary_reads_them(tmp_path, tokenizer):
    trainer = _trainer(tmp_path, tokenizer, mechanism.RightTokenTrainer)
    settings = ProbeSettings(arms=mechanism.ARMS, branch_points=2, probe_prompts=4)
    result = run_probe(trainer, PROMPTS[:4], settings, log=None, arm_setup=mechanism.set_right_tokens)
    branches = result["branches"]
    assert list(branches[0]["arms"]) == [mechanism.FULL, mechanism.RAISE, mechanism.REST, mechanism.REF]
    assert {b["arms"][mechanism.RAISE]["variant"] for b in branches} == {"raise"}
    # The classes change the update: not every arm ends where the paper's rule does.
    deltas = {arm: [b["arms"][arm]["delta"] for b in branches] for arm in branches[0]["arms"]}
    assert deltas[mechanism.RAISE] != deltas[mechanism.FULL] or deltas[mechanism.REST] != deltas[mechanism.FULL]
    out = tmp_path / "out"
    out.mkdir()
    for seed in (0, 1):
        (out / f"t1-seed{seed}.json").write_text(json.dumps(
            {"meta": {"regime": "t1", "seed": seed}, "branches": branches}))  # fmt: skip
    text, evaluation = mechanism.results_markdown(out, stage_a=None)
    row = evaluation["regimes"]["t1"]
    assert row["k"] == 4
    d_full = [b["arms"][mechanism.FULL]["delta"] - b["arms"][mechanism.REF]["delta"] for b in branches] * 2
    assert row["arms"][mechanism.FULL]["d"] == d_full
    assert {t["id"] for t in evaluation["tests"]} == {
        "M1[t1]", "M1[t1] reversed", "M2[t1]", "M2[t1] reversed", "M3[t1]", "S[t1]"}  # fmt: skip
    assert "M1[t1]" in evaluation["verdicts"] and "| S[t1] |" in text


def _branch(step, h0, ref, d):
    """A branch record as the probe writes it: GRPO's ΔH `ref`, each other arm's ΔH = ref + its D."""
    arms = {mechanism.REF: {"delta": ref, "predicted": 0.0, "clip": {"pos_above": 0.01}}}
    for arm, value in d.items():
        arms[arm] = {"delta": ref + value, "predicted": value, "clip": {"pos_above": 0.01}}
    return {"step": step, "h0": h0, "arms": arms}


def test_the_rule_study_pairs_with_the_mechanism_runs_and_joins_the_holm_family(tmp_path):
    # Seed 0 has 7 branch points, seed 1 six. The entropy rule's β2 arm raises entropy (+0.01) and its β1 arm lowers it
    # (-0.01) at all 12 paired ones: exact one-sided p = 2^-12 each, held after Holm over the 10 tests. One rule branch point has another
    # starting entropy than its mechanism twin (another base run): it is left out, not paired.
    mech = {mechanism.FULL: -0.02, mechanism.RAISE: 0.005, mechanism.REST: -0.025}
    for seed in (0, 1):
        steps = range(0, 56, 8) if seed == 0 else range(0, 48, 8)
        branches = [_branch(s, 2.0 + s / 100, -0.05, {k: v * (1 + s / 80) for k, v in mech.items()}) for s in steps]
        rule = [_branch(s, 2.0 + s / 100 + (s == 48), -0.05, {mechanism.B1_PAPER: -0.003 * (1 + s / 80),
                mechanism.B2_ENTROPY: 0.01, mechanism.B1_ENTROPY: -0.01}) for s in steps]  # fmt: skip
        for name, data, study in (("t1", branches, "mechanism"), ("rule-t1", rule, "rule")):
            (tmp_path / f"{name}-seed{seed}.json").write_text(
                json.dumps({"meta": {"regime": "t1", "seed": seed, "study": study}, "branches": data}))  # fmt: skip
    text, evaluation = mechanism.results_markdown(tmp_path, stage_a=None)
    rule = evaluation["rule"]
    assert (rule["k"], rule["unmatched"]) == (12, 1)
    assert evaluation["verdicts"]["E1"] == evaluation["verdicts"]["E2"] == "held"
    tests = {t["id"]: t for t in evaluation["tests"]}
    # Holm over 10: M1[t1] and M2[t1] (13 branch points of one sign: 2^-13) rank first and second, E1 (2^-12) third.
    assert len(tests) == 10 and tests["E1"]["p"] == 2**-12 and tests["E1"]["p_holm"] == pytest.approx(8 * 2**-12)
    full = [-0.02 * (1 + s / 80) for s in range(0, 48, 8)] * 2
    assert rule["arms"][mechanism.B2_ENTROPY]["minus_paper"]["mean"] == pytest.approx(0.01 - sum(full) / 12)
    assert evaluation["verdicts"]["M2[t1]"] == "held" and "E1 reversed" in text


def test_the_model_card_names_the_entropy_rule_and_not_the_papers(tmp_path, tokenizer):
    assert (
        _trainer(tmp_path / "e", tokenizer, gppo_beta_rule="entropy").cegppo_settings()["gppo_beta_rule"] == "entropy"
    )
    assert "gppo_beta_rule" not in _trainer(tmp_path / "p", tokenizer).cegppo_settings()  # the paper's: as before
