"""The run harness of the quickstart and the studies: one RL run with held-out accuracy, its summary table.

`run_training` trains a model on a `Task` with `CEGPPOTrainer` and returns its history (greedy held-out accuracy
before, during and after, TRL's log history in between); `summarize` and `format_summary` give its headline numbers.
`TINY_MODEL_TRAINING` is the training configuration `run_training` starts from (the built-in tiny model on CPU).
"""

from __future__ import annotations

import logging
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import TrainerCallback, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..config import CEGPPOConfig
from ..research.baselines import method_config
from ..trainer import CEGPPOTrainer
from .tasks import Task, evaluate_accuracy

HELDOUT_KEY = "heldout/accuracy"

# Training settings of the default run (tiny model, CPU). Off-policy by construction: each rollout batch (64 prompts
# x 8 samples) feeds 4 optimizer steps of 128 completions, so the ratio leaves 1 and clipping happens. Adam's first
# steps move every weight by about lr whatever the gradient's size, so a short lr warm-up keeps the noisy first RL
# gradients from knocking the warmed-up policy over; at 6e-4 this tiny model collapses, at 1.5e-4 it climbs steadily.
TINY_MODEL_TRAINING: dict = {
    "per_device_train_batch_size": 128,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 4,
    "num_generations": 8,
    "temperature": 1.0,
    "learning_rate": 1.5e-4,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_steps": 20,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "beta": 0.0,
}

# `WarmupSettings` fields of a smaller built-in model (`--fast`, the studies' `--small_model`): 27k parameters and
# about 2 s of warm-up; exercises every stage, solves few prompts (tests).
FAST_MODEL_WARMUP = {
    "hidden_size": 32, "intermediate_size": 64, "learning_rate": 3e-3, "target_accuracy": 0.05, "max_steps": 150,
    "eval_every": 25, "dev_problems": 64,
}  # fmt: skip


class HeldoutAccuracyCallback(TrainerCallback):
    """Greedy held-out accuracy every `every` optimizer steps, `{"step": s, "heldout/accuracy": a}` appended to
    `state.log_history` just before step `s`'s training log entry."""

    def __init__(self, task: Task, tokenizer, every: int, batch_size: int = 256):
        self.task, self.tokenizer, self.every, self.batch_size = task, tokenizer, every, batch_size

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every > 0 and state.global_step % self.every == 0 and state.global_step < state.max_steps:
            accuracy = evaluate_accuracy(model, self.tokenizer, self.task, batch_size=self.batch_size)
            state.log_history.append({"step": state.global_step, HELDOUT_KEY: accuracy})


class _ProgressBar(TrainerCallback):
    """One tqdm bar with the latest reward, entropy and held-out accuracy (replaces transformers' log dumps)."""

    def __init__(self):
        self.bar = None
        self.postfix: dict[str, str] = {}

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        self.bar = tqdm(total=state.max_steps, desc="RL", unit="step", dynamic_ncols=True)

    def on_step_end(self, args, state, control, **kwargs):
        last = state.log_history[-1] if state.log_history else {}
        if HELDOUT_KEY in last:
            self.postfix["acc"] = f"{last[HELDOUT_KEY]:.0%}"
        self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        for key, short in (("reward", "reward"), ("entropy", "entropy"), ("cegppo/preserved/grad_share", "kept")):
            if key in logs:
                self.postfix[short] = f"{logs[key]:.3f}"
        self.bar.set_postfix(self.postfix, refresh=False)  # tqdm redraws at most every 0.1 s

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()


@dataclass
class RunResult:
    """What `run_training` returns: TRL's `log_history` with `{"step", "heldout/accuracy"}` entries at step 0, every
    `eval_every` steps and at the end; the greedy held-out accuracy before and after; the wall time of `train()`
    (evaluations included); the `CEGPPOConfig` fields it set; the trained policy (trained in place)."""

    history: list[dict]
    accuracy_before: float
    accuracy_after: float
    train_seconds: float
    config: dict = field(default_factory=dict)
    model: torch.nn.Module | None = None


RESEARCH_FIELDS = {"entropy_controller", "gppo_beta_rule", "log_predictor"}


