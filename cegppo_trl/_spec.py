"""Number parsing and printing for the entropy controller's one-line grammar (`controller`) and the config's messages."""

from __future__ import annotations

import math
import re
from numbers import Real

# Non-negative decimal / scientific number; signs are handled by each grammar, so '-0.5' gets a precise message.
NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
NUMBER_RE = re.compile(NUMBER)


class SpecError(Exception):
    """Problem found while parsing a spec; each grammar's parser turns it into a ValueError carrying its syntax."""


def format_number(x: float) -> str:
    """The shortest text that reads back to the same float (`repr`); integers print without '.0'."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else repr(float(x))


def is_finite_number(x: object) -> bool:
    """A real, finite number that is not a bool (YAML's `yes` must not read as 1)."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)
