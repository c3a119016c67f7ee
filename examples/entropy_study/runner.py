"""One RL run of the second study: `CEGPPOTrainer` on the digit-sum testbed, with probes and drift tracking.

`StudyTrainer` adds diagnostics for claim (h): how far the log-probabilities of left-clipped tokens (A < 0,
r < 1 - ε) have fallen below the rollout policy's, per optimizer step (the library has since adopted this one as
`cegppo/preserved/left_log_ratio`; the study keeps its own so that older curves line up), and more. It only reads the
tensors the loss already computed; the loss, the gradients and the random stream are exactly `CEGPPOTrainer`'s,
except in the guard arms, which also test the proposed left-side guard (`delta_low_logps`).
It lives here, not in the library, because it is a research probe (the study may not edit the trainer).
"""

from __future__ import annotations

import copy
import math
import os
import tempfile
import time
from collections.abc import Callable

import torch
from transformers import TrainerCallback, set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from cegppo_trl.research.trainer import ResearchCEGPPOConfig as CEGPPOConfig
from cegppo_trl.research.trainer import ResearchCEGPPOTrainer as CEGPPOTrainer

from .testbed import probe

__all__ = ["DELTA_LOW_MODES", "PER_STEP_KEYS", "StudyTrainer", "delta_low_logps", "digit_probe", "run_once"]

# TRL / CE-GPPO metric -> curve name, one value per optimizer step.
PER_STEP_KEYS = {
    "entropy": "entropy",
    "reward": "reward",
    "beta1": "cegppo/beta1",
    "beta2": "cegppo/beta2",
    "left_frac": "clip_ratio/low_mean",
    "right_frac": "clip_ratio/high_mean",
    "grad_share": "cegppo/preserved/grad_share",
    "left_logratio": "study/left_logratio_mean",
    "neg_logratio_min": "study/neg_logratio_min",
    "neg_deep_frac": "study/neg_below_half_frac",
    "lowp_clipped_frac": "study/lowp_clipped_frac",
    "guard_frac": "study/delta_low_frac",
    "lib_left_log_ratio": "cegppo/preserved/left_log_ratio",  # what the trainer's drift warning reads
}
DELTA_LOW_MODES = ("cutoff", "decay")


def delta_low_mask(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor,
                   delta_low: float) -> torch.Tensor:  # fmt: skip
    """The tokens the left-side guard acts on: A < 0 and r = exp(logps - old) < `delta_low`."""
    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    return (adv < 0) & (logps.detach() - old_logps < math.log(delta_low))


def delta_low_logps(logps: torch.Tensor, old_logps: torch.Tensor, advantages: torch.Tensor, delta_low: float,
                    mode: str = "cutoff") -> torch.Tensor:  # fmt: skip
    """The proposed left-side guard (the library's `delta_low` / `delta_low_mode`), as an input transform of the
    log-probs before the loss: values never change, only the gradient of the tokens `delta_low_mask` selects.

    - `"cutoff"`: no gradient (a left analogue of the dual clip; the value stays the constant -β1(1-ε)A).
    - `"decay"`: the gradient is scaled by r / `delta_low`, so β1(1-ε)A decays like the ratio; at `delta_low` =
      1 - ε it is β1·r·A, the unclipped surrogate's own gradient.

    Every other token's value and gradient are exactly as without it.
    """
    if mode not in DELTA_LOW_MODES:
        raise ValueError(f"delta_low_mode must be one of {DELTA_LOW_MODES}, got {mode!r}.")
    cut = delta_low_mask(logps, old_logps, advantages, delta_low)
    if mode == "cutoff":
        return torch.where(cut, logps.detach(), logps)
    scale = torch.where(cut, torch.exp(logps - old_logps) / delta_low, torch.ones_like(logps)).detach()
    return logps.detach() + (logps - logps.detach()) * scale


class StudyTrainer(CEGPPOTrainer):
    """`CEGPPOTrainer` (with `delta_low` set: plus the proposed left-side guard, `delta_low_logps`) and read-only
    metrics of the negative-advantage tokens' log-ratio `log r`:

    - `study/left_logratio_mean`: mean `log r` over left-clipped tokens (A < 0, r < 1 - ε), 0 when there are none;
    - `study/neg_logratio_min`: the smallest `log r` among A < 0 tokens (the deepest push below the rollout policy);
    - `study/neg_below_half_frac`: share of completion tokens with A < 0 and r < 0.5 (log-prob down by > 0.69);
    - `study/lowp_clipped_frac`: the clipped share (A < 0, r < 1 - ε or A > 0, r > 1 + ε) among the tokens the
      rollout policy sampled with probability < 0.5, the paper's "low-probability tokens" (0 on a batch's first,
      on-policy step; not logged when the run never computes old log-probs);
    - `study/delta_low_frac` (guard arms only): share of completion tokens the guard acted on.
    """

    _capture = False
    _captured = None
    _inputs = None
    delta_low: float | None = None  # the proposed guard (`delta_low_logps`); None: CEGPPOTrainer unchanged
    delta_low_mode: str = "cutoff"

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        out = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._capture:
            old = self._inputs.get("old_per_token_logps")
            if self.delta_low is not None and old is not None:
                guarded = delta_low_logps(out[0], old, self._inputs["advantages"], self.delta_low, self.delta_low_mode)
                out = (guarded, *out[1:])
            self._captured = out[0].detach()
        return out

    def _compute_loss(self, model, inputs):
        self._capture, self._captured, self._inputs = True, None, inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._capture, self._inputs = False, None
        old = inputs.get("old_per_token_logps")
        logps = self._captured
        if logps is not None:
            log_r = logps - (old if old is not None else logps)  # on-policy steps: r = 1 exactly
            adv = inputs["advantages"]
            adv = adv.unsqueeze(1) if adv.dim() == 1 else adv
            mask = inputs["completion_mask"].bool()
            neg = mask & (adv < 0)
            left = neg & (log_r < math.log(1 - self.epsilon_low))
            metrics = self._metrics["train" if model.training else "eval"]
            metrics["study/left_logratio_mean"].append(log_r[left].mean().item() if left.any() else 0.0)
            metrics["study/neg_logratio_min"].append(log_r[neg].min().item() if neg.any() else 0.0)
            metrics["study/neg_below_half_frac"].append(
                ((neg & (log_r < math.log(0.5))).sum() / mask.sum().clamp(min=1)).item()
            )
            if old is not None and self.delta_low is not None:
                acted = mask & delta_low_mask(logps, old, adv, self.delta_low)
                metrics["study/delta_low_frac"].append((acted.sum() / mask.sum().clamp(min=1)).item())
            if old is not None:
                low_p = mask & (old < math.log(0.5))
                clipped = left | (mask & (adv > 0) & (log_r > math.log(1 + self.epsilon_high)))
                metrics["study/lowp_clipped_frac"].append(
                    ((clipped & low_p).sum() / low_p.sum()).item() if low_p.any() else math.nan
                )
        self._captured = None
        return loss


