"""What a CE-GPPO checkpoint holds beside transformers' files, read back as plain JSON only.

Every checkpoint the trainer writes has a `cegppo_state.json`: the CE-GPPO settings a resumed run is compared with
(`RESUME_COMPARED_FIELDS`), with an entropy controller the controller's state, and the run state that the trainer
carries between steps (`CEGPPOTrainer.cegppo_run_state`: the drift alarm, the unscorable-batch count). Resuming never
reads `training_args.bin` (a pickle: reading it would run whatever code it holds). The other pickles of a checkpoint
(optimizer, scheduler, RNG states; DeepSpeed's model and optimizer states) are read with
`torch.load(weights_only=True)`, DeepSpeed's through `cegppo_trl.safe_load` with an allowlist of its own data
classes, so no file of a checkpoint runs code on resume; a checkpoint with a plain-pickle index (FSDP's
`SHARDED_STATE_DICT`) is refused (docs/usage.md, "Security").
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

CEGPPO_STATE_FILE = "cegppo_state.json"
TRAINER_STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
CEGPPO_STATE_FORMAT = 1
# CE-GPPO settings compared with the checkpoint's when resuming (a change is allowed, and named in a warning).
RESUME_COMPARED_FIELDS = (
    "gppo_beta1",
    "gppo_beta2",
    "gppo_beta1_schedule",
    "gppo_beta2_schedule",
    "entropy_controller",
    "delta_low",
    "delta_low_mode",
    "max_steps",
)


# ----------------------------------------------------------------------------------------------------------------
# Reading and writing the state files (JSON only)
# ----------------------------------------------------------------------------------------------------------------
def state_record(args: Any, controller_state: dict | None, run_state: dict | None = None) -> dict[str, Any]:
    """The content of `cegppo_state.json` for a run configured by `args` (a `CEGPPOConfig`).

    `run_state` (`CEGPPOTrainer.cegppo_run_state()`: the drift alarm, the unscorable-batch count) is stored under
    `"run_state"`; a checkpoint without that key (written before it existed) resumes with a fresh run state.
    """
    record: dict[str, Any] = {
        "format": CEGPPO_STATE_FORMAT,
        "settings": {name: getattr(args, name) for name in RESUME_COMPARED_FIELDS},
    }
    if controller_state is not None:
        record["controller"] = controller_state
    if run_state is not None:
        record["run_state"] = run_state
    return record


def write_state(folder: str, record: dict[str, Any]) -> None:
    """Write `record` to `folder/cegppo_state.json` atomically: a kill mid-write leaves the old file or none."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, CEGPPO_STATE_FILE)
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def read_state(checkpoint: str) -> dict[str, Any] | None:
    """The checkpoint's `cegppo_state.json` as a dict, or None when it has none (written by another trainer).

    Raises:
        ValueError: the file exists but is not a JSON object.
    """
    path = os.path.join(checkpoint, CEGPPO_STATE_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError) as error:
        state = error
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a JSON object ({state!r}): the checkpoint is damaged.")  # noqa: TRY004
    return state


