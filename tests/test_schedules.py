"""Beta schedules (`cegppo_trl.schedules`): values hand-computed per kind, windows, round trips, malformed specs."""

from __future__ import annotations

import math
import pickle

import pytest

from cegppo_trl.schedules import (
    SCHEDULE_SYNTAX,
    ConstantSchedule,
    CosineSchedule,
    ExpSchedule,
    LinearSchedule,
    PiecewiseSchedule,
    Schedule,
    WarmupSchedule,
    parse_schedule,
)

TOTAL = 1000


def values(spec: str, steps, total: int = TOTAL) -> list[float]:
    schedule = parse_schedule(spec)
    return [schedule(s, total) for s in steps]


# ---------------------------------------------------------------------------------------------------------------
# The paper's schedule
# ---------------------------------------------------------------------------------------------------------------
def test_paper_switch_is_zero_before_step_585_and_half_from_it_on():
    # CE-GPPO paper, Sec. 5: (beta1, beta2) = (0, 1) until step 585 of 1000, then (0.5, 1).
    beta1 = parse_schedule("piecewise:0@0,0.5@585")
    assert beta1(584, 1000) == 0
    assert beta1(585, 1000) == 0.5
    assert beta1(0, 1000) == 0 and beta1(999, 1000) == 0.5 and beta1(5000, 1000) == 0.5


def test_paper_switch_in_percent_lands_exactly_on_step_585():
    # 58.5% of 1000 is kept as an exact fraction: no 584.999... that would switch one step early.
    beta1 = parse_schedule("piecewise:0,0.5@58.5%")
    assert (beta1(584, 1000), beta1(585, 1000)) == (0.0, 0.5)
    # with 2000 steps the same spec switches at 1170
    assert (beta1(1169, 2000), beta1(1170, 2000)) == (0.0, 0.5)


# ---------------------------------------------------------------------------------------------------------------
# Values of each kind
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["0.5", "constant:0.5", " constant : 0.5 ", "CONSTANT:0.5", "5e-1", 0.5])
def test_constant_is_the_same_at_every_step(spec):
    assert values(spec, [0, 1, 500, 999, 1000, 10**6]) == [0.5] * 6


def test_integer_spec_is_a_constant():
    assert parse_schedule(1) == ConstantSchedule(1.0) and parse_schedule(0)(3, 10) == 0.0


def test_linear_without_window_spans_step_0_to_total_steps():
    # value = 0.5 * step / 1000: 0 at step 0, 0.25 at 500, 0.4995 at the last step 999, 0.5 at 1000 and beyond
    assert values("linear:0->0.5", [0, 1, 500, 999, 1000, 1500]) == pytest.approx(
        [0.0, 0.0005, 0.25, 0.4995, 0.5, 0.5], abs=1e-15
    )


def test_linear_decreasing():
    assert values("linear:1->0.5", [0, 250, 1000]) == pytest.approx([1.0, 0.875, 0.5])


def test_linear_step_window_holds_start_before_and_end_after():
    # window 100-600: 0 up to step 100, then 0.5 * (step - 100) / 500, then 0.5 from step 600 on
    got = values("linear:0->0.5@100-600", [0, 99, 100, 101, 350, 599, 600, 999, 2000])
    assert got == pytest.approx([0, 0, 0, 0.001, 0.25, 0.499, 0.5, 0.5, 0.5], abs=1e-15)


def test_linear_percent_window_resolves_against_total_steps():
    # 10%-60% of 1000 = 100-600 (same values as the step window); of 200 steps = 20-120
    assert values("linear:0->0.5@10%-60%", [0, 100, 350, 600, 999]) == pytest.approx([0, 0, 0.25, 0.5, 0.5])
    assert values("linear:0->0.5@10%-60%", [20, 70, 120], total=200) == pytest.approx([0, 0.25, 0.5])


def test_percent_window_with_fractional_resolution():
    # 10%-60% of 15 steps = 1.5-9: step 1 is before the window, step 5 at (5 - 1.5) / 7.5 of it
    assert values("linear:0->1@10%-60%", [1, 5, 9], total=15) == pytest.approx([0, 3.5 / 7.5, 1])


def test_window_may_mix_steps_and_percent():
    # from step 100 to the end of training
    assert values("linear:0->1@100-100%", [100, 550, 1000]) == pytest.approx([0, 0.5, 1])


def test_mixed_window_that_is_empty_for_this_run_raises_at_check():
    schedule = parse_schedule("linear:0->1@600-50%")  # fine for 2000 steps (600-1000), empty for 1000 (600-500)
    schedule.check(2000)
    assert schedule(800, 2000) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="empty for total_steps=1000"):
        schedule.check(1000)


def test_piecewise_mixing_steps_and_percent_is_checked_against_total_steps():
    schedule = parse_schedule("piecewise:0,1@600,2@50%")  # 600 < 50% only for runs longer than 1200 steps
    assert [schedule(s, 2000) for s in (599, 600, 999, 1000)] == [0, 1, 1, 2]
    with pytest.raises(ValueError, match="not increasing for total_steps=1000"):
        schedule.check(1000)


