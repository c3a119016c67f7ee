"""Preemption-safe checkpoints: a commit record built from what each process reports it wrote, transformers'
rotation over committed folders only, no older run coming back, one resume plan per launch, a kernel lock.

Each test names the behaviour it pins; the numbers in the comments are the items of the safety-layer issue.
"""

from __future__ import annotations

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
from cegppo_trl.checkpoints import (
    CEGPPO_STATE_FILE,
    COMMIT_FILE,
    LOCK_FILE,
    acquire_lock,
    begin_checkpoint,
    checkpoint_folders,
    commit_after_save,
    incomplete_reason,
    inspect,
    last_complete_checkpoint,
    own_files,
    plan_resume,
    release_lock,
    rotate,
    start_run,
    write_commit,
)

ROOT = Path(__file__).resolve().parents[1]


def _checkpoint(output_dir: Path, step: int, world: int = 2, commit: bool = True) -> Path:
    """A checkpoint folder as this trainer writes it for `world` processes (tiny stand-in files), committed or not."""
    folder = output_dir / f"checkpoint-{step}"
    begin_checkpoint(str(folder), {"format": 1, "settings": {}, "commit": COMMIT_FILE})
    (folder / "model.safetensors").write_bytes(b"w" * 64)
    (folder / "optimizer.pt").write_bytes(b"o" * 32)
    for rank in range(world):
        (folder / (f"rng_state_{rank}.pth" if world > 1 else "rng_state.pth")).write_bytes(b"r" * 16)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "epoch": 0.1, "max_steps": 100}))
    if commit:
        files = {}
        for rank in range(world):
            files.update(own_files(str(folder), rank, writes_shared=rank == 0))
        write_commit(str(folder), world, files)
    return folder


def _names(output_dir: Path) -> list[str]:
    return [Path(folder).name for folder in checkpoint_folders(str(output_dir))]


def _plan(output_dir: Path, value, **kw):
    args = CEGPPOConfig(output_dir=str(output_dir), use_cpu=True, **kw)
    return plan_resume(str(output_dir), value, args, args.later_checkpoints)


def _fake_process(folder: Path, rank: int, world: int, *, node: int, save_on_each_node: bool = False):
    """What `commit_after_save` reads of a trainer on process `rank`."""
    args = types.SimpleNamespace(process_index=rank, local_process_index=rank - node, world_size=world,
                                 should_save=rank == node, save_on_each_node=save_on_each_node)  # fmt: skip
    return types.SimpleNamespace(args=args, state=types.SimpleNamespace(best_model_checkpoint=None))


# ----------------------------------------------------------------------------------------------------------------
# The commit record: what each process reports, gathered; written last (items 3, 9)
# ----------------------------------------------------------------------------------------------------------------
def test_the_commit_record_is_built_from_each_processs_report_never_from_the_main_processs_listing(
    tmp_path, monkeypatch
):
    import accelerate.utils

    folder = _checkpoint(tmp_path, 2, commit=False)
    reports = [(0, own_files(str(folder), 0, True)), (0, own_files(str(folder), 1, False))]
    assert set(reports[1][1]) == {"rng_state_1.pth"}  # process 1 claims only its own file ...
    assert "rng_state_1.pth" not in reports[0][1]  # ... and the main process never claims it
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: reports)
    commit_after_save(_fake_process(folder, 0, 2, node=0), str(folder), str(tmp_path),
                      {"save_total_limit": None, "push_to_hub": False}, set())  # fmt: skip
    record = json.loads((folder / COMMIT_FILE).read_text())
    assert record["world_size"] == 2
    assert set(record["files"]) == {"model.safetensors", "optimizer.pt", "rng_state_0.pth", "rng_state_1.pth",
                                    "trainer_state.json", CEGPPO_STATE_FILE}  # fmt: skip
    assert record["files"]["rng_state_1.pth"] == reports[1][1]["rng_state_1.pth"]  # [size, crc32]
    # A process that did not report: its file is not vouched for, whatever the main process sees.
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: reports[:1])
    commit_after_save(_fake_process(folder, 0, 2, node=0), str(folder), str(tmp_path),
                      {"save_total_limit": None, "push_to_hub": False}, set())  # fmt: skip
    assert "rng_state_1.pth" not in json.loads((folder / COMMIT_FILE).read_text())["files"]


