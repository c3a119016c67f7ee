"""`CEGPPOTrainer`: TRL's `GRPOTrainer` whose clipped surrogate keeps CE-GPPO's gradient on clipped tokens.

The seam: `_compute_loss` calls TRL's method on a copy of the micro-batch; when TRL's policy forward pass returns
(`_get_per_token_logps_and_entropies`), the copy's `advantages` become `loss.preserved_advantages` (value exactly
``A``, gradient ``A * w`` on clipped tokens). TRL reads `inputs["advantages"]` after that pass (a contract since TRL
1.10, held by tests/test_trl_seam.py; `_SeamCheck` fails the first step of a TRL that does not), so its own surrogate,
masks, normalisation and metrics carry CE-GPPO's gradient. At ``beta1 = beta2 = 0`` the trainer is `GRPOTrainer`.
"""

from __future__ import annotations

from pathlib import Path

import torch
import trl
from accelerate.logging import get_logger
from transformers import TrainerCallback

from .checkpoint_hooks import CheckpointHooks
from .config import CEGPPO_LOSS_TYPES, CEGPPOConfig, on_policy_message, vanishing_term_messages
from .loss import cegppo_regions, preserved_advantages, preserved_weight, sft_loss
from .modelcard import PAPER, cegppo_settings, finish_card
from .monitoring import (
    LeftDriftAlarm,
    RewardSignalMonitor,
    StopWhenNothingToLearn,
    loss_statistics,
    statistics_metrics,
)
from .rewards import resolve_reward_names
from .rollouts import rollout_batch_masks, total_rewards
from .schedules import parse_schedule
from .trl_compat import check_trl_compatibility

logger = get_logger(__name__)