def digit_probe(tokenizer, task, samples: int = 32) -> Callable[[torch.nn.Module], dict]:
    """The digit testbed's probe (`testbed.probe` on the task's probe sums) as a `model -> stats` function."""
    return lambda model: probe(model, tokenizer, task.probe_sums, samples=samples,
                               max_new_tokens=task.max_completion_length)  # fmt: skip


class _ProbeCallback(TrainerCallback):
    """Runs `measure(model)` at step 0 and every `every` optimizer steps (and at the end), keeping `(step, stats)`."""

    def __init__(self, measure: Callable[[torch.nn.Module], dict], every: int):
        self.measure, self.every = measure, every
        self.records: list[dict] = []

    def _probe(self, model, step: int) -> None:
        self.records.append({"step": step, **self.measure(model)})

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._probe(model, 0)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self._probe(model, state.global_step)


def run_once(
    overrides: dict,
    *,
    model,
    tokenizer,
    task,
    steps: int,
    seed: int,
    probe_every: int,
    probe_samples: int = 32,
    measure: Callable[[torch.nn.Module], dict] | None = None,
) -> dict:
    """Train a deep copy of `model` with `CEGPPOConfig(**overrides)` for `steps` optimizer steps.

    Seed `seed` fixes TRL's sampling and data order (`seed = data_seed`), so arms are paired by seed. `task` needs
    `train`, `reward_fn` and `max_completion_length` (the digit testbed's `DigitTask` or the quickstart's `Task`);
    `measure(model) -> stats` is the probe (default: `digit_probe` with `probe_samples` samples). The overrides'
    `study_delta_low` / `study_delta_low_mode` (not `CEGPPOConfig` fields) switch on the study's guard.

    Returns:
        `{"steps": [...], <PER_STEP_KEYS>: [...], "probe": {"steps", "validity", "pass@8", "distinct_correct",
        "distinct"}, "train_seconds", "collapsed"}`; per-step lists have one value per optimizer step (NaN when a
        metric was not logged that step: the reward is logged on every step of this setup).
    """
    set_seed(seed)
    overrides = dict(overrides)
    delta_low = overrides.pop("study_delta_low", None)  # not CEGPPOConfig fields: the study's guard
    delta_low_mode = overrides.pop("study_delta_low_mode", "cutoff")
    settings = {
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "use_cpu": True,
        "bf16": False,
        "disable_tqdm": True,
        "max_completion_length": task.max_completion_length,
        **overrides,
    }
    with tempfile.TemporaryDirectory() as output_dir:
        args = CEGPPOConfig(
            output_dir=output_dir, max_steps=steps, seed=seed, data_seed=seed, log_predictor=True, **settings
        )
        trainer = StudyTrainer(
            model=copy.deepcopy(model), reward_funcs=task.reward_fn, args=args, train_dataset=task.train,
            processing_class=tokenizer,
        )  # fmt: skip
        if delta_low is not None and not 0 < delta_low <= 1 - trainer.epsilon_low:
            raise ValueError(f"study_delta_low must be in (0, 1 - epsilon_low] = (0, {1 - trainer.epsilon_low:g}] "
                             f"(a ratio below the left clip), got {delta_low}.")  # fmt: skip
        if delta_low_mode not in DELTA_LOW_MODES:
            raise ValueError(f"study_delta_low_mode must be one of {DELTA_LOW_MODES}, got {delta_low_mode!r}.")
        trainer.delta_low, trainer.delta_low_mode = delta_low, delta_low_mode
        probes = _ProbeCallback(measure or digit_probe(tokenizer, task, probe_samples), probe_every)
        trainer.add_callback(probes)
        trainer.remove_callback(PrinterCallback)
        trainer.remove_callback(ProgressCallback)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
    per_step = [h for h in trainer.state.log_history if "loss" in h]
    curves: dict = {"steps": [int(h["step"]) for h in per_step]}
    for name, key in PER_STEP_KEYS.items():
        curves[name] = [float(h[key]) if h.get(key) is not None else math.nan for h in per_step]
    curves["probe"] = {k: [r[k] for r in probes.records] for k in probes.records[0]}
    curves["train_seconds"] = seconds
    return curves


def one_thread_worker_init() -> None:
    """Worker processes: one torch thread each (two threads per process slow down badly on shared cores)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
