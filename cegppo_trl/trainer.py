"""`CEGPPOTrainer`: TRL's `GRPOTrainer` whose clipped surrogate keeps CE-GPPO's gradient on clipped tokens.

The seam: `_compute_loss` calls TRL's method on a copy of the micro-batch; when TRL's policy forward pass returns
(`_get_per_token_logps_and_entropies`), the copy's `advantages` become `loss.preserved_advantages` (value exactly
``A``, gradient ``A * w`` on clipped tokens). TRL reads `inputs["advantages"]` after that pass (a contract since TRL
1.10, held by tests/test_trl_seam.py), so its own surrogate, masks, normalisation and metrics carry CE-GPPO's
gradient, and every value TRL logs is TRL's. At ``beta1 = beta2 = 0`` nothing is replaced: the trainer is
`GRPOTrainer`. A TRL that reads the advantages before the pass fails at the first training step (`_check_seam`).
"""

from __future__ import annotations

import torch
from accelerate.logging import get_logger
from transformers import TrainerCallback
from trl import GRPOTrainer

from .checkpoint_hooks import CheckpointHooks
from .config import CEGPPO_LOSS_TYPES, CEGPPOConfig, on_policy_message, vanishing_term_messages
from .loss import cegppo_regions, preserved_advantages, preserved_weight, sft_loss
from .modelcard import PAPER, cegppo_settings, finish_trainer_card, write_model_card
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


