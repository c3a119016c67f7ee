"""A closed-loop controller that keeps the policy's mean token entropy inside a band by moving beta1 / beta2.

Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
Reinforcement Learning", ACL 2026 (arXiv:2509.20712). For a softmax policy the entropy change of a policy-gradient
step is about ``-eta * Cov(log pi(a), pi(a) A(a))`` (Sec. 3): low-probability tokens with positive advantage raise
entropy, low-probability tokens with negative advantage lower it. CE-GPPO scales the gradient of the clipped ones by
``beta2`` (PA&LP, right clip) and ``beta1`` (NA&LP, left clip), so

* entropy **below** the band (collapsing): raise ``beta2`` and/or lower ``beta1``;
* entropy **above** the band (exploding): lower ``beta2`` and/or raise ``beta1`` (by default only back up to
  its scheduled value: see step 7 below);
* entropy inside the band: no push towards any set point (a deadband); only the damping term below acts, and only
  while entropy moves.

The paper adapts beta by hand (one switch at step 585 of 1000) and names automatic adaptation as future work; this
controller is this package's own design, not the paper's.

Composition with a schedule (``cegppo_trl.schedules``): the schedule gives the *nominal* betas of the current step,
the controller keeps an additive *offset* per coefficient, and the betas used by the loss are
``clamp(nominal + offset, min, max)`` (:meth:`EntropyController.apply`). The schedule is the user's plan (e.g. the
paper's explore -> exploit switch of ``beta1``); the offset corrects deviations around it. A controller that replaced
the schedule would erase that plan; one that scaled it multiplicatively could not act while the nominal is 0 (the
paper's ``beta1 = 0`` phase). With a constant schedule, the nominal is just the configured ``gppo_beta1/2``.

Update rule, once per window of ``update_every`` optimizer steps, given the window's global mean entropy ``H``:

1. ``h = H`` on the first update, then ``h = ema * h + (1 - ema) * H`` (``ema = 0``: no smoothing).
2. Distance outside the band, signed towards it: ``d = low - h`` if ``h < low``, ``high - h`` if ``h > high``,
   else ``0``.
3. Push: ``sign(d) * step_size`` (bang-bang), or ``gain * d`` when ``gain`` is set.
4. Damping: ``- damping * (h - h_prev)``, against the change of ``h`` since the previous update (0 on the first).
5. ``u = clip(push + damping term, -step_size, step_size)``; ``offset2 += u`` (modes ``beta2``/``both``),
   ``offset1 -= u`` (modes ``beta1``/``both``). ``u > 0`` pushes entropy up.
6. Anti-windup: before and after the step, each offset is clamped so ``nominal + offset`` stays inside its bounds
   (latest nominal). Without it a saturated beta would keep accumulating offset and need as many updates to come
   back; with it the first step in the other direction moves the applied beta off its bound.
7. Unless ``raise_beta1`` is set, ``offset1`` is also clamped to ``<= 0``: the applied beta1 never exceeds its
   nominal (scheduled) value. Above the band the controller then lowers beta2 (modes ``beta2``/``both``) and only
   takes back a reduction of beta1 it made earlier.

Why beta1 is not raised by default: raising beta1 is the direction the paper prescribes against high entropy, and it
is the hazard of docs/entropy-study.md's second study. There, entropy started just above the band (0.415 against
0.30-0.40), so the controller's first updates raised beta1 from 0.5 to 0.6-0.75 (and lowered beta2), and probe
validity collapsed on 5/5 seeds (0.19 -> 0.04) while entropy stayed in the band for 74% of the batches. A larger
beta1 pushes negative-advantage tokens further below the rollout policy; with several optimizer steps per rollout
batch that is what collapsed every beta1 > 0 arm. ``raise_beta1=true`` restores the symmetric rule.

A coefficient the mode does not move (``beta2`` under ``mode=beta1``, and vice versa) is the nominal itself: its
bounds do not apply to it. So an applied beta moves by at most ``step_size`` per update (for a fixed nominal) and a
moved one never leaves its bounds; with ``damping=0`` it does not move at all inside the band. The bounds of a moved
beta must contain its nominal values, or the clamp would replace the configured beta before anything was measured:
``CEGPPOConfig`` refuses such settings (this class itself still clamps a nominal outside them).

Why the damping term: entropy *integrates* the effect of beta (beta sets how fast entropy changes, not its level),
and the push alone is integral action, so push-only control of an integrating quantity keeps pushing until entropy
is back in the band, by which time it is moving fast and overshoots to the other side (a sustained oscillation).
The damping term is proportional action in incremental form (summed over updates it is ``-damping * (h - h_0)``),
which turns the loop into a PI controller and lets it slow entropy down before the band is crossed. On the toy
entropy model of ``docs/plot_schedules.py`` (which prints this), ``damping=1`` keeps entropy inside the band for 0.83
of the steps against 0.66 without it (4 noise seeds; the symmetric rule, ``raise_beta1``; 0.68 against 0.54 with the
default); two other parameter sets of that model and ``step_size=0.02``
gave 0.58-0.86 against 0.38-0.66. A toy model is no evidence about real training: the default (``1.0``) is a
starting point, and ``damping=0`` restores the pure deadband.

Everything is plain Python (no torch, no torch.distributed): the trainer reduces entropy across processes, calls
:meth:`EntropyController.update` with the same number on every process, and saves :meth:`state_dict` in checkpoints.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from numbers import Integral

from .._spec import NUMBER as _NUMBER
from .._spec import SpecError as _SpecError
from .._spec import format_number as _format_number
from .._spec import is_finite_number as _finite

__all__ = ["CONTROLLER_SYNTAX", "CONTROLLER_MODES", "EntropyController", "EntropyControllerConfig", "parse_controller"]

CONTROLLER_MODES = ("beta1", "beta2", "both")

CONTROLLER_SYNTAX = """\
Accepted entropy-controller forms: comma-separated KEY=VALUE pairs in one string (no spaces needed), a mapping
with the same keys (YAML), or none / off / an empty string (no controller). Ranges are LOW-HIGH or [LOW, HIGH].
  band=0.3-0.6     required: target band [low, high] of the mean token entropy, 0 <= low < high
  step=0.05        max change of each beta per update, > 0                     (default 0.05)
  mode=both        coefficient(s) moved: beta1 | beta2 | both                  (default both)
  beta1=0-1        bounds of the applied beta1, 0 <= min <= max               (default 0-1)
  beta2=0.5-1.5    bounds of the applied beta2, 0 <= min <= max               (default 0.5-1.5)
  gain=2           push gain * distance to band instead of a full step, > 0   (default: off, full steps)
  damping=1        move betas against entropy's change between updates, >= 0   (default 1; 0: pure deadband)
  ema=0.5          smoothing of the measured entropy, in [0, 1)               (default 0: none)
  every=10         optimizer steps per update (entropy averaged over them), >= 1 (default 1)
  raise_beta1=true allow beta1 above its nominal (scheduled) value: true | false (default false: never above)
