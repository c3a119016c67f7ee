"""Checkpoints as torch DCP and Orbax do them: a marker written last. The protocol, in the order the code follows:

1. Commit, after everything that writes into the folder (transformers, then every callback's `on_save`): its owner
   (the main process; each node's under `save_on_each_node`) clears it and writes `cegppo_state.json` first; at the
   end every process fsyncs its files, a barrier, and the owner writes `cegppo_commit.json` by atomic rename: each
   file's size, the SHA-256 of the two state files, the run. Resumable iff marked and matching (a stat per file, two
   small reads), or another trainer's (`trainer_state.json`, nothing of this library: transformers' checks apply).
2. `last` is the newest resumable `checkpoint-<step>`, a marked one first; each newer one is named with its reason.
3. One run per `output_dir`. A resume continues its checkpoint's run and moves the run's later marked checkpoints
   aside. A launch is refused while `output_dir` holds a resumable marked checkpoint of another run (the way out:
   `--overwrite_output_dir`, deleting exactly those, or another folder). Rotation is transformers' rule over this
   run's marked checkpoints (transformers' own is held back). No rule deletes any other folder.
4. Same run. A resume names, old -> new, every setting that differs from the checkpoint's (all config fields but
   `config.SAFE_TO_CHANGE`, the script's arguments). A `save_only_model` checkpoint is not resumed.
5. Lock. `flock` on `output_dir/_cegppo_run.lock` for the run's life (released by the kernel at death), close-on-exec
   and closed in forked children; where the file system refuses it, one warning naming the file.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import uuid
from dataclasses import dataclass, field
from typing import Any

from .config import changed_settings, run_settings

CEGPPO_STATE_FILE = "cegppo_state.json"
COMMIT_FILE = "cegppo_commit.json"
COMMIT_FORMAT = 3  # 3: sizes, state hashes, run; 2 (0.4): {name: [size, crc32]}; 1 (0.3): {name: size}
LOCK_FILE = "_cegppo_run.lock"
TRAINER_STATE_FILE = "trainer_state.json"  # transformers' TRAINER_STATE_NAME


def _write_json(path: str, record: dict[str, Any]) -> None:
    """Write `record` to `path` durably and atomically (temporary file of this process, fsync, rename, fsync dir)."""
    with open(tmp := f"{path}.{os.getpid()}.tmp", "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync(os.path.dirname(path))


def _read_json(path: str) -> Any:  # None when missing or unreadable
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        return json.load(f)


def _fsync(path: str) -> None:
    with contextlib.suppress(OSError):  # gone meanwhile (a writer's rename), or a directory the FS will not sync
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _sha256(path: str) -> str | None:
    with contextlib.suppress(OSError), open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _files(folder: str) -> list[str]:  # `folder`'s files, relative, but the marker and temporary files
    names = [os.path.relpath(os.path.join(r, n), folder) for r, _, files in os.walk(folder) for n in files]
    return sorted(n for n in names if n != COMMIT_FILE and not n.endswith(".tmp"))


def read_state(checkpoint: str) -> dict[str, Any]:  # its `cegppo_state.json`; {} when it has none
    state = _read_json(os.path.join(checkpoint, CEGPPO_STATE_FILE))
    return state if isinstance(state, dict) else {}


# 1. Commit
def begin_checkpoint(folder: str, record: dict[str, Any]) -> None:
    """Start writing `folder` (its owner, first; a barrier before the others write): an earlier save's files go,
    marker first (a step saved again lists only what this save writes), then `cegppo_state.json`."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, COMMIT_FILE))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, exist_ok=True)
    _write_json(os.path.join(folder, CEGPPO_STATE_FILE), record)


def commit(folder: str, owner: bool, run: str | None, barrier: Any, save_only_model: bool = False) -> None:
    """Rule 1, on every process once each wrote its files into `folder`: fsync, barrier, the owner's marker."""
    for path in [*(os.path.join(folder, name) for name in _files(folder)), folder]:
        _fsync(path)
    barrier()
    if owner:
        files = {name: os.path.getsize(os.path.join(folder, name)) for name in _files(folder)}
        state = {n: _sha256(os.path.join(folder, n)) for n in (TRAINER_STATE_FILE, CEGPPO_STATE_FILE) if n in files}
        record = {"format": COMMIT_FORMAT, "run": run, "save_only_model": save_only_model, "files": files}
        _write_json(os.path.join(folder, COMMIT_FILE), {**record, "state": state})


