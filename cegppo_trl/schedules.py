"""Schedules for the CE-GPPO coefficients ``beta1`` / ``beta2``, written as one-line strings.

Reference: Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
Reinforcement Learning", ACL 2026 (arXiv:2509.20712). ``beta1`` scales the gradient of negative-advantage tokens
clipped on the left (larger -> entropy falls faster), ``beta2`` that of positive-advantage tokens clipped on the
right (larger -> entropy falls slower). The paper's only schedule switches ``(beta1, beta2)`` from ``(0, 1)`` to
``(0.5, 1)`` at step 585 of 1000 (explore early, exploit late): ``piecewise:0@0,0.5@585`` for ``beta1``.

A schedule is a pure function ``schedule(step, total_steps) -> float`` of the optimizer step, so the only state a
checkpoint needs is the step itself. Every schedule prints as a canonical spec (``str(schedule)``) that
``parse_schedule`` reads back to an equal schedule; the spec is what config files and the command line carry.

Syntax (whitespace is ignored, kind names are case-insensitive; see ``SCHEDULE_SYNTAX``)::

    0.5 | constant:0.5              constant
    linear:0->0.5                   0 at step 0 -> 0.5 at step total_steps
    linear:0->0.5@100-600           hold 0 until step 100, ramp, hold 0.5 from step 600 on
    cosine:1->0.5@10%-60%           half-cosine ramp; window in percent of total_steps
    exp:1->0.1                      geometric ramp (both values > 0)
    piecewise:0@0,0.5@585           0 from step 0, 0.5 from step 585 on (the paper's switch)
    warmup:0->0.5@50                linear ramp over the first 50 steps, then hold 0.5

Conventions (those of ``transformers``' learning-rate schedulers): steps count from 0, ``N%`` means
``N / 100 * total_steps`` (kept as an exact fraction, so ``58.5%`` of 1000 is exactly step 585), and a ramp reaches
its end value at the window's end, which by default is ``total_steps`` (one step after the last optimizer step).
Step boundaries are absolute: a step past ``total_steps`` is valid and holds the end value.
"""

from __future__ import annotations

import bisect
import math
import re
from dataclasses import dataclass
from decimal import Decimal, localcontext
from fractions import Fraction
from numbers import Integral, Real
from typing import ClassVar

from ._spec import NUMBER_RE as _NUMBER_RE
from ._spec import SpecError as _SpecError
from ._spec import format_number as _format_number

__all__ = [
    "SCHEDULE_SYNTAX",
    "ConstantSchedule",
    "CosineSchedule",
    "ExpSchedule",
    "LinearSchedule",
    "PiecewiseSchedule",
    "Schedule",
    "StepPoint",
    "WarmupSchedule",
    "parse_schedule",
]

SCHEDULE_SYNTAX = """\
Accepted schedule forms (one string, no spaces needed; steps are optimizer steps counted from 0,
N% is N percent of total_steps; all values must be finite and >= 0):
  0.5  or  constant:0.5          constant value
  linear:0->0.5                  linear from 0 at step 0 to 0.5 at step total_steps
  linear:0->0.5@100-600          hold 0 until step 100, linear to 0.5 at step 600, hold 0.5 after
  linear:0->0.5@10%-60%          same, window in percent of total_steps (steps and % may be mixed)
  cosine:1->0.5  cosine:1->0.5@100-600     half-cosine ramp, same windows
  exp:1->0.1  exp:1->0.1@10%-90%           geometric ramp (both values > 0), same windows
  piecewise:0@0,0.5@585          0 from step 0, 0.5 from step 585 on (the CE-GPPO paper's switch);
                                 boundaries increasing, first one 0 (may be omitted: piecewise:0,0.5@58.5%)
  warmup:0->0.5@50  warmup:0.5@5%          linear from 0 over the first 50 steps (5%), then hold 0.5
On a shell command line, quote the spec ('linear:0->0.5'): an unquoted '>' redirects output."""

_POINT = r"\d+(?:\.\d+)?%?"
_POINT_RE = re.compile(rf"({_POINT})")
_WINDOW_RE = re.compile(rf"({_POINT})-({_POINT})")


