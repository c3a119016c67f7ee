"""Numbers in the one-line grammars (β schedules, the research layer's entropy controller) and in settings checks."""

from __future__ import annotations

import math
from numbers import Real

# Non-negative decimal / scientific number; signs are handled by each grammar, so '-0.5' gets a precise message.
NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"


class SpecError(Exception):
    """A malformed spec; each grammar's parser turns it into a ValueError carrying its syntax."""


def format_number(x: float) -> str:
    """The shortest text that reads back to the same float (`repr`); integers print without '.0'."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else repr(float(x))


def is_finite_number(x: object) -> bool:
    """A real, finite number that is not a bool (YAML's `yes` must not read as 1)."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)