def marker(folder: str) -> dict[str, Any] | None:  # `folder`'s marker; None: not a committed checkpoint
    record = _read_json(os.path.join(folder, COMMIT_FILE))
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def damage(folder: str) -> str | None:
    """Why `folder` cannot be resumed, or None: marked and matching, or another trainer's (no marker, no
    `cegppo_state.json`, transformers' `trainer_state.json`)."""
    if (record := marker(folder)) is None:
        if os.path.exists(os.path.join(folder, CEGPPO_STATE_FILE)):
            return f"it has no {COMMIT_FILE}: a run of this library began it and did not commit it"
        trainers = os.path.isfile(os.path.join(folder, TRAINER_STATE_FILE))
        return None if trainers else f"it has neither {COMMIT_FILE} nor {TRAINER_STATE_FILE}: not a checkpoint"
    for name, size in record["files"].items():
        size = size[0] if isinstance(size, list) else size  # format 2 also held a CRC-32, no longer read
        now = os.path.getsize(path) if os.path.isfile(path := os.path.join(folder, name)) else None
        if now != size:
            return f"{name} is {'missing' if now is None else f'{now} bytes'}, its marker says {size} bytes"
    for name, digest in (record.get("state") or {}).items():
        if _sha256(os.path.join(folder, name)) != digest:
            return f"{name} changed after the commit (its SHA-256 differs from the marker's)"
    only = "it was saved with `save_only_model=True`: no optimizer, learning-rate schedule or RNG state to resume. To"
    if record.get("save_only_model"):
        return f"{only} train on from its weights, start a new run with it as the model"
    return None


# 2. `last`, and the folders of `output_dir`
def checkpoint_step(folder: str) -> int | None:  # the step of a `checkpoint-<step>` folder; None for another name
    match = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def checkpoint_folders(output_dir: str) -> list[str]:
    """The `checkpoint-<step>` folders of `output_dir`, oldest step first (marked or not)."""
    names = os.listdir(output_dir) if output_dir and os.path.isdir(output_dir) else []
    folders = [os.path.join(output_dir, n) for n in names if checkpoint_step(n) is not None]
    return sorted((f for f in folders if os.path.isdir(f)), key=checkpoint_step)


# 3. One run per `output_dir`: rotation over this run's marked checkpoints
def rotate(run_dir: str, save_total_limit: int | None, best: str | None, run: str | None) -> list[str]:
    """transformers' `rotate_checkpoints` rule (oldest first; the newest and the best kept) over the marked
    checkpoints of `run` in `run_dir`; returns the deleted folders. The marker goes first: a kill mid-delete leaves
    an unmarked folder, never a marked one missing files."""
    own = [os.path.normpath(f) for f in checkpoint_folders(run_dir) if (m := marker(f)) and m.get("run") == run]
    kept = set(own[-1:]) | ({os.path.normpath(best)} & set(own) if best else set())
    excess = len(own) - max(save_total_limit, len(kept)) if save_total_limit and save_total_limit > 0 else 0
    doomed = [f for f in own if f not in kept][: max(excess, 0)]
    for folder in doomed:
        os.remove(os.path.join(folder, COMMIT_FILE))
        shutil.rmtree(folder, ignore_errors=True)
    return doomed


# 2-4. The launch plan
@dataclass
class ResumePlan:
    """What a launch resumes and the run it continues, made once by the main process and shared by every process."""

    checkpoint: str | None = None
    finished: bool = False  # the checkpoint is at the end of the run: nothing left to train
    run: str | None = None  # the run's id, in each of its markers (None: a cegppo-trl 0.4 run)
    messages: list[str] = field(default_factory=list)
    lock: int | None = None  # the main process's lock descriptor
    settings: dict = field(default_factory=dict)  # `config.run_settings` now: what this run's checkpoints record
    changes: dict = field(default_factory=dict)  # the settings that differ from the resumed checkpoint's
    superseded: list = field(default_factory=list)  # the run's committed checkpoints past the resumed one

    def release(self) -> None:
        self.lock = release_lock(self.lock)  # None


def _wanted(requested: object) -> object:  # `resume_from_checkpoint` as None (fresh), "last", or a path
    word = requested.strip().lower() if isinstance(requested, str) else requested
    none, last = word in ("", "none", "null", "false", None, False), word in (True, "true", "last")
    return None if none else "last" if last else requested


