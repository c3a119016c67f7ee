"""What a CE-GPPO checkpoint holds beside transformers' files, when it is committed, and which one a run resumes.

`cegppo_state.json` (JSON only) holds the settings a resume is compared with, the controller and run state, and the
settings changed on resume. A checkpoint is committed once `cegppo_commit.json` exists: each process fsyncs the files
it wrote and reports names, sizes and CRC-32s, gathered to the saving processes, which write the record last (fsync,
rename); nothing lists another process's files, so per-node disks work. Rotation is transformers' rule run over
committed folders only. One plan per launch (`start_run`: main process, broadcast) holds the `output_dir` lock
(`flock`, released by the kernel at death), picks the checkpoint and words each message once. The layer's own files
in `output_dir` have `_` names, which transformers' Hub uploads skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .config import check_later_checkpoints

CEGPPO_STATE_FILE = "cegppo_state.json"
CEGPPO_STATE_FORMAT = 1
COMMIT_FILE = "cegppo_commit.json"
COMMIT_FORMAT = 2  # 2: {name: [size, crc32]}; 1 (cegppo-trl 0.3): {name: size}
LOCK_FILE = "_cegppo_run.lock"  # also the mark that a run began in this folder (a requeue may start it afresh)
SUPERSEDED_PREFIX = "_superseded-"
TRAINER_STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME
# Settings that change the objective, the batch or the run's length: a resume that changes one is named, old -> new.
RESUME_COMPARED_FIELDS = (
    "loss_type", "epsilon", "epsilon_high", "delta", "delta_low", "delta_low_mode", "beta", "num_generations",
    "steps_per_generation", "gradient_accumulation_steps", "per_device_train_batch_size", "world_size",
    "num_iterations", "importance_sampling_level", "scale_rewards", "gppo_beta1", "gppo_beta2",
    "gppo_beta1_schedule", "gppo_beta2_schedule", "entropy_controller", "sft_loss_coef", "dynamic_sampling",
    "max_completion_length", "temperature", "learning_rate", "lr_scheduler_type", "max_steps",
)  # fmt: skip
# Files a resume loads as data: a change after the commit means damage, not a callback's note.
_LOADED = re.compile(r"(\.(safetensors|bin|pt|pth|distcp)|^latest)$")
# A process's own files carry its rank (transformers' RNG state, DeepSpeed's ZeRO shards, DCP's shards); the others
# are written by the saving process of each node.
_RANK = re.compile(r"rng_state_(\d+)\.pth$|zero_pp_rank_(\d+)_|__(\d+)_\d+\.distcp$")


# JSON state files
def _write_json(path: str, record: dict[str, Any]) -> None:
    """Write `record` to `path` durably and atomically (temporary file of this process, fsync, rename, fsync dir)."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(os.path.dirname(path))


def _read_json(path: str) -> Any:
    """The JSON in `path`, or None when missing or unreadable."""
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    with contextlib.suppress(OSError):  # some file systems refuse to sync a directory
        os.fsync(fd)
    os.close(fd)


def state_record(
    args: Any, controller_state: dict | None, run_state: dict | None = None, history: list | None = None
) -> dict[str, Any]:
    """The content of `cegppo_state.json`: settings, controller state, run state, settings changed on resume."""
    settings = {name: getattr(args, name, None) for name in RESUME_COMPARED_FIELDS}
    record: dict[str, Any] = {"format": CEGPPO_STATE_FORMAT, "settings": settings, "commit": COMMIT_FILE}
    for key, value in (("controller", controller_state), ("run_state", run_state), ("history", history)):
        if value:
            record[key] = value
    return record


def read_state(checkpoint: str) -> dict[str, Any] | None:
    """The checkpoint's `cegppo_state.json`, or None when it has none; a ValueError when it is not a JSON object."""
    path = os.path.join(checkpoint, CEGPPO_STATE_FILE)
    state = _read_json(path) if os.path.exists(path) else {}
    if not isinstance(state, dict):
        raise ValueError(f"{path} is not a JSON object: the checkpoint is damaged.")
    return state or None


