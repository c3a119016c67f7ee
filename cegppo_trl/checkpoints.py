"""What a CE-GPPO checkpoint holds beside transformers' files, read back as plain JSON only, and when it is complete.

Every checkpoint the trainer writes has a `cegppo_state.json`: the CE-GPPO settings a resumed run is compared with
(`RESUME_COMPARED_FIELDS`), with an entropy controller the controller's state, and the run state that the trainer
carries between steps (`CEGPPOTrainer.cegppo_run_state`: the drift alarm, the unscorable-batch count). Resuming never
reads `training_args.bin` (a pickle: reading it would run whatever code it holds). The other pickles of a checkpoint
(optimizer, scheduler, RNG states; DeepSpeed's model and optimizer states) are read with
`torch.load(weights_only=True)`, DeepSpeed's through `cegppo_trl.safe_load` with an allowlist of its own data
classes, so no file of a checkpoint runs code on resume; a checkpoint with a plain-pickle index (FSDP's
`SHARDED_STATE_DICT`) is refused (docs/usage.md, "Security").

A checkpoint counts as complete once its commit record (`cegppo_commit.json`) exists: written last, after every
process has written its files and a barrier, by the main process, naming the world size and every file with its size
(`write_commit`, `commit_problem`). Rotation (`rotate`) only runs after a commit and only counts committed folders.
Which checkpoint a run resumes, and what happens to later checkpoints of another run in the same `output_dir`, is
decided once (`plan_resume`) on the main process (`start_run`), which also holds the `output_dir` lock.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .config import LATER_CHECKPOINTS_CHOICES, check_later_checkpoints  # noqa: F401 (re-exported)

CEGPPO_STATE_FILE = "cegppo_state.json"
COMMIT_FILE = "cegppo_commit.json"
COMMIT_FORMAT = 1
LOCK_FILE = "cegppo_run.lock"
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


def _write_json(path: str, record: dict[str, Any], *, durable: bool = False) -> None:
    """Write `record` to `path` atomically (a kill mid-write leaves the old file or none); `durable` also syncs it
    and its folder to disk. The temporary file is this process's own, so two processes never share one."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        if durable:
            f.flush()
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if durable:
        _fsync_dir(os.path.dirname(path))


def _read_json_object(path: str) -> dict[str, Any] | None:
    """The JSON object in `path`, or None when it is missing, unreadable or not an object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_state(folder: str, record: dict[str, Any]) -> None:
    """Write `record` to `folder/cegppo_state.json` atomically: a kill mid-write leaves the old file or none."""
    os.makedirs(folder, exist_ok=True)
    _write_json(os.path.join(folder, CEGPPO_STATE_FILE), record)


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
    return _read_json_object(os.path.join(checkpoint, TRAINER_STATE_FILE))


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
# Checkpoints without a commit record whose note was already given in this process (`cegppo train` plans the resume
# before the model loads, and `CEGPPOTrainer.train` plans it again for the Python API).
LEGACY_NOTE_ANNOUNCED: set[str] = set()


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

    A checkpoint this trainer wrote (its `cegppo_state.json` names the commit record) is complete when its commit
    record exists and every file it names is there with its recorded size, including each process's RNG state
    (`commit_problem`). A checkpoint without that mark (another trainer's, or an older cegppo-trl's) keeps the
    older rule: `trainer_state.json` is readable JSON (transformers writes it after the weights, optimizer,
    scheduler and process 0's RNG state, but without waiting for the other processes: `legacy_note`).
    """
    try:
        state = read_state(checkpoint)
    except ValueError:
        return f"{CEGPPO_STATE_FILE} is not readable JSON"
    if os.path.exists(os.path.join(checkpoint, COMMIT_FILE)):
        problem = commit_problem(checkpoint)
        if problem is not None:
            return problem
    elif state is not None and state.get("commit") == COMMIT_FILE:
        return f"{COMMIT_FILE} is missing: the run stopped before every process had written its files"
    if trainer_state(checkpoint) is None:
        missing = not os.path.exists(os.path.join(checkpoint, TRAINER_STATE_FILE))
        return f"{TRAINER_STATE_FILE} is {'missing' if missing else 'not readable JSON'}"
    return None


