"""The `cegppo` console command: `train`, `check` (the plan of the same command), `probe`, `recipes`,
`config-path`, `rewards`. Launchers take the module form, `-m cegppo_trl.cli train ...`.

`cegppo train` prints a refused setting (`preflight.CEGPPOUsageError`, or a value a config field's own check refuses
while parsing) as one line, exit status 2, and a reward that raised (`scripts.RewardFailed`) as one line, exit status
5; anything else keeps its traceback. `CEGPPO_TRACEBACK=1` keeps every traceback.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys

# `cegppo --help` and `cegppo train --help` end with these (docs/usage.md has the same table).
TRAIN_EXIT_STATUSES = """\
exit status of `cegppo train` (the final model and its card are saved in each case but 2 and 5):
  0  trained to the end, with a learning signal
  1  an error raised by TRL, transformers or torch (their traceback)
  2  a refused setting, before the model loads (one line says what to change)
  3  nothing to learn: `max_zero_signal_batches` rollout batches in a row, or every rollout batch of a shorter run,
     gave every completion of a prompt the same reward (a solved task, a constant, infinite or NaN reward: the
     message names the kind)
  4  the reward cannot score this data: `max_unscorable_batches` rollout batches in a row, or every rollout batch
     of a shorter run, got no reward (None or NaN everywhere)
  5  a reward function raised (one line names it and its error; CEGPPO_TRACEBACK=1 shows the traceback)
  130  interrupted (Ctrl-C): one line names the newest complete checkpoint and how to resume
"""


def _build_parser() -> argparse.ArgumentParser:
    from . import __version__  # the package imports TRL lazily, so `cegppo --help` stays fast
    from .resources import accelerate_configs_dir

    parser = argparse.ArgumentParser(
        prog="cegppo",
        description="CE-GPPO (gradient-preserving clipping policy optimization) training for TRL.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"""\
examples:
  cegppo train --config cpu_smoke --model_name_or_path MODEL --dataset_name data.jsonl --output_dir runs/smoke
      --config takes a shipped recipe's name (`cegppo recipes` lists them) or a YAML path; flags override it.
  cegppo check --config cpu_smoke --model_name_or_path MODEL --dataset_name data.jsonl --output_dir runs/smoke
      the same command, checked in seconds before any GPU time: a report, exit status 1 on any error (an
      argument error too); no reward of yours is called unless you add --call_rewards.
  accelerate launch --config_file "$(cegppo config-path multi_gpu)" -m cegppo_trl.cli train --config RECIPE
      several GPUs (launchers take the module form `-m cegppo_trl.cli`); the shipped configs are in
      {accelerate_configs_dir()}.
  ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m cegppo_trl.cli train --config RECIPE ...
      two CPU processes. Any CPU run: add --use_cpu true --bf16 false (the cpu_smoke recipe sets both).

{TRAIN_EXIT_STATUSES}""",
    )
    parser.add_argument("--version", action="version", version=f"cegppo-trl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # `train` parses its own arguments (every CEGPPOConfig / ModelConfig / script field); `cegppo train -h` lists them.
    commands.add_parser(
        "train",
        add_help=False,
        help="train with CE-GPPO: --config RECIPE (a shipped recipe's name or a YAML path) plus any config field as "
        "a flag (flags override the YAML)",
    )
    commands.add_parser(
        "check",
        add_help=False,
        help="check a `cegppo train` command before training (same arguments): the data and prompts as the model "
        "gets them, the columns each reward reads, the batch layout, the output directory, and what it did not check; "
        "no GPU, no model weights; exits 1 on any error; --call_rewards also calls your rewards on real rows",
    )
    for name, entry_point in extra_commands().items():  # each parses its own arguments, like `train`
        commands.add_parser(name, add_help=False, help=f"{_summary(entry_point)} (`cegppo {name} --help`)")
    commands.add_parser(
        "recipes", help="list the shipped recipes (for --config NAME) and accelerate configs, with their folders"
    )
    config_path = commands.add_parser(
        "config-path",
        help="print the installed path of a shipped accelerate config or recipe, by name: accelerate launch "
        '--config_file "$(cegppo config-path deepspeed_zero2)" ...',
    )
    config_path.add_argument("name", help="e.g. deepspeed_zero2, multi_gpu (`cegppo recipes` lists them)")
    commands.add_parser("rewards", help="list the reward functions usable in --reward_funcs")
    return parser


CHECK_DESCRIPTION = """\
Check a `cegppo train` command without training: it takes the same arguments (`cegppo train --help` lists them) and,
in seconds, without a GPU or the model's weights, prints the plan: the data and prompts as the model gets them, the
columns each reward reads, the batch layout (on- or off-policy) and the output directory, then what it did not check.
Exit status 1 on any error (an argument error too), else 0."""


def _check_parser() -> argparse.ArgumentParser:
    """`cegppo check`'s own flag; every other argument is `cegppo train`'s (parsed without importing torch here)."""
    parser = argparse.ArgumentParser(
        prog="cegppo check",
        usage="cegppo check [--call_rewards] TRAIN_ARGUMENTS...",
        description=CHECK_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument(
        "--call_rewards",
        action="store_true",
        help="also call every reward (yours too: your code runs, with its side effects) on a rollout batch of real "
        "rows; by default only this package's and TRL's rewards are called, on the reference answers",
    )
    return parser


def _print_table(title: str, entries: dict[str, str], name_width: int) -> None:
    """`title`, then each name with its text wrapped beside it to the terminal's width (words kept whole)."""
    import shutil
    import textwrap

    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 119))
    print(title + "\n")
    for name, text in entries.items():
        lines = textwrap.wrap(text or "-", width=width - name_width, break_long_words=False)
        print("\n".join([f"{name:<{name_width}}{lines[0]}", *(" " * name_width + line for line in lines[1:])]))


