"""β schedules (`cegppo_trl.schedules`): each accepted form and each refusal, with values worked out by hand."""

from __future__ import annotations

import math
import pickle

import pytest

from cegppo_trl.schedules import SCHEDULE_SYNTAX, FunctionSchedule, Schedule, parse_schedule


def values(spec, steps, total: int = 1000) -> list[float]:
    schedule = parse_schedule(spec)
    return [schedule(s, total) for s in steps]


# ---------------------------------------------------------------------------------------------------------------
# The paper's switch, in steps and in percent
# ---------------------------------------------------------------------------------------------------------------
def test_paper_switch_is_zero_before_step_585_and_half_from_it_on():
    # CE-GPPO paper, Sec. 5: beta1 = 0 until step 585 of 1000, then 0.5; later steps hold the last value
    assert values("piecewise:0@0,0.5@585", [0, 584, 585, 999, 5000]) == [0, 0, 0.5, 0.5, 0.5]


def test_percent_boundaries_resolve_to_the_intended_step():
    # 58.5% of 1000 = 585 and of 2000 = 1170 (the switch recipe's spec scales with max_steps)
    assert values("piecewise:0,0.5@58.5%", [584, 585]) == [0, 0.5]
    assert values("piecewise:0,0.5@58.5%", [1169, 1170], total=2000) == [0, 0.5]
    # 1.1% of 3000 is 33, but 1.1 * 3000 / 100 in floats is 33.00000000000001, which would switch a step late (rounded)
    assert 1.1 * 3000 / 100 > 33 and values("piecewise:0,1@1.1%", [32, 33], total=3000) == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# constant
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["0.5", "constant:0.5", " constant : 0.5 ", "CONSTANT:0.5", 0.5])
def test_constant_is_the_same_at_every_step_and_prints_as_constant(spec):
    assert values(spec, [0, 1, 999, 1000, 10**6]) == [0.5] * 5
    assert str(parse_schedule(spec)) == "constant:0.5"


def test_numbers_print_as_written():
    assert str(parse_schedule(1)) == "constant:1" and parse_schedule(0)(3, 10) == 0.0
    assert str(parse_schedule("5e-1")) == "constant:5e-1" and values("5e-1", [0, 7]) == [0.5, 0.5]


# ---------------------------------------------------------------------------------------------------------------
# linear
# ---------------------------------------------------------------------------------------------------------------
def test_linear_without_window_spans_step_0_to_total_steps():
    # 0.5 * step / 1000: 0.0005 at step 1, 0.25 at 500, 0.4995 at the last step 999, 0.5 from 1000 on
    got = values("linear:0->0.5", [0, 1, 500, 999, 1000, 1500])
    assert got == pytest.approx([0, 0.0005, 0.25, 0.4995, 0.5, 0.5], abs=1e-15)


def test_linear_decreasing():
    assert values("linear:1->0.5", [0, 250, 1000]) == pytest.approx([1, 0.875, 0.5])  # 1 - 0.5 * 250 / 1000


def test_linear_step_window_holds_start_before_and_end_after():
    # 0 up to step 100, then 0.5 * (step - 100) / 500, then 0.5 from step 600 on
    got = values("linear:0->0.5@100-600", [0, 99, 100, 101, 350, 599, 600, 2000])
    assert got == pytest.approx([0, 0, 0, 0.001, 0.25, 0.499, 0.5, 0.5], abs=1e-15)


def test_linear_ends_are_exact():
    # start + (end - start) * 1.0 would give 0.09999999999999998 for 0.7 -> 0.1
    assert values("linear:0.7->0.1", [0, 1000]) == [0.7, 0.1]


def test_linear_percent_window_resolves_against_total_steps():
    # 10%-60% of 1000 = steps 100-600; of 200 = 20-120; of 15 = 1.5-9 (step 5 is (5 - 1.5) / 7.5 of the way)
    assert values("linear:0->0.5@10%-60%", [0, 100, 350, 600, 999]) == pytest.approx([0, 0, 0.25, 0.5, 0.5])
    assert values("linear:0->0.5@10%-60%", [20, 70, 120], total=200) == pytest.approx([0, 0.25, 0.5])
    assert values("linear:0->1@10%-60%", [1, 5, 9], total=15) == pytest.approx([0, 3.5 / 7.5, 1])


def test_linear_percent_window_may_start_at_step_0():
    assert values("linear:0->1@0-50%", [0, 250, 500, 999]) == pytest.approx([0, 0.5, 1, 1])  # 0 is 0 steps or 0%