def legacy_note(checkpoint: str) -> str | None:
    """The note for resuming a checkpoint without a commit record (written by another trainer), else None."""
    if os.path.exists(os.path.join(checkpoint, COMMIT_FILE)):
        return None
    return (
        f"{checkpoint} has no {COMMIT_FILE} (written by another trainer or an older cegppo-trl), so it counts as "
        f"complete because its {TRAINER_STATE_FILE} is readable; in a multi-process save that does not prove the "
        "other processes had finished writing their files."
    )


# ----------------------------------------------------------------------------------------------------------------
# The commit protocol: a checkpoint is complete once its commit record, written last, says so
# ----------------------------------------------------------------------------------------------------------------
def per_rank_files(world_size: int, save_only_model: bool) -> list[str]:
    """The file each process writes into every checkpoint (transformers' RNG state), as a `{rank}` pattern."""
    return [] if save_only_model or world_size <= 1 else ["rng_state_{rank}.pth"]


def _missing_rank_files(rank_files: list[str], world_size: int, files: dict[str, int]) -> list[str]:
    """The per-process files (`rank_files` patterns, every rank of `world_size`) that `files` does not name."""
    names = [pattern.format(rank=rank) for pattern in rank_files for rank in range(world_size)]
    return [name for name in names if name not in files]


def uncommit(folder: str) -> None:
    """Remove `folder`'s commit record, if any: called by every process before it writes into the folder, so a
    checkpoint rewritten in place (or deleted) never looks complete while it is half-written."""
    try:
        os.remove(os.path.join(folder, COMMIT_FILE))
    except FileNotFoundError:
        return
    _fsync_dir(folder)


def begin_checkpoint(folder: str, record: dict[str, Any]) -> None:
    """Start writing checkpoint `folder` (main process): drop its old commit record, then write `cegppo_state.json`
    with `record`, marked as needing a commit record to count as complete."""
    os.makedirs(folder, exist_ok=True)
    uncommit(folder)
    write_state(folder, {**record, "commit": COMMIT_FILE})


def write_commit(folder: str, world_size: int, rank_files: list[str]) -> dict[str, Any]:
    """Write `folder`'s commit record (main process, after every process's files and a barrier), atomically.

    The record names the world size, the per-process files (`rank_files`, a `{rank}` pattern each) and every file in
    the folder with its size. Returns the record.
    """
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, folder)
            if relative != COMMIT_FILE and not name.endswith(".tmp"):
                files[relative] = os.path.getsize(path)
    missing = _missing_rank_files(rank_files, world_size, files)
    if missing:  # after the barrier every process has written its files: a gap here is a bug, not a kill
        raise RuntimeError(f"{folder}: {', '.join(missing)} missing after every process saved; not committing it.")
    record = {"format": COMMIT_FORMAT, "world_size": world_size, "rank_files": rank_files, "files": files}
    _write_json(os.path.join(folder, COMMIT_FILE), record, durable=True)
    return record


def commit_problem(folder: str) -> str | None:
    """What is wrong with `folder` by its commit record (the record missing or unreadable, a file missing or of
    another size, a process's file not recorded), or None when the folder is as committed."""
    try:
        with open(os.path.join(folder, COMMIT_FILE)) as f:
            record = json.load(f)
    except FileNotFoundError:
        return f"{COMMIT_FILE} is missing"
    except (OSError, ValueError):
        record = None
    if (
        not isinstance(record, dict)
        or not isinstance(record.get("files"), dict)
        or not isinstance(record.get("world_size", 1), int)
        or not isinstance(record.get("rank_files", []), list)
    ):
        return f"{COMMIT_FILE} is not a readable commit record"
    files = record["files"]
    for relative, size in files.items():
        path = os.path.join(folder, relative)
        if not os.path.isfile(path):
            return f"{relative} is missing (named in {COMMIT_FILE})"
        if os.path.getsize(path) != size:
            return f"{relative} has {os.path.getsize(path)} bytes, {COMMIT_FILE} says {size}"
    world_size = record.get("world_size", 1)
    missing = _missing_rank_files(record.get("rank_files", []), world_size, files)
    if missing:
        return f"{missing[0]} is not in {COMMIT_FILE} (world size {world_size})"
    return None