def test_per_node_local_disks_each_commit_their_own_folder_with_save_on_each_node(tmp_path, monkeypatch):
    """Two nodes, one process each, each its own local `output_dir` (`save_on_each_node`): node 0 never sees
    `rng_state_1.pth`, and each node's folder is committed with the files its own processes wrote."""
    import accelerate.utils

    disks = [tmp_path / "node0", tmp_path / "node1"]
    folders = []
    for rank, disk in enumerate(disks):
        folder = disk / "checkpoint-3"
        begin_checkpoint(str(folder), {"format": 1, "settings": {}, "commit": COMMIT_FILE})
        (folder / "model.safetensors").write_bytes(b"w" * 64)
        (folder / f"rng_state_{rank}.pth").write_bytes(b"r" * (16 + rank))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
        folders.append(folder)
    reports = [(rank, own_files(str(folders[rank]), rank, True)) for rank in (0, 1)]
    monkeypatch.setattr(accelerate.utils, "gather_object", lambda objects: reports)
    for rank in (0, 1):
        commit_after_save(_fake_process(folders[rank], rank, 2, node=rank, save_on_each_node=True),
                          str(folders[rank]), str(disks[rank]), {"save_total_limit": None, "push_to_hub": False},
                          set())  # fmt: skip
    for rank in (0, 1):
        assert f"rng_state_{rank}.pth" in json.loads((folders[rank] / COMMIT_FILE).read_text())["files"]
        assert f"rng_state_{1 - rank}.pth" not in json.loads((folders[rank] / COMMIT_FILE).read_text())["files"]
        assert last_complete_checkpoint(str(disks[rank]))[0] == str(folders[rank])


def test_a_same_size_corruption_of_the_weights_is_not_resumed(tmp_path):
    _checkpoint(tmp_path, 1)
    damaged = _checkpoint(tmp_path, 2)
    (damaged / "model.safetensors").write_bytes(b"x" * 64)  # same size, other bytes
    assert incomplete_reason(str(damaged)) == (
        f"model.safetensors differs from {COMMIT_FILE} (64 bytes, recorded 64): damaged"
    )
    plan, _ = _plan(tmp_path, "last")
    assert plan.checkpoint == str(tmp_path / "checkpoint-1")
    assert "checkpoint-2 (model.safetensors differs from" in plan.messages[0]


def test_a_folder_killed_before_its_commit_is_torn_and_last_passes_over_it(tmp_path):
    _checkpoint(tmp_path, 1)
    torn = _checkpoint(tmp_path, 2, commit=False)
    (torn / "rng_state_1.pth").unlink()  # process 1 had not written its RNG state yet
    assert incomplete_reason(str(torn)) == (
        f"{COMMIT_FILE} is missing: the run stopped before every process had written its files"
    )
    plan, _ = _plan(tmp_path, "last")
    assert plan.checkpoint == str(tmp_path / "checkpoint-1")
    assert plan.messages[0].startswith("Skipped the newer incomplete checkpoint-2 (cegppo_commit.json is missing")
    with pytest.raises(ValueError, match=r"is not a complete checkpoint \(cegppo_commit.json is missing.*Resume .*checkpoint-1"):  # fmt: skip
        _plan(tmp_path, str(torn))


def test_the_trainer_commits_each_checkpoint_last_with_sizes_and_checksums(make_trainer, tmp_path):
    make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=1, save_total_limit=1).train()
    assert [p.name for p in tmp_path.glob("checkpoint-*")] == ["checkpoint-2"]  # rotation ran after the commit
    folder = tmp_path / "checkpoint-2"
    record = json.loads((folder / COMMIT_FILE).read_text())
    on_disk = {str(p.relative_to(folder)): p.stat().st_size for p in folder.rglob("*") if p.is_file()}
    del on_disk[COMMIT_FILE]
    assert {name: size for name, (size, _) in record["files"].items()} == on_disk
    assert {"model.safetensors", "optimizer.pt", "rng_state.pth", "trainer_state.json", CEGPPO_STATE_FILE} <= set(
        on_disk
    )
    # Written last: nothing in the folder is newer than the commit record.
    assert max(p.stat().st_mtime_ns for p in folder.rglob("*")) == (folder / COMMIT_FILE).stat().st_mtime_ns


# ----------------------------------------------------------------------------------------------------------------
# Rotation: transformers' rule over committed folders only (item 2)
# ----------------------------------------------------------------------------------------------------------------
def test_rotation_is_transformers_rule_over_committed_folders_and_keeps_the_best(tmp_path):
    for step in (1, 2, 3, 4):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 5, commit=False)  # torn: never counted, never deleted by rotation
    (tmp_path / "checkpoint-0").mkdir()  # hand-made
    (tmp_path / "checkpoint-0" / "model.safetensors").write_bytes(b"mine")
    deleted = rotate(str(tmp_path), 2, best_checkpoint=str(tmp_path / "checkpoint-1"))
    assert [Path(d).name for d in deleted] == ["checkpoint-2", "checkpoint-3"]
    assert _names(tmp_path) == [
        "checkpoint-0", "checkpoint-1", "checkpoint-4", "checkpoint-5"
    ]  # fmt: skip


