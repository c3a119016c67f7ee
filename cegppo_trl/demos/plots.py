"""PNG plots of a quickstart run from its log history (matplotlib, headless `Agg` backend)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

# The extras that bring matplotlib (`quickstart` also brings the progress bar).
PLOT_INSTALL_HINT = 'pip install "cegppo-trl[plot]" or "cegppo-trl[quickstart]"'
PLOT_FILES = ("reward_accuracy.png", "entropy.png", "betas.png", "preserved_tokens.png")


def _points(history: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    steps, values = [], []
    for entry in history:
        value = entry.get(key)
        if value is not None and "step" in entry and isinstance(value, (int, float)) and math.isfinite(value):
            steps.append(int(entry["step"]))
            values.append(float(value))
    return steps, values


def _smooth(steps: list[int], values: list[float], window: int) -> list[float]:
    """Mean of the values logged in the trailing `window` optimizer steps (rewards are logged once per rollout
    batch, other metrics every step, so the window is counted in steps, not in points)."""
    out, start, total = [], 0, 0.0
    for i, (step, value) in enumerate(zip(steps, values)):
        total += value
        while steps[start] <= step - window:
            total -= values[start]
            start += 1
        out.append(total / (i - start + 1))
    return out


def plot_run(history: Sequence[dict], output_dir: str | Path, *, title: str = "", smooth: int = 20) -> list[Path]:
    """Write the four `PLOT_FILES` of a `RunResult.history` to `output_dir` and return their paths: reward (raw and
    moving average) with greedy held-out accuracy; policy entropy; β1 and β2 per step; the shares of tokens clipped
    left and right (TRL's `clip_ratio/low_mean`, `high_mean`), whose gradient CE-GPPO keeps, with their share of the
    gradient weight where the run logs `cegppo/preserved/grad_share`.

    Args:
        title: prefix of every plot title.
        smooth: moving-average window in steps (a multiple of the optimizer steps per rollout batch, so the
            within-batch cycle of the clip fractions, zero on each batch's on-policy first step, averages out).

    Raises:
        ImportError: matplotlib is not installed (`PLOT_INSTALL_HINT` says which extra brings it).
    """
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{title}\n" if title else ""
    paths = []

    def save(fig, name: str) -> None:
        fig.tight_layout()
        path = output_dir / name
        fig.savefig(path, dpi=110)
        plt.close(fig)
        paths.append(path)

    def raw_and_smoothed(ax, key: str, label: str, color: str) -> None:
        steps, values = _points(history, key)
        if not steps:
            return
        ax.plot(steps, values, color=color, alpha=0.15, linewidth=0.8)
        ax.plot(steps, _smooth(steps, values, smooth), color=color, linewidth=2, label=f"{label} ({smooth}-step mean)")

    # Reward and held-out accuracy
    fig, ax = plt.subplots(figsize=(7, 4))
    raw_and_smoothed(ax, "reward", "training reward, sampled at T=1", "tab:blue")
    steps, accuracy = _points(history, "heldout/accuracy")
    if steps:
        ax.plot(steps, accuracy, "o-", color="tab:red", linewidth=2, markersize=4, label="held-out accuracy (greedy)")
        ax.annotate(f"{accuracy[0]:.1%}", (steps[0], accuracy[0]), textcoords="offset points", xytext=(4, 6))
        ax.annotate(f"{accuracy[-1]:.1%}", (steps[-1], accuracy[-1]), textcoords="offset points", xytext=(-20, 8))
    ax.set(xlabel="optimizer step", ylabel="reward / accuracy", title=f"{prefix}reward and held-out accuracy")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    save(fig, PLOT_FILES[0])

    # Entropy
    fig, ax = plt.subplots(figsize=(7, 4))
    raw_and_smoothed(ax, "entropy", "policy entropy", "tab:purple")
    ax.set(xlabel="optimizer step", ylabel="entropy (nats / token)", title=f"{prefix}policy entropy")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    save(fig, PLOT_FILES[1])

    # beta1 / beta2
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label, color, style in (
        ("cegppo/beta1", "β1 (left clip, A<0: exploitation)", "tab:orange", "-"),
        ("cegppo/beta2", "β2 (right clip, A>0: exploration)", "tab:green", "--"),
    ):
        steps, values = _points(history, key)
        if steps:
            ax.plot(steps, values, style, color=color, linewidth=2, label=label)
    ax.set(xlabel="optimizer step", ylabel="β", title=f"{prefix}CE-GPPO coefficients β1, β2")
    ax.set_ylim(
        -0.05, max([1.1] + [v * 1.1 for k in ("cegppo/beta1", "cegppo/beta2") for v in _points(history, k)[1]])
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    save(fig, PLOT_FILES[2])

    # Preserved-gradient tokens
    fig, ax = plt.subplots(figsize=(7, 4))
    raw_and_smoothed(ax, "clip_ratio/low_mean", "left: r < 1-ε, A<0 (scaled by β1)", "tab:orange")
    raw_and_smoothed(ax, "clip_ratio/high_mean", "right: r > 1+ε, A>0 (scaled by β2)", "tab:green")
    steps, share = _points(history, "cegppo/preserved/grad_share")
    if steps:
        label = "their share of the gradient weight"
        ax.plot(steps, _smooth(steps, share, smooth), ":", color="black", linewidth=1.5, label=label)
    heading = f"{prefix}tokens outside the clip range (CE-GPPO keeps their gradient x β)"
    ax.set(xlabel="optimizer step", ylabel="share of tokens / of gradient", title=heading)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8, framealpha=0.9)
    save(fig, PLOT_FILES[3])
    return paths