def rotate(run_dir: str, save_total_limit: int | None, best_checkpoint: str | None = None) -> list[str]:
    """`save_total_limit` over the complete checkpoints of `run_dir` (after a commit); returns the deleted folders.

    Keeps the newest complete checkpoint and `best_checkpoint` whatever the limit, counts only complete folders, and
    deletes the incomplete folders older than the newest complete one (left by a run killed while saving; `last`
    never resumes them). Newer incomplete folders are left alone.
    """
    if save_total_limit is None or save_total_limit <= 0:
        return []
    folders = checkpoint_folders(run_dir)
    complete = [folder for folder in folders if incomplete_reason(folder) is None]
    if not complete:
        return []
    newest = complete[-1]
    protected = {os.path.normpath(newest)} | ({os.path.normpath(best_checkpoint)} if best_checkpoint else set())
    excess = len(complete) - max(save_total_limit, len(protected & set(map(os.path.normpath, complete))))
    doomed = [folder for folder in folders[: folders.index(newest)] if folder not in complete]
    for folder in complete:
        if excess <= 0:
            break
        if os.path.normpath(folder) not in protected:
            doomed.append(folder)
            excess -= 1
    for folder in doomed:
        uncommit(folder)  # a kill mid-delete leaves an incomplete folder, never a "complete" one missing files
        shutil.rmtree(folder, ignore_errors=True)
    return doomed


@contextmanager
def held_until_commit(args: Any) -> Iterator[dict[str, Any]]:
    """Hold back rotation and the Hub push of transformers' `_save_checkpoint` (both run right after process 0's
    `trainer_state.json`, while other processes may still be writing); yields what `commit_after_save` runs."""
    held = {"save_total_limit": args.save_total_limit, "push_to_hub": args.push_to_hub}
    args.save_total_limit, args.push_to_hub = None, False
    try:
        yield held
    finally:
        args.save_total_limit, args.push_to_hub = held["save_total_limit"], held["push_to_hub"]


def commit_after_save(trainer: Any, folder: str, run_dir: str, held: dict[str, Any]) -> None:
    """After every process saved `folder`: a barrier, the commit record (main process), then rotation and the Hub
    push that `held_until_commit` held back."""
    trainer.accelerator.wait_for_everyone()
    args = trainer.args
    if args.should_save:
        # With `save_on_each_node` each node's folder holds its own processes' files only: the sizes are checked,
        # the full set of RNG states cannot be.
        rank_files = [] if args.save_on_each_node else per_rank_files(args.world_size, args.save_only_model)
        write_commit(folder, args.world_size, rank_files)
        rotate(run_dir, held["save_total_limit"], trainer.state.best_model_checkpoint)
    if held["push_to_hub"]:
        trainer._push_from_checkpoint(folder)


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def checkpoint_step(folder: str) -> int:
    """The step in a `checkpoint-<step>` folder's name."""
    return int(os.path.basename(os.path.normpath(folder)).rsplit("-", 1)[1])


def _step_or_none(folder: str) -> int | None:
    try:
        return checkpoint_step(folder)
    except (IndexError, ValueError):
        return None


def check_complete(checkpoint: str) -> None:
    """Refuse an explicit `resume_from_checkpoint` path that is an incomplete checkpoint, naming the newest complete
    one beside it.

    Raises:
        ValueError: naming why it is incomplete and what to resume instead.
    """
    reason = incomplete_reason(checkpoint)
    if reason is None:
        return
    newest, _ = last_complete_checkpoint(os.path.dirname(os.path.abspath(checkpoint)))
    fix = (
        f"Resume {newest}, the newest complete checkpoint beside it."
        if newest
        else "No checkpoint beside it is complete: start a new run."
    )
    raise ValueError(
        f"`resume_from_checkpoint={checkpoint}` is not a complete checkpoint ({reason}): a run stopped while "
        f"writing it, or it is not a `checkpoint-*` folder. {fix}"
    )


