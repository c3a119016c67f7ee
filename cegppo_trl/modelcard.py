"""The model card (`README.md`) beside every model a `CEGPPOTrainer` saves: TRL's card (tags, paper link and
citation from the trainer's `_tag_names` / `_paper`) plus a CE-GPPO section with the settings table, and a line saying
so when the run was stopped early for lack of a learning signal. TRL writes its card only at checkpoints and pushes;
the trainer also writes it before its final `save_model` (`write_model_card`), so a run with `save_strategy: no`
leaves one too.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import CEGPPO_LOSS_TYPES

CARD_SECTION_TITLE = "## CE-GPPO settings"
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
    """The settings that define a CE-GPPO run, as the card's table shows them; `stopped_early` when the reward
    monitor stopped the run (`trainer.stop_reason`)."""
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
    if history := getattr(trainer, "settings_history", None):  # a resume changed settings: where each began
        settings["settings_changed"] = "; ".join(f"at step {entry['step']}: " + ", ".join(
            f"{k} {old!r} -> {new!r}" for k, (old, new) in entry["changes"].items()) for entry in history)  # fmt: skip
    if getattr(trainer, "stop_reason", None) is not None:
        settings["stopped_early"] = f"at step {trainer.state.global_step}: {trainer.reward_monitor.stop_message}"
    return settings


def rewrite_card(card: str, settings: Mapping[str, object]) -> str:
    """`card` with the CE-GPPO section (replaced if there) before TRL's citations; rewriting twice changes nothing.
    TRL links a local base model to the Hub as `[None](https://huggingface.co/None)`: named "a local model" here."""
    if CARD_SECTION_TITLE in card:
        start = card.index("\n" + CARD_SECTION_TITLE)
        end = card.find("\n## ", start + 1)
        card = card[:start] + (card[end + 1 :] if end != -1 else "\n")
    settings = dict(settings)
    stopped = settings.pop("stopped_early", None)
    rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in settings.items())
    section = (
        f"\n{CARD_SECTION_TITLE}\n\n"
        + (f"**Stopped early, for lack of a learning signal**, {stopped}\n\n" if stopped else "")
        + "Trained with cegppo-trl (`pip install cegppo-trl`): TRL's GRPO trainer with gradient-preserving clipping "
        "([CE-GPPO](https://huggingface.co/papers/2509.20712)). beta1 scales the gradient of clipped "
        "negative-advantage tokens, beta2 that of clipped positive-advantage tokens.\n\n"
        f"| setting | value |\n|---|---|\n{rows}\n"
    )
    marker = "## Citations"  # TRL's template puts the citations last
    card = card.replace(marker, section + "\n" + marker, 1) if marker in card else card.rstrip("\n") + "\n" + section
    return card.replace("[None](https://huggingface.co/None)", "a local model").replace(
        'model="None"', 'model="path/to/this/folder"'
    )


def finish_card(path: str | os.PathLike, settings: Mapping[str, object]) -> None:
    """Rewrite the card at `path` in place (`rewrite_card`); nothing to do when there is no file."""
    if os.path.isfile(path):
        Path(path).write_text(rewrite_card(Path(path).read_text(), settings))


def finish_trainer_card(trainer: Any, folder: str | os.PathLike) -> None:
    """`finish_card` on the card in `folder`, with the trainer's settings (process 0 only)."""
    if trainer.args.should_save and trainer.is_world_process_zero():
        finish_card(os.path.join(folder, "README.md"), cegppo_settings(trainer))


def write_model_card(trainer: Any, folder: str | os.PathLike) -> None:
    """Write the card into `folder`, where the trainer is about to save a model (process 0 only): TRL's
    `create_model_card` writes it to `args.output_dir`, copied from there when `folder` is elsewhere."""
    if not (trainer.args.should_save and trainer.is_world_process_zero()):
        return
    args = trainer.args
    os.makedirs(args.output_dir, exist_ok=True)  # TRL's card goes there, which a run may not have created yet
    trainer.create_model_card(
        model_name=args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name
    )
    card, target = os.path.join(args.output_dir, "README.md"), os.path.join(folder, "README.md")
    if os.path.isfile(card) and os.path.abspath(card) != os.path.abspath(target):
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(card, target)