def test_only_a_folder_this_trainer_began_and_never_committed_is_cleaned_up_after_a_newer_commit(tmp_path):
    left = _checkpoint(tmp_path, 1, world=1, commit=False)  # an earlier run's torn folder: not this trainer's
    began = _checkpoint(tmp_path, 2, world=1, commit=False)  # this trainer's save that failed half-way
    newer = _checkpoint(tmp_path, 4, world=1, commit=False)
    begun = {str(began), str(newer)}
    commit_after_save(_fake_process(newer, 0, 1, node=0), str(newer), str(tmp_path),
                      {"save_total_limit": None, "push_to_hub": False}, begun)  # fmt: skip
    assert left.exists() and not began.exists() and begun == set()
    assert last_complete_checkpoint(str(tmp_path))[0] == str(newer)


@pytest.mark.slow
def test_a_callback_writing_into_every_checkpoint_keeps_save_total_limit_checkpoints_and_last_resumes_the_newest(
    make_trainer, tmp_path, caplog
):
    import logging

    from transformers import TrainerCallback

    class WritesIntoCheckpoints(TrainerCallback):  # an EMA file and a line in the README, after the commit
        def on_save(self, args, state, control, **kwargs):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            (folder / "ema.bin").write_bytes(b"ema")
            with open(folder / "README.md", "a") as f:
                f.write("\nEMA saved.\n")

    (tmp_path / "checkpoint-0").mkdir()  # hand-made, holding weights
    (tmp_path / "checkpoint-0" / "model.safetensors").write_bytes(b"mine")
    kwargs = dict(num_iterations=2, save_strategy="steps", save_steps=2, save_total_limit=3)
    first = make_trainer(max_steps=8, **kwargs)
    first.add_callback(WritesIntoCheckpoints())
    first.train()
    assert _names(tmp_path) == [
        "checkpoint-0", "checkpoint-4", "checkpoint-6", "checkpoint-8"
    ]  # fmt: skip
    edited = tmp_path / "checkpoint-6" / "trainer_state.json"
    edited.write_text(json.dumps(json.loads(edited.read_text()), indent=4))  # a hand edit of an old one
    resumed = make_trainer(max_steps=10, **kwargs)
    with caplog.at_level(logging.WARNING):
        resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 10
    assert f"Resuming from {tmp_path / 'checkpoint-8'} (global step 8)" in caplog.text
    assert "Changed since its commit (by a callback or by hand; not loaded on resume): README.md." in caplog.text
    assert _names(tmp_path) == [
        "checkpoint-0", "checkpoint-6", "checkpoint-8", "checkpoint-10"
    ]  # fmt: skip
    assert inspect(str(tmp_path / "checkpoint-6")) == (None, ["README.md", "trainer_state.json"])


# ----------------------------------------------------------------------------------------------------------------
# No older run comes back; a second train(); the API's way out (items 4, 6)
# ----------------------------------------------------------------------------------------------------------------
FRESH_REFUSED = (
    r"already holds checkpoints \(latest: checkpoint-1\).*--later_checkpoints move_aside.*--overwrite_output_dir true"
    r'.*CEGPPOConfig\(later_checkpoints="move_aside"\)'
)


@pytest.mark.slow
def test_a_new_trainer_into_a_folder_with_checkpoints_is_refused_naming_the_way_out(make_trainer, tmp_path):
    make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1).train()
    with pytest.raises(ValueError, match=FRESH_REFUSED):
        make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1).train()
    release_lock(acquire_lock(str(tmp_path))[0])  # a refused run left the lock free
    make_trainer(num_iterations=2, max_steps=1, save_strategy="steps", save_steps=1,
                 later_checkpoints="move_aside").train()  # fmt: skip
    moved = list(tmp_path.glob("_superseded-*/checkpoint-1"))
    assert len(moved) == 1 and (moved[0] / COMMIT_FILE).exists()  # still resumable by its path
    assert incomplete_reason(str(moved[0])) is None
    assert (tmp_path / "checkpoint-1" / COMMIT_FILE).exists()  # this run's