def _parse_value(text: str, what: str) -> float:
    if text[:1] in "+-" and _NUMBER_RE.fullmatch(text[1:]):
        if float(text) < 0:
            raise _SpecError(f"{what} {text!r} is negative; beta must be >= 0")
        text = text[1:]
    if not _NUMBER_RE.fullmatch(text):
        raise _SpecError(f"{what} {text!r} is not a number" if text else f"{what} is missing")
    value = float(text)
    if not math.isfinite(value):
        raise _SpecError(f"{what} {text!r} is not finite")
    return value


def _check_value(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, Real):
        raise _SpecError(f"{what} must be a number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise _SpecError(f"{what} must be finite and >= 0, got {value!r}")
    return value


@dataclass(frozen=True)
class StepPoint:
    """A position in training: an absolute optimizer step, or a percentage of ``total_steps``.

    Attributes:
        value: the step (an integer) or the percentage (an exact fraction in ``[0, 100]``).
        percent: whether ``value`` is a percentage.
    """

    value: Fraction
    percent: bool = False

    @classmethod
    def parse(cls, text: str) -> StepPoint:
        """Reads ``"585"`` (a step) or ``"58.5%"`` (a percentage of ``total_steps``)."""
        if not _POINT_RE.fullmatch(text):
            raise _SpecError(f"position {text!r} is neither a step (e.g. 585) nor a percentage (e.g. 58.5%)")
        if Fraction(text.rstrip("%")) == 0:
            return _ZERO  # step 0 and 0% are the same position; one canonical form
        if text.endswith("%"):
            value = Fraction(text[:-1])  # exact: '58.5%' of 1000 steps is step 585, not 584.999...
            if value > 100:
                raise _SpecError(f"percentage {text!r} is above 100%")
            return cls(value, percent=True)
        if "." in text:
            raise _SpecError(f"step {text!r} is not an integer (write a percentage as e.g. 58.5%)")
        return cls(Fraction(int(text)))

    def resolve(self, total_steps: int) -> Fraction:
        """The position as an (exact, possibly fractional) step for a run of ``total_steps`` steps."""
        return self.value * total_steps / 100 if self.percent else self.value

    def __str__(self) -> str:
        if not self.percent:
            return str(self.value.numerator)
        with localcontext() as ctx:
            ctx.prec = 60  # parsed from a finite decimal, so the quotient is exact at this precision
            text = format((Decimal(self.value.numerator) / Decimal(self.value.denominator)).normalize(), "f")
        return text + "%"


_ZERO = StepPoint(Fraction(0))
_HUNDRED_PERCENT = StepPoint(Fraction(100), percent=True)


def _check_step(step: int, total_steps: int) -> None:
    if isinstance(step, bool) or not isinstance(step, Integral):
        raise TypeError(f"`step` must be an integer, got {type(step).__name__}")
    if isinstance(total_steps, bool) or not isinstance(total_steps, Integral):
        raise TypeError(f"`total_steps` must be an integer, got {type(total_steps).__name__}")
    if step < 0:
        raise ValueError(f"`step` must be >= 0, got {step}")
    if total_steps < 1:
        raise ValueError(f"`total_steps` must be >= 1, got {total_steps}")


class Schedule:
    """Base class: a pure, deterministic map ``(step, total_steps) -> beta``.

    Subclasses are frozen dataclasses (picklable, comparable with ``==``); ``str(schedule)`` is the canonical spec
    and ``parse_schedule(str(schedule)) == schedule``.
    """

    kind: ClassVar[str]

    def __call__(self, step: int, total_steps: int) -> float:
        """The value at optimizer ``step`` (``>= 0``, counted from 0) of a run of ``total_steps`` (``>= 1``) steps.

        Raises:
            ValueError: ``step < 0``, ``total_steps < 1``, or a window/boundaries that mix steps and percentages
                resolve to an empty window / a non-increasing order for this ``total_steps``.
        """
        _check_step(step, total_steps)
        return float(self._value(step, total_steps))

    def check(self, total_steps: int, field: str | None = None) -> None:
        """Raises ValueError now if the schedule cannot be evaluated for a run of ``total_steps`` steps.

        Only schedules that mix steps and percentages can fail (e.g. ``linear:0->1@600-50%`` with 1000 steps); a
        trainer calls this once before training so the error does not surface mid-run.

        Args:
            total_steps: the run length.
            field: the config field the schedule came from (``gppo_beta1_schedule``), named in the error.
        """
        try:
            self(0, total_steps)
        except ValueError as error:
            if field is None:
                raise
            raise ValueError(f"`{field}`: {error}") from None

    def _value(self, step: int, total_steps: int) -> float:
        raise NotImplementedError

    @property
    def initial(self) -> float:
        """The value at step 0, which no run length changes: the value before the run length is known."""
        raise NotImplementedError

    @property
    def value_range(self) -> tuple[float, float]:
        """``(smallest, largest)`` value the schedule takes over any run (ramps are monotone from start to end)."""
        raise NotImplementedError

    def spec(self) -> str:
        """The canonical spec string."""
        raise NotImplementedError

    def __str__(self) -> str:
        return self.spec()

    def __repr__(self) -> str:
        return f"parse_schedule({self.spec()!r})"


@dataclass(frozen=True, repr=False)
class ConstantSchedule(Schedule):
    """``constant:V`` (or just ``V``): the same value at every step."""

    value: float
    kind: ClassVar[str] = "constant"

    def _value(self, step: int, total_steps: int) -> float:
        return self.value

    @property
    def initial(self) -> float:
        return self.value

    @property
    def value_range(self) -> tuple[float, float]:
        return self.value, self.value

    def spec(self) -> str:
        return f"constant:{_format_number(self.value)}"


@dataclass(frozen=True, repr=False)
class _RampSchedule(Schedule):
    """``kind:START->END[@FROM-TO]``: ``start`` before ``FROM``, a ramp, ``end`` from ``TO`` on.

    Without a window the ramp spans ``0`` to ``total_steps``.
    """

    start: float
    end: float
    window_start: StepPoint = _ZERO
    window_end: StepPoint = _HUNDRED_PERCENT

    def _shape(self, t: float) -> float:
        """Value at fraction ``0 < t < 1`` of the window."""
        raise NotImplementedError

    def _value(self, step: int, total_steps: int) -> float:
        lo, hi = self.window_start.resolve(total_steps), self.window_end.resolve(total_steps)
        if hi <= lo:  # only reachable when steps and percentages are mixed; parse rejects the rest
            raise ValueError(
                f"schedule {self.spec()!r}: window {self.window_start}-{self.window_end} is empty for "
                f"total_steps={total_steps} (it resolves to steps {float(lo):g}-{float(hi):g}). Write both ends in "
                "steps or both in percentages, or move the end after the start for this run length."
            )
        # The ends are returned exactly (exp's pow would otherwise give end * (1 + 1e-16)).
        if step <= lo:
            return self.start
        if step >= hi:
            return self.end
        return self._shape(float((step - lo) / (hi - lo)))

    @property
    def initial(self) -> float:
        return self.start  # a window starts at step >= 0, so step 0 is never past its start

    @property
    def value_range(self) -> tuple[float, float]:
        return min(self.start, self.end), max(self.start, self.end)

    def spec(self) -> str:
        text = f"{self.kind}:{_format_number(self.start)}->{_format_number(self.end)}"
        if (self.window_start, self.window_end) != (_ZERO, _HUNDRED_PERCENT):
            text += f"@{self.window_start}-{self.window_end}"
        return text


@dataclass(frozen=True, repr=False)
class LinearSchedule(_RampSchedule):
    """``linear:START->END[@FROM-TO]``: straight line from ``start`` to ``end`` over the window."""

    kind: ClassVar[str] = "linear"

    def _shape(self, t: float) -> float:
        return self.start + (self.end - self.start) * t


@dataclass(frozen=True, repr=False)
class CosineSchedule(_RampSchedule):
    """``cosine:START->END[@FROM-TO]``: half-cosine from ``start`` to ``end`` (flat at both ends of the window)."""

    kind: ClassVar[str] = "cosine"

    def _shape(self, t: float) -> float:
        return self.end + (self.start - self.end) * 0.5 * (1.0 + math.cos(math.pi * t))


@dataclass(frozen=True, repr=False)
class ExpSchedule(_RampSchedule):
    """``exp:START->END[@FROM-TO]``: geometric interpolation ``start * (end / start) ** t``; both values ``> 0``.

    Equal ratios in equal steps: the natural ramp for a coefficient spanning orders of magnitude (e.g. 1 -> 0.01).
    """

    kind: ClassVar[str] = "exp"

    def _shape(self, t: float) -> float:
        return self.start * (self.end / self.start) ** t


@dataclass(frozen=True, repr=False)
class WarmupSchedule(Schedule):
    """``warmup:START->END@LENGTH`` (``START`` defaults to 0): linear ramp over the first ``LENGTH`` steps, then hold.

    Same values as ``linear:START->END@0-LENGTH``; kept as its own kind because it reads as what it is.
    """

    start: float
    end: float
    length: StepPoint
    kind: ClassVar[str] = "warmup"

    def _value(self, step: int, total_steps: int) -> float:
        return LinearSchedule(self.start, self.end, _ZERO, self.length)._value(step, total_steps)

    @property
    def initial(self) -> float:
        return self.start

    @property
    def value_range(self) -> tuple[float, float]:
        return min(self.start, self.end), max(self.start, self.end)

    def spec(self) -> str:
        return f"warmup:{_format_number(self.start)}->{_format_number(self.end)}@{self.length}"


@dataclass(frozen=True, repr=False)
class PiecewiseSchedule(Schedule):
    """``piecewise:V0@0,V1@B1,...``: value ``V_i`` from boundary ``B_i`` on (until the next boundary).

    Boundaries are steps or percentages, strictly increasing, and the first is 0. The CE-GPPO paper's switch is
    ``piecewise:0@0,0.5@585`` for ``beta1``.
    """

    values: tuple[float, ...]
    boundaries: tuple[StepPoint, ...]
    kind: ClassVar[str] = "piecewise"

    def _value(self, step: int, total_steps: int) -> float:
        resolved = [b.resolve(total_steps) for b in self.boundaries]
        if any(b <= a for a, b in zip(resolved, resolved[1:])):  # only when steps and percentages are mixed
            raise ValueError(
                f"schedule {self.spec()!r}: boundaries are not increasing for total_steps={total_steps} "
                f"(they resolve to steps {', '.join(f'{float(b):g}' for b in resolved)}). Write every boundary in "
                "steps or every one in percentages, or reorder them for this run length."
            )
        # Last boundary <= step; resolved[0] == 0 <= step, so the index is never -1.
        return self.values[bisect.bisect_right(resolved, step) - 1]

    @property
    def initial(self) -> float:
        return self.values[0]  # the first boundary is 0

    @property
    def value_range(self) -> tuple[float, float]:
        return min(self.values), max(self.values)

    def spec(self) -> str:
        pieces = [f"{_format_number(v)}@{b}" for v, b in zip(self.values, self.boundaries)]
        return "piecewise:" + ",".join(pieces)


def _parse_ramp_values(body: str, kind: str) -> tuple[float, float]:
    parts = body.split("->")
    if len(parts) != 2:
        hint = " (an unquoted '->' on a shell command line loses its '>')" if body.endswith("-") else ""
        raise _SpecError(f"{kind} needs START->END, got {body!r}{hint}")
    return _parse_value(parts[0], f"{kind} start value"), _parse_value(parts[1], f"{kind} end value")


def _parse_window(text: str, kind: str) -> tuple[StepPoint, StepPoint]:
    match = _WINDOW_RE.fullmatch(text)
    if not match:
        raise _SpecError(f"{kind} window {text!r} must be FROM-TO in steps or percentages, e.g. 100-600 or 10%-60%")
    lo, hi = StepPoint.parse(match.group(1)), StepPoint.parse(match.group(2))
    if hi.value == 0 or (lo.percent == hi.percent and hi.value <= lo.value):
        raise _SpecError(f"{kind} window {text!r} is empty: its end must come after its start")
    return lo, hi


_RAMPS: dict[str, type[_RampSchedule]] = {cls.kind: cls for cls in (LinearSchedule, CosineSchedule, ExpSchedule)}


def _parse_text(text: str) -> Schedule:
    if ":" not in text:
        if not _NUMBER_RE.fullmatch(text.lstrip("+-")):
            raise _SpecError(f"{text!r} is neither a number nor KIND:..., with KIND a known schedule kind")
        return ConstantSchedule(_parse_value(text, "constant value"))
    kind, _, body = text.partition(":")
    kind = kind.lower()
    if kind == "constant":
        return ConstantSchedule(_parse_value(body, "constant value"))
    if kind in _RAMPS:
        values, at, window = body.partition("@")
        start, end = _parse_ramp_values(values, kind)
        if kind == "exp" and (start <= 0 or end <= 0):
            raise _SpecError(f"exp interpolates geometrically, so both values must be > 0, got {start:g} and {end:g}")
        if at:
            return _RAMPS[kind](start, end, *_parse_window(window, kind))
        return _RAMPS[kind](start, end)
    if kind == "warmup":
        values, at, length = body.partition("@")
        if not at:
            raise _SpecError(f"warmup needs a length, e.g. warmup:0->0.5@50, got {body!r}")
        if "->" in values or values.endswith("-"):
            start, end = _parse_ramp_values(values, kind)
        else:
            start, end = 0.0, _parse_value(values, "warmup end value")
        point = StepPoint.parse(length)
        if point.value == 0:
            raise _SpecError(f"warmup length {length!r} must be > 0")
        return WarmupSchedule(start, end, point)
    if kind == "piecewise":
        values, boundaries = [], []
        for i, piece in enumerate(body.split(",")):
            value, at, boundary = piece.partition("@")
            values.append(_parse_value(value, f"piecewise value #{i + 1}"))
            if not at and i > 0:
                raise _SpecError(f"piecewise piece {piece!r} needs a boundary VALUE@STEP (only the first may omit it)")
            boundaries.append(StepPoint.parse(boundary) if at else _ZERO)
        if boundaries[0].value != 0:
            raise _SpecError(f"the first piecewise boundary must be 0 (the value at step 0), got {boundaries[0]}")
        for a, b in zip(boundaries, boundaries[1:]):
            if b.value == 0 or (a.percent == b.percent and b.value <= a.value):
                raise _SpecError(f"piecewise boundaries must increase, got {a} then {b}")
        return PiecewiseSchedule(tuple(values), tuple(boundaries))
    known = ", ".join(["constant", *_RAMPS, "piecewise", "warmup"])
    raise _SpecError(f"unknown schedule kind {kind!r} (known: {known})")


def parse_schedule(spec: str | float | int | Schedule) -> Schedule:
    """Reads a one-line schedule spec (see ``SCHEDULE_SYNTAX``) into a :class:`Schedule`.

    Args:
        spec: a spec string such as ``"piecewise:0@0,0.5@585"``, a number (a constant, as YAML parses ``0.5``), or
            a :class:`Schedule` (returned unchanged).

    Returns:
        The schedule; ``str()`` of it is the canonical spec and parses back to an equal schedule.

    Raises:
        ValueError: the spec is malformed or a value is negative / not finite. The message names the problem and
            lists the accepted forms with examples.

    Example:
        >>> beta1 = parse_schedule("piecewise:0@0,0.5@585")  # CE-GPPO paper, Sec. 5: explore, then exploit
        >>> beta1(584, 1000), beta1(585, 1000)
        (0.0, 0.5)
    """
    if isinstance(spec, Schedule):
        return spec
    try:
        if isinstance(spec, str):
            text = "".join(spec.split())  # 'linear: 0 -> 0.5' reads like 'linear:0->0.5'
            if not text:
                raise _SpecError("the spec is empty")
            return _parse_text(text)
        return ConstantSchedule(_check_value(spec, "a numeric schedule"))
    except _SpecError as err:
        raise ValueError(f"Invalid beta schedule {spec!r}: {err}.\n{SCHEDULE_SYNTAX}") from None
