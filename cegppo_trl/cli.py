"""The `cegppo` command (`train`, `check`, `recipes`, `config-path`, `rewards`, `cegppo.commands` entry points such as
`probe`); launchers take `-m cegppo_trl.cli`. A refused setting or a raising reward is one line (exit 2 or 5) unless
`CEGPPO_TRACEBACK=1`; anything else keeps its traceback."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

TRAIN_EXIT_STATUSES = """\
exit status of `cegppo train` (the final model is saved in each case but 2 and 5):
  0  trained to the end
  1  an error raised by TRL, transformers or torch (their traceback)
  2  a refused setting, before the model loads (one line says what to change)
  3  nothing to learn: `max_zero_signal_batches` rollout batches in a row without reward spread (the message says)
  4  the reward cannot score this data: `max_unscorable_batches` rollout batches in a row got no reward
  5  a reward function raised (one line names it)
  130  interrupted (Ctrl-C)
"""
COMMANDS_GROUP = "cegppo.commands"  # `NAME = "module:function"` adds `cegppo NAME`: function(argv) -> exit status
BUILT_IN = ("train", "check", "recipes", "config-path", "rewards")


def extra_commands() -> dict:
    """The installed `cegppo.commands` entry points by name (none may shadow a built-in command)."""
    from importlib.metadata import entry_points

    return {ep.name: ep for ep in entry_points(group=COMMANDS_GROUP) if ep.name not in BUILT_IN}


def _build_parser() -> argparse.ArgumentParser:
    from . import __version__  # the package imports TRL lazily, so `cegppo --help` stays fast

    parser = argparse.ArgumentParser(prog="cegppo", formatter_class=argparse.RawDescriptionHelpFormatter,
                                     description="CE-GPPO (gradient-preserving clipping policy optimization) for TRL.",
                                     epilog="""\
examples:
  cegppo check --config cpu_smoke --model_name_or_path MODEL --dataset_name data.jsonl --output_dir runs/smoke
  cegppo train --config cpu_smoke --model_name_or_path MODEL --dataset_name data.jsonl --output_dir runs/smoke
  accelerate launch --config_file "$(cegppo config-path multi_gpu)" -m cegppo_trl.cli train --config RECIPE