def changed_settings(state: dict[str, Any] | None, args: Any) -> dict[str, list] | None:
    """The compared settings of `args` that differ from `state`'s, as `{name: [old, new]}`; None: nothing recorded.

    A controller state that the new settings drop (no `entropy_controller` now) counts as a change.
    """
    if state is None:
        return None
    saved = state.get("settings")
    saved = saved if isinstance(saved, dict) else {}
    changes = {name: [saved[name], getattr(args, name, None)] for name in RESUME_COMPARED_FIELDS if name in saved}
    changes = {name: pair for name, pair in changes.items() if pair[0] != pair[1]}
    if getattr(args, "entropy_controller", None) is None and "controller" in state:
        changes.setdefault("entropy_controller", ["(state in the checkpoint)", None])
    return changes if saved or changes else None


def settings_history(state: dict[str, Any] | None, args: Any, step: int) -> list[dict[str, Any]]:
    """The settings changes of a run resumed at `step` from `state`: the checkpoint's history plus this resume's."""
    history = list((state or {}).get("history", []))
    changes = changed_settings(state, args)
    return history + ([{"step": step, "changes": changes}] if changes else [])


# The commit: every process reports what it wrote; the record is written last
def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            crc = zlib.crc32(chunk, crc)
    return crc


def own_files(folder: str, rank: int, writes_shared: bool) -> dict[str, list[int]]:
    """The files of `folder` this process wrote, each fsynced, as `{name: [size, crc32]}`.

    A file named with a rank is that process's; the others belong to the process that saves (`writes_shared`).
    """
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            relative = os.path.relpath(os.path.join(root, name), folder)
            owner = _RANK.search(name)
            owner = next(int(g) for g in owner.groups() if g is not None) if owner else None
            if relative == COMMIT_FILE or name.endswith(".tmp") or (owner is None and not writes_shared):
                continue
            if owner is None or owner == rank:
                path = os.path.join(folder, relative)
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
                files[relative] = [os.path.getsize(path), _crc32(path)]
    return files


def uncommit(folder: str) -> None:
    """Remove `folder`'s commit record before anything is rewritten in it."""
    try:
        os.remove(os.path.join(folder, COMMIT_FILE))
    except FileNotFoundError:
        return
    _fsync(folder)


def begin_checkpoint(folder: str, record: dict[str, Any]) -> None:
    """Start writing `folder` (saving processes): drop an old commit record, then write `cegppo_state.json`."""
    os.makedirs(folder, exist_ok=True)
    uncommit(folder)
    _write_json(os.path.join(folder, CEGPPO_STATE_FILE), record)


def write_commit(folder: str, world_size: int, files: dict[str, list[int]]) -> dict[str, Any]:
    """Write `folder`'s commit record naming `files` (gathered from every process sharing the folder)."""
    record = {"format": COMMIT_FORMAT, "world_size": world_size, "files": files}
    _write_json(os.path.join(folder, COMMIT_FILE), record)
    return record


def commit_after_save(trainer: Any, folder: str, run_dir: str, held: dict[str, Any], begun: set[str]) -> None:
    """After each process saved `folder`: report its files, gather, commit, rotate, then the held-back Hub push."""
    from accelerate.utils import gather_object

    args = trainer.args
    node = args.process_index - args.local_process_index  # processes of a node share its disk
    report = (node, own_files(folder, args.process_index, args.should_save))
    reports = gather_object([report]) if args.world_size > 1 else [report]
    if args.should_save:
        files = {}
        for where, names in reports:
            if where == node or not args.save_on_each_node:
                files.update(names)
        write_commit(folder, args.world_size, files)
        begun.discard(folder)
        for stale in [f for f in begun if checkpoint_step(f) < checkpoint_step(folder)]:
            shutil.rmtree(stale, ignore_errors=True)  # begun by this trainer, never committed, now superseded
            begun.discard(stale)
        rotate(run_dir, held["save_total_limit"], trainer.state.best_model_checkpoint)
    if held["push_to_hub"]:
        trainer._push_from_checkpoint(folder)


