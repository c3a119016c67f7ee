"""The checkpoint protocol (`cegppo_trl.checkpoints`): a marker written last, `last`, one run per folder, the lock.

`test_item<k>_...` pins defect k of cegppo-trl 0.4's checkpoint layer (each failed on 0.4); the other tests pin the
protocol's rules.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from cegppo_trl import CEGPPOConfig
from cegppo_trl import checkpoints as cp
from cegppo_trl.checkpoints import (
    CEGPPO_STATE_FILE,
    COMMIT_FILE,
    LOCK_FILE,
    acquire_lock,
    begin_checkpoint,
    checkpoint_folders,
    commit,
    damage,
    plan_resume,
    release_lock,
    rotate,
    start_run,
)
from cegppo_trl.config import run_settings

ROOT = Path(__file__).resolve().parents[1]


def _args(output_dir: Path, **kw) -> CEGPPOConfig:
    return CEGPPOConfig(output_dir=str(output_dir), use_cpu=True, report_to="none", max_steps=100, **kw)


def _checkpoint(output_dir: Path, step: int, run: str | None = "run-a", *, mark: bool = True, name: str = "",
                args: CEGPPOConfig | None = None, save_only_model: bool = False) -> Path:  # fmt: skip
    """A checkpoint folder as the trainer writes it (tiny stand-in files), marked (committed) or not."""
    folder = output_dir / (name or f"checkpoint-{step}")
    settings = run_settings(args) if args is not None else {}
    begin_checkpoint(str(folder), {"format": 2, "settings": settings})
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    (folder / "optimizer.pt").write_bytes(b"o" * 32)
    (folder / "rng_state.pth").write_bytes(b"r" * 16)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.1, "max_steps": 100}))
    if mark:
        commit(str(folder), True, run, lambda: None, save_only_model)
    return folder


def _names(output_dir: Path) -> list[str]:
    return [Path(folder).name for folder in checkpoint_folders(str(output_dir))]


def _start(output_dir: Path, requested, messages: list | None = None, **kw) -> cp.ResumePlan:
    plan = start_run(_args(output_dir), requested, (messages if messages is not None else []).append, **kw)
    plan.release()
    return plan


# ----------------------------------------------------------------------------------------------------------------
# Rule 1: the marker, written last; resumable iff marked and matching
# ----------------------------------------------------------------------------------------------------------------
def test_the_marker_names_every_file_with_its_size_and_hashes_the_state_files(tmp_path):
    folder = _checkpoint(tmp_path, 2)
    record = json.loads((folder / COMMIT_FILE).read_text())
    assert record["files"] == {n: (folder / n).stat().st_size for n in sorted(os.listdir(folder)) if n != COMMIT_FILE}
    assert set(record["state"]) == {"trainer_state.json", CEGPPO_STATE_FILE} and record["run"] == "run-a"
    assert damage(str(folder)) is None
    (folder / "optimizer.pt").write_bytes(b"o" * 31)  # truncated
    assert "optimizer.pt is 31 bytes, its marker says 32 bytes" in damage(str(folder))


def test_a_folder_without_its_marker_is_not_a_checkpoint_and_last_passes_over_it_with_its_reason(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, mark=False)  # killed before the marker (or while a callback still wrote): torn
    messages = []
    assert _start(tmp_path, "last", messages).checkpoint == str(tmp_path / "checkpoint-2")
    assert messages[0] == (f"{tmp_path}: passed over checkpoint-4 (it has no cegppo_commit.json: a run of this library "
                           "began it and did not commit it).")  # fmt: skip
    with pytest.raises(ValueError, match=r"checkpoint-4 cannot be resumed \(it has no cegppo_commit.json: a run of"):
        _start(tmp_path, str(tmp_path / "checkpoint-4"))


def test_the_marker_waits_for_every_process_at_the_barrier(tmp_path):
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    seen = []
    commit(str(folder), True, "r", lambda: seen.append((folder / COMMIT_FILE).exists()))
    assert seen == [False] and (folder / COMMIT_FILE).exists()
    other = tmp_path / "checkpoint-2"
    other.mkdir()
    commit(str(other), False, "r", lambda: None)  # not the folder's owner: fsyncs only
    assert not (other / COMMIT_FILE).exists()


# ----------------------------------------------------------------------------------------------------------------
# The twelve defects of cegppo-trl 0.4's checkpoint layer
# ----------------------------------------------------------------------------------------------------------------
def test_item1_a_resume_from_outside_output_dir_into_another_runs_checkpoints_is_refused_and_never_deletes_them(
    tmp_path,
):
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    _checkpoint(out, 2, run="other")
    _checkpoint(out, 6, run="other")
    source = _checkpoint(elsewhere, 4, run="mine")
    with pytest.raises(ValueError, match=r"holds committed checkpoints of another run "
                       r"\(checkpoint-2, checkpoint-6\).*--overwrite_output_dir"):  # fmt: skip
        _start(out, str(source))
    # Rotation only ever counts this run's marked checkpoints, whatever lies beside them.
    mine = _checkpoint(out, 8, run="mine")
    assert rotate(str(out), 1, None, "mine") == [] and _names(out) == ["checkpoint-2", "checkpoint-6", "checkpoint-8"]
    _checkpoint(out, 10, run="mine")
    assert rotate(str(out), 1, None, "mine") == [os.path.normpath(mine)]
    assert _names(out) == ["checkpoint-2", "checkpoint-6", "checkpoint-10"]


def an_explicit_older_checkpoint_of_the_run_resumes_and_its_later_ones_are_moved_aside(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 6)
    messages = []
    plan = _start(tmp_path, str(tmp_path / "checkpoint-2"), messages)
    assert (plan.checkpoint, plan.run) == (str(tmp_path / "checkpoint-2"), "run-a")  # the run goes on from step 2
    assert _names(tmp_path) == ["checkpoint-2"]  # `last` cannot bring the later ones back
    moved = sorted(p.name for p in tmp_path.glob("superseded-*"))
    assert [name.rsplit("-", 1)[0] for name in moved] == ["superseded-checkpoint-4", "superseded-checkpoint-6"]
    assert messages[-2:] == [f"Moved checkpoint-{step}, a later checkpoint of this run, aside: {tmp_path / name}."
                             for step, name in zip((4, 6), moved)]  # fmt: skip
    assert all((tmp_path / name / COMMIT_FILE).exists() for name in moved)  # nothing deleted
    assert _start(tmp_path, str(tmp_path / "checkpoint-2")).run == "run-a"  # nothing left to move


def last_falls_back_to_the_newest_resumable_checkpoint_naming_each_one_passed_over(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, save_only_model=True)
    (_checkpoint(tmp_path, 6) / "optimizer.pt").write_bytes(b"o" * 5)  # damaged after its commit
    messages = []
    assert _start(tmp_path, "last", messages).checkpoint == str(tmp_path / "checkpoint-2")
    assert messages[0] == (
        f"{tmp_path}: passed over checkpoint-4 (it was saved with `save_only_model=True`: no optimizer, learning-rate "
        "schedule or RNG state to resume. To train on from its weights, start a new run with it as the model); "
        "checkpoint-6 (optimizer.pt is 5 bytes, its marker says 32 bytes)."
    )
    assert _names(tmp_path) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]  # passed over, not moved


def test_item4_the_repeat_sampler_draws_seed_plus_epoch_so_a_resumed_epoch_gets_the_uninterrupted_order():
    from trl.trainer.utils import RepeatSampler

    from cegppo_trl.checkpoint_hooks import EpochSeededRepeatSampler

    def sampler():
        s = RepeatSampler(list(range(16)), mini_repeat_count=1, batch_size=4, shuffle=True, seed=7)
        s.__class__ = EpochSeededRepeatSampler
        return s

    uninterrupted, orders = sampler(), []
    for epoch in range(3):
        uninterrupted.set_epoch(epoch)
        orders.append(list(uninterrupted))
    assert orders[0] == list(RepeatSampler(list(range(16)), 1, 4, shuffle=True, seed=7))  # epoch 0: TRL's own
    assert orders[1] != orders[0]
    resumed = sampler()
    resumed.set_epoch(2)  # a fresh process resuming in epoch 3
    assert list(resumed) == orders[2]


def test_item5_a_save_only_model_checkpoint_is_not_resumed_and_the_refusal_names_what_it_lacks(tmp_path):
    _checkpoint(tmp_path, 2, save_only_model=True)
    with pytest.raises(ValueError, match=r"save_only_model=True`: no optimizer, learning-rate schedule or RNG state"):
        _start(tmp_path, str(tmp_path / "checkpoint-2"))
    messages = []  # a run saved model-only from the start: every requeue is a fresh start, saying why
    assert _start(tmp_path, "last", messages).checkpoint is None
    assert f"{tmp_path}: passed over checkpoint-2 (it was saved with `save_only_model=True`" in messages[0]


@pytest.mark.parametrize("name", ["trainer_state.json", CEGPPO_STATE_FILE])
def test_item6_a_same_size_edit_of_a_state_file_after_the_commit_is_seen(tmp_path, name):
    folder = _checkpoint(tmp_path, 2)
    text = (folder / name).read_text()
    edited = text.replace('"global_step": 2', '"global_step": 4') if name == "trainer_state.json" else text[:-1] + " "
    (folder / name).write_text(edited)
    assert edited != text and len(edited) == len(text)
    with pytest.raises(ValueError, match=rf"{name} changed after the commit"):
        _start(tmp_path, str(folder))


def test_item7_a_resume_names_every_changed_field_but_the_safe_ones_also_into_a_new_folder(tmp_path):
    old = _args(tmp_path / "k", learning_rate=5e-3, seed=0, reward_weights=[1.0], warmup_steps=0)
    source = _checkpoint(tmp_path / "k", 4, args=old)
    new_dir = tmp_path / "new"
    args = _args(new_dir, learning_rate=1e-4, seed=1, reward_weights=[2.0], warmup_steps=3, weight_decay=0.1,
                 max_grad_norm=0.5, logging_steps=7, save_steps=9, dataloader_num_workers=2)  # fmt: skip
    plan, blocking = plan_resume(str(new_dir), str(source), args)
    message = plan.messages[0]
    for changed in ("learning_rate: 0.005 -> 0.0001", "seed: 0 -> 1", "reward_weights: [1.0] -> [2.0]",
                    "warmup_steps: 0 -> 3", "weight_decay: 0.0 -> 0.1", "max_grad_norm: 1.0 -> 0.5"):  # fmt: skip
        assert changed in message, message
    for safe in ("logging_steps", "save_steps", "dataloader_num_workers", "output_dir"):
        assert f"{safe}:" not in message
    assert blocking == []


def test_item8_non_numbered_folders_are_ignored_by_every_rule(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 4, name="last-checkpoint")  # transformers' `hub_strategy="checkpoint"` copy
    _checkpoint(tmp_path, 9, run="x", name="checkpoint-best")
    assert _start(tmp_path, "last").checkpoint == str(tmp_path / "checkpoint-4")
    assert _start(tmp_path, str(tmp_path / "last-checkpoint")).checkpoint == str(tmp_path / "last-checkpoint")
    assert rotate(str(tmp_path), 1, None, "run-a") == [os.path.normpath(tmp_path / "checkpoint-2")]
    assert (tmp_path / "last-checkpoint").is_dir() and (tmp_path / "checkpoint-best").is_dir()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES, errno.EIO,
                                  None])  # fmt: skip
def test_item9_a_file_system_without_flock_warns_once_naming_the_path_and_the_run_goes_on(tmp_path, monkeypatch, code):
    def refuse(fd, operation):  # EACCES, EIO and a plain OSError too
        raise OSError(code, os.strerror(code)) if code is not None else OSError("no locks here")

    monkeypatch.setattr(fcntl, "flock", refuse)
    before, messages = _open_fds(), []
    plan = _start(tmp_path, "last", messages)
    assert plan.checkpoint is None and plan.lock is None and _open_fds() == before  # no descriptor leaks
    refusals = [m for m in messages if "refuses `flock`" in m]
    assert len(refusals) == 1 and str(tmp_path / LOCK_FILE) in refusals[0] and "second run" in refusals[0]
    assert any("a fresh start" in m for m in messages)  # the lock file is no "run began here" mark


def test_item10_last_on_a_first_launch_starts_fresh_with_a_notice_and_a_missing_path_is_refused(tmp_path):
    messages = []
    assert _start(tmp_path / "new", "last", messages).checkpoint is None
    assert messages == [f"`resume_from_checkpoint=last`: {tmp_path / 'new'} holds no committed checkpoint: a fresh "
                        "start. (The first launch of a requeued command line.)"]  # fmt: skip
    with pytest.raises(ValueError, match="Can.t find a valid checkpoint at .*: no such folder"):
        _start(tmp_path / "new", str(tmp_path / "new" / "checkpoint-9"))


def test_item11_a_forked_child_does_not_keep_the_lock_after_its_parent_is_killed(tmp_path):
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # the run's main process: takes the lock, forks a long-lived child (a loader worker)
        try:
            fd = acquire_lock(str(tmp_path))
            child = os.fork()
            if child == 0:
                time.sleep(60)
                os._exit(0)
            os.write(write, f"{child} {int(fd is not None)}\n".encode())
            time.sleep(60)
        finally:
            os._exit(0)
    child, held = map(int, os.read(read, 100).decode().split())
    try:
        assert held == 1
        with pytest.raises(RuntimeError, match="written by another live run"):
            acquire_lock(str(tmp_path))
        os.kill(holder, signal.SIGKILL)
        os.waitpid(holder, 0)
        fd = acquire_lock(str(tmp_path))  # the child lives on, without the lock
        release_lock(fd)
    finally:
        os.kill(child, signal.SIGKILL)
    fd = acquire_lock(str(tmp_path))
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # and an exec'd program never holds it
    release_lock(fd)


def test_item12_choosing_and_committing_a_checkpoint_reads_no_weight_or_optimizer_byte(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 2)
    folder = _checkpoint(tmp_path, 4, mark=False)
    opened, real_open = [], open

    def spy(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cp, "open", spy, raising=False)
    commit(str(folder), True, "run-a", lambda: None)
    assert _start(tmp_path, "last").checkpoint == str(folder)
    assert set(opened) <= {"trainer_state.json", CEGPPO_STATE_FILE, COMMIT_FILE} | {
        n for n in opened if n.endswith(".tmp")
    }


def test_the_lock_is_the_kernels_and_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    fd = acquire_lock(str(tmp_path))
    with pytest.raises(RuntimeError, match="written by another live run"):
        acquire_lock(str(tmp_path))  # another open file description: flock refuses it, in this process too
    release_lock(fd)
    release_lock(acquire_lock(str(tmp_path)))


# ----------------------------------------------------------------------------------------------------------------
# Rule 3: one run per folder; the plan is the main process's, broadcast
# ----------------------------------------------------------------------------------------------------------------
def test_a_new_run_into_a_folder_with_checkpoints_is_refused_and_overwrite_deletes_exactly_those(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, mark=False)
    with pytest.raises(ValueError, match=r"A new run into .* \(checkpoint-2\).*--resume_from_checkpoint last.*"
                       r"--output_dir.*--overwrite_output_dir true"):  # fmt: skip
        _start(tmp_path, None)
    messages = []
    plan = _start(tmp_path, None, messages, overwrite=True)
    assert plan.checkpoint is None and _names(tmp_path) == ["checkpoint-4"]  # the torn folder is not a checkpoint
    assert messages == [  # the unmarked folder is named
        f"{tmp_path}: passed over checkpoint-4 (it has no cegppo_commit.json: a run of this library began it and did "
        "not commit it).", f"`overwrite_output_dir`: deleted checkpoint-2 from {tmp_path}."]  # fmt: skip


def test_a_second_fresh_train_of_the_same_run_is_allowed_beside_its_own_checkpoints(tmp_path):
    _checkpoint(tmp_path, 2)
    assert _start(tmp_path, None, run="run-a").run == "run-a"
    with pytest.raises(ValueError, match="another run"):
        _start(tmp_path, None, run="run-b")


@pytest.mark.slow
def test_nothing_the_safety_layer_writes_reaches_the_hub(make_trainer, tmp_path, monkeypatch):
    """transformers' own push (`_push_from_checkpoint` after the commit, then `push_to_hub`) with the upload
    recorded: the files it would send, filtered by huggingface_hub's own rule, hold no lock file; the pushed
    checkpoint holds its marker (the `last-checkpoint` copy is resumable)."""
    import transformers.trainer
    from huggingface_hub.utils import filter_repo_objects

    uploads = []

    class Recorder:
        def upload_folder(self, folder_path, ignore_patterns=None, path_in_repo=None, **kwargs):
            root = Path(folder_path)
            names = [p.relative_to(root).as_posix() for p in sorted(root.rglob("*")) if p.is_file()]
            uploads.append((path_in_repo, list(filter_repo_objects(names, ignore_patterns=ignore_patterns))))
            return types.SimpleNamespace(is_done=lambda: True, done=lambda: True)

        def __getattr__(self, name):
            return lambda *args, **kwargs: types.SimpleNamespace(repo_id="me/run", commit_url="", oid="")

    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: Recorder(), raising=False)
    hub = dict(push_to_hub=True, hub_model_id="me/run", hub_strategy="checkpoint")
    trainer = make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2, **hub)
    trainer.train()
    trainer.push_to_hub()  # the end-of-run push of the whole `output_dir`
    assert (tmp_path / LOCK_FILE).exists()
    sent = [name for _, names in uploads for name in names]
    assert "model.safetensors" in sent
    assert [COMMIT_FILE in names for where, names in uploads if where == "last-checkpoint"] == [True]
    assert not [name for name in sent if name.startswith("_") or "lock" in name], sent


def _as_process(monkeypatch, main: bool, broadcast):
    import accelerate
    import accelerate.utils

    state = types.SimpleNamespace(is_main_process=main, num_processes=2)
    monkeypatch.setattr(accelerate, "PartialState", lambda: state)
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", broadcast)


def test_every_process_resumes_the_checkpoint_and_run_the_main_process_planned(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)  # written by a job still running when this rank looked, after the main process did

    def broadcast(objects, from_process=0):
        objects[:] = [str(tmp_path / "checkpoint-2"), False, "run-a", None]  # the main process's answer

    _as_process(monkeypatch, False, broadcast)
    plan = start_run(_args(tmp_path), True, print)
    assert (plan.checkpoint, plan.run, plan.lock) == (str(tmp_path / "checkpoint-2"), "run-a", None)
    assert not (tmp_path / LOCK_FILE).exists()  # only the main process takes the lock


def test_an_oserror_in_the_main_processs_planning_still_reaches_the_broadcast(tmp_path, monkeypatch):
    sent = []
    _as_process(monkeypatch, True, lambda objects, from_process=0: sent.append(list(objects)))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    with pytest.raises(OSError, match="Not a directory"):
        start_run(_args(blocked / "out"), None, print)
    assert sent and sent[0][3][0] == "OSError" and "Not a directory" in sent[0][3][1]


# ----------------------------------------------------------------------------------------------------------------
# The lock: flock, held while the run lives
# ----------------------------------------------------------------------------------------------------------------
CONTENDER = """
import sys, time
from cegppo_trl.checkpoints import acquire_lock, release_lock
print("ready", flush=True)
for line in sys.stdin:  # "<start time> <output_dir>": try the lock at that instant, hold it 0.3 s, say what it got
    start, output_dir = line.split()
    time.sleep(max(0.0, float(start) - time.time()))
    try:
        fd, got = acquire_lock(output_dir), "held"
    except RuntimeError:
        fd, got = None, "refused"
    time.sleep(max(0.0, float(start) + 0.3 - time.time()))
    release_lock(fd)
    print(got, flush=True)
