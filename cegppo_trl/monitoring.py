"""Run-health monitoring: is there still a learning signal, is the left-clipped log-ratio drifting, and the metrics'
one-transfer reduction over processes.

Is there still a learning signal? A stop when every rollout batch trains on nothing.

A rollout batch whose every group has zero reward spread has zero advantage everywhere: the policy loss has no
gradient, and the logs look normal (TRL logs `frac_reward_zero_std` = 1). `RewardSignalMonitor` watches the training
rollout batches and

- counts *unscorable* batches (no completion got a reward: every reward None/NaN) and stops after
  `max_unscorable_batches` in a row;
- counts *zero-signal* batches (no term of the loss has a gradient: every group's scorable rewards are equal, exactly
  the batches in which dynamic sampling, `rollouts.informative_groups`, would keep no group, and neither TRL's KL term
  (`beta != 0`), its entropy bonus (`entropy_coef`) nor the SFT term on a completion it selects (`sft_loss_coef`) is
  on; or no completion is left in the loss) and stops
  after `max_zero_signal_batches` in a row, warning at the first batch of each such streak with its kind:

  - `"top"`: every completion got the top reward (the task is solved or too easy);
  - `"lowest"`: every completion got the lowest reward (too hard, or the reward cannot score this data);
  - `"equal"`: every completion got one value in between (the reward is constant);
  - `"mixed"`: each group is unanimous, some at the top and some at the lowest (each prompt is all or nothing);
  - `"nonfinite"`: a reward is infinite, so TRL's advantages are NaN (TRL sets them to 0). An infinite reward is
    warned about once per run at its first batch (`observe_rewards`), whatever the other groups do;
  - `"masked"`: every completion is masked out of the loss (e.g. `mask_truncated_completions` and every completion
    truncated).

"Top" and "lowest" are the weighted sum of the rewards' declared ranges (`rewards.reward_value_range`: this package's
rewards and TRL's by name declare them) when every reward declares one; otherwise the highest and lowest total reward
the run has seen so far in training, this batch included (a batch whose every value equals both is `"equal"`: a run
that has only ever seen one value cannot tell).

A run that ends with no learning signal at all (no training rollout batch had reward spread in a group, whatever
the run's length: a short run never reaches either limit) is not a success either: at the end of `train()` the
monitor records `"unscorable"` when no batch got any reward, else `"zero_signal"` (`end_of_run`).

A stop is not an exception: the monitor records `stop_reason` (`"zero_signal"` or `"unscorable"`) and its message,
and `StopWhenNothingToLearn`, a transformers callback, sets `control.should_training_stop` at the end of that optimizer
step, so transformers finishes the step, saves per the save strategy and runs `on_train_end`, `train()` returns, and
`cegppo train` saves the final model and exits with `STOP_EXIT_STATUS[stop_reason]`. The trainer hands each batch's
gathered rewards (every process sees the same tensors, so every process decides the same) and logs the returned
warning. The counts are the monitor's state: `state_dict()` is JSON-able for checkpoints.

Is the policy drifting? `LeftDriftAlarm` watches each optimizer step's mean log-ratio of the left-clipped tokens
(`cegppo/preserved/left_log_ratio`, summed over the step's micro-batches and processes, `loss_statistics`) and fires once per
episode below `left_drift_warning`; `left_drift_message` is its warning (docs/entropy-study.md: the early sign of the
beta1 drift).
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

ZERO_SIGNAL_KINDS = ("top", "lowest", "equal", "mixed", "nonfinite", "masked")
# `cegppo train`'s exit status after each stop (0: training ran to its end; 2: a refused setting).
STOP_EXIT_STATUS = {"zero_signal": 3, "unscorable": 4}
_ADVICE = {
    "top": "every completion got the top reward ({value}): the task is solved or too easy for the model. Stop here, "
    "or train on harder prompts.",
    "lowest": "every completion got the lowest reward ({value}): the task is too hard for the model, or the reward "
    "cannot score this data (a wrong reference column or answer format). Run `cegppo check` with the same arguments "
    "to see what each reward receives and how it scores the reference answers.",
    "equal": "the completions of each prompt got one reward ({value}), not all the lowest or all the top one"
    "{range_note}: the reward is constant on these completions. Check the reward function (`cegppo check` shows "
    "what it receives).",
    "mixed": "every prompt's completions got one reward each, the top for some prompts and the lowest for others "
    "({value}): each prompt is all or nothing for the model. Mix in prompts of intermediate difficulty, or raise "
    "`num_generations`.",
    "nonfinite": "a reward is infinite ({value}), so the group's advantages are NaN. Make the reward functions "
    "return finite numbers (or None for a completion they cannot score).",
    "masked": "every completion is masked out of the loss (no completion token is trained), e.g. "
    "`mask_truncated_completions=True` with every completion cut at `max_completion_length`: raise "
    "`max_completion_length`, or turn `mask_truncated_completions` off.",
}


def total_reward_range(
    ranges: Sequence[tuple[float, float] | None], weights: Sequence[float]
) -> tuple[float, float] | None:
    """`(lowest, top)` of the weighted sum of rewards with ranges `ranges`; None if any range is unknown."""
    if not ranges or any(r is None for r in ranges):
        return None
    low = sum(min(w * lo, w * hi) for (lo, hi), w in zip(ranges, weights, strict=True))
    high = sum(max(w * lo, w * hi) for (lo, hi), w in zip(ranges, weights, strict=True))
    return float(low), float(high)


class RewardSignalMonitor:
    """Counts consecutive unscorable and zero-signal training rollout batches; warns, and stops at the limits.

    Args:
        max_unscorable_batches: stop after this many consecutive batches without any reward (0: never).
        max_zero_signal_batches: stop after this many consecutive batches with zero reward spread in every group
            (0: never).
        reward_range: `(lowest, top)` of the total (weighted) reward when every reward declares its range, else None
            (the run's observed extremes are used).
        reward_names: the reward functions' names, for the messages.
        gradient_terms: the loss terms other than the policy's that have a gradient whatever the rewards (TRL's KL
            term with `beta != 0`, its entropy bonus): a batch with any of them has a learning signal.
        sft_term: the SFT term is on (`sft_loss_coef > 0`): a batch in which it trains a completion (one that
            `rollouts.correct_completions` selects with `sft_reward_threshold`) has a learning signal.
        sft_reward_threshold: the SFT term's threshold (None: the best of its group and positive).
    """

    def __init__(
        self,
        max_unscorable_batches: int = 10,
        max_zero_signal_batches: int = 0,
        reward_range: tuple[float, float] | None = None,
        reward_names: Sequence[str] = (),
        gradient_terms: Sequence[str] = (),
        sft_term: bool = False,
        sft_reward_threshold: float | None = None,
    ):
        self.max_unscorable_batches = max_unscorable_batches
        self.max_zero_signal_batches = max_zero_signal_batches
        self.reward_range = reward_range
        self.reward_names = list(reward_names)
        self.gradient_terms = tuple(gradient_terms)
        self.sft_term, self.sft_reward_threshold = sft_term, sft_reward_threshold
        self.warned_infinite = False  # the infinite-reward warning is given once per run
        self.unscorable_batches = 0  # consecutive training rollout batches without any reward
        self.zero_signal_batches = 0  # consecutive training rollout batches without reward spread in any group
        self.zero_signal_kind: str | None = None  # kind of the last zero-signal batch
        self.last_values: list[float] = []  # its distinct group values (`end_of_run`'s message)
        self.observed_min: float | None = None  # extremes of the total reward seen in training (finite ones)
        self.observed_max: float | None = None
        # Whether a training rollout batch of this run got a reward / had a learning signal (`end_of_run`)
        self.scored = False
        self.learned = False
        # Set when a limit is reached (`STOP_EXIT_STATUS`' keys); not saved: a resumed streak reaches it again.
        self.stop_reason: str | None = None
        self.stop_message: str | None = None

    @classmethod
    def for_trainer(cls, trainer) -> RewardSignalMonitor:
        """The monitor of a `CEGPPOTrainer`: its limits, reward names and the total reward's declared range."""
        from .rewards import reward_value_range

        args = trainer.args
        ranges = [reward_value_range(func) for func in trainer.reward_funcs]
        terms = [name for name, on in (("KL (`beta`)", args.beta != 0),
                 ("entropy bonus (`entropy_coef`)", getattr(args, "entropy_coef", 0) != 0  # TRL >= 1.14's fields
                  or getattr(args, "use_adaptive_entropy", False))) if on]  # fmt: skip
        return cls(
            max_unscorable_batches=args.max_unscorable_batches,
            max_zero_signal_batches=args.max_zero_signal_batches,
            reward_range=total_reward_range(ranges, trainer.reward_weights.tolist()),
            reward_names=trainer.reward_func_names,
            gradient_terms=terms,
            sft_term=args.sft_loss_coef > 0 and args.loss_type in CEGPPO_LOSS_TYPES,
            sft_reward_threshold=args.sft_reward_threshold,
        )

    # ------------------------------------------------------------------------------------------------------------
    def observe_rewards(self, rewards_per_func: torch.Tensor) -> str | None:
        """Count one training batch's per-function rewards `[N, num_funcs]` (NaN: unscorable).

        Returns:
            A warning to log when the batch has no reward at all (the stop's message at the
            `max_unscorable_batches`-th in a row, which also sets `stop_reason = "unscorable"`), else None.
        """
        unscorable = bool(torch.isnan(rewards_per_func).all()) if rewards_per_func.numel() else False
        self.scored = self.scored or not unscorable
        self.unscorable_batches = self.unscorable_batches + 1 if unscorable else 0
        infinite = torch.isinf(rewards_per_func)
        if bool(infinite.any()) and not self.warned_infinite:
            # TRL turns the NaN advantages of such a group into 0: the group trains on nothing, silently
            self.warned_infinite = True
            names = [n for i, n in enumerate(self.reward_names) if bool(infinite[:, i].any())] or self.reward_names
            return (
                f"Reward {', '.join(names)} returned an infinite score for {int(infinite.any(1).sum())} of "
                f"{rewards_per_func.size(0)} completions of this rollout batch: their groups' advantages are NaN, "
                "which TRL sets to 0, so those prompts train on nothing (warned once per run; a run with no other "
                "signal stops as zero-signal). Return a finite score (or None for a completion it cannot score)."
            )
        if not unscorable or not self.max_unscorable_batches:
            return None
        names = ", ".join(self.reward_names)
        if self.unscorable_batches >= self.max_unscorable_batches:
            return self._stop(
                "unscorable",
                f"No completion of the last {self.unscorable_batches} rollout batch(es) got a reward: every reward "
                f"function ({names}) returned None or NaN for all {rewards_per_func.size(0)} completions, so the "
                "loss and gradient are zero. Training stops after this step (`max_unscorable_batches="
                f"{self.max_unscorable_batches}`, 0 never stops). Check that the reward functions can score this task "
                "(their dataset columns, e.g. `solution`, and the completion format): `cegppo check` with the same "
                "arguments shows what each reward receives.",
            )
        return (
            f"No completion of this rollout batch got a reward (zero loss and gradient): {self.unscorable_batches} "
            f"consecutive unscorable batch(es); training stops at {self.max_unscorable_batches} "
            "(`max_unscorable_batches`)."
        )

    def observe_signal(
        self,
        rewards: torch.Tensor,
        advantages: torch.Tensor,
        num_generations: int,
        trained: torch.Tensor | None = None,
    ) -> str | None:
        """Count one training batch's learning signal.

        Args:
            rewards: total (weighted) reward per completion `(N,)`, NaN where no reward scored it, group by group.
            advantages: TRL's advantages `(N,)` of the same completions (all processes), the input dynamic sampling
                decides from; NaN where unscorable.
            num_generations: completions per group.
            trained: which completions have at least one token in the loss `(N,)`; None: all of them.

        Returns:
            A warning to log at the first zero-signal batch of a streak (the stop's message at the
            `max_zero_signal_batches`-th in a row, which also sets `stop_reason = "zero_signal"`), else None.
        """
        scorable = rewards[~torch.isnan(rewards)]
        if scorable.numel() == 0:  # an unscorable batch: `observe_rewards` counts it; neither counts nor resets
            return None
        finite = scorable[torch.isfinite(scorable)]
        if finite.numel():
            low, high = float(finite.min()), float(finite.max())
            self.observed_min = low if self.observed_min is None else min(self.observed_min, low)
            self.observed_max = high if self.observed_max is None else max(self.observed_max, high)
        masked = trained is not None and not bool(trained.any())
        if not masked and (
            bool(informative_groups(advantages, num_generations).any())
            or self.other_term_has_gradient(rewards, num_generations, trained)
        ):
            self.zero_signal_batches, self.zero_signal_kind, self.learned = 0, None, True
            return None
        self.zero_signal_batches += 1
        kind, values = ("masked", []) if masked else self.classify(rewards, num_generations)
        self.last_values = values
        first = self.zero_signal_batches == 1 or kind != self.zero_signal_kind
        self.zero_signal_kind = kind
        limit = self.max_zero_signal_batches
        if limit and self.zero_signal_batches >= limit:
            return self._stop(
                "zero_signal",
                f"No learning signal in the last {self.zero_signal_batches} rollout batch(es): in every group all "
                f"completions got the same reward, or none is trained, so the policy loss and its gradient are zero. "
                f"In the last one {self._advice(kind, values)} Training stops after this step "
                f"(`max_zero_signal_batches={limit}`, 0 never stops).",
            )
        if not first:
            return None
        stop = (
            f"training stops after {limit} such batches in a row (`max_zero_signal_batches`)"
            if limit
            else "`max_zero_signal_batches=0`: training does not stop"
        )
        return (
            f"No learning signal in this rollout batch: in every group all completions got the same reward, or none "
            f"is trained (zero policy gradient); {self._advice(kind, values)} ({stop}.)"
        )

    def other_term_has_gradient(self, rewards: torch.Tensor, num_generations: int, trained=None) -> bool:
        """Whether a loss term besides the policy's has a gradient in this batch: a `gradient_terms` one (always),
        or the SFT term on a trained completion it selects."""
        if self.gradient_terms:
            return True
        if not self.sft_term:
            return False
        selected = correct_completions(rewards, num_generations, self.sft_reward_threshold)
        return bool((selected if trained is None else selected & trained.bool()).any())

    def end_of_run(self, steps: int) -> str | None:
        """At the end of `train()`: a run of `steps` optimizer steps in which no rollout batch had a learning signal
        ends with a stop reason (and its message, returned), however short it was."""
        if self.stop_reason is not None or steps < 1 or self.learned:
            return None
        if not self.scored:
            return self._stop(
                "unscorable",
                f"No completion of this run got a reward: every reward function ({', '.join(self.reward_names)}) "
                "returned None or NaN for every completion, so no optimizer step had a gradient. Check that they can "
                "score this task (`cegppo check --call_rewards` calls them on real rows).",
            )
        kind, values = self.zero_signal_kind or "equal", self.last_values
        return self._stop(
            "zero_signal",
            "No optimizer step of this run had a learning signal: in every rollout batch all completions of each "
            f"prompt got the same reward, or none was trained. In the last one {self._advice(kind, values)}",
        )

    def _stop(self, reason: str, message: str) -> str:
        self.stop_reason, self.stop_message = reason, message
        return message

    def classify(self, rewards: torch.Tensor, num_generations: int) -> tuple[str, list[float]]:
        """The kind of a zero-signal batch (`ZERO_SIGNAL_KINDS`) and its distinct group values."""
        grouped = rewards.view(-1, num_generations)
        if bool(torch.isinf(rewards).any()):
            return "nonfinite", sorted({float(v) for v in rewards[torch.isinf(rewards)]})
        values = sorted({float(v) for v in torch.nan_to_num(grouped, nan=-math.inf).amax(dim=1) if v != -math.inf})
        if self.reward_range is not None:
            low, high = self.reward_range
        else:
            low, high = self.observed_min, self.observed_max
        if low is None or high is None or not math.isfinite(low) or not math.isfinite(high) or low == high:
            return "equal", values
        tol = 1e-6 * max(1.0, abs(low), abs(high))
        at_top = [abs(v - high) <= tol for v in values]
        at_low = [abs(v - low) <= tol for v in values]
        if all(at_top):
            return "top", values
        if all(at_low):
            return "lowest", values
        if all(t or lo for t, lo in zip(at_top, at_low)):
            return "mixed", values
        return "equal", values

    def _advice(self, kind: str, values: list[float]) -> str:
        shown = ", ".join(f"{v:g}" for v in values[:4]) + (", ..." if len(values) > 4 else "")
        if self.reward_range is not None:
            range_note = f" ({self.reward_range[0]:g} to {self.reward_range[1]:g})"
        else:
            range_note = (
                f"; the rewards ({', '.join(self.reward_names)}) declare no score range (a `reward_range` attribute), "
                "so the lowest and top are the extremes seen so far, and a run that has seen one value cannot tell"
            )
        return _ADVICE[kind].format(value=shown, range_note=range_note)

    # ------------------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The counts and observed extremes, JSON-able (for checkpoints)."""
        return {
            "unscorable_batches": self.unscorable_batches,
            "zero_signal_batches": self.zero_signal_batches,
            "zero_signal_kind": self.zero_signal_kind,
            "last_values": self.last_values,
            "observed_min": self.observed_min,
            "observed_max": self.observed_max,
            "scored": self.scored,
            "learned": self.learned,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore what `state_dict` returned (missing keys keep their fresh values)."""
        keys = ("unscorable_batches", "zero_signal_batches", "zero_signal_kind", "last_values", "observed_min")
        for key in (*keys, "observed_max"):
            if key in state:
                setattr(self, key, state[key])
        # A checkpoint written before these were saved came from a run that was not stopped: assume it learned.
        self.scored, self.learned = state.get("scored", True), state.get("learned", True)


class StopWhenNothingToLearn(TrainerCallback, ExportableState):
    """Ends training at the end of the optimizer step in which `monitor` reached a stop (`monitor.stop_reason`).

    `control.should_training_stop` is transformers' own early stop: the step finishes, the save strategy saves as it
    would, `on_train_end` runs and `train()` returns normally. The monitor's counts are this callback's state in
    `trainer_state.json` (`ExportableState`, as `EarlyStoppingCallback`'s), restored on resume.
    """

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


# ----------------------------------------------------------------------------------------------------------------
# The `cegppo/` statistics of an optimizer step
# ----------------------------------------------------------------------------------------------------------------
STATISTICS = ("tokens", "left", "left_log_ratio", "dual", "guard")  # summed; then the smallest r and -(the largest r)


@torch.no_grad()
def loss_statistics(log_ratio: torch.Tensor, mask: torch.Tensor, regions: CEGPPORegions) -> torch.Tensor:
    """One micro-batch's local statistics as one tensor, without a host transfer: the `STATISTICS` sums over the loss's
    entries (tokens, or sequences with a token for a sequence-level ratio), then ``min r`` and ``-max r`` (``inf``
    without entries), so that windows and processes combine by adding the sums and taking the minimum of the rest.

    Args:
        log_ratio: ``log r``, detached, ``(B, T)`` or ``(B, 1)``.
        mask: ``(B, T)`` loss mask.
        regions: `loss.cegppo_regions` of the same ratio.
    """
    log_ratio = log_ratio.float()
    count = mask.float() if log_ratio.shape[-1] != 1 else (mask.sum(-1, keepdim=True) > 0).float()  # [B, T] | [B, 1]
    left, right, dual, guard = (x.float().expand_as(log_ratio) for x in regions)
    del right  # TRL logs the clip fractions (`clip_ratio/*`)
    sums = torch.stack([(x * count).sum() for x in (torch.ones_like(log_ratio), left, left * log_ratio, dual, guard)])
    valid = count.bool().expand_as(log_ratio)
    smallest = torch.where(valid, log_ratio, torch.inf).amin().exp()  # inf without entries
    largest = torch.where(valid, log_ratio, -torch.inf).amax().exp()  # 0 without entries
    return torch.cat([sums, torch.stack([smallest, -largest])])


def statistics_metrics(
    values: Sequence[float], dual: bool, left_guard: bool
) -> tuple[dict[str, float], dict[str, float]]:
    """The `cegppo/` metrics of an optimizer step from its combined `loss_statistics` (all processes, all
    micro-batches), and the named sums (`LeftDriftAlarm.warning` reads them). TRL logs the clip fractions itself.

    Args:
        values: the combined statistics: the `STATISTICS` sums, the smallest ``r``, ``-`` the largest ``r``.
        dual, left_guard: whether the dual clip (`delta`) and the left guard (`delta_low`) are on.
    """
    sums = dict(zip(STATISTICS, values))
    count = sums["tokens"]
    if count == 0:  # every group, on every process, was dropped: nothing to measure
        return {}, sums
    metrics = {"cegppo/ratio/min": values[-2], "cegppo/ratio/max": -values[-1]}
    if sums["left"] > 0:  # mean log r of left-clipped tokens: a drift far below log(1 - eps) is the early sign of the
        # beta1 instability (`LeftDriftAlarm`)
        metrics["cegppo/preserved/left_log_ratio"] = sums["left_log_ratio"] / sums["left"]
    if dual:
        metrics["cegppo/dual_clip_frac"] = sums["dual"] / count
    if left_guard:
        metrics["cegppo/preserved/left_guard_frac"] = sums["guard"] / count
    return metrics, sums


# ----------------------------------------------------------------------------------------------------------------
# The left-drift early warning
# ----------------------------------------------------------------------------------------------------------------
class LeftDriftAlarm(TrainerCallback, ExportableState):
    """Once-per-episode alarm on the mean left-clipped log-ratio of each optimizer step.

    Fires on the first step of an episode of drift (a value below `threshold`), stays silent while the drift lasts,
    and re-arms once a step's value is back at or above the threshold. A step without left-clipped tokens (`None`)
    says nothing either way and leaves the state as it is.
    """

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.armed = True
        # The current optimizer step's sums, over its micro-batches: log r over left-clipped tokens, their count. Empty
        # at every checkpoint (saved after a step ends), so not in `state_dict`.
        self._window = [0.0, 0.0]

    def state_dict(self) -> dict:
        """The alarm's state as JSON: whether the next drift fires (False within an episode of drift)."""
        return {"armed": self.armed}

    def state(self) -> dict:  # `ExportableState`: in `trainer_state.json`, restored on resume
        return {"args": {"threshold": self.threshold}, "attributes": self.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.armed = bool(state["armed"])

    def update(self, value: float | None) -> bool:
        """Record one optimizer step's value; True when the warning should be given now."""
        if value is None:
            return False
        if value < self.threshold:
            fire, self.armed = self.armed, False
            return fire
        self.armed = True
        return False

    def observe(self, left_log_ratio: float, left: float, step_end: bool) -> float | None:
        """Add one micro-batch's sums (over all processes): log r over its left-clipped tokens and their count.

        Args:
            left_log_ratio: the sum of log r over the left-clipped tokens (`loss_statistics`' `left_log_ratio`).
            left: how many tokens are left-clipped (its `left`).
            step_end: whether this micro-batch ends the optimizer step (`accelerator.sync_gradients`).

        Returns:
            The step's mean left-clipped log r when the warning should be given now (`update`), else None.
        """
        self._window[0] += left_log_ratio
        self._window[1] += left
        if not step_end:  # within the optimizer step's gradient accumulation
            return None
        log_ratio_sum, count = self._window
        self._window = [0.0, 0.0]
        value = log_ratio_sum / count if count > 0 else None
        return value if self.update(value) else None

    def warning(
        self, sums: dict[str, float], step_end: bool, step: int, args: Any, coefficients: dict[str, Any]
    ) -> str | None:
        """`observe` one micro-batch's combined sums (`cegppo_metrics`); `left_drift_message` when it fires.

        Args:
            sums: the step's combined sums (`statistics_metrics`).
            step_end: whether it ends the optimizer step (`accelerator.sync_gradients`).
            step: the optimizer step, counted from 1.
            args: the run's config.
            coefficients: the step's `CEGPPOTrainer.cegppo_coefficients`.
        """
        drift = self.observe(sums["left_log_ratio"], sums["left"], step_end)
        if drift is None:
            return None
        return left_drift_message(drift, step, self.threshold, args, coefficients["beta1"], coefficients["delta_low"])


def left_drift_message(
    value: float, step: int, threshold: float, args: Any, beta1: float, delta_low: float | None
) -> str:
    """The warning `LeftDriftAlarm` fires, naming the fixes with the run's values.

    Args:
        value: the optimizer step's mean left-clipped log r.
        step: the optimizer step, counted from 1.
        threshold: `left_drift_warning`.
        args: the run's config (its batch layout and learning rate).
        beta1, delta_low: the step's coefficients.
    """
    steps = args.steps_per_generation * args.num_iterations / args.gradient_accumulation_steps
    guard = (
        f"a larger `delta_low` (now {delta_low:g}; with the guard on, this drift is a weaker sign: most false alarms "
        "in cegppo-trl's entropy studies came from guarded runs, so check validation first)"
        if delta_low
        else "the left guard `delta_low` (e.g. 0.5)"
    )
    return (
        f"cegppo/preserved/left_log_ratio = {value:.2f} at step {step} is below "
        f"`left_drift_warning` = {threshold:g}: left-clipped negative-advantage tokens are "
        "being pushed far below the rollout policy, which preceded most collapses in cegppo-trl's entropy studies (on "
        "a tiny model this warning at -1.5 caught 50 of 59 held-out collapses, with 16 false alarms in 101 stable "
        "runs). "
        f"Fixes: fewer optimizer steps per rollout batch (now {steps:g}), a lower learning rate (now "
        f"{args.learning_rate:g}), or a smaller `gppo_beta1` (now {beta1:g}) or {guard}. "
        "Not repeated until the value is back above the threshold; `left_drift_warning=None` disables it."
    )
