"""Two real processes (gloo on CPU) take the same CE-GPPO steps as one process on the same global batch.

`accelerate launch --cpu --num_processes 2` starts only one process (docs/algorithm.md §6), so the test uses
`torchrun --nproc_per_node 2` with ACCELERATE_USE_CPU=1.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).parent / "helpers" / "mp_train.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(cmd, tmp: Path) -> dict[str, tuple[dict, list]]:
    env = {**os.environ, "ACCELERATE_USE_CPU": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    result = subprocess.run([*cmd, str(WORKER), str(tmp)], env=env, capture_output=True, text=True, timeout=600)
    (tmp / "stderr.txt").parent.mkdir(parents=True, exist_ok=True)
    (tmp / "stderr.txt").write_text(result.stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    return {
        lt: (torch.load(tmp / f"params_{lt}.pt"), json.loads((tmp / f"log_history_{lt}.json").read_text()))
        for lt in ("dapo", "grpo")
    }


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("torchrun") is None and not Path(sys.executable).with_name("torchrun").exists(),
                    reason="torchrun not installed")  # fmt: skip
def test_two_processes_match_one_process(tmp_path):
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    single = _run([sys.executable], tmp_path / "single")
    multi = _run([torchrun, "--nproc_per_node", "2", "--master_port", str(_free_port())], tmp_path / "multi")
    for loss_type in ("dapo", "grpo"):  # token-count and sequence-count normalisers
        _check_same_training(loss_type, *single[loss_type], *multi[loss_type])


def _check_same_training(loss_type, single_params, single_logs, multi_params, multi_logs):
    for name, value in single_params.items():
        torch.testing.assert_close(multi_params[name], value, rtol=0, atol=1e-6, msg=f"{loss_type}: {name}")
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in single_params.values())

    steps_single = [h for h in single_logs if "cegppo/beta1" in h]
    steps_multi = [h for h in multi_logs if "cegppo/beta1" in h]
    assert len(steps_single) == len(steps_multi) == 2
    for a, b in zip(steps_single, steps_multi):
        keys = sorted(k for k in a if k.startswith("cegppo/"))
        assert keys == sorted(k for k in b if k.startswith("cegppo/"))
        assert "cegppo/dynamic_sampling/kept_groups" in keys or "cegppo/sft_loss" in keys
        for k in keys:
            assert math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-6), (loss_type, k, a[k], b[k])
    # The second step is off-policy, so something was actually clipped and preserved.
    second = steps_single[1]
    assert second["cegppo/ratio/max"] > 1.0
