"""Draws the beta schedules and the entropy controller into ``docs/images/schedules/`` (used by ``schedules.md`` and
``entropy-controller.md``).

Run from anywhere: ``python docs/plot_schedules.py``. One PNG per ramp kind (linear, piecewise) over 1000 steps, plus
``controller.png``: the controller on a synthetic entropy model (not a training run; see ``_entropy_drift``), with
and without its damping term; ``main`` also prints the share of steps each keeps inside the band.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on CI machines
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cegppo_trl.research.controller import EntropyController, parse_controller  # noqa: E402
from cegppo_trl.schedules import parse_schedule  # noqa: E402

TOTAL = 1000
OUT = Path(__file__).resolve().parent / "images" / "schedules"

# kind -> (title, specs drawn on the same axes)
EXAMPLES = {
    "linear": ("linear ramps", ["linear:0->0.5", "linear:0->0.5@100-600", "linear:1->0.25@60%-90%"]),
    "piecewise": (
        "piecewise: the CE-GPPO paper's beta1 switch",
        ["piecewise:0@0,0.5@585", "piecewise:1@0,0.75@30%,0.5@70%"],
    ),
}


def plot_schedules() -> list[Path]:
    steps = np.arange(TOTAL)
    paths = []
    for kind, (title, specs) in EXAMPLES.items():
        fig, ax = plt.subplots(figsize=(6.4, 3.0), dpi=100)
        for spec in specs:
            schedule = parse_schedule(spec)
            ax.plot(steps, [schedule(int(s), TOTAL) for s in steps], lw=2, label=f"'{spec}'")
        ax.set(title=title, xlabel=f"optimizer step (total_steps = {TOTAL})", ylabel="beta", xlim=(0, TOTAL))
        ax.set_ylim(bottom=min(0.0, ax.get_ylim()[0]))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        paths.append(OUT / f"{kind}.png")
        fig.savefig(paths[-1])
        plt.close(fig)
    return paths


def _entropy_drift(beta1: float, beta2: float, step: int) -> float:
    """Per-step entropy change of a toy plant: beta2 pushes entropy up, beta1 down (CE-GPPO paper, Sec. 3), and an
    intrinsic downward drift that grows during training (RL on LLMs tends to collapse entropy)."""
    return 0.003 * (beta2 - 1.6 * beta1 - 0.6) - 0.0015 * step / TOTAL


def simulate(controller: EntropyController | None, seed: int = 0):
    """Runs the toy plant under the paper's switch; returns entropy, nominal and applied betas per step."""
    rng = np.random.default_rng(seed)
    beta1_schedule, beta2_schedule = parse_schedule("piecewise:0@0,0.5@585"), parse_schedule("1")
    every = controller.config.update_every if controller else 1
    h, window = 0.65, []
    trace = {"entropy": [], "nominal1": [], "nominal2": [], "beta1": [], "beta2": []}
    for step in range(TOTAL):
        n1, n2 = beta1_schedule(step, TOTAL), beta2_schedule(step, TOTAL)
        b1, b2 = controller.apply(n1, n2) if controller else (n1, n2)
        h = max(0.0, h + _entropy_drift(b1, b2, step))
        measured = max(0.0, h + rng.normal(0, 0.02))  # a batch's mean token entropy is noisy
        window.append(measured)
        if controller and (step + 1) % every == 0:
            controller.update(float(np.mean(window)))
        if (step + 1) % every == 0:
            window = []
        for key, value in zip(trace, (measured, n1, n2, b1, b2)):
            trace[key].append(value)
    return trace


# The symmetric rule (raise_beta1): this toy plant has no task to lose, so it shows the control loop itself. The
# default (beta1 never above its schedule) is printed beside it.
CONTROLLER_SPEC = {"target_low": 0.55, "target_high": 0.75, "update_every": 10, "raise_beta1": True}


def in_band_share(damping: float, seeds=range(4), raise_beta1: bool = True) -> float:
    """Share of steps whose 20-step mean entropy is inside the band, over a few noise seeds."""
    config = replace(parse_controller(CONTROLLER_SPEC), damping=damping, raise_beta1=raise_beta1)
    shares = []
    for seed in seeds:
        trace = simulate(EntropyController(config, 0.0, 1.0), seed)
        entropy = np.convolve(trace["entropy"], np.ones(20) / 20, "valid")
        shares.append(np.mean((entropy >= config.target_low) & (entropy <= config.target_high)))
    return float(np.mean(shares))


def plot_controller() -> Path:
    config = parse_controller(CONTROLLER_SPEC)  # damping=1 (the default)
    open_loop = simulate(None)
    push_only = simulate(EntropyController(replace(config, damping=0.0), beta1=0.0, beta2=1.0))
    closed = simulate(EntropyController(config, beta1=0.0, beta2=1.0))

    steps = np.arange(TOTAL)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 5.6), dpi=100, sharex=True)
    top.axhspan(config.target_low, config.target_high, color="tab:green", alpha=0.15, label="target band")
    top.plot(steps, open_loop["entropy"], color="0.6", lw=1, label="schedule only")
    top.plot(steps, push_only["entropy"], color="tab:orange", lw=1, label="+ controller, damping=0")
    top.plot(steps, closed["entropy"], color="tab:blue", lw=1, label="+ controller, damping=1 (default)")
    top.set(ylabel="mean token entropy", title="entropy controller on a toy entropy model")
    top.legend(fontsize=7, loc="lower left")
    top.grid(alpha=0.3)
    bottom.plot(steps, closed["nominal1"], "--", color="tab:red", lw=1, label="beta1 nominal (paper switch)")
    bottom.plot(steps, closed["beta1"], color="tab:red", lw=2, label="beta1 applied")
    bottom.plot(steps, closed["nominal2"], "--", color="tab:purple", lw=1, label="beta2 nominal")
    bottom.plot(steps, closed["beta2"], color="tab:purple", lw=2, label="beta2 applied")
    bottom.set(xlabel="optimizer step", ylabel="beta", xlim=(0, TOTAL))
    bottom.set_title(f"betas with damping=1: '{CONTROLLER_SPEC}'", fontsize=8)
    bottom.legend(fontsize=7, loc="upper left", ncol=2)
    bottom.grid(alpha=0.3)
    fig.tight_layout()
    path = OUT / "controller.png"
    fig.savefig(path)
    plt.close(fig)
    return path


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for path in [*plot_schedules(), plot_controller()]:
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    for raise_beta1 in (True, False):
        for damping in (0.0, 1.0):
            share = in_band_share(damping, raise_beta1=raise_beta1)
            print(f"toy model, raise_beta1={raise_beta1}, damping={damping:g}: {share:.2f} of steps inside the band")


if __name__ == "__main__":
    main()
