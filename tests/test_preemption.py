"""Preemption-safe checkpoints: a commit record written last, rotation after the commit, no older run
coming back, one resume decision for every process, one live run per `output_dir`, and the chaos test.

Each trap has a test here that fails without the protocol: (1) a checkpoint missing a process's
RNG state is not resumed, (2) rotation never leaves nothing to resume, (3a) the Python API refuses a new run into a
folder with checkpoints and a folder rewritten in place is not complete until committed, (3b) a resume with later
checkpoints beside it is refused, naming the option, (5) the main process's resolution is every process's and a live
run's lock refuses a second one.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from cegppo_trl import CEGPPOConfig
from cegppo_trl.checkpoints import (
    CEGPPO_STATE_FILE,
    COMMIT_FILE,
    LOCK_FILE,
    acquire_lock,
    begin_checkpoint,
    incomplete_reason,
    last_complete_checkpoint,
    read_lock,
    release_lock,
    resume_last,
    rotate,
    write_commit,
)

TWO_RANKS = ["rng_state_{rank}.pth"]


def _checkpoint(output_dir: Path, step: int, world: int = 2, commit: bool = True) -> Path:
    """A checkpoint folder as this trainer writes it for `world` processes (tiny stand-in files), committed or not."""
    folder = output_dir / f"checkpoint-{step}"
    begin_checkpoint(str(folder), {"format": 1, "settings": {}})
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    (folder / "optimizer.pt").write_bytes(b"o" * 32)
    for rank in range(world):
        (folder / (f"rng_state_{rank}.pth" if world > 1 else "rng_state.pth")).write_bytes(b"r" * 16)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.1, "max_steps": 100}))
    if commit:
        write_commit(str(folder), world, TWO_RANKS if world > 1 else [])
    return folder


def _resolve(output_dir: Path, value, **kw):
    from cegppo_trl.scripts import resolve_checkpoint

    args = CEGPPOConfig(output_dir=str(output_dir), use_cpu=True, resume_from_checkpoint=value, **kw)
    return resolve_checkpoint(args)


# ----------------------------------------------------------------------------------------------------------------
# 1. A checkpoint counts as complete only once committed, with every process's files
# ----------------------------------------------------------------------------------------------------------------
def test_a_checkpoint_missing_a_processs_rng_state_is_not_resumed(tmp_path, caplog):
    _checkpoint(tmp_path, 1)
    # Process 0 wrote everything, trainer_state.json included; process 1 had not written its RNG state yet.
    partial = _checkpoint(tmp_path, 2, commit=False)
    (partial / "rng_state_1.pth").unlink()
    assert resume_last(str(tmp_path))[0] == str(tmp_path / "checkpoint-1")
    assert incomplete_reason(str(partial)) == f"{COMMIT_FILE} is missing: the run stopped before every process had written its files"  # fmt: skip

    # Process 1 killed while writing it: the commit record's size no longer matches (a forged record too).
    truncated = _checkpoint(tmp_path, 3)
    (truncated / "rng_state_1.pth").write_bytes(b"r" * 3)
    last, warning = resume_last(str(tmp_path))
    assert last == str(tmp_path / "checkpoint-1")
    assert "checkpoint-3 (rng_state_1.pth has 3 bytes, cegppo_commit.json says 16)" in warning
    with pytest.raises(ValueError, match=r"is not a complete checkpoint \(rng_state_1.pth has 3 bytes.*Resume .*checkpoint-1"):  # fmt: skip
        _resolve(tmp_path, str(truncated))
    # A record that leaves out a process's file (world size 2) does not count either.
    (truncated / "rng_state_1.pth").unlink()
    write_commit(str(truncated), 2, [])
    record = json.loads((truncated / COMMIT_FILE).read_text())
    record["rank_files"] = TWO_RANKS
    (truncated / COMMIT_FILE).write_text(json.dumps(record))
    assert incomplete_reason(str(truncated)) == f"rng_state_1.pth is not in {COMMIT_FILE} (world size 2)"


def test_the_python_api_refuses_an_uncommitted_checkpoint_path(make_trainer, tmp_path):
    make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1).train()
    (tmp_path / "checkpoint-1" / COMMIT_FILE).unlink()
    again = make_trainer(num_iterations=2, max_steps=2)
    with pytest.raises(
        ValueError, match=r"checkpoint-1` is not a complete checkpoint \(cegppo_commit.json is missing"
    ):
        again.train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))


def test_the_trainer_commits_each_checkpoint_last_naming_world_size_and_file_sizes(make_trainer, tmp_path):
    make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=1).train()
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"]  # rotation ran after the commit
    folder = tmp_path / "checkpoint-2"
    record = json.loads((folder / COMMIT_FILE).read_text())
    assert record["world_size"] == 1 and record["rank_files"] == []
    on_disk = {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    del on_disk[COMMIT_FILE]
    assert record["files"] == on_disk
    assert {"model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json", CEGPPO_STATE_FILE} <= set(
        on_disk
    )
    # Written last: nothing in the folder is newer than the commit record.
    assert max(p.stat().st_mtime_ns for p in folder.rglob("*")) == (folder / COMMIT_FILE).stat().st_mtime_ns
    assert not (tmp_path / LOCK_FILE).exists()  # released when training ended


# ----------------------------------------------------------------------------------------------------------------
# 2. Rotation waits for the commit and never leaves nothing to resume
# ----------------------------------------------------------------------------------------------------------------
def test_rotation_counts_only_committed_checkpoints_and_keeps_the_newest(tmp_path):
    for step in (1, 2, 3):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 4, commit=False)  # being written by another process
    stale = _checkpoint(tmp_path, 0, commit=False)  # left by a run killed while saving
    deleted = rotate(str(tmp_path), 1)
    assert sorted(Path(d).name for d in deleted) == ["checkpoint-0", "checkpoint-1", "checkpoint-2"]
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-4"]
    assert not stale.exists()


@pytest.mark.slow
def test_a_slow_process_in_a_two_process_save_neither_loses_the_old_checkpoint_nor_is_resumed(tmp_path):
    """Trap 1 and 2 in a real 2-process DDP job: with `save_total_limit=1`, process 1 stalls before writing its RNG
    state into checkpoint-2 while process 0 has finished its part (weights, optimizer, `trainer_state.json`); the job
    is then killed, as a preempted one is. transformers rotated checkpoint-1 away at that point (process 0 does so
    right after `trainer_state.json`) and `last` picked checkpoint-2 without process 1's RNG state."""
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
    assert (output_dir / "checkpoint-2" / "rng_state_0.pth").exists()
    assert not (output_dir / "checkpoint-2" / "rng_state_1.pth").exists()
    last, skipped = last_complete_checkpoint(str(output_dir))
    assert last == str(output_dir / "checkpoint-1")
    assert {(output_dir / "checkpoint-1" / f"rng_state_{k}.pth").exists() for k in (0, 1)} == {True}
    assert skipped == {str(output_dir / "checkpoint-2"): f"{COMMIT_FILE} is missing: the run stopped before every process had written its files"}  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# 3. An older run does not come back
