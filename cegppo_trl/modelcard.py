"""The model card: TRL's card (tags, paper link and citation from the trainer's `_tag_names` / `_paper`) plus a CE-GPPO
section with the settings table, and a line when the run was stopped early for lack of a learning signal.
"""

from __future__ import annotations

import os
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import CEGPPO_LOSS_TYPES

PAPER = {  # the paper as TRL's card cites it (the trainer's `_paper`); `eprint` as in the README
    "title": "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in "
    "Reinforcement Learning",
    "id": "2509.20712",
    # docstyle-ignore
    "citation": textwrap.dedent("""\
        @inproceedings{su2026cegppo,
            title        = {{CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in Reinforcement Learning}},
            author       = {Zhenpeng Su and Leiyu Pan and Minxuan Lv and Yuntao Li and Wenping Hu and Fuzheng Zhang and Kun Gai and Guorui Zhou},
            booktitle    = {Proceedings of the 64th Annual Meeting of the Association for Computational Linguistics (ACL)},
            year         = 2026,
            eprint       = {2509.20712},
        }"""),
}


def cegppo_settings(trainer: Any) -> dict[str, object]:
    """The settings that define a CE-GPPO run, and `stopped_early` when the reward monitor stopped it."""
    args = trainer.args
    settings: dict[str, object] = {"loss_type": args.loss_type}
    if trainer.loss_type in CEGPPO_LOSS_TYPES:
        settings.update(
            beta1=str(trainer.beta1_schedule), beta2=str(trainer.beta2_schedule), epsilon_low=trainer.epsilon_low,
            epsilon_high=trainer.epsilon_high, delta=args.delta, delta_low=args.delta_low,
            **({} if args.delta_low is None else {"delta_low_mode": args.delta_low_mode}),
            importance_sampling_level=args.importance_sampling_level,
            sft_loss_coef=args.sft_loss_coef, dynamic_sampling=args.dynamic_sampling,
        )  # fmt: skip
    settings.update(num_generations=args.num_generations, num_iterations=args.num_iterations,
                    steps_per_generation=args.steps_per_generation,
                    gradient_accumulation_steps=args.gradient_accumulation_steps, learning_rate=args.learning_rate,
                    kl_beta=args.beta)  # fmt: skip
    if trainer.stop_reason is not None:
        settings["stopped_early"] = f"at step {trainer.state.global_step}: {trainer.reward_monitor.stop_message}"
    return settings


def rewrite_card(card: str, settings: Mapping[str, object]) -> str:
    """TRL's fresh `card` with the CE-GPPO section before its citations."""
    settings = dict(settings)
    stopped = settings.pop("stopped_early", None)
    rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in settings.items())
    section = (
        "\n## CE-GPPO settings\n\n"
        + (f"**Stopped early, for lack of a learning signal**, {stopped}\n\n" if stopped else "")
        + "Trained with cegppo-trl (`pip install cegppo-trl`): TRL's GRPO trainer with gradient-preserving clipping "
        "([CE-GPPO](https://huggingface.co/papers/2509.20712)). beta1 scales the gradient of clipped "
        "negative-advantage tokens, beta2 that of clipped positive-advantage tokens.\n\n"
        f"| setting | value |\n|---|---|\n{rows}\n"
    )
    marker = "## Citations"  # TRL's template puts the citations last
    card = card.replace(marker, section + "\n" + marker, 1) if marker in card else card.rstrip("\n") + "\n" + section
    card = card.replace("[None](https://huggingface.co/None)", "a local model")
    return card.replace('model="None"', 'model="path/to/this/folder"')


def finish_card(trainer: Any) -> None:
    """Rewrite the card TRL just wrote in `args.output_dir` (process 0 only) with `trainer.cegppo_settings()`."""
    path = Path(trainer.args.output_dir, "README.md")
    if trainer.args.should_save and trainer.is_world_process_zero() and os.path.isfile(path):
        path.write_text(rewrite_card(path.read_text(), trainer.cegppo_settings()))