class CEGPPOTrainer(CheckpointHooks, trl.GRPOTrainer):
    """GRPO trainer whose clipped surrogate keeps bounded gradients for clipped tokens (CE-GPPO).

    Accepts exactly the arguments of [`~trl.GRPOTrainer`]; `args` is a [`CEGPPOConfig`] (a `GRPOConfig` is converted,
    with CE-GPPO's defaults). For `loss_type` in `("grpo", "bnpo", "dr_grpo", "dapo", "luspo")` clipped tokens keep
    ``beta * bound * A`` of gradient (Eq. 8); the loss, and the logged `loss`, is TRL's value at every beta, plus
    ``sft_loss_coef`` times the correct completions' token-mean NLL (`loss.sft_loss`) when `sft_loss_coef > 0`. Other
    loss types run TRL's objective unchanged. Hooks for subclasses (`cegppo_trl.research`): `current_gppo_betas()`,
    `preserved_weight(...)` and `_preserve_gradient(batch, logps, entropies)`, called at TRL's policy forward pass.

    Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
    Reinforcement Learning", ACL 2026 (arXiv:2509.20712).
    """

    _tag_names = ["trl", "grpo", "cegppo"]
    _name = "CE-GPPO"
    _paper = PAPER  # TRL's card: its paper link and citation

    def __init__(self, model, reward_funcs=None, args: CEGPPOConfig | None = None, *pargs, **kwargs):
        args = CEGPPOConfig.for_trainer(model, args, type(self))  # CE-GPPO's fields checked; the rest GRPOTrainer's
        check_trl_compatibility(args)  # Liger's fused loss before TRL 1.14: before the model loads
        super().__init__(model, resolve_reward_names(reward_funcs), args, *pargs, **kwargs)
        self._warn_if_on_policy()
        self.beta1_schedule = parse_schedule(args.gppo_beta1_schedule or args.gppo_beta1)
        self.beta2_schedule = parse_schedule(args.gppo_beta2_schedule or args.gppo_beta2)
        self._schedules_checked_for = None
        self.reward_monitor = RewardSignalMonitor.for_trainer(self)  # unscorable / zero-signal streaks and stops
        self._last_rewards_per_func = None  # set by `_calculate_rewards`, read by `_generate_and_score_completions`
        self.left_drift_alarm = None if args.left_drift_warning is None else LeftDriftAlarm(args.left_drift_warning)
        # What carries state from one optimizer step to the next: `ExportableState` callbacks (`CheckpointHooks`).
        stop = StopWhenNothingToLearn(self.reward_monitor)
        self._run_state_callbacks = tuple(c for c in (stop, self.left_drift_alarm) if c is not None)
        for callback in (*self._run_state_callbacks, _SeamCheck(self)):
            self.add_callback(callback)
        self._micro_batch: dict | None = None  # the copy TRL's `_compute_loss` reads, until its policy forward pass
        self._window: dict[str, torch.Tensor] = {}  # per mode: the step's `loss_statistics` (empty at checkpoints)
        self._unconsumed = 0  # training micro-batches of this step whose A_hat the backward pass has not reached

    def _warn_if_on_policy(self) -> None:
        """One warning for each setting that makes CE-GPPO silently GRPO (on-policy) or empties one of its terms."""
        vllm = self.use_vllm and self.vllm_importance_sampling_correction
        for message in filter(None, [on_policy_message(self.args, vllm), *vanishing_term_messages(self.args)]):
            logger.warning(message, main_process_only=True)

    @property
    def stop_reason(self) -> str | None:
        """Why the last `train()` ended early: `"zero_signal"` (no reward spread), `"unscorable"` (no reward at all) or
        None (`reward_monitor.stop_message` says more)."""
        return self.reward_monitor.stop_reason

    def current_gppo_betas(self) -> tuple[float, float]:
        """(beta1, beta2) used by the loss at the current optimizer step: the schedules' values, constant within an
        optimizer step. A subclass may move them (e.g. `cegppo_trl.research`'s entropy controller)."""
        step, total = self.state.global_step, self.state.max_steps
        if total < 1:  # before `train()` sets the run length (e.g. evaluate()): each schedule's step-0 value
            return float(self.beta1_schedule.initial), float(self.beta2_schedule.initial)
        if total != self._schedules_checked_for:  # once per run length: a window that is empty for it fails now
            self.beta1_schedule.check(total, field="gppo_beta1_schedule")
            self.beta2_schedule.check(total, field="gppo_beta2_schedule")
            self._schedules_checked_for = total
        return float(self.beta1_schedule(step, total)), float(self.beta2_schedule(step, total))

    def preserved_weight(self, log_ratio, advantages, regions, *, beta1, beta2, logps, entropies, mask):
        """Per token, the share of the clipped gradient kept (`loss.preserved_weight`: beta1 left, beta2 right, the
        left guard): the one place to change which clipped tokens keep how much.

        Args:
            log_ratio: ``log r``, detached, ``(B, T)`` (``(B, 1)`` for sequence-level ratios).
            advantages: ``(B,)`` or ``(B, T)``; regions: `loss.cegppo_regions` of both; beta1, beta2: the step's.
            logps, entropies, mask: TRL's ``(B, T)`` log-probabilities and entropies of the current policy, and the
                loss mask (unused here; for subclasses).
        """
        args = self.args
        return preserved_weight(log_ratio, advantages, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
                                beta1=beta1, beta2=beta2, delta_low=args.delta_low, delta_low_mode=args.delta_low_mode,
                                regions=regions)  # fmt: skip

    def cegppo_settings(self) -> dict[str, object]:
        """The settings that define this CE-GPPO run, as the model card shows them."""
        return cegppo_settings(self)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """TRL's card in `args.output_dir` (written at checkpoints and by `push_to_hub`) plus the CE-GPPO settings
        (`cegppo_trl.modelcard`). Call it before `save_model()` for a card beside the final model, as `cegppo train`
        does (a PEFT adapter's save then adds its metadata to it)."""
        model_name = model_name or Path(self.args.hub_model_id or self.args.output_dir).name  # TRL's checkpoints' name
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        finish_card(self)

    # Rollouts: the stops' counts, and the masks of the SFT term and dynamic sampling (the authors' recipe, reference §3)
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # TRL's `_generate_and_score_completions` gathers these but does not return them: short of copying that
        self._last_rewards_per_func = rewards_per_func  # 400-line method, an attribute hands them over
        # A training batch without any reward counts towards the unscorable stop; evaluation batches do not train.
        if self.model.training and (warning := self.reward_monitor.observe_rewards(rewards_per_func)) is not None:
            logger.warning(warning, main_process_only=True)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        mode = "train" if self.model.training else "eval"
        rewards, unscorable = total_rewards(self._last_rewards_per_func, self.reward_weights)  # all processes
        loss_mask = output["completion_mask"] * output.get("tool_mask", 1)
        advantages = None
        if mode == "train":  # gathered once: the zero-signal stop and dynamic sampling decide alike on all processes
            trained = (loss_mask.sum(1) > 0).to(output["advantages"].dtype)
            gathered = self.accelerator.gather(torch.stack([output["advantages"], trained], 1))
            advantages = gathered[:, 0].masked_fill(unscorable, torch.nan)
            warning = self.reward_monitor.observe_signal(rewards, advantages, self.num_generations, gathered[:, 1] > 0)
            if warning is not None:  # stops after `max_zero_signal_batches` in a row (`StopWhenNothingToLearn`)
                logger.warning(warning, main_process_only=True)
        if self.loss_type not in CEGPPO_LOSS_TYPES:
            return output
        args = self.args
        masks, metrics = rollout_batch_masks(rewards, advantages, loss_mask, process_index=self.accelerator.process_index,
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            dynamic_sampling=args.dynamic_sampling and mode == "train", sft_loss_coef=args.sft_loss_coef,
            sft_reward_threshold=args.sft_reward_threshold, gather=self.accelerator.gather)  # fmt: skip
        output.update(masks)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        return output

    # Loss: TRL's `_compute_loss` on a micro-batch whose advantages carry the preserved gradient (`cegppo_trl.loss`)
    def _compute_loss(self, model, inputs):
        if self.loss_type not in CEGPPO_LOSS_TYPES:  # cispo, sapo, vespo: TRL's objective as it is
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # TRL reads `advantages` from this copy; the buffered rollout batch keeps its own
        if "keep_mask" in inputs:  # dynamic sampling: dropped groups leave the loss as tokens TRL's tool mask drops
            keep = inputs["keep_mask"].unsqueeze(1).to(inputs["completion_mask"].dtype)
            inputs["tool_mask"] = keep * inputs.get("tool_mask", 1)
        self._micro_batch = inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._micro_batch = None
        if "sft_mask" in inputs:  # the authors' SFT term: over the step, the correct completions' token-mean NLL
            normaliser = inputs["num_sft_items_in_batch"] / self.accelerator.num_processes
            if self.model.training:  # the rollout batch spans `steps_per_generation` micro-batches, a step fewer
                normaliser = normaliser * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            nll = sft_loss(inputs["per_token_logps"], inputs["sft_token_mask"], normaliser)  # both set at the forward
            loss = loss + self.args.sft_loss_coef * nll
        return loss

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        batch, self._micro_batch = self._micro_batch, None  # the first call inside `_compute_loss`: the policy's
        if batch is not None:
            batch["per_token_logps"] = output[0]  # for the SFT term, with `sft_token_mask` (`_preserve_gradient`)
            self._preserve_gradient(batch, output[0], output[1])
        return output

    def _preserve_gradient(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        """Replace the micro-batch's advantages by `preserved_advantages` (off-policy, beta > 0) and add its
        `loss_statistics` to the step's window."""
        mode = "train" if self.model.training else "eval"
        beta1, beta2 = self.current_gppo_betas()
        args, advantages, old_logps = self.args, batch["advantages"], batch.get("old_per_token_logps")
        mask = batch["completion_mask"] * batch.get("tool_mask", 1)
        log_ratio = logps - (logps.detach() if old_logps is None else old_logps)  # TRL's: 0 on-policy
        if self.importance_sampling_level == "sequence":  # TRL's sequence ratio: the masked mean log r
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        regions = cegppo_regions(log_ratio.detach(), advantages, epsilon_low=self.epsilon_low,
                                 epsilon_high=self.epsilon_high, delta=args.delta, delta_low=args.delta_low)  # fmt: skip
        if (beta1 or beta2) and old_logps is not None:  # on-policy nothing is clipped; at beta = 0, TRL's advantages
            weight = self.preserved_weight(log_ratio.detach(), advantages, regions, beta1=beta1, beta2=beta2,
                                           logps=logps.detach(), entropies=entropies, mask=mask)  # fmt: skip
            batch["advantages"] = preserved_advantages(advantages, log_ratio, weight)
            if mode == "train" and batch["advantages"].requires_grad:
                self._unconsumed += 1
                batch["advantages"].register_hook(self._consumed)
        sft = batch["sft_token_mask"] = mask * batch["sft_mask"].unsqueeze(1) if "sft_mask" in batch else None
        self._log_step(mode, beta1, beta2, loss_statistics(log_ratio.detach(), mask, regions, logps, sft))

    def _consumed(self, grad: torch.Tensor) -> None:
        self._unconsumed -= 1  # the backward pass reached A_hat: TRL's loss used it

    def _log_step(self, mode: str, beta1: float, beta2: float, statistics: torch.Tensor) -> None:
        """Accumulate the micro-batch's `loss_statistics`; at the optimizer step's end (every micro-batch in
        evaluation), log beta1, beta2 and the `cegppo/` statistics, gathered once, and feed the left-drift alarm."""
        if (window := self._window.get(mode)) is not None:
            statistics = torch.cat([window[:-2] + statistics[:-2], torch.minimum(window[-2:], statistics[-2:])])
        self._window[mode] = statistics
        if mode == "train" and not self.accelerator.sync_gradients:
            return
        values = self.accelerator.gather(self._window.pop(mode)).view(-1, statistics.numel())  # [processes, n]
        sums = torch.cat([values[:, :-2].sum(0), values[:, -2:].amin(0)]).tolist()  # one transfer a step
        metrics = {"cegppo/beta1": beta1, "cegppo/beta2": beta2}
        metrics.update(statistics_metrics(sums, self.args.delta is not None, self.args.delta_low is not None))
        if mode == "train" and self.left_drift_alarm is not None:
            value = metrics.get("cegppo/preserved/left_log_ratio")
            if warning := self.left_drift_alarm.warning(value, self.state.global_step + 1, self.args, beta1):
                logger.warning(warning, main_process_only=True)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)


class _SeamCheck(TrainerCallback):
    """Before each optimizer step, once its backward passes are done: fail where TRL no longer reads
    `inputs["advantages"]` after the policy's forward pass (the backward must have reached every A_hat handed over)."""

    def __init__(self, trainer: CEGPPOTrainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.trainer._unconsumed:
            self.trainer._unconsumed = 0
            raise RuntimeError(
                f"CEGPPOTrainer: TRL {trl.__version__}'s `_compute_loss` did not use the advantages handed to it at the "
                "policy's forward pass (it must read `inputs['advantages']` after that pass, as TRL 1.10-1.16 do), so "
                "clipped tokens would get no CE-GPPO gradient: GRPO under CE-GPPO's name. Install a supported TRL."
            )
