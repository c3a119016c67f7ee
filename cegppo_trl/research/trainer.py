"""`ResearchCEGPPOTrainer`: `CEGPPOTrainer` with the entropy studies' instruments, plugged into its two public hooks.

- `entropy_controller` moves beta1 / beta2 to keep the mean token entropy in a band (`research.controller`; this
  package's design, not the paper's): `current_gppo_betas()` applies it; its state is an `ExportableState` callback
  that transformers saves in `trainer_state.json` and restores on resume.
- `gppo_beta_rule="entropy"` assigns each beta by the push's first-order entropy effect (`preserved_weight()`).
- `log_predictor` logs the entropy predictor and the preserved gradient share (`research.diagnostics`) every
  micro-batch, at the cost of one gather and one host transfer each.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import ClassVar

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..config import CEGPPOConfig
from ..schedules import parse_schedule
from ..trainer import CEGPPOTrainer
from .controller import EntropyController, parse_controller
from .diagnostics import entropy_rule_weight, predictor_metrics, predictor_sums, side_bound


@dataclass
class ResearchCEGPPOConfig(CEGPPOConfig):
    r"""
    [`CEGPPOConfig`] plus the entropy studies' options.

    Parameters:
        entropy_controller (`dict`, `str` or `None`, *optional*, defaults to `None`):
            Keep the mean token entropy in a band by moving beta1/beta2 around their scheduled values: the fields of
            `research.controller.EntropyControllerConfig`, as a mapping or its JSON text, e.g.
            `'{"target_low": 0.3, "target_high": 0.6, "update_every": 10}'`.
        gppo_beta_rule (`str`, *optional*, defaults to `"paper"`):
            `"paper"` (Eq. 8: beta1 left-clipped, beta2 right-clipped) or `"entropy"` (beta2 where the push raises
            the position's entropy to first order, beta1 where it lowers it). Not the paper's rule.
        log_predictor (`bool`, *optional*, defaults to `False`):
            Log `cegppo/predictor/*`, `cegppo/preserved/grad_share` and `cegppo/ratio/mean` every micro-batch.
    """

    entropy_controller: dict | str | None = field(
        default=None,
        metadata={"help": 'The entropy controller: JSON of EntropyControllerConfig\'s fields, {"target_low": ...}'},
    )
    gppo_beta_rule: str = field(
        default="paper",
        metadata={"help": "Which clipped tokens each beta scales: 'paper' (by clip side) or 'entropy'."},
    )
    log_predictor: bool = field(
        default=False, metadata={"help": "Log the entropy predictor and the preserved gradient share."}
    )
    trainer_class: ClassVar[str] = "ResearchCEGPPOTrainer"  # `CEGPPOTrainer` refuses these fields set

    def __post_init__(self):
        if self.gppo_beta_rule not in ("paper", "entropy"):
            raise ValueError(f"`gppo_beta_rule` must be 'paper' or 'entropy', got {self.gppo_beta_rule!r}.")
        if self.gppo_beta_rule == "entropy" and self.importance_sampling_level != "token":
            raise ValueError(
                "`gppo_beta_rule='entropy'` assigns beta per token (by log p against the entropy H at its position); "
                f"`importance_sampling_level={self.importance_sampling_level!r}` has one ratio per sequence. Set "
                "`importance_sampling_level='token'` or `gppo_beta_rule='paper'`."
            )
        try:
            controller = parse_controller(self.entropy_controller)
        except ValueError as error:
            raise ValueError(f"`entropy_controller`: {error}") from None
        super().__post_init__()
        # The bounds must contain every nominal beta the controller moves, or the clamp would replace the configured
        # beta before anything was measured.
        for beta in ("beta1", "beta2") if controller is not None else ():
            spec = getattr(self, f"gppo_{beta}_schedule") or getattr(self, f"gppo_{beta}")
            low, high = parse_schedule(spec).value_range
            bounds = getattr(controller, f"{beta}_min"), getattr(controller, f"{beta}_max")
            if controller.mode in (beta, "both") and not bounds[0] <= low <= high <= bounds[1]:
                raise ValueError(
                    f"`entropy_controller`'s {beta} bounds {bounds[0]:g}-{bounds[1]:g} exclude the configured {beta} "
                    f"({low:g}-{high:g}): the controller would replace it before measuring any entropy. Widen "
                    f"`{beta}_min` / `{beta}_max`, change `gppo_{beta}`, or set the controller's `mode` to the other "
                    "beta."
                )


class EntropyControllerState(TrainerCallback, ExportableState):
    """The entropy controller, kept where transformers keeps callback state: `state()` goes into
    `trainer_state.json` at every checkpoint, and a resume restores it (`CheckpointHooks`)."""

    def __init__(self, spec: dict | str, beta1: float, beta2: float):
        self.spec, self.initial = spec, (beta1, beta2)
        self.controller = EntropyController(parse_controller(spec), beta1, beta2)

    def state(self) -> dict:
        args = {"spec": self.spec, "beta1": self.initial[0], "beta2": self.initial[1]}
        return {"args": args, "attributes": self.controller.state_dict()}

    def load_state_dict(self, state: dict) -> None:  # `CheckpointHooks` restores the run-state callbacks with it
        self.controller.load_state_dict(state)


class ResearchCEGPPOTrainer(CEGPPOTrainer):
    """`CEGPPOTrainer` with `ResearchCEGPPOConfig`'s options (module docstring); the same arguments otherwise."""

    def __init__(self, model, reward_funcs=None, args: CEGPPOConfig | None = None, *pargs, **kwargs):
        if isinstance(args, CEGPPOConfig) and not isinstance(args, ResearchCEGPPOConfig):
            args = ResearchCEGPPOConfig.from_grpo_config(args)
        super().__init__(
            model, reward_funcs, ResearchCEGPPOConfig.for_trainer(model, args, type(self)), *pargs, **kwargs
        )
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
            self._log_predictor(log_ratio, advantages, regions, weight, logps, entropies, mask)
        return weight

    def _log_predictor(self, log_ratio, advantages, regions, weight, logps, entropies, mask) -> None:
        coefficient = weight * side_bound(log_ratio, regions, self.epsilon_low, self.epsilon_high)
        sums = predictor_sums(log_ratio, advantages, mask, regions, coefficient, logps, entropies)
        gathered = self.accelerator.gather(torch.stack(list(sums.values()))).view(-1, len(sums)).sum(0).tolist()
        metrics = predictor_metrics(dict(zip(sums, gathered)))
        if "cegppo/predictor/entropy_change" in metrics:  # DDP averages the processes' gradients: so does the push
            metrics["cegppo/predictor/entropy_change"] /= self.accelerator.num_processes
        mode = "train" if self.model.training else "eval"
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
                self._metrics["train"]["cegppo/controller/target_low"].append(controller.config.target_low)
                self._metrics["train"]["cegppo/controller/target_high"].append(controller.config.target_high)
                if controller.last_entropy is not None:
                    self._metrics["train"]["cegppo/controller/entropy"].append(controller.last_entropy)
        return loss

    def cegppo_settings(self) -> dict[str, object]:
        settings = super().cegppo_settings()
        controller = self.entropy_controller
        if controller is not None:
            settings["entropy_controller"] = json.dumps(asdict(controller.config))
        if self.args.gppo_beta_rule != "paper":
            settings["gppo_beta_rule"] = self.args.gppo_beta_rule
        return settings