def trainer_state(checkpoint: str) -> dict[str, Any] | None:
    """The checkpoint's `trainer_state.json` (JSON written by transformers), or None if missing or unreadable."""
    try:
        with open(os.path.join(checkpoint, TRAINER_STATE_FILE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None


# ----------------------------------------------------------------------------------------------------------------
# What a resumed run is told: changed settings, a fresh controller, a run already finished
# ----------------------------------------------------------------------------------------------------------------
def changed_settings(checkpoint: str, args: Any) -> list[str] | None:
    """The CE-GPPO settings of `args` that differ from the checkpoint's, as `name: old -> new` lines.

    Returns None when the checkpoint records no settings (nothing to compare). A controller state that the new
    settings drop (no `entropy_controller` now) counts as a change.
    """
    state = read_state(checkpoint)
    if state is None:
        return None
    saved = state.get("settings")
    differing: list[str] = []
    if isinstance(saved, dict):
        for name in RESUME_COMPARED_FIELDS:
            if name in saved and saved[name] != getattr(args, name, None):
                differing.append(f"{name}: {saved[name]!r} -> {getattr(args, name, None)!r}")
    dropped = getattr(args, "entropy_controller", None) is None and "controller" in state
    if dropped and not any(d.startswith("entropy_controller:") for d in differing):
        differing.append("entropy_controller state in the checkpoint is dropped (no `entropy_controller` set now)")
    return differing if isinstance(saved, dict) or differing else None


# Checkpoints whose fresh controller start was already announced in this process (`main` warns before the model
# loads; the trainer, which also serves the Python API, then does not warn a second time).
FRESH_CONTROLLER_ANNOUNCED: set[str] = set()


def fresh_controller_note(checkpoint: str, args: Any) -> str | None:
    """The warning for resuming with `entropy_controller` set from a checkpoint without controller state, else None.

    Such a resume starts the controller fresh, as at step 0 of a run: no offset on the (scheduled) nominal β values
    and an empty measurement window. Every other CE-GPPO setting may change on resume too, with a warning.
    """
    if getattr(args, "entropy_controller", None) is None:
        return None
    state = read_state(checkpoint)
    if state is not None and "controller" in state:
        return None
    return (
        f"{checkpoint} holds no entropy-controller state (that run had no `entropy_controller`), so the controller "
        "starts fresh at the resumed step: no offset on the nominal beta1/beta2 and an empty measurement window. To "
        "continue the run as it was, resume without `entropy_controller`."
    )


def check_resume_length(checkpoint: str, max_steps: int, num_train_epochs: float) -> None:
    """Refuse to resume a checkpoint that the configured run length has already reached (read from JSON only).

    Raises:
        ValueError: naming the checkpoint's step (or epoch), the setting, and the fix.
    """
    state = trainer_state(checkpoint)
    if state is None:
        return
    step = int(state.get("global_step", 0))
    if max_steps > 0 and step >= max_steps:
        raise ValueError(finished_resume_message(checkpoint, step, max_steps))
    epoch = state.get("epoch")
    if max_steps <= 0 and isinstance(epoch, (int, float)) and epoch >= num_train_epochs:
        raise ValueError(
            f"`num_train_epochs={num_train_epochs}` but {checkpoint} is already at epoch {epoch:g} (global step "
            f"{step}): resuming it would train 0 steps and save that checkpoint's weights as the final model. Set "
            f"`num_train_epochs` above {epoch:g} (or `max_steps` above {step}) to train on."
        )


def finished_resume_message(checkpoint: str, global_step: int, max_steps: int) -> str:
    """Why resuming `checkpoint` at `global_step` with `max_steps` is refused: it would train nothing."""
    return (
        f"`max_steps={max_steps}` but {checkpoint} is already at global step {global_step}: resuming it would train "
        f"0 steps and save that checkpoint's weights as the final model. `max_steps` counts the whole run, not the "
        f"steps after the checkpoint: set it above {global_step} to train on, or resume an earlier checkpoint."
    )


# ----------------------------------------------------------------------------------------------------------------
# Checkpoint folders of an output directory: complete or not, removed when starting over
# ----------------------------------------------------------------------------------------------------------------
def checkpoint_folders(output_dir: str) -> list[str]:
    """The `checkpoint-<step>` folders of `output_dir`, oldest step first (none when it does not exist)."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    if not output_dir or not os.path.isdir(output_dir):
        return []
    pattern = re.compile(rf"^{PREFIX_CHECKPOINT_DIR}-(\d+)$")
    steps = {}
    for name in os.listdir(output_dir):
        match = pattern.match(name)
        if match and os.path.isdir(os.path.join(output_dir, name)):
            steps[os.path.join(output_dir, name)] = int(match.group(1))
    return sorted(steps, key=steps.get)


def incomplete_reason(checkpoint: str) -> str | None:
    """Why `checkpoint` is not a complete checkpoint (e.g. the run was killed while saving it), or None if it is.

    Complete means `trainer_state.json` is readable JSON (and so is `cegppo_state.json`, when there is one). That
    is enough because of the order of the writes: `CEGPPOTrainer` writes `cegppo_state.json` first (atomically),
    then transformers writes the weights, optimizer, scheduler and RNG states, and `trainer_state.json` last. A
    folder pushed to the Hub (`hub_strategy="checkpoint"`) is pushed after all of them, so it is complete too.
    """
    if trainer_state(checkpoint) is None:
        missing = not os.path.exists(os.path.join(checkpoint, TRAINER_STATE_FILE))
        return f"{TRAINER_STATE_FILE} is {'missing' if missing else 'not readable JSON'}"
    try:
        read_state(checkpoint)
    except ValueError:
        return f"{CEGPPO_STATE_FILE} is not readable JSON"
    return None


def last_complete_checkpoint(output_dir: str) -> tuple[str | None, dict[str, str]]:
    """The newest complete checkpoint of `output_dir` (None if there is none), and the newer incomplete folders
    it passed over, each with the reason it is incomplete."""
    skipped: dict[str, str] = {}
    for folder in reversed(checkpoint_folders(output_dir)):
        reason = incomplete_reason(folder)
        if reason is None:
            return folder, skipped
        skipped[folder] = reason
    return None, skipped


def resume_last(output_dir: str, requested: object = True) -> tuple[str, str | None]:
    """`resume_from_checkpoint=True` / `"last"`: the newest complete checkpoint of `output_dir`, and the warning that
    names the newer incomplete folders it passed over (None when there are none).

    Raises:
        ValueError: when `output_dir` holds no complete checkpoint, naming the incomplete ones if any.
    """
    last, skipped = last_complete_checkpoint(output_dir)
    partial = "; ".join(f"{os.path.basename(folder)} ({reason})" for folder, reason in skipped.items())
    if last is None:
        if skipped:
            raise ValueError(
                f"`resume_from_checkpoint={requested}` resumes the newest complete checkpoint in {output_dir}, but "
                f"every `checkpoint-*` folder there is incomplete: {partial}. They were being written when a run "
                "stopped; start a new run (`--overwrite_output_dir true` deletes them)."
            )
        raise ValueError(
            f"`resume_from_checkpoint={requested}` resumes the latest checkpoint in `output_dir`, but {output_dir} "
            "has no `checkpoint-*` folder. Give a checkpoint path, or start a new run without the flag."
        )
    warning = None
    if skipped:
        warning = (
            f"Resuming from {last}, the newest complete checkpoint; skipped the newer incomplete {partial}, which the "
            "run was writing when it stopped (it is overwritten when this run saves that step)."
        )
    return last, warning


def remove_checkpoints(output_dir: str) -> list[str]:
    """Delete every `checkpoint-*` folder of `output_dir` (an earlier run's, when starting over); returns them."""
    folders = checkpoint_folders(output_dir)
    for folder in folders:
        shutil.rmtree(folder)
    return folders