def plan_resume(
    output_dir: str, requested: object, later_checkpoints: str = "refuse", overwrite_output_dir: bool = False
) -> tuple[str | None, list[str], list[str]]:
    """Which checkpoint a run resumes, what to tell the user, and which checkpoints of `output_dir` to move aside.

    `requested` is `resume_from_checkpoint`: None/False (a fresh run), True or `"last"` (the newest complete
    checkpoint, `resume_last`), or a path (refused when incomplete, `check_complete`). Checkpoints of `output_dir`
    later than the resumed one (every one, for a fresh run) belong to a run that went further: left there, `last`
    would bring that run back as soon as this one stops before their step. They are refused unless
    `later_checkpoints="move_aside"` (returned, for `move_aside`) or, for a fresh run, `overwrite_output_dir` (the
    CLI deletes them before this is called).

    Returns:
        The checkpoint (None for a fresh run), warnings to log, and the folders to move aside.

    Raises:
        ValueError: an unknown `later_checkpoints`, an incomplete checkpoint, or later checkpoints to refuse.
    """
    check_later_checkpoints(later_checkpoints)
    warnings: list[str] = []
    checkpoint = None
    if requested is True or (isinstance(requested, str) and requested.strip().lower() in ("true", "last")):
        checkpoint, warning = resume_last(output_dir, requested)
        warnings += [warning] if warning else []
    elif isinstance(requested, str) and os.path.isdir(requested):
        check_complete(requested)
        checkpoint = requested
    elif requested not in (None, False):
        return requested, warnings, []  # not a folder: transformers says it cannot find it
    if checkpoint is not None and os.path.realpath(checkpoint) not in LEGACY_NOTE_ANNOUNCED:
        note = legacy_note(checkpoint)
        if note:
            warnings.append(note)
            LEGACY_NOTE_ANNOUNCED.add(os.path.realpath(checkpoint))
    step = -1 if checkpoint is None else _step_or_none(checkpoint)
    later = [] if step is None else [f for f in checkpoint_folders(output_dir) if checkpoint_step(f) > step]
    if checkpoint is not None:  # a later half-written folder is this run's to rewrite: `last` never resumes it
        refused = [folder for folder in later if incomplete_reason(folder) is None]
    else:
        refused = later
    if not refused or later_checkpoints == "move_aside":
        return checkpoint, warnings, later if later_checkpoints == "move_aside" else []
    later = refused
    names = ", ".join(os.path.basename(folder) for folder in later)
    if checkpoint is None:
        if overwrite_output_dir:
            return None, warnings, []
        raise ValueError(
            f"`output_dir` {output_dir} already holds checkpoints (latest: {os.path.basename(later[-1])}). Resume "
            "with `--resume_from_checkpoint last`, pick another `--output_dir`, pass `--later_checkpoints move_aside` "
            f"to move them into {output_dir}/superseded-<time>/ and start over, or pass `--overwrite_output_dir true` "
            "to delete them and start over in it (Python API: `train(resume_from_checkpoint=True)`, another "
            '`output_dir`, or `later_checkpoints="move_aside"`).'
        )
    raise ValueError(
        f"Resuming {checkpoint}, but {output_dir} also holds later checkpoints ({names}): a run that got further. "
        "Left there, `--resume_from_checkpoint last` would bring that run back if this one stops before their steps. "
        'Pass `--later_checkpoints move_aside` (Python API: `later_checkpoints="move_aside"`) to move them into '
        f"{output_dir}/superseded-<time>/, or resume the newest one with `--resume_from_checkpoint last`."
    )


def move_aside(output_dir: str, folders: list[str]) -> str | None:
    """Move `folders` into `output_dir/superseded-<UTC time>/` (nothing is deleted); returns that folder."""
    if not folders:
        return None
    base = os.path.join(output_dir, time.strftime("superseded-%Y%m%d-%H%M%S", time.gmtime()))
    target = base
    for attempt in itertools.count(1):  # a folder of its own: two moves within one second must not collide
        try:
            os.makedirs(target)
            break
        except FileExistsError:
            target = f"{base}-{attempt}"
    for folder in folders:
        uncommit(folder)  # `last` must never pick a copy of it up, whatever happens to `target` later
        os.rename(folder, os.path.join(target, os.path.basename(folder)))
    return target


