"""Schedules of ``beta1`` / ``beta2``: pure functions ``schedule(step, total_steps) -> float`` of the optimizer step, as
transformers' learning-rate schedulers are, so a checkpoint holds no schedule state: a string (``SCHEDULE_SYNTAX``) in
config files and on the command line, or from Python any ``Callable[[int, int], float]`` (docs/schedules.md).
"""

from __future__ import annotations

import bisect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import pairwise
from numbers import Real

from .loss import is_finite_number

__all__ = ["SCHEDULE_SYNTAX", "FunctionSchedule", "Schedule", "parse_schedule"]

SCHEDULE_SYNTAX = """\
Accepted schedule forms (optimizer steps from 0, or N% of total_steps; values finite and >= 0): 0.5 or constant:0.5;
linear:0->0.5 (over the run), linear:0->0.5@100-600 or linear:0->0.5@10%-60% (hold, ramp, hold);
piecewise:0@0,0.5@585 (the paper's switch: boundaries increasing from 0, all steps or all percentages);
any other shape: a callable fn(step, total_steps) -> float. Quote specs on a shell: an unquoted '>' redirects."""

_REMOVED = {"warmup": "warmup:A->B@N is linear:A->B@0-N", "cosine": "use a callable", "exp": "use a callable"}


def _value(text: str, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what} {text!r} is not a number" if text else f"{what} is missing") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{what} {text!r} must be finite and >= 0")
    return value


def _points(texts: list[str], what: str) -> tuple[tuple[float, ...], bool]:
    """Increasing steps (``585``) or percentages (``58.5%``), and whether they are percentages (0 is either)."""
    points, percent = [], set()
    for text in texts:
        match = re.fullmatch(r"(\d+)|(\d+(?:\.\d+)?)%", text, re.ASCII)
        if not match or (match[2] and float(match[2]) > 100):
            raise ValueError(f"{what} {text!r} must be a step (an integer, e.g. 585) or a percentage <= 100 (58.5%)")
        points.append(float(match[1] or match[2]))
        percent |= {bool(match[2])} if points[-1] else set()
    if len(percent) > 1:
        raise ValueError(f"{what} {', '.join(texts)} mixes steps and percentages: write all in one or the other")
    for (a, b), (text_a, text_b) in zip(pairwise(points), pairwise(texts)):
        if b <= a:
            raise ValueError(f"{what} must increase, got {text_a} then {text_b}")
    return tuple(points), percent == {True}


@dataclass(frozen=True)
class Schedule:
    """A parsed string: ``linear`` ramps from ``values[0]`` to ``values[1]`` over the window ``points``; ``constant``
    and ``piecewise`` hold ``values[i]`` from ``points[i]`` on. ``str()`` is the spec without whitespace."""

    kind: str
    values: tuple[float, ...]
    points: tuple[float, ...]
    percent: bool  # the points are percentages of total_steps
    spec: str = field(compare=False)

    def __call__(self, step: int, total_steps: int) -> float:
        # rounded, so that 1.1% of 3000 steps is step 33, not 33.00000000000001 (a step late)
        steps = [round(p * total_steps / 100, 9) for p in self.points] if self.percent else self.points
        if self.kind != "linear":
            return self.values[bisect.bisect_right(steps, step) - 1]  # steps[0] == 0 <= step
        (lo, hi), (start, end) = steps, self.values
        if step <= lo or step >= hi:  # the ends exactly, not start + (end - start) * 1.0
            return start if step <= lo else end
        return start + (end - start) * (step - lo) / (hi - lo)

    def check(self, total_steps: int, field: str | None = None) -> None:
        """Nothing to check: a parsed string is valid at every step of every run length."""

    @property
    def initial(self) -> float:  # the value at step 0 of every run length
        return self.values[0]

    @property
    def value_range(self) -> tuple[float, float]:  # the smallest and largest value of any run
        return min(self.values), max(self.values)

    def __str__(self) -> str:
        return self.spec