class CEGPPOTrainer(CheckpointHooks, GRPOTrainer):
    """GRPO trainer whose clipped surrogate keeps bounded gradients for clipped tokens (CE-GPPO).

    Accepts exactly the arguments of [`~trl.GRPOTrainer`]; `args` is a [`CEGPPOConfig`] (a `GRPOConfig` is converted,
    with CE-GPPO's defaults). For `loss_type` in `("grpo", "bnpo", "dr_grpo", "dapo", "luspo")` clipped tokens keep
    ``beta * bound * A`` of gradient (Eq. 8); the loss is TRL's `_compute_loss`, whose logged value is TRL's at every
    beta (plus the authors' SFT term when `sft_loss_coef > 0`). Other loss types run TRL's objective unchanged.

    Two public hooks for subclasses (`cegppo_trl.research` uses them): `current_gppo_betas()`, the step's
    (beta1, beta2), and `preserved_weight(...)`, which clipped tokens keep how much.

    Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
    Reinforcement Learning", ACL 2026 (arXiv:2509.20712).
    """

    _tag_names = ["trl", "grpo", "cegppo"]
    _name = "CE-GPPO"
    _paper = PAPER  # TRL's card: its paper link and citation

    def __init__(self, model, reward_funcs=None, args: CEGPPOConfig | None = None, *pargs, **kwargs):
        # CE-GPPO's own fields were checked by `CEGPPOConfig`; everything else is GRPOTrainer's to take or refuse.
        args = CEGPPOConfig.for_trainer(model, args)
        reward_funcs = resolve_reward_names(reward_funcs)
        check_trl_compatibility(args)  # Liger's fused loss before TRL 1.14: before the model loads
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        self._warn_if_on_policy()
        self.beta1_schedule = parse_schedule(args.gppo_beta1_schedule or args.gppo_beta1)
        self.beta2_schedule = parse_schedule(args.gppo_beta2_schedule or args.gppo_beta2)
        self._schedules_checked_for = None
        self.reward_monitor = RewardSignalMonitor.for_trainer(self)  # unscorable / zero-signal streaks and stops
        self._last_rewards_per_func = None  # set by `_calculate_rewards`, read by `_generate_and_score_completions`
        # Early warning of the beta1 drift (docs/entropy-study.md): the optimizer step's left-clipped log r sums.
        self.left_drift_alarm = None if args.left_drift_warning is None else LeftDriftAlarm(args.left_drift_warning)
        # What carries state from one optimizer step to the next: `ExportableState` callbacks (`CheckpointHooks`). The
        # step's own windows (`_sft_nll_window`, the drift alarm's) are empty at every checkpoint (a step's end).
        stop = StopWhenNothingToLearn(self.reward_monitor)
        self._run_state_callbacks = tuple(c for c in (stop, self.left_drift_alarm) if c is not None)
        for callback in self._run_state_callbacks:
            self.add_callback(callback)
        self._micro_batch: dict | None = None  # the copy TRL's `_compute_loss` reads, until its policy forward pass
        self._window: dict[str, torch.Tensor] = {}  # per mode: this optimizer step's local `loss_statistics` sums
        self._sft_window: dict[str, torch.Tensor] = {}  # per mode: the step's [NLL sum, tokens] of correct completions
        self._unconsumed = 0  # training micro-batches of this step whose A_hat the backward pass has not reached
        self.add_callback(_SeamCheck(self))

    def _warn_if_on_policy(self) -> None:
        """One warning for each setting TRL trains on that makes CE-GPPO silently GRPO (on-policy) or empties one of
        its terms (`config.vanishing_term_messages`)."""
        vllm_correction = self.use_vllm and self.vllm_importance_sampling_correction
        messages = [on_policy_message(self.args, vllm_correction), *vanishing_term_messages(self.args)]
        for message in filter(None, messages):
            logger.warning(message, main_process_only=True)

    @property
    def stop_reason(self) -> str | None:
        """Why the last `train()` ended before `max_steps`: `"zero_signal"` (`max_zero_signal_batches` rollout batches
        in a row without reward spread, e.g. a solved task) or `"unscorable"` (`max_unscorable_batches` without any
        reward); None when it was not stopped by either. The message is `reward_monitor.stop_message`."""
        return self.reward_monitor.stop_reason

    # ------------------------------------------------------------------------------------------------------------
    # The public hooks: beta1 / beta2 of the step, and the weight each clipped token keeps
    # ------------------------------------------------------------------------------------------------------------
    def current_gppo_betas(self) -> tuple[float, float]:
        """(beta1, beta2) used by the loss at the current optimizer step: the schedules' values, constant within an
        optimizer step. A subclass may move them (e.g. `cegppo_trl.research`'s entropy controller)."""
        step, total = self.state.global_step, self.state.max_steps
        if total < 1:
            # The run length is unknown until `train()` sets it (e.g. evaluate() before training): every schedule
            # starts at its step-0 value, and a percentage window must not be resolved against a made-up length.
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
            advantages: ``(B,)`` or ``(B, T)``.
            regions: `loss.cegppo_regions` of the same inputs.
            beta1, beta2: `current_gppo_betas()`.
            logps, entropies, mask: TRL's ``(B, T)`` log-probabilities and entropies of the current policy, and the
                loss mask (unused here; for subclasses).
        """
        args = self.args
        return preserved_weight(log_ratio, advantages, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
                                beta1=beta1, beta2=beta2, delta_low=args.delta_low, delta_low_mode=args.delta_low_mode,
                                regions=regions)  # fmt: skip

    # ------------------------------------------------------------------------------------------------------------
    # Model card: TRL's card plus the CE-GPPO settings, beside every saved model (`cegppo_trl.modelcard`)
    # ------------------------------------------------------------------------------------------------------------
    def cegppo_settings(self) -> dict[str, object]:
        """The settings that define this CE-GPPO run, as shown on the model card."""
        return cegppo_settings(self)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        super().create_model_card(model_name=model_name, dataset_name=dataset_name, tags=tags)
        finish_trainer_card(self, self.args.output_dir)

    def save_model(self, output_dir=None, _internal_call=False):
        folder = self.args.output_dir if output_dir is None else output_dir
        write_model_card(self, folder)  # before the weights: PEFT's `save_pretrained` then updates it
        super().save_model(output_dir, _internal_call)
        finish_trainer_card(self, folder)

    # ------------------------------------------------------------------------------------------------------------
    # Rollouts: per-completion masks for the SFT term and dynamic sampling (the authors' recipe, reference §3)
    # ------------------------------------------------------------------------------------------------------------
    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        rewards_per_func = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        # TRL's `_generate_and_score_completions` computes these (gathered over all processes) but does not return
        # them; handing them over through an attribute is the only way short of copying that 400-line method.
        self._last_rewards_per_func = rewards_per_func
        # A training batch without any reward counts towards the unscorable stop (gathered: every process decides
        # alike); evaluation batches do not train, so they neither count nor reset it.
        if self.model.training and (warning := self.reward_monitor.observe_rewards(rewards_per_func)) is not None:
            logger.warning(warning, main_process_only=True)
        return rewards_per_func

    def _generate_and_score_completions(self, inputs):
        output = super()._generate_and_score_completions(inputs)
        args = self.args
        mode = "train" if self.model.training else "eval"
        rewards, unscorable = total_rewards(self._last_rewards_per_func, self.reward_weights)  # all processes
        loss_mask = output["completion_mask"]
        if "tool_mask" in output:
            loss_mask = loss_mask * output["tool_mask"]
        advantages = None
        if mode == "train":
            # All processes' advantages and which completions have a token in the loss, gathered once: the
            # zero-signal monitor and dynamic sampling decide from them alike (a zero-signal batch is one where
            # dynamic sampling keeps no group, or where no completion is trained).
            trained = (loss_mask.sum(1) > 0).to(output["advantages"].dtype)
            gathered = self.accelerator.gather(torch.stack([output["advantages"], trained], 1))
            advantages = gathered[:, 0].masked_fill(unscorable, torch.nan)
            warning = self.reward_monitor.observe_signal(rewards, advantages, self.num_generations, gathered[:, 1] > 0)
            if warning is not None:  # stops after `max_zero_signal_batches` in a row (`StopWhenNothingToLearn`)
                logger.warning(warning, main_process_only=True)
        if self.loss_type not in CEGPPO_LOSS_TYPES:
            return output
        masks, metrics = rollout_batch_masks(  # the rollout batch (all processes) and this process's outputs
            rewards,
            advantages,
            loss_mask,
            process_index=self.accelerator.process_index,
            num_generations=self.num_generations if mode == "train" else self.num_generations_eval,
            dynamic_sampling=args.dynamic_sampling and mode == "train",
            sft_loss_coef=args.sft_loss_coef,
            sft_reward_threshold=args.sft_reward_threshold,
            gather=self.accelerator.gather,
        )
        output.update(masks)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        return output

    # ------------------------------------------------------------------------------------------------------------
    # Loss: TRL's `_compute_loss` on a micro-batch whose advantages carry the preserved gradient (`cegppo_trl.loss`)
    # ------------------------------------------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        if self.loss_type not in CEGPPO_LOSS_TYPES:  # cispo, sapo, vespo: TRL's objective as it is
            return super()._compute_loss(model, inputs)
        inputs = dict(inputs)  # TRL reads `advantages` from this copy; the buffered rollout batch keeps its own
        if (
            "keep_mask" in inputs
        ):  # dynamic sampling: dropped groups leave the loss as TRL's tool mask takes tokens out
            keep = inputs["keep_mask"].unsqueeze(1).to(inputs["completion_mask"].dtype)
            inputs["tool_mask"] = keep * inputs["tool_mask"] if "tool_mask" in inputs else keep
        self._micro_batch = inputs
        try:
            loss = super()._compute_loss(model, inputs)
        finally:
            self._micro_batch = None
        if "sft_mask" in inputs:
            loss = loss + self.args.sft_loss_coef * self._sft_loss(inputs)
        return loss

    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        batch, self._micro_batch = self._micro_batch, None  # the first call inside `_compute_loss`: the policy's
        if batch is not None:
            batch["per_token_logps"] = output[0]  # for the SFT term
            self._preserve_gradient(batch, output[0], output[1])
        return output

    def _preserve_gradient(self, batch: dict, logps: torch.Tensor, entropies: torch.Tensor) -> None:
        """Replace the micro-batch's advantages by `preserved_advantages` (off-policy, beta > 0) and add its
        `loss_statistics` to the step's window."""
        mode = "train" if self.model.training else "eval"
        beta1, beta2 = self.current_gppo_betas()
        old_logps = batch.get("old_per_token_logps")
        if old_logps is None:  # on-policy: TRL's ratio is exactly 1 and nothing is clipped
            return self._log_step(mode, beta1, beta2, None)
        mask = batch["completion_mask"] if "tool_mask" not in batch else batch["completion_mask"] * batch["tool_mask"]
        log_ratio = logps - old_logps
        if self.importance_sampling_level == "sequence":  # TRL's sequence ratio: the masked mean log r
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        advantages = batch["advantages"]
        bounds = dict(epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, delta=self.args.delta,
                      delta_low=self.args.delta_low)  # fmt: skip
        regions = cegppo_regions(log_ratio.detach(), advantages, **bounds)
        if beta1 or beta2:  # at beta = 0, TRL's advantages and nothing else
            weight = self.preserved_weight(log_ratio.detach(), advantages, regions, beta1=beta1, beta2=beta2,
                                           logps=logps.detach(), entropies=entropies, mask=mask)  # fmt: skip
            batch["advantages"] = preserved_advantages(advantages, log_ratio, weight)
            if mode == "train" and batch["advantages"].requires_grad:
                self._unconsumed += 1
                batch["advantages"].register_hook(self._consumed)
        self._log_step(mode, beta1, beta2, loss_statistics(log_ratio.detach(), mask, regions))

    def _consumed(self, grad: torch.Tensor) -> None:
        self._unconsumed -= 1  # the backward pass reached A_hat: TRL's loss used it

    def _check_seam(self) -> None:
        """Before each optimizer step: fail where TRL no longer reads `inputs["advantages"]` after the policy's
        forward pass (the backward passes of the step must have reached every A_hat handed to TRL)."""
        if self._unconsumed:
            import trl

            self._unconsumed = 0
            raise RuntimeError(
                f"CEGPPOTrainer: TRL {trl.__version__}'s `_compute_loss` did not use the advantages "
                "`_get_per_token_logps_and_entropies` handed it (it must read `inputs['advantages']` after the policy's "
                "forward pass, as TRL 1.10-1.16 do), so clipped tokens would get no CE-GPPO gradient and the run would "
                "be GRPO under CE-GPPO's name. Install a supported TRL (`pip install 'cegppo-trl'` picks one)."
            )

    def _log_step(self, mode: str, beta1: float, beta2: float, statistics: torch.Tensor | None) -> None:
        """Accumulate the micro-batch's statistics; at the optimizer step's end (every micro-batch in evaluation),
        log beta1, beta2 and the `cegppo/` statistics, gathered once, and feed the left-drift alarm."""
        if statistics is not None:
            window = self._window.get(mode)
            self._window[mode] = statistics if window is None else torch.cat(
                [window[:-2] + statistics[:-2], torch.minimum(window[-2:], statistics[-2:])])  # fmt: skip
        if mode == "train" and not self.accelerator.sync_gradients:
            return
        metrics = {"cegppo/beta1": beta1, "cegppo/beta2": beta2}
        if (window := self._window.pop(mode, None)) is not None:
            values = self.accelerator.gather(window).view(-1, window.numel())  # [processes, n]
            sums = torch.cat([values[:, :-2].sum(0), values[:, -2:].amin(0)]).tolist()  # one transfer a step
            step_metrics, totals = statistics_metrics(sums, dual=self.args.delta is not None,
                                                      left_guard=self.args.delta_low is not None)  # fmt: skip
            metrics.update(step_metrics)
            if mode == "train" and self.left_drift_alarm is not None:
                coefficients = {"beta1": beta1, "delta_low": self.args.delta_low}
                warning = self.left_drift_alarm.warning(
                    totals, True, self.state.global_step + 1, self.args, coefficients
                )
                if warning is not None:
                    logger.warning(warning, main_process_only=True)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def _sft_loss(self, inputs: dict) -> torch.Tensor:
        """`loss.sft_loss` of the micro-batch: the correct completions' NLL over their tokens in its share of the
        accumulation window, so the window's loss is their token mean (as TRL's ``dapo`` normalises); once a step,
        `cegppo/sft_loss` logs the step's token-mean NLL over all processes (none when it has no correct completion)."""
        mode = "train" if self.model.training else "eval"
        mask = inputs["completion_mask"] * inputs["sft_mask"].unsqueeze(1)
        if "tool_mask" in inputs:
            mask = mask * inputs["tool_mask"]
        normaliser = inputs["num_sft_items_in_batch"] / self.accelerator.num_processes
        if mode == "train":  # the rollout batch spans `steps_per_generation` micro-batches; a step, the accumulation
            normaliser = normaliser * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        logps = inputs["per_token_logps"]
        totals = torch.stack([-(logps.detach() * mask).sum(), mask.sum()]).float()  # [NLL sum, tokens]
        window = self._sft_window.get(mode)
        self._sft_window[mode] = totals if window is None else window + totals
        if mode == "eval" or self.accelerator.sync_gradients:
            nll_sum, num_tokens = self.accelerator.reduce(self._sft_window.pop(mode), reduction="sum").tolist()
            if num_tokens > 0:
                self._metrics[mode]["cegppo/sft_loss"].append(nll_sum / num_tokens)
        return sft_loss(logps, mask, normaliser)


class _SeamCheck(TrainerCallback):
    """Runs `CEGPPOTrainer._check_seam` once the step's backward passes are done, before the optimizer steps."""

    def __init__(self, trainer: CEGPPOTrainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self.trainer._check_seam()
