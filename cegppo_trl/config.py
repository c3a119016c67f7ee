"""`CEGPPOConfig`: `trl.GRPOConfig` plus the CE-GPPO coefficients, validated at construction."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, fields
from typing import Any

from trl import GRPOConfig

from .loss import check_left_guard
from .schedules import parse_schedule

logger = logging.getLogger(__name__)

# Aggregations of TRL's clipped surrogate; CE-GPPO replaces the surrogate and keeps each aggregation.
CEGPPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# TRL's other objectives run unchanged through `CEGPPOTrainer` (baselines side by side with one flag).
PASSTHROUGH_LOSS_TYPES = ("cispo", "sapo", "vespo")


def is_on_policy(args: Any) -> bool:
    """Every optimizer step uses fresh rollouts: the ratio is 1 and CE-GPPO is GRPO (no token is clipped)."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0


def on_policy_message(args: Any, vllm_importance_sampling_correction: bool = False) -> str | None:
    """The warning for a CE-GPPO run that is GRPO because it is on-policy (`is_on_policy`), else None.

    Args:
        args: the run's config (its batch layout and `loss_type`).
        vllm_importance_sampling_correction: whether TRL corrects vLLM's sampling, which the message then explains
            does not help.
    """
    if args.loss_type not in CEGPPO_LOSS_TYPES or not is_on_policy(args):
        return None
    # With vLLM importance-sampling correction TRL also computes `old_per_token_logps`, but with the training model on
    # the same weights the loss then sees: the ratio is still 1 (up to the numerical difference between two forward
    # passes). The correction only reweights tokens by pi_train / pi_vllm; it does not make the ratio move, so the
    # warning applies with or without it.
    vllm_note = (
        " vLLM importance-sampling correction does not change this: it reweights tokens by the trainer/vLLM "
        "probability ratio, while the clipped ratio compares the policy with old log-probs the training "
        "model recomputes on the same weights."
        if vllm_importance_sampling_correction
        else ""
    )
    return (
        "CE-GPPO is identical to GRPO with this configuration: every optimizer step uses fresh rollouts "
        f"(gradient_accumulation_steps={args.gradient_accumulation_steps} is a multiple of "
        f"steps_per_generation={args.steps_per_generation} x num_iterations={args.num_iterations}), so the "
        "probability ratio is 1, no token is clipped and there is no gradient to preserve." + vllm_note + " "
        "To train off-policy as the paper does, take several optimizer steps per rollout batch: set "
        "`num_iterations=2` (or more), or `steps_per_generation` to a multiple of "
        "`gradient_accumulation_steps` greater than it (the authors use 8 optimizer steps per batch)."
    )


def vanishing_term_messages(args: Any) -> list[str]:
    """One line for each setting TRL trains on that makes a CE-GPPO term vanish or meaningless (not refused)."""
    if args.loss_type not in CEGPPO_LOSS_TYPES:
        return []
    messages = []
    if args.epsilon >= 1:
        messages.append(
            f"`epsilon={args.epsilon:g}` >= 1: the ratio is never below 1 - epsilon <= 0, so no token is left-clipped "
            "and `gppo_beta1` has no effect (CE-GPPO's left term vanishes). The paper uses `epsilon=0.2`."
        )
    return messages


