"""Checkpoints committed as torch DCP and Orbax commit theirs, by a marker written last; one live run per folder.

A save begins with a pending mark beside its folder; once every process and callback has written, a barrier, and the
owner writes `cegppo_commit.json` (each file's size). `True`/`"last"` resume the newest resumable `checkpoint-<step>`:
committed with every file at its size, or another trainer's. A `flock` keeps a second live run out of `output_dir`.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from typing import Any

COMMIT_FILE = "cegppo_commit.json"
LEGACY_STATE_FILE = "cegppo_state.json"  # earlier cegppo-trl's run state (read on resume, never written)
LOCK_FILE = "_cegppo_run.lock"


def _fsync(path: str) -> None:
    with contextlib.suppress(OSError):  # gone meanwhile, or a directory the file system will not sync
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _files(folder: str) -> list[str]:  # `folder`'s files, relative, but the marker and temporary files
    names = [os.path.relpath(os.path.join(r, n), folder) for r, _, files in os.walk(folder) for n in files]
    return sorted(n for n in names if not n.startswith(COMMIT_FILE) and not n.endswith(".tmp"))


def _pending(folder: str) -> str:  # beside the folder: transformers' Hub push of the folder leaves it out
    head, name = os.path.split(os.path.normpath(folder))
    return os.path.join(head, f"_cegppo_pending-{name}")


def read_json(path: str) -> Any:  # None when missing or unreadable
    with contextlib.suppress(OSError, ValueError), open(path) as f:
        return json.load(f)


def begin(folder: str) -> None:
    """The owner, before anything is written: an earlier save's folder goes (its marker first), the pending mark."""
    with contextlib.suppress(FileNotFoundError):
        os.remove(os.path.join(folder, COMMIT_FILE))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    open(_pending(folder), "w").close()
    _fsync(os.path.dirname(os.path.abspath(folder)))


def commit(folder: str, owner: bool, barrier: Any, save_only_model: bool = False) -> None:
    """Every process, once each wrote its files into `folder`: fsync, `barrier()`, the owner's marker."""
    for path in [*(os.path.join(folder, name) for name in _files(folder)), folder]:
        _fsync(path)
    barrier()
    if owner:
        files = {name: os.path.getsize(os.path.join(folder, name)) for name in _files(folder)}
        with open(tmp := os.path.join(folder, f"{COMMIT_FILE}.{os.getpid()}.tmp"), "w") as f:
            json.dump({"format": 4, "save_only_model": save_only_model, "files": files}, f)
        _fsync(tmp)
        os.replace(tmp, os.path.join(folder, COMMIT_FILE))
        _fsync(folder)
        with contextlib.suppress(FileNotFoundError):
            os.remove(_pending(folder))


def marker(folder: str) -> dict[str, Any] | None:  # `folder`'s marker when committed (formats 1-4), else None
    record = read_json(os.path.join(folder, COMMIT_FILE))
    return record if isinstance(record, dict) and isinstance(record.get("files"), dict) else None


def damage(folder: str) -> str | None:
    """Why `folder` cannot be resumed, or None."""
    if (record := marker(folder)) is None:
        if os.path.exists(_pending(folder)) or os.path.exists(os.path.join(folder, LEGACY_STATE_FILE)):
            return f"it has no {COMMIT_FILE}: a run of this library began it and did not finish it"
        if not os.path.isfile(os.path.join(folder, "trainer_state.json")):
            return f"it has neither {COMMIT_FILE} nor trainer_state.json: not a checkpoint"
        return None
    for name, size in record["files"].items():
        size = size[0] if isinstance(size, list) else size  # cegppo-trl 0.4 also held a CRC-32
        now = os.path.getsize(path) if os.path.isfile(path := os.path.join(folder, name)) else None
        if now != size:
            return f"{name} is {'missing' if now is None else f'{now} bytes'}, its marker says {size} bytes"
    if record.get("save_only_model"):
        return "it was saved with `save_only_model=True`: no optimizer, schedule or RNG state to resume"
    return None


def _step(folder: str) -> int | None:  # the step of a `checkpoint-<step>` folder; None for another name
    match = re.fullmatch(r"checkpoint-(\d+)", os.path.basename(os.path.normpath(folder)))
    return int(match.group(1)) if match else None


def checkpoint_folders(output_dir: str) -> list[str]:  # its `checkpoint-<step>` folders, oldest first
    names = os.listdir(output_dir) if output_dir and os.path.isdir(output_dir) else []
    folders = [os.path.join(output_dir, n) for n in names if _step(n) is not None]
    return sorted((f for f in folders if os.path.isdir(f)), key=_step)


