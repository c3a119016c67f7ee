"""Two real processes (gloo on CPU) take the same CE-GPPO steps as one process on the same global batch.

`accelerate launch --cpu --num_processes 2` starts only one process (docs/algorithm.md §6), so the test uses
`torchrun --nproc_per_node 2` with ACCELERATE_USE_CPU=1. Two nodes and DeepSpeed: tests/test_deepspeed.py.

Both runs are fp32 (`bf16=False`, as the CPU recipe sets). Measured on a 2-core shared CPU (2026-12-01), the largest
parameter difference after the job's 4 steps at lr 5e-2 is 6.5e-5 (dapo) and 5.6e-5 (grpo), and the largest
`cegppo/*` metric difference is 1e-5 relative: fp32 matmuls over a batch of 8 rows (one process) and of 4 rows (each
of two) round differently, and the job's off-policy steps (ratios up to 6, clipped gradients) amplify that over the
steps. A real difference in the objective is three orders larger: the dapo and grpo normalisers end 0.23 apart, bf16
and fp32 0.12 apart, and the whole update is 0.125. With TrainingArguments' default `bf16=True` the forward runs
under CPU bf16 autocast, whose rounding hides most of that noise (2e-6 here): a tight tolerance then passes by
rounding luck, on a precision nobody trains the CPU recipe in.

The resume tests at the end are bit for bit (`torch.equal`): a finished DDP job cut after checkpoint N, as a kill -9
right after that checkpoint would leave it, and resumed with `last`, at every step of three rollout batches and in
epochs 2 and 3 (DeepSpeed ZeRO-2 inside batches of epochs 2 and 3); and one real kill -9 of every process right
after a checkpoint inside a batch.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
import torch
from helpers.mp_launch import LAYOUT_ATOL, METRIC_RTOL, TORCHRUN, free_port, load, run, same_training, start

# Multi-process or real-model work: a separate step of .ci/run (README, Contributing).
pytestmark = [pytest.mark.slow, pytest.mark.campaign]


@pytest.mark.slow
def test_two_processes_match_one_process(tmp_path, ddp_two_process_run):
    single = run([sys.executable], tmp_path / "single", ACCELERATE_USE_CPU="1")
    for loss_type in ("dapo", "grpo"):  # token-count and sequence-count normalisers
        ddp = ddp_two_process_run[loss_type]
        same_training(loss_type, single[loss_type], ddp, atol=LAYOUT_ATOL, metric_rtol=METRIC_RTOL)
        # The off-policy steps actually clipped and preserved something.
        off_policy = [h for h in single[loss_type][1] if "cegppo/beta1" in h][1::2]
        assert all(h["cegppo/ratio/max"] > 1.0 and h["clip_ratio/region_mean"] > 0 for h in off_policy)


# ----------------------------------------------------------------------------------------------------------------
# Resumes under DDP: every step of a rollout batch, every epoch, and a real kill -9 right after a checkpoint
# ----------------------------------------------------------------------------------------------------------------
# One rollout batch of 4 optimizer steps per epoch (8 prompts, 8 completions a step): 12 steps are three batches in
# three epochs, a checkpoint at every step. Completions come from the job's deterministic `rollout_func`.
EVERY_STEP = {"loss_types": ["dapo"], "save_steps": 1, "max_steps": 12, "num_iterations": 1,
              "steps_per_generation": 4, "dataset_repeats": 2}  # fmt: skip
# Two rollout batches of 2 steps per epoch, checkpoints at batch ends: only the epoch a resume lands in matters.
EPOCHS = {**EVERY_STEP, "save_steps": 2, "steps_per_generation": 2}


def _torchrun() -> list[str]:
    return [str(TORCHRUN), "--nproc_per_node", "2", "--master_port", str(free_port())]


def _finished_run_cut_after(run: Path, step: int, into: Path) -> Path:
    """A copy of the finished job `run` as if it had been killed right after checkpoint-`step` was committed."""
    shutil.copytree(run / "dapo", into / "dapo")
    for folder in (into / "dapo").glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    for name in ("model.safetensors", "config.json", "generation_config.json", "README.md"):
        (into / "dapo" / name).unlink(missing_ok=True)
    return into


def _assert_equal_params(reference: dict, params: dict, label) -> None:
    assert sorted(params) == sorted(reference), label
    for name, value in reference.items():
        assert torch.equal(params[name], value), (label, name)


@pytest.fixture(scope="module")
def every_step_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("every-step") / "run"
    run(_torchrun(), out, EVERY_STEP, ACCELERATE_USE_CPU="1")
    return out


@pytest.mark.slow
def test_ddp_resumes_from_the_checkpoint_of_every_step_end_with_the_uninterrupted_weights(tmp_path, every_step_run):
    reference = load(every_step_run, ["dapo"])["dapo"][0]
    for step in range(1, EVERY_STEP["max_steps"]):
        files = sorted(p.name for p in (every_step_run / "dapo" / f"checkpoint-{step}").glob("rollout_batch_*"))
        assert files == ([] if step % 4 == 0 else ["rollout_batch_0.pt", "rollout_batch_1.pt"])
        cut = _finished_run_cut_after(every_step_run, step, tmp_path / f"cut-{step}")
        resumed = run(_torchrun(), cut, {**EVERY_STEP, "resume": "last"}, ACCELERATE_USE_CPU="1")["dapo"][0]
        _assert_equal_params(reference, resumed, step)


@pytest.mark.slow
def test_ddp_requeued_after_a_kill_9_right_after_a_checkpoint_inside_a_batch_ends_with_the_uninterrupted_weights(
    tmp_path, every_step_run
):
    # checkpoint-6: step 2 of the batch of epoch 2, resumed mid-epoch (the sampler's epoch, the saved batch)
    killed = start(_torchrun(), tmp_path, {**EVERY_STEP, "kill_after_save": 6}, ACCELERATE_USE_CPU="1")
    killed.wait(timeout=600)
    assert killed.returncode != 0 and not (tmp_path / "params_dapo.pt").exists()
    assert max(int(p.name.split("-")[1]) for p in (tmp_path / "dapo").glob("checkpoint-*")) == 6
    resumed = run(_torchrun(), tmp_path, {**EVERY_STEP, "resume": "last"}, ACCELERATE_USE_CPU="1")["dapo"][0]
    _assert_equal_params(load(every_step_run, ["dapo"])["dapo"][0], resumed, "kill -9 after checkpoint-6")


@pytest.mark.slow
def test_ddp_resumes_in_epochs_2_and_3_end_with_the_uninterrupted_weights(tmp_path):
    # accelerate's `skip_first_batches` hid the sampler from `set_epoch` in the epoch a DDP run resumed in (it drew
    # epoch 1's order); an epoch's start and one process were exact.
    out = tmp_path / "run"
    reference = run(_torchrun(), out, EPOCHS, ACCELERATE_USE_CPU="1")["dapo"][0]
    for step in (6, 10):  # step 2 of epoch 2, of epoch 3
        cut = _finished_run_cut_after(out, step, tmp_path / f"cut-{step}")
        resumed = run(_torchrun(), cut, {**EPOCHS, "resume": "last"}, ACCELERATE_USE_CPU="1")["dapo"][0]
        _assert_equal_params(reference, resumed, step)


@pytest.mark.slow
def test_zero2_resumes_inside_a_batch_in_epochs_2_and_3_end_with_the_uninterrupted_weights(tmp_path):
    # DeepSpeed ZeRO-2 on CPU (the shipped config's CPU copy): each process's batch file as under DDP
    from helpers.chaos import launcher

    prefix, env, extra = launcher("zero2", tmp_path)
    reference = run(prefix, tmp_path / "run", {**EVERY_STEP, **extra}, **env)["dapo"][0]
    for step in (6, 10):  # steps 2 of the batches of epochs 2 and 3
        cut = _finished_run_cut_after(tmp_path / "run", step, tmp_path / f"cut-{step}")
        prefix, env, extra = launcher("zero2", tmp_path)  # a fresh port
        resumed = run(prefix, cut, {**EVERY_STEP, **extra, "resume": "last"}, **env)["dapo"][0]
        _assert_equal_params(reference, resumed, step)
