"""`CEGPPOTrainer`: TRL's `GRPOTrainer` with CE-GPPO's preserved gradient added to its loss.

The seam: `_compute_loss` calls TRL's method unchanged and adds one term built from the tensors TRL computed (the
log-probabilities and entropies of its forward pass, its entropy mask, captured as TRL hands them on): the gradient
PPO's clip throws away, scaled by `loss.preserved_coefficient`, times the factors TRL multiplies its per-token loss
by and TRL's aggregation weights (`aggregation.trl_weights`). The term is 0 in value, so the loss TRL logs is TRL's,
and at ``beta1 = beta2 = 0`` it is not built: the trainer is `GRPOTrainer`. The private TRL names the seam touches
are listed in docs/maintaining.md, each held by a test.
"""

from __future__ import annotations

import os

import torch
from accelerate.logging import get_logger
from trl import GRPOTrainer

from .aggregation import sft_loss, trl_weights
from .checkpoint_hooks import CheckpointHooks, CommitAfterCallbacks, EpochSeededRepeatSampler  # noqa: F401 (re-exported)
from .checkpoints import CEGPPO_STATE_FILE  # noqa: F401 (re-exported)
from .config import CEGPPO_LOSS_TYPES, CEGPPOConfig, on_policy_message, vanishing_term_messages
from .controller import EntropyController, parse_controller
from .distributed import _flag
from .loss import cegppo_regions, preserved_coefficient, preserved_gradient_term
from .modelcard import PAPER, cegppo_settings, finish_trainer_card, write_model_card
from .monitoring import LeftDriftAlarm, RewardSignalMonitor, StopWhenNothingToLearn, cegppo_metrics
from .quiet import quiet_unused_deepspeed, trl_deprecated_model_calls
from .rewards import resolve_reward_names
from .rollouts import rollout_batch_masks, total_rewards
from .schedules import parse_schedule
from .trl_compat import check_trl_compatibility

logger = get_logger(__name__)


