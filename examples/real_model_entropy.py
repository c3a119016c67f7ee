"""A first real-model look at entropy: GRPO vs CE-GPPO (0.5, 1) on SmolLM2-135M-Instruct, same seed and data.

Both arms: chat additions of two 1-digit numbers (`cegppo_trl.demos.tasks.chat_addition_task`, last-integer
exact-match reward), `--batch` prompts x 8 samples per rollout batch, 8 optimizer steps of `--batch` completions
(off-policy, as in the paper), <= 16 new tokens, T = 1, constant learning rate. GRPO is the same trainer with
β1 = β2 = 0 (PPO-clip's gradient). Each arm writes `<output>/<arm>.json` after every step (so a run stopped by
`--minutes` or by hand keeps its curve); `--plot` draws both arms' curves.

    python examples/real_model_entropy.py --arm grpo --minutes 60 --output-dir examples/entropy_study/results/real_model &
    python examples/real_model_entropy.py --arm cegppo --minutes 60 --output-dir examples/entropy_study/results/real_model &
    python examples/real_model_entropy.py --plot --output-dir examples/entropy_study/results/real_model

Results: examples/entropy_study/RESULTS.md, section "A first look on a real model".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

ARMS = {"grpo": (0.0, 0.0), "cegppo": (0.5, 1.0)}
KEYS = (
    "entropy",
    "reward",
    "clip_ratio/low_mean",
    "clip_ratio/high_mean",
    "clip_ratio/region_mean",
    "cegppo/preserved/left_frac",
    "cegppo/preserved/right_frac",
    "cegppo/preserved/grad_share",
    "cegppo/ratio/max",
    "completions/mean_length",
    "heldout/accuracy",
)


def train_arm(
    arm: str, output_dir: Path, *, minutes: float, max_steps: int, seed: int, lr: float, eval_every: int, batch: int
):
    import torch
    from transformers import TrainerCallback, set_seed

    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
    from cegppo_trl.demos.runs import HeldoutAccuracyCallback
    from cegppo_trl.demos.smollm2 import load_smollm2
    from cegppo_trl.demos.tasks import chat_addition_task, evaluate_accuracy

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    set_seed(seed)
    model, tokenizer, path = load_smollm2()
    task = chat_addition_task(num_digits=1, num_heldout=40, max_completion_length=16, seed=0)
    beta1, beta2 = ARMS[arm]
    args = CEGPPOConfig(
        output_dir=str(output_dir / f"trainer-{arm}"),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=seed,
        data_seed=seed,
        max_steps=max_steps,
        per_device_train_batch_size=batch,
        steps_per_generation=8,
        num_generations=8,
        max_completion_length=task.max_completion_length,
        temperature=1.0,
        learning_rate=lr,
        lr_scheduler_type="constant",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        loss_type="dapo",
        epsilon=0.2,
        epsilon_high=0.2,
        gppo_beta1=beta1,
        gppo_beta2=beta2,
    )
    record = {
        "arm": arm,
        "beta1": beta1,
        "beta2": beta2,
        "seed": seed,
        "learning_rate": lr,
        "completions_per_step": batch,
        "completions_per_rollout_batch": 8 * batch,
        "model": "SmolLM2-135M-Instruct",
        "checkpoint": path,
        "task": task.name,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared), torch threads "
        f"{torch.get_num_threads()}",
        "date": time.strftime("%Y-%m-%d"),
        "steps": [],
    }
    out = output_dir / f"{arm}.json"
    start = time.time()

    class Recorder(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "loss" not in logs:
                return
            entry = {"step": state.global_step, "seconds": round(time.time() - start, 1)}
            entry.update({k: logs[k] for k in KEYS if k in logs})
            for h in reversed(state.log_history):  # the held-out accuracy the callback appended for this step
                if "heldout/accuracy" in h and h.get("step") == state.global_step:
                    entry["heldout/accuracy"] = h["heldout/accuracy"]
                    break
            record["steps"].append(entry)
            record["wall_seconds"] = round(time.time() - start, 1)
            out.write_text(json.dumps(record, indent=1))
            # Stop at a rollout-batch boundary once the time is up.
            if minutes and time.time() - start > minutes * 60 and state.global_step % args.steps_per_generation == 0:
                control.should_training_stop = True

    trainer = CEGPPOTrainer(
        model=model, reward_funcs=task.reward_fn, args=args, train_dataset=task.train, processing_class=tokenizer
    )
    trainer.add_callback(HeldoutAccuracyCallback(task, tokenizer, eval_every, batch_size=40))
    trainer.add_callback(Recorder())
    record["heldout_before"] = evaluate_accuracy(model, tokenizer, task, batch_size=40)
    trainer.train()
    record["heldout_after"] = evaluate_accuracy(trainer.model, tokenizer, task, batch_size=40)
    record["wall_seconds"] = round(time.time() - start, 1)
    out.write_text(json.dumps(record, indent=1))


def _smooth(values, window):
    out = []
    for i in range(len(values)):
        chunk = values[max(0, i - window + 1) : i + 1]
        out.append(sum(chunk) / len(chunk))
    return out


def plot(output_dir: Path, window: int = 8) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    runs = {
        arm: json.loads((output_dir / f"{arm}.json").read_text())
        for arm in ARMS
        if (output_dir / f"{arm}.json").exists()
    }
    common = min(len(r["steps"]) for r in runs.values())  # compare the arms over the same steps
    panels = [
        ("entropy", "token entropy (nats)"),
        ("reward", "mean reward (per rollout batch)"),
        ("clip_ratio/low_mean", "share clipped left (A<0, r<1-ε)"),
        ("completions/mean_length", "mean completion length (tokens, per rollout batch)"),
        ("clip_ratio/high_mean", "share clipped right (A>0, r>1+ε)"),
        ("cegppo/preserved/grad_share", "gradient-weight share of clipped tokens (0 for GRPO)"),
    ]
    panels = [panels[i] for i in (0, 1, 3, 2, 4, 5)]  # top row: entropy, reward, length; bottom: clipping
    fig, axes = plt.subplots(2, 3, figsize=(15, 7))
    for ax, (key, label) in zip(axes.flat, panels):
        for arm, run in runs.items():
            pts = [(s["step"], s[key]) for s in run["steps"][:common] if key in s]
            if not pts:
                continue
            xs, ys = zip(*pts)
            name = f"{arm.upper() if arm == 'grpo' else 'CE-GPPO'} (β1={run['beta1']}, β2={run['beta2']})"
            ax.plot(xs, ys, alpha=0.25)
            per_batch = key in ("reward", "completions/mean_length")  # logged once per rollout batch
            ax.plot(xs, _smooth(list(ys), 1 if per_batch else window), label=name, color=ax.lines[-1].get_color())
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=8)
    any_run = next(iter(runs.values()))
    fig.suptitle(
        f"SmolLM2-135M-Instruct, {any_run['task']}, seed {any_run['seed']}, lr {any_run['learning_rate']}, "
        f"8 steps per rollout batch; {common} steps; {any_run['date']}; lines: {window}-step mean",
        fontsize=9,
    )
    fig.tight_layout()
    path = output_dir / "entropy_reward_clip.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def summarize(output_dir: Path) -> dict:
    runs = {
        arm: json.loads((output_dir / f"{arm}.json").read_text())
        for arm in ARMS
        if (output_dir / f"{arm}.json").exists()
    }
    common = min(len(r["steps"]) for r in runs.values())
    table = {}
    for arm, run in runs.items():
        steps = run["steps"][:common]

        def mean(key, part):
            vals = [s[key] for s in part if key in s]
            return sum(vals) / len(vals) if vals else float("nan")

        k = max(1, min(40, common // 4))
        table[arm] = {
            "steps": common,
            "seconds_per_step": run["steps"][common - 1]["seconds"] / common,
            "entropy_first": mean("entropy", steps[:k]),
            "entropy_last": mean("entropy", steps[-k:]),
            "reward_first": mean("reward", steps[:k]),
            "reward_last": mean("reward", steps[-k:]),
            "clip_low_mean": mean("clip_ratio/low_mean", steps),
            "clip_high_mean": mean("clip_ratio/high_mean", steps),
            "left_frac_mean": mean("cegppo/preserved/left_frac", steps),
            "right_frac_mean": mean("cegppo/preserved/right_frac", steps),
            "grad_share_mean": mean("cegppo/preserved/grad_share", steps),
            "heldout": [(s["step"], s["heldout/accuracy"]) for s in steps if "heldout/accuracy" in s],
            "heldout_before": run.get("heldout_before"),
            "heldout_after": run.get("heldout_after"),
            "window": k,
        }
    (output_dir / "summary.json").write_text(json.dumps(table, indent=1))
    return table


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=sorted(ARMS), help="train one arm")
    p.add_argument("--plot", action="store_true", help="plot and summarise the arms found in --output-dir")
    p.add_argument("--output-dir", "--output_dir", default="outputs/real_model_entropy")
    p.add_argument("--minutes", type=float, default=60.0, help="stop at the first rollout-batch boundary after this")
    p.add_argument("--max-steps", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--learning-rate", type=float, default=1e-5)
    p.add_argument("--batch", type=int, default=8, help="completions per optimizer step (x8 per rollout batch)")
    p.add_argument("--eval-every", type=int, default=0, help="steps between greedy held-out evaluations (0: none)")
    a = p.parse_args()
    output_dir = Path(a.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if a.arm:
        train_arm(a.arm, output_dir, minutes=a.minutes, max_steps=a.max_steps, seed=a.seed, lr=a.learning_rate,
                  eval_every=a.eval_every, batch=a.batch)  # fmt: skip
    if a.plot:
        print(plot(output_dir))
        print(json.dumps(summarize(output_dir), indent=1))


if __name__ == "__main__":
    main()
