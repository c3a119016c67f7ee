"""A closed-loop controller that keeps the policy's mean token entropy inside a band by moving beta1 / beta2.

CE-GPPO scales the gradient of right-clipped tokens (A > 0) by beta2 and of left-clipped ones (A < 0) by beta1; the
paper reads beta2 as raising entropy and beta1 as lowering it, and adapts beta by hand (one switch at step 585 of 1000).
This controller is this package's own design, not the paper's. The loss uses ``clamp(nominal + offset, bounds)``: the
schedule gives the nominal betas (the user's plan, e.g. the paper's switch), the controller an additive offset (a
multiplicative one could not act while the nominal is 0).

Once per window of ``update_every`` optimizer steps, with ``H`` the window's mean entropy:

1. ``h = H`` on the first update, then ``h = ema * h + (1 - ema) * H``.
2. ``d = low - h`` below the band, ``high - h`` above it, else 0 (a deadband).
3. ``u = clip(sign(d) * step_size (or gain * d) - damping * (h - h_prev), -step_size, step_size)``; ``u > 0`` pushes
   entropy up: ``offset2 += u`` (modes beta2 / both), ``offset1 -= u`` (modes beta1 / both).
4. Anti-windup: before and after the step each offset is clamped so that ``nominal + offset`` stays in its bounds, so
   a saturated beta leaves its bound on the first step the other way. A coefficient the mode does not move is its
   nominal (its bounds do not apply).
5. Unless ``raise_beta1``, ``offset1 <= 0``: beta1 never exceeds its scheduled value. Raising beta1 is the paper's
   remedy for high entropy and the hazard of docs/entropy.md: in the second study entropy started just above the band,
   the symmetric rule raised beta1 from 0.5 to 0.6-0.75 and probe validity collapsed on 5/5 seeds.

Why damping: entropy integrates beta's effect, so a push alone (integral action) overshoots the band and oscillates;
the damping term (proportional action in incremental form) brakes before the band is crossed. On the toy entropy model
of docs/plot_schedules.py it keeps entropy in the band for 0.83 of the steps against 0.66 without it (a toy, no
evidence about real training: ``damping=0`` restores the pure deadband).

Plain Python: the trainer reduces the entropy across processes and feeds every process the same number.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from numbers import Real

__all__ = ["CONTROLLER_MODES", "EntropyController", "EntropyControllerConfig", "parse_controller"]

CONTROLLER_MODES = ("beta1", "beta2", "both")


@dataclass
class EntropyControllerConfig:
    """Settings of `EntropyController` (the module docstring gives the rule).

    Args:
        target_low: lower edge of the band (mean token entropy, nats), >= 0.
        target_high: upper edge, > target_low.
        step_size: largest change of each beta per update, > 0.
        mode: the coefficient(s) moved: "beta1", "beta2" or "both".
        beta1_min: lowest applied beta1, >= 0.
        beta1_max: highest applied beta1, >= beta1_min.
        beta2_min: lowest applied beta2, >= 0.
        beta2_max: highest applied beta2, >= beta2_min.
        gain: push by ``gain * distance`` (capped at step_size) instead of a full step; None: full steps.
        damping: moves the betas by ``damping * (h - h_prev)`` against entropy's change, >= 0 (0: pure deadband).
        ema: smoothing of the measured entropy, in [0, 1).
        update_every: optimizer steps per update (entropy averaged over them), >= 1.
        raise_beta1: allow beta1 above its nominal (scheduled) value.
    """

    target_low: float
    target_high: float
    step_size: float = 0.05
    mode: str = "both"
    beta1_min: float = 0.0
    beta1_max: float = 1.0
    beta2_min: float = 0.5
    beta2_max: float = 1.5
    gain: float | None = None
    damping: float = 1.0
    ema: float = 0.0
    update_every: int = 1
    raise_beta1: bool = False

    def __post_init__(self):
        f, lo, lo1, lo2 = _finite, self.target_low, self.beta1_min, self.beta2_min
        for name, ok, allowed in (
            ("target_low", f(lo) and lo >= 0, "a number >= 0"),
            ("target_high", f(self.target_high) and f(lo) and self.target_high > lo, "a number > target_low"),
            ("step_size", f(self.step_size) and self.step_size > 0, "a number > 0"),
            ("mode", self.mode in CONTROLLER_MODES, " | ".join(CONTROLLER_MODES)),
            ("beta1_min", f(lo1) and lo1 >= 0, "a number >= 0"),
            ("beta1_max", f(self.beta1_max) and f(lo1) and self.beta1_max >= lo1, "a number >= beta1_min"),
            ("beta2_min", f(lo2) and lo2 >= 0, "a number >= 0"),
            ("beta2_max", f(self.beta2_max) and f(lo2) and self.beta2_max >= lo2, "a number >= beta2_min"),
            ("gain", self.gain is None or (f(self.gain) and self.gain > 0), "None (full steps) or a number > 0"),
            ("damping", f(self.damping) and self.damping >= 0, "a number >= 0"),
            ("ema", f(self.ema) and 0 <= self.ema < 1, "a number in [0, 1)"),
            ("update_every", type(self.update_every) is int and self.update_every >= 1, "an integer >= 1"),
            ("raise_beta1", isinstance(self.raise_beta1, bool), "true or false"),
        ):
            if not ok:
                raise ValueError(f"`{name}` must be {allowed}, got {getattr(self, name)!r}.")


def parse_controller(spec: EntropyControllerConfig | Mapping | str | None) -> EntropyControllerConfig | None:
    """The controller's config from `EntropyControllerConfig`'s fields: a mapping (YAML), its JSON text (a flag, as
    transformers reads `lr_scheduler_kwargs`), a config, or None (no controller).

    Raises:
        ValueError: not JSON, an unknown field, a missing band or a value out of range.
    """
    if spec is None or isinstance(spec, EntropyControllerConfig):
        return spec
    if isinstance(spec, str):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as error:
            raise ValueError(f"entropy controller {spec!r} is not JSON: {error}") from None
    if not isinstance(spec, Mapping):
        raise ValueError(f"entropy controller: expected a mapping of EntropyControllerConfig's fields, got {spec!r}.")
    try:
        return EntropyControllerConfig(**spec)
    except TypeError as error:  # an unknown or missing field
        raise ValueError(f"entropy controller {dict(spec)}: {error}") from None


class EntropyController:
    """Moves beta1 / beta2 by bounded steps to keep the mean token entropy inside `config`'s band.

    Args:
        config: the band, step, bounds and mode.
        beta1: initial nominal beta1 (the schedule's value at step 0).
        beta2: initial nominal beta2.
    """

    def __init__(self, config: EntropyControllerConfig, beta1: float, beta2: float):
        if not isinstance(config, EntropyControllerConfig):
            raise TypeError(f"`config` must be an EntropyControllerConfig, got {type(config).__name__}.")
        self.config = config
        self._nominal = [_check_beta("beta1", beta1), _check_beta("beta2", beta2)]
        self._offset = [0.0, 0.0]
        self._smoothed = self._last = 0.0  # meaningful once num_updates > 0
        self.num_updates = 0
        self.last_direction = 0  # +1: the latest update pushed entropy up, -1 down, 0 neither
        self._window = [0.0, 0.0, 0]  # entropy sum, token count, optimizer steps since the last update

    @property
    def beta1(self) -> float:
        """The applied beta1: ``clamp(nominal + offset, beta1 bounds)``, the nominal with ``mode="beta2"``."""
        if self.config.mode == "beta2":
            return self._nominal[0]
        return _clamp(self._nominal[0] + self._offset[0], self.config.beta1_min, self.config.beta1_max)

    @property
    def beta2(self) -> float:
        """The applied beta2: ``clamp(nominal + offset, beta2 bounds)``, the nominal with ``mode="beta1"``."""
        if self.config.mode == "beta1":
            return self._nominal[1]
        return _clamp(self._nominal[1] + self._offset[1], self.config.beta2_min, self.config.beta2_max)

    @property
    def offsets(self) -> tuple[float, float]:
        return self._offset[0], self._offset[1]

    @property
    def last_entropy(self) -> float | None:
        """The entropy of the latest `update` (None before the first)."""
        return self._last if self.num_updates else None

    def apply(self, nominal_beta1: float, nominal_beta2: float) -> tuple[float, float]:
        """Records the step's nominal (scheduled) betas and returns the applied ones."""
        self._nominal = [_check_beta("nominal_beta1", nominal_beta1), _check_beta("nominal_beta2", nominal_beta2)]
        return self.beta1, self.beta2

    def update(self, entropy: float) -> tuple[float, float]:
        """One bounded step given the window's global mean token entropy (finite, >= 0); the new applied betas."""
        if not _finite(entropy) or entropy < 0:
            raise ValueError(f"`entropy` must be a finite number >= 0, got {entropy!r}.")
        cfg = self.config
        previous = self._smoothed if self.num_updates else float(entropy)
        h = float(entropy) if self.num_updates == 0 else cfg.ema * self._smoothed + (1 - cfg.ema) * entropy
        self._smoothed, self._last = h, float(entropy)
        self.num_updates += 1
        distance = cfg.target_low - h if h < cfg.target_low else cfg.target_high - h if h > cfg.target_high else 0.0
        if cfg.gain is None:
            push = math.copysign(cfg.step_size, distance) if distance else 0.0
        else:
            push = cfg.gain * distance
        u = _clamp(push - cfg.damping * (h - previous), -cfg.step_size, cfg.step_size)
        self.last_direction = (u > 0) - (u < 0)
        if u:
            self._clamp_offsets()
            if cfg.mode in ("beta1", "both"):
                self._offset[0] -= u
            if cfg.mode in ("beta2", "both"):
                self._offset[1] += u
            self._clamp_offsets()
        return self.beta1, self.beta2

    def observe(self, entropy_sum: float, token_count: float, *, step_end: bool) -> None:
        """Adds a micro-batch's global entropy sum and token count; every `update_every` optimizer steps, `update`s
        (a window without tokens measures nothing: no update)."""
        self._window[0] += entropy_sum
        self._window[1] += token_count
        if not step_end:
            return
        self._window[2] += 1
        if self._window[2] >= self.config.update_every:
            if self._window[1] > 0:
                self.update(self._window[0] / self._window[1])
            self._window = [0.0, 0.0, 0]

    def _clamp_offsets(self) -> None:
        cfg, (n1, n2) = self.config, self._nominal
        if cfg.mode in ("beta1", "both"):
            highest = cfg.beta1_max - n1 if cfg.raise_beta1 else min(cfg.beta1_max - n1, 0.0)
            self._offset[0] = _clamp(self._offset[0], cfg.beta1_min - n1, highest)
        if cfg.mode in ("beta2", "both"):
            self._offset[1] = _clamp(self._offset[1], cfg.beta2_min - n2, cfg.beta2_max - n2)

    def state_dict(self) -> dict[str, float | int]:
        """JSON-ready state; with the same config, `load_state_dict` restores identical behaviour."""
        return {
            "nominal_beta1": self._nominal[0], "nominal_beta2": self._nominal[1],
            "offset_beta1": self._offset[0], "offset_beta2": self._offset[1],
            "last_entropy": self._last, "smoothed_entropy": self._smoothed, "num_updates": self.num_updates,
            "last_direction": self.last_direction, "window_entropy_sum": self._window[0],
            "window_tokens": self._window[1], "window_steps": self._window[2],
        }  # fmt: skip

    def load_state_dict(self, state: Mapping[str, float | int]) -> None:
        """Restores `state_dict`'s output (the config comes from the run's args).

        Raises:
            ValueError: a key is missing or a value is not a finite number.
        """
        expected = self.state_dict().keys()
        if missing := sorted(set(expected) - set(state)):
            raise ValueError(f"controller state is missing {missing}; expected keys {sorted(expected)}.")
        if bad := [key for key in expected if not _finite(state[key])]:
            raise ValueError(f"controller state {bad} must be finite numbers, got {[state[k] for k in bad]}.")
        self._nominal = [float(state["nominal_beta1"]), float(state["nominal_beta2"])]
        self._offset = [float(state["offset_beta1"]), float(state["offset_beta2"])]
        self._last, self._smoothed = float(state["last_entropy"]), float(state["smoothed_entropy"])
        self.num_updates, self.last_direction = int(state["num_updates"]), int(state["last_direction"])
        self._window = [float(state["window_entropy_sum"]), float(state["window_tokens"]), int(state["window_steps"])]

    def __repr__(self) -> str:
        return f"EntropyController({asdict(self.config)}, beta1={self.beta1:g}, beta2={self.beta2:g})"


def _finite(x: object) -> bool:
    """A real, finite number that is not a bool (YAML's `yes` must not read as 1)."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _check_beta(name: str, value: float) -> float:
    if not _finite(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return float(value)
