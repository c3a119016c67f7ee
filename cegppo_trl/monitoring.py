"""Run health: is there still a learning signal, is the left-clipped log-ratio drifting; the `cegppo/` metrics.

`RewardSignalMonitor` counts the training rollout batches in a row that are *unscorable* (every reward None/NaN) or
have *zero signal* (no group with reward spread and no other loss term with a gradient, or no completion in the loss),
warns at a streak's first batch, and stops at the limits or at the end of a run that never had a signal, through
transformers' `control.should_training_stop` (`StopWhenNothingToLearn`). `LeftDriftAlarm` warns once per episode of
`cegppo/preserved/left_log_ratio` below `left_drift_warning`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .config import CEGPPO_LOSS_TYPES
from .loss import CEGPPORegions
from .rollouts import correct_completions, informative_groups

logger = logging.getLogger(__name__)

# `cegppo train`'s exit status after each stop (0: trained to the end; 2: a refused setting).
STOP_EXIT_STATUS = {"zero_signal": 3, "unscorable": 4}
_ADVICE = {  # each zero-signal kind: what the batch shows ({value}) and what to do
    "top": "every completion got the top reward ({value}): the task is solved; stop, or train on harder prompts.",
    "lowest": "every completion got the lowest reward ({value}): the task is too hard or unscorable; `cegppo check`.",
    "equal": "each prompt's completions got one reward ({value}), not all the lowest or all the top one{range_note}: "
    "the reward is constant on them; `cegppo check`.",
    "mixed": "each prompt's completions got one reward, the top or the lowest ({value}): mix in prompts of "
    "intermediate difficulty, or raise `num_generations`.",
    "nonfinite": "a reward is infinite ({value}), so its group's advantages are NaN: return finite numbers or None.",
    "masked": "every completion is masked out of the loss (`mask_truncated_completions=True` with every completion "
    "cut): raise `max_completion_length`.",
}
_STATE = ("unscorable_batches", "zero_signal_batches", "zero_signal_kind", "last_values", "observed_min",
          "observed_max", "scored", "learned")  # fmt: skip


class RewardSignalMonitor:
    """Counts consecutive unscorable and zero-signal training rollout batches; warns, and stops at the limits (0:
    never). `reward_range` is the total reward's `(lowest, top)` when every reward declares it (else the run's observed
    extremes are used); `other_terms`: a loss term has a gradient whatever the rewards (TRL's KL term, entropy bonus);
    `sft_term`: a batch in which the SFT term trains a completion has a signal."""

    def __init__(
        self,
        max_unscorable_batches: int = 10,
        max_zero_signal_batches: int = 0,
        reward_range: tuple[float, float] | None = None,
        reward_names: Sequence[str] = (),
        other_terms: bool = False,
        sft_term: bool = False,
        sft_reward_threshold: float | None = None,
    ):
        self.max_unscorable_batches, self.max_zero_signal_batches = max_unscorable_batches, max_zero_signal_batches
        self.reward_range, self.reward_names, self.other_terms = reward_range, list(reward_names), other_terms
        self.sft_term, self.sft_reward_threshold = sft_term, sft_reward_threshold
        self.warned_infinite = False  # once per run
        self.unscorable_batches = self.zero_signal_batches = 0  # the current streaks
        self.zero_signal_kind, self.last_values = None, []  # the last zero-signal batch's kind and group values
        self.observed_min = self.observed_max = None  # of the finite total rewards seen in training
        self.scored = self.learned = False  # a training batch of this run got a reward / had a signal
        self.stop_reason = self.stop_message = None  # not saved: a resumed streak reaches the stop again

    @classmethod
    def for_trainer(cls, trainer) -> RewardSignalMonitor:
        from .rewards import reward_value_range

        args = trainer.args
        ranges = [reward_value_range(func) for func in trainer.reward_funcs]
        total_range = None
        if ranges and all(r is not None for r in ranges):
            ends = [(w * lo, w * hi) for (lo, hi), w in zip(ranges, trainer.reward_weights.tolist(), strict=True)]
            total_range = (float(sum(map(min, ends))), float(sum(map(max, ends))))
        entropy_bonus = getattr(args, "entropy_coef", 0) != 0 or getattr(args, "use_adaptive_entropy", False)
        sft_term = args.sft_loss_coef > 0 and args.loss_type in CEGPPO_LOSS_TYPES
        return cls(args.max_unscorable_batches, args.max_zero_signal_batches, total_range, trainer.reward_func_names,
                   args.beta != 0 or entropy_bonus, sft_term, args.sft_reward_threshold)  # fmt: skip

    def observe_rewards(self, rewards_per_func: torch.Tensor) -> str | None:
        """Count one training batch's rewards `[N, num_funcs]` (NaN: unscorable); the warning to log, if any."""
        unscorable = bool(torch.isnan(rewards_per_func).all()) if rewards_per_func.numel() else False
        self.scored = self.scored or not unscorable
        self.unscorable_batches = self.unscorable_batches + 1 if unscorable else 0
        infinite = torch.isinf(rewards_per_func)
        if bool(infinite.any()) and not self.warned_infinite:
            self.warned_infinite = True
            names = [n for i, n in enumerate(self.reward_names) if bool(infinite[:, i].any())] or self.reward_names
            return (
                f"Reward {', '.join(names)} returned an infinite score for {int(infinite.any(1).sum())} of "
                f"{rewards_per_func.size(0)} completions: their advantages are NaN, which TRL sets to 0. Return a "
                "finite score or None."
            )
        if not unscorable or not self.max_unscorable_batches:
            return None
        if self.unscorable_batches >= self.max_unscorable_batches:
            return self._stop(
                "unscorable",
                f"No completion of the last {self.unscorable_batches} rollout batch(es) got a reward: every reward "
                f"function ({', '.join(self.reward_names)}) returned None or NaN for all {rewards_per_func.size(0)} "
                f"completions. Training stops after this step (`max_unscorable_batches={self.max_unscorable_batches}`, "
                "0 never stops). `cegppo check` shows what each reward receives.",
            )
        return (
            f"No completion of this rollout batch got a reward (zero gradient): {self.unscorable_batches} consecutive "
            f"unscorable batch(es); training stops at {self.max_unscorable_batches} (`max_unscorable_batches`)."
        )

    def observe_signal(self, rewards, advantages, num_generations: int, trained=None) -> str | None:
        """Count one training batch's learning signal from its `(N,)` total rewards, TRL's advantages (both NaN where
        unscorable) and which completions have a token in the loss (None: all); the warning to log, if any."""
        scorable = rewards[~torch.isnan(rewards)]
        if scorable.numel() == 0:  # unscorable: `observe_rewards` counts it; it neither counts nor resets here
            return None
        finite = scorable[torch.isfinite(scorable)]
        if finite.numel():
            low, high = float(finite.min()), float(finite.max())
            self.observed_min = low if self.observed_min is None else min(self.observed_min, low)
            self.observed_max = high if self.observed_max is None else max(self.observed_max, high)
        trained = torch.ones_like(rewards, dtype=torch.bool) if trained is None else trained.bool()
        masked, threshold = not bool(trained.any()), self.sft_reward_threshold
        # the SFT term has a gradient where it trains a correct completion; the other terms whatever the rewards
        sft = self.sft_term and bool((correct_completions(rewards, num_generations, threshold) & trained).any())
        if not masked and (self.other_terms or sft or bool(informative_groups(advantages, num_generations).any())):
            self.zero_signal_batches, self.zero_signal_kind, self.learned = 0, None, True
            return None
        self.zero_signal_batches += 1
        kind, self.last_values = ("masked", []) if masked else self.classify(rewards, num_generations)
        first, self.zero_signal_kind = self.zero_signal_batches == 1 or kind != self.zero_signal_kind, kind
        advice, limit = self._advice(kind, self.last_values), self.max_zero_signal_batches
        if limit and self.zero_signal_batches >= limit:
            return self._stop(
                "zero_signal",
                f"No learning signal in the last {self.zero_signal_batches} rollout batch(es): in every group all "
                f"completions got the same reward, or none is trained. In the last one {advice} Training stops after "
                f"this step (`max_zero_signal_batches={limit}`, 0 never stops).",
            )
        if not first:
            return None
        stop = f"training stops after {limit} such batches in a row" if limit else "`max_zero_signal_batches=0`"
        return (
            "No learning signal in this rollout batch: in every group all completions got the same reward, or none "
            f"is trained (zero policy gradient); {advice} ({stop}.)"
        )

    def end_of_run(self, steps: int) -> str | None:
        """At the end of `train()`: a run without any learning signal ends with a stop reason, however short."""
        if self.stop_reason is not None or steps < 1 or self.learned:
            return None
        if not self.scored:
            return self._stop(
                "unscorable",
                f"No completion of this run got a reward from {', '.join(self.reward_names)}: check that they can "
                "score this task (`cegppo check --call_rewards`).",
            )
        return self._stop(
            "zero_signal",
            "No optimizer step of this run had a learning signal: in every rollout batch all completions of each "
            f"prompt got the same reward, or none was trained. In the last one "
            f"{self._advice(self.zero_signal_kind or 'equal', self.last_values)}",
        )

    def _stop(self, reason: str, message: str) -> str:
        self.stop_reason, self.stop_message = reason, message
        return message

    def classify(self, rewards: torch.Tensor, num_generations: int) -> tuple[str, list[float]]:
        if bool(torch.isinf(rewards).any()):
            return "nonfinite", sorted({float(v) for v in rewards[torch.isinf(rewards)]})
        grouped = torch.nan_to_num(rewards.view(-1, num_generations), nan=-math.inf).amax(dim=1)
        values = sorted({float(v) for v in grouped if v != -math.inf})
        low, high = self.reward_range or (self.observed_min, self.observed_max)
        if low is None or high is None or not math.isfinite(low) or not math.isfinite(high) or low == high:
            return "equal", values  # a run that has seen one value cannot tell top from lowest
        tol = 1e-6 * max(1.0, abs(low), abs(high))
        at_top, at_low = [abs(v - high) <= tol for v in values], [abs(v - low) <= tol for v in values]
        if all(at_top):
            return "top", values
        if all(at_low):
            return "lowest", values
        return ("mixed" if all(t or lo for t, lo in zip(at_top, at_low)) else "equal"), values

    def _advice(self, kind: str, values: list[float]) -> str:
        shown = ", ".join(f"{v:g}" for v in values[:4]) + (", ..." if len(values) > 4 else "")
        range_note = f" ({r[0]:g} to {r[1]:g})" if (r := self.reward_range) else "; the rewards declare no score range"
        return _ADVICE[kind].format(value=shown, range_note=range_note)

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in _STATE}

    def load_state_dict(self, state: dict) -> None:
        # a checkpoint without `scored` / `learned` came from a run that was not stopped: it learned
        for key in _STATE:
            setattr(self, key, state.get(key, True if key in ("scored", "learned") else getattr(self, key)))