The bounds of a moved beta must contain its configured value (every value of its schedule): CEGPPOConfig refuses
bounds that would replace it before the controller has measured anything.
Example: band=0.3-0.6,step=0.05,mode=both,beta1=0-1,beta2=0.5-2
YAML:    {band: [0.3, 0.6], step: 0.05, mode: both, beta1: [0, 1], beta2: [0.5, 2]}"""

_RANGE_RE = re.compile(rf"({_NUMBER})-({_NUMBER})")


@dataclass
class EntropyControllerConfig:
    """Settings of :class:`EntropyController` (see the module docstring for the update rule).

    Args:
        target_low: lower edge of the entropy band (mean token entropy, nats); below it entropy counts as collapsing.
        target_high: upper edge of the band, ``> target_low``; above it entropy counts as exploding.
        step_size: maximum change of each beta per update, ``> 0`` (e.g. 0.05).
        mode: which coefficient(s) the controller moves: ``"beta1"``, ``"beta2"`` or ``"both"``.
        beta1_min: lowest applied beta1, ``>= 0``.
        beta1_max: highest applied beta1, ``>= beta1_min``.
        beta2_min: lowest applied beta2, ``>= 0``.
        beta2_max: highest applied beta2, ``>= beta2_min``.
        gain: if set (``> 0``), outside the band push by ``gain * distance to the band`` (capped at ``step_size``)
            so small deviations get small corrections; ``None`` pushes by ``step_size`` every time.
        damping: each update also moves the betas by ``damping * (h - h_prev)`` against the change of the smoothed
            entropy, inside the band too (capped at ``step_size`` together with the push). It stops entropy
            overshooting the band; ``0`` gives a pure deadband (no change at all inside the band).
        ema: smoothing of the measured entropy, in ``[0, 1)``; the decision uses
            ``h = ema * h + (1 - ema) * entropy``. 0 uses the measurement as is.
        update_every: optimizer steps per controller update; the trainer averages entropy over these steps (more
            steps -> a less noisy measurement and time for the last change to show in the entropy).
        raise_beta1: allow the applied beta1 above its nominal (scheduled) value. ``False`` (default): the
            controller only lowers beta1 (below the band) and takes that back (above it), never raising it past the
            schedule, the hazardous direction of docs/entropy-study.md's second study (module docstring).
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
        for name in (
            "target_low",
            "target_high",
            "step_size",
            "beta1_min",
            "beta1_max",
            "beta2_min",
            "beta2_max",
            "damping",
            "ema",
        ):
            if not _finite(getattr(self, name)):
                raise ValueError(f"`{name}` must be a finite number, got {getattr(self, name)!r}.")
            setattr(self, name, float(getattr(self, name)))
        if self.target_low < 0:
            raise ValueError(f"`target_low` must be >= 0 (entropy is non-negative), got {self.target_low}.")
        if not self.target_high > self.target_low:
            raise ValueError(
                f"`target_high` must be > target_low = {self.target_low} (a band, not a point), "
                f"got {self.target_high}."
            )
        if not self.step_size > 0:
            raise ValueError(f"`step_size` must be > 0, got {self.step_size}.")
        if self.mode not in CONTROLLER_MODES:
            raise ValueError(f"`mode` must be one of {list(CONTROLLER_MODES)}, got {self.mode!r}.")
        for beta in ("beta1", "beta2"):
            lo, hi = getattr(self, f"{beta}_min"), getattr(self, f"{beta}_max")
            if lo < 0:
                raise ValueError(f"`{beta}_min` must be >= 0 (beta is non-negative), got {lo}.")
            if hi < lo:
                raise ValueError(f"`{beta}_max` must be >= {beta}_min = {lo}, got {hi}.")
        if self.gain is not None:
            if not _finite(self.gain) or self.gain <= 0:
                raise ValueError(f"`gain` must be None (off) or a finite number > 0, got {self.gain!r}.")
            self.gain = float(self.gain)
        if self.damping < 0:
            raise ValueError(f"`damping` must be >= 0 (0 disables it), got {self.damping}.")
        if not 0 <= self.ema < 1:
            raise ValueError(f"`ema` must be in [0, 1), got {self.ema}.")
        if isinstance(self.update_every, bool) or not isinstance(self.update_every, Integral) or self.update_every < 1:
            raise ValueError(f"`update_every` must be an integer >= 1, got {self.update_every!r}.")
        self.update_every = int(self.update_every)
        if not isinstance(self.raise_beta1, bool):
            raise ValueError(f"`raise_beta1` must be True or False, got {self.raise_beta1!r}.")

    @property
    def target(self) -> tuple[float, float]:
        """The band ``(target_low, target_high)``."""
        return self.target_low, self.target_high

    def to_spec(self) -> str:
        """The canonical one-line spec; ``parse_controller(config.to_spec()) == config``."""
        f = _format_number
        parts = [
            f"band={f(self.target_low)}-{f(self.target_high)}",
            f"step={f(self.step_size)}",
            f"mode={self.mode}",
            f"beta1={f(self.beta1_min)}-{f(self.beta1_max)}",
            f"beta2={f(self.beta2_min)}-{f(self.beta2_max)}",
        ]
        if self.gain is not None:
            parts.append(f"gain={f(self.gain)}")
        parts += [f"damping={f(self.damping)}", f"ema={f(self.ema)}", f"every={self.update_every}"]
        if self.raise_beta1:
            parts.append("raise_beta1=true")
        return ",".join(parts)