def _changes(state: dict, args: Any, script: dict | None) -> dict[str, list]:  # rule 4, the script's arguments too
    old, now = (state.get("settings") or {}).get("script") or {}, json.loads(json.dumps(script or {}, default=str))
    changed = {k: [v, now.get(k)] for k, v in old.items() if script is not None and now.get(k) != v}
    return {**changed_settings(state, args), **changed}


def _resume_message(checkpoint: str, args: Any, script: dict | None = None) -> tuple[str, bool, int]:
    """What resuming `checkpoint` tells the user (once), whether it leaves nothing to train, and its step."""
    trainer_state = _read_json(os.path.join(checkpoint, TRAINER_STATE_FILE)) or {}
    step, epoch, max_steps = int(trainer_state.get("global_step", 0)), trainer_state.get("epoch"), args.max_steps
    if max_steps > 0 and step >= max_steps or max_steps <= 0 and (epoch or 0) >= args.num_train_epochs:
        if step > max_steps > 0:  # not a requeue (its `max_steps` is the run's): a changed length
            raise ValueError(f"`max_steps={max_steps}` but {checkpoint} is at global step {step}: resuming it would "
                             f"train 0 steps. `max_steps` counts the whole run: set it above {step}.")  # fmt: skip
        text = f"Nothing left to train: {checkpoint} is at global step {step}, the run's end. The final model is "
        return text + f"written from it into `{args.output_dir}`. Raise `max_steps` to go on.", True, step
    state, text = read_state(checkpoint), f"Resuming from {checkpoint} (global step {step})."
    if changes := _changes(state, args, script):
        changed = "; ".join(f"{name}: {old!r} -> {new!r}" for name, (old, new) in changes.items())
        text += f" Settings that differ from the checkpoint's (the run follows the new ones): {changed}."
    if getattr(args, "entropy_controller", None) is not None and "controller" not in state:
        text += " It holds no entropy-controller state, so the controller starts fresh at the resumed step."
    no_record = " It carries no commit record (another trainer wrote it): only transformers' own checks apply."
    return text + no_record * (marker(checkpoint) is None), False, step


def plan_resume(output_dir: str, requested: object, args: Any, run: str | None = None, script: dict | None = None
                ) -> tuple[ResumePlan, list[str]]:  # fmt: skip
    """Rules 2-4: the checkpoint a launch resumes, the run it continues (`run`: a fresh start's, for a second
    `train()` of one trainer), the marked folders rule 3 refuses beside it, the run's later ones (`superseded`)."""
    plan, wanted, step = ResumePlan(run=run or uuid.uuid4().hex), _wanted(requested), None
    folders = checkpoint_folders(output_dir)
    why = {f: damage(f) for f in folders}
    ok = [f for f in folders if why[f] is None]
    if wanted == "last":  # the newer folders are named; on a fresh start, those it does not resume (rules 2, 3)
        plan.checkpoint = ([f for f in ok if marker(f)] or ok or [None])[-1]
        skipped = [f for f in folders if not plan.checkpoint or checkpoint_step(f) > checkpoint_step(plan.checkpoint)]
    elif wanted is not None:
        plan.checkpoint, skipped = str(wanted), []
        if not os.path.isdir(plan.checkpoint):
            raise ValueError(f"Can't find a valid checkpoint at {wanted}: no such folder. Give one, or `last`.")
        if (reason := damage(plan.checkpoint)) is not None:
            raise ValueError(f"{plan.checkpoint} cannot be resumed ({reason}). Resume another one.")
    else:
        skipped = [f for f in folders if f not in ok or not marker(f)]
    names = [f"{os.path.basename(f)} ({why[f] or 'another trainer wrote it'})" for f in skipped]
    plan.messages += [f"{output_dir}: passed over {'; '.join(names)}."] * bool(names)
    if wanted == "last" and plan.checkpoint is None:
        message = f"`resume_from_checkpoint={requested}`: {output_dir} holds no committed checkpoint: a fresh start."
        plan.messages.append(message + " (The first launch of a requeued command line.)")
    if plan.checkpoint is not None:
        text, plan.finished, step = _resume_message(plan.checkpoint, args, script)
        plan.run, plan.messages = (marker(plan.checkpoint) or {"run": plan.run}).get("run"), [*plan.messages, text]
    resumed, past = plan.checkpoint and os.path.realpath(plan.checkpoint), float("inf") if step is None else step
    others = [f for f in ok if marker(f) and os.path.realpath(f) != resumed]
    plan.superseded = [f for f in others if marker(f).get("run") == plan.run and checkpoint_step(f) > past]
    return plan, [f for f in others if marker(f).get("run") != plan.run]


