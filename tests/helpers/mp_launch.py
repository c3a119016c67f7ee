"""Launch tests/helpers/mp_train.py as real multi-process jobs on CPU and compare what they trained.

One torch thread per process (two shared cores). DeepSpeed runs use its CPU accelerator (`DS_ACCELERATOR=cpu`, gloo)
and JIT-compile one op (`deepspeed_shm_comm`, gcc + ninja, a few minutes once) into a cache folder that outlives
the test run, so only the first run on a machine pays for it.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import torch
from helpers.cpu_rehearsal import cpu_rehearsal_config

WORKER = Path(__file__).parent / "mp_train.py"
REPO = Path(__file__).resolve().parents[2]
TORCHRUN = Path(sys.executable).with_name("torchrun")
ACCELERATE = Path(sys.executable).with_name("accelerate")
TORCH_EXTENSIONS_DIR = Path.home() / ".cache" / "cegppo_trl" / "torch_extensions"

# Tolerances between fp32 launch layouts of the job, each a few times the difference measured on a 2-core shared CPU
# (2026-12-01) and far below a real difference in the objective (the dapo and grpo normalisers end 0.23 apart, the
# whole update is 0.125); tests/test_multiprocess.py and tests/test_deepspeed.py say where each number comes from.
LAYOUT_ATOL = 5e-4  # 1 vs 2 processes: 6.5e-5; DeepSpeed ZeRO-3 vs DDP: 1.1e-4
ZERO2_ATOL = 5e-5  # DeepSpeed ZeRO-2 vs DDP: 6.5e-6
METRIC_RTOL = 1e-4  # every `cegppo/*` metric at every step: at most 1e-5 relative


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1", "DS_ACCELERATOR": "cpu"}
    env.setdefault("TORCH_EXTENSIONS_DIR", str(TORCH_EXTENSIONS_DIR))
    # The JIT compile calls `ninja` by name: the `ninja` package's binary sits beside this interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    # The accelerate launcher's own env flags must come from the launch line only.
    for key in [k for k in env if k.startswith(("ACCELERATE_", "FSDP_"))]:
        del env[key]
    return {**env, **extra}


def start(cmd: list[str], tmp: Path, spec: dict | None = None, **env: str) -> subprocess.Popen:
    """Start the worker under `cmd` (a launcher prefix) writing into `tmp`; its output goes to a log file there."""
    return launch([*cmd, str(WORKER), str(tmp), json.dumps(spec or {})], tmp, **env)


def launch(argv: list[str], tmp: Path, **env: str) -> subprocess.Popen:
    """Start `argv` with `launch_env(**env)`; its output goes to `tmp/output_<n>.txt` (`proc.log_path`)."""
    tmp.mkdir(parents=True, exist_ok=True)
    log_path = tmp / f"output_{len(list(tmp.glob('output_*.txt')))}.txt"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, env=launch_env(**env), stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.log_path = log_path
    return proc


def wait(procs: list[subprocess.Popen], timeout: float = 600) -> None:
    """Wait for every process (killing any still running after `timeout` s); each must exit 0."""
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for proc in procs:
        assert proc.returncode == 0, f"{proc.args} exited {proc.returncode}:\n{proc.log_path.read_text()[-4000:]}"


def run(cmd: list[str], tmp: Path, spec: dict | None = None, **env: str) -> dict[str, tuple[dict, list]]:
    """Run the worker once under `cmd` (a launcher prefix) and load what rank 0 wrote, per loss type."""
    wait([start(cmd, tmp, spec, **env)])
    return load(tmp, (spec or {}).get("loss_types", ("dapo", "grpo")))


def load(tmp: Path, loss_types) -> dict[str, tuple[dict, list]]:
    return {
        lt: (torch.load(tmp / f"params_{lt}.pt"), json.loads((tmp / f"log_history_{lt}.json").read_text()))
        for lt in loss_types
    }


def cpu_accelerate_config(shipped: str, tmp: Path, num_processes: int = 2) -> Path:
    """The CPU copy of `accelerate_configs/<shipped>` (`cpu_rehearsal_config`): a broken shipped file fails tests."""
    return cpu_rehearsal_config(REPO / "accelerate_configs" / shipped, tmp / f"cpu_{shipped}", num_processes)


def same_training(label, reference, other, atol: float, metric_rtol: float = 1e-5, metric_atol: float = 1e-6) -> float:
    """Assert two runs trained the same (parameters within `atol`, every `cegppo/*` metric at every step close);
    returns the largest parameter difference."""
    ref_params, ref_logs = reference
    params, logs = other
    assert sorted(params) == sorted(ref_params), label
    worst = max((params[name] - value).abs().max().item() for name, value in ref_params.items())
    for name, value in ref_params.items():
        torch.testing.assert_close(params[name], value, rtol=0, atol=atol, msg=f"{label}: {name}")
    assert any(not torch.equal(v, torch.zeros_like(v)) for v in ref_params.values())

    steps_ref = [h for h in ref_logs if "cegppo/beta1" in h]
    steps = [h for h in logs if "cegppo/beta1" in h]
    assert len(steps_ref) == len(steps) and len(steps) >= 2, label
    assert any(h.get("cegppo/dynamic_sampling/dropped_groups", 0) > 0 for h in steps_ref)  # a group was dropped
    for a, b in zip(steps_ref, steps):
        keys = sorted(k for k in a if k.startswith("cegppo/"))
        assert keys == sorted(k for k in b if k.startswith("cegppo/")), label
        assert "cegppo/sft_loss" in keys
        for k in keys:
            assert math.isclose(a[k], b[k], rel_tol=metric_rtol, abs_tol=metric_atol), (label, k, a[k], b[k])
    return worst
