"""Schedules of ``beta1`` / ``beta2``: pure functions ``schedule(step, total_steps) -> float`` of the optimizer step, as
transformers' learning-rate schedulers are, so a checkpoint holds no schedule state. Config files and the command line
carry a string (``SCHEDULE_SYNTAX``; the paper's switch, Sec. 5, is ``piecewise:0@0,0.5@585``); from Python any
``Callable[[int, int], float]`` works too::

    trainer.beta1_schedule = parse_schedule(lambda step, total: 0.5 * min(1.0, step / (0.1 * total)))
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import pairwise
from numbers import Integral, Real

from ._spec import SpecError, format_number, is_finite_number

__all__ = ["SCHEDULE_SYNTAX", "FunctionSchedule", "Schedule", "parse_schedule"]

SCHEDULE_SYNTAX = """\
Accepted schedule forms (steps are optimizer steps counted from 0, N% is N percent of total_steps; values must be
finite and >= 0):
  0.5  or  constant:0.5          constant value
  linear:0->0.5                  linear from 0 at step 0 to 0.5 at step total_steps
  linear:0->0.5@100-600          hold 0 until step 100, linear to 0.5 at step 600, hold 0.5 after
  linear:0->0.5@10%-60%          the same with the window in percent of total_steps (steps and % may be mixed)
  piecewise:0@0,0.5@585          0 from step 0, 0.5 from step 585 on (the CE-GPPO paper's switch); boundaries
                                 increasing, the first one 0 (it may be omitted: piecewise:0,0.5@58.5%)
Any other shape: a Python callable fn(step, total_steps) -> float (`python -m pydoc cegppo_trl.schedules`).
On a shell command line, quote the spec ('linear:0->0.5'): an unquoted '>' redirects output."""

_REMOVED = {"warmup": "warmup:A->B@N is linear:A->B@0-N", "cosine": "use a callable", "exp": "use a callable"}
Point = tuple[Fraction, bool]  # a step, or (when True) a percentage of total_steps
_ZERO: Point = (Fraction(0), False)


def _value(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SpecError(f"{what} {text!r} is not a number" if text else f"{what} is missing") from None
    if not math.isfinite(value) or value < 0:
        raise SpecError(f"{what} {text!r} must be finite and >= 0")
    return value


def _points(texts: list[str], what: str) -> tuple[Point, ...]:
    """Steps (``585``) or percentages (``58.5%``, an exact fraction: 58.5% of 1000 steps is step 585), increasing."""
    points = []
    for text in texts:
        match = re.fullmatch(r"(\d+(?:\.\d+)?)(%?)", text, re.ASCII)
        if not match or (not match[2] and "." in text) or (match[2] and Fraction(match[1]) > 100):
            raise SpecError(f"{what} {text!r} must be a step (an integer, e.g. 585) or a percentage <= 100 (58.5%)")
        points.append((Fraction(match[1]), bool(match[2]) and Fraction(match[1]) != 0))  # 0% is step 0
    for (a, b), (text_a, text_b) in zip(pairwise(points), pairwise(texts)):
        if b[0] == 0 or (a[1] == b[1] and b[0] <= a[0]):  # mixed steps and % are checked against the run length
            raise SpecError(f"{what} must increase, got {text_a} then {text_b}")
    return tuple(points)


def _check_step(step: int, total_steps: int) -> None:
    for name, value, low in (("step", step, 0), ("total_steps", total_steps, 1)):
        if isinstance(value, bool) or not isinstance(value, Integral) or value < low:
            raise ValueError(f"`{name}` must be an integer >= {low}, got {value!r}")


class _Checked:
    def check(self, total_steps: int, field: str | None = None) -> None:
        """Raise ValueError, naming `field` (e.g. ``gppo_beta1_schedule``), if the schedule fails for a run of
        `total_steps` steps: the trainer calls it before the first step, so that a run does not fail mid-way."""
        try:
            self._check(total_steps)
        except ValueError as error:
            raise ValueError(f"`{field}`: {error}" if field else str(error)) from None


@dataclass(frozen=True)
class Schedule(_Checked):
    """A parsed string: ``linear`` ramps from ``values[0]`` to ``values[1]`` over the window ``points``; ``constant``
    and ``piecewise`` hold ``values[i]`` from ``points[i]`` on. ``str()`` is the spec without whitespace."""

    kind: str
    values: tuple[float, ...]
    points: tuple[Point, ...]
    spec: str = field(compare=False)

    def __call__(self, step: int, total_steps: int) -> float:
        _check_step(step, total_steps)
        steps = [value * total_steps / 100 if percent else value for value, percent in self.points]
        if any(b <= a for a, b in pairwise(steps)):  # only when steps and percentages are mixed
            what = "window resolves" if self.kind == "linear" else "boundaries resolve"
            raise ValueError(
                f"schedule {self.spec!r}: its {what} to steps {', '.join(f'{float(s):g}' for s in steps)}, empty for "
                f"total_steps={total_steps}. Write them both in steps or both in percentages, or move them apart for "
                "this run length."
            )
        if self.kind != "linear":
            return self.values[bisect.bisect_right(steps, step) - 1]  # steps[0] == 0 <= step
        (lo, hi), (start, end) = steps, self.values
        if step <= lo or step >= hi:  # the ends exactly, not start + (end - start) * 1.0
            return start if step <= lo else end
        return start + (end - start) * float((step - lo) / (hi - lo))

    def _check(self, total_steps: int) -> None:
        self(0, total_steps)  # only the positions can fail, and they fail at every step alike

    @property
    def initial(self) -> float:
        """The value at step 0, which no run length changes (read before the run length is known)."""
        return self.values[0]

    @property
    def value_range(self) -> tuple[float, float]:
        """The smallest and largest value the schedule takes in any run."""
        return min(self.values), max(self.values)

    def __str__(self) -> str:
        return self.spec


@dataclass(frozen=True)
class FunctionSchedule(_Checked):
    """A Python callable ``fn(step, total_steps) -> float``; every value it returns is checked (finite, ``>= 0``)."""

    fn: Callable[[int, int], float]

    def __call__(self, step: int, total_steps: int) -> float:
        _check_step(step, total_steps)
        value = self.fn(step, total_steps)
        if not is_finite_number(value) or value < 0:
            raise ValueError(f"beta schedule {self} returned {value!r} at step {step} of {total_steps}, not >= 0")
        return float(value)

    def _check(self, total_steps: int) -> None:  # every step: a Python call each, ~0.1 s for 10**5 steps
        if [self(step, total_steps) for step in range(total_steps)][0] != self.initial:
            raise ValueError(
                f"beta schedule {self} gives {self(0, total_steps):g} at step 0 of {total_steps} steps but "
                f"{self.initial:g} at step 0 of 1 step: the trainer reads step 0 before it knows the run length"
            )

    @property
    def initial(self) -> float:
        """The value at step 0, read as ``fn(0, 1)``; `check` verifies it for the real run length."""
        return self(0, 1)

    def __str__(self) -> str:
        return f"python:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"


def _parse(text: str) -> Schedule:
    kind, colon, body = text.partition(":")
    kind, body = (kind.lower(), body) if colon else ("constant", text)
    if kind == "constant":
        value = _value(body, "constant value")
        return Schedule(kind, (value,), (_ZERO,), f"constant:{format_number(value)}")
    if kind == "linear":
        values, at, window = body.partition("@")
        if values.count("->") != 1:
            hint = " (an unquoted '->' on a shell command line loses its '>')" if values.endswith("-") else ""
            raise SpecError(f"linear needs START->END, got {values!r}{hint}")
        if at and window.count("-") != 1:
            raise SpecError(f"linear window {window!r} must be FROM-TO in steps or percentages, e.g. 100-600, 10%-60%")
        points = _points(window.split("-"), "linear window") if at else (_ZERO, (Fraction(100), True))
        ramp = tuple(_value(end, f"linear {name} value") for end, name in zip(values.split("->"), ("start", "end")))
        return Schedule(kind, ramp, points, f"linear:{body}")
    if kind == "piecewise":
        pieces = [piece.partition("@") for piece in body.split(",")]
        if any(not at for _, at, _ in pieces[1:]):
            raise SpecError("every piece but the first needs its boundary, VALUE@STEP")
        points = _points([point or "0" for _, _, point in pieces], "piecewise boundaries")
        if points[0] != _ZERO:
            raise SpecError(f"the first piecewise boundary must be 0 (the value at step 0), got {pieces[0][2]}")
        values = tuple(_value(value, f"piecewise value #{i + 1}") for i, (value, _, _) in enumerate(pieces))
        return Schedule(kind, values, points, f"piecewise:{body}")
    removed = f"; {kind} was removed in cegppo-trl 0.5.0: {_REMOVED[kind]}" if kind in _REMOVED else ""
    raise SpecError(f"unknown schedule kind {kind!r} (known: constant, linear, piecewise){removed}")


def parse_schedule(spec: str | float | Callable[[int, int], float]) -> Schedule | FunctionSchedule:
    """A schedule from a spec string (``SCHEDULE_SYNTAX``), a number (a constant, as YAML reads ``0.5``) or a callable
    ``fn(step, total_steps) -> float``; a schedule is returned unchanged.

    Raises:
        ValueError: a malformed spec or a negative / non-finite value, naming the problem and the accepted forms.

    Example:
        >>> beta1 = parse_schedule("piecewise:0@0,0.5@585")  # CE-GPPO paper, Sec. 5: explore, then exploit
        >>> beta1(584, 1000), beta1(585, 1000)
        (0.0, 0.5)
    """
    if isinstance(spec, (Schedule, FunctionSchedule)):
        return spec
    if callable(spec):
        return FunctionSchedule(spec)
    try:
        if isinstance(spec, bool) or not isinstance(spec, (str, Real)):
            raise SpecError(f"expected a string, a number or a callable, got {type(spec).__name__}")
        text = "".join(str(spec).split())  # 'linear: 0 -> 0.5' reads like 'linear:0->0.5'
        if not text:
            raise SpecError("the spec is empty")
        return _parse(text)
    except SpecError as error:
        raise ValueError(f"Invalid beta schedule {spec!r}: {error}.\n{SCHEDULE_SYNTAX}") from None
