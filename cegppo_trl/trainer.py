"""`CEGPPOTrainer`: TRL's `GRPOTrainer` with the CE-GPPO surrogate.

The seam: a full override of `GRPOTrainer._compute_loss` (TRL's own GMPO pattern). TRL 1.16 has no per-token
surrogate hook, and the alternatives cost more than they save: a gradient-injection term needs TRL's masking and
normalisation re-derived beside the copy anyway, and per-token advantages that carry the extra gradient corrupt
TRL's clip metrics and cannot express a sequence-level ratio. The override below is TRL 1.16.0's method line for
line except where marked `# CE-GPPO`; the objective itself lives only in `cegppo_trl.loss`. Because the copy, and
the rollout-batch normalisers, rely on TRL internals that can change without notice, `check_trl_compatibility`
compares the source of each (`TRL_GUARDED_SOURCES`) with its hash in the TRL release it was read from and refuses to
train on a mismatch, naming the method (tests/test_trl_drift.py pins the same hashes and tests each assumption).
"""

from __future__ import annotations

import os

import torch
from accelerate.logging import get_logger
from transformers import TrainerState
from transformers.trainer_utils import TrainOutput
from trl import GRPOTrainer
from trl.trainer.utils import RepeatSampler

from .aggregation import Normaliser, aggregation_weights, policy_loss, policy_normaliser, sft_loss
from .checkpoints import (  # noqa: F401 (CEGPPO_STATE_FILE re-exported)
    CEGPPO_STATE_FILE,
    ResumePlan,
    begin_checkpoint,
    commit,
    read_state,
    rotate,
    start_run,
)
from .config import CEGPPO_LOSS_TYPES, CEGPPOConfig, on_policy_message, vanishing_term_messages
from .controller import EntropyController, parse_controller
from .distributed import _flag
from .loss import cegppo_per_token_loss
from .modelcard import PAPER, cegppo_settings, finish_trainer_card, write_model_card
from .monitoring import (
    LeftDriftAlarm,
    RewardSignalMonitor,
    StopWhenNothingToLearn,
    cegppo_metrics,
)
from .quiet import quiet_unused_deepspeed, trl_deprecated_model_calls
from .rewards import resolve_reward_names
from .rollouts import rollout_batch_masks, total_rewards
from .safe_load import UnsafeCheckpointError, safe_resume_loads
from .schedules import parse_schedule
from .trl_compat import check_trl_compatibility

logger = get_logger(__name__)