def run_training(
    config_overrides: dict,
    *,
    model,
    tokenizer,
    task: Task,
    output_dir: str | os.PathLike,
    max_steps: int,
    seed: int = 0,
    eval_every: int = 0,
    eval_batch_size: int = 256,
    progress: bool = True,
) -> RunResult:
    """Train `model` (in place) on `task` with `CEGPPOTrainer`, with greedy held-out accuracy before, every
    `eval_every` steps (0: never) and after. On CPU unless CUDA is available; nothing is saved in `output_dir`.

    The configuration is `TINY_MODEL_TRAINING` with CE-GPPO's paper defaults (`method_config("cegppo")`), then
    `config_overrides` (any `CEGPPOConfig` field but the arguments here): `{**method_config("grpo"),
    "learning_rate": 1e-3}` runs the GRPO baseline at another learning rate. A research field (`entropy_controller`,
    `gppo_beta_rule`, `log_predictor`) selects `ResearchCEGPPOTrainer`.
    """
    set_seed(seed)
    on_gpu = torch.cuda.is_available()
    settings = {
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": not on_gpu,
        "bf16": on_gpu and torch.cuda.is_bf16_supported(),
        "disable_tqdm": True,  # replaced by the compact bar below
        **TINY_MODEL_TRAINING,
        **method_config("cegppo"),
        "max_completion_length": task.max_completion_length,
        **config_overrides,
    }
    config_cls, trainer_cls = CEGPPOConfig, CEGPPOTrainer
    if RESEARCH_FIELDS & set(settings):  # the entropy studies' options: `cegppo_trl.research`'s trainer
        from ..research.trainer import ResearchCEGPPOConfig as config_cls
        from ..research.trainer import ResearchCEGPPOTrainer as trainer_cls
    args = config_cls(output_dir=str(output_dir), max_steps=max_steps, seed=seed, data_seed=seed, **settings)
    trainer = trainer_cls(model=model, reward_funcs=task.reward_fn, args=args, train_dataset=task.train,
                          processing_class=tokenizer)  # fmt: skip
    trainer.add_callback(HeldoutAccuracyCallback(task, tokenizer, eval_every, eval_batch_size))
    trainer.remove_callback(PrinterCallback)  # it prints every step's full metric dict
    trainer.remove_callback(ProgressCallback)
    if progress:
        trainer.add_callback(_ProgressBar())

    policy = trainer.model
    accuracy_before = evaluate_accuracy(policy, tokenizer, task, batch_size=eval_batch_size)
    start = time.perf_counter()
    trainer.train()
    accuracy_after = evaluate_accuracy(trainer.model, tokenizer, task, batch_size=eval_batch_size)
    train_seconds = time.perf_counter() - start

    history = [{"step": 0, HELDOUT_KEY: accuracy_before}, *trainer.state.log_history]
    history.append({"step": trainer.state.global_step, HELDOUT_KEY: accuracy_after})
    return RunResult(history, accuracy_before, accuracy_after, train_seconds, settings, trainer.model)


def _series(history: Sequence[dict], key: str) -> list[float]:
    return [float(h[key]) for h in history if key in h and h[key] is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(result: RunResult, *, window: int = 10) -> dict:
    """Headline numbers of a run, a flat dict of floats (NaN where a metric was not logged): accuracy before/after,
    reward and entropy over the first and last `window` logged values (at most half of them each; rewards are logged
    once per rollout batch, entropy every step), the clip shares."""
    steps = [h for h in result.history if "loss" in h]  # one entry per optimizer step
    reward, entropy = _series(steps, "reward"), _series(steps, "entropy")

    def first(values: list[float]) -> float:
        return _mean(values[: max(1, min(window, len(values) // 2))])

    def last(values: list[float]) -> float:
        return _mean(values[-max(1, min(window, len(values) // 2)) :])

    return {
        "steps": len(steps),
        "accuracy_before": result.accuracy_before,
        "accuracy_after": result.accuracy_after,
        "reward_first": first(reward),
        "reward_last": last(reward),
        "entropy_first": first(entropy),
        "entropy_last": last(entropy),
        # TRL's own counts of the clipped tokens: CE-GPPO keeps the gradient of exactly these (x beta1, x beta2)
        "preserved_left_frac": _mean(_series(steps, "clip_ratio/low_mean")),
        "preserved_right_frac": _mean(_series(steps, "clip_ratio/high_mean")),
        "preserved_grad_share": _mean(_series(steps, "cegppo/preserved/grad_share")),  # NaN unless a run logs it
        "clip_region_frac": _mean(_series(steps, "clip_ratio/region_mean")),
        "ratio_max": max(_series(steps, "cegppo/ratio/max"), default=float("nan")),
        "train_seconds": result.train_seconds,
    }


def format_summary(summary: dict, *, title: str, extra: dict | None = None, window: int = 10) -> str:
    """An aligned text table of `summarize`'s numbers under `title`, plus `extra` rows as given (`window`: the one
    given to `summarize`, for the labels)."""

    def pct(x):
        return "n/a" if x is None or math.isnan(x) else f"{x:.1%}"

    def num(x):
        return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"

    rows = [
        ("held-out accuracy (greedy)", f"{pct(summary['accuracy_before'])} -> {pct(summary['accuracy_after'])}"),
        (
            f"training reward, first -> last {window} batches",
            f"{num(summary['reward_first'])} -> {num(summary['reward_last'])}",
        ),
        (
            f"policy entropy, first -> last {window} steps",
            f"{num(summary['entropy_first'])} -> {num(summary['entropy_last'])}",
        ),
        ("tokens outside the clip range (mean)", pct(summary["clip_region_frac"])),
        ("  left: A<0, r<1-eps (kept x beta1)", pct(summary["preserved_left_frac"])),
        ("  right: A>0, r>1+eps (kept x beta2)", pct(summary["preserved_right_frac"])),
        ("their share of the gradient weight", pct(summary["preserved_grad_share"])),
        ("max ratio seen", num(summary["ratio_max"])),
        ("optimizer steps", str(summary["steps"])),
        ("RL wall time", f"{summary['train_seconds']:.0f} s"),
    ]
    rows = [(k, v) for k, v in rows if not (k.startswith("their share") and v == "n/a")]  # not logged by this run
    rows += [(k, str(v)) for k, v in (extra or {}).items()]
    width = max(len(k) for k, _ in rows)
    value_width = max(len(v) for _, v in rows)
    rule = "-" * (width + value_width + 3)
    lines = [title, rule] + [f"{k:<{width}} | {v}" for k, v in rows] + [rule]
    return "\n".join(lines)


def quiet_libraries() -> None:
    """Keep the terminal to the progress bar and the summary: library info logs and known warnings off."""
    import datasets
    import transformers

    transformers.logging.set_verbosity_warning()
    transformers.logging.disable_progress_bar()
    datasets.logging.set_verbosity_warning()
    datasets.disable_progress_bars()
    logging.getLogger("accelerate").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