@dataclass(frozen=True)
class FunctionSchedule:
    """A Python callable ``fn(step, total_steps) -> float``; every value it returns is checked (finite, ``>= 0``)."""

    fn: Callable[[int, int], float]

    def __call__(self, step: int, total_steps: int) -> float:
        value = self.fn(step, total_steps)
        if not is_finite_number(value) or value < 0:
            raise ValueError(f"beta schedule {self} returned {value!r} at step {step} of {total_steps}, not >= 0")
        return float(value)

    def check(self, total_steps: int, field: str | None = None) -> None:
        """Raise ValueError, naming `field`, unless every step of a `total_steps` run gives a valid value, step 0 the
        `initial` one: the trainer calls it before the first step, so that a run does not fail mid-way."""
        try:  # every step: a Python call each, ~0.1 s for 10**5 steps
            if [self(step, total_steps) for step in range(total_steps)][0] != self.initial:
                raise ValueError(
                    f"beta schedule {self} gives {self(0, total_steps):g} at step 0 of {total_steps} steps but "
                    f"{self.initial:g} at step 0 of 1 step: the trainer reads step 0 before it knows the run length"
                )
        except ValueError as error:
            raise ValueError(f"`{field}`: {error}" if field else str(error)) from None

    @property
    def initial(self) -> float:  # `check` verifies it for the real run length
        return self(0, 1)

    def __str__(self) -> str:
        return f"python:{getattr(self.fn, '__module__', '?')}.{getattr(self.fn, '__qualname__', repr(self.fn))}"


def _parse(text: str) -> Schedule:
    kind, colon, body = text.partition(":")
    kind, body = (kind.lower(), body) if colon else ("constant", text)
    spec = f"{kind}:{body}"
    if kind == "constant":
        return Schedule(kind, (_value(body, "constant value"),), (0.0,), False, spec)
    if kind == "linear":
        values, at, window = body.partition("@")
        if values.count("->") != 1:
            hint = " (an unquoted '->' on a shell command line loses its '>')" if values.endswith("-") else ""
            raise ValueError(f"linear needs START->END, got {values!r}{hint}")
        if at and window.count("-") != 1:
            raise ValueError(f"linear window {window!r} must be FROM-TO in steps or percentages, e.g. 10%-60%")
        points, percent = _points(window.split("-"), "linear window") if at else ((0.0, 100.0), True)
        ramp = tuple(_value(end, f"linear {name} value") for end, name in zip(values.split("->"), ("start", "end")))
        return Schedule(kind, ramp, points, percent, spec)
    if kind == "piecewise":
        pieces = [piece.partition("@") for piece in body.split(",")]
        if any(not at for _, at, _ in pieces[1:]):
            raise ValueError("every piece but the first needs its boundary, VALUE@STEP")
        points, percent = _points([point or "0" for _, _, point in pieces], "piecewise boundaries")
        if points[0] != 0:
            raise ValueError(f"the first piecewise boundary must be 0 (the value at step 0), got {pieces[0][2]}")
        values = tuple(_value(value, f"piecewise value #{i + 1}") for i, (value, _, _) in enumerate(pieces))
        return Schedule(kind, values, points, percent, spec)
    removed = f"; {kind} was removed in cegppo-trl 0.5.0: {_REMOVED[kind]}" if kind in _REMOVED else ""
    raise ValueError(f"unknown schedule kind {kind!r} (known: constant, linear, piecewise){removed}")


def parse_schedule(spec: str | float | Callable[[int, int], float]) -> Schedule | FunctionSchedule:
    """A schedule from a spec string (``SCHEDULE_SYNTAX``), a number (a constant, as YAML reads ``0.5``) or a callable
    ``fn(step, total_steps) -> float``; a schedule is returned unchanged.

    Raises:
        ValueError: a malformed spec or a negative / non-finite value, naming the problem and the accepted forms.
    """
    if isinstance(spec, (Schedule, FunctionSchedule)):
        return spec
    if callable(spec):
        return FunctionSchedule(spec)
    try:
        if isinstance(spec, bool) or not isinstance(spec, (str, Real)):
            raise ValueError(f"expected a string, a number or a callable, got {type(spec).__name__}")
        text = "".join(str(spec).split())  # 'linear: 0 -> 0.5' reads like 'linear:0->0.5'
        if not text:
            raise ValueError("the spec is empty")
        return _parse(text)
    except ValueError as error:
        raise ValueError(f"Invalid beta schedule {spec!r}: {error}.\n{SCHEDULE_SYNTAX}") from None