# ----------------------------------------------------------------------------------------------------------------
FRESH_REFUSED = (
    r"already holds checkpoints \(latest: checkpoint-1\).*--later_checkpoints move_aside.*--overwrite_output_dir true"  # noqa: E501
)


def test_the_python_api_refuses_a_new_run_into_a_folder_with_checkpoints_as_the_cli_does(make_trainer, tmp_path):
    make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1).train()
    with pytest.raises(ValueError, match=FRESH_REFUSED):
        make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1).train()
    with pytest.raises(ValueError, match=FRESH_REFUSED):
        _resolve(tmp_path, None)  # the CLI: the same message
    assert not (tmp_path / LOCK_FILE).exists()  # a refused run leaves no lock behind
    # The way out: move the old run aside (or resume it, or `--overwrite_output_dir true` on the CLI).
    make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1,
                 later_checkpoints="move_aside").train()  # fmt: skip
    superseded = list(tmp_path.glob("superseded-*/checkpoint-1"))
    assert len(superseded) == 1 and not (superseded[0] / COMMIT_FILE).exists()  # never resumable by accident
    assert (tmp_path / "checkpoint-1" / COMMIT_FILE).exists()  # this run's


def test_a_checkpoint_rewritten_in_place_loses_its_commit_record_before_anything_is_written(
    make_trainer, tmp_path, monkeypatch
):
    from cegppo_trl import CEGPPOTrainer

    make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1).train()
    folder = tmp_path / "checkpoint-1"
    old_state = (folder / "trainer_state.json").read_text()
    trainer = make_trainer(num_iterations=2, max_steps=1)
    trainer.state.global_step = 1

    class Killed(BaseException):
        pass

    def killed_after_the_weights(self, output_dir=None, _internal_call=False):
        (Path(output_dir) / "model.safetensors").write_bytes(b"new weights")
        raise Killed

    monkeypatch.setattr(CEGPPOTrainer, "save_model", killed_after_the_weights)
    with pytest.raises(Killed):
        trainer._save_checkpoint(trainer.model, None)
    assert (folder / "trainer_state.json").read_text() == old_state  # the old run's, beside the new weights
    assert incomplete_reason(str(folder)) == f"{COMMIT_FILE} is missing: the run stopped before every process had written its files"  # fmt: skip
    with pytest.raises(ValueError, match="every `checkpoint-\\*` folder there is incomplete"):
        resume_last(str(tmp_path))


