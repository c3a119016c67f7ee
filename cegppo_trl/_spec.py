"""Number checks shared by the settings, the schedules and the loss."""

from __future__ import annotations

import math
from numbers import Real


def is_finite_number(x: object) -> bool:
    """A real, finite number that is not a bool (YAML's `yes` must not read as 1)."""
    return isinstance(x, Real) and not isinstance(x, bool) and math.isfinite(x)