def test_total_steps_of_one_ramps_over_a_single_step():
    assert values("linear:0->1", [0, 1], total=1) == [0, 1]


# ---------------------------------------------------------------------------------------------------------------
# piecewise
# ---------------------------------------------------------------------------------------------------------------
def test_piecewise_several_pieces():
    got = values("piecewise:1@0,0.5@10%,0.25@20%", [0, 99, 100, 199, 200, 999, 3000])
    assert got == [1, 1, 0.5, 0.5, 0.25, 0.25, 0.25]  # 20% of 1000 = 200


def test_piecewise_single_piece_is_constant():
    assert values("piecewise:0.3", [0, 10, 999]) == [0.3] * 3


# ---------------------------------------------------------------------------------------------------------------
# What the trainer reads: initial, str; value_range for the controller's bounds
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "spec, initial, value_range",
    [
        ("0.5", 0.5, (0.5, 0.5)),
        ("linear:1->0.5", 1.0, (0.5, 1.0)),
        ("linear:0.2->1@5%-50%", 0.2, (0.2, 1.0)),
        ("piecewise:0.5@0,0@10%,0.75@50%", 0.5, (0.0, 0.75)),
    ],
)
def test_initial_is_the_step_0_value_of_every_run_length(spec, initial, value_range):
    schedule = parse_schedule(spec)
    assert schedule.initial == initial and schedule.value_range == value_range
    for total in (400, 1000, 12345):
        assert schedule(0, total) == initial


def test_str_is_the_spec_without_whitespace_and_reads_back():
    schedule = parse_schedule(" Linear: 0.0 -> 0.50 @ 10% - 60% ")
    assert str(schedule) == "linear:0.0->0.50@10%-60%"
    assert parse_schedule(str(schedule)) == schedule and parse_schedule(schedule) is schedule
    assert isinstance(schedule, Schedule) and pickle.loads(pickle.dumps(schedule)) == schedule


# ---------------------------------------------------------------------------------------------------------------
# A Python callable
# ---------------------------------------------------------------------------------------------------------------
def half_cosine(step: int, total: int) -> float:
    return 0.5 * (1 + math.cos(math.pi * step / total))


def test_callable_gives_its_values_and_names_itself():
    schedule = parse_schedule(half_cosine)
    assert isinstance(schedule, FunctionSchedule) and parse_schedule(schedule) is schedule
    assert values(schedule, [0, 500, 1000]) == pytest.approx([1, 0.5, 0])  # (1 + cos(pi t)) / 2 at t = 0, 1/2, 1
    assert schedule.initial == 1.0 and str(schedule) == f"python:{__name__}.half_cosine"
    schedule.check(1000, field="gppo_beta1_schedule")
    assert values(lambda step, total: 1 if step else 0, [0, 7]) == [0.0, 1.0]  # an int is a number


@pytest.mark.parametrize("returned", [-0.5, math.nan, math.inf, "0.5", None, True])
def test_callable_returning_a_bad_beta_is_refused_at_that_step(returned):
    schedule = parse_schedule(lambda step, total: returned if step == 3 else 0.5)
    assert schedule(2, 10) == 0.5
    with pytest.raises(ValueError, match=r"^`gppo_beta1_schedule`: beta schedule python:.*<lambda> returned .* at "
                       r"step 3 of 10, not >= 0$"):  # fmt: skip
        schedule.check(10, field="gppo_beta1_schedule")


def test_callable_whose_step_0_value_depends_on_the_run_length_is_refused_at_check():
    schedule = parse_schedule(lambda step, total: 1 / total)  # 1 at step 0 of 1 step, 0.1 of 10 steps
    with pytest.raises(ValueError, match=r"gives 0\.1 at step 0 of 10 steps but 1 at step 0 of 1 step"):
        schedule.check(10, field="gppo_beta1_schedule")