def _check_finite_nonnegative(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")


@dataclass
class CEGPPOConfig(GRPOConfig):
    r"""
    Configuration for [`CEGPPOTrainer`]: every field of [`~trl.GRPOConfig`], plus the two CE-GPPO coefficients.

    CE-GPPO (Su et al., ACL 2026, [arXiv:2509.20712](https://huggingface.co/papers/2509.20712)) keeps a bounded
    gradient for the tokens that PPO's clip discards. With `loss_type` one of `"grpo"`, `"bnpo"`, `"dr_grpo"`,
    `"dapo"` (default, the token-mean of the authors' runs) or `"luspo"`, the clipped surrogate is replaced by the
    CE-GPPO objective and the aggregation is TRL's. With `"cispo"`, `"sapo"` or `"vespo"` the trainer runs TRL's
    objective unchanged, so baselines need one flag.

    Parameters that matter for CE-GPPO:
        gppo_beta1 (`float`, *optional*, defaults to `0.5`):
            Gradient scale of negative-advantage tokens whose ratio fell below `1 - epsilon` (NA&LP, left clip).
            Larger values make entropy fall faster (exploitation). The paper's default is `0.5` (1.5B), `0.75` (7B).
        gppo_beta2 (`float`, *optional*, defaults to `1.0`):
            Gradient scale of positive-advantage tokens whose ratio rose above `1 + epsilon_high` (PA&LP, right
            clip). Larger values make entropy fall slower (exploration).
        delta (`float` or `None`, *optional*, defaults to `None`):
            TRL's field (two-sided clipping: the ratio is capped at `delta`), which for negative-advantage tokens is
            the authors' dual clip `c`: a ratio above it gives the constant loss `-c * A` and no gradient. Their
            recipes use `delta=10`. TRL's clamp does the clipping, for any value TRL takes.
        num_iterations, steps_per_generation, gradient_accumulation_steps:
            CE-GPPO only differs from GRPO when the policy is off-policy (ratio != 1). That needs
            `gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0`, e.g. `num_iterations=2`
            or `steps_per_generation=8` with `gradient_accumulation_steps=1` (the authors' 8 optimizer steps per
            rollout batch). vLLM importance-sampling correction does not make it off-policy: the old log-probs are
            then recomputed by the training model on the same weights (ratio 1), and the correction only reweights
            tokens. The trainer warns when the ratio is 1.
        delta_low (`float` or `None`, *optional*, defaults to `None`):
            Left guard, the left-side counterpart of `delta`: negative-advantage tokens whose ratio fell below it
            (`0 < delta_low <= 1 - epsilon`) keep the left-clipped loss value but lose (`delta_low_mode="cutoff"`) or
            decay (`"decay"`: weight `-beta1 * (1 - epsilon) * A * r / delta_low`) its gradient, so that `gppo_beta1`
            cannot push a token out of the policy. `None` is the paper's exact objective. See docs/algorithm.md.
        delta_low_mode (`str`, *optional*, defaults to `"cutoff"`):
            `"cutoff"` or `"decay"`, see `delta_low`.
        max_zero_signal_batches (`int`, *optional*, defaults to `100`):
            Stop after this many consecutive training rollout batches in which every group has zero reward spread
            (zero advantages, no policy gradient; the batches dynamic sampling would empty) or no completion token is
            in the loss. The first batch of such a streak warns with its kind: every completion at the top reward, at
            the lowest, all equal in between, an infinite reward, or every completion masked. The stop is
            transformers' `control.should_training_stop` at the end of that optimizer step: `train()` returns,
            `trainer.stop_reason` is `"zero_signal"` (`"unscorable"` for `max_unscorable_batches`), and
            `cegppo train` saves the model and exits 3 (4). `0` never stops. See docs/configuration.md for the
            default.
        left_drift_warning (`float` or `None`, *optional*, defaults to `-1.5`):
            Warn when an optimizer step's `cegppo/preserved/left_log_ratio` (mean log-ratio of left-clipped tokens)
            falls below it, once per episode of drift. `None` disables the warning.
    """

    gppo_beta1: float = field(
        default=0.5,
        metadata={
            "help": "CE-GPPO beta1: gradient scale of negative-advantage tokens clipped below 1 - epsilon (entropy falls "
            "faster when raised). Paper: 0.5 (1.5B), 0.75 (7B). Off-policy hazard: see `delta_low`, `left_drift_warning`."
        },
    )
    gppo_beta2: float = field(
        default=1.0,
        metadata={
            "help": "CE-GPPO beta2: gradient scale of positive-advantage tokens clipped above 1 + epsilon_high "
            "(PA&LP). Larger beta2 makes policy entropy fall slower (exploration). Paper default 1.0."
        },
    )

    gppo_beta1_schedule: str | None = field(
        default=None,
        metadata={
            "help": "Schedule of beta1 over optimizer steps, overriding `gppo_beta1`: a number, 'linear:0->0.5@10%-60%' "
            "(a ramp over 10-60% of the run) or 'piecewise:0,0.5@58.5%' (the paper's switch). Syntax: `python -m pydoc "
            "cegppo_trl.schedules`."
        },
    )
    gppo_beta2_schedule: str | None = field(
        default=None,
        metadata={"help": "Schedule of beta2, same syntax as `gppo_beta1_schedule`; overrides `gppo_beta2` when set."},
    )
    sft_loss_coef: float = field(
        default=0.0,
        metadata={
            "help": "Coefficient of the authors' SFT term: NLL of the completions judged correct, aggregated like the policy "
            "loss over the rollout batch (recipes: 0.1). See `python -m pydoc cegppo_trl.rollouts`."
        },
    )
    sft_reward_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Which completions the SFT term treats as correct. None (default): those whose total reward is "
            "positive and equals the maximum reward in their group. A float: those whose total reward is >= it."
        },
    )
    delta_low: float | None = field(
        default=None,
        metadata={
            "help": "Left guard (left-side counterpart of `delta`): A < 0 tokens with ratio below it, in (0, 1 - "
            "epsilon], lose or decay their left-clipped gradient. None: the paper's objective. See `python -m pydoc "
            "cegppo_trl.loss`."
        },
    )
    delta_low_mode: str = field(
        default="cutoff",
        metadata={
            "help": "How the left guard bounds the gradient below `delta_low`: 'cutoff' (none) or 'decay' (scaled by "
            "r / delta_low). The loss value is unchanged."
        },
    )
    left_drift_warning: float | None = field(
        default=-1.5,
        metadata={
            "help": "Warn (once per episode) when an optimizer step's mean left-clipped log-ratio "
            "(`cegppo/preserved/left_log_ratio`) falls below this; it preceded most collapses. None disables it."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Drop prompt groups whose advantages are all zero from the loss, its normalisers and the metrics, as the "
            "authors' recipes do (no refill). Training only. See `python -m pydoc cegppo_trl.rollouts`."
        },
    )

    max_unscorable_batches: int = field(
        default=10,
        metadata={
            "help": "Stop cleanly (at that step's end; `cegppo train` saves the model, exits 4) after this many "
            "consecutive rollout batches without any reward (all None/NaN). Fewer only warn, as TRL does. 0: never."
        },
    )

    max_zero_signal_batches: int = field(
        default=100,
        metadata={
            "help": "Stop cleanly (at that step's end; `cegppo train` saves the model, exits 3) after this many "
            "consecutive rollout batches without reward spread in any group (no policy gradient). 0: never."
        },
    )

    def __post_init__(self):
        self._validate_cegppo()  # first, so a bad CE-GPPO field is reported before TRL's own checks
        self._validate_left_guard()
        super().__post_init__()

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig, **overrides: Any) -> CEGPPOConfig:
        """A `CEGPPOConfig` with every field of `grpo_config`, plus CE-GPPO fields (or any override) as keywords.

        `CEGPPOConfig(**grpo_config.to_dict())` cannot work: after construction a `GRPOConfig` holds both
        `steps_per_generation` and the `generation_batch_size` derived from it, which may not both be set, and
        `to_dict` masks tokens and turns enums into strings. This copies the attributes instead and re-derives the
        rollout batch as `GRPOConfig` would from the resulting fields:

        - an override of `steps_per_generation` or `generation_batch_size` sets the layout (the other is derived);
        - otherwise `generation_batch_size` is derived from the source's `steps_per_generation`, unless an override
          changes `gradient_accumulation_steps` or `per_device_train_batch_size` and the source's
          `steps_per_generation` is TRL's default (equal to its `gradient_accumulation_steps`): then both are
          derived afresh, as `CEGPPOConfig(...)` with the same fields would;
        - a changed `per_device_train_batch_size` with a source layout that is not TRL's default is refused: the
          source does not say whether `steps_per_generation` or `generation_batch_size` was set, and they now
          disagree. Pass one of them.

        Example: `CEGPPOConfig.from_grpo_config(GRPOConfig(output_dir="out", num_iterations=2), gppo_beta1=0.5)`.
        """
        if not isinstance(grpo_config, GRPOConfig):
            raise TypeError(f"`grpo_config` must be a `trl.GRPOConfig`, got `{type(grpo_config).__name__}`.")
        own = {f.name for f in fields(cls) if f.init}
        values = {f.name: getattr(grpo_config, f.name) for f in fields(grpo_config) if f.init and f.name in own}
        unknown = sorted(set(overrides) - own)
        if unknown:
            raise TypeError(f"`CEGPPOConfig` has no field(s) {unknown}.")
        values["generation_batch_size"] = None  # derived from steps_per_generation, the per-device setting
        if "generation_batch_size" in overrides and "steps_per_generation" not in overrides:
            values["steps_per_generation"] = None
        elif "steps_per_generation" not in overrides:
            changed = [
                name
                for name in ("gradient_accumulation_steps", "per_device_train_batch_size")
                if name in overrides and overrides[name] != getattr(grpo_config, name)
            ]
            if changed and grpo_config.steps_per_generation == grpo_config.gradient_accumulation_steps:
                values["steps_per_generation"] = None  # TRL's default: derive it from the new fields
            elif "per_device_train_batch_size" in changed:
                spg, gbs = grpo_config.steps_per_generation, grpo_config.generation_batch_size
                raise ValueError(
                    f"`per_device_train_batch_size={overrides['per_device_train_batch_size']}` changes the rollout "
                    f"batch of the source config (steps_per_generation={spg}, generation_batch_size={gbs}), which "
                    "does not say which of the two was set. Pass one of them with the override: "
                    f"`steps_per_generation={spg}` (keep the micro-batches per rollout batch) or "
                    f"`generation_batch_size={gbs}` (keep the rollout batch)."
                )
        return cls(**{**values, **overrides})

    @classmethod
    def for_trainer(cls, model: Any, args: Any) -> CEGPPOConfig:
        """`CEGPPOTrainer`'s `args`: a `CEGPPOConfig` as given, TRL's default for None (named `<model>-CE-GPPO`), and a
        `GRPOConfig` converted (`from_grpo_config`, CE-GPPO's defaults) with one line saying so: a drop-in user swaps
        the class, not the config. Anything else is passed on for `GRPOTrainer` to take or refuse."""
        if args is None:
            model_name = model if isinstance(model, str) else model.config._name_or_path
            return cls(f"{model_name.split('/')[-1]}-CE-GPPO")
        if isinstance(args, GRPOConfig) and not isinstance(args, cls):
            logger.warning(
                "`args` is a `GRPOConfig`: converted to a `CEGPPOConfig` with CE-GPPO's defaults (gppo_beta1=0.5, "
                "gppo_beta2=1.0); pass a `CEGPPOConfig` to set them."
            )
            return cls.from_grpo_config(args)
        return args

    def _validate_left_guard(self) -> None:
        """`delta_low`, `delta_low_mode` and `left_drift_warning` (after `_validate_cegppo` has checked epsilon)."""
        if self.delta_low is not None and self.loss_type not in CEGPPO_LOSS_TYPES:
            raise ValueError(
                f"`delta_low` (the left guard) applies to the CE-GPPO loss types {list(CEGPPO_LOSS_TYPES)}; "
                f"`loss_type={self.loss_type!r}` runs TRL's objective unchanged. Set `delta_low=None`."
            )
        check_left_guard(self.delta_low, self.delta_low_mode, self.epsilon)
        threshold = self.left_drift_warning
        if self.epsilon >= 1:  # no left region (`vanishing_term_messages` warns): the warning can never fire
            return
        if threshold is not None and not (
            isinstance(threshold, (int, float)) and math.isfinite(threshold) and threshold < math.log(1 - self.epsilon)
        ):
            raise ValueError(
                "`left_drift_warning` must be a finite log-ratio below log(1 - epsilon) = "
                f"{math.log(1 - self.epsilon):.3f} (every left-clipped token is below it), or None to disable the "
                f"warning; got {threshold!r}. "
                "The default -1.5 comes from cegppo-trl's entropy studies (it caught 50 of 59 collapses of a tiny model, "
                "with 16 false alarms in 101 stable runs)."
            )

    def _validate_cegppo(self) -> None:
        _check_finite_nonnegative("gppo_beta1", self.gppo_beta1)
        _check_finite_nonnegative("gppo_beta2", self.gppo_beta2)
        for name in ("gppo_beta1_schedule", "gppo_beta2_schedule"):
            if callable(getattr(self, name)):  # a lambda cannot be pickled into training_args.bin at the first save
                raise ValueError(
                    f"`{name}` takes a string or a number: it is saved with the run's settings. Give a callable to "
                    f"the trainer instead: `trainer.{name[5:]} = parse_schedule(fn)` (`cegppo_trl.schedules`)."
                )
            if getattr(self, name) is None:
                continue
            try:
                parsed = parse_schedule(getattr(self, name))
                if self.max_steps > 0:
                    parsed.check(self.max_steps)  # a window mixing steps and percentages may be empty for this run
            except ValueError as error:
                raise ValueError(f"`{name}`: {error}") from None
        _check_finite_nonnegative("sft_loss_coef", self.sft_loss_coef)
        if self.sft_reward_threshold is not None and not math.isfinite(self.sft_reward_threshold):
            raise ValueError(
                f"`sft_reward_threshold` must be a finite number or None, got {self.sft_reward_threshold!r}."
            )
        if self.loss_type not in CEGPPO_LOSS_TYPES and (self.sft_loss_coef > 0 or self.dynamic_sampling):
            raise ValueError(
                f"`sft_loss_coef` and `dynamic_sampling` apply to the CE-GPPO loss types {list(CEGPPO_LOSS_TYPES)}; "
                f"`loss_type={self.loss_type!r}` runs TRL's objective unchanged. Set `sft_loss_coef=0` and "
                "`dynamic_sampling=False`, or use a CE-GPPO loss type."
            )
        for name in ("max_unscorable_batches", "max_zero_signal_batches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be an integer >= 0 (0 never stops), got {value!r}.")
