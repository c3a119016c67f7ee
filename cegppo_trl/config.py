"""`CEGPPOConfig`: `trl.GRPOConfig` plus the CE-GPPO coefficients, validated at construction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from trl import GRPOConfig

from .controller import parse_controller
from .schedules import parse_schedule

# Aggregations of TRL's clipped surrogate; CE-GPPO replaces the surrogate and keeps each aggregation.
CEGPPO_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
# TRL's other objectives run unchanged through `CEGPPOTrainer` (baselines side by side with one flag).
PASSTHROUGH_LOSS_TYPES = ("cispo", "sapo", "vespo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence")


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
            TRL's field, used as the dual clip `c`: negative-advantage tokens with ratio above `c` get the constant
            loss `-c * A` and no gradient. The authors' recipes use `delta=10`. Must be `> 1`. For `delta >
            1 + epsilon_high` this is exactly TRL's two-sided clipping; for `1 < delta <= 1 + epsilon_high` the
            authors' form is used (the constant applies from `r > delta`), where TRL's clamp would act only above
            `1 + epsilon_high`.
        num_iterations, steps_per_generation, gradient_accumulation_steps:
            CE-GPPO only differs from GRPO when the policy is off-policy (ratio != 1). That needs
            `gradient_accumulation_steps % (steps_per_generation * num_iterations) != 0`, e.g. `num_iterations=2`
            or `steps_per_generation=8` with `gradient_accumulation_steps=1` (the authors' 8 optimizer steps per
            rollout batch). vLLM importance-sampling correction does not make it off-policy: the old log-probs are
            then recomputed by the training model on the same weights (ratio 1), and the correction only reweights
            tokens. The trainer warns when the ratio is 1.
    """

    gppo_beta1: float = field(
        default=0.5,
        metadata={
            "help": "CE-GPPO beta1: gradient scale of negative-advantage tokens clipped below 1 - epsilon (NA&LP). "
            "Larger beta1 makes policy entropy fall faster (exploitation). Paper default 0.5; 0.75 for 7B. "
            "Caution: beta1 > 0 keeps pushing left-clipped tokens down, with no trust region on that side. In a "
            "small study (tiny model, docs/entropy-study.md) beta1 = 0.5 trained close to GRPO at lr 1e-4 or with 2 "
            "optimizer steps per rollout batch, but lost accuracy at lr 3e-4 with 4 steps and collapsed with 8, where "
            "GRPO did not; beta1 = 1 failed sooner. With many steps per batch or a large lr, start from 0 and watch "
            "cegppo/preserved/left_log_ratio (a drift below about -1.5 preceded most collapses)."
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
            "help": "Schedule of beta1 over optimizer steps, one string; overrides `gppo_beta1` when set. E.g. "
            "'piecewise:0@0,0.5@585' (the paper's explore-then-exploit switch), 'linear:0->0.5@10%-60%', "
            "'cosine:1->0.5', 'exp:1->0.1', 'warmup:0->0.5@50'. See docs/schedules.md."
        },
    )
    gppo_beta2_schedule: str | None = field(
        default=None,
        metadata={"help": "Schedule of beta2, same syntax as `gppo_beta1_schedule`; overrides `gppo_beta2` when set."},
    )
    entropy_controller: str | None = field(
        default=None,
        metadata={
            "help": "Closed-loop entropy control: keep the mean token entropy in a band by moving beta1/beta2 around "
            "their (scheduled) nominal values. One string, e.g. 'band=0.3-0.6,step=0.05,mode=both,beta1=0-1,"
            "beta2=0.5-1.5,every=10'. None disables it. See docs/schedules.md."
        },
    )
    sft_loss_coef: float = field(
        default=0.0,
        metadata={
            "help": "Coefficient of the SFT term on correct rollouts (Klear-Reasoner's 'RL with SFT loss', in every "
            "official CE-GPPO recipe with 0.1): adds coef x the negative log-likelihood of the completions judged "
            "correct, aggregated like the policy loss (`loss_type`; `bnpo`: token-mean) and normalised by the correct "
            "sequences / tokens of the whole rollout batch, so it does not depend on the micro-batch split. 0 "
            "disables it."
        },
    )
    sft_reward_threshold: float | None = field(
        default=None,
        metadata={
            "help": "Which completions the SFT term treats as correct. None (default): those whose total reward is "
            "positive and equals the maximum reward in their group. A float: those whose total reward is >= it."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "Drop prompt groups whose TRL advantages are all zero (uninformative) from the loss, its "
            "normalisers, the metrics, the entropy controller and the entropy bonus, as in DAPO and the CE-GPPO "
            "recipes. Groups are not refilled with new generations (the authors' `max_num_gen_batches=1`). "
            "Training only; evaluation keeps every group."
        },
    )

    max_unscorable_batches: int = field(
        default=1,
        metadata={
            "help": "Stop with an error after this many consecutive rollout batches in which no completion got a "
            "reward (every reward function returned None or NaN): such batches have zero loss and gradient, so the "
            "run would end with an unchanged model. 0 never stops."
        },
    )

    def __post_init__(self):
        self._validate_cegppo()  # first, so a bad CE-GPPO field is reported before TRL's own checks
        self._validate_inherited()
        super().__post_init__()

    def _validate_inherited(self) -> None:
        """GRPOConfig fields whose bad values TRL accepts but that silently corrupt a CE-GPPO run."""
        if not (isinstance(self.beta, (int, float)) and math.isfinite(self.beta) and self.beta >= 0):
            raise ValueError(
                f"`beta` (TRL's KL coefficient) must be a finite number >= 0, got {self.beta!r}: a negative value "
                "rewards moving away from the reference model. Use `beta=0.0` for no KL term (the authors' setting)."
            )
        temperature = self.temperature
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature > 0):
            raise ValueError(
                f"`temperature` must be a finite number > 0, got {self.temperature!r}: the rollouts are sampled and "
                "the log-probabilities are divided by it. The authors use `temperature=1.0`."
            )
        # `num_generations < 2` is refused by GRPOConfig itself.
        if self.num_iterations < 1:
            raise ValueError(
                f"`num_iterations` must be >= 1, got {self.num_iterations}: it is the number of passes over each "
                "rollout batch. Use 1, or 2+ for off-policy steps where CE-GPPO differs from GRPO."
            )
        if self.steps_per_generation is not None and self.steps_per_generation < 1:
            raise ValueError(
                f"`steps_per_generation` must be >= 1 or None (= `gradient_accumulation_steps`), got "
                f"{self.steps_per_generation}."
            )
        if self.max_unscorable_batches < 0:
            raise ValueError(
                f"`max_unscorable_batches` must be >= 0 (0 never stops), got {self.max_unscorable_batches}."
            )

    def _validate_cegppo(self) -> None:
        _check_finite_nonnegative("gppo_beta1", self.gppo_beta1)
        _check_finite_nonnegative("gppo_beta2", self.gppo_beta2)
        for name, parse in (
            ("gppo_beta1_schedule", parse_schedule),
            ("gppo_beta2_schedule", parse_schedule),
            ("entropy_controller", parse_controller),
        ):
            if getattr(self, name) is None:
                continue
            try:
                parsed = parse(getattr(self, name))
                if name != "entropy_controller" and self.max_steps > 0:
                    parsed.check(self.max_steps)  # a window mixing steps and percentages may be empty for this run
            except ValueError as error:
                raise ValueError(f"`{name}`: {error}") from None
        _check_finite_nonnegative("sft_loss_coef", self.sft_loss_coef)
        if self.sft_reward_threshold is not None and not math.isfinite(self.sft_reward_threshold):
            raise ValueError(
                f"`sft_reward_threshold` must be a finite number or None, got {self.sft_reward_threshold!r}."
            )
        allowed = CEGPPO_LOSS_TYPES + PASSTHROUGH_LOSS_TYPES
        if self.loss_type not in allowed:
            raise ValueError(
                f"`loss_type` must be one of {list(CEGPPO_LOSS_TYPES)} (CE-GPPO objective with TRL's aggregation) or "
                f"{list(PASSTHROUGH_LOSS_TYPES)} (TRL's objective, unchanged), got {self.loss_type!r}."
            )
        if self.loss_type in PASSTHROUGH_LOSS_TYPES and (self.sft_loss_coef > 0 or self.dynamic_sampling):
            raise ValueError(
                f"`sft_loss_coef` and `dynamic_sampling` apply to the CE-GPPO loss types {list(CEGPPO_LOSS_TYPES)}; "
                f"`loss_type={self.loss_type!r}` runs TRL's objective unchanged. Set `sft_loss_coef=0` and "
                "`dynamic_sampling=False`, or use a CE-GPPO loss type."
            )
        if self.importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
            raise ValueError(
                f"`importance_sampling_level` must be one of {list(IMPORTANCE_SAMPLING_LEVELS)}, "
                f"got {self.importance_sampling_level!r}."
            )
        if self.loss_type in CEGPPO_LOSS_TYPES:
            epsilon_high = self.epsilon if self.epsilon_high is None else self.epsilon_high
            for name, value in (("epsilon", self.epsilon), ("epsilon_high", epsilon_high)):
                if not (math.isfinite(value) and 0 < value < 1):
                    raise ValueError(
                        f"`{name}` must be in the open interval (0, 1) for the CE-GPPO clip range, got {value!r}."
                    )
        if self.delta is not None and not (math.isfinite(self.delta) and self.delta > 1):
            raise ValueError(
                f"`delta` (the dual-clip constant c) must be a finite number > 1, got {self.delta!r}; the authors' "
                "recipes use 10. Set `delta=None` to disable the dual clip."
            )
