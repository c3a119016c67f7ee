"""First entropy study: do the CE-GPPO paper's entropy claims (arXiv 2509.20712, §4) hold on the quickstart task?

Runs GRPO, DAPO clip-higher, CE-GPPO at several (β1, β2) and the paper's (0, 1) → (0.5, 1) switch from the same
warmed-up tiny Llama on 2-digit addition, several seeds each, and writes the entropy, held-out accuracy and
preserved-token plots, a markdown table with the paper's claims checked seed by seed, and the raw curves as JSON.
Command line (from the repository root): `python -m examples.entropy_study.addition`; `--help` lists the options.
Results: examples/entropy_study/RESULTS.md.

Fairness: every arm starts from the same cached model and uses the same training settings; only the method fields
differ. Seed `s` fixes TRL's sampling and data order (`seed = data_seed = s`) in every arm, so arms are compared
seed by seed (paired) and arms with identical β before a switch train identically up to it.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

__all__ = ["ARMS", "CLAIMS", "STUDY_TRAINING", "check_claims", "main", "run_arm", "summarize_runs"]

# ----------------------------------------------------------------------------------------------------------------
# Arms and settings
# ----------------------------------------------------------------------------------------------------------------
SWITCH_AT = 0.585  # the paper switches β1 0 -> 0.5 at step 585 of 1000


def cegppo_arm(beta1: float, beta2: float) -> dict:
    from cegppo_trl.research.baselines import method_config

    return {**method_config("cegppo"), "gppo_beta1": beta1, "gppo_beta2": beta2}


def arm_overrides() -> dict[str, tuple[str, dict]]:
    """name -> (label, `CEGPPOConfig` overrides). Everything else is `STUDY_TRAINING`, shared by every arm."""
    from cegppo_trl.research.baselines import method_config

    return {
        "grpo": ("GRPO (ε 0.2/0.2)", method_config("grpo")),
        "dapo": ("DAPO clip-higher (ε 0.2/0.28)", method_config("dapo")),
        "cegppo_0_1": ("CE-GPPO (0, 1)", cegppo_arm(0.0, 1.0)),
        "cegppo_0.5_1": ("CE-GPPO (0.5, 1)", cegppo_arm(0.5, 1.0)),
        "cegppo_0.75_1": ("CE-GPPO (0.75, 1)", cegppo_arm(0.75, 1.0)),
        "cegppo_1_0.5": ("CE-GPPO (1, 0.5)", cegppo_arm(1.0, 0.5)),
        "cegppo_1_1": ("CE-GPPO (1, 1)", cegppo_arm(1.0, 1.0)),
        "switch": (
            "CE-GPPO (0, 1) → (0.5, 1) at 58.5%",
            {**cegppo_arm(0.0, 1.0), "gppo_beta1_schedule": f"piecewise:0,0.5@{SWITCH_AT * 100:g}%"},
        ),
    }


ARMS = ("grpo", "dapo", "cegppo_0_1", "cegppo_0.5_1", "cegppo_0.75_1", "cegppo_1_0.5", "cegppo_1_1", "switch")

# Shared by every arm, over `cegppo_trl.demos.runs.TINY_MODEL_TRAINING` (lr 1.5e-4 with a 20-step warm-up, 128
# completions per optimizer step, 8 samples per prompt, temperature 1, no KL). The one change: 8 optimizer steps per rollout
# batch (128 prompts x 8 samples), as in the authors' runs (examples/entropy_study/RESULTS.md, Setup): most updates off-policy.
STUDY_TRAINING: dict = {"steps_per_generation": 8}

# Default sweep and --quick, sized for 2 shared CPU cores: a 600-step run takes ~52 s with two running side by
# side, so the default 40 runs take ~18 min (up to twice that when other jobs load the cores); --quick ~1.5 min.
DEFAULTS = {"steps": 600, "seeds": "0,1,2,3,4", "eval_every": 50, "workers": 2}
QUICK = {"steps": 40, "seeds": "0,1", "eval_every": 20}

OUTPUT_FILES = ("entropy.png", "accuracy.png", "preserved_tokens.png", "results.md", "curves.json")


# ----------------------------------------------------------------------------------------------------------------
# One run
# ----------------------------------------------------------------------------------------------------------------
_MODEL_CACHE: dict = {}


def _model(warmup: dict, cache_dir: str | None):
    """The warmed-up model (built once, then loaded from the quickstart's cache), kept per process."""
    from cegppo_trl.demos.tasks import addition_task
    from cegppo_trl.demos.warmup import WarmupSettings, build_default_model

    key = (json.dumps(warmup, sort_keys=True), cache_dir)
    if key not in _MODEL_CACHE:
        settings = WarmupSettings(**warmup)
        model, tokenizer, info = build_default_model(settings, cache_dir=cache_dir, log=None)
        task = addition_task(settings.num_digits, settings.num_heldout, settings.task_seed)
        _MODEL_CACHE[key] = (model, tokenizer, task, info)
    return _MODEL_CACHE[key]


def _values(history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(int(h["step"]), float(h[key])) for h in history if h.get(key) is not None and "step" in h]
    return [s for s, _ in pairs], [v for _, v in pairs]


def run_arm(arm: str, seed: int, *, steps: int, eval_every: int, warmup: dict, cache_dir: str | None) -> dict:
    """Train one arm with one seed from the shared warmed-up model; return its raw curves.

    Runs in the calling process with one torch thread (the model's ops are too small to gain from two, and two
    threads slow down badly when another process shares the cores).

    Returns:
        `{"arm", "seed", "steps", "entropy", "beta1", "beta2", "left_frac", "right_frac", "grad_share",
        "reward": {"steps", "values"}, "heldout": {"steps", "values"}, "train_seconds"}`; the per-step lists have
        one value per optimizer step (steps 1..`steps`).
    """
    import tempfile

    import torch

    from cegppo_trl.demos.runs import quiet_libraries, run_training

    quiet_libraries()
    torch.set_num_threads(1)
    model, tokenizer, task, _ = _model(warmup, cache_dir)
    overrides = {**STUDY_TRAINING, **arm_overrides()[arm][1], "log_predictor": True}  # grad_share
    with tempfile.TemporaryDirectory() as trainer_dir:  # TRL's output_dir; nothing is saved there
        result = run_training(
            overrides, model=copy.deepcopy(model), tokenizer=tokenizer, task=task, max_steps=steps, seed=seed,
            eval_every=eval_every, output_dir=trainer_dir, progress=False,
        )  # fmt: skip
    per_step = [h for h in result.history if "loss" in h]  # one entry per optimizer step
    curves: dict = {"arm": arm, "seed": seed, "steps": [int(h["step"]) for h in per_step]}
    for name, key in (
        ("entropy", "entropy"),
        ("beta1", "cegppo/beta1"),
        ("beta2", "cegppo/beta2"),
        ("left_frac", "clip_ratio/low_mean"),
        ("right_frac", "clip_ratio/high_mean"),
        ("grad_share", "cegppo/preserved/grad_share"),
    ):
        # grad_share is logged where something is preserved: 0 at beta = 0 and under TRL's other objectives
        curves[name] = [float(h.get(key, 0.0 if name == "grad_share" else math.nan)) for h in per_step]
    reward_steps, reward = _values(per_step, "reward")
    heldout_steps, heldout = _values(result.history, "heldout/accuracy")
    curves["reward"] = {"steps": reward_steps, "values": reward}
    curves["heldout"] = {"steps": heldout_steps, "values": heldout}
    curves["train_seconds"] = result.train_seconds
    return curves


def _run_all(jobs: list[tuple[str, int]], settings: dict, workers: int, log) -> list[dict]:
    """Every (arm, seed) job, in `workers` processes (spawned, so each starts clean) or in this process."""
    results: list[dict] = []
    start = time.perf_counter()

    def done(curves: dict) -> None:
        results.append(curves)
        elapsed = time.perf_counter() - start
        eta = elapsed / len(results) * (len(jobs) - len(results))
        log(
            f"  [{len(results):2d}/{len(jobs)}] {curves['arm']:<14} seed {curves['seed']}: "
            f"entropy {curves['entropy'][0]:.3f} -> {_tail_mean(curves['entropy']):.3f}, "
            f"held-out {curves['heldout']['values'][0]:.1%} -> {curves['heldout']['values'][-1]:.1%}, "
            f"{curves['train_seconds']:.0f} s (elapsed {elapsed / 60:.1f} min, ~{eta / 60:.1f} min left)"
        )

    if workers <= 1:
        for arm, seed in jobs:
            done(run_arm(arm, seed, **settings))
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=context, initializer=_worker_init) as pool:
            futures = [pool.submit(run_arm, arm, seed, **settings) for arm, seed in jobs]
            for future in as_completed(futures):
                done(future.result())
    order = {job: i for i, job in enumerate(jobs)}
    return sorted(results, key=lambda c: order[(c["arm"], c["seed"])])