# Subcommands of other layers and packages: an entry point `NAME = "module:function"` in this group adds
# `cegppo NAME ...`, which calls `function(argv_after_NAME)` for its exit status.
COMMANDS_GROUP = "cegppo.commands"
BUILT_IN = ("train", "check", "recipes", "config-path", "rewards")


def extra_commands() -> dict:
    """The installed `cegppo.commands` entry points by name (none may shadow a built-in command)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP) if ep.name not in BUILT_IN}


def _summary(entry_point) -> str:
    """The first line of the command module's docstring, read from its file without importing the module or its
    packages (the probe imports torch: `cegppo --help` would take seconds)."""
    import ast
    import importlib.util
    from importlib.machinery import PathFinder
    from pathlib import Path

    top, *parts = entry_point.module.split(".")
    try:
        spec = importlib.util.find_spec(top)  # a top-level name is found without being imported
        for i in range(len(parts)):
            spec = PathFinder.find_spec(".".join([top, *parts[: i + 1]]), spec.submodule_search_locations)
        docstring = ast.get_docstring(ast.parse(Path(spec.origin).read_text()))
    except (AttributeError, ImportError, OSError, SyntaxError, TypeError, ValueError):
        docstring = None
    if not docstring:
        return entry_point.value
    line = docstring.splitlines()[0].rstrip(".")
    return line[:1].lower() + line[1:]  # as the built-in commands' help reads


def _recipe_summary(path) -> str:
    """The first sentence of a recipe's leading comment block (not "Sec. 5" or "et al.")."""
    lines = [line.lstrip("#").strip() for line in itertools.takewhile(
        lambda line: line.startswith("#") and line.strip("# "), path.read_text().splitlines())]  # fmt: skip
    text = " ".join(lines)
    end = re.search(r"\.(?=\s+[A-Z`])", text)
    return text if end is None else text[: end.end()]


def _list_recipes() -> None:
    from .resources import accelerate_configs_dir, recipe_names, recipes_dir

    names = recipe_names()
    _print_table(f"Recipes for `cegppo train --config NAME` (a path to your own YAML works too), in {recipes_dir()}:",
                 {name: _recipe_summary(recipes_dir() / f"{name}.yaml") for name in names},
                 max(map(len, names), default=0) + 2)  # fmt: skip
    print(f"\nAccelerate configs for `accelerate launch --config_file PATH`, in {accelerate_configs_dir()}:")
    print("  " + ", ".join(f"{name}.yaml" for name in recipe_names(accelerate_configs_dir())))


def describe_reward(func) -> str:
    """One line for `cegppo rewards`: what the reward checks and its score convention (+1/-1 or 1/0)."""
    if not hasattr(func, "correct"):  # format_reward
        return "a non-empty closed \\boxed{} answer after a well-formed <think> block (or none). Scores 1 if so, 0 " \
            "otherwise; reads no reference."  # fmt: skip
    what = (
        "math-verify equivalence of the last \\boxed{} answer with `solution`"
        if hasattr(func, "require_boxed")
        else "exact match of the final number with `solution` (GSM8K's `#### 72` or a bare number)"
    )
    return f"{what}. Scores {'+' if func.incorrect < 0 else ''}{func.correct:g} correct, {func.incorrect:g} otherwise."


def _list_rewards() -> None:
    from .rewards import REWARD_FUNCS, TRL_REWARD_FUNCS

    width = max(map(len, [*REWARD_FUNCS, *TRL_REWARD_FUNCS])) + 2
    _print_table("Reward functions for --reward_funcs (or a dotted path to your own):",
                 {name: describe_reward(func) for name, func in REWARD_FUNCS.items()}, width)  # fmt: skip
    print()
    _print_table("TRL's reward functions, by name (any other as trl.rewards.<name>):", TRL_REWARD_FUNCS, width)