@pytest.mark.slow
def test_a_second_train_on_the_same_trainer_is_allowed_as_in_trl(make_trainer, tmp_path):
    trainer = make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2)
    trainer.train()
    first = (tmp_path / "checkpoint-2" / "model.safetensors").read_bytes()
    output = trainer.train()
    assert output.global_step == 2
    # Its own earlier checkpoint is moved aside, whole: `last` can only pick up the second run's.
    assert [p.read_bytes() for p in tmp_path.glob("_superseded-*/checkpoint-2/model.safetensors")] == [first]
    assert last_complete_checkpoint(str(tmp_path))[0] == str(tmp_path / "checkpoint-2")


def test_resuming_with_later_checkpoints_is_refused_or_they_are_moved_aside_with_their_commit_records(tmp_path):
    for step in (2, 4):
        _checkpoint(tmp_path, step)
    _checkpoint(tmp_path, 5, commit=False)  # torn: this run's to write again, not a later checkpoint
    with pytest.raises(ValueError, match=r"Resuming .*checkpoint-2, but .* also holds later checkpoints \(checkpoint-4\)"):  # fmt: skip
        _plan(tmp_path, str(tmp_path / "checkpoint-2"))
    assert _plan(tmp_path, "last")[0].checkpoint == str(tmp_path / "checkpoint-4")
    args = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, later_checkpoints="move_aside", max_steps=9)
    messages = []
    plan = start_run(args, str(tmp_path / "checkpoint-2"), messages.append)
    plan.release()
    assert plan.checkpoint == str(tmp_path / "checkpoint-2")
    assert _names(tmp_path) == ["checkpoint-2", "checkpoint-5"]
    moved = next(tmp_path.glob("_superseded-*/checkpoint-4"))
    assert incomplete_reason(str(moved)) is None and f"Moved checkpoint-4 into {moved.parent}" in messages[-1]
    assert _plan(tmp_path, str(moved))[0].checkpoint == str(moved)  # resumable by its path


@pytest.mark.slow
def test_nothing_the_safety_layer_writes_reaches_the_hub(make_trainer, tmp_path, monkeypatch):
    """transformers' own push (`_push_from_checkpoint`, then `push_to_hub`) with the upload recorded: the files it
    would send, filtered by huggingface_hub's own rule, hold no lock and no moved-aside checkpoint."""
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
    make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2).train()
    hub = dict(push_to_hub=True, hub_model_id="me/run", hub_strategy="checkpoint", later_checkpoints="move_aside")
    trainer = make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2, **hub)
    trainer.train()
    trainer.push_to_hub()  # the end-of-run push of the whole `output_dir`
    assert list(tmp_path.glob("_superseded-*/checkpoint-2")) and (tmp_path / LOCK_FILE).exists()
    sent = [name for _, names in uploads for name in names]
    assert "model.safetensors" in sent and uploads
    assert not [name for name in sent if name.startswith("_") or "superseded" in name or "lock" in name], sent


# ----------------------------------------------------------------------------------------------------------------
# Requeue: before the first checkpoint, and after the last (item 5)
# ----------------------------------------------------------------------------------------------------------------
def test_last_after_a_kill_before_the_first_checkpoint_starts_fresh_and_a_mistyped_folder_is_refused(
    tmp_path, make_trainer
):
    never = tmp_path / "typo"
    with pytest.raises(ValueError, match=r"has no `checkpoint-\*` folder and no run ever started there"):
        start_run(CEGPPOConfig(output_dir=str(never), use_cpu=True), "last", print)
    run = tmp_path / "run"
    fd, _ = acquire_lock(str(run))  # the killed run's start: its lock file, no checkpoint yet
    release_lock(fd)
    messages = []
    plan = start_run(CEGPPOConfig(output_dir=str(run), use_cpu=True), "last", messages.append)
    plan.release()
    assert (
        plan.checkpoint is None
        and "a requeue of a run stopped before its first checkpoint starts fresh" in messages[0]
    )


def test_a_requeue_with_nothing_left_to_train_writes_the_final_model_and_returns(make_trainer, tmp_path):
    from safetensors.torch import load_file

    make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2).train()
    assert not (tmp_path / "model.safetensors").exists()  # killed before the final save
    requeued = make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2)
    output = requeued.train(resume_from_checkpoint=True)
    assert output.global_step == 2 and output.metrics == {}
    final, saved = (
        load_file(tmp_path / "model.safetensors"),
        load_file(tmp_path / "checkpoint-2" / "model.safetensors"),
    )
    assert final.keys() == saved.keys() and all((final[k] == saved[k]).all() for k in final)