def test_resuming_with_later_checkpoints_beside_it_is_refused_naming_the_option(tmp_path, caplog):
    for step in (2, 4):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 5, commit=False)
    refused = (
        r"Resuming .*checkpoint-2, but .* also holds later checkpoints \(checkpoint-4\): a run that got further.*"
        r"Pass `--later_checkpoints move_aside`"
    )
    with pytest.raises(ValueError, match=refused):
        _resolve(tmp_path, str(tmp_path / "checkpoint-2"))
    # `last` is checkpoint-4: the half-written checkpoint-5 is this run's to write again, not a later checkpoint.
    assert _resolve(tmp_path, "last") == str(tmp_path / "checkpoint-4")
    # Moving them aside: the CLI checks before the model loads; the trainer moves them once it holds the lock.
    assert _resolve(tmp_path, str(tmp_path / "checkpoint-2"), later_checkpoints="move_aside") == str(
        tmp_path / "checkpoint-2"
    )
    from cegppo_trl.checkpoints import start_run

    args = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, later_checkpoints="move_aside")
    warnings = []
    assert start_run(args, str(tmp_path / "checkpoint-2"), warnings.append) == str(tmp_path / "checkpoint-2")
    release_lock(str(tmp_path))
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    assert sorted(p.name for p in tmp_path.glob("superseded-*/*")) == ["checkpoint-4", "checkpoint-5"]
    assert "moved checkpoint-4, checkpoint-5 into" in warnings[-1]
    with pytest.raises(ValueError, match="`later_checkpoints` must be one of 'refuse', 'move_aside', got 'delete'"):
        _resolve(tmp_path, "last", later_checkpoints="delete")


def test_a_checkpoint_without_a_commit_record_from_another_trainer_keeps_the_old_rule_with_a_note(tmp_path):
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    assert incomplete_reason(str(folder)) is None
    last, warning = resume_last(str(tmp_path))
    assert last == str(folder) and warning is None
    from cegppo_trl.checkpoints import plan_resume

    assert plan_resume(str(tmp_path), "last")[1] == [
        f"{folder} has no {COMMIT_FILE} (written by another trainer or an older cegppo-trl), so it counts as complete "
        "because its trainer_state.json is readable; in a multi-process save that does not prove the other processes "
        "had finished writing their files."
    ]
    assert plan_resume(str(tmp_path), "last")[1] == []  # once per process: `cegppo train` and `train()` both plan


