"""The `cegppo` console command.

    cegppo train --config examples/recipes/gsm8k_qwen2.5_0.5b_lora.yaml [--any_field value ...]
    cegppo rewards

`train` runs in the current process; for several GPUs put `accelerate launch` in front (`-m cegppo_trl.cli train`),
exactly as with `examples/cegppo.py`. Both call `cegppo_trl.scripts.main`.
"""

from __future__ import annotations

import argparse
import sys


def _build_parser() -> argparse.ArgumentParser:
    from . import __version__  # the package imports TRL lazily, so `cegppo --help` stays fast

    parser = argparse.ArgumentParser(
        prog="cegppo",
        description="CE-GPPO (gradient-preserving clipping policy optimization) training for TRL.",
        epilog="Multi-GPU: accelerate launch --config_file accelerate_configs/multi_gpu.yaml -m cegppo_trl.cli "
        "train --config RECIPE.yaml. CPU only: add --use_cpu true --bf16 false (or start from "
        "examples/recipes/cpu_smoke.yaml); two CPU processes: ACCELERATE_USE_CPU=1 torchrun --nproc_per_node 2 "
        "examples/cegppo.py ... See docs/usage.md.",
    )
    parser.add_argument("--version", action="version", version=f"cegppo-trl {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    # `train` parses its own arguments (every CEGPPOConfig / ModelConfig / script field); `cegppo train -h` lists them.
    commands.add_parser(
        "train",
        add_help=False,
        help="train with CE-GPPO: --config RECIPE.yaml plus any config field as a flag (flags override the YAML)",
    )
    commands.add_parser("rewards", help="list the reward functions usable in --reward_funcs")
    return parser


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


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `cegppo` command; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _build_parser()
    args = parser.parse_args(argv[:1])  # only the subcommand: `train` hands the rest to its TrlParser
    if args.command == "train":
        from .scripts import main as train
        from .scripts import parse_args

        train(*parse_args(argv[1:], prog="cegppo train"))
    elif args.command == "rewards":
        _list_rewards()
    else:
        parser.print_help()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
