"""The checkpoint protocol (`cegppo_trl.checkpoints`): a marker written last, `last`, the refusal, the lock.

`test_item<k>_...` pins defect k of cegppo-trl 0.4's checkpoint layer where its rule is still the protocol's; the
other tests pin the protocol's rules.
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
from pathlib import Path

import pytest

from cegppo_trl import checkpoints as cp
from cegppo_trl.checkpoints import (
    COMMIT_FILE,
    LEGACY_STATE_FILE,
    LOCK_FILE,
    acquire_lock,
    begin,
    checkpoint_folders,
    commit,
    damage,
    other_runs,
    release_lock,
    resolve,
)

ROOT = Path(__file__).resolve().parents[1]


def _checkpoint(output_dir: Path, step: int, *, mark: bool = True, name: str = "", save_only_model: bool = False
                ) -> Path:  # fmt: skip
    """A checkpoint folder as the trainer writes it (tiny stand-in files), committed or not."""
    folder = output_dir / (name or f"checkpoint-{step}")
    begin(str(folder))
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    (folder / "optimizer.pt").write_bytes(b"o" * 32)
    (folder / "rng_state.pth").write_bytes(b"r" * 16)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.1, "max_steps": 100}))
    if mark:
        commit(str(folder), True, lambda: None, save_only_model)
    return folder


def _names(output_dir: Path) -> list[str]:
    return [Path(folder).name for folder in checkpoint_folders(str(output_dir))]


# ----------------------------------------------------------------------------------------------------------------
# Rule 1: the marker, written last; resumable iff marked and matching
# ----------------------------------------------------------------------------------------------------------------
def test_the_marker_names_every_file_with_its_size(tmp_path):
    folder = _checkpoint(tmp_path, 2)
    record = json.loads((folder / COMMIT_FILE).read_text())
    assert record["files"] == {n: (folder / n).stat().st_size for n in sorted(os.listdir(folder)) if n != COMMIT_FILE}
    assert damage(str(folder)) is None and os.listdir(tmp_path) == ["checkpoint-2"]  # the pending mark is gone
    (folder / "optimizer.pt").write_bytes(b"o" * 31)  # truncated
    assert "optimizer.pt is 31 bytes, its marker says 32 bytes" in damage(str(folder))


def test_a_folder_without_its_marker_is_not_a_checkpoint_and_last_passes_over_it_with_its_reason(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, mark=False)  # killed before the marker (or while a callback still wrote): torn
    checkpoint, messages = resolve(str(tmp_path), "last")
    assert checkpoint == str(tmp_path / "checkpoint-2")
    assert messages == [f"{tmp_path}: passed over checkpoint-4 (it has no cegppo_commit.json: a run of this library "
                        "began it and did not finish it)", f"Resuming from {checkpoint} (global step 2)."]  # fmt: skip
    with pytest.raises(ValueError, match=r"checkpoint-4 cannot be resumed \(it has no cegppo_commit.json: a run of"):
        resolve(str(tmp_path), str(tmp_path / "checkpoint-4"))
    # `True` as transformers treats it: the newest checkpoint, or its error when there is none
    assert resolve(str(tmp_path), True)[0] == checkpoint
    with pytest.raises(ValueError, match=r"No valid checkpoint found in output directory"):
        resolve(str(tmp_path / "empty"), True)


def test_checkpoints_of_earlier_cegppo_trl_resume_unless_their_save_did_not_finish(tmp_path):
    old = _checkpoint(tmp_path, 2)
    (old / LEGACY_STATE_FILE).write_text(
        "{}"
    )  # earlier cegppo-trl wrote it first, its run state in it; its marker (format 3)
    record = json.loads((old / COMMIT_FILE).read_text())
    files = {**record["files"], LEGACY_STATE_FILE: 2}
    (old / COMMIT_FILE).write_text(json.dumps({"format": 3, "run": "x", "files": files, "state": {}}))
    torn = _checkpoint(tmp_path, 4, mark=False)
    os.remove(tmp_path / "_cegppo_pending-checkpoint-4")
    (torn / LEGACY_STATE_FILE).write_text("{}")  # begun by earlier cegppo-trl, killed before its marker
    assert resolve(str(tmp_path), True)[0] == str(old)
    assert "began it and did not finish it" in damage(str(torn))


def test_the_marker_waits_for_every_process_at_the_barrier(tmp_path):
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    seen = []
    commit(str(folder), True, lambda: seen.append((folder / COMMIT_FILE).exists()))
    assert seen == [False] and (folder / COMMIT_FILE).exists()
    other = tmp_path / "checkpoint-2"
    other.mkdir()
    commit(str(other), False, lambda: None)  # not the folder's owner: fsyncs only
    assert not (other / COMMIT_FILE).exists()


# ----------------------------------------------------------------------------------------------------------------
# The defects of cegppo-trl 0.4's checkpoint layer whose rules remain
# ----------------------------------------------------------------------------------------------------------------
def test_last_falls_back_to_the_newest_resumable_checkpoint_naming_each_one_passed_over(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4, save_only_model=True)
    (_checkpoint(tmp_path, 6) / "optimizer.pt").write_bytes(b"o" * 5)  # damaged after its commit
    checkpoint, messages = resolve(str(tmp_path), "last")
    assert checkpoint == str(tmp_path / "checkpoint-2")
    assert messages[0] == (
        f"{tmp_path}: passed over checkpoint-4 (it was saved with `save_only_model=True`: no optimizer, schedule or "
        "RNG state to resume); checkpoint-6 (optimizer.pt is 5 bytes, its marker says 32 bytes)"
    )
    assert _names(tmp_path) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]  # passed over, not moved


def test_item4_the_repeat_sampler_draws_trls_order_and_a_resumed_epoch_gets_the_uninterrupted_order():
    from trl.trainer.utils import RepeatSampler

    from cegppo_trl.checkpoint_hooks import ResumableRepeatSampler

    epoch = [0]
    args = dict(data_source=list(range(16)), mini_repeat_count=1, batch_size=4, shuffle=True, seed=7)
    trl, ours = RepeatSampler(**args), ResumableRepeatSampler(**args, epoch_of=lambda: epoch[0])
    orders = []
    for epoch[0] in range(3):  # one generator seeded once, one permutation an epoch: TRL's order in every epoch
        orders.append(list(ours))
        assert orders[-1] == list(trl)
    assert orders[1] != orders[0]
    for epoch[0] in (2, 1):  # a fresh process resuming in epoch 3, then one in epoch 2
        assert list(ResumableRepeatSampler(**args, epoch_of=lambda: epoch[0])) == orders[epoch[0]]


def test_item5_a_save_only_model_checkpoint_is_not_resumed_and_the_refusal_names_what_it_lacks(tmp_path):
    _checkpoint(tmp_path, 2, save_only_model=True)
    with pytest.raises(ValueError, match=r"save_only_model=True`: no optimizer, schedule or RNG state"):
        resolve(str(tmp_path), str(tmp_path / "checkpoint-2"))
    checkpoint, messages = resolve(str(tmp_path), "last")  # saved model-only from the start: a fresh start, saying why
    assert checkpoint is None
    assert f"{tmp_path}: passed over checkpoint-2 (it was saved with `save_only_model=True`" in messages[0]


def test_item8_non_numbered_folders_are_ignored_by_every_rule(tmp_path):
    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)
    _checkpoint(tmp_path, 4, name="last-checkpoint")  # transformers' `hub_strategy="checkpoint"` copy
    _checkpoint(tmp_path, 9, name="checkpoint-best")
    assert resolve(str(tmp_path), "last")[0] == str(tmp_path / "checkpoint-4")
    assert resolve(str(tmp_path), str(tmp_path / "last-checkpoint"))[0] == str(tmp_path / "last-checkpoint")
    assert other_runs(str(tmp_path), set()) == [str(tmp_path / "checkpoint-2"), str(tmp_path / "checkpoint-4")]


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EACCES, errno.EIO,
                                  None])  # fmt: skip
def test_item9_a_file_system_without_flock_warns_once_naming_the_path_and_the_run_goes_on(tmp_path, monkeypatch, code):
    def refuse(fd, operation):  # EACCES, EIO and a plain OSError too
        raise OSError(code, os.strerror(code)) if code is not None else OSError("no locks here")

    monkeypatch.setattr(fcntl, "flock", refuse)
    before, messages = _open_fds(), []
    fd, created = acquire_lock(str(tmp_path / "out"), messages.append)
    assert fd is None and created and _open_fds() == before  # no descriptor leaks
    assert len(messages) == 1 and str(tmp_path / "out" / LOCK_FILE) in messages[0] and "second run" in messages[0]
    assert resolve(str(tmp_path / "out"), "last")[0] is None  # the lock file is no "run began here" mark


def test_item10_last_on_a_first_launch_starts_fresh_with_a_notice_and_a_missing_path_is_transformers_to_refuse(
    tmp_path,
):
    assert resolve(str(tmp_path / "new"), "last") == (
        None, [f"`resume_from_checkpoint=last`: {tmp_path / 'new'} holds no committed checkpoint: a fresh start."]
    )  # fmt: skip
    missing = str(tmp_path / "new" / "checkpoint-9")
    assert resolve(str(tmp_path / "new"), missing) == (missing, [])  # transformers says it cannot find it


def test_item11_a_forked_child_does_not_keep_the_lock_after_its_parent_is_killed(tmp_path):
    read, write = os.pipe()
    holder = os.fork()
    if holder == 0:  # the run's main process: takes the lock, forks a long-lived child (a loader worker)
        try:
            fd, _ = acquire_lock(str(tmp_path))
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
        fd, _ = acquire_lock(str(tmp_path))  # the child lives on, without the lock
        release_lock(fd, str(tmp_path))
    finally:
        os.kill(child, signal.SIGKILL)
    fd, _ = acquire_lock(str(tmp_path))
    assert fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC  # and an exec'd program never holds it
    release_lock(fd, str(tmp_path))


def test_item12_choosing_and_committing_a_checkpoint_reads_no_weight_or_optimizer_byte(tmp_path, monkeypatch):
    _checkpoint(tmp_path, 2)
    folder = _checkpoint(tmp_path, 4, mark=False)
    opened, real_open = [], open

    def spy(path, *args, **kwargs):
        opened.append(os.path.basename(path))
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(cp, "open", spy, raising=False)
    commit(str(folder), True, lambda: None)
    assert resolve(str(tmp_path), "last")[0] == str(folder)
    assert set(opened) <= {"trainer_state.json", COMMIT_FILE, "_cegppo_pending-checkpoint-4"} | {
        n for n in opened if n.endswith(".tmp")
    }


def test_the_lock_is_the_kernels_and_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    fd, created = acquire_lock(str(tmp_path / "out"))
    with pytest.raises(RuntimeError, match="written by another live run"):
        acquire_lock(str(tmp_path / "out"))  # another open file description: flock refuses it, in this process too
    release_lock(fd, str(tmp_path / "out"), created)
    assert not (tmp_path / "out").exists()  # nothing was saved: neither the lock file nor the folder made for it stay
    fd, created = acquire_lock(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    release_lock(fd, str(tmp_path), created)
    assert (tmp_path / LOCK_FILE).exists()  # beside what a run saved, the lock file stays (removing it would race)


# ----------------------------------------------------------------------------------------------------------------
# Rule 3: a fresh run into another run's committed checkpoints
# ----------------------------------------------------------------------------------------------------------------
def test_a_fresh_run_is_refused_only_beside_committed_checkpoints_it_did_not_write(make_trainer, tmp_path):
    _checkpoint(tmp_path, 4, mark=False)  # torn: not a checkpoint `last` would resume
    assert other_runs(str(tmp_path), set()) == []
    trainer = make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()  # beside a torn folder: trains
    trainer.train()  # again, beside its own checkpoints (as in TRL)
    with pytest.raises(ValueError, match=r"A new run into .* \(checkpoint-2\).*--resume_from_checkpoint last.*"
                       r"--output_dir.*--overwrite_output_dir true"):  # fmt: skip
        make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2).train()


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
        (fd, _), got = acquire_lock(output_dir), "held"
    except RuntimeError:
        fd, got = None, "refused"
    time.sleep(max(0.0, float(start) + 0.3 - time.time()))
    release_lock(fd, output_dir)
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
    release_lock(acquire_lock(str(tmp_path))[0], str(tmp_path))  # the kernel released it: no stale-owner rule


# ----------------------------------------------------------------------------------------------------------------
# A real 2-process save with a slow process (the kill-and-requeue trials: tests/test_chaos.py)
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.campaign
def test_a_slow_process_in_a_two_process_save_neither_loses_the_old_checkpoint_nor_is_resumed(tmp_path):
    """In a real 2-process DDP job with `save_total_limit=2`, process 1 stalls before writing its RNG state into
    checkpoint-2 while process 0 has finished its part; the job is then killed, as a preempted one is. (With
    `save_total_limit=1` transformers' rotation deletes checkpoint-1 once process 0's files are written: then `last`
    passes over checkpoint-2 and starts fresh.)"""
    from helpers.mp_launch import TORCHRUN, free_port, start

    spec = {"loss_types": ["dapo"], "save_steps": 1, "save_total_limit": 2, "max_steps": 3, "num_iterations": 1,
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
    last = resolve(str(output_dir), "last")[0]
    assert last == str(output_dir / "checkpoint-1")  # kept by the rotation, the newest committed
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
        assert resolve(str(output_dir), "last")[0] == str(output_dir / "checkpoint-2")
