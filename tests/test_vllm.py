"""CE-GPPO with vLLM generation (colocate mode) on CPU, checked end to end.

Runs `examples/vllm_cpu/train_vllm_cpu.py` (a tiny Llama, 6 optimizer steps, 2 per rollout batch, so every second
step is off-policy) in a subprocess and checks what it recorded against independent computations: vLLM's sampling
log-probs reach the loss, TRL's importance-sampling (IS) ratio is the documented function of them and multiplies the
CE-GPPO per-token loss, the ratio/clip metrics match the recorded log-probs, and the weights reach vLLM before every
generation that follows an optimizer step, with full fine-tuning and with a LoRA adapter.

Needs vLLM (`bash .ci/vllm_venv.sh`, then run pytest from that venv); skipped where `vllm` is not importable.
About 2 minutes per run (full fine-tuning, LoRA) on 2 shared CPU cores; vLLM's start-up is most of it.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.reference import trl_clip_loss

pytest.importorskip("vllm", reason="vLLM is not installed (bash .ci/vllm_venv.sh builds a venv with it)")


SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "vllm_cpu" / "train_vllm_cpu.py"
pytestmark = pytest.mark.slow

# vLLM runs the float32 checkpoint in bfloat16 on CPU (its "auto" dtype; TRL passes none): bf16 rounding of
# log-probs of a ~100-token vocabulary is ~1e-3, the optimizer steps here move them by ~1e-1.
BF16_LOGP_TOL = 2e-2


@pytest.fixture(scope="module", params=[[], ["--lora", "--learning_rate", "3e-2"]], ids=["full", "lora"])
def run(request, tmp_path_factory):
    """One training run per parameter set: full fine-tuning, and a LoRA adapter (TRL merges it into vLLM's weights
    at every sync; the higher learning rate makes the adapter move the policy as far as full fine-tuning does)."""
    out = tmp_path_factory.mktemp("vllm_cpu")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPT.parents[2]), env.get("PYTHONPATH")]))
    cmd = [sys.executable, str(SCRIPT), "--output_dir", str(out), "--record", str(out / "record.pt"), *request.param]
    result = subprocess.run(cmd, check=False, env=env, capture_output=True, text=True, timeout=900)
    (out / "log.txt").write_text(result.stdout + result.stderr)
    assert result.returncode == 0, result.stderr[-4000:]
    return torch.load(out / "record.pt", weights_only=False)


def step_logs(record):
    return [row for row in record["log_history"] if "cegppo/beta1" in row]


def test_trains_off_policy_with_vllm(run):
    assert run["summary"]["steps"] == 6
    calls = run["loss_calls"]
    assert [c["step"] for c in calls] == [0, 1, 2, 3, 4, 5]  # one micro-batch per optimizer step
    # The first step after each generation is on-policy (ratio 1), the second is not: the policy moved.
    for call in calls:
        mask = call["completion_mask"].bool()
        moved = (call["per_token_logps"] - call["old_per_token_logps"])[mask].abs().max().item()
        if call["step"] % 2 == 0:
            assert moved < 1e-5
        else:
            assert moved > 1e-2


def test_vllm_sampling_logps_reach_the_loss(run):
    for call in run["loss_calls"]:
        sampling, old, mask = call["sampling_per_token_logps"], call["old_per_token_logps"], call["completion_mask"]
        assert sampling is not None and call["importance_sampling_ratio"] is not None
        valid = mask.bool()
        # vLLM's log-probs of the sampled tokens: the same distribution as the training model's (which recomputed
        # `old_per_token_logps`) up to bf16, but not the training model's numbers.
        gap = (old - sampling)[valid].abs()
        assert gap.max().item() < BF16_LOGP_TOL
        assert gap.max().item() > 0


def expected_is_ratio(call, config):
    """TRL 1.16's vLLM IS ratio, written from its documentation (`vllm_importance_sampling_mode`)."""
    mode = config["vllm_importance_sampling_mode"]
    diff = (call["old_per_token_logps"] - call["sampling_per_token_logps"]) * call["completion_mask"]
    lo = config["vllm_importance_sampling_clip_min"]
    hi = config["vllm_importance_sampling_clip_max"]
    lo = -math.inf if lo is None else lo
    hi = math.inf if hi is None else hi
    if mode.startswith("sequence"):
        diff = diff.sum(-1, keepdim=True)
    ratio = diff.exp()
    if mode.endswith("mask"):
        return torch.where((ratio < lo) | (ratio > hi), torch.zeros_like(ratio), ratio)
    return ratio.clamp(min=lo, max=hi)