# ----------------------------------------------------------------------------------------------------------------
# One run per output_dir: a lock that names its owner and goes stale when the owner is dead
# ----------------------------------------------------------------------------------------------------------------
def _process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux `/proc`), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_alive(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    start = owner.get("process_start")
    return start is None or _process_start(pid) in (None, start)


def read_lock(output_dir: str) -> dict[str, Any] | None:
    """The owner recorded in `output_dir`'s lock file, or None (no lock, or an unreadable one)."""
    return _read_json_object(os.path.join(output_dir, LOCK_FILE))


def acquire_lock(output_dir: str) -> list[str]:
    """Take `output_dir`'s lock for this process (main process only); returns warnings to log.

    A lock held by a live process on this host is refused; one whose owner is dead (a preempted or killed run) is
    stale and taken over, so a run never blocks its own resume. An owner on another host cannot be checked: its lock
    is taken over with a warning naming it (the lock guards against a second run on the same machine).

    Raises:
        RuntimeError: naming the live owner and what to do.
    """
    os.makedirs(output_dir, exist_ok=True)
    host, pid = socket.gethostname(), os.getpid()
    owner = read_lock(output_dir)
    warnings = []
    if owner is not None and owner.get("pid") == pid and owner.get("host") == host:
        return warnings  # this process holds it already (`cegppo train` takes it before the model loads)
    if owner is not None and owner.get("host") == host and _owner_alive(owner):
        raise RuntimeError(
            f"{output_dir} is being written by another live run (pid {owner.get('pid')} on {host}, started "
            f"{owner.get('started')}; lock file {LOCK_FILE}). Two runs into one `output_dir` overwrite each other's "
            "checkpoints: wait for it to end (or stop it), or pick another `output_dir`."
        )
    if owner is not None and owner.get("host") != host:
        warnings.append(
            f"{output_dir} was locked by pid {owner.get('pid')} on {owner.get('host')} (started "
            f"{owner.get('started')}), which cannot be checked from {host}; taking the lock over. Make sure that run "
            "is gone: two runs into one `output_dir` overwrite each other's checkpoints."
        )
    record = {
        "host": host,
        "pid": pid,
        "process_start": _process_start(pid),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _write_json(os.path.join(output_dir, LOCK_FILE), record)
    return warnings


def release_lock(output_dir: str) -> None:
    """Remove `output_dir`'s lock if this process holds it."""
    owner = read_lock(output_dir)
    if owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname():
        try:
            os.remove(os.path.join(output_dir, LOCK_FILE))
        except FileNotFoundError:
            pass


def start_run(args: Any, requested: object, log: Any) -> str | None:
    """The checkpoint every process of a run resumes (None: a fresh run), decided once by the main process.

    The main process takes the `output_dir` lock, plans the resume (`plan_resume`), moves later checkpoints aside
    when `later_checkpoints="move_aside"` and logs the warnings; its answer (or its refusal) is broadcast, so every
    process resumes the same folder even if `output_dir` changes meanwhile. `log` takes a warning string.

    Raises:
        ValueError, RuntimeError: the main process's refusal, on every process.
    """
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    answer: list[Any] = [None, None]
    if state.is_main_process:
        output_dir = args.output_dir
        try:
            warnings = acquire_lock(output_dir) if getattr(args, "should_save", True) else []
            checkpoint, more, later = plan_resume(output_dir, requested, getattr(args, "later_checkpoints", "refuse"))
            target = move_aside(output_dir, later)
            if target is not None:
                more.append(
                    f"`later_checkpoints=move_aside`: moved {', '.join(map(os.path.basename, later))} into {target}."
                )
            for warning in warnings + more:
                log(warning)
            answer = [checkpoint, None]
        except (ValueError, RuntimeError) as error:
            release_lock(output_dir)
            answer = [None, (type(error).__name__, str(error))]
    if state.num_processes > 1:
        broadcast_object_list(answer, from_process=0)
    if answer[1] is not None:
        raise {"ValueError": ValueError, "RuntimeError": RuntimeError}[answer[1][0]](answer[1][1])
    return answer[0]


def remove_checkpoints(output_dir: str) -> list[str]:
    """Delete every `checkpoint-*` folder of `output_dir` (an earlier run's, when starting over); returns them."""
    folders = checkpoint_folders(output_dir)
    for folder in folders:
        shutil.rmtree(folder)
    return folders