def holds_model(folder: str) -> bool:
    """Whether `folder` holds saved weights (a full model or an adapter, one file or an index of shards)."""
    names = [s + e + i for s in ("model", "pytorch_model", "adapter_model") for e in (".safetensors", ".bin")
             for i in ("", ".index.json")]  # fmt: skip
    return any(os.path.isfile(os.path.join(folder, name)) for name in names)


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` with its generator reseeded to `seed + epoch` at each epoch (see `_get_train_sampler`)."""

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


class CEGPPOTrainer(GRPOTrainer):
    """GRPO trainer whose clipped surrogate keeps bounded gradients for clipped tokens (CE-GPPO).

    Accepts exactly the arguments of [`~trl.GRPOTrainer`]; `args` is a [`CEGPPOConfig`] (a `GRPOConfig` is converted,
    with CE-GPPO's defaults). For `loss_type` in
    `("grpo", "bnpo", "dr_grpo", "dapo", "luspo")` the per-token surrogate is `cegppo_per_token_loss`; every other
    part of the loss (KL, entropy mask, off-policy mask, vLLM correction, entropy bonus, MoE aux loss, gradient
    accumulation) is TRL's. Other loss types run TRL's objective unchanged.

    The class wires separately tested modules into TRL's hooks: `aggregation` (split-invariant normalisers, the SFT
    term), `rollouts` (dynamic sampling, SFT masks), `schedules` and `controller` (beta1, beta2), `monitoring`
    (metrics, stops, the left-drift warning), `checkpoints`, `safe_load` and `modelcard`. It never runs the
    pre-flight (`cegppo check`): where `GRPOTrainer` trains, so does it.

    Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
    Reinforcement Learning", ACL 2026 (arXiv:2509.20712).
    """

    _tag_names = ["trl", "grpo", "cegppo"]
    _name = "CE-GPPO"
    _paper = PAPER  # TRL's card: its paper link and citation

    def __init__(self, model, reward_funcs=None, args: CEGPPOConfig | None = None, *pargs, **kwargs):
        # CE-GPPO's own fields were checked by `CEGPPOConfig`; everything else is GRPOTrainer's to take or refuse,
        # in its words. The inspection of the data, rewards and launch is `cegppo check` / `cegppo train`'s.
        args = CEGPPOConfig.for_trainer(model, args)
        reward_funcs = resolve_reward_names(reward_funcs)
        kwargs.pop("preflight_report", None)  # what `cegppo probe` still hands over: the trainer does not read it
        check_trl_compatibility(args)  # the copied TRL internals above must be a tested release's
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
        self.settings_history: list[dict] = []  # settings changed on resume, `{"step", "changes"}` (model card)
        self._run: str | None = None  # the run this trainer's checkpoints belong to (`checkpoints`, rule 3)
        self._plan: ResumePlan | None = None  # the plan of the current `train()`
        self._save_total_limit: int | None = None  # transformers' `save_total_limit`, held back during `train()`

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
        """Keyword arguments of `cegppo_per_token_loss` at the current optimizer step: the clip range, this step's
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
        super().save_model(output_dir, _internal_call)
        finish_trainer_card(self, folder)

    # ------------------------------------------------------------------------------------------------------------
    # Checkpoints: schedules are functions of the global step (saved by Trainer); the controller has state.
    # ------------------------------------------------------------------------------------------------------------
    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Trainer.train` from the launch's `checkpoints.ResumePlan` (`start_run`, or the one `cegppo train` made);
        a checkpoint at the run's end trains nothing: the final model is written from it if missing.

        `save_total_limit` is held back for the call: rotation runs after each commit, over this run's committed
        checkpoints (`_save_checkpoint`), and transformers' end-of-train deletion (with `save_total_limit=1` and
        `load_best_model_at_end`, every checkpoint but the best) does not run, so the newest one stays."""
        plan = resume_from_checkpoint
        if not isinstance(plan, ResumePlan):
            plan = start_run(self.args, resume_from_checkpoint, logger.warning, run=self._run)
        self._run, self._plan, self._save_total_limit = plan.run, plan, self.args.save_total_limit
        self.args.save_total_limit = None
        try:
            if not plan.finished:
                return super().train(plan.checkpoint, trial, ignore_keys_for_eval, **kwargs)
            # transformers would train a step past the end; a requeue of a finished run only writes the final model
            self._load_from_checkpoint(plan.checkpoint)  # guarded (`safe_load`), as every checkpoint read
            state = TrainerState.load_from_json(f"{plan.checkpoint}/trainer_state.json")
            self.state.global_step = state.global_step
            if self.args.load_best_model_at_end and state.best_model_checkpoint is not None:
                self.state.best_model_checkpoint = state.best_model_checkpoint  # the run's final model is the best
                self._load_best_model()
            if not holds_model(self.args.output_dir):
                self.save_model(self.args.output_dir)
            return TrainOutput(self.state.global_step, 0.0, {})
        finally:
            self.args.save_total_limit = self._save_total_limit
            if plan is not resume_from_checkpoint:
                plan.release()

    def _get_train_sampler(self, dataset=None):
        # TRL's `RepeatSampler` seeds its generator once, so a run resumed in a later epoch would replay the first
        # epoch's permutation; reseeded with seed + epoch (accelerate's `SeedableRandomSampler`), every epoch draws
        # the same order whether the run was resumed or not. transformers calls `set_epoch` before each epoch.
        sampler = super()._get_train_sampler(dataset)
        if type(sampler) is RepeatSampler and sampler.shuffle and sampler.seed is not None:
            sampler.__class__ = EpochSeededRepeatSampler  # TRL's construction kept, its iteration reseeded
        return sampler

    def _save_checkpoint(self, model, trial):
        # The protocol of `checkpoints` (rule 1): `cegppo_state.json` first (an old marker dropped); transformers'
        # files; every process fsyncs, a barrier, the owner's marker; then rotation over this run's marked
        # checkpoints and the Hub push, which transformers would run before the other processes finished.
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"checkpoint-{self.state.global_step}")
        if self.args.should_save:
            controller = None if self.entropy_controller is None else self.entropy_controller.state_dict()
            record = {"settings": self._plan.settings, "controller": controller,
                      "run_state": self.cegppo_run_state(), "history": self.settings_history}  # fmt: skip
            # format 2: every config field that changes the run (1, cegppo-trl 0.4: a fixed list of them)
            begin_checkpoint(folder, {"format": 2, **{k: v for k, v in record.items() if v}})
        push, self.args.push_to_hub = self.args.push_to_hub, False
        try:
            super()._save_checkpoint(model, trial)
        finally:
            self.args.push_to_hub = push
        commit(folder, self.args.should_save, self._run, self.accelerator.wait_for_everyone, self.args.save_only_model)
        if self.args.should_save:
            rotate(run_dir, self._save_total_limit, self.state.best_model_checkpoint, self._run)
        if push:
            self._push_from_checkpoint(folder)

    # Attributes whose objects carry state from one optimizer step to the next (`state_dict` / `load_state_dict`,
    # JSON-able); each is saved in `cegppo_state.json` and restored on resume. The step's own windows
    # (`_sft_nll_window`, the drift alarm's step window) are empty at every checkpoint (it is saved after the step ends).
    _RUN_STATE_COMPONENTS = ("left_drift_alarm", "reward_monitor")

    def cegppo_run_state(self) -> dict:
        """What this trainer carries from step to step, as JSON (saved in each checkpoint's `cegppo_state.json`)."""
        state = {}
        for name in self._RUN_STATE_COMPONENTS:
            if getattr(self, name) is not None:
                state[name] = getattr(self, name).state_dict()
        return state

    def load_cegppo_run_state(self, state: dict) -> None:
        """Restore `cegppo_run_state()`; what `state` lacks (a checkpoint written before it was saved) stays fresh."""
        for name in self._RUN_STATE_COMPONENTS:
            if getattr(self, name) is not None and name in state:
                getattr(self, name).load_state_dict(state[name])

    # Every read of a checkpoint folder is data only (`safe_load`), for as long as the trainer lives: the resume
    # (`_prepare_for_training` holds the DeepSpeed, FSDP and optimizer loads; `_load_from_checkpoint` the weights of
    # one process and DDP), the RNG state (read inside the training loop) and the best model at the end.
    def _prepare_for_training(self, max_steps, train_dataloader, resume_from_checkpoint):
        with safe_resume_loads(resume_from_checkpoint):
            return super()._prepare_for_training(max_steps, train_dataloader, resume_from_checkpoint)

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        with safe_resume_loads(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)

    def _load_rng_state(self, checkpoint):
        with safe_resume_loads(checkpoint):
            return super()._load_rng_state(checkpoint)

    def _load_best_model(self):
        # `best_model_checkpoint` may come from a resumed checkpoint's `trainer_state.json`, i.e. name any folder.
        # A refusal comes after training: the model keeps the weights it has, and the run is not lost.
        try:
            with safe_resume_loads(self.state.best_model_checkpoint):
                return super()._load_best_model()
        except UnsafeCheckpointError as error:
            logger.warning(
                f"`load_best_model_at_end`: the best model was not loaded, and the model keeps the weights it has "
                f"(the last step's, unless the refused file was read after the model's weights). {error}"
            )

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is None:
            return
        # The plan has told the user what differs; here the state is restored (JSON, read on every process). The
        # history of settings changed on resume goes on the model card.
        state, changes = read_state(checkpoint), self._plan.changes
        self.settings_history = state.get("history", []) + (
            [{"step": self.state.global_step, "changes": changes}] if changes else []
        )
        self.load_cegppo_run_state(state.get("run_state", {}))
        if self.entropy_controller is not None and "controller" in state:
            self.entropy_controller.load_state_dict(state["controller"])

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
    # Loss
    # ------------------------------------------------------------------------------------------------------------
    def _layout(self, mode) -> dict:
        """How the rollout batch is split into micro-batches: `aggregation.normaliser`'s layout arguments."""
        train = mode == "train"
        return dict(
            num_processes=self.accelerator.num_processes,
            steps_per_generation=self.args.steps_per_generation,
            # set by transformers inside the training loop only (an `evaluate()` before `train()` has none)
            gradient_accumulation_steps=self.current_gradient_accumulation_steps if train else 1,
            max_completion_length=self.max_completion_length,
            train=train,
        )

    def _policy_normaliser(self, per_token_loss, mask, inputs, mode) -> Normaliser:
        """`aggregation.policy_normaliser` of one micro-batch."""
        counts = inputs["num_items_in_batch"], inputs.get("num_sequences_in_batch"), inputs.get("keep_mask")
        return policy_normaliser(self.loss_type, per_token_loss, mask, *counts, **self._layout(mode))

    def _policy_loss(self, per_token_loss, mask, inputs, mode):
        """`aggregation.policy_loss`: one micro-batch's policy loss and TRL's `policy_loss` metric value."""
        norm = self._policy_normaliser(per_token_loss, mask, inputs, mode)
        return policy_loss(self.loss_type, per_token_loss, mask, norm)

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

    def _compute_loss(self, model, inputs):
        # --- CE-GPPO begin: TRL's other objectives (cispo, sapo, vespo) run unchanged ---
        if self.loss_type not in CEGPPO_LOSS_TYPES:
            return super()._compute_loss(model, inputs)
        # --- CE-GPPO end ---
        # Compute the per-token log probabilities for the model
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)  # we only need to compute the logits for the completion tokens
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]

        # Compute the per_token_logps and the entropy at each position in the completion
        per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            compute_entropy=True,
            compute_aux_loss=self.aux_loss_enabled,
            pixel_values=inputs.get("pixel_values"),
            image_grid_thw=inputs.get("image_grid_thw"),
            num_images=inputs.get("num_images"),
            pixel_attention_mask=inputs.get("pixel_attention_mask"),
            spatial_shapes=inputs.get("spatial_shapes"),
            num_tiles=inputs.get("num_tiles"),
            image_sizes=inputs.get("image_sizes"),
            token_type_ids=inputs.get("token_type_ids"),
            mm_token_type_ids=inputs.get("mm_token_type_ids"),
            image_position_ids=inputs.get("image_position_ids"),
        )

        # --- CE-GPPO begin: dynamic sampling drops uninformative groups before anything else, as the authors do: ---
        # from here on they are out of the entropy quantile, the loss, the entropy bonus, the controller and metrics.
        if "keep_mask" in inputs:
            mask = mask * inputs["keep_mask"].unsqueeze(1)
        # --- CE-GPPO end ---

        if self.top_entropy_quantile < 1.0:
            entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
        else:
            entropy_mask = None

        # Compute the loss
        advantages = inputs["advantages"]
        # In the base GRPO implementation, advantages are expected to have shape (B,). To support subclasses that
        # provide advantages with shape (B, T), we *conditionally* unsqueeze the tensor.
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        # When num_iterations == 1 and steps_per_generation <= gradient_accumulation_steps,
        # old_per_token_logps == per_token_logps. In this case we can skip its computation
        # (see _generate_and_score_completions) and instead use per_token_logps.detach().
        # The exception is when using vLLM, where we always compute old_per_token_logps
        # for importance sampling
        old_per_token_logps = inputs.get("old_per_token_logps")
        old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps

        if self.off_policy_mask_threshold is not None:
            # OPSM should use inference-time logprobs to detect both sources of off-policyness:
            # 1. Drift from gradient updates (always present)
            # 2. Drift from training-inference mismatch (when using vLLM)
            # When using vLLM, prioritize sampling_per_token_logps, otherwise use old_per_token_logps
            sampling_per_token_logps = inputs.get("sampling_per_token_logps", old_per_token_logps)

            off_policy_mask = self.get_off_policy_mask(
                advantages=advantages,
                per_token_logps=per_token_logps,
                sampling_per_token_logps=sampling_per_token_logps,
                mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold,
            )

        log_ratio = per_token_logps - old_per_token_logps
        if self.importance_sampling_level == "token":
            log_importance_weights = log_ratio
        elif self.importance_sampling_level == "sequence":
            log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
            log_importance_weights = log_importance_weights.unsqueeze(-1)
        else:
            raise ValueError(
                f"Unknown importance sampling level: {self.importance_sampling_level}. Possible values are 'token' "
                "and 'sequence'."
            )

        coef_1 = torch.exp(log_importance_weights)

        # Compute the KL divergence between the model and the reference model
        if self.beta != 0.0:
            ref_per_token_logps = inputs["ref_per_token_logps"]
            per_token_kl = (
                torch.exp(ref_per_token_logps - per_token_logps) - (ref_per_token_logps - per_token_logps) - 1
            )
            # Importance sampling correction for the KL divergence
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * coef_1

        # From here, log_importance_weights (and all subsequent tensors, coef_1, coef_2, etc.) shape depends on
        # importance_sampling_level: "token" level: (B, T); "sequence" level: (B, 1)
        # --- CE-GPPO begin: the cispo, sapo and vespo branches below (and their metrics further down) cannot run ---
        # here, since those loss types go to `super()` at the top; they are kept so that this copy diffs line for line
        # against TRL's method (tests/test_trl_drift.py).
        # --- CE-GPPO end ---
        if self.loss_type == "cispo":
            clamped_ratios = torch.clamp(coef_1, max=self.epsilon_high).detach()
            per_token_loss = -clamped_ratios * advantages * per_token_logps
        elif self.loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]:
            # --- CE-GPPO begin: the gradient-preserving surrogate (Eq. 8) replaces -min(r A, clip(r) A) and the ---
            # two-sided `delta` clamp, which for A < 0 is the authors' dual clip. A sequence-level (GSPO) ratio is a
            # (B, 1) log-ratio: clipped sequences keep beta * bound * A * grad(mean log-ratio).
            coefficients = self.cegppo_coefficients()
            per_token_loss = cegppo_per_token_loss(
                log_importance_weights,
                log_importance_weights.new_zeros(()),  # already a log-ratio; a 0-d zero avoids a (B, T) copy
                advantages,
                **coefficients,
            )
            # --- CE-GPPO end ---
        elif self.loss_type == "sapo":
            temperatures = torch.where(advantages > 0, self.args.sapo_temperature_pos, self.args.sapo_temperature_neg)
            soft_coef_1 = torch.sigmoid(temperatures * (coef_1 - 1)) * 4 / temperatures
            per_token_loss = -soft_coef_1 * advantages
        elif self.loss_type == "vespo":
            phi_seq = self.get_gamma_weights(
                advantages=advantages,
                log_ratio_per_token=log_ratio,
                mask=mask,
                importance_sampling_ratio=inputs.get("importance_sampling_ratio"),
                k_pos=self.args.vespo_k_pos,
                lambda_pos=self.args.vespo_lambda_pos,
                k_neg=self.args.vespo_k_neg,
                lambda_neg=self.args.vespo_lambda_neg,
            )
            per_token_loss = -phi_seq * advantages * per_token_logps
        else:
            raise ValueError(f"Unknown loss type: {self.loss_type}")

        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * off_policy_mask

        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask

        if self.use_vllm and self.vllm_importance_sampling_correction and self.loss_type != "vespo":
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]

        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        mode = "train" if self.model.training else "eval"
        # --- CE-GPPO begin: TRL's aggregation per loss type, but with the sequence counts of the whole rollout ---
        # batch, so the loss does not depend on how the batch is split (`_aggregate`); the authors' SFT term.
        loss, policy_loss = self._policy_loss(per_token_loss, mask, inputs, mode)
        if self.args.sft_loss_coef > 0 and "sft_mask" in inputs:
            loss = loss + self.args.sft_loss_coef * self._sft_loss(per_token_logps, mask, inputs, mode)
        # --- CE-GPPO end ---

        # Entropy bonus: add entropy regularization to encourage exploration. _entropy_bonus_enabled is set
        # whenever a non-zero static coef is set OR adaptive mode is enabled (adaptive stays enabled even when
        # entropy_coef has been decremented to entropy_coef_min so it can recover once entropy drops again).
        if self._entropy_bonus_enabled:
            # When top_entropy_quantile < 1.0, entropy_mask restricts policy gradients to high-entropy
            # tokens. Use the same effective mask for the entropy bonus so it acts on the same tokens.
            effective_mask = mask if entropy_mask is None else mask * entropy_mask
            # Entropy bonus = mean per-token entropy H (the documented objective L = L_policy - coef * H), so
            # H does not depend on how each loss type normalizes its policy term. The bonus is a mean over the
            # tokens it acts on (effective_mask), scaled only for gradient accumulation, never by a loss-type-
            # specific policy normalizer. (The adaptive controller below tracks a window-global token-weighted mean,
            # which can differ from this per-micro-batch mean when token counts vary across micro-batches.)
            accumulation_factor = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            entropy_loss = (
                (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / accumulation_factor
            )

            # Apply the coefficient and gating from the end of the previous optimizer step, so that every
            # micro-batch in the current accumulation window applies the same entropy bonus. The adaptive
            # update below only takes effect on the next step.
            if self.use_adaptive_entropy:
                apply_coef = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
            else:
                apply_coef = self.entropy_coef

            loss = loss - apply_coef * entropy_loss

            self._metrics[mode]["policy_loss"].append(self.accelerator.gather(policy_loss).nanmean().item())

            # Adaptive update. Gated on train mode so evaluation cannot mutate the entropy controller state.
            if self.use_adaptive_entropy and mode == "train":
                # Accumulate the entropy sum and active-token count of every micro-batch into a running window
                # buffer, so the controller measures the exact window-global entropy rather than just the last
                # micro-batch (which would be a 1 / gradient_accumulation_steps subsample).
                stats = torch.stack([(entropies * effective_mask).sum(), effective_mask.sum()]).detach()
                if self._entropy_window_stats is None:
                    self._entropy_window_stats = stats
                else:
                    self._entropy_window_stats = self._entropy_window_stats + stats
                # At the optimizer-step boundary, reduce the window totals across ranks (sum and token count
                # jointly, for a true global mean unbiased when ranks have different completion lengths),
                # update the coefficient for the next step, then reset the window buffer.
                if self.accelerator.sync_gradients:
                    window_stats = self.accelerator.reduce(self._entropy_window_stats, reduction="sum")
                    world_entropy = (window_stats[0] / window_stats[1].clamp(min=1.0)).item()
                    if world_entropy <= self.args.entropy_target:
                        self.entropy_coef = min(
                            self.entropy_coef + self.args.entropy_coef_delta, self.args.entropy_coef_max
                        )
                    else:
                        self.entropy_coef = max(
                            self.entropy_coef - self.args.entropy_coef_delta, self.args.entropy_coef_min
                        )
                    self._last_world_entropy = world_entropy
                    self._entropy_window_stats = None

            # Log entropy_coef on train optimizer-step boundaries (constant for static control; updated just
            # above for adaptive control). sync_gradients is always True in eval (no accumulation context).
            if mode == "train" and self.accelerator.sync_gradients:
                self._metrics[mode]["entropy_coef"].append(self.entropy_coef)

        # The policy loss above is scaled for gradient accumulation (HF auto-scaling is off here), so scale aux too
        if self.aux_loss_enabled:
            normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
            loss = loss + self.router_aux_loss_coef * aux_loss / normalizer
            self._metrics[mode]["aux_loss"].append(self.accelerator.gather_for_metrics(aux_loss).mean().item())

        # Log the metrics
        # --- CE-GPPO begin: `masked_seq_mean` is unused here (TRL's clip metrics come from `cegppo_diagnostics`); ---
        # kept, like the branches above, for the line-for-line diff.
        # --- CE-GPPO end ---
        def masked_seq_mean(x):
            if x.shape[1] == 1:  # when importance_sampling_level == "sequence": already one value per sequence
                return x.squeeze(1)
            return (x * mask).sum(-1) / mask.sum(-1)

        def global_masked_mean(x):
            if x.shape[1] == 1:  # when importance_sampling_level == "sequence": one value per sequence
                local_sum, local_count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
            else:
                local_sum, local_count = (x * mask).sum(), mask.sum().float()
            totals = self.accelerator.reduce(torch.stack([local_sum, local_count]), reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        # --- CE-GPPO begin: KL and entropy over the kept groups in one reduction; a micro-batch whose groups ---
        # were all dropped measures nothing and logs neither (TRL's `global_masked_mean` would log 0). The means are
        # `global_masked_mean`'s own operations (sums in the tensors' dtype, one tensor division), so the logged
        # values are TRL's bit for bit. The same global entropy feeds the entropy controller.
        kl_sum = (per_token_kl * mask).sum() if self.beta != 0.0 else entropies.new_zeros(())
        totals = torch.stack([(entropies * mask).sum(), kl_sum, mask.sum().float()]).detach()
        totals = self.accelerator.reduce(totals, reduction="sum")
        means = totals[:2] / totals[2].clamp(min=1.0)  # elementwise: each the same division as TRL's
        entropy_sum, _, num_tokens, entropy_mean, kl_mean = torch.cat([totals, means]).tolist()  # one host sync
        if num_tokens > 0:
            if self.beta != 0.0:
                self._metrics[mode]["kl"].append(kl_mean)
            self._metrics[mode]["entropy"].append(entropy_mean)
        if self.entropy_controller is not None and mode == "train":
            self.entropy_controller.observe(entropy_sum, num_tokens, step_end=self.accelerator.sync_gradients)
        # --- CE-GPPO end ---

        if self.loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]:
            # --- CE-GPPO begin: TRL's clip_ratio/* keep their meaning (tokens outside the clip range, which now ---
            # keep a gradient); they and the cegppo/ metrics come from `cegppo_diagnostics`, beside the loss.
            # Each token's coefficient in the loss scales its gradient: the aggregation's weight (from the normalisers
            # the loss used) times the factors TRL multiplies the per-token loss by. The diagnostics weigh by it.
            vllm_correction = self.use_vllm and self.vllm_importance_sampling_correction
            weights = aggregation_weights(mask, self._policy_normaliser(per_token_loss, mask, inputs, mode))
            for factor in (
                off_policy_mask if self.off_policy_mask_threshold is not None else None,
                entropy_mask,
                inputs["importance_sampling_ratio"] if vllm_correction else None,
            ):
                if factor is not None:
                    weights = weights * factor
            self._log_cegppo_metrics(mode, log_importance_weights, advantages, mask, coefficients, weights)
            # --- CE-GPPO end ---
        elif self.loss_type == "cispo":
            is_cispo_clipped = (coef_1 > self.epsilon_high) & (advantages > 0)
            self._metrics[mode]["cispo_clip_ratio"].append(global_masked_mean(is_cispo_clipped.float()))
        elif self.loss_type == "vespo":
            self._metrics[mode]["vespo/phi_seq_mean"].append(global_masked_mean(phi_seq))

        return loss

    def _log_cegppo_metrics(self, mode, log_ratio, advantages, mask, coefficients, weights=None) -> None:
        """`monitoring.cegppo_metrics` into TRL's metrics (`log()` averages them over the logging window); the
        left-drift alarm reads the same sums, alike on every process."""
        gather, controller = self.accelerator.gather, self.entropy_controller
        metrics, sums = cegppo_metrics(log_ratio, advantages, mask, coefficients, gather, weights, controller)
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)
        if mode == "train" and self.left_drift_alarm is not None:
            step_end, step = self.accelerator.sync_gradients, self.state.global_step + 1
            if (warning := self.left_drift_alarm.warning(sums, step_end, step, self.args, coefficients)) is not None:
                logger.warning(warning, main_process_only=True)
