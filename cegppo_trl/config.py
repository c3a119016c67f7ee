"""`CEGPPOConfig`: `trl.GRPOConfig` plus the CE-GPPO coefficients, validated at construction."""

from __future__ import annotations

import logging
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from trl import GRPOConfig

from .loss import check_left_guard, is_finite_number
from .schedules import parse_schedule

logger = logging.getLogger(__name__)

# TRL's clipped surrogate under these aggregations carries CE-GPPO's gradient; other loss types run TRL's objective.
CEGPPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")


def is_on_policy(args: Any) -> bool:
    """Every optimizer step uses fresh rollouts: the ratio is 1 and CE-GPPO is GRPO (no token is clipped)."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * args.num_iterations) == 0


def on_policy_message(args: Any, vllm_importance_sampling_correction: bool = False) -> str | None:
    """The warning for a CE-GPPO run that is GRPO because it is on-policy (`is_on_policy`), else None; it explains
    that TRL's vLLM importance-sampling correction (`vllm_importance_sampling_correction`) keeps the ratio at 1."""
    if args.loss_type not in CEGPPO_LOSS_TYPES or not is_on_policy(args):
        return None
    vllm_note = (" vLLM importance-sampling correction does not change this: the clipped ratio compares the policy "
                 "with old log-probs the training model recomputes on the same weights.")  # fmt: skip
    vllm_note = vllm_note if vllm_importance_sampling_correction else ""
    return (
        "CE-GPPO is identical to GRPO with this configuration: every optimizer step uses fresh rollouts "
        f"(gradient_accumulation_steps={args.gradient_accumulation_steps} is a multiple of "
        f"steps_per_generation={args.steps_per_generation} x num_iterations={args.num_iterations}), so the "
        "probability ratio is 1, no token is clipped and there is no gradient to preserve." + vllm_note + " "
        "To train off-policy as the paper does, set `num_iterations=2` (or more), or `steps_per_generation` to a "
        "multiple of `gradient_accumulation_steps` greater than it (the authors take 8 optimizer steps per batch)."
    )


def vanishing_term_messages(args: Any) -> list[str]:
    """One line for each setting TRL trains on that makes a CE-GPPO term vanish (warned, not refused)."""
    if args.loss_type not in CEGPPO_LOSS_TYPES or args.epsilon < 1:
        return []
    return [
        f"`epsilon={args.epsilon:g}` >= 1: the ratio is never below 1 - epsilon <= 0, so no token is left-clipped "
        "and `gppo_beta1` has no effect (CE-GPPO's left term vanishes). The paper uses `epsilon=0.2`."
    ]