def _worker_init() -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


# ----------------------------------------------------------------------------------------------------------------
# Summary numbers
# ----------------------------------------------------------------------------------------------------------------
def _tail_mean(values: Sequence[float], frac: float = 0.1) -> float:
    """Mean of the last `frac` of the values (at least one)."""
    n = max(1, round(len(values) * frac))
    return statistics.fmean(values[-n:])


def _run_metrics(curves: dict, steps_per_generation: int) -> dict:
    """Per-run scalars. 'start' is the first rollout batch's steps (the same policy in every arm up to step 1);
    'final' the last 10% of steps; the switch window starts at the switch step."""
    entropy = curves["entropy"]
    start = statistics.fmean(entropy[:steps_per_generation])
    final = _tail_mean(entropy)
    switch_step = math.ceil(SWITCH_AT * len(entropy))
    at_switch = statistics.fmean(entropy[max(0, switch_step - steps_per_generation) : switch_step] or entropy[:1])
    heldout = curves["heldout"]["values"]
    return {
        "entropy_start": start,
        "entropy_final": final,
        "entropy_mean": statistics.fmean(entropy),
        "entropy_change": final - start,
        "entropy_abs_change": abs(final - start),
        "entropy_abs_change_after_switch": abs(final - at_switch),
        "accuracy_before": heldout[0],
        "accuracy_after": heldout[-1],
        "left_frac": statistics.fmean(curves["left_frac"]),
        "right_frac": statistics.fmean(curves["right_frac"]),
        "grad_share": statistics.fmean(curves["grad_share"]),
    }


