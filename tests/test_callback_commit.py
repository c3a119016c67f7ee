"""A checkpoint is committed after every callback's `on_save`: what a callback writes into it (a LoRA
adapter and its card, a README line, an EMA file) is in the commit, and the newest checkpoint resumes the
uninterrupted run bit for bit, through `CEGPPOTrainer` as through `GRPOTrainer`. A kill between transformers' files
and the commit leaves the folder unmarked, and `last` passes over it with its reason.

The job is tests/helpers/ckpt_job.py's: off-policy (two optimizer steps per rollout batch), a checkpoint every rollout
batch, 8 steps in epoch 1. "A kill after the newest checkpoint's commit" is the uninterrupted run's folder with its
last checkpoint and final model taken away.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.ckpt_job import build, params, torchrun

from cegppo_trl.checkpoints import COMMIT_FILE, marker

ROOT = Path(__file__).resolve().parents[1]
JOB = ROOT / "tests" / "helpers" / "ckpt_job.py"
CASES = {  # callback -> its settings
    "peft": dict(lora=True),
    "readme": {},
    "ema": dict(save_total_limit=3),
}


def _run(output_dir: Path, trainer: str, case: str, resume=None):
    job = build(dict(trainer=trainer, output_dir=output_dir, max_steps=8, callback=case, **CASES[case]))
    job.train(resume_from_checkpoint=resume)
    return job


def _killed_after(run: Path, into: Path, step: int) -> Path:
    """`run` as a job killed after its checkpoint-`step` was written: later checkpoints and the final model gone."""
    shutil.copytree(run, into)
    for folder in into.glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    for name in ("model.safetensors", "adapter_model.safetensors"):
        (into / name).unlink(missing_ok=True)
    return into


def _assert_same_weights(resumed, final: dict) -> None:
    now = params(resumed)
    assert now.keys() == final.keys()
    for name, value in now.items():
        assert torch.equal(value, final[name]), name


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["grpo", "cegppo"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_checkpoint_a_callback_wrote_into_resumes_the_run_bit_for_bit(tmp_path, case, trainer):
    reference = _run(tmp_path / "run", trainer, case)
    final = params(reference)
    saved = sorted(int(p.name.split("-")[1]) for p in (tmp_path / "run").glob("checkpoint-*"))
    assert saved == ([4, 6, 8] if case == "ema" else [2, 4, 6, 8])  # save_total_limit=3 rotated checkpoint-2
    newest = tmp_path / "run" / "checkpoint-6"
    if case == "peft":
        assert (newest / "adapter_model.safetensors").exists() and not (newest / "model.safetensors").exists()
    if case == "ema":
        assert (newest / "ema.pt").exists()
    if trainer == "cegppo":  # the commit came after the callback: every file as the callback left it
        files = json.loads((newest / COMMIT_FILE).read_text())["files"]
        assert files == {n: (newest / n).stat().st_size for n in os.listdir(newest) if n != COMMIT_FILE}
    requeue = _killed_after(tmp_path / "run", tmp_path / "requeue", 6)
    resumed = _run(requeue, trainer, case, resume=True)
    assert resumed.state.global_step == 8
    _assert_same_weights(resumed, final)


def _job(spec: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1",
           "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}  # fmt: skip
    return subprocess.run([sys.executable, str(JOB), json.dumps(spec, default=str)], env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip


@pytest.mark.slow
def test_a_kill_while_a_callback_writes_leaves_the_folder_unmarked_and_last_passes_over_it(tmp_path, caplog):
    killed = _job(dict(trainer="cegppo", output_dir=tmp_path / "run", max_steps=8, callback="kill"))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    torn = tmp_path / "run" / "checkpoint-4"
    assert (torn / "trainer_state.json").exists() and marker(str(torn)) is None  # transformers had finished
    with caplog.at_level("WARNING"):
        resumed = _run(tmp_path / "run", "cegppo", "readme", resume=True)  # the requeue, the callback now harmless
    assert (f"{tmp_path / 'run'}: passed over checkpoint-4 (it has no {COMMIT_FILE}: a run of this library "
            "began it and did not finish it)") in caplog.text  # fmt: skip
    reference = _run(tmp_path / "reference", "cegppo", "readme")
    _assert_same_weights(resumed, params(reference))


@pytest.mark.slow
def test_training_args_bin_keeps_the_real_save_total_limit(tmp_path):
    # the limit is held back from transformers during `train()`, not from what a checkpoint records
    _run(tmp_path / "run", "cegppo", "ema")
    for folder in (tmp_path / "run").glob("checkpoint-*"):
        args = torch.load(folder / "training_args.bin", weights_only=False)  # written here, by this test
        assert args.save_total_limit == 3, folder


@pytest.mark.slow
def test_a_step_saved_again_lists_only_what_this_save_wrote(tmp_path):
    # a folder of an earlier, unfinished save at the same step (another launch's RNG file in it)
    stale = tmp_path / "run" / "checkpoint-2"
    stale.mkdir(parents=True)
    (stale / "rng_state_1.pth").write_bytes(b"old")
    (stale / "cegppo_state.json").write_text("{}")
    _run(tmp_path / "run", "cegppo", "readme")
    assert not (stale / "rng_state_1.pth").exists()
    assert "rng_state_1.pth" not in json.loads((stale / COMMIT_FILE).read_text())["files"]


@pytest.mark.slow
def test_sigterm_with_enable_jit_checkpoint_commits_the_step_and_ends_the_job_as_sigterm_does(tmp_path):
    # One rollout batch a step: the request is raised during step 4; that step's end is saved through the callbacks,
    # committed, and the job ends by the signal (no "finished" run); the requeue resumes checkpoint-4 exactly.
    spec = dict(trainer="cegppo", max_steps=6, steps_per_generation=1, save_steps=3, enable_jit_checkpoint=True)
    stopped = _job({**spec, "output_dir": tmp_path / "run", "callback": "sigterm"})
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    assert "SIGTERM: stopped at step 4 of 6 after committing its checkpoint" in stopped.stderr
    saved = sorted(p.name for p in (tmp_path / "run").iterdir() if p.name.startswith("checkpoint-"))
    assert saved == ["checkpoint-3", "checkpoint-4"]  # 4: the step transformers stopped at, not a save step
    assert not (tmp_path / "run" / "model.safetensors").exists()
    requeued = _job({**spec, "output_dir": tmp_path / "run", "resume": True, "params": tmp_path / "resumed.pt"})
    assert requeued.returncode == 0, requeued.stderr[-3000:]
    assert f"Resuming from {tmp_path / 'run' / 'checkpoint-4'} (global step 4)" in requeued.stderr
    reference = _job({**spec, "output_dir": tmp_path / "reference", "params": tmp_path / "reference.pt"})
    assert reference.returncode == 0, reference.stderr[-3000:]
    resumed, final = torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "reference.pt")
    assert resumed.keys() == final.keys() and all(torch.equal(resumed[k], final[k]) for k in final)
    # GRPOTrainer: transformers' checkpoint at the start of step 5, then a normal end (exit 0) as if finished
    grpo = _job({**spec, "trainer": "grpo", "output_dir": tmp_path / "grpo", "callback": "sigterm"})
    assert grpo.returncode == 0, grpo.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.campaign
def test_ddp_a_checkpoint_only_rank_0s_callback_wrote_into_resumes_the_run_bit_for_bit(tmp_path):
    spec = dict(trainer="cegppo", max_steps=8, callback="readme")
    torchrun({**spec, "output_dir": tmp_path / "run", "params": tmp_path / "reference.pt"})
    newest = tmp_path / "run" / "checkpoint-6"
    files = json.loads((newest / COMMIT_FILE).read_text())["files"]
    assert {"rng_state_0.pth", "rng_state_1.pth", "README.md"} <= set(files)  # both processes', and the callback's
    requeue = _killed_after(tmp_path / "run", tmp_path / "requeue", 6)
    torchrun({**spec, "output_dir": requeue, "resume": True, "params": tmp_path / "resumed.pt"})
    resumed, final = torch.load(tmp_path / "resumed.pt"), torch.load(tmp_path / "reference.pt")
    assert resumed.keys() == final.keys() and all(torch.equal(resumed[k], final[k]) for k in final)


_SIGTERM_JOB = dict(trainer="cegppo", max_steps=60, save_steps=1000, enable_jit_checkpoint=True, callback="slow")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    where = tmp_path_factory.mktemp("uninterrupted")
    torchrun({**_SIGTERM_JOB, "output_dir": where / "run", "params": where / "final.pt"})
    return torch.load(where / "final.pt")


@pytest.mark.slow
@pytest.mark.campaign
@pytest.mark.parametrize("target", ["one worker", "the launcher", "all"])
def test_ddp_sigterm_to_any_processes_saves_one_step_on_every_rank_and_the_requeue_resumes_it(
    tmp_path, target, uninterrupted
):
    # transformers' JIT checkpoint ran per process: a signal to one worker hung the job or aborted it in gloo
    import psutil

    run = tmp_path / "run"
    launcher = torchrun({**_SIGTERM_JOB, "output_dir": run, "pid_dir": tmp_path}, wait=False)
    workers = []
    try:
        while len(workers) < 2 and launcher.poll() is None:
            workers = [int(p.read_text()) for p in tmp_path.glob("pid_*") if p.read_text()]
            time.sleep(0.1)
        time.sleep(4)  # training
        victims = {"one worker": workers[1:], "the launcher": [launcher.pid], "all": [launcher.pid, *workers]}
        for pid in victims[target]:
            os.kill(pid, signal.SIGTERM)
        launcher.wait(timeout=120)
    finally:
        for pid in [launcher.pid, *workers]:  # torchrun's workers have sessions of their own
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(pid).kill()
    log = Path(f"{run}.log").read_text()
    saved = sorted(run.glob("checkpoint-*"))
    assert len(saved) == 1 and (saved[0] / COMMIT_FILE).exists(), log[-4000:]  # one step, saved by every rank
    step = int(saved[0].name.split("-")[1])
    assert 0 < step < 60 and f"SIGTERM: stopped at step {step} of 60" in log, log[-4000:]
    assert {"rng_state_0.pth", "rng_state_1.pth"} <= set(os.listdir(saved[0]))
    torchrun({**_SIGTERM_JOB, "output_dir": run, "resume": True, "params": tmp_path / "resumed.pt"})
    resumed = torch.load(tmp_path / "resumed.pt")
    assert resumed.keys() == uninterrupted.keys()
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)