class CEGPPOTrainer(CheckpointHooks, GRPOTrainer):
    """GRPO trainer whose clipped surrogate keeps bounded gradients for clipped tokens (CE-GPPO).

    Accepts exactly the arguments of [`~trl.GRPOTrainer`]; `args` is a [`CEGPPOConfig`] (a `GRPOConfig` is converted,
    with CE-GPPO's defaults). For `loss_type` in
    `("grpo", "bnpo", "dr_grpo", "dapo", "luspo")` TRL's loss gains the preserved-gradient term of
    `cegppo_trl.loss` (Eq. 8's gradient: clipped tokens keep ``beta * bound * A``); every other part of the loss
    (the clipped surrogate, KL, entropy mask, off-policy mask, vLLM correction, entropy bonus, MoE aux loss, gradient
    accumulation) is TRL's own computation. Other loss types run TRL's objective unchanged.

    The class wires separately tested modules into TRL's hooks: `loss` (the term), `aggregation` (TRL's weights, the
    SFT term), `rollouts` (dynamic sampling, SFT masks), `schedules` and `controller` (beta1, beta2), `monitoring`
    (metrics, stops, the left-drift warning) and `modelcard`; its save and resume hooks are `CheckpointHooks`
    (`checkpoint_hooks`). It never runs the pre-flight (`cegppo check`): where `GRPOTrainer` trains, so does it.

    Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
    Reinforcement Learning", ACL 2026 (arXiv:2509.20712).
    """

    _tag_names = ["trl", "grpo", "cegppo"]
    _loss_tensors: dict | None = None  # what TRL's `_compute_loss` computed, while it runs
    _name = "CE-GPPO"
    _paper = PAPER  # TRL's card: its paper link and citation
    # Objects that carry state from one optimizer step to the next (`state_dict` / `load_state_dict`, JSON-able),
    # saved in `cegppo_state.json` and restored on resume (`CheckpointHooks`). The step's own windows (`_sft_nll_window`,
    # the drift alarm's step window) are empty at every checkpoint (it is saved after the step ends).
    _RUN_STATE_COMPONENTS = ("left_drift_alarm", "reward_monitor")

    def __init__(self, model, reward_funcs=None, args: CEGPPOConfig | None = None, *pargs, **kwargs):
        # CE-GPPO's own fields were checked by `CEGPPOConfig`; everything else is GRPOTrainer's to take or refuse,
        # in its words. The inspection of the data, rewards and launch is `cegppo check` / `cegppo train`'s.
        args = CEGPPOConfig.for_trainer(model, args)
        reward_funcs = resolve_reward_names(reward_funcs)
        check_trl_compatibility(args)  # TRL 1.15 on CPU, Liger's fused loss before TRL 1.14: before the model loads
        if not (getattr(args, "deepspeed", None) or _flag(os.environ, "ACCELERATE_USE_DEEPSPEED")):
            quiet_unused_deepspeed()
        super().__init__(model, reward_funcs, args, *pargs, **kwargs)
        self._warn_if_on_policy()
        # beta1 / beta2: a schedule each (a constant unless configured) and an optional entropy controller.
        self.beta1_schedule = parse_schedule(args.gppo_beta1_schedule or args.gppo_beta1)
        self.beta2_schedule = parse_schedule(args.gppo_beta2_schedule or args.gppo_beta2)
        controller_config = parse_controller(args.entropy_controller)
        self.entropy_controller = (
            None
            if controller_config is None
            else EntropyController(controller_config, self.beta1_schedule.initial, self.beta2_schedule.initial)
        )
        self._schedules_checked_for = None
        self.reward_monitor = RewardSignalMonitor.for_trainer(self)  # unscorable / zero-signal streaks and stops
        self.add_callback(StopWhenNothingToLearn(self.reward_monitor))
        self._last_rewards_per_func = None  # set by `_calculate_rewards`, read by `_generate_and_score_completions`
        self._sft_nll_window: dict[str, torch.Tensor] = {}  # per mode: [NLL sum, tokens] of the correct completions
        # Early warning of the beta1 drift (docs/entropy-study.md): the optimizer step's left-clipped log r sums.
        self.left_drift_alarm = None if args.left_drift_warning is None else LeftDriftAlarm(args.left_drift_warning)
        self._init_checkpoint_state()

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
    # beta1 / beta2 for the current optimizer step
    # ------------------------------------------------------------------------------------------------------------
    def cegppo_coefficients(self) -> dict[str, float | str | None]:
        """Keyword arguments of `loss.preserved_coefficient` at the current optimizer step: the clip range, this step's
        (beta1, beta2), the dual-clip constant and the left guard."""
        beta1, beta2 = self.current_gppo_betas()
        return dict(
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta1=beta1,
            beta2=beta2,
            delta=self.args.delta,
            delta_low=self.args.delta_low,
            delta_low_mode=self.args.delta_low_mode,
        )

    def current_gppo_betas(self) -> tuple[float, float]:
        """(beta1, beta2) used by the loss at the current optimizer step: the schedules' nominal values, moved by
        the entropy controller when one is configured. Constant within an optimizer step."""
        step, total = self.state.global_step, self.state.max_steps
        if total < 1:
            # The run length is unknown until `train()` sets it (e.g. evaluate() or a read before training). Every
            # schedule starts at its step-0 value whatever the length, so that is the value before training; a
            # percentage window must not be resolved against a made-up length (it could be empty for it).
            beta1, beta2 = self.beta1_schedule.initial, self.beta2_schedule.initial
        else:
            if total != self._schedules_checked_for:  # once per run length: a window that is empty for it fails now
                self.beta1_schedule.check(total, field="gppo_beta1_schedule")
                self.beta2_schedule.check(total, field="gppo_beta2_schedule")
                self._schedules_checked_for = total
            beta1, beta2 = self.beta1_schedule(step, total), self.beta2_schedule(step, total)
        if self.entropy_controller is not None:
            beta1, beta2 = self.entropy_controller.apply(beta1, beta2)
        return float(beta1), float(beta2)

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
        held = {name: getattr(self.args, name) for name in self._held}  # training_args.bin records the real ones
        self.args.__dict__.update(self._held)
        super().save_model(output_dir, _internal_call)
        self.args.__dict__.update(held)
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
        with trl_deprecated_model_calls():
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
    # Loss: TRL's `_compute_loss`, plus CE-GPPO's preserved gradient as a term of value 0 (`cegppo_trl.loss`)
    # ------------------------------------------------------------------------------------------------------------
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        output = super()._get_per_token_logps_and_entropies(*args, **kwargs)
        if self._loss_tensors is not None and "logps" not in self._loss_tensors:  # the policy's pass in the loss
            self._loss_tensors["logps"], self._loss_tensors["entropies"] = output[0], output[1]
        return output

    def get_high_entropy_mask(self, entropies, mask, threshold):
        entropy_mask = super().get_high_entropy_mask(entropies, mask, threshold)  # a collective: taken, not redone
        if isinstance(self._loss_tensors, dict):  # (TRL's own tests call this on a stand-in trainer)
            self._loss_tensors["entropy_mask"] = entropy_mask
        return entropy_mask

    def _layout(self, mode) -> dict:
        """How the rollout batch is split into micro-batches: `aggregation`'s layout arguments."""
        train = mode == "train"
        return dict(
            num_processes=self.accelerator.num_processes,
            steps_per_generation=self.args.steps_per_generation,
            # set by transformers inside the training loop only (an `evaluate()` before `train()` has none)
            gradient_accumulation_steps=self.current_gradient_accumulation_steps if train else 1,
            max_completion_length=self.max_completion_length,
            train=train,
        )

    def _compute_loss(self, model, inputs):
        if self.loss_type not in CEGPPO_LOSS_TYPES:  # cispo, sapo, vespo: TRL's objective as it is
            return super()._compute_loss(model, inputs)
        if (
            "keep_mask" in inputs
        ):  # dynamic sampling: dropped groups leave the loss as TRL's tool mask takes tokens out
            keep = inputs["keep_mask"].unsqueeze(1).to(inputs["completion_mask"].dtype)
            inputs = {**inputs, "tool_mask": keep * inputs["tool_mask"] if "tool_mask" in inputs else keep}
        self._loss_tensors = {}
        try:
            loss = super()._compute_loss(model, inputs)
            captured = self._loss_tensors
        finally:
            self._loss_tensors = None
        return loss + self._cegppo_terms(inputs, **captured)

    def _cegppo_terms(self, inputs, logps, entropies, entropy_mask=None):
        """What CE-GPPO adds to TRL's loss of one micro-batch, from the tensors TRL computed: the preserved gradient
        (value 0) and the authors' SFT term; the `cegppo/` metrics and the controller's entropy on the way."""
        mode = "train" if self.model.training else "eval"
        mask = (
            inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        )
        advantages = inputs["advantages"]
        advantages = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
        old_logps = inputs.get("old_per_token_logps")
        log_ratio = logps - (logps.detach() if old_logps is None else old_logps)  # TRL's, in TRL's dtype
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        # The factors TRL multiplies its per-token loss by, then TRL's aggregation weights of `loss_type`.
        weights = trl_weights(self.loss_type, mask, num_items_in_batch=inputs["num_items_in_batch"],
                              **self._layout(mode))  # fmt: skip
        if self.off_policy_mask_threshold is not None:
            sampling_logps = inputs.get("sampling_per_token_logps", logps.detach() if old_logps is None else old_logps)
            weights = weights * self.get_off_policy_mask(advantages, logps, sampling_logps, mask,
                                                         self.off_policy_mask_threshold)  # fmt: skip
        if entropy_mask is not None:
            weights = weights * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            weights = weights * inputs["importance_sampling_ratio"]
        coefficients = self.cegppo_coefficients()
        bounds = {k: coefficients[k] for k in ("epsilon_low", "epsilon_high", "delta", "delta_low")}
        regions = cegppo_regions(log_ratio.detach(), advantages, **bounds)
        coefficient = self.preserved_gradient_coefficient(
            log_ratio.detach(), advantages, coefficients, regions, logps.detach(), entropies
        )
        term = logps.new_zeros(())
        if coefficients["beta1"] or coefficients["beta2"]:  # at beta = 0, TRL's loss and nothing else
            term = (preserved_gradient_term(log_ratio, advantages, coefficient) * weights).sum()
        if self.args.sft_loss_coef > 0 and "sft_mask" in inputs:
            term = term + self.args.sft_loss_coef * self._sft_loss(logps, mask, inputs, mode)
        tensors = dict(weights=weights, logps=logps, entropies=entropies, regions=regions, coefficient=coefficient)
        self._log_cegppo_metrics(mode, log_ratio.detach(), advantages, mask, coefficients, **tensors)
        return term

    def preserved_gradient_coefficient(
        self, log_ratio, advantages, coefficients, regions, logps, entropies
    ) -> torch.Tensor:
        """Per token, the weight of the gradient kept where PPO's clip drops it: `loss.preserved_coefficient` under
        `gppo_beta_rule` (the paper's rule by default). The one place to change which clipped tokens keep how much (a
        study arm overrides it, e.g. examples/entropy_study/mechanism.py); the loss term, the `cegppo/` metrics and
        the predictor all read it.

        Args:
            log_ratio: ``log r``, detached, ``(B, T)`` (``(B, 1)`` for sequence-level ratios).
            advantages: ``(B,)`` or ``(B, T)``.
            coefficients: `cegppo_coefficients()`: this step's clip range, (beta1, beta2) and guards.
            regions: `loss.cegppo_regions` of the same inputs.
            logps, entropies: TRL's ``(B, T)`` log-probabilities and entropies of the current policy.

        Returns:
            A tensor of `log_ratio`'s dtype and the broadcast shape of `log_ratio` and `advantages`, 0 where no
            gradient is kept (at ``beta1 = beta2 = 0`` the trainer adds no term, whatever this returns).
        """
        return preserved_coefficient(log_ratio, advantages, **coefficients, regions=regions,
                                     beta_rule=self.args.gppo_beta_rule, logps=logps, entropies=entropies)  # fmt: skip

    def _sft_loss(self, per_token_logps, mask, inputs, mode):
        """`aggregation.sft_loss`, and `cegppo/sft_loss` once per optimizer step: the token-mean NLL of the correct
        completions of its micro-batches over all processes (split-invariant); nothing when they hold none."""
        counts = inputs["sft_mask"], inputs["num_sft_items_in_batch"], inputs.get("num_sft_sequences_in_batch")
        loss, totals = sft_loss(self.loss_type, per_token_logps, mask, *counts, **self._layout(mode))
        window = self._sft_nll_window.get(mode)
        self._sft_nll_window[mode] = totals if window is None else window + totals
        if self.accelerator.sync_gradients or mode == "eval":
            nll_sum, num_tokens = self.accelerator.reduce(self._sft_nll_window.pop(mode), reduction="sum").tolist()
            if num_tokens > 0:
                self._metrics[mode]["cegppo/sft_loss"].append(nll_sum / num_tokens)
        return loss

    def _log_cegppo_metrics(self, mode, log_ratio, advantages, mask, coefficients, weights=None, **tensors) -> None:
        """`monitoring.cegppo_metrics` into TRL's metrics (`log()` averages them over the logging window); the
        entropy controller and the left-drift alarm read the same sums, alike on every process. `tensors`: the
        `cegppo_diagnostics` keywords at hand (log-probs, entropies, regions, coefficient)."""
        gather, controller = self.accelerator.gather, self.entropy_controller
        metrics, sums = cegppo_metrics(
            log_ratio, advantages, mask, coefficients, gather, weights, controller, **tensors
        )
        if "cegppo/predictor/entropy_change" in metrics:  # DDP averages the processes' gradients: so does the push
            metrics["cegppo/predictor/entropy_change"] /= self.accelerator.num_processes
        if mode == "train" and controller is not None:  # the step's entropy, logged once measured
            controller.observe(sums["entropy"], sums["entropy_tokens"], step_end=self.accelerator.sync_gradients)
            if controller.last_entropy is not None:
                metrics["cegppo/controller/entropy"] = controller.last_entropy
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        if mode == "train" and self.left_drift_alarm is not None:
            step_end, step = self.accelerator.sync_gradients, self.state.global_step + 1
            if (warning := self.left_drift_alarm.warning(sums, step_end, step, self.args, coefficients)) is not None:
                logger.warning(warning, main_process_only=True)