def summarize_runs(runs: list[dict], steps_per_generation: int) -> dict[str, dict[str, list[float]]]:
    """arm -> metric -> per-seed values (seeds in the order of `runs`)."""
    table: dict[str, dict[str, list[float]]] = {}
    for curves in runs:
        for key, value in _run_metrics(curves, steps_per_generation).items():
            table.setdefault(curves["arm"], {}).setdefault(key, []).append(value)
    return table


def _spread(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{fmt.format(mean)} ± {fmt.format(std)}"


# ----------------------------------------------------------------------------------------------------------------
# The paper's claims, as paired comparisons of per-seed numbers
# ----------------------------------------------------------------------------------------------------------------
# (claim, [(left arm, metric, relation, right arm, metric), ...]): the claim's direction held if every comparison
# held on the mean over seeds; each comparison also counts the seeds on which it held.
CLAIMS: list[tuple[str, list[tuple[str, str, str, str, str]]]] = [
    (
        "GRPO's entropy collapses (falls, and ends below CE-GPPO (0.5, 1))",
        [
            ("grpo", "entropy_final", "<", "grpo", "entropy_start"),
            ("grpo", "entropy_final", "<", "cegppo_0.5_1", "entropy_final"),
        ],
    ),
    (
        "DAPO clip-higher makes entropy rise (rises, and ends above CE-GPPO (0.5, 1) and GRPO)",
        [
            ("dapo", "entropy_final", ">", "dapo", "entropy_start"),
            ("dapo", "entropy_final", ">", "cegppo_0.5_1", "entropy_final"),
            ("dapo", "entropy_final", ">", "grpo", "entropy_final"),
        ],
    ),
    (
        "CE-GPPO (0.5, 1) keeps entropy more stable than GRPO and DAPO (smaller |final - start|)",
        [
            ("cegppo_0.5_1", "entropy_abs_change", "<", "grpo", "entropy_abs_change"),
            ("cegppo_0.5_1", "entropy_abs_change", "<", "dapo", "entropy_abs_change"),
        ],
    ),
    (
        "Larger β1 → entropy falls faster (final entropy (0, 1) > (0.5, 1) > (0.75, 1) > (1, 1))",
        [
            ("cegppo_0_1", "entropy_final", ">", "cegppo_0.5_1", "entropy_final"),
            ("cegppo_0.5_1", "entropy_final", ">", "cegppo_0.75_1", "entropy_final"),
            ("cegppo_0.75_1", "entropy_final", ">", "cegppo_1_1", "entropy_final"),
        ],
    ),
    (
        "Smaller β2 → entropy falls faster (final entropy (1, 0.5) < (1, 1))",
        [
            ("cegppo_1_0.5", "entropy_final", "<", "cegppo_1_1", "entropy_final"),
        ],
    ),
    (
        "(1, 0.5) collapses and loses accuracy (lowest CE-GPPO entropy; accuracy below (0.5, 1))",
        [
            ("cegppo_1_0.5", "entropy_final", "<", "cegppo_0.75_1", "entropy_final"),
            ("cegppo_1_0.5", "accuracy_after", "<", "cegppo_0.5_1", "accuracy_after"),
        ],
    ),
    (
        "(0, 1) keeps entropy rising without clear gains (rises; accuracy not above (0.5, 1))",
        [
            ("cegppo_0_1", "entropy_final", ">", "cegppo_0_1", "entropy_start"),
            ("cegppo_0_1", "accuracy_after", "<=", "cegppo_0.5_1", "accuracy_after"),
        ],
    ),
    (
        "CE-GPPO (0.5, 1) ends with higher held-out accuracy than GRPO and DAPO (the paper's main table)",
        [
            ("cegppo_0.5_1", "accuracy_after", ">", "grpo", "accuracy_after"),
            ("cegppo_0.5_1", "accuracy_after", ">", "dapo", "accuracy_after"),
        ],
    ),
    (
        "Switching (0, 1) → (0.5, 1) stabilises entropy and helps accuracy (vs staying at (0, 1))",
        [
            ("switch", "entropy_abs_change_after_switch", "<", "cegppo_0_1", "entropy_abs_change_after_switch"),
            ("switch", "accuracy_after", ">", "cegppo_0_1", "accuracy_after"),
        ],
    ),
]

_RELATIONS = {"<": lambda a, b: a < b, ">": lambda a, b: a > b, "<=": lambda a, b: a <= b}


def check_claims(table: dict[str, dict[str, list[float]]]) -> list[dict]:
    """Each comparison of `CLAIMS` on the mean over seeds and seed by seed (paired: same seed, same data order).

    Returns:
        One dict per claim: `claim`, `held` (every comparison held on the mean), `comparisons` (each with `text`,
        `left`, `right` (mean values), their per-seed values and paired `differences`, `held` (on the mean),
        `seeds_held`, `seeds`). Claims whose arms were not run are skipped.
    """
    out = []
    for claim, comparisons in CLAIMS:
        if any(a not in table or b not in table for a, _, _, b, _ in comparisons):
            continue
        rows = []
        for a, ma, rel, b, mb in comparisons:
            left, right = table[a][ma], table[b][mb]
            test = _RELATIONS[rel]
            diffs = [x - y for x, y in zip(left, right, strict=True)]  # paired: same seed, same data order
            rows.append({
                "text": f"{a} {ma} {rel} {b} {mb}",
                "left": statistics.fmean(left), "right": statistics.fmean(right),
                "left_values": left, "right_values": right, "differences": diffs,
                "held": test(statistics.fmean(left), statistics.fmean(right)),
                "seeds_held": sum(test(x, y) for x, y in zip(left, right, strict=True)), "seeds": len(left),
            })  # fmt: skip
        out.append({"claim": claim, "held": all(r["held"] for r in rows), "comparisons": rows})
    return out


# ----------------------------------------------------------------------------------------------------------------
# Outputs
# ----------------------------------------------------------------------------------------------------------------
def _labels() -> dict[str, str]:
    return {name: label for name, (label, _) in arm_overrides().items()}


def write_markdown(runs: list[dict], meta: dict, path: Path) -> str:
    """The summary table (mean ± std over seeds), per-seed numbers, and the claims check; returns the text."""
    spg = meta["steps_per_generation"]
    table = summarize_runs(runs, spg)
    labels = _labels()
    seeds = meta["seeds"]
    lines = [
        (
            f"Entropy study: {meta['steps']} optimizer steps per run, {spg} per rollout batch, seeds {seeds}; "
            f"mean ± std over seeds. Entropy: mean token entropy of the training batch; start = first rollout batch "
            f"(steps 1-{spg}), final = last 10% of steps, mean = all steps. Held-out: greedy accuracy on "
            f"{meta['num_heldout']} prompts. Left / right: share of tokens with A<0, r<1-ε / A>0, r>1+ε; grad share: "
            f"their share of the gradient weight (0 when β = 0)."
        ),
        "",
        (
            "| arm | entropy start | entropy final | entropy mean | held-out before | held-out after | left | right "
            "| grad share |"
        ),
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, m in table.items():
        lines.append(
            f"| {labels[arm]} | {_spread(m['entropy_start'])} | {_spread(m['entropy_final'])} "
            f"| {_spread(m['entropy_mean'])} | {_spread([100 * x for x in m['accuracy_before']], '{:.1f}')}% "
            f"| {_spread([100 * x for x in m['accuracy_after']], '{:.1f}')}% | {_spread(m['left_frac'], '{:.4f}')} "
            f"| {_spread(m['right_frac'], '{:.4f}')} | {_spread(m['grad_share'], '{:.4f}')} |"
        )
    lines += ["", "Per seed (final entropy / held-out accuracy after):", ""]
    lines += ["| arm | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---|" + "---|" * len(seeds)]
    for arm, m in table.items():
        cells = [f"{e:.3f} / {a:.1%}" for e, a in zip(m["entropy_final"], m["accuracy_after"], strict=True)]
        lines.append(f"| {labels[arm]} | " + " | ".join(cells) + " |")
    finals = [x for m in table.values() for x in m["entropy_final"]]
    accuracies = [x for m in table.values() for x in m["accuracy_after"]]
    if len(finals) > 2 and len(set(finals)) > 1 and len(set(accuracies)) > 1:
        lines += [
            "",
            (
                f"Across all {len(finals)} runs, the correlation (Pearson) between final entropy and held-out accuracy "
                f"after training is {statistics.correlation(finals, accuracies):+.2f}."
            ),
        ]

    lines += [
        "",
        (
            "Claims, as paired comparisons (same seed = same data order in both arms). 'held': the direction holds on "
            "the mean over seeds and on every seed; 'mean only': on the mean but not on every seed; 'failed': not on "
            "the mean. Difference: left minus right, mean ± std over seeds."
        ),
        "",
        "| claim | comparison | mean values | difference | seeds where it held | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in check_claims(table):
        for i, r in enumerate(c["comparisons"]):
            if not r["held"]:
                verdict = "**failed**"
            else:
                verdict = "held" if r["seeds_held"] == r["seeds"] else "mean only"
            claim_cell = c["claim"] if i == 0 else ""
            lines.append(
                f"| {claim_cell} | {r['text']} | {r['left']:.3f} vs {r['right']:.3f} | {_spread(r['differences'])} "
                f"| {r['seeds_held']}/{r['seeds']} | {verdict} |"
            )
    if "switch" in table and "cegppo_0_1" in table:
        lines += ["", _switch_note(runs)]
    text = "\n".join(lines) + "\n"
    path.write_text(text)
    return text


def _switch_note(runs: list[dict]) -> str:
    """Before the switch both arms run (0, 1) with the same seed, so their curves should coincide up to it."""
    by = {(c["arm"], c["seed"]): c for c in runs}
    diffs = []
    for (arm, seed), c in by.items():
        if arm == "switch" and ("cegppo_0_1", seed) in by:
            n = math.ceil(SWITCH_AT * len(c["entropy"]))
            other = by[("cegppo_0_1", seed)]["entropy"]
            diffs.append(max((abs(x - y) for x, y in zip(c["entropy"][:n], other[:n])), default=0.0))
    worst = max(diffs, default=0.0)
    return (
        "Check: before the switch, the switch arm's entropy curve "
        + ("is identical to" if worst == 0 else f"differs by at most {worst:.2g} from")
        + " the (0, 1) arm's with the same seed (both train with (0, 1) on the same data up to the switch)."
    )


def _block_means(curves: list[dict], key: str, block: int):
    """Per-seed curves averaged over each rollout batch (`block` steps): the within-batch sawtooth (step 1 of a
    batch is on-policy, nothing clipped) averages out. Returns (x, [per-seed lists])."""
    n = min(len(c[key]) for c in curves) // block * block
    x = [(i + (block + 1) / 2) for i in range(0, n, block)]
    ys = [[statistics.fmean(c[key][i : i + block]) for i in range(0, n, block)] for c in curves]
    return x, ys


def _band(ax, x, ys, color, label, style="-"):
    import numpy as np

    y = np.array(ys, dtype=float)
    mean, std = y.mean(axis=0), (y.std(axis=0, ddof=1) if len(ys) > 1 else np.zeros(y.shape[1]))
    ax.plot(x, mean, style, color=color, linewidth=1.8, label=label)
    ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.12, linewidth=0)


# Colours: baselines grey/black, the β1 ladder a sequential map, (1, 0.5) red, the switch purple.
_STYLE = {
    "grpo": ("black", "-"), "dapo": ("tab:gray", "--"), "cegppo_0_1": ("#9ecae1", "-"),
    "cegppo_0.5_1": ("#4292c6", "-"), "cegppo_0.75_1": ("#2171b5", "-"), "cegppo_1_1": ("#08306b", "-"),
    "cegppo_1_0.5": ("tab:red", "-"), "switch": ("tab:purple", "-."),
}  # fmt: skip
_PANELS = (
    ("Methods", ("grpo", "dapo", "cegppo_0.5_1", "cegppo_0_1", "switch")),
    ("β ablation", ("cegppo_0_1", "cegppo_0.5_1", "cegppo_0.75_1", "cegppo_1_1", "cegppo_1_0.5")),
)


def write_plots(runs: list[dict], meta: dict, output_dir: Path) -> list[Path]:
    """entropy.png, accuracy.png, preserved_tokens.png: mean ± std over seeds per arm."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = _labels()
    # One point per `block` steps: whole rollout batches, so the within-batch sawtooth averages out, and about
    # 25 points per curve, so batch-to-batch sampling noise does not hide the trends.
    spg = meta["steps_per_generation"]
    block = spg * max(1, round(meta["steps"] / spg / 25))
    by_arm: dict[str, list[dict]] = {}
    for c in runs:
        by_arm.setdefault(c["arm"], []).append(c)
    switch_step = SWITCH_AT * meta["steps"]
    seeds = f"{len(meta['seeds'])} seeds, mean ± std"
    suffix = f"{seeds}; {block} steps per point"
    paths = []

    def panels(key_fn, ylabel, title, filename, suffix):
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=True)
        for ax, (panel, arms) in zip(axes, _PANELS):
            for arm in arms:
                if arm in by_arm:
                    x, ys = key_fn(by_arm[arm])
                    _band(ax, x, ys, _STYLE[arm][0], labels[arm], _STYLE[arm][1])
            if "switch" in arms and "switch" in by_arm:
                ax.axvline(switch_step, color="tab:purple", alpha=0.4, linewidth=1)
            ax.set(xlabel="optimizer step", title=panel)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:  # a panel can be empty when only some arms ran
                ax.legend(fontsize=8)
        axes[0].set_ylabel(ylabel)
        fig.suptitle(f"{title} ({suffix})")
        fig.tight_layout()
        path = output_dir / filename
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    panels(lambda cs: _block_means(cs, "entropy", block), "mean token entropy of the sampled tokens",
           "Policy entropy", "entropy.png", suffix)  # fmt: skip
    panels(lambda cs: (cs[0]["heldout"]["steps"], [c["heldout"]["values"] for c in cs]),
           "greedy held-out accuracy", "Held-out accuracy", "accuracy.png",
           f"{seeds}; greedy, {meta['num_heldout']} prompts")  # fmt: skip

    # Preserved tokens: left (A<0, r<1-ε) and right (A>0, r>1+ε) shares, and CE-GPPO's gradient share, every arm.
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    for ax, (key, title) in zip(axes, (
        ("left_frac", "left clip: A<0, r<1-ε (scaled by β1)"),
        ("right_frac", "right clip: A>0, r>1+ε (scaled by β2)"),
        ("grad_share", "their share of the gradient weight"),
    )):  # fmt: skip
        for arm in ARMS:
            if arm in by_arm and not (key == "grad_share" and arm in ("grpo", "dapo")):
                x, ys = _block_means(by_arm[arm], key, block)
                _band(ax, x, ys, _STYLE[arm][0], labels[arm], _STYLE[arm][1])
        ax.set(xlabel="optimizer step", title=title)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("share of completion tokens")
    axes[2].set_ylabel("share of |gradient weight|")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(f"Tokens outside the clip range ({suffix})")
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    path = output_dir / "preserved_tokens.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    paths.append(path)
    return paths


def _rounded(value, digits: int = 5):
    """Curves to 5 decimals (entropy's step-to-step noise is ~1e-2), so curves.json stays near 1 MB."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    return value


def write_outputs(runs: list[dict], meta: dict, output_dir: Path) -> str:
    """curves.json (meta + raw curves), the three PNGs and results.md, all from the same rounded curves (so
    `--replot` reproduces the table exactly); returns the markdown."""
    output_dir.mkdir(parents=True, exist_ok=True)
    runs = [_rounded(c) for c in runs]
    (output_dir / "curves.json").write_text(json.dumps({"meta": meta, "runs": runs}, separators=(",", ":")))
    write_plots(runs, meta, output_dir)
    return write_markdown(runs, meta, output_dir / "results.md")


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.entropy_study.addition",
        description="Test the CE-GPPO paper's entropy claims on the quickstart's tiny model and addition task: "
        "GRPO, DAPO clip-higher, CE-GPPO at (β1, β2) in {(0,1), (0.5,1), (0.75,1), (1,0.5), (1,1)} and the "
        "(0,1)->(0.5,1) switch at 58.5%, same data and budget for every arm, several seeds. Writes entropy.png, "
        "accuracy.png, preserved_tokens.png, results.md and curves.json.",
    )
    p.add_argument("--output-dir", "--output_dir", default="outputs/entropy_study", help="where the outputs go")
    p.add_argument("--quick", action="store_true", help=f"a ~2 minute run: {QUICK['steps']} steps, seeds "
                   f"{QUICK['seeds']}, every arm (its numbers mean nothing)")  # fmt: skip
    p.add_argument("--steps", type=int, default=None, help=f"optimizer steps per run (default {DEFAULTS['steps']})")
    p.add_argument("--seeds", default=None, help=f"comma-separated RL seeds (default {DEFAULTS['seeds']})")
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated subset of {','.join(ARMS)}")
    p.add_argument("--eval-every", "--eval_every", type=int, default=None,
                   help=f"steps between held-out evaluations (default {DEFAULTS['eval_every']})")  # fmt: skip
    p.add_argument("--workers", type=int, default=DEFAULTS["workers"],
                   help="parallel processes, one torch thread each (1: run in this process)")  # fmt: skip
    p.add_argument("--cache-dir", "--cache_dir", default=None, help="model cache (default ~/.cache/cegppo_trl)")
    p.add_argument("--small-model", "--small_model", action="store_true",
                   help="the quickstart --fast model (27k parameters, 2 s warm-up): for smoke tests")  # fmt: skip
    p.add_argument("--replot", action="store_true", help="rewrite plots and tables from <output-dir>/curves.json")
    return p


def main(argv: Sequence[str] | None = None, *, log=print) -> dict:
    """Run the study (see `--help`); returns `{"meta": ..., "runs": [...]}` as written to curves.json."""
    args = _parser().parse_args(argv)
    output_dir = Path(args.output_dir)
    if args.replot:
        data = json.loads((output_dir / "curves.json").read_text())
        write_outputs(data["runs"], data["meta"], output_dir)
        return data
    import torch

    previous_threads = torch.get_num_threads()
    try:
        return _run_study(args, argv, output_dir, log)
    finally:
        torch.set_num_threads(previous_threads)  # main() may be called in-process (tests, notebooks)


def _run_study(args: argparse.Namespace, argv: Sequence[str] | None, output_dir: Path, log) -> dict:
    started = time.time()
    preset = {**DEFAULTS, **(QUICK if args.quick else {})}
    steps = args.steps or preset["steps"]
    seeds = [int(s) for s in (args.seeds or preset["seeds"]).split(",")]
    eval_every = args.eval_every if args.eval_every is not None else preset["eval_every"]
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise SystemExit(f"Unknown arm(s) {unknown}; choose from {list(ARMS)}.")

    import torch

    from cegppo_trl.demos.runs import FAST_MODEL_WARMUP, TINY_MODEL_TRAINING, quiet_libraries
    from cegppo_trl.demos.warmup import WarmupSettings

    quiet_libraries()
    torch.set_num_threads(1)
    warmup = asdict(WarmupSettings(**(FAST_MODEL_WARMUP if args.small_model else {})))
    _, _, task, info = _model(warmup, args.cache_dir)  # built once here, so the workers only load it
    settings = {"steps": steps, "eval_every": eval_every, "warmup": warmup, "cache_dir": args.cache_dir}
    jobs = [(arm, seed) for seed in seeds for arm in arms]  # seed-major: partial results cover every arm early
    training = {**TINY_MODEL_TRAINING, **STUDY_TRAINING}
    log(
        f"Entropy study: {len(arms)} arms x {len(seeds)} seeds, {steps} steps each "
        f"({training['steps_per_generation']} per rollout batch), {args.workers} worker(s); model "
        f"{info['num_parameters']:,} parameters, warm-up {'cached' if info['cached'] else 'built'}"
    )
    runs = _run_all(jobs, settings, args.workers, log)
    meta = {
        "steps": steps,
        "seeds": seeds,
        "arms": arms,
        "eval_every": eval_every,
        "steps_per_generation": training["steps_per_generation"],
        "num_heldout": len(task.heldout),
        "training": training,
        "arm_overrides": {a: arm_overrides()[a][1] for a in arms},
        "warmup": {k: info[k] for k in ("steps", "dev_accuracy", "num_parameters")},
        "workers": args.workers,
        "command": "python -m examples.entropy_study.addition " + " ".join(argv if argv is not None else sys.argv[1:]),
    }
    meta["wall_seconds"] = time.time() - started  # runs only; plotting adds a few seconds
    text = write_outputs(runs, meta, output_dir)
    log("\n" + text)
    log(f"Wall time {meta['wall_seconds'] / 60:.1f} min; outputs in {output_dir}")
    return {"meta": meta, "runs": runs}


if __name__ == "__main__":
    main()
