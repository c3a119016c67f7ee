"""The model card (`README.md`) written beside every model a `CEGPPOTrainer` saves: TRL's card plus the CE-GPPO
settings.

TRL writes its card (tags, paper link, citation from the trainer's `_tag_names` / `_paper`) only when a checkpoint
is saved or the model is pushed, and always to `args.output_dir`; a final `save_model` with `save_strategy: no`
left no card, and PEFT's `save_pretrained` then wrote its blank template beside an adapter. The trainer calls
`write_model_card` from `save_model` for every folder it saves to, before the weights (PEFT then adds its
`library_name: peft` and version to our card instead of writing its own), and `finish_card` after every TRL card.

TRL's template links the base model to the Hub whatever it is: a local model gives "fine-tuned version of
[None](https://huggingface.co/None)" (TRL passes no base model for a local directory) and PEFT records the local
path as `base_model`. `finish_card` names a local base model by its folder name, unlinked, and drops a local path
out of the metadata.
"""

from __future__ import annotations

import os
import shutil
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .config import CEGPPO_LOSS_TYPES

__all__ = [
    "CARD_SECTION_TITLE",
    "PAPER",
    "card_section",
    "cegppo_settings",
    "finish_card",
    "finish_trainer_card",
    "rewrite_card",
    "write_model_card",
]