@contextlib.contextmanager
def held_until_commit(args: Any) -> Iterator[dict[str, Any]]:
    """Hold back the rotation and Hub push of transformers' `_save_checkpoint` (run right after process 0's
    `trainer_state.json`, before the others finished); `commit_after_save` runs them after the commit."""
    held = {"save_total_limit": args.save_total_limit, "push_to_hub": args.push_to_hub}
    args.save_total_limit, args.push_to_hub = None, False
    try:
        yield held
    finally:
        args.save_total_limit, args.push_to_hub = held["save_total_limit"], held["push_to_hub"]


# Reading a folder back: committed, torn, changed
def checkpoint_folders(output_dir: str) -> list[str]:
    """The `checkpoint-<step>` folders of `output_dir`, oldest step first."""
    if not output_dir or not os.path.isdir(output_dir):
        return []
    names = [n for n in os.listdir(output_dir) if re.fullmatch(r"checkpoint-\d+", n)]
    folders = [os.path.join(output_dir, n) for n in names if os.path.isdir(os.path.join(output_dir, n))]
    return sorted(folders, key=checkpoint_step)


def checkpoint_step(folder: str) -> int:
    """The step in a `checkpoint-<step>` folder's name (-1 for another name)."""
    match = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else -1


def is_committed(folder: str) -> bool:
    return os.path.isfile(os.path.join(folder, COMMIT_FILE))


def inspect(folder: str) -> tuple[str | None, list[str]]:
    """Why `folder` cannot be resumed (None: it can), and the files changed since its commit (a callback's).

    A committed folder is damaged when a file its record names is missing, or one that a resume loads (weights,
    optimizer, RNG, shards) differs in size or CRC-32. A folder without a record is torn when this trainer began it
    (`cegppo_state.json` names the record); another trainer's (or an older cegppo-trl's) keeps the older rule: its
    `trainer_state.json` is readable.
    """
    try:
        state = read_state(folder)
    except ValueError:
        return f"{CEGPPO_STATE_FILE} is not readable JSON", []
    changed = []
    if is_committed(folder):
        record = _read_json(os.path.join(folder, COMMIT_FILE))
        if not isinstance(record, dict) or not isinstance(record.get("files"), dict):
            return f"{COMMIT_FILE} is not a readable commit record", []
        for name, expected in record["files"].items():
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                return f"{name} is missing (named in {COMMIT_FILE})", []
            size, crc = (expected, None) if isinstance(expected, int) else expected
            now = os.path.getsize(path)
            if now != size or (crc is not None and _crc32(path) != crc):
                if _LOADED.search(name):
                    return f"{name} differs from {COMMIT_FILE} ({now} bytes, recorded {size}): damaged", []
                changed.append(name)
    elif state is not None and state.get("commit") == COMMIT_FILE:
        return f"{COMMIT_FILE} is missing: the run stopped before every process had written its files", []
    if not isinstance(_read_json(os.path.join(folder, TRAINER_STATE_FILE)), dict):
        missing = not os.path.exists(os.path.join(folder, TRAINER_STATE_FILE))
        return f"{TRAINER_STATE_FILE} is {'missing' if missing else 'not readable JSON'}", []
    return None, changed


def incomplete_reason(folder: str) -> str | None:  # why `folder` cannot be resumed, or None
    return inspect(folder)[0]


def last_complete_checkpoint(output_dir: str) -> tuple[str | None, dict[str, str]]:
    """The newest resumable checkpoint of `output_dir` (or None), and the newer folders passed over, with why."""
    skipped = {}
    for folder in reversed(checkpoint_folders(output_dir)):
        reason = incomplete_reason(folder)
        if reason is None:
            return folder, skipped
        skipped[folder] = reason
    return None, skipped


def rotate(run_dir: str, save_total_limit: int | None, best_checkpoint: str | None = None) -> list[str]:
    """transformers' `rotate_checkpoints` rule over the committed folders of `run_dir`; returns the deleted ones.

    Only committed folders count and go: a hand-made folder, a torn one or another trainer's is never touched.
    """
    committed = [os.path.normpath(f) for f in checkpoint_folders(run_dir) if is_committed(f)]
    if not save_total_limit or save_total_limit <= 0 or len(committed) <= save_total_limit:
        return []
    protected = {committed[-1]} | ({os.path.normpath(best_checkpoint)} if best_checkpoint else set())
    doomed = [f for f in committed if f not in protected][: len(committed) - max(save_total_limit, len(protected))]
    for folder in doomed:
        uncommit(folder)  # a kill mid-delete leaves a torn folder, never a committed one missing files
        shutil.rmtree(folder, ignore_errors=True)
    return doomed


