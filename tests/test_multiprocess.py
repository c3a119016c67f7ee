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
"""

from __future__ import annotations

import sys

import pytest
from helpers.mp_launch import LAYOUT_ATOL, METRIC_RTOL, run, same_training

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
        assert all(h["cegppo/ratio/max"] > 1.0 and h["cegppo/preserved/grad_share"] > 0 for h in off_policy)