def resolve(output_dir: str, requested: object) -> tuple[str | None, list[str]]:
    """The checkpoint `resume_from_checkpoint=requested` resumes (None: a fresh start) and what to tell the user.

    Raises:
        ValueError: `True` without a resumable checkpoint (transformers' words), or a path that cannot be resumed.
    """
    word = requested.strip().lower() if isinstance(requested, str) else requested
    if word in (None, False, "", "none", "false"):
        return None, []
    if word not in (True, "true", "last"):
        if os.path.isdir(path := str(requested)) and (why := damage(path)) is not None:
            raise ValueError(f"{path} cannot be resumed ({why}). Resume another checkpoint.")
        return path, [_resuming(path)] if os.path.isdir(path) else []  # a missing folder: transformers' own error
    folders = checkpoint_folders(output_dir)
    why = [damage(folder) for folder in folders]
    last = max((i for i, w in enumerate(why) if w is None), default=-1)  # the newest resumable
    checkpoint = folders[last] if last >= 0 else None
    newer = "; ".join(f"{os.path.basename(f)} ({w})" for f, w in zip(folders[last + 1 :], why[last + 1 :]))
    messages = [f"{output_dir}: passed over {newer}"] if newer else []
    if checkpoint is None and requested is True:
        raise ValueError(f"No valid checkpoint found in output directory ({output_dir})")
    fresh = f"`resume_from_checkpoint={requested}`: {output_dir} holds no committed checkpoint: a fresh start."
    return checkpoint, [*messages, fresh if checkpoint is None else _resuming(checkpoint)]


def _resuming(checkpoint: str) -> str:
    step = (read_json(os.path.join(checkpoint, "trainer_state.json")) or {}).get("global_step")
    return f"Resuming from {checkpoint} (global step {step})."


def other_runs(output_dir: str, own: set[str]) -> list[str]:  # committed checkpoints but `own` (real paths)
    return [f for f in checkpoint_folders(output_dir) if marker(f) and os.path.realpath(f) not in own]


def refusal(output_dir: str, others: list[str]) -> str:  # why a fresh run beside `others` is refused (`cegppo check`)
    return (f"A new run into {output_dir}, which holds committed checkpoints of another run "
            f"({', '.join(map(os.path.basename, others))}): `last` would resume them after a stop. Resume the newest "
            "with `--resume_from_checkpoint last` (Python API: `train(resume_from_checkpoint=True)`), pick another "
            "`--output_dir`, or delete them (`--overwrite_output_dir true`).")  # fmt: skip


_HELD: set[int] = set()  # the lock descriptors this process holds


def _close_held_in_child() -> None:  # a forked child (loader worker, reward subprocess) must not keep the lock
    while _HELD:
        os.close(_HELD.pop())


os.register_at_fork(after_in_child=_close_held_in_child)


def acquire_lock(output_dir: str, warn: Any = print) -> tuple[int | None, bool]:
    """`flock` `output_dir/_cegppo_run.lock`: its descriptor (None, after a warning, where the file system refuses
    `flock`) and whether `output_dir` was created for it. Raises RuntimeError while another live process holds it."""
    created = not os.path.isdir(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    fd = os.open(path := os.path.join(output_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:  # any: where `flock` is refused (ENOLCK, EACCES, EIO, ...), the run goes on unlocked
        os.close(fd)
        if isinstance(error, BlockingIOError):
            raise RuntimeError(f"{output_dir} is written by another live run (it holds {path}): wait for it, or pick "
                               "another.") from None  # fmt: skip
        warn(f"{path}: the file system refuses `flock` ({error.strerror or error}); nothing stops a second run from "
             "writing into this `output_dir` meanwhile. Training goes on: start one run per folder.")  # fmt: skip
        return None, created
    _HELD.add(fd)
    return fd, created


def release_lock(fd: int | None, output_dir: str, created: bool = False) -> None:
    """Let go of the lock; where the run saved nothing, its lock file (and the folder it created) go too."""
    if fd not in _HELD:
        return
    if os.listdir(output_dir) == [LOCK_FILE]:  # removed while locked: a waiting run then makes its own
        os.remove(os.path.join(output_dir, LOCK_FILE))
        if created:
            os.rmdir(output_dir)
    _HELD.discard(fd)
    os.close(fd)