class EntropyController:
    """Moves beta1 / beta2 by bounded steps to keep the mean token entropy inside ``config``'s band.

    Usage in a trainer (one controller shared by all processes, fed the globally reduced entropy)::

        controller = EntropyController(config, beta1=args.gppo_beta1, beta2=args.gppo_beta2)
        for step in range(total_steps):
            beta1, beta2 = controller.apply(beta1_schedule(step, total_steps), beta2_schedule(step, total_steps))
            ...  # loss with beta1, beta2; accumulate the mean token entropy
            if (step + 1) % config.update_every == 0:
                controller.update(window_mean_entropy)  # takes effect from the next apply()

    Args:
        config: the band, step size, bounds and mode.
        beta1: initial nominal beta1 (the configured constant, or the schedule's value at step 0).
        beta2: initial nominal beta2.
    """

    def __init__(self, config: EntropyControllerConfig, beta1: float, beta2: float):
        if not isinstance(config, EntropyControllerConfig):
            raise TypeError(f"`config` must be an EntropyControllerConfig, got {type(config).__name__}.")
        self.config = config
        self._nominal = [_check_beta("beta1", beta1), _check_beta("beta2", beta2)]
        self._offset = [0.0, 0.0]
        self._smoothed = 0.0  # meaningful once num_updates > 0
        self._last = 0.0
        self._num_updates = 0
        self._last_direction = 0
        # The current window: global entropy sum, token count and optimizer steps since the last update.
        self._window = [0.0, 0.0, 0]

    # -- read-only views ------------------------------------------------------------------------------------------
    @property
    def beta1(self) -> float:
        """Applied beta1: ``clamp(nominal + offset, beta1_min, beta1_max)``; the nominal itself with ``mode=beta2``."""
        if self.config.mode == "beta2":  # a coefficient the controller does not move passes through untouched
            return self._nominal[0]
        return _clamp(self._nominal[0] + self._offset[0], self.config.beta1_min, self.config.beta1_max)

    @property
    def beta2(self) -> float:
        """Applied beta2: ``clamp(nominal + offset, beta2_min, beta2_max)``; the nominal itself with ``mode=beta1``."""
        if self.config.mode == "beta1":
            return self._nominal[1]
        return _clamp(self._nominal[1] + self._offset[1], self.config.beta2_min, self.config.beta2_max)

    @property
    def offsets(self) -> tuple[float, float]:
        """The controller's additive corrections ``(offset1, offset2)``."""
        return self._offset[0], self._offset[1]

    @property
    def nominal(self) -> tuple[float, float]:
        """The latest nominal ``(beta1, beta2)`` passed to :meth:`apply` (or ``__init__``)."""
        return self._nominal[0], self._nominal[1]

    @property
    def last_entropy(self) -> float | None:
        """The entropy passed to the latest :meth:`update` (``None`` before the first)."""
        return self._last if self._num_updates else None

    @property
    def smoothed_entropy(self) -> float | None:
        """The EMA-smoothed entropy the latest decision used (``None`` before the first update)."""
        return self._smoothed if self._num_updates else None

    @property
    def last_direction(self) -> int:
        """Latest action: ``+1`` pushed entropy up (beta2 up / beta1 down), ``-1`` down, ``0`` none."""
        return self._last_direction

    @property
    def num_updates(self) -> int:
        """Number of :meth:`update` calls so far."""
        return self._num_updates

    @property
    def target(self) -> tuple[float, float]:
        """The entropy band ``(low, high)``."""
        return self.config.target

    # -- control --------------------------------------------------------------------------------------------------
    def apply(self, nominal_beta1: float, nominal_beta2: float) -> tuple[float, float]:
        """Records this step's nominal betas (e.g. from schedules) and returns the betas the loss should use.

        Args:
            nominal_beta1: the schedule's beta1 at this step.
            nominal_beta2: the schedule's beta2 at this step.

        Returns:
            ``(clamp(nominal_beta1 + offset1, beta1 bounds), clamp(nominal_beta2 + offset2, beta2 bounds))``,
            where a coefficient the mode does not move is returned as its nominal.
        """
        self._nominal = [_check_beta("nominal_beta1", nominal_beta1), _check_beta("nominal_beta2", nominal_beta2)]
        return self.beta1, self.beta2

    def update(self, entropy: float) -> tuple[float, float]:
        """Takes one bounded step given the mean token entropy of the latest window.

        Args:
            entropy: the global (all-process) mean token entropy over the latest ``update_every`` optimizer steps.
                Must be finite and ``>= 0``; a trainer with no tokens in a window should skip the call.

        Returns:
            The new applied ``(beta1, beta2)`` for the latest nominal values.
        """
        if not _finite(entropy) or entropy < 0:
            raise ValueError(f"`entropy` must be a finite number >= 0, got {entropy!r}.")
        cfg = self.config
        entropy = float(entropy)
        previous = self._smoothed if self._num_updates else entropy
        h = entropy if self._num_updates == 0 else cfg.ema * self._smoothed + (1 - cfg.ema) * entropy
        self._smoothed, self._last = h, entropy
        self._num_updates += 1

        # Signed distance towards the band: > 0 when collapsing (push entropy up), < 0 when exploding.
        distance = cfg.target_low - h if h < cfg.target_low else cfg.target_high - h if h > cfg.target_high else 0.0
        if cfg.gain is None:
            push = math.copysign(cfg.step_size, distance) if distance else 0.0
        else:
            push = cfg.gain * distance
        # Proportional action on an integrating quantity: brake before the band is crossed (module docstring).
        u = _clamp(push - cfg.damping * (h - previous), -cfg.step_size, cfg.step_size)
        self._last_direction = (u > 0) - (u < 0)
        if u == 0:
            return self.beta1, self.beta2

        # Anti-windup, before and after the step: with nominal + offset inside the bounds, a saturated beta (or a
        # nominal outside them) leaves the bound on the first step in the other direction.
        self._clamp_offsets()
        # beta2 (PA&LP) raises entropy, beta1 (NA&LP) lowers it: move them in opposite directions.
        if cfg.mode in ("beta1", "both"):
            self._offset[0] -= u
        if cfg.mode in ("beta2", "both"):
            self._offset[1] += u
        self._clamp_offsets()
        return self.beta1, self.beta2

    def observe(self, entropy_sum: float, token_count: float, *, step_end: bool) -> None:
        """Feeds one micro-batch's entropy; every ``update_every`` optimizer steps, takes one :meth:`update`.

        Args:
            entropy_sum: sum of the token entropies of the micro-batch over all processes (the same number on every
                process, so every process takes the same decision).
            token_count: number of those tokens.
            step_end: True for the last micro-batch of an optimizer step (the trainer's ``sync_gradients``).
        """
        window = self._window
        window[0] += entropy_sum
        window[1] += token_count
        if not step_end:
            return
        window[2] += 1
        if window[2] >= self.config.update_every:
            if window[1] > 0:  # a window without completion tokens measures nothing; do not read it as collapse
                self.update(window[0] / window[1])  # effective from the next apply()
            self._window = [0.0, 0.0, 0]

    def _clamp_offsets(self) -> None:
        cfg, (n1, n2) = self.config, self._nominal
        if cfg.mode in ("beta1", "both"):  # the other coefficient's offset stays 0 (its bounds do not apply)
            highest = cfg.beta1_max - n1 if cfg.raise_beta1 else min(cfg.beta1_max - n1, 0.0)
            self._offset[0] = _clamp(self._offset[0], cfg.beta1_min - n1, highest)
        if cfg.mode in ("beta2", "both"):
            self._offset[1] = _clamp(self._offset[1], cfg.beta2_min - n2, cfg.beta2_max - n2)

    # -- checkpointing --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, float | int]:
        """JSON-serialisable state (floats and ints only); with the same config it restores identical behaviour."""
        return {
            "nominal_beta1": self._nominal[0],
            "nominal_beta2": self._nominal[1],
            "offset_beta1": self._offset[0],
            "offset_beta2": self._offset[1],
            "last_entropy": self._last,
            "smoothed_entropy": self._smoothed,
            "num_updates": self._num_updates,
            "last_direction": self._last_direction,
            "window_entropy_sum": self._window[0],
            "window_tokens": self._window[1],
            "window_steps": self._window[2],
        }

    def load_state_dict(self, state: Mapping[str, float | int]) -> None:
        """Restores :meth:`state_dict` output (the config is not part of the state; build it from the run's args).

        Raises:
            ValueError: a key is missing or a value is not a finite number.
        """
        expected = self.state_dict().keys()
        missing = sorted(set(expected) - set(state))
        if missing:
            raise ValueError(f"controller state is missing {missing}; expected keys {sorted(expected)}.")
        for key in expected:
            if not _finite(state[key]):
                raise ValueError(f"controller state `{key}` must be a finite number, got {state[key]!r}.")
        self._nominal = [float(state["nominal_beta1"]), float(state["nominal_beta2"])]
        self._offset = [float(state["offset_beta1"]), float(state["offset_beta2"])]
        self._last = float(state["last_entropy"])
        self._smoothed = float(state["smoothed_entropy"])
        self._num_updates = int(state["num_updates"])
        self._last_direction = int(state["last_direction"])
        self._window = [float(state["window_entropy_sum"]), float(state["window_tokens"]), int(state["window_steps"])]

    def __repr__(self) -> str:
        return (
            f"EntropyController({self.config.to_spec()!r}, beta1={self.beta1:g}, beta2={self.beta2:g}, "
            f"offsets=({self._offset[0]:g}, {self._offset[1]:g}))"
        )


