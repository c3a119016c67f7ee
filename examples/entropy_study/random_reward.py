"""The clipping rule alone against entropy: SmolLM2-135M-Instruct trained with a reward independent of the text.

With rewards drawn at random (Bernoulli(0.5), from a generator keyed on the run's seed, the generation step and the
sample's position in the rollout batch), the expected advantage of every completion is zero, so a systematic change
of entropy comes from how the loss treats the clipped tokens, not from what the model learns (arXiv 2509.26114).
Every arm with the same seed sees the same prompts, the same first rollout batch and the same reward stream.

Arms (β1, β2): `grpo` (0, 0: PPO-clip's gradient), `cegppo` (0.5, 1), `beta2_only` (0, 1), `beta1_only` (1, 0) and
`guarded` (0.5, 1 with the recipes' left guard `delta_low: 0.5`, `delta_low_mode: cutoff`). Off-policy as in the
paper: each rollout batch feeds `--steps-per-batch` optimizer steps (without them CE-GPPO is GRPO).

    python -m examples.entropy_study.random_reward --output-dir examples/entropy_study/results/random_reward           # the grid
    python -m examples.entropy_study.random_reward --output-dir examples/entropy_study/results/random_reward --report  # figure, summary

Each run writes `<output-dir>/runs/<arm>-seed<k>.json` after every optimizer step (`"complete": false` until it
ends); a finished run is skipped when the command is started again, an unfinished one is rerun from the start.
`--model tiny` trains the package's tiny character-level Llama instead (for the smoke test).
Results: examples/entropy_study/RESULTS.md, section "Random reward on a real model".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from .stats import paired_verdict

ARMS: dict[str, dict] = {
    "grpo": {"gppo_beta1": 0.0, "gppo_beta2": 0.0},
    "cegppo": {"gppo_beta1": 0.5, "gppo_beta2": 1.0},
    "beta2_only": {"gppo_beta1": 0.0, "gppo_beta2": 1.0},
    "beta1_only": {"gppo_beta1": 1.0, "gppo_beta2": 0.0},
    "guarded": {"gppo_beta1": 0.5, "gppo_beta2": 1.0, "delta_low": 0.5, "delta_low_mode": "cutoff"},
}
LABELS = {
    "grpo": "GRPO clip (0, 0)",
    "cegppo": "CE-GPPO (0.5, 1)",
    "beta2_only": "β2 only (0, 1)",
    "beta1_only": "β1 only (1, 0)",
    "guarded": "guarded (0.5, 1), δ_low 0.5",
}
# Logged metric -> series name, one value per optimizer step (the trainer's own logs).
SERIES = {
    "entropy": "entropy",
    "left_frac": "clip_ratio/low_mean",  # A<0, r<1-ε: gradient scaled by β1 (TRL's metric)
    "right_frac": "clip_ratio/high_mean",  # A>0, r>1+ε: gradient scaled by β2 (TRL's metric)
    "guard_frac": "cegppo/preserved/left_guard_frac",  # A<0, r<delta_low: no gradient (guarded arm only)
    "grad_share": "cegppo/preserved/grad_share",
    "left_log_ratio": "cegppo/preserved/left_log_ratio",
    "ratio_min": "cegppo/ratio/min",
    "ratio_mean": "cegppo/ratio/mean",
    "ratio_max": "cegppo/ratio/max",
    "reward": "reward",
    "reward_std": "reward_std",
    "completion_length": "completions/mean_length",
}


def random_reward(seed: int):
    """A TRL reward function returning Bernoulli(0.5) rewards that ignore the completions.

    The draw for a sample depends only on `seed`, the optimizer step at which its rollout batch was generated and its
    position in that batch, so every arm with the same seed gets the same reward stream.
    """

    def reward(completions: Sequence, trainer_state=None, **kwargs) -> list[float]:
        step = trainer_state.global_step if trainer_state is not None else 0
        return [float(random.Random(f"{seed}:{step}:{i}").random() < 0.5) for i in range(len(completions))]

    reward.__name__ = "random_reward"
    return reward


def _model(name: str):
    if name == "smollm2":
        from cegppo_trl.demos.smollm2 import load_smollm2

        model, tokenizer, path = load_smollm2()
        return model, tokenizer, str(path)
    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    return build_tiny_llama(tokenizer, seed=0), tokenizer, "tiny char-level Llama (cegppo_trl.demos.tiny)"


def run_path(output_dir: Path, arm: str, seed: int) -> Path:
    return output_dir / "runs" / f"{arm}-seed{seed}.json"


def is_done(path: Path, settings: dict) -> bool:
    """Whether `path` holds a finished run of these settings (the command line itself may differ).

    Raises:
        ValueError: `path` holds a run of other settings (mixing them would compare unlike runs).
    """
    if not path.exists():
        return False
    record = json.loads(path.read_text())
    theirs, ours = ({k: v for k, v in s.items() if k != "command"} for s in (record["settings"], settings))
    if theirs != ours:
        raise ValueError(f"{path} was trained with other settings ({theirs}); use another --output-dir.")
    return bool(record.get("complete"))


def train_run(arm: str, seed: int, output_dir: Path, settings: dict) -> dict:
    """Train one (arm, seed) and write its per-step series to `run_path` after every optimizer step."""
    import torch
    from transformers import TrainerCallback, set_seed

    from cegppo_trl.demos.tasks import chat_addition_task
    from cegppo_trl.research.trainer import ResearchCEGPPOConfig as CEGPPOConfig
    from cegppo_trl.research.trainer import ResearchCEGPPOTrainer as CEGPPOTrainer

    torch.set_num_threads(1)
    set_seed(seed)
    model, tokenizer, source = _model(settings["model"])
    task = chat_addition_task(num_digits=1, num_heldout=10, max_completion_length=settings["max_completion_length"])
    # An empty system message: without one SmolLM2's template adds its default system prompt, 16 of a prompt's 44
    # tokens, which every forward and backward pass would carry.
    system = [{"role": "system", "content": ""}]
    train = task.train.map(lambda row: {"prompt": system + row["prompt"]})
    k = settings["steps_per_batch"]
    rollout = settings["prompts"] * settings["generations"]
    if rollout % k:
        raise ValueError(f"prompts x generations ({rollout}) must be divisible by --steps-per-batch ({k}).")
    out = run_path(output_dir, arm, seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        args = CEGPPOConfig(
            log_predictor=True,  # the gradient share and the mean ratio
            output_dir=tmp,
            use_cpu=True,
            bf16=False,
            report_to="none",
            save_strategy="no",
            logging_steps=1,
            disable_tqdm=True,
            seed=seed,
            data_seed=seed,
            max_steps=settings["steps"],
            per_device_train_batch_size=rollout // k,
            gradient_accumulation_steps=1,
            steps_per_generation=k,
            num_generations=settings["generations"],
            max_completion_length=settings["max_completion_length"],
            temperature=1.0,
            learning_rate=settings["learning_rate"],
            lr_scheduler_type="constant",
            warmup_steps=0,
            weight_decay=0.0,
            max_grad_norm=1.0,
            beta=0.0,
            loss_type="dapo",
            epsilon=0.2,
            epsilon_high=0.2,
            **ARMS[arm],
        )
        record = {
            "arm": arm,
            "label": LABELS[arm],
            "seed": seed,
            **{k2: v for k2, v in ARMS[arm].items()},
            "settings": settings,
            "model": source,
            "task": task.name + " (empty system message), random Bernoulli(0.5) reward",
            "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), torch threads "
            f"{torch.get_num_threads()}",
            "date": time.strftime("%Y-%m-%d"),
            "complete": False,
            "steps": [],
        }
        start = time.time()

        class Recorder(TrainerCallback):
            def on_log(self, args, state, control, logs=None, **kwargs):
                logs = logs or {}
                if "loss" not in logs:
                    return
                entry = {"step": state.global_step, "seconds": round(time.time() - start, 2)}
                entry.update({name: logs[key] for name, key in SERIES.items() if key in logs})
                record["steps"].append(entry)
                record["wall_seconds"] = round(time.time() - start, 2)
                out.write_text(json.dumps(record, indent=1))

        trainer = CEGPPOTrainer(
            model=model,
            reward_funcs=random_reward(seed),
            args=args,
            train_dataset=train,
            processing_class=tokenizer,
            callbacks=[Recorder()],
        )
        trainer.train()
    record["complete"] = True
    record["wall_seconds"] = round(time.time() - start, 2)
    out.write_text(json.dumps(record, indent=1))
    return record


# ----------------------------------------------------------------------------------------------------------------
# Summary and figure
# ----------------------------------------------------------------------------------------------------------------
def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else float("nan")


def load_runs(output_dir: Path, complete_only: bool = True) -> list[dict]:
    runs = [json.loads(p.read_text()) for p in sorted((output_dir / "runs").glob("*.json"))]
    return [r for r in runs if r["complete"] or not complete_only]


def entropy_change(run: dict, steps: int | None = None) -> float:
    """Mean entropy over the last rollout batch's optimizer steps minus the mean over the first rollout batch's."""
    k = run["settings"]["steps_per_batch"]
    series = [s["entropy"] for s in run["steps"][:steps] if "entropy" in s]
    return _mean(series[-k:]) - _mean(series[:k])


def summarize(runs: list[dict]) -> dict:
    """Per arm: the final entropy change per seed, its mean and range, and the mean clip shares and ratio spread.

    Only seeds every arm present finished count, so the arms are compared over the same seeds.
    """
    present = {r["arm"] for r in runs}
    seeds = sorted(set.intersection(*({r["seed"] for r in runs if r["arm"] == a} for a in present))) if runs else []
    table = {"seeds": seeds, "arms": {}}
    for arm in ARMS:
        chosen = sorted((r for r in runs if r["arm"] == arm and r["seed"] in seeds), key=lambda r: r["seed"])
        if not chosen:
            continue
        changes = [entropy_change(r) for r in chosen]
        table["arms"][arm] = {
            "label": LABELS[arm],
            "entropy_change": changes,
            "entropy_change_mean": _mean(changes),
            "entropy_change_range": [min(changes), max(changes)],
            "entropy_start_mean": _mean(
                [_mean([s["entropy"] for s in r["steps"][: r["settings"]["steps_per_batch"]]]) for r in chosen]
            ),  # fmt: skip
            **{
                f"{name}_mean": _mean([_mean([s.get(name) for s in r["steps"]]) for r in chosen])
                for name in ("left_frac", "right_frac", "guard_frac", "grad_share", "ratio_min", "ratio_max")
            },
            "wall_seconds": [r["wall_seconds"] for r in chosen],
        }
        row = table["arms"][arm]
        for key in [k for k, v in row.items() if isinstance(v, float) and math.isnan(v)]:  # e.g. no guard: no share
            del row[key]
    # Paired per seed against GRPO (the same first batch, prompts and rewards): the claims' differences.
    if "grpo" in table["arms"]:
        base = table["arms"]["grpo"]["entropy_change"]
        for row in table["arms"].values():
            row["minus_grpo"] = [a - b for a, b in zip(row["entropy_change"], base, strict=True)]
    return table


CLAIMS = (  # (name, statement, left arm, relation, right arm or None for 0)
    ("a", "GRPO's symmetric clip lowers entropy", "grpo", "<", None),
    ("b", "β2 > 0 raises it against that: β2 only above GRPO", "beta2_only", ">", "grpo"),
    ("c", "β1 > 0 lowers it further: β1 only below GRPO", "beta1_only", "<", "grpo"),
    ("d1", "CE-GPPO (0.5, 1) above β1 only", "cegppo", ">", "beta1_only"),
    ("d2", "CE-GPPO (0.5, 1) below β2 only", "cegppo", "<", "beta2_only"),
)


def check_claims(table: dict) -> list[dict]:
    """The claims stated before the run, each as a paired per-seed comparison of entropy changes (`paired_verdict`:
    with 3 seeds the exact sign-flip p cannot go below 1/8, so "direction only" is the most 3 seeds can say)."""
    arms = table["arms"]
    rows = []
    for name, statement, left, relation, right in CLAIMS:
        if left not in arms or (right is not None and right not in arms):
            continue
        lhs = arms[left]["entropy_change"]
        rhs = arms[right]["entropy_change"] if right else [0.0] * len(lhs)
        rows.append({"claim": name, "statement": statement, **paired_verdict(lhs, rhs, relation)})
    return rows


def markdown(table: dict) -> str:
    """The docs' table of entropy changes per arm and the claims' verdicts, from `summary.json`."""
    lines = [
        "| arm (β1, β2) | entropy change, mean [min, max] over seeds | minus GRPO, per seed | clipped left / right "
        "(mean share) | ratio min / max (mean of steps) |",
        "|---|---|---|---|---|",
    ]
    for row in table["arms"].values():
        minus = ", ".join(f"{d:+.3f}" for d in row.get("minus_grpo", []))

        def g(key, row=row):  # a series no step logged has no mean
            return row.get(key, math.nan)

        lo, hi = row["entropy_change_range"]
        lines.append(
            f"| {row['label']} | {row['entropy_change_mean']:+.3f} [{lo:+.3f}, {hi:+.3f}] | {minus} | "
            f"{g('left_frac_mean'):.1%} / {g('right_frac_mean'):.1%} | {g('ratio_min_mean'):.2f} / "
            f"{g('ratio_max_mean'):.2f} |"
        )
    lines += [
        "",
        "| claim | mean difference | seeds on the claimed side | sign-flip p | verdict |",
        "|---|---|---|---|---|",
    ]
    for c in table.get("claims", []):
        lines.append(
            f"| ({c['claim']}) {c['statement']} | {c['mean_diff']:+.3f} | {c['seeds_held']}/{c['n']} | "
            f"{c['p']:.3f} | {c['verdict']} |"
        )
    if "total_compute_seconds" in table:
        lines += ["", f"{table['runs']} runs, training time {table['total_compute_seconds'] / 60:.1f} min in all "
                  "(per run: from the trainer's construction to the end of training; model loads not counted)."]  # fmt: skip
    return "\n".join(lines) + "\n"


def _blocks(values: list[float], size: int) -> list[float]:
    return [_mean(values[i : i + size]) for i in range(0, len(values), size)]


def plot(runs: list[dict], output_dir: Path) -> Path:
    """Entropy per step and per rollout batch (mean line, min-max band over seeds), each arm's entropy change with its
    seed range, and the clip shares and ratio spread per step."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    table = summarize(runs)
    k = runs[0]["settings"]["steps_per_batch"]
    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    panels = {
        (0, 0): ("entropy", "token entropy per optimizer step (nats)", 1),
        (0, 1): ("entropy", f"token entropy per rollout batch (mean of its {k} steps)", k),
        (1, 0): ("left_frac", "tokens clipped left (A<0, r<1-ε), share per step", 1),
        (1, 1): ("right_frac", "tokens clipped right (A>0, r>1+ε), share per step", 1),
        (1, 2): ("ratio_max", "largest ratio per step (dotted: smallest), log scale", 1),
    }
    for i, arm in enumerate(table["arms"]):
        chosen = [r for r in runs if r["arm"] == arm and r["seed"] in table["seeds"]]
        steps = min(len(r["steps"]) for r in chosen)
        color = f"C{i}"
        for (row, col), (key, _, block) in panels.items():
            ys = [[s.get(key, float("nan")) for s in r["steps"][:steps]] for r in chosen]
            if block > 1:
                ys = [_blocks(y, block) for y in ys]
            x = [block * (j + 1) for j in range(len(ys[0]))]
            cols = list(zip(*ys))
            ax = axes[row, col]
            ax.plot(x, [_mean(c) for c in cols], color=color, lw=1.5, marker="o" if block > 1 else None,
                    label=LABELS[arm])  # fmt: skip
            ax.fill_between(x, [min(c) for c in cols], [max(c) for c in cols], color=color, alpha=0.15)
            if key == "ratio_max":
                low = list(zip(*[[s.get("ratio_min", float("nan")) for s in r["steps"][:steps]] for r in chosen]))
                ax.plot(x, [_mean(c) for c in low], color=color, lw=1.2, ls=":")
        row = table["arms"][arm]
        lo, hi = row["entropy_change_range"]
        axes[0, 2].errorbar([i], [row["entropy_change_mean"]], yerr=[[row["entropy_change_mean"] - lo],
                            [hi - row["entropy_change_mean"]]], fmt="o", color=color, capsize=5)  # fmt: skip
        axes[0, 2].scatter([i] * len(row["entropy_change"]), row["entropy_change"], color=color, s=12, alpha=0.6)
    axes[0, 2].axhline(0, color="grey", lw=0.8)
    axes[0, 2].set_xticks(range(len(table["arms"])), [LABELS[a] for a in table["arms"]], rotation=20, fontsize=8)
    axes[0, 2].set_title("entropy change, last minus first rollout batch: mean, seed range, seeds", fontsize=10)
    for (row, col), (_, title, _) in panels.items():
        axes[row, col].set_title(title, fontsize=10)
        axes[row, col].set_xlabel("optimizer step")
        axes[row, col].grid(alpha=0.3)
    axes[0, 2].grid(alpha=0.3)
    axes[1, 2].set_yscale("log")
    axes[0, 0].legend(fontsize=8)
    any_run = runs[0]
    s = any_run["settings"]
    model = "SmolLM2-135M-Instruct" if s["model"] == "smollm2" else "tiny Llama"
    fig.suptitle(
        f"{model}, random Bernoulli(0.5) reward, seeds {table['seeds']}, {s['prompts']}x{s['generations']} "
        f"completions per rollout batch, {k} optimizer steps per batch, lr {s['learning_rate']}, "
        f"{any_run['date']}; bands: min-max over seeds",
        fontsize=9,
    )
    fig.tight_layout()
    path = output_dir / "entropy_by_arm.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def write_report(output_dir: Path) -> dict:
    """Write `summary.json`, `steps.csv` (every run's series) and the figure from the finished runs."""
    runs = load_runs(output_dir)
    table = summarize(runs)
    table["total_compute_seconds"] = round(sum(r["wall_seconds"] for r in runs), 1)
    table["runs"] = len(runs)
    table["claims"] = check_claims(table)
    (output_dir / "summary.json").write_text(json.dumps(table, indent=1))
    with open(output_dir / "steps.csv", "w") as f:
        f.write(",".join(["arm", "seed", "step", "seconds", *SERIES]) + "\n")
        for r in runs:
            for s in r["steps"]:
                f.write(",".join(str(v) for v in [r["arm"], r["seed"], s["step"], s["seconds"],
                                                   *(s.get(k, "") for k in SERIES)]) + "\n")  # fmt: skip
    if table["arms"]:
        table["figure"] = str(plot(runs, output_dir))
        (output_dir / "table.md").write_text(markdown(table))
    return table


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default="outputs/random_reward")
    p.add_argument("--model", choices=("smollm2", "tiny"), default="smollm2")
    p.add_argument("--arms", nargs="+", choices=sorted(ARMS), default=list(ARMS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--steps", type=int, default=24, help="optimizer steps per run")
    p.add_argument("--prompts", type=int, default=2, help="prompts per rollout batch")
    p.add_argument("--generations", type=int, default=8, help="samples per prompt")
    p.add_argument("--steps-per-batch", type=int, default=8, help="optimizer steps per rollout batch")
    p.add_argument("--max-completion-length", type=int, default=8)
    p.add_argument("--learning-rate", type=float, default=3e-5)
    p.add_argument("--report", action="store_true", help="only write the summary, CSV and figure")
    return p


def main(argv: Sequence[str] | None = None) -> dict:
    a = _parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    output_dir = Path(a.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    settings = {
        "model": a.model,
        "steps": a.steps,
        "prompts": a.prompts,
        "generations": a.generations,
        "steps_per_batch": a.steps_per_batch,
        "max_completion_length": a.max_completion_length,
        "learning_rate": a.learning_rate,
        "command": "python -m examples.entropy_study.random_reward " + " ".join(argv or sys.argv[1:]),
    }
    if not a.report:
        for seed in a.seeds:  # seed-major: a partial grid has whole seeds of every arm
            for arm in a.arms:
                if is_done(run_path(output_dir, arm, seed), settings):
                    continue
                record = train_run(arm, seed, output_dir, settings)
                print(f"{arm} seed {seed}: {record['wall_seconds']:.0f} s, entropy change "
                      f"{entropy_change(record):+.4f}", flush=True)  # fmt: skip
    return write_report(output_dir)


if __name__ == "__main__":
    main()