# ----------------------------------------------------------------------------------------------------------------
# One plan per launch, made on the main process and broadcast (items 7, 9)
# ----------------------------------------------------------------------------------------------------------------
def _as_process(monkeypatch, main: bool, broadcast):
    import accelerate
    import accelerate.utils

    state = types.SimpleNamespace(is_main_process=main, num_processes=2)
    monkeypatch.setattr(accelerate, "PartialState", lambda: state)
    monkeypatch.setattr(accelerate.utils, "broadcast_object_list", broadcast)


def test_every_process_resumes_the_checkpoint_the_main_process_planned(tmp_path, monkeypatch):
    from trl import GRPOTrainer

    from cegppo_trl import CEGPPOTrainer

    _checkpoint(tmp_path, 2)
    _checkpoint(tmp_path, 4)  # written by a job still running when this rank looked, after the main process did

    def broadcast(objects, from_process=0):
        objects[:] = [str(tmp_path / "checkpoint-2"), False, None]  # the main process's answer

    _as_process(monkeypatch, False, broadcast)
    received = []
    monkeypatch.setattr(GRPOTrainer, "train", lambda self, checkpoint, *rest, **kw: received.append(checkpoint))
    trainer = CEGPPOTrainer.__new__(CEGPPOTrainer)
    trainer.args, trainer._committed = types.SimpleNamespace(output_dir=str(tmp_path), max_steps=10), set()
    CEGPPOTrainer.train(trainer, resume_from_checkpoint=True)
    assert received == [str(tmp_path / "checkpoint-2")]
    assert not (tmp_path / LOCK_FILE).exists()  # only the main process takes the lock


def test_an_oserror_in_the_main_processs_planning_still_reaches_the_broadcast(tmp_path, monkeypatch):
    sent = []
    _as_process(monkeypatch, True, lambda objects, from_process=0: sent.append(list(objects)))
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    args = CEGPPOConfig(output_dir=str(blocked / "out"), use_cpu=True)
    with pytest.raises(OSError, match="Not a directory"):
        start_run(args, None, print)
    assert sent and sent[0][2][0] == "OSError" and "Not a directory" in sent[0][2][1]


# ----------------------------------------------------------------------------------------------------------------
# The lock: flock, held while the run lives (items 1, 9 of the brief: issue item 4)
# ----------------------------------------------------------------------------------------------------------------
CONTENDER = """
import sys, time
from cegppo_trl.checkpoints import acquire_lock, release_lock
print("ready", flush=True)
for line in sys.stdin:  # "<start time> <output_dir>": try the lock at that instant, hold it 0.3 s, say what it got
    start, output_dir = line.split()
    time.sleep(max(0.0, float(start) - time.time()))
    try:
        fd, got = acquire_lock(output_dir)[0], "held"
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


def test_the_lock_is_the_kernels_and_a_second_holder_is_refused_until_the_first_lets_go(tmp_path):
    fd, existed = acquire_lock(str(tmp_path))
    assert not existed and (tmp_path / LOCK_FILE).exists()
    with pytest.raises(RuntimeError, match="being written by another live run"):
        acquire_lock(str(tmp_path))  # another open file description: flock refuses it, in this process too
    release_lock(fd)
    fd, existed = acquire_lock(str(tmp_path))
    assert existed  # the file stays: it marks that a run began here
    release_lock(fd)


@pytest.mark.slow
def test_two_runs_started_together_never_both_hold_the_lock(tmp_path):
    assert _contend(tmp_path, 20) == [["held", "refused"]] * 20


@pytest.mark.slow
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
        with pytest.raises(RuntimeError, match=r"being written by another live run \(it holds .*_cegppo_run.lock\)"):
            acquire_lock(str(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    fd, existed = acquire_lock(str(tmp_path))  # the kernel released it with its holder: no stale-owner rule
    assert existed
    release_lock(fd)


# ----------------------------------------------------------------------------------------------------------------
# A real 2-process save with a slow process (the kill-and-requeue trials: tests/test_chaos.py)
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.slow
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
    last, skipped = last_complete_checkpoint(str(output_dir))
    assert last == str(output_dir / "checkpoint-1")
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(json.loads((Path(last) / COMMIT_FILE).read_text())["files"])
    assert skipped == {str(output_dir / "checkpoint-2"): f"{COMMIT_FILE} is missing: the run stopped before every process had written its files"}  # fmt: skip


@pytest.mark.slow
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
            assert set(files) == on_disk  # what this node's process wrote, as it reported it
        assert last_complete_checkpoint(str(output_dir))[0] == str(output_dir / "checkpoint-2")


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