def _clamp(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _check_beta(name: str, value: float) -> float:
    if not _finite(value) or value < 0:
        raise ValueError(f"`{name}` must be a finite number >= 0, got {value!r}.")
    return float(value)


# -- parsing ------------------------------------------------------------------------------------------------------
# Spec keys -> config fields; ranges fill two fields.
_RANGE_KEYS = {
    "band": ("target_low", "target_high"),
    "beta1": ("beta1_min", "beta1_max"),
    "beta2": ("beta2_min", "beta2_max"),
}
_SCALAR_KEYS = {
    "step": "step_size",
    "mode": "mode",
    "gain": "gain",
    "damping": "damping",
    "ema": "ema",
    "every": "update_every",
    "raise_beta1": "raise_beta1",
}
_FIELD_NAMES = {f.name for f in fields(EntropyControllerConfig)}


def _parse_number(text: object, key: str) -> float:
    if _finite(text):
        return float(text)
    if isinstance(text, str):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if math.isfinite(value):
            return value
    raise _SpecError(f"{key}={text!r} is not a finite number")


def _parse_bool(value: object, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "yes", "on", "1"):
        return True
    if text in ("false", "no", "off", "0"):
        return False
    raise _SpecError(f"{key}={value!r} must be true or false")


def _parse_range(value: object, key: str) -> tuple[float, float]:
    if isinstance(value, str):
        match = _RANGE_RE.fullmatch(value)
        if not match:
            raise _SpecError(f"{key}={value!r} must be a range LOW-HIGH of non-negative numbers, e.g. {key}=0.3-0.6")
        return float(match.group(1)), float(match.group(2))
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return _parse_number(value[0], key), _parse_number(value[1], key)
    raise _SpecError(f"{key}={value!r} must be a range: 'LOW-HIGH' or [LOW, HIGH]")


def _to_kwargs(items: list[tuple[str, object]]) -> dict[str, object]:
    kwargs: dict[str, object] = {}
    for key, value in items:
        key = key.strip().lower() if isinstance(key, str) else key
        if key in _RANGE_KEYS:
            targets = dict(zip(_RANGE_KEYS[key], _parse_range(value, key)))
        elif key in _SCALAR_KEYS or key in _FIELD_NAMES:
            name = _SCALAR_KEYS.get(key, key)
            if name == "mode":
                targets = {name: str(value).strip().lower()}
            elif name == "gain" and (value is None or str(value).strip().lower() in ("none", "off", "")):
                targets = {name: None}
            elif name == "raise_beta1":
                targets = {name: _parse_bool(value, key)}
            elif name == "update_every":
                number = _parse_number(value, key)
                if not number.is_integer():
                    raise _SpecError(f"{key}={value!r} must be an integer")
                targets = {name: int(number)}
            else:
                targets = {name: _parse_number(value, key)}
        else:
            known = ", ".join([*_RANGE_KEYS, *_SCALAR_KEYS])
            raise _SpecError(f"unknown key {key!r} (known: {known})")
        for name in targets:
            if name in kwargs:
                raise _SpecError(f"{name!r} is given twice")
        kwargs.update(targets)
    if "target_low" not in kwargs or "target_high" not in kwargs:
        raise _SpecError("the target band is required, e.g. band=0.3-0.6")
    return kwargs


def parse_controller(
    spec: str | Mapping[str, object] | EntropyControllerConfig | None,
) -> EntropyControllerConfig | None:
    """Reads an entropy-controller spec (see ``CONTROLLER_SYNTAX``); ``None`` means no controller.

    Args:
        spec: ``"band=0.3-0.6,step=0.05,mode=both,beta1=0-1,beta2=0.5-2"``; a mapping with the same keys (ranges as
            ``[low, high]`` or ``"low-high"``; config field names such as ``target_low`` are accepted too); an
            :class:`EntropyControllerConfig` (returned unchanged); or ``None`` / ``""`` / ``"none"`` / ``"off"``.

    Returns:
        The config, or ``None`` when the controller is disabled.

    Raises:
        ValueError: malformed spec or a value out of range. The message names the problem and lists the accepted
            forms.
    """
    if spec is None or isinstance(spec, EntropyControllerConfig):
        return spec
    try:
        if isinstance(spec, str):
            text = "".join(spec.split())
            if text.lower() in ("", "none", "off"):
                return None
            items = []
            for pair in text.split(","):
                key, eq, value = pair.partition("=")
                if not eq or not key:
                    raise _SpecError(f"{pair!r} is not KEY=VALUE")
                items.append((key, value))
        elif isinstance(spec, Mapping):
            items = list(spec.items())
        else:
            raise _SpecError(f"expected a string or a mapping, got {type(spec).__name__}")
        return EntropyControllerConfig(**_to_kwargs(items))
    except (_SpecError, ValueError) as err:
        problem = str(err).rstrip(".")
        raise ValueError(f"Invalid entropy controller {spec!r}: {problem}.\n{CONTROLLER_SYNTAX}") from None