# ---------------------------------------------------------------------------------------------------------------
# Malformed specs: the problem, the spec and the accepted forms
# ---------------------------------------------------------------------------------------------------------------
MALFORMED = {
    "": "the spec is empty",
    "   ": "the spec is empty",
    "abc": "constant value 'abc' is not a number",
    "-0.5": "constant value '-0.5' must be finite and >= 0",
    "nan": "constant value 'nan' must be finite and >= 0",
    "1e999": "constant value '1e999' must be finite and >= 0",
    "constant:": "constant value is missing",
    "linear:0": "linear needs START->END, got '0'",
    "linear:0-": "got '0-' (an unquoted '->' on a shell command line loses its '>')",
    "linear:0->": "linear end value is missing",
    "linear:0->0.5->1": "linear needs START->END",
    "linear:0->-0.5": "linear end value '-0.5' must be finite and >= 0",
    "linear:0->0.5@100": "linear window '100' must be FROM-TO",
    "linear:0->0.5@-10-20": "must be FROM-TO",
    "linear:0->0.5@600-100": "linear window must increase, got 600 then 100",
    "linear:0->0.5@100-100": "linear window must increase, got 100 then 100",
    "linear:0->0.5@10.5-20": "linear window '10.5' must be a step (an integer, e.g. 585) or a percentage <= 100",
    "linear:0->0.5@10%-120%": "linear window '120%' must be a step",
    "linear:0->1@600-50%": "linear window 600, 50% mixes steps and percentages: write all in one or the other",
    "piecewise:0,1@600,2@50%": "piecewise boundaries 0, 600, 50% mixes steps and percentages",
    "piecewise:": "piecewise value #1 is missing",
    "piecewise:0@10,1@20": "the first piecewise boundary must be 0 (the value at step 0), got 10",
    "piecewise:0@0,1": "every piece but the first needs its boundary, VALUE@STEP",
    "piecewise:0@0,1@20,2@10": "piecewise boundaries must increase, got 20 then 10",
    "piecewise:0,1@0%": "piecewise boundaries must increase, got 0 then 0%",
    "piecewise:0@0,1@2x": "piecewise boundaries '2x' must be a step",
    "foo:1": "unknown schedule kind 'foo' (known: constant, linear, piecewise).",
    "warmup:0->0.5@50": "warmup was removed in cegppo-trl 0.5.0: warmup:A->B@N is linear:A->B@0-N",
    "cosine:1->0.5": "cosine was removed in cegppo-trl 0.5.0: use a callable",
    "exp:1->0.1": "exp was removed in cegppo-trl 0.5.0: use a callable",
    None: "expected a string, a number or a callable, got NoneType",
    True: "got bool",
    (0.5,): "got tuple",
    -1: "constant value '-1' must be finite and >= 0",
    math.inf: "constant value 'inf' must be finite and >= 0",
}


@pytest.mark.parametrize("spec, problem", MALFORMED.items())
def test_malformed_spec_names_the_problem_and_lists_the_accepted_forms(spec, problem):
    with pytest.raises(ValueError) as error:
        parse_schedule(spec)
    message = str(error.value)
    assert message.startswith(f"Invalid beta schedule {spec!r}: ") and problem in message
    assert message.endswith(SCHEDULE_SYNTAX)
    for form in ("constant:0.5", "linear:0->0.5@100-600", "linear:0->0.5@10%-60%", "piecewise:0@0,0.5@585"):
        assert form in SCHEDULE_SYNTAX


def test_the_warmup_replacement_gives_warmups_values():
    # warmup:0->0.5@50 was 0.5 * step / 50 over the first 50 steps, then 0.5
    assert values("linear:0->0.5@0-50", [0, 25, 49, 50, 999]) == pytest.approx([0, 0.25, 0.49, 0.5, 0.5])


def test_the_documented_callables_for_cosine_and_exp_give_the_removed_kinds_values():
    # docs/schedules.md's replacements, with the values 0.4's cosine:1->0.5 and exp:1->0.1 gave:
    # 0.5 + 0.25 * (1 + cos(pi t)) at t = 0, 1/4, 1/2, 3/4, 1; 0.1 ** t at t = 0, 1/2, 1, and held after the end
    a, b = 1, 0.5
    cosine = parse_schedule(lambda step, total: b + (a - b) * (1 + math.cos(math.pi * min(step / total, 1))) / 2)
    expected = [1, 0.5 + 0.25 * (1 + math.sqrt(0.5)), 0.75, 0.5 + 0.25 * (1 - math.sqrt(0.5)), 0.5, 0.5]
    assert values(cosine, [0, 250, 500, 750, 1000, 1200]) == pytest.approx(expected)
    a, b = 1, 0.1
    exp = parse_schedule(lambda step, total: a * (b / a) ** min(step / total, 1))
    assert values(exp, [0, 500, 1000, 1200]) == pytest.approx([1, 10**-0.5, 0.1, 0.1])