"""


def _contend(tmp_path: Path, trials: int, prefix: tuple[str, ...] = ()) -> list[list[str]]:
    """Two processes (each under `prefix`) try the same lock at the same instant, `trials` times."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([*prefix, sys.executable, "-c", CONTENDER], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(2)]  # fmt: skip
    try:
        assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
        results = []
        for trial in range(trials):
            line = f"{time.time() + 0.2:.4f} {tmp_path / f'trial{trial}'}\n"
            for p in procs:
                p.stdin.write(line)
                p.stdin.flush()
            results.append(sorted(p.stdout.readline().strip() for p in procs))
        return results
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)


@pytest.mark.slow
@pytest.mark.campaign
def test_two_runs_started_together_never_both_hold_the_lock(tmp_path):
    assert _contend(tmp_path, 20) == [["held", "refused"]] * 20


@pytest.mark.slow
@pytest.mark.campaign
def test_the_lock_excludes_a_run_in_another_pid_namespace_and_dies_with_its_holder(tmp_path):
    unshare = ("unshare", "--pid", "--fork", "--mount-proc")
    probe = subprocess.run([*unshare, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"the kernel refuses a new PID namespace here: {probe.stderr.decode().strip()}")
    # Each process is pid 1 in its namespace, on one host: a lock keyed on host and pid took the other's as its own.
    assert _contend(tmp_path, 3, unshare) == [["held", "refused"]] * 3
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from cegppo_trl.checkpoints import "
                               "acquire_lock; acquire_lock(sys.argv[1]); print('held', flush=True); time.sleep(60)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RuntimeError, match=r"written by another live run \(it holds .*_cegppo_run.lock\)"):
            acquire_lock(str(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    release_lock(acquire_lock(str(tmp_path)))  # the kernel released it with its holder: no stale-owner rule


# ----------------------------------------------------------------------------------------------------------------
# A real 2-process save with a slow process (the kill-and-requeue trials: tests/test_chaos.py)
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.campaign
def test_a_slow_process_in_a_two_process_save_neither_loses_the_old_checkpoint_nor_is_resumed(tmp_path):
    """In a real 2-process DDP job with `save_total_limit=1`, process 1 stalls before writing its RNG state into
    checkpoint-2 while process 0 has finished its part; the job is then killed, as a preempted one is."""
    from helpers.mp_launch import TORCHRUN, free_port, start

    spec = {"loss_types": ["dapo"], "save_steps": 1, "save_total_limit": 1, "max_steps": 3, "num_iterations": 1,
            "pid_files": True, "slow_save": {"rank": 1, "step": 2}}  # fmt: skip
    torchrun = [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", str(free_port())]
    proc = start(torchrun, tmp_path, spec, ACCELERATE_USE_CPU="1")
    output_dir = tmp_path / "dapo"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if (tmp_path / "slow_save_started").exists() and (
                output_dir / "checkpoint-2" / "trainer_state.json"
            ).exists():
                break
            time.sleep(0.05)
        assert proc.poll() is None, proc.log_path.read_text()[-3000:]
        time.sleep(2)  # process 0 goes on as far as it can
    finally:
        for pid_file in tmp_path.glob("pid_*"):
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait()
    assert not (output_dir / "checkpoint-2" / "rng_state_1.pth").exists()
    assert not (output_dir / "checkpoint-2" / COMMIT_FILE).exists()  # process 0 waits at the barrier: no marker
    last = plan_resume(str(output_dir), "last", _args(output_dir))[
        0
    ].checkpoint  # (the killed job may still be exiting)
    assert last == str(output_dir / "checkpoint-1")  # the older one was not rotated away before the commit
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(json.loads((Path(last) / COMMIT_FILE).read_text())["files"])


@pytest.mark.slow
@pytest.mark.campaign
def test_two_nodes_with_their_own_local_disks_each_commit_their_checkpoints(tmp_path):
    """Two nodes of one process each on loopback, each with its own `output_dir` (a local disk per node) and
    `save_on_each_node`: the old commit listed the folder on process 0 and crashed on the other node's RNG state."""
    from helpers.mp_launch import TORCHRUN, free_port, start, wait

    spec = {"loss_types": ["dapo"], "save_steps": 1, "max_steps": 2, "num_iterations": 1, "save_on_each_node": True}
    port = str(free_port())
    procs = [start([str(TORCHRUN), "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(node),
                    "--master_addr", "127.0.0.1", "--master_port", port], tmp_path / f"node{node}", spec,
                   ACCELERATE_USE_CPU="1") for node in (0, 1)]  # fmt: skip
    wait(procs)
    for node in (0, 1):
        output_dir = tmp_path / f"node{node}" / "dapo"
        for step in (1, 2):
            files = json.loads((output_dir / f"checkpoint-{step}" / COMMIT_FILE).read_text())["files"]
            assert f"rng_state_{node}.pth" in files and f"rng_state_{1 - node}.pth" not in files
            on_disk = {p.name for p in (output_dir / f"checkpoint-{step}").iterdir()} - {COMMIT_FILE}
            assert set(files) == on_disk  # what this node's process wrote, as its owner listed it
        assert _start(output_dir, "last").checkpoint == str(output_dir / "checkpoint-2")