# One run per output_dir: a kernel lock
def acquire_lock(output_dir: str) -> tuple[int, bool]:
    """`flock` `output_dir/_cegppo_run.lock` until `release_lock` or death; returns the descriptor and whether the
    file was there before (a run began here). Raises RuntimeError when another live process holds it."""
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK_FILE)
    existed = os.path.exists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RuntimeError(
            f"{output_dir} is being written by another live run (it holds {path}). Two runs into one `output_dir` "
            "overwrite each other's checkpoints: wait for it to end (or stop it), or pick another `output_dir`."
        ) from None
    return fd, existed


def release_lock(fd: int | None) -> None:  # the file stays: it marks that a run began here
    if fd is not None:
        os.close(fd)


# The resume plan
@dataclass
class ResumePlan:
    """What a launch resumes, made once by the main process and shared by every process."""

    checkpoint: str | None = None
    finished: bool = False  # the checkpoint is at the end of the run: nothing left to train
    messages: list[str] = field(default_factory=list)
    lock: int | None = None  # the main process's lock descriptor

    def release(self) -> None:
        release_lock(self.lock)
        self.lock = None


def _wanted(requested: object) -> object:
    """`resume_from_checkpoint` as None (fresh), "last", or a path."""
    if isinstance(requested, str) and requested.strip().lower() in ("", "none", "null", "false"):
        return None
    if requested is True or (isinstance(requested, str) and requested.strip().lower() in ("true", "last")):
        return "last"
    return None if requested is False else requested


def _resume_messages(checkpoint: str, args: Any, changed_files: list[str]) -> tuple[list[str], bool]:
    """What resuming `checkpoint` tells the user (once), and whether it leaves nothing to train."""
    state = read_state(checkpoint)
    trainer_state = _read_json(os.path.join(checkpoint, TRAINER_STATE_FILE)) or {}
    step, epoch = int(trainer_state.get("global_step", 0)), trainer_state.get("epoch")
    max_steps, epochs = getattr(args, "max_steps", -1), getattr(args, "num_train_epochs", float("inf"))
    if max_steps > 0 and step > max_steps:  # not a requeue (its `max_steps` is the run's): a changed length
        raise ValueError(
            f"`max_steps={max_steps}` but {checkpoint} is already at global step {step}: resuming it would train 0 "
            "steps and save that checkpoint's weights as the final model. `max_steps` counts the whole run, not the "
            f"steps after the checkpoint: set it above {step} to train on, or resume an earlier checkpoint."
        )
    if max_steps > 0 and step >= max_steps or max_steps <= 0 and isinstance(epoch, (int, float)) and epoch >= epochs:
        length = f"max_steps={max_steps}" if max_steps > 0 else f"num_train_epochs={epochs:g}"
        return [
            f"Nothing left to train: {checkpoint} is at global step {step} and the run ends there (`{length}`). "
            f"The final model is written from it if `{args.output_dir}` does not hold one. `max_steps` counts the "
            f"whole run: set it above {step} to train on."
        ], True
    text = f"Resuming from {checkpoint} (global step {step})."
    if state is None:
        text += (
            f" It has no {CEGPPO_STATE_FILE} (written by another trainer or an older cegppo-trl): no settings to "
            f"compare, and it counts as complete because its {TRAINER_STATE_FILE} is readable."
        )
    changes = changed_settings(state, args) or {}
    if changes:
        text += " Settings that differ from the checkpoint's (the run follows the new ones): " + "; ".join(
            f"{name}: {old!r} -> {new!r}" for name, (old, new) in changes.items()
        )
        text += "."
    if getattr(args, "entropy_controller", None) is not None and "controller" not in (state or {}):
        text += (
            " It holds no entropy-controller state, so the controller starts fresh at the resumed step: no offset on "
            "the nominal beta1/beta2 and an empty measurement window."
        )
    if changed_files:
        text += (
            f" Changed since its commit (by a callback or by hand; not loaded on resume): {', '.join(changed_files)}."
        )
    return [text], False