def test_cosine_is_half_cosine_between_the_endpoints():
    # end + (start - end) * (1 + cos(pi t)) / 2 with start 1, end 0.5: t=0.25 -> 0.5 + 0.25 * (1 + sqrt(2)/2)
    got = values("cosine:1->0.5", [0, 250, 500, 750, 1000])
    assert got == pytest.approx([1.0, 0.5 + 0.25 * (1 + math.sqrt(0.5)), 0.75, 0.5 + 0.25 * (1 - math.sqrt(0.5)), 0.5])


def test_cosine_window():
    assert values("cosine:0->1@200-400", [0, 200, 300, 400, 999]) == pytest.approx([0, 0, 0.5, 1, 1])


def test_exp_is_geometric_interpolation():
    # 1 * (0.1 / 1) ** t: equal ratios in equal steps -> 10**-0.5 at the midpoint
    got = values("exp:1->0.1", [0, 500, 1000, 1200])
    assert got == pytest.approx([1.0, 10**-0.5, 0.1, 0.1])
    assert got[2] == 0.1  # the end value is exact, not 0.1 * (1 + 1e-16)


def test_exp_percent_window():
    assert values("exp:0.01->1@50%-100%", [0, 500, 750, 1000]) == pytest.approx([0.01, 0.01, 0.1, 1])


def test_piecewise_several_pieces():
    got = values("piecewise:1@0,0.5@100,0.25@200", [0, 99, 100, 199, 200, 999, 1000, 3000])
    assert got == [1, 1, 0.5, 0.5, 0.25, 0.25, 0.25, 0.25]


def test_piecewise_single_piece_is_constant():
    assert values("piecewise:0.3", [0, 10, 999]) == [0.3] * 3


def test_warmup_ramps_then_holds():
    assert values("warmup:0->0.5@50", [0, 25, 49, 50, 999]) == pytest.approx([0, 0.25, 0.49, 0.5, 0.5])
    # start defaults to 0; 5% of 1000 = 50 steps
    assert parse_schedule("warmup:0.5@5%") == parse_schedule("warmup:0->0.5@5%")
    assert values("warmup:0.5@5%", [25, 50]) == pytest.approx([0.25, 0.5])


def test_warmup_equals_linear_over_the_same_window():
    steps = range(0, 1001, 7)
    assert values("warmup:0.2->0.8@300", steps) == values("linear:0.2->0.8@0-300", steps)


def test_parse_returns_the_expected_classes():
    assert isinstance(parse_schedule("linear:0->1"), LinearSchedule)
    assert isinstance(parse_schedule("cosine:0->1"), CosineSchedule)
    assert isinstance(parse_schedule("exp:1->2"), ExpSchedule)
    assert isinstance(parse_schedule("piecewise:0,1@5"), PiecewiseSchedule)
    assert isinstance(parse_schedule("warmup:1@5"), WarmupSchedule)
    schedule = parse_schedule("0.5")
    assert parse_schedule(schedule) is schedule


# ---------------------------------------------------------------------------------------------------------------
# Step / total validation
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("step, total", [(-1, 10), (0, 0), (5, -3)])
def test_negative_step_or_total_below_one_raises(step, total):
    with pytest.raises(ValueError):
        parse_schedule("linear:0->1")(step, total)


def test_non_integer_step_raises_type_error():
    with pytest.raises(TypeError):
        parse_schedule("0.5")(1.5, 10)


def test_total_steps_of_one_ramps_over_a_single_step():
    assert values("linear:0->1", [0, 1], total=1) == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# Canonical spec, round trips, pickling
# ---------------------------------------------------------------------------------------------------------------
ROUND_TRIP = [
    ("0.5", "constant:0.5"),
    ("constant:2", "constant:2"),
    ("linear:0->0.5", "linear:0->0.5"),
    ("linear: 0.0 -> 0.50 @ 100 - 600", "linear:0->0.5@100-600"),
    ("linear:0->0.5@10%-60%", "linear:0->0.5@10%-60%"),
    ("linear:0->0.5@0%-100%", "linear:0->0.5"),  # the default window prints as no window
    ("cosine:1.0->0.5@0%-12.125%", "cosine:1->0.5@0-12.125%"),
    ("exp:1e-3->0.1", "exp:0.001->0.1"),
    ("exp:1e-7->1", "exp:1e-07->1"),
    ("piecewise:0@0,0.5@585", "piecewise:0@0,0.5@585"),
    ("piecewise:0,0.5@58.5%", "piecewise:0@0,0.5@58.5%"),
    ("piecewise:0@0%,1@50%", "piecewise:0@0,1@50%"),
    ("warmup:0->0.5@50", "warmup:0->0.5@50"),
    ("warmup:0.5@5%", "warmup:0->0.5@5%"),
    ("linear:0.1->0.30000000000000004", "linear:0.1->0.30000000000000004"),
]


