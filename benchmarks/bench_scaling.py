"""Scaling benchmark: how the optimizer-step time grows with completion length and group size.

Same set-up as `bench_train_step.py` (tiny local Llama, `num_iterations=2`, `loss_type="dapo"`, `delta=10`,
generation forced to the full completion length), two prompts per step, so the batch is ``2 x group size``
completions. For each point CE-GPPO and GRPO are trained alternately (paired) and the median of the per-repetition
ratios is reported next to the median step times, plus the share of the CE-GPPO step spent in `_compute_loss`.

Run: ``python benchmarks/bench_scaling.py`` (or ``--quick``; ``--plot scaling.png`` also draws the step times).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics

import torch
from bench_train_step import quiet, timed_run

FULL_LENGTHS, FULL_GROUPS = (16, 32, 64, 128), (2, 4, 8, 16)
QUICK_LENGTHS, QUICK_GROUPS = (16, 64), (2, 8)
DEFAULT_LENGTH, DEFAULT_GROUP = 32, 4


def measure(completion_length: int, num_generations: int, reps: int, steps: int, output_dir: str) -> dict:
    runs = {"cegppo": [], "grpo": []}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            runs[name].append(
                timed_run(
                    name,
                    output_dir,
                    steps,
                    warmup=2,
                    completion_length=completion_length,
                    num_generations=num_generations,
                )
            )
    return {
        "length": completion_length,
        "group": num_generations,
        "cegppo_ms": 1e3 * statistics.median(r["step"] for r in runs["cegppo"]),
        "grpo_ms": 1e3 * statistics.median(r["step"] for r in runs["grpo"]),
        "ratio": statistics.median(c["step"] / g["step"] for c, g in zip(runs["cegppo"], runs["grpo"])),
        "loss_share": statistics.median(r["loss"] / r["step"] for r in runs["cegppo"]),
    }


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for ax, key, fixed, label in (
        (axes[0], "length", ("group", DEFAULT_GROUP), "completion length (tokens)"),
        (axes[1], "group", ("length", DEFAULT_LENGTH), "group size (generations per prompt)"),
    ):
        points = sorted((r for r in rows if r[fixed[0]] == fixed[1]), key=lambda r: r[key])
        xs = [r[key] for r in points]
        ax.plot(xs, [r["cegppo_ms"] for r in points], "o-", label="CE-GPPO")
        ax.plot(xs, [r["grpo_ms"] for r in points], "s--", label="GRPO (dapo)")
        ax.set_xscale("log", base=2)
        ax.set_xlabel(label)
        ax.set_ylabel("ms per optimizer step")
        ax.set_title(f"{fixed[0]} = {fixed[1]}")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"lengths {QUICK_LENGTHS}, groups {QUICK_GROUPS}")
    parser.add_argument("--reps", type=int, default=None, help="paired repetitions per point (default 5, quick 2)")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps per run (first 2 dropped)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--plot", default=None, help="write a PNG of the step times here")
    parser.add_argument("--output-dir", default="/tmp/cegppo_bench_scaling")
    args = parser.parse_args(argv)

    quiet()
    torch.set_num_threads(args.threads)
    lengths, groups = (QUICK_LENGTHS, QUICK_GROUPS) if args.quick else (FULL_LENGTHS, FULL_GROUPS)
    reps = args.reps or (2 if args.quick else 5)
    print(
        f"# bench_scaling: {datetime.date.today()} | {platform.machine()} | torch {torch.__version__} | "
        f"threads={torch.get_num_threads()} | reps={reps} x {args.steps} steps | tiny Llama hidden=64, 2 prompts per "
        "step, num_iterations=2, loss_type=dapo, delta=10; step time = mean over steps (generation included)"
    )
    print(
        "| completion length | group size | batch (completions) | CE-GPPO ms/step | GRPO ms/step | CE-GPPO / GRPO "
        "| `_compute_loss` share of CE-GPPO step |\n|---|---|---|---|---|---|---|"
    )
    points = [(length, DEFAULT_GROUP) for length in lengths]
    points += [(DEFAULT_LENGTH, group) for group in groups if (DEFAULT_LENGTH, group) not in points]
    rows = []
    for length, group in points:
        row = measure(length, group, reps, args.steps, args.output_dir)
        rows.append(row)
        print(
            f"| {length} | {group} | {2 * group} | {row['cegppo_ms']:.1f} | {row['grpo_ms']:.1f} | "
            f"{row['ratio']:.3f}x | {100 * row['loss_share']:.0f}% |",
            flush=True,
        )
    if args.plot:
        plot(rows, args.plot)
    return rows


if __name__ == "__main__":
    main()