def plan_resume(
    output_dir: str, requested: object, args: Any, later_checkpoints: str = "refuse", own: set[str] | None = None,
    began_here: bool = False,
) -> tuple[ResumePlan, list[str]]:  # fmt: skip
    """Which checkpoint a launch resumes, its messages, and the later checkpoints to move aside (or delete).

    `requested`: None/False (fresh), True/"last" (the newest resumable checkpoint; none there is a fresh start when
    `began_here`, the requeue of a run killed before its first checkpoint), or a path (refused when not resumable).
    Later committed checkpoints belong to a run that went further: `last` would bring it back, so they are refused
    unless `later_checkpoints` is "move_aside" (or "delete": the CLI's `--overwrite_output_dir` on a fresh run), or
    they are `own` (this trainer's, from an earlier `train()`: moved aside).

    Raises:
        ValueError: naming the folder, the reason and the way out.
    """
    if later_checkpoints != "delete":
        check_later_checkpoints(later_checkpoints)
    plan, wanted = ResumePlan(), _wanted(requested)
    if wanted == "last":
        plan.checkpoint, skipped = last_complete_checkpoint(output_dir)
        passed = "; ".join(f"{os.path.basename(f)} ({reason})" for f, reason in skipped.items())
        if plan.checkpoint is None and not (began_here or skipped):
            raise ValueError(
                f"`resume_from_checkpoint={requested}` resumes the latest checkpoint in `output_dir`, but {output_dir} "
                "has no `checkpoint-*` folder and no run ever started there. Check `output_dir`, or start a new run "
                "without the flag."
            )
        if plan.checkpoint is None and not began_here:
            raise ValueError(
                f"`resume_from_checkpoint={requested}` resumes the newest complete checkpoint in {output_dir}, but "
                f"no `checkpoint-*` folder there is complete: {passed}. Start a new run (`--overwrite_output_dir "
                "true` deletes them)."
            )
        if plan.checkpoint is None:
            plan.messages.append(
                f"`resume_from_checkpoint={requested}`: {output_dir} holds no complete checkpoint yet, but a run began "
                f"there ({LOCK_FILE}): a requeue of a run stopped before its first checkpoint starts fresh"
                + (f"; {passed} is written again." if passed else ".")
            )
        elif skipped:
            plan.messages.append(
                f"Skipped the newer incomplete {passed}, which the run was writing when it stopped (it is written "
                "again when this run saves that step)."
            )
    elif isinstance(wanted, str) and os.path.isdir(wanted):
        reason = incomplete_reason(wanted)
        if reason is not None:
            newest, _ = last_complete_checkpoint(os.path.dirname(os.path.abspath(wanted)))
            fix = f"Resume {newest}, the newest complete checkpoint beside it." if newest else "Start a new run."
            raise ValueError(
                f"`resume_from_checkpoint={wanted}` is not a complete checkpoint ({reason}): a run stopped while "
                f"writing it, or it is not a `checkpoint-*` folder. {fix}"
            )
        plan.checkpoint = wanted
    elif wanted is not None:
        return ResumePlan(checkpoint=wanted), []  # not a folder: transformers says it cannot find it
    if plan.checkpoint is not None:
        messages, plan.finished = _resume_messages(plan.checkpoint, args, inspect(plan.checkpoint)[1])
        plan.messages += messages
    step = -1 if plan.checkpoint is None else checkpoint_step(plan.checkpoint)
    in_dir = plan.checkpoint is None or os.path.realpath(os.path.dirname(plan.checkpoint)) == os.path.realpath(
        output_dir
    )
    later = [f for f in checkpoint_folders(output_dir) if checkpoint_step(f) > step] if in_dir else []
    later = [f for f in later if incomplete_reason(f) is None]  # what `last` could bring back
    own = {os.path.realpath(f) for f in own or ()}
    if not later or later_checkpoints != "refuse" or all(os.path.realpath(f) in own for f in later):
        return plan, later
    names = ", ".join(os.path.basename(f) for f in later)
    where = f"{output_dir}/{SUPERSEDED_PREFIX}<time>/"
    if plan.checkpoint is None:
        raise ValueError(
            f"`output_dir` {output_dir} already holds checkpoints (latest: {os.path.basename(later[-1])}). Resume "
            "with `--resume_from_checkpoint last`, pick another `--output_dir`, pass `--later_checkpoints move_aside` "
            f"to move them into {where} and start over, or pass `--overwrite_output_dir true` to delete them and "
            "start over in it (Python API: `train(resume_from_checkpoint=True)`, another `output_dir`, or "
            '`CEGPPOConfig(later_checkpoints="move_aside")` to start over).'
        )
    raise ValueError(
        f"Resuming {plan.checkpoint}, but {output_dir} also holds later checkpoints ({names}): a run that got further. "
        "Left there, `--resume_from_checkpoint last` would bring that run back if this one stops before their steps. "
        'Pass `--later_checkpoints move_aside` (Python API: `later_checkpoints="move_aside"`) to move them into '
        f"{where}, or resume the newest one with `--resume_from_checkpoint last`."
    )