@pytest.mark.parametrize("spec, canonical", ROUND_TRIP)
def test_str_is_canonical_and_round_trips(spec, canonical):
    schedule = parse_schedule(spec)
    assert str(schedule) == canonical
    again = parse_schedule(str(schedule))
    assert again == schedule and str(again) == canonical
    assert [again(s, 997) for s in range(0, 1200, 13)] == [schedule(s, 997) for s in range(0, 1200, 13)]
    assert repr(schedule) == f"parse_schedule({canonical!r})"


@pytest.mark.parametrize("spec", [canonical for _, canonical in ROUND_TRIP])
def test_schedules_pickle(spec):
    schedule = parse_schedule(spec)
    clone = pickle.loads(pickle.dumps(schedule))
    assert clone == schedule and clone(123, 1000) == schedule(123, 1000)


def test_different_kinds_with_same_fields_are_not_equal():
    assert parse_schedule("linear:0->1") != parse_schedule("cosine:0->1")


# ---------------------------------------------------------------------------------------------------------------
# Malformed specs
# ---------------------------------------------------------------------------------------------------------------
MALFORMED = {
    "": "empty",
    "   ": "empty",
    "abc": "neither a number",
    "-0.5": "negative",
    "nan": "neither a number",
    "inf": "neither a number",
    "1e999": "not finite",
    "constant:": "missing",
    "constant:-1": "negative",
    "linear:0": "START->END",
    "linear:0-": "shell",  # what bash leaves of an unquoted linear:0->0.5
    "linear:0->": "missing",
    "linear:0->0.5->1": "START->END",
    "linear:0->x": "not a number",
    "linear:0->-0.5": "negative",
    "linear:0->0.5@100": "FROM-TO",
    "linear:0->0.5@600-100": "empty",
    "linear:0->0.5@100-100": "empty",
    "linear:0->0.5@10.5-20": "not an integer",
    "linear:0->0.5@10%-120%": "above 100%",
    "linear:0->0.5@-10-20": "FROM-TO",
    "cosine:1->0.5@a-b": "FROM-TO",
    "exp:0->1": "> 0",
    "exp:1->0": "> 0",
    "piecewise:": "missing",
    "piecewise:0@10,1@20": "first piecewise boundary must be 0",
    "piecewise:0@0,1": "needs a boundary",
    "piecewise:0@0,1@20,2@10": "must increase",
    "piecewise:0@0,1@20,2@20": "must increase",
    "piecewise:0,1@0%": "must increase",
    "piecewise:0@0,1@2x": "neither a step",
    "warmup:0->1": "needs a length",
    "warmup:1@0": "> 0",
    "warmup:1@0%": "> 0",
    "foo:1": "unknown schedule kind",
    "step:0@0,1@5": "unknown schedule kind",
}


@pytest.mark.parametrize("spec, problem", MALFORMED.items())
def test_malformed_spec_names_the_problem_and_lists_accepted_forms(spec, problem):
    with pytest.raises(ValueError) as info:
        parse_schedule(spec)
    message = str(info.value)
    assert problem in message
    assert repr(spec) in message
    assert SCHEDULE_SYNTAX in message
    for example in (
        "constant:0.5",
        "linear:0->0.5@100-600",
        "linear:0->0.5@10%-60%",
        "cosine:",
        "exp:",
        "piecewise:0@0,0.5@585",
        "warmup:0->0.5@50",
    ):
        assert example in message


@pytest.mark.parametrize("spec", [-1, float("nan"), float("inf"), True, None, [0.5]])
def test_malformed_non_string_spec_raises_value_error(spec):
    with pytest.raises(ValueError, match="Accepted schedule forms"):
        parse_schedule(spec)


def test_base_class_is_abstract():
    with pytest.raises(NotImplementedError):
        Schedule()(0, 1)


@pytest.mark.parametrize(
    "spec",
    [
        "0.5",
        "linear:0.2->1@5-50%",
        "cosine:1->0.5@10%-60%",
        "exp:1->0.1",
        "warmup:0.1->0.5@50",
        "piecewise:0@0,0.5@585",
    ],
)
def test_initial_is_the_step_0_value_for_every_run_length(spec):
    # Before training the run length is unknown; the step-0 value must not depend on it, and reading it must not
    # resolve a window against a made-up length ('5-50%' is empty for a run of 1 to 10 steps).
    schedule = parse_schedule(spec)
    for total in (20, 1000, 12345):
        assert schedule.initial == schedule(0, total)


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("0.5", (0.5, 0.5)),
        ("linear:1->0.5", (0.5, 1.0)),
        ("cosine:0->0.5@10%-90%", (0.0, 0.5)),
        ("exp:1.5->1.0", (1.0, 1.5)),
        ("warmup:0.2->0.5@50", (0.2, 0.5)),
        ("piecewise:0.5@0,0@100,0.75@50%", (0.0, 0.75)),
    ],
)
def test_value_range_bounds_every_value_the_schedule_takes(spec, expected):
    schedule = parse_schedule(spec)
    assert schedule.value_range == expected
    values = [schedule(step, 1000) for step in range(0, 1000, 7)]
    assert expected[0] <= min(values) and max(values) <= expected[1]