class StopWhenNothingToLearn(TrainerCallback, ExportableState):
    """Ends training at the end of the optimizer step in which `monitor` reached a stop; the monitor's counts are this
    callback's state in `trainer_state.json`."""

    def __init__(self, monitor: RewardSignalMonitor | None = None):
        self.monitor = monitor

    def state(self) -> dict:
        return {"args": {}, "attributes": self.monitor.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.monitor.load_state_dict(state)

    def on_train_begin(self, args, state, control, **kwargs):
        self.monitor.stop_reason = self.monitor.stop_message = None  # a second `train()` starts without a stop
        if state.global_step == 0:  # a fresh run (a resume restored what its checkpoint saw)
            self.monitor.scored = self.monitor.learned = False

    def on_step_end(self, args, state, control, **kwargs):
        if self.monitor.stop_reason is not None:
            control.should_training_stop = True

    def on_train_end(self, args, state, control, **kwargs):
        message = self.monitor.end_of_run(state.global_step)
        if message is not None and state.is_world_process_zero:
            logger.warning(message)


# The `cegppo/` statistics of an optimizer step: these sums, then the smallest r and -(the largest r)
STATISTICS = ("tokens", "left", "left_log_ratio", "dual", "guard", "sft_nll", "sft_tokens")


@torch.no_grad()
def loss_statistics(log_ratio, mask, regions: CEGPPORegions, logps=None, sft_mask=None) -> torch.Tensor:
    """One micro-batch's statistics as one tensor, without a host transfer: the `STATISTICS` sums over the loss's
    entries (tokens, or sequences for a sequence-level ratio), then ``min r`` and ``-max r``: windows and processes
    combine by adding the sums and taking the minimum of the rest. `logps` and `sft_mask` when the SFT term is on."""
    log_ratio = log_ratio.float()
    count = mask.float() if log_ratio.shape[-1] != 1 else (mask.sum(-1, keepdim=True) > 0).float()  # [B, T] | [B, 1]
    left, _, dual, guard = (x.float().expand_as(log_ratio) for x in regions)
    sums = [(x * count).sum() for x in (torch.ones_like(log_ratio), left, left * log_ratio, dual, guard)]
    sft = [-(logps.float() * sft_mask).sum(), sft_mask.float().sum()] if sft_mask is not None else [sums[0] * 0] * 2
    valid = count.bool().expand_as(log_ratio)
    smallest = torch.where(valid, log_ratio, torch.inf).amin().exp()
    largest = torch.where(valid, log_ratio, -torch.inf).amax().exp()
    return torch.stack([*sums, *sft, smallest, -largest])


def statistics_metrics(values: Sequence[float], dual: bool, left_guard: bool) -> dict[str, float]:
    """The `cegppo/` metrics of an optimizer step from its combined `loss_statistics`."""
    sums = dict(zip(STATISTICS, values))
    count = sums["tokens"]
    if count == 0:  # every group, on every process, was dropped: nothing to measure
        return {}
    metrics = {"cegppo/ratio/min": values[-2], "cegppo/ratio/max": -values[-1]}
    if sums["left"] > 0:  # far below log(1 - eps): the early sign of the beta1 drift (`LeftDriftAlarm`)
        metrics["cegppo/preserved/left_log_ratio"] = sums["left_log_ratio"] / sums["left"]
    if dual:
        metrics["cegppo/dual_clip_frac"] = sums["dual"] / count
    if left_guard:
        metrics["cegppo/preserved/left_guard_frac"] = sums["guard"] / count
    if sums["sft_tokens"] > 0:  # the step's correct completions' token-mean NLL
        metrics["cegppo/sft_loss"] = sums["sft_nll"] / sums["sft_tokens"]
    return metrics


class LeftDriftAlarm(TrainerCallback, ExportableState):
    """Fires on the first optimizer step of an episode of drift (mean left-clipped log r below `threshold`) and re-arms
    once a step is back at or above it; a step without left-clipped tokens (None) changes nothing."""

    def __init__(self, threshold: float):
        self.threshold, self.armed = threshold, True

    def state(self) -> dict:
        return {"args": {"threshold": self.threshold}, "attributes": {"armed": self.armed}}

    def load_state_dict(self, state: dict) -> None:
        self.armed = bool(state["armed"])

    def update(self, value: float | None) -> bool:
        if value is None:
            return False
        fire, self.armed = self.armed and value < self.threshold, value >= self.threshold
        return fire

    def warning(self, value: float | None, step: int, args: Any, beta1: float) -> str | None:
        return left_drift_message(value, step, self.threshold, args, beta1) if self.update(value) else None


def left_drift_message(value: float, step: int, threshold: float, args: Any, beta1: float) -> str:
    """The drift warning, naming each fix with the run's values."""
    steps = args.steps_per_generation * args.num_iterations / args.gradient_accumulation_steps
    guard = f"a larger `delta_low` (now {args.delta_low:g}; with the guard on, check validation first)" if (
        args.delta_low) else "the left guard `delta_low` (e.g. 0.5)"  # fmt: skip
    return (f"cegppo/preserved/left_log_ratio = {value:.2f} at step {step} is below `left_drift_warning` = "
            f"{threshold:g}: left-clipped tokens are pushed far below the rollout policy, which preceded most entropy "
            f"collapses in cegppo-trl's studies. Fixes: fewer optimizer steps per rollout batch (now {steps:g}), a lower "
            f"learning rate (now {args.learning_rate:g}), a smaller `gppo_beta1` (now {beta1:g}) or {guard}. Said "
            "again once the value is back above it; `left_drift_warning=None` disables it.")  # fmt: skip