def move_aside(output_dir: str, folders: list[str]) -> str | None:
    """Rename `folders` into `output_dir/_superseded-<UTC time>/`, commit records and all; returns that folder."""
    if not folders:
        return None
    base = os.path.join(output_dir, time.strftime(f"{SUPERSEDED_PREFIX}%Y%m%d-%H%M%S", time.gmtime()))
    target, attempt = base, 0
    while os.path.exists(target):  # a folder of its own: two moves within one second must not collide
        attempt += 1
        target = f"{base}-{attempt}"
    os.makedirs(target)  # the output_dir lock is held: no other run picks the same name meanwhile
    for folder in folders:
        os.rename(folder, os.path.join(target, os.path.basename(folder)))
    _fsync(output_dir)
    return target


def start_run(
    args: Any, requested: object, log: Any, *, overwrite: bool = False, own: set[str] | None = None
) -> ResumePlan:
    """The launch's plan, made by the main process (lock, plan, moves, messages) and broadcast to every process.

    `overwrite`: the CLI's `--overwrite_output_dir` (a fresh run deletes the earlier run's checkpoints). Any error of
    the main process (a refusal, an `OSError` of the file system) is broadcast too and raised on every process.

    Raises:
        ValueError, RuntimeError, OSError: the main process's, on every process.
    """
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    plan, answer = ResumePlan(), [None, False, None]
    if state.is_main_process:
        try:
            output_dir = args.output_dir
            if getattr(args, "should_save", True):
                plan.lock, began_here = acquire_lock(output_dir)
            else:
                began_here = os.path.exists(os.path.join(output_dir, LOCK_FILE))
            mode = (
                "delete" if overwrite and _wanted(requested) is None else getattr(args, "later_checkpoints", "refuse")
            )
            made, later = plan_resume(output_dir, requested, args, mode, own, began_here)
            made.lock, plan = plan.lock, made
            if later and mode == "delete":
                for folder in later:
                    shutil.rmtree(folder)
                plan.messages.append(
                    f"`overwrite_output_dir`: removed the earlier run's checkpoints from {output_dir} "
                    f"({', '.join(map(os.path.basename, later))}), so that `last` can only pick up this run's."
                )
            elif later:
                target = move_aside(output_dir, later)
                plan.messages.append(
                    f"Moved {', '.join(map(os.path.basename, later))} into {target} (resumable there)."
                )
            for message in plan.messages:
                log(message)
            answer = [plan.checkpoint, plan.finished, None]
        except Exception as error:  # every process must hear of it, or the others wait at the broadcast
            plan.release()
            kind = "OSError" if isinstance(error, OSError) else type(error).__name__
            answer = [None, False, (kind, str(error))]
    if state.num_processes > 1:
        broadcast_object_list(answer, from_process=0)
    if answer[2] is not None:
        kind = {"ValueError": ValueError, "OSError": OSError}.get(answer[2][0], RuntimeError)
        raise kind(answer[2][1])
    plan.checkpoint, plan.finished = answer[0], answer[1]
    return plan