def refusal(plan: ResumePlan, blocking: list[str], output_dir: str) -> str:  # rule 3's words, for `cegppo check` too
    return (f"{f'Resuming {plan.checkpoint}' if plan.checkpoint else 'A new run'} into {output_dir}, which holds "
            f"committed checkpoints of another run ({', '.join(map(os.path.basename, blocking))}"
            "): `last` would pick them up after a stop. Resume the newest with `--resume_from_checkpoint last` (Python "
            "API: `train(resume_from_checkpoint=True)`), pick another `--output_dir`, or delete them "
            "(`--overwrite_output_dir true`).")  # fmt: skip


def start_run(args: Any, resume: object, log: Any, *, overwrite: bool = False, run: str | None = None,
              script: dict | None = None) -> ResumePlan:  # fmt: skip
    """The launch's plan, made by the main process (lock, plan, rule 3's refusal or `overwrite`, messages) and
    broadcast; an error of the main process (ValueError, RuntimeError, OSError) is raised on every process."""
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState()
    plan, answer, lock = ResumePlan(), [None, False, None, None], None
    if state.is_main_process:
        try:
            lock = acquire_lock(args.output_dir, log) if getattr(args, "should_save", True) else None
            plan, blocking = plan_resume(args.output_dir, resume, args, run, script)
            plan.lock = lock
            if blocking and not overwrite:
                raise ValueError(refusal(plan, blocking, args.output_dir))
            for folder in blocking:
                os.remove(os.path.join(folder, COMMIT_FILE))
                shutil.rmtree(folder)
            deleted = ", ".join(map(os.path.basename, blocking))
            plan.messages += [f"`overwrite_output_dir`: deleted {deleted} from {args.output_dir}."] if blocking else []
            for folder in plan.superseded:  # `last` must not bring them back
                name = os.path.basename(folder)
                os.rename(folder, aside := os.path.join(args.output_dir, f"superseded-{name}-{uuid.uuid4().hex[:6]}"))
                plan.messages.append(f"Moved {name}, a later checkpoint of this run, aside: {aside}.")
            for message in plan.messages:
                log(message)
            answer = [plan.checkpoint, plan.finished, plan.run, None]
        except Exception as error:  # every process must hear of it, or the others wait at the broadcast
            release_lock(lock)
            answer[3] = ("OSError" if isinstance(error, OSError) else type(error).__name__, str(error))
    if state.num_processes > 1:
        broadcast_object_list(answer, from_process=0)
    if answer[3] is not None:
        raise {"ValueError": ValueError, "OSError": OSError}.get(answer[3][0], RuntimeError)(answer[3][1])
    plan.checkpoint, plan.finished, plan.run = answer[:3]
    plan.settings = run_settings(args)  # before `cegppo train` fills in `model_init_kwargs`: what a requeue compares
    plan.settings |= {"script": json.loads(json.dumps(script, default=str))} if script else {}
    plan.changes = _changes(read_state(plan.checkpoint), args, script) if plan.checkpoint else {}
    return plan


# 5. The lock (taken by `start_run`)
_HELD: set[int] = set()


def _close_held_in_child() -> None:  # a forked child (loader worker, reward subprocess) must not keep the lock
    while _HELD:
        os.close(_HELD.pop())


os.register_at_fork(after_in_child=_close_held_in_child)


def acquire_lock(output_dir: str, warn: Any = print) -> int | None:
    """`flock` `output_dir/_cegppo_run.lock` until `release_lock` or death; None (after one warning through `warn`)
    where the file system refuses it. Raises RuntimeError while another live process holds it."""
    os.makedirs(output_dir, exist_ok=True)
    fd = os.open(path := os.path.join(output_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:  # any: where `flock` is refused (ENOLCK, EACCES, EIO, ...), the run goes on unlocked
        os.close(fd)
        if isinstance(error, BlockingIOError):
            message = f"{output_dir} is written by another live run (it holds {path}): wait for it, or pick another."
            raise RuntimeError(message) from None
        warn(f"{path}: the file system refuses `flock` ({error.strerror or error}); nothing stops a second run from "
             "writing into this `output_dir` meanwhile. Training goes on: start one run per folder.")  # fmt: skip
        return None
    _HELD.add(fd)
    return fd


def release_lock(fd: int | None) -> None:
    if fd in _HELD:
        _HELD.discard(fd)
        os.close(fd)