# ----------------------------------------------------------------------------------------------------------------
# 5. One decision for every process; one live run per output_dir
# ----------------------------------------------------------------------------------------------------------------
def test_every_process_resumes_the_checkpoint_the_main_process_resolved(tmp_path, monkeypatch):
    import accelerate
    import accelerate.utils
    from trl import GRPOTrainer

    from cegppo_trl import CEGPPOTrainer

    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)  # written by a job still running when this rank looked, after the main process did
    monkeypatch.setattr(
        accelerate, "PartialState", lambda: types.SimpleNamespace(is_main_process=False, num_processes=2)
    )

    def broadcast(objects, from_process=0):
        objects[:] = [str(tmp_path / "checkpoint-2"), None]  # the main process's answer

    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", broadcast)
    received = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, checkpoint, *rest, **kw: received.append(checkpoint))
    trainer = CEGPPOTrainer.__new__(CEGPPOTrainer)
    trainer.args = types.SimpleNamespace(output_dir=str(tmp_path))
    CEGPPOTrainer.train(trainer, resume_from_checkpoint=True)
    assert received == [str(tmp_path / "checkpoint-2")]
    assert not (tmp_path / LOCK_FILE).exists()  # only the main process takes the lock

    def refused(objects, from_process=0):
        objects[:] = [None, ("ValueError", "refused on the main process")]

    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", refused)
    with pytest.raises(ValueError, match="refused on the main process"):
        CEGPPOTrainer.train(trainer, resume_from_checkpoint=True)


def test_a_live_runs_lock_refuses_a_second_run_and_a_dead_runs_lock_is_stale(make_trainer, tmp_path):
    from cegppo_trl.checkpoints import _owner_alive, _process_start

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = {"host": socket.gethostname(), "pid": other.pid, "process_start": _process_start(other.pid),
                 "started": "2026-12-01T10:00:00Z"}  # fmt: skip
        (tmp_path / LOCK_FILE).write_text(json.dumps(owner))
        with pytest.raises(RuntimeError, match=rf"being written by another live run \(pid {other.pid} on .*started 2026-12-01T10:00:00Z"):  # fmt: skip
            make_trainer(num_iterations=2, max_steps=1).train()
        assert read_lock(str(tmp_path)) == owner  # still the live run's
    finally:
        other.kill()
        other.wait()
    # The owner is dead (a preempted run): its lock is stale and never blocks the resume.
    make_trainer(num_iterations=2, max_steps=1).train()
    assert not (tmp_path / LOCK_FILE).exists()
    # A reused pid (the number of a live process that started at another time) is not the owner either.
    assert _owner_alive({"pid": os.getpid(), "process_start": _process_start(os.getpid())})
    assert not _owner_alive({"pid": os.getpid(), "process_start": "1"})
    # `cegppo train` takes the lock before the model loads; the trainer's `train()` in the same process re-enters it.
    assert acquire_lock(str(tmp_path)) == [] and acquire_lock(str(tmp_path)) == []
    release_lock(str(tmp_path))
    assert not (tmp_path / LOCK_FILE).exists()


# ----------------------------------------------------------------------------------------------------------------
# 6. Chaos: kill any process at a random moment, resume `last`, end where an uninterrupted run ends
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("launch", ["single", "ddp"])
def test_chaos_kill_and_resume_last_ends_bit_identical(launch, tmp_path):
    from helpers.chaos import campaign

    results = campaign([launch], 1, tmp_path, seed=1)[launch]
    assert all("error" not in r for r in results), results
    assert all(r["max_abs_diff"] == 0.0 for r in results)


def test_two_moves_aside_within_one_second_keep_both_copies(tmp_path, monkeypatch):
    from cegppo_trl import checkpoints

    frozen = time.gmtime(0)
    monkeypatch.setattr(checkpoints.time, "gmtime", lambda *args: frozen)  # both moves in the same second
    targets = []
    for run in ("first", "second"):
        folder = tmp_path / "checkpoint-3"
        folder.mkdir()
        (folder / "trainer_state.json").write_text(run)
        targets.append(checkpoints.move_aside(str(tmp_path), [str(folder)]))
    assert targets[0] != targets[1]
    assert [(Path(t) / "checkpoint-3" / "trainer_state.json").read_text() for t in targets] == ["first", "second"]
