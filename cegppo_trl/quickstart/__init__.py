"""Quickstart: watch CE-GPPO improve a small model on CPU in a couple of minutes (`python -m cegppo_trl.quickstart`).

The pieces are importable for other studies (e.g. entropy sweeps over β):

- `build_default_model` / `WarmupSettings`: the seeded tiny Llama with its supervised warm-up, cached by settings.
- `addition_task`, `addition_reward`, `hub_dataset_task`, `Task`: the built-in and GSM8K-style tasks.
- `evaluate_accuracy`, `generate_greedy`: greedy held-out accuracy.
- `run_training`: one RL run returning its history; `summarize`, `plot_run`: its headline numbers and plots.
"""

from .plots import PLOT_FILES, plot_run
from .run import (
    FAST_MODEL_WARMUP,
    HUB_MODEL_TRAINING,
    TINY_MODEL_TRAINING,
    HeldoutAccuracyCallback,
    RunResult,
    format_summary,
    main,
    quiet_libraries,
    run_training,
    summarize,
)
from .task import (
    Task,
    addition_is_correct,
    addition_problems,
    addition_reward,
    addition_task,
    encode_prompts,
    evaluate_accuracy,
    generate_greedy,
    hub_dataset_task,
    numeric_is_correct,
)
from .warmup import WarmupSettings, build_default_model, default_cache_dir, supervised_warmup

__all__ = [
    "FAST_MODEL_WARMUP",
    "HUB_MODEL_TRAINING",
    "PLOT_FILES",
    "TINY_MODEL_TRAINING",
    "HeldoutAccuracyCallback",
    "RunResult",
    "Task",
    "WarmupSettings",
    "addition_is_correct",
    "addition_problems",
    "addition_reward",
    "addition_task",
    "build_default_model",
    "default_cache_dir",
    "encode_prompts",
    "evaluate_accuracy",
    "format_summary",
    "generate_greedy",
    "hub_dataset_task",
    "main",
    "numeric_is_correct",
    "quiet_libraries",
    "plot_run",
    "run_training",
    "summarize",
    "supervised_warmup",
]
