"""`ResearchCEGPPOTrainer`: `CEGPPOTrainer` with the entropy studies' instruments, plugged into its two public hooks.

- `entropy_controller` moves beta1 / beta2 to keep the mean token entropy in a band (`research.controller`; this
  package's design, not the paper's): `current_gppo_betas()` applies it; its state is an `ExportableState` callback
  that transformers saves in `trainer_state.json` and restores on resume.
- `gppo_beta_rule="entropy"` assigns each beta by the push's first-order entropy effect (`preserved_weight()`).
- `log_predictor` logs the entropy predictor and the preserved gradient share (`research.diagnostics`) every
  micro-batch, at the cost of one gather and one host transfer each.

The core package never imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from .._spec import format_number
from ..config import CEGPPOConfig
from ..schedules import parse_schedule
from ..trainer import CEGPPOTrainer
from .controller import EntropyController, parse_controller
from .diagnostics import (
    cegppo_diagnostics,
    combine_diagnostics,
    diagnostics_metrics,
    entropy_rule_weight,
    side_bound,
)

BETA_RULES = ("paper", "entropy")


@dataclass
class ResearchCEGPPOConfig(CEGPPOConfig):
    r"""
    [`CEGPPOConfig`] plus the entropy studies' options.

    Parameters:
        entropy_controller (`str`, `dict` or `None`, *optional*, defaults to `None`):
            Keep the mean token entropy in a band by moving beta1/beta2 around their scheduled values, e.g.
            `"band=0.3-0.6,every=10"`. See `python -m pydoc cegppo_trl.research.controller`.
        gppo_beta_rule (`str`, *optional*, defaults to `"paper"`):
            `"paper"` (Eq. 8: beta1 left-clipped, beta2 right-clipped) or `"entropy"` (beta2 where the push raises
            the position's entropy to first order, beta1 where it lowers it). Not the paper's rule.
        log_predictor (`bool`, *optional*, defaults to `False`):
            Log `cegppo/predictor/*`, `cegppo/preserved/grad_share` and `cegppo/ratio/mean` every micro-batch.
    """

    entropy_controller: str | dict | None = field(
        default=None,
        metadata={"help": "Entropy band controller for beta1/beta2, e.g. 'band=0.3-0.6,every=10'. None: off."},
    )
    gppo_beta_rule: str = field(
        default="paper",
        metadata={"help": "Which clipped tokens each beta scales: 'paper' (by clip side) or 'entropy'."},
    )
    log_predictor: bool = field(
        default=False, metadata={"help": "Log the entropy predictor and the preserved gradient share."}
    )

    def __post_init__(self):
        if self.gppo_beta_rule not in BETA_RULES:
            raise ValueError(f"`gppo_beta_rule` must be one of {list(BETA_RULES)}, got {self.gppo_beta_rule!r}.")
        if self.gppo_beta_rule == "entropy" and self.importance_sampling_level != "token":
            raise ValueError(
                "`gppo_beta_rule='entropy'` assigns beta per token (by log p against the entropy H at its position); "
                f"`importance_sampling_level={self.importance_sampling_level!r}` has one ratio per sequence. Set "
                "`importance_sampling_level='token'` or `gppo_beta_rule='paper'`."
            )
        try:
            parse_controller(self.entropy_controller)
        except ValueError as error:
            raise ValueError(f"`entropy_controller`: {error}") from None
        super().__post_init__()
        self._validate_controller_bounds()

    def _validate_controller_bounds(self) -> None:
        """The controller's bounds must contain every nominal beta it moves: otherwise the clamp would replace the
        configured beta from the first step, before the controller has measured anything."""
        controller = parse_controller(self.entropy_controller)
        if controller is None:
            return
        for beta in ("beta1", "beta2"):
            if controller.mode not in (beta, "both"):
                continue  # a coefficient the controller does not move is the nominal itself, bounds do not apply
            schedule_field, constant_field = f"gppo_{beta}_schedule", f"gppo_{beta}"
            spec = getattr(self, schedule_field)
            low, high = parse_schedule(spec if spec is not None else getattr(self, constant_field)).value_range
            bound_low, bound_high = getattr(controller, f"{beta}_min"), getattr(controller, f"{beta}_max")
            if bound_low <= low and high <= bound_high:
                continue
            f = format_number
            if spec is not None:
                nominal = f"`{schedule_field}={spec!r}` takes values {f(low)}-{f(high)}"
                fix_nominal = f"keep `{schedule_field}` within {f(bound_low)}-{f(bound_high)}"
            else:
                nominal = f"`{constant_field}={f(low)}`"
                fix_nominal = f"set `{constant_field}` within {f(bound_low)}-{f(bound_high)}"
            other = "beta2" if beta == "beta1" else "beta1"
            raise ValueError(
                f"{nominal}, outside the `entropy_controller` bounds {beta}={f(bound_low)}-{f(bound_high)}: the "
                f"controller would replace the configured {beta} by the nearest bound, before measuring any entropy. "
                f"Set `{beta}={f(min(low, bound_low))}-{f(max(high, bound_high))}` in `entropy_controller` (bounds "
                f"that contain the nominal values), {fix_nominal}, or use `mode={other}` in `entropy_controller` so "
                f"the controller leaves {beta} alone."
            )


class EntropyControllerState(TrainerCallback, ExportableState):
    """The entropy controller, kept where transformers keeps callback state: `state()` goes into
    `trainer_state.json` at every checkpoint, and a resume restores it (`CheckpointHooks._load_rng_state`)."""

    def __init__(self, spec: str | dict, beta1: float, beta2: float):
        self.spec, self.initial = spec, (beta1, beta2)
        self.controller = EntropyController(parse_controller(spec), beta1, beta2)

    def state(self) -> dict:
        return {
            "args": {"spec": self.spec, "beta1": self.initial[0], "beta2": self.initial[1]},
            "attributes": self.controller.state_dict(),
        }

    def load_state_dict(self, state: dict) -> None:  # `CheckpointHooks` restores the run-state callbacks with it
        self.controller.load_state_dict(state)


class ResearchCEGPPOTrainer(CEGPPOTrainer):
    """`CEGPPOTrainer` with `ResearchCEGPPOConfig`'s options (module docstring); the same arguments otherwise."""

    def __init__(self, model, reward_funcs=None, args: CEGPPOConfig | None = None, *pargs, **kwargs):
        if isinstance(args, CEGPPOConfig) and not isinstance(args, ResearchCEGPPOConfig):
            args = ResearchCEGPPOConfig.from_grpo_config(args)
        super().__init__(model, reward_funcs, ResearchCEGPPOConfig.for_trainer(model, args), *pargs, **kwargs)
        self._entropy_window: list[float] = []  # TRL's logged entropy of this step's micro-batches
        if self.args.entropy_controller is not None:
            initial = (self.beta1_schedule.initial, self.beta2_schedule.initial)
            state = EntropyControllerState(self.args.entropy_controller, *map(float, initial))
            self._run_state_callbacks = (*self._run_state_callbacks, state)  # saved and restored with the run
            self.add_callback(state)

    @property
    def entropy_controller(self) -> EntropyController | None:
        """The controller, looked up where transformers keeps it (a resume replaces the callback)."""
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, EntropyControllerState):
                return callback.controller
        return None

    def current_gppo_betas(self) -> tuple[float, float]:
        beta1, beta2 = super().current_gppo_betas()
        controller = self.entropy_controller
        return (beta1, beta2) if controller is None else tuple(map(float, controller.apply(beta1, beta2)))

    def preserved_weight(self, log_ratio, advantages, regions, *, beta1, beta2, logps, entropies, mask):
        args = self.args
        if args.gppo_beta_rule == "entropy":
            bounds = dict(epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high, delta_low=args.delta_low,
                          delta_low_mode=args.delta_low_mode)  # fmt: skip
            weight = entropy_rule_weight(log_ratio, advantages, regions, logps, entropies, beta1=beta1, beta2=beta2,
                                         **bounds)  # fmt: skip
        else:
            weight = super().preserved_weight(log_ratio, advantages, regions, beta1=beta1, beta2=beta2, logps=logps,
                                              entropies=entropies, mask=mask)  # fmt: skip
        if args.log_predictor:
            self._log_predictor(log_ratio, advantages, regions, weight, logps, entropies, mask, beta1, beta2)
        return weight

    def _log_predictor(self, log_ratio, advantages, regions, weight, logps, entropies, mask, beta1, beta2) -> None:
        mode = "train" if self.model.training else "eval"
        bound = side_bound(log_ratio, regions, self.epsilon_low, self.epsilon_high)
        settings = dict(
            epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high,
            beta1=beta1,
            beta2=beta2,
            delta=self.args.delta,
            delta_low=self.args.delta_low,
            delta_low_mode=self.args.delta_low_mode,
        )
        diagnostics = cegppo_diagnostics(log_ratio, advantages, mask, **settings, logps=logps, entropies=entropies,
                                         regions=regions, coefficient=weight * bound)  # fmt: skip
        metrics = diagnostics_metrics(*combine_diagnostics(diagnostics, self.accelerator.gather))
        if "cegppo/predictor/entropy_change" in metrics:  # DDP averages the processes' gradients: so does the push
            metrics["cegppo/predictor/entropy_change"] /= self.accelerator.num_processes
        for name, value in metrics.items():
            self._metrics[mode][name].append(value)

    def _compute_loss(self, model, inputs):
        loss = super()._compute_loss(model, inputs)
        controller = self.entropy_controller
        if controller is not None and self.model.training:
            # The step's entropy as TRL logs it (all processes, each micro-batch's token mean), fed once a step.
            self._entropy_window.append(self._metrics["train"]["entropy"][-1])
            if self.accelerator.sync_gradients:
                window, self._entropy_window = self._entropy_window, []
                controller.observe(sum(window), len(window), step_end=True)
                self._metrics["train"]["cegppo/controller/target_low"].append(controller.target[0])
                self._metrics["train"]["cegppo/controller/target_high"].append(controller.target[1])
                if controller.last_entropy is not None:
                    self._metrics["train"]["cegppo/controller/entropy"].append(controller.last_entropy)
        return loss

    def cegppo_settings(self) -> dict[str, object]:
        settings = super().cegppo_settings()
        controller = self.entropy_controller
        if controller is not None:
            settings["entropy_controller"] = controller.config.to_spec()
        if self.args.gppo_beta_rule != "paper":
            settings["gppo_beta_rule"] = self.args.gppo_beta_rule
        return settings