""" + TRAIN_EXIT_STATUSES)  # fmt: skip
    parser.add_argument("--version", action="version", version=f"cegppo-trl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # `train`, `check` and the entry points parse their own arguments (`cegppo train -h` lists every field).
    commands.add_parser("train", add_help=False, help="train: --config RECIPE (a name or a path), any field a flag")
    commands.add_parser("check", add_help=False, help="check a `cegppo train` command before any GPU time")
    for name, entry_point in extra_commands().items():
        commands.add_parser(name, add_help=False, help=f"`cegppo {name} --help` ({entry_point.value})")
    commands.add_parser("recipes", help="list the shipped recipes and accelerate configs")
    config_path = commands.add_parser("config-path", help="print a shipped accelerate config's or recipe's path")
    config_path.add_argument("name", help="e.g. deepspeed_zero2, multi_gpu (`cegppo recipes` lists them)")
    commands.add_parser("rewards", help="list the reward functions usable in --reward_funcs")
    return parser


def check_main(argv: list[str] | None = None) -> int:
    """`cegppo check`: the plan of a `cegppo train` command line; 1 on any error (an argument error too), else 0."""
    parser = argparse.ArgumentParser(prog="cegppo check", usage="cegppo check [--call_rewards] TRAIN_ARGUMENTS...",
                                     description="The plan of a `cegppo train` command (`cegppo train --help`), with "
                                     "no GPU or weights; exit status 1 on any error.", allow_abbrev=False)  # fmt: skip
    parser.add_argument("--call_rewards", action="store_true", help="also call your rewards on a rollout batch")
    try:
        options, rest = parser.parse_known_args(list(sys.argv[1:] if argv is None else argv))
        from .scripts import check_command, parse_args  # after `--help`: it imports torch and TRL

        parsed = parse_args(rest, prog="cegppo check")
    except SystemExit as exit:  # argparse printed its help or its one line
        return 1 if exit.code else 0
    except ValueError as error:  # a field's own check refused its value
        print(f"cegppo check: error: {error}", file=sys.stderr)
        return 1
    report, _ = check_command(*parsed, call_rewards=options.call_rewards, plan_resume=True)
    print(report.format())
    return 1 if report.errors else 0


def _say(line: str) -> None:
    """`line` on stderr, on a line of its own above a progress bar still on screen."""
    getattr(getattr(sys.modules.get("tqdm"), "tqdm", None), "write", print)(line, file=sys.stderr)


def _train(argv: list[str]) -> int:
    from .monitoring import STOP_EXIT_STATUS
    from .preflight import CEGPPOUsageError
    from .scripts import RewardFailed, main, parse_args

    parsed, tracebacks = None, os.environ.get("CEGPPO_TRACEBACK", "0") not in ("", "0")
    try:
        parsed = parse_args(argv, prog="cegppo train", epilog=TRAIN_EXIT_STATUSES)
        trainer = main(*parsed)
    except (ValueError, RewardFailed) as error:  # a plain ValueError: a field's own check, while parsing
        if tracebacks or (parsed is not None and not isinstance(error, CEGPPOUsageError | RewardFailed)):
            raise
        _say(f"cegppo train: error: {error}")
        return 5 if isinstance(error, RewardFailed) else 2
    except KeyboardInterrupt:
        _say("cegppo train: interrupted. Resume: the same command with `--resume_from_checkpoint last`.")
        return 130
    if trainer.stop_reason is not None and trainer.accelerator.is_main_process:  # stopped early, model saved: why
        _say(f"cegppo train: stopped at step {trainer.state.global_step}: {trainer.reward_monitor.stop_message}")
    return STOP_EXIT_STATUS.get(trainer.stop_reason, 0)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `cegppo` command; returns the exit status."""
    from .resources import accelerate_configs_dir, recipe_names, recipes_dir, resolve_accelerate_config, resolve_config

    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    command = parser.parse_args(argv[: 2 if argv[:1] == ["config-path"] else 1]).command  # the rest: parsed by each
    if command in ("train", "check"):
        return (_train if command == "train" else check_main)(argv[1:])
    if command == "config-path":
        name = parser.parse_args(argv).name
        for resolve in (resolve_accelerate_config, resolve_config):
            with contextlib.suppress(ValueError):
                return print(os.path.abspath(resolve(name))) or 0
        parser.exit(2, f"cegppo config-path: error: {name!r} is neither a shipped accelerate config "
                    f"({', '.join(recipe_names(accelerate_configs_dir()))}) nor a shipped recipe.\n")  # fmt: skip
    elif command == "recipes":
        print(f"Recipes for `cegppo train --config NAME` (or a YAML path), in {recipes_dir()}:\n  "
              + ", ".join(recipe_names()))  # fmt: skip
        print(f"Accelerate configs for `--config_file \"$(cegppo config-path NAME)\"`, in {accelerate_configs_dir()}:"
              "\n  " + ", ".join(recipe_names(accelerate_configs_dir())))  # fmt: skip
    elif command == "rewards":
        from .rewards import REWARD_FUNCS, TRL_REWARD_FUNCS

        print("Reward functions for --reward_funcs (or a dotted path to your own):")
        print("\n".join(f"  {name:<27}{func.description}" for name, func in REWARD_FUNCS.items()))
        print("TRL's, by name (any other as trl.rewards.<name>; they read chat completions only):")
        print("\n".join(f"  {name:<27}{text}" for name, text in TRL_REWARD_FUNCS.items()))
    elif command is not None:  # a `cegppo.commands` entry point, e.g. `probe`
        try:
            return extra_commands()[command].load()(argv[1:])
        except ValueError as error:
            print(f"cegppo {command}: error: {error}", file=sys.stderr)
            return 2
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