def test_importance_sampling_ratio_multiplies_the_cegppo_loss(run):
    config = run["summary"]["config"]
    assert config["vllm_importance_sampling_mode"] == "sequence_mask"
    tolerance = dict(rtol=1e-5, atol=1e-6)
    told_apart = 0  # micro-batches whose loss the same tolerance tells from the loss without the correction
    for call in run["loss_calls"]:
        is_ratio = call["importance_sampling_ratio"]
        torch.testing.assert_close(is_ratio, expected_is_ratio(call, config), rtol=1e-5, atol=1e-6)
        assert (is_ratio - 1).abs().max().item() > 1e-4  # bf16 sampling vs fp32 training: a real correction

        mask = call["completion_mask"]
        per_token = trl_clip_loss(  # the loss value is TRL's clipped surrogate (CE-GPPO's term adds 0)
            call["per_token_logps"], call["old_per_token_logps"], call["advantages"],
            epsilon_low=config["epsilon_low"], epsilon_high=config["epsilon_high"], delta=config["delta"],
        )  # fmt: skip
        # loss_type="dapo": token sum over the normaliser of one accumulation window (1 process, no accumulation:
        # the generation batch's token count spread over its `steps_per_generation` optimizer steps).
        normaliser = (
            call["num_items_in_batch"] * config["gradient_accumulation_steps"] / config["steps_per_generation"]
        )
        by_hand = (per_token * is_ratio * mask).sum() / normaliser
        without_is = (per_token * mask).sum() / normaliser
        torch.testing.assert_close(call["loss"], by_hand, **tolerance)
        told_apart += not torch.isclose(call["loss"], without_is, **tolerance).item()
    assert told_apart > 0, "the correction never changed the loss by more than the tolerance: the test shows nothing"


def test_ratio_and_clip_metrics(run):
    config = run["summary"]["config"]
    eps_low, eps_high = config["epsilon_low"], config["epsilon_high"]
    logs = step_logs(run)
    assert len(logs) == len(run["loss_calls"])
    clipped_somewhere = False
    for call, row in zip(run["loss_calls"], logs, strict=True):
        mask = call["completion_mask"].bool()
        ratio = (call["per_token_logps"] - call["old_per_token_logps"]).exp()
        adv = call["advantages"].unsqueeze(1).expand_as(ratio)
        left = ((adv < 0) & (ratio < 1 - eps_low))[mask].float()
        right = ((adv > 0) & (ratio > 1 + eps_high))[mask].float()
        # The PPO ratio is policy vs the training model's own old log-probs; the vLLM IS ratio is separate.
        assert math.isclose(row["cegppo/ratio/min"], ratio[mask].min().item(), rel_tol=1e-5)
        assert math.isclose(row["cegppo/ratio/max"], ratio[mask].max().item(), rel_tol=1e-5)
        assert math.isclose(row["clip_ratio/low_mean"], left.mean().item(), abs_tol=1e-7)
        assert math.isclose(row["clip_ratio/high_mean"], right.mean().item(), abs_tol=1e-7)
        clipped_somewhere |= bool(left.sum() + right.sum())
        # TRL's IS metrics are logged with the rollout batch (every second step here).
        if "sampling/importance_sampling_ratio/mean" in row:
            assert row["step"] % 2 == 1
    assert clipped_somewhere  # the off-policy steps clip tokens, so CE-GPPO's preserved gradients are in play


def test_weights_reach_vllm_after_each_optimizer_step(run):
    # TRL syncs lazily, before the first generation after the global step changed: here at steps 0, 2 and 4 (one
    # rollout batch per 2 optimizer steps). The example pushes once more after the last step (6) to probe it.
    assert run["syncs"] == [0, 2, 4, 6]
    probes = run["probes"]
    assert [p["step"] for p in probes] == [0, 2, 4, 6]
    for probe in probes:  # at every generation vLLM scores the probe as the current training model does
        gap = max(abs(a - b) for a, b in zip(probe["vllm"], probe["hf"], strict=True))
        assert gap < BF16_LOGP_TOL, probe
    # ... and the training model moved far more than that, so vLLM followed it rather than staying put.
    for later in probes[1:]:
        moved = max(abs(a - b) for a, b in zip(later["vllm"], probes[0]["vllm"], strict=True))
        assert moved > 10 * BF16_LOGP_TOL, later