@dataclass
class CEGPPOConfig(GRPOConfig):
    r"""
    Configuration for [`CEGPPOTrainer`]: [`~trl.GRPOConfig`] plus the CE-GPPO fields below (Su et al., ACL 2026,
    [arXiv:2509.20712](https://huggingface.co/papers/2509.20712)).

    With `loss_type` one of `"grpo"`, `"bnpo"`, `"dr_grpo"`, `"dapo"` (the default, the authors' token mean) or
    `"luspo"`, clipped tokens keep CE-GPPO's gradient under TRL's aggregation; `"cispo"`, `"sapo"` and `"vespo"` run
    TRL's objective unchanged (baselines with one flag). TRL's `delta` is the authors' dual clip `c` (their recipes:
    10). CE-GPPO differs from GRPO only off-policy: take several optimizer steps per rollout batch (`num_iterations=2`,
    or `steps_per_generation` a multiple of `gradient_accumulation_steps` above it); the trainer warns otherwise.

    Parameters:
        gppo_beta1, gppo_beta2 (`float`, defaults to `0.5`, `1.0`): gradient scales of left-clipped negative-advantage
            (NA&LP; larger: entropy falls faster) and right-clipped positive-advantage tokens (PA&LP; slower).
        gppo_beta1_schedule, gppo_beta2_schedule (`str` or `None`): the betas over optimizer steps
            (`cegppo_trl.schedules`), e.g. `"piecewise:0,0.5@58.5%"`, the paper's switch.
        sft_loss_coef, sft_reward_threshold: the authors' SFT term (recipes: `0.1`) on the correct completions (total
            reward >= the threshold; `None`: positive and the best of its group).
        delta_low, delta_low_mode: the left guard in `(0, 1 - epsilon]`; below it left-clipped tokens lose
            (`"cutoff"`) or decay (`"decay"`: weight `-beta1 * (1 - epsilon) * A * r / delta_low`) their gradient.
    """

    gppo_beta1: float = field(
        default=0.5, metadata={"help": "Gradient scale of left-clipped A < 0 tokens (raised: entropy falls faster)."}
    )
    gppo_beta2: float = field(
        default=1.0, metadata={"help": "Gradient scale of right-clipped A > 0 tokens (raised: entropy falls slower)."}
    )
    gppo_beta1_schedule: str | None = field(
        default=None,
        metadata={
            "help": "beta1 over optimizer steps, overriding gppo_beta1: a number, 'linear:0->0.5@10%-60%' or "
            "'piecewise:0,0.5@58.5%' (`python -m pydoc cegppo_trl.schedules`)."
        },
    )
    gppo_beta2_schedule: str | None = field(
        default=None, metadata={"help": "beta2 over optimizer steps, overriding gppo_beta2 (see gppo_beta1_schedule)."}
    )
    sft_loss_coef: float = field(
        default=0.0, metadata={"help": "Weight of the authors' SFT term on the correct completions (recipes: 0.1)."}
    )
    sft_reward_threshold: float | None = field(
        default=None, metadata={"help": "SFT: correct is reward >= this; None: positive and the best of its group."}
    )
    delta_low: float | None = field(
        default=None, metadata={"help": "Left guard in (0, 1 - eps]: cut or decay the left-clipped gradient below it."}
    )
    delta_low_mode: str = field(
        default="cutoff", metadata={"help": "'cutoff' (no gradient below delta_low) or 'decay' (times r / delta_low)."}
    )
    left_drift_warning: float | None = field(
        default=-1.5, metadata={"help": "Warn when a step's mean left-clipped log-ratio falls below this. None: off."}
    )
    dynamic_sampling: bool = field(
        default=False, metadata={"help": "Drop groups whose advantages are all zero from the loss (authors' recipes)."}
    )
    max_unscorable_batches: int = field(
        default=10, metadata={"help": "Stop (exit 4) after this many batches in a row without any reward; 0: never."}
    )
    max_zero_signal_batches: int = field(
        default=100, metadata={"help": "Stop (exit 3) after this many batches in a row with zero signal; 0: never."}
    )
    # The trainer class that reads this class's own fields: another refuses them set (`for_trainer`)
    trainer_class: ClassVar[str] = "CEGPPOTrainer"

    def __post_init__(self):
        self._validate_cegppo()  # first, so that a bad CE-GPPO field is named before TRL's own checks
        super().__post_init__()

    @classmethod
    def from_grpo_config(cls, grpo_config: GRPOConfig, **overrides: Any) -> CEGPPOConfig:
        """A `CEGPPOConfig` with every field of `grpo_config`, plus CE-GPPO fields (or any override) as keywords
        (`CEGPPOConfig(**grpo_config.to_dict())` fails on the derived `generation_batch_size`). The rollout batch is
        derived afresh from an overridden layout, else from the source's `steps_per_generation`, unless that is TRL's
        default and the overrides change the batch."""
        if not isinstance(grpo_config, GRPOConfig):
            raise TypeError(f"`grpo_config` must be a `trl.GRPOConfig`, got `{type(grpo_config).__name__}`.")
        own = {f.name for f in fields(cls) if f.init}
        values = {f.name: getattr(grpo_config, f.name) for f in fields(grpo_config) if f.init and f.name in own}
        if unknown := sorted(set(overrides) - own):
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
                    "does not say which was set. Pass one of them with the override: `steps_per_generation="
                    f"{spg}` (keep its micro-batch count) or `generation_batch_size={gbs}` (keep its size)."
                )
        return cls(**{**values, **overrides})

    @classmethod
    def for_trainer(cls, model: Any, args: Any, trainer: type | None = None) -> CEGPPOConfig:
        """The `args` of a `trainer` class: a `CEGPPOConfig` as given (refused if it sets fields only another trainer
        class reads), TRL's default for None, a `GRPOConfig` converted with a warning (a drop-in user swaps the class,
        not the config); anything else is for `GRPOTrainer` to take or refuse."""
        if isinstance(args, cls) and trainer and args.trainer_class not in {c.__name__ for c in trainer.mro()}:
            own, unset = {f.name for f in fields(cls)}, lambda f: f.default if f.default is not MISSING else None
            if unread := [f.name for f in fields(args) if f.name not in own and getattr(args, f.name) != unset(f)]:
                raise ValueError(
                    f"`{type(args).__name__}` sets {unread}, which only `{args.trainer_class}` reads: "
                    f"`{trainer.__name__}` would ignore them. Use `{args.trainer_class}`, or leave them at their defaults."
                )
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

    def _validate_cegppo(self) -> None:
        """Each refusal names the field and the fix; TRL's own fields are TRL's to check."""
        for name in ("gppo_beta1", "gppo_beta2", "sft_loss_coef"):
            if not is_finite_number(value := getattr(self, name)) or value < 0:
                raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
        for name in ("gppo_beta1_schedule", "gppo_beta2_schedule"):
            if callable(spec := getattr(self, name)):  # a lambda cannot be pickled into training_args.bin
                raise ValueError(
                    f"`{name}` takes a string or a number: it is saved with the run's settings. Give a callable to "
                    f"the trainer instead: `trainer.{name[5:]} = parse_schedule(fn)` (`cegppo_trl.schedules`)."
                )
            try:
                _ = spec is None or parse_schedule(spec)
            except ValueError as error:
                raise ValueError(f"`{name}`: {error}") from None
        if (threshold := self.sft_reward_threshold) is not None and not is_finite_number(threshold):
            raise ValueError(f"`sft_reward_threshold` must be a finite number or None, got {threshold!r}.")
        if self.loss_type not in CEGPPO_LOSS_TYPES:
            for name, off in {"sft_loss_coef": 0, "dynamic_sampling": False, "delta_low": None}.items():
                if getattr(self, name) != off:  # (a negative `sft_loss_coef` is refused above)
                    raise ValueError(
                        f"`{name}` (a CE-GPPO term) applies to the CE-GPPO loss types {list(CEGPPO_LOSS_TYPES)}; "
                        f"`loss_type={self.loss_type!r}` runs TRL's objective unchanged. Set `{name}={off}`, or use "
                        "a CE-GPPO loss type."
                    )
        check_left_guard(self.delta_low, self.delta_low_mode, self.epsilon)
        # epsilon >= 1 leaves no left region (`vanishing_term_messages` warns): the warning cannot fire
        if (threshold := self.left_drift_warning) is not None and self.epsilon < 1:
            left_bound = math.log(1 - self.epsilon)
            if not (is_finite_number(threshold) and threshold < left_bound):
                raise ValueError(
                    f"`left_drift_warning` must be a finite log-ratio below log(1 - epsilon) = {left_bound:.3f} (every "
                    f"left-clipped token is below it), or None to disable it; got {threshold!r} (default -1.5)."
                )
        for name in ("max_unscorable_batches", "max_zero_signal_batches"):
            if isinstance(value := getattr(self, name), bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"`{name}` must be an integer >= 0 (0 never stops), got {value!r}.")
