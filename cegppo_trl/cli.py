"""The `cegppo` console command.

    cegppo train --config gsm8k_qwen2.5_0.5b_lora [--any_field value ...]   # a shipped recipe, or a YAML path
    cegppo check --config gsm8k_qwen2.5_0.5b_lora [--any_field value ...]   # the same, checked without training
    cegppo probe --config RECIPE [--any_field value ...] [--probe_arms "0,0;0.5,1"]  # the β-response probe (*)
    cegppo recipes                                                          # the shipped recipes and their folders
    cegppo config-path deepspeed_zero2                                      # a shipped file's installed path
    cegppo rewards

`train` runs in the current process. Launchers take the module form, which needs no repository checkout:
`accelerate launch --config_file ACCELERATE_CONFIG -m cegppo_trl.cli train ...` for several GPUs,
`ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 -m cegppo_trl.cli train ...` for several CPU processes.
`examples/cegppo.py` is the same script for repository users; both call `cegppo_trl.scripts.main`.

(*) Not this module's: a command of another layer or package, found by name in the `cegppo.commands` entry-point
group (`probe = "cegppo_trl.research.probe:main"` in pyproject.toml), so the core imports no research code.
"""

from __future__ import annotations

import argparse
import re
import sys

# `cegppo --help` and `cegppo train --help` end with these (docs/usage.md has the same table).
TRAIN_EXIT_STATUSES = """\
exit status of `cegppo train` (the final model and its card are saved in each case but 2):
  0  trained to the end, with a learning signal
  2  a refused setting, before training (one line says what to change)
  3  nothing to learn: `max_zero_signal_batches` rollout batches in a row, or every rollout batch of a shorter run,
     gave every completion of a prompt the same reward (a solved task, a constant, infinite or NaN reward: the
     message names the kind)
  4  the reward cannot score this data: `max_unscorable_batches` rollout batches in a row, or every rollout batch
     of a shorter run, got no reward (None or NaN everywhere)
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
        "gets them, what each reward receives, the batch layout, the engine, optimizer and generation settings, and "
        "what it did not check; no GPU, no model weights; exits 1 on any error; --call_rewards also calls your "
        "rewards on real rows",
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
    """The first sentence of a recipe's leading comment block."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#") or not line.strip("# "):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(lines)
    end = re.search(r"\.(?=\s+[A-Z`])", text)  # a sentence's end, not "Sec. 5" or "et al."
    return text if end is None else text[: end.end()]


def _list_recipes() -> None:
    import shutil
    import textwrap

    from .resources import accelerate_configs_dir, recipe_names, recipes_dir

    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 119))
    names = recipe_names()
    name_width = max(map(len, names), default=0) + 2
    print(f"Recipes for `cegppo train --config NAME` (a path to your own YAML works too), in {recipes_dir()}:\n")
    for name in names:
        summary = _recipe_summary(recipes_dir() / f"{name}.yaml") or "-"
        lines = textwrap.wrap(summary, width=width - name_width, break_long_words=False)
        print(f"{name:<{name_width}}{lines[0]}")
        for line in lines[1:]:
            print(" " * name_width + line)
    configs = sorted(p.name for p in accelerate_configs_dir().glob("*.yaml"))
    print(f"\nAccelerate configs for `accelerate launch --config_file PATH`, in {accelerate_configs_dir()}:")
    print("  " + ", ".join(configs))


def _list_rewards() -> None:
    import shutil
    import textwrap

    from .rewards import REWARD_FUNCS, TRL_REWARD_FUNCS, describe_reward

    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 119))
    name_width = max(map(len, [*REWARD_FUNCS, *TRL_REWARD_FUNCS])) + 2
    sections = (
        ("Reward functions for --reward_funcs (or a dotted path to your own):", {
            name: describe_reward(func) for name, func in REWARD_FUNCS.items()
        }),
        ("TRL's reward functions, by name (any other as trl.rewards.<name>):", TRL_REWARD_FUNCS),
    )  # fmt: skip
    for i, (title, entries) in enumerate(sections):
        print(("\n" if i else "") + title + "\n")
        for name, text in entries.items():
            lines = textwrap.wrap(text, width=width - name_width, break_long_words=False)
            print(f"{name:<{name_width}}{lines[0]}")
            for line in lines[1:]:
                print(" " * name_width + line)


# Set to 1 to see the traceback of a refused setting too (a bug report, a debugger).
TRACEBACK_ENV = "CEGPPO_TRACEBACK"


def _is_user_error(error: BaseException) -> bool:
    """Whether `cegppo train` reports `error` as one line (exit status 2) instead of a traceback.

    A refused setting is: a `ValueError` raised before training starts (a bad field, a missing column, a dataset
    that cannot be read), or a `RuntimeError`, `OSError` or `ImportError` raised by this package's own checks before
    training (a launch that would run the wrong engine, a refused TRL, an `output_dir` that is a file: the pre-flight
    report raises them). Anything raised inside the training loop, and any other such error,
    keeps its traceback: that is where bugs show. `CEGPPO_TRACEBACK=1` keeps every traceback.
    """
    import os

    if os.environ.get(TRACEBACK_ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    frames = []
    tb = error.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    if any(frame.f_code.co_name == "_inner_training_loop" for frame in frames):
        return False
    if isinstance(error, ValueError):
        return True
    return bool(frames) and frames[-1].f_globals.get("__name__", "").startswith("cegppo_trl.")


def check_main(argv: list[str] | None = None) -> int:
    """`cegppo check`: the report for a `cegppo train` command line; 1 when it holds errors or the arguments are
    refused (one line), else 0. `--call_rewards` (this command's own flag) calls every reward on a rollout batch of
    real rows (your code runs: it may have side effects); by default no reward of yours is called."""
    import shutil

    from .quiet import quiet_unused_deepspeed
    from .scripts import check_command, parse_args

    quiet_unused_deepspeed()  # a check trains nothing: DeepSpeed's device notice is noise whatever the engine
    argv = list(sys.argv[1:] if argv is None else argv)
    call_rewards = "--call_rewards" in argv
    try:
        parsed = parse_args([a for a in argv if a != "--call_rewards"], prog="cegppo check")
    except SystemExit as exit:  # argparse printed its one line (or `--help`, which exits 0)
        return 1 if exit.code else 0
    except ValueError as error:
        print(f"cegppo check: error: {error}", file=sys.stderr)
        return 1
    report, _ = check_command(*parsed, call_rewards=call_rewards, plan_resume=True)
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
        from .scripts import main as train
        from .scripts import parse_args

        parsed = None
        try:
            parsed = parse_args(argv[1:], prog="cegppo train", epilog=TRAIN_EXIT_STATUSES)
            trainer = train(*parsed)
        except (ValueError, RuntimeError, OSError, ImportError) as error:
            if not _is_user_error(error):
                raise
            print(f"cegppo train: error: {error}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print(f"cegppo train: interrupted. {_interrupted(parsed)}", file=sys.stderr)
            return 130
        if trainer.stop_reason is not None:  # stopped early, the final model saved: say why (see the epilog)
            print(f"cegppo train: stopped at step {trainer.state.global_step}: {trainer.reward_monitor.stop_message}",
                  file=sys.stderr)  # fmt: skip
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