CARD_SECTION_TITLE = "## CE-GPPO settings"
# The paper as TRL's model card cites it (the trainer's `_paper`); `eprint` as in the README.
PAPER = {
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
    """The settings that define a CE-GPPO run, as shown on the model card.

    Args:
        trainer: a `CEGPPOTrainer` (its `args`, `loss_type`, clip range and β schedules).
    """
    args = trainer.args
    settings: dict[str, object] = {"loss_type": args.loss_type}
    if trainer.loss_type in CEGPPO_LOSS_TYPES:
        settings.update(
            beta1=str(trainer.beta1_schedule),
            beta2=str(trainer.beta2_schedule),
            epsilon_low=trainer.epsilon_low,
            epsilon_high=trainer.epsilon_high,
            delta=args.delta,
            delta_low=args.delta_low,  # None: the paper's objective, no left guard
            **({} if args.delta_low is None else {"delta_low_mode": args.delta_low_mode}),
            importance_sampling_level=args.importance_sampling_level,
            sft_loss_coef=args.sft_loss_coef,
            dynamic_sampling=args.dynamic_sampling,
        )
    settings.update(
        num_generations=args.num_generations,
        num_iterations=args.num_iterations,
        steps_per_generation=args.steps_per_generation,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        learning_rate=args.learning_rate,
        kl_beta=args.beta,
    )
    history = getattr(trainer, "settings_history", None)
    if history:  # a resume changed settings: the table shows the last segment's, this says where it began
        settings["settings_changed"] = "; ".join(
            f"at step {entry['step']}: "
            + ", ".join(f"{k} {old!r} -> {new!r}" for k, (old, new) in entry["changes"].items())
            for entry in history
        )
    return settings


def card_section(settings: Mapping[str, object]) -> str:
    """The card's CE-GPPO section: what the method is and the settings table."""
    rows = "\n".join(f"| `{key}` | `{value}` |" for key, value in settings.items())
    return (
        f"\n{CARD_SECTION_TITLE}\n\n"
        "Trained with cegppo-trl (`pip install cegppo-trl`): TRL's GRPO trainer with "
        "gradient-preserving clipping ([CE-GPPO](https://huggingface.co/papers/2509.20712)). beta1 scales the "
        "gradient of clipped negative-advantage tokens, beta2 that of clipped positive-advantage tokens; "
        "schedules are written in cegppo-trl's schedule syntax (a bare number is a constant).\n\n"
        f"| setting | value |\n|---|---|\n{rows}\n"
    )


def _is_local(name: str | None) -> bool:
    return bool(name) and (os.path.isabs(name) or name.startswith(("./", "../", "~")) or os.path.isdir(name))


def rewrite_card(card: str, settings: Mapping[str, object], base_model: str | None = None) -> str:
    """`card` (TRL's, or one already rewritten) with the CE-GPPO section before the citations and no dead links.

    Pure: the same card and settings give the same text, and rewriting a rewritten card changes nothing.

    Args:
        card: the card's text.
        settings: `cegppo_settings(trainer)`.
        base_model: the trained model's `name_or_path`; a local one is named by its folder name, unlinked.
    """
    if CARD_SECTION_TITLE in card:  # a card written before: replace its section (the settings may have changed)
        start = card.index("\n" + CARD_SECTION_TITLE)
        end = card.find("\n## ", start + 1)
        card = card[:start] + (card[end + 1 :] if end != -1 else "\n")  # as it was before the insertion
    section = card_section(settings)
    marker = "## Citations"  # TRL's template puts the citations last
    card = card.replace(marker, section + "\n" + marker, 1) if marker in card else card.rstrip("\n") + "\n" + section
    local = (
        "a local model"
        if not base_model or not _is_local(base_model)
        else f"a local model (`{_local_name(base_model)}`)"
    )
    # TRL's template links whatever base model it got to the Hub: `None` for a local directory.
    card = card.replace("[None](https://huggingface.co/None)", local)
    if base_model and _is_local(base_model):
        card = card.replace(f"[{base_model}](https://huggingface.co/{base_model})", local)
    # The quick start's pipeline loads `hub_model_id`, which is None unless the run pushes to the Hub.
    card = card.replace('model="None"', 'model="path/to/this/folder"')
    return card


def _local_name(path: str) -> str:
    return Path(os.path.expanduser(path).rstrip("/")).name or path


def finish_card(path: str | os.PathLike, settings: Mapping[str, object], base_model: str | None = None) -> None:
    """Rewrite the card at `path` in place (`rewrite_card`) and drop a local path from its metadata (`base_model`,
    PEFT's `base_model:adapter:<path>` tag: the Hub reads them as model ids). Nothing to do when there is no file."""
    from huggingface_hub import ModelCard

    if not os.path.isfile(path):
        return
    card = ModelCard.load(path)
    if _is_local(card.data.get("base_model")):
        card.data.base_model = None
    if card.data.tags:
        card.data.tags = [
            tag for tag in card.data.tags if not (tag.startswith("base_model:") and _is_local(tag.split(":", 2)[-1]))
        ]
    card.text = rewrite_card(card.text, settings, base_model)
    card.save(path)


def finish_trainer_card(trainer: Any, folder: str | os.PathLike) -> None:
    """`finish_card` on the card in `folder`, with the trainer's settings and base model (process 0 only)."""
    if trainer.args.should_save and trainer.is_world_process_zero():
        base_model = getattr(getattr(trainer.model, "config", None), "_name_or_path", None)
        finish_card(os.path.join(folder, "README.md"), cegppo_settings(trainer), base_model)


def write_model_card(trainer: Any, folder: str | os.PathLike) -> None:
    """Write the CE-GPPO card into `folder`, where the trainer is about to save a model (process 0 only).

    The trainer's `create_model_card` (TRL's, then `finish_trainer_card`) writes it to `args.output_dir`, as TRL
    does at each checkpoint; it is copied from there to `folder` when that is elsewhere.
    """
    if not (trainer.args.should_save and trainer.is_world_process_zero()):
        return
    args = trainer.args
    model_name = args.hub_model_id.split("/")[-1] if args.hub_model_id else Path(args.output_dir).name
    os.makedirs(args.output_dir, exist_ok=True)  # TRL's card goes there, which a run may not have created yet
    trainer.create_model_card(model_name=model_name)
    card = os.path.join(args.output_dir, "README.md")
    target = os.path.join(folder, "README.md")
    if os.path.isfile(card) and os.path.abspath(card) != os.path.abspath(target):
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(card, target)