# Set to 1 to see the traceback of a refused setting too (a bug report, a debugger).
TRACEBACK_ENV = "CEGPPO_TRACEBACK"


def _tracebacks() -> bool:
    import os

    return os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


def _say(line: str) -> None:
    """`line` on stderr, on a line of its own above a progress bar still on screen (a run that ended by an error)."""
    tqdm = sys.modules.get("tqdm")
    if tqdm is not None:
        tqdm.tqdm.write(line, file=sys.stderr)
    else:
        print(line, file=sys.stderr)


def _log_above_progress_bars() -> None:
    """`cegppo train` is an application: where nothing configured logging, the package's warnings print on lines of
    their own above the progress bar (`tqdm.write`) instead of into it (Python's last-resort handler)."""
    import logging

    if logging.getLogger().handlers or logging.getLogger("cegppo_trl").handlers:
        return

    class TqdmWrite(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=sys.stderr)

    logging.getLogger("cegppo_trl").addHandler(TqdmWrite(logging.WARNING))


def check_main(argv: list[str] | None = None) -> int:
    """`cegppo check`: the plan of a `cegppo train` command line; 1 when it holds errors or the arguments are
    refused (one line), else 0."""
    import shutil

    try:
        options, rest = _check_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
        from .scripts import check_command, parse_args  # after `--help`: it imports torch and TRL

        parsed = parse_args(rest, prog="cegppo check")
    except SystemExit as exit:  # argparse printed its help or its one line
        return 1 if exit.code else 0
    except ValueError as error:  # a field's own check refused its value
        print(f"cegppo check: error: {error}", file=sys.stderr)
        return 1
    report, _ = check_command(*parsed, call_rewards=options.call_rewards, plan_resume=True)
    print(report.format(max(60, min(shutil.get_terminal_size((100, 20)).columns, 119))))
    return 1 if report.errors else 0


def _interrupted(parsed) -> str:
    """After Ctrl-C: what was saved (the newest committed checkpoint) and how to resume, in one line."""
    if parsed is None:
        return "Nothing was started."
    from .checkpoints import checkpoint_folders, marker

    output_dir = parsed[1].output_dir
    saved = [folder for folder in checkpoint_folders(output_dir) if marker(folder) is not None]
    if not saved:
        return f"No checkpoint was saved in {output_dir}: the same command starts over."
    return (
        f"Saved: {saved[-1]} (the newest complete checkpoint). Resume: the same command with "
        "`--resume_from_checkpoint last`."
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `cegppo` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    if argv[:1] == ["config-path"]:
        from .resources import config_path

        name = parser.parse_args(argv).name
        try:
            print(config_path(name))
        except ValueError as error:
            parser.exit(2, f"cegppo config-path: error: {error}\n")
        return 0
    args = parser.parse_args(argv[:1])  # only the subcommand: `train` hands the rest to its TrlParser
    if args.command == "train":
        from .monitoring import STOP_EXIT_STATUS
        from .preflight import CEGPPOUsageError
        from .scripts import RewardFailed, parse_args
        from .scripts import main as train

        parsed = None
        _log_above_progress_bars()
        try:
            parsed = parse_args(argv[1:], prog="cegppo train", epilog=TRAIN_EXIT_STATUSES)
            trainer = train(*parsed)
        except (CEGPPOUsageError, RewardFailed) as error:
            if _tracebacks():
                raise
            _say(f"cegppo train: error: {error}")
            return 5 if isinstance(error, RewardFailed) else 2
        except ValueError as error:  # raised while parsing: a field's own check refused its value
            if parsed is not None or _tracebacks():
                raise
            print(f"cegppo train: error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            _say(f"cegppo train: interrupted. {_interrupted(parsed)}")
            return 130
        if trainer.stop_reason is not None:  # stopped early, the final model saved: say why (see the epilog), once
            if trainer.accelerator.is_main_process:
                _say(
                    f"cegppo train: stopped at step {trainer.state.global_step}: {trainer.reward_monitor.stop_message}"
                )
            return STOP_EXIT_STATUS[trainer.stop_reason]
    elif args.command == "check":
        return check_main(argv[1:])
    elif args.command not in (None, *BUILT_IN):  # a `cegppo.commands` entry point, e.g. `probe`
        try:
            return extra_commands()[args.command].load()(argv[1:])
        except ValueError as error:
            print(f"cegppo {args.command}: error: {error}", file=sys.stderr)
            return 2
    elif args.command == "recipes":
        _list_recipes()
    elif args.command == "rewards":
        _list_rewards()
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
