"""Entropy controller (`cegppo_trl.research.controller`): direction, bounded steps, deadband, bounds, state, composition."""

from __future__ import annotations

import json
import re

import pytest

from cegppo_trl.research.controller import EntropyController, EntropyControllerConfig, parse_controller
from cegppo_trl.research.trainer import ResearchCEGPPOConfig
from cegppo_trl.schedules import parse_schedule

TOL = 1e-12


def make(mode="both", beta1=0.5, beta2=1.0, **overrides) -> EntropyController:
    """A controller with the symmetric rule (beta1 may rise above its nominal): the tests of the update rule use it;
    the default, which never raises beta1 above its nominal, has its own tests below."""
    kwargs = dict(
        raise_beta1=True,
        target_low=0.3,
        target_high=0.6,
        step_size=0.05,
        mode=mode,
        beta1_min=0.0,
        beta1_max=1.0,
        beta2_min=0.5,
        beta2_max=1.5,
    )
    kwargs.update(overrides)
    return EntropyController(EntropyControllerConfig(**kwargs), beta1=beta1, beta2=beta2)


def run(controller: EntropyController, entropies) -> list[tuple[float, float]]:
    return [controller.update(h) for h in entropies]


# ---------------------------------------------------------------------------------------------------------------
# Direction and step size
# ---------------------------------------------------------------------------------------------------------------
def test_entropy_below_band_raises_beta2_and_lowers_beta1_by_at_most_one_step_per_update():
    controller = make()
    history = [(0.5, 1.0), *run(controller, [0.2] * 30)]  # collapsing entropy, far below the band
    for (b1, b2), (n1, n2) in zip(history, history[1:]):
        assert n1 <= b1 and n2 >= b2  # beta1 falls, beta2 rises
        assert b1 - n1 <= 0.05 + TOL and n2 - b2 <= 0.05 + TOL
    # first update moves both by a full step; then both saturate at their bounds and stay there
    assert history[1] == pytest.approx((0.45, 1.05))
    assert history[-1] == pytest.approx((0.0, 1.5))
    assert all(0.0 <= b1 <= 1.0 and 0.5 <= b2 <= 1.5 for b1, b2 in history)
    assert controller.last_direction == 1


def test_entropy_above_band_lowers_beta2_and_raises_beta1():
    controller = make()
    history = [(0.5, 1.0), *run(controller, [0.9] * 30)]  # exploding entropy
    for (b1, b2), (n1, n2) in zip(history, history[1:]):
        assert n1 >= b1 and n2 <= b2
        assert n1 - b1 <= 0.05 + TOL and b2 - n2 <= 0.05 + TOL
    assert history[1] == pytest.approx((0.55, 0.95))
    assert history[-1] == pytest.approx((1.0, 0.5))
    assert controller.last_direction == -1


def test_by_default_beta1_never_rises_above_its_nominal():
    # The second entropy study's situation: entropy starts just above the band. The symmetric rule raised beta1
    # (0.5 -> 0.6 -> ...), the direction that collapsed validity on 5/5 seeds; the default lowers beta2 only.
    default = EntropyController(EntropyControllerConfig(0.30, 0.40, step_size=0.1), beta1=0.5, beta2=1.0)
    history = run(default, [0.415, 0.42, 0.43, 0.45, 0.5])
    assert all(beta1 == 0.5 for beta1, _ in history)
    assert history[-1][1] == pytest.approx(0.5)  # beta2 went down to its bound instead
    assert make(target_high=0.40, step_size=0.1).update(0.415)[0] == pytest.approx(0.6)  # the symmetric rule


def test_by_default_beta1_comes_back_up_to_its_nominal_but_not_past_it():
    controller = EntropyController(EntropyControllerConfig(0.3, 0.6, damping=0.0), beta1=0.5, beta2=1.0)
    collapsing = run(controller, [0.1, 0.1])  # below the band: beta1 down
    assert collapsing == [pytest.approx(b) for b in [(0.45, 1.05), (0.4, 1.1)]]
    exploding = run(controller, [0.9] * 4)  # above it: beta1 back up to its nominal, then only beta2 moves
    assert exploding == [pytest.approx(b) for b in [(0.45, 1.05), (0.5, 1.0), (0.5, 0.95), (0.5, 0.9)]]
    assert controller.offsets[0] == 0.0
    # Along a schedule: the applied beta1 is never above the nominal of the step, whatever the nominal does.
    for nominal in (0.0, 0.2, 0.7, 0.1):
        assert controller.apply(nominal, 1.0)[0] <= nominal
        controller.update(0.9)
        assert controller.beta1 <= nominal


def test_raise_beta1_is_a_bool():
    assert EntropyControllerConfig(0.3, 0.6).raise_beta1 is False
    assert parse_controller('{"target_low": 0.3, "target_high": 0.6, "raise_beta1": true}').raise_beta1 is True
    with pytest.raises(ValueError, match="`raise_beta1` must be true or false, got 1"):
        EntropyControllerConfig(0.3, 0.6, raise_beta1=1)


@pytest.mark.parametrize("entropy", [0.3, 0.45, 0.6])
def test_without_damping_nothing_changes_inside_the_band_including_its_edges(entropy):
    controller = make(damping=0.0)
    run(controller, [0.2, 0.2])  # move away from the nominal first: inside the band the offset is kept
    before = (controller.beta1, controller.beta2)
    assert run(controller, [entropy] * 10) == [before] * 10
    assert controller.last_direction == 0


def test_with_damping_a_still_entropy_inside_the_band_changes_nothing():
    controller = make()  # damping=1 by default
    run(controller, [0.45])
    assert run(controller, [0.45] * 10) == [(0.5, 1.0)] * 10


def test_damping_moves_betas_against_entropy_motion_inside_the_band():
    # entropy rises 0.35 -> 0.40 -> 0.43 inside the band: with damping 2, beta2 falls by 2 * 0.05 then 2 * 0.03
    controller = make(damping=2.0, step_size=0.5)
    run(controller, [0.35])
    assert controller.update(0.40) == pytest.approx((0.6, 0.9))
    assert controller.update(0.43) == pytest.approx((0.66, 0.84))
    assert controller.last_direction == -1


def test_damping_brakes_the_push_when_entropy_already_returns_to_the_band():
    # below the band: a full push (+0.05) minus damping * rise (1 * 0.03) leaves +0.02; a faster rise (0.1) reverses
    controller = make()
    run(controller, [0.1])  # first update: full step, (0.45, 1.05)
    assert controller.update(0.13) == pytest.approx((0.43, 1.07))
    assert controller.update(0.23) == pytest.approx((0.43 + 0.05, 1.07 - 0.05))  # -0.05 after the clip at step_size


def _closed_loop_band_crossings(damping: float) -> tuple[int, float, bool]:
    # Entropy integrates the betas: per update it changes by 0.01 * (beta2 - beta1 - 0.5) (0 at the nominal (0.5,
    # 1)), plus a constant collapse pressure of -0.004. Starting below the band, count how often the entropy leaves
    # the band again after first entering it, and the largest overshoot above it.
    controller = make(damping=damping, step_size=0.02)
    h, entered, exits, overshoot, inside = 0.1, False, 0, 0.0, False
    for _ in range(400):
        beta1, beta2 = controller.update(h)
        h = max(0.0, h + 0.01 * (beta2 - beta1 - 0.5) - 0.004)
        now_inside = 0.3 <= h <= 0.6
        entered |= now_inside
        exits += entered and inside and not now_inside
        overshoot = max(overshoot, h - 0.6)
        inside = now_inside
    return exits, overshoot, inside


def test_damping_stops_the_oscillation_of_push_only_control():
    # Push-only control of an integrating quantity overshoots the band again and again; damping settles inside it.
    exits, overshoot, _ = _closed_loop_band_crossings(damping=0.0)
    assert exits >= 3 and overshoot > 0.04
    for damping in (1.0, 3.0):  # the default, and a stronger one
        exits, overshoot, ends_inside = _closed_loop_band_crossings(damping)
        assert exits == 0 and overshoot <= 0.0 and ends_inside


@pytest.mark.parametrize(
    "mode, low_result, high_result",
    [("beta1", (0.45, 1.0), (0.55, 1.0)), ("beta2", (0.5, 1.05), (0.5, 0.95)), ("both", (0.45, 1.05), (0.55, 0.95))],
)
def test_mode_selects_which_coefficient_moves(mode, low_result, high_result):
    assert make(mode).update(0.1) == pytest.approx(low_result)
    assert make(mode).update(0.9) == pytest.approx(high_result)


def test_proportional_gain_scales_small_deviations_and_caps_large_ones():
    # distance 0.01 below the band with gain 2 -> step 0.02; distance 0.2 -> 0.4, capped at step_size 0.05
    assert make(gain=2.0).update(0.29) == pytest.approx((0.48, 1.02))
    assert make(gain=2.0).update(0.1) == pytest.approx((0.45, 1.05))
    assert make(gain=2.0).update(0.8) == pytest.approx((0.55, 0.95))


def test_ema_smooths_the_measured_entropy():
    # ema 0.5: h = 0.5 (first update, in band) -> 0.5 * 0.5 + 0.5 * 0.0 = 0.25 < 0.3 -> one step up
    controller = make(ema=0.5, damping=0.0)
    assert controller.update(0.5) == (0.5, 1.0)
    assert controller.update(0.0) == pytest.approx((0.45, 1.05))
    assert controller.state_dict()["smoothed_entropy"] == pytest.approx(0.25) and controller.last_entropy == 0.0
    # without smoothing a single spike into the band stops the controller; with it, one spike does not
    controller = make(ema=0.8, damping=0.0)
    run(controller, [0.1, 0.1])
    assert controller.update(0.5) == pytest.approx((0.35, 1.15))  # h = 0.8 * 0.1 + 0.2 * 0.5 = 0.18


def test_bounds_hold_even_when_the_nominal_is_outside_them():
    controller = make(beta2=2.0)  # nominal beta2 above beta2_max = 1.5
    assert (controller.beta1, controller.beta2) == (0.5, 1.5)
    # exploding entropy: beta2 moves down from its bound at once (no accumulated excess to unwind)
    assert controller.update(0.9) == pytest.approx((0.55, 1.45))


def test_anti_windup_leaves_saturation_on_the_first_update_after_the_sign_flips():
    controller = make()
    run(controller, [0.0] * 100)  # 100 updates pushing against bounds that are 10 steps away
    assert (controller.beta1, controller.beta2) == pytest.approx((0.0, 1.5))
    assert controller.update(1.0) == pytest.approx((0.05, 1.45))


def test_zero_width_bounds_freeze_a_coefficient():
    controller = make(beta1_min=0.5, beta1_max=0.5)
    assert run(controller, [0.0] * 5)[-1] == pytest.approx((0.5, 1.25))


def test_properties_before_and_after_the_first_update():
    controller = make()
    assert controller.last_entropy is None and controller.num_updates == 0
    assert (controller.beta1, controller.beta2) == (0.5, 1.0) and controller.offsets == (0.0, 0.0)
    controller.update(0.2)
    assert controller.last_entropy == 0.2 and controller.num_updates == 1
    assert controller.offsets == pytest.approx((-0.05, 0.05))


@pytest.mark.parametrize("entropy", [float("nan"), float("inf"), -0.1, "0.5", None])
def test_invalid_entropy_raises(entropy):
    with pytest.raises(ValueError, match="entropy"):
        make().update(entropy)


def test_invalid_initial_beta_raises():
    with pytest.raises(ValueError, match="beta1"):
        make(beta1=-0.1)
    with pytest.raises(TypeError):
        EntropyController({"band": [0.3, 0.6]}, 0.5, 1.0)


# ---------------------------------------------------------------------------------------------------------------
# Composition with a schedule
# ---------------------------------------------------------------------------------------------------------------
def test_offset_rides_on_the_schedule_paper_switch():
    # Nominal beta1 follows the paper's switch; entropy below the band for two updates before step 585 gives an
    # offset of -0.1 on beta1 (clamped to 0 while the nominal is 0) and +0.1 on beta2. After the switch the offset
    # is still there: beta1 = 0.5 - 0.1, not the controller's own value and not the bare schedule.
    beta1_schedule, beta2_schedule = parse_schedule("piecewise:0@0,0.5@585"), parse_schedule("1")
    controller = make(beta1=0.0, beta2=1.0)
    assert controller.apply(beta1_schedule(0, 1000), beta2_schedule(0, 1000)) == (0.0, 1.0)
    run(controller, [0.2, 0.2])
    assert controller.apply(beta1_schedule(584, 1000), beta2_schedule(584, 1000)) == pytest.approx((0.0, 1.1))
    assert controller.offsets[0] == pytest.approx(0.0)  # anti-windup: nominal 0 cannot go lower
    controller.update(0.9)  # now above the band: beta1 up a step from its bound, beta2 down
    assert controller.apply(beta1_schedule(584, 1000), beta2_schedule(584, 1000)) == pytest.approx((0.05, 1.05))
    assert controller.apply(beta1_schedule(585, 1000), beta2_schedule(585, 1000)) == pytest.approx((0.55, 1.05))


def test_apply_with_a_changing_nominal_keeps_the_offset_and_clamps():
    controller = make()
    run(controller, [0.9, 0.9])  # offsets (+0.1, -0.1)
    assert controller.apply(0.2, 1.0) == pytest.approx((0.3, 0.9))
    assert controller.apply(0.95, 0.55) == pytest.approx((1.0, 0.5))  # clamped to the bounds
    with pytest.raises(ValueError, match="nominal_beta2"):
        controller.apply(0.5, float("nan"))


def test_update_returns_what_apply_would_return_for_the_latest_nominal():
    controller = make()
    controller.apply(0.3, 0.8)
    new = controller.update(0.1)
    assert new == controller.apply(0.3, 0.8) == pytest.approx((0.25, 0.85))


# ---------------------------------------------------------------------------------------------------------------
# State
# ---------------------------------------------------------------------------------------------------------------
def _trace(controller, schedule, steps):
    out = []
    for step in steps:
        out.append(controller.apply(schedule(step, 100), 1.0))
        out.append(controller.update(0.1 + 0.9 * ((step * 37) % 11) / 10))  # deterministic, crosses the band
    return out


def test_state_dict_round_trip_gives_identical_future_outputs():
    schedule = parse_schedule("linear:0->0.8@10-60")
    config = EntropyControllerConfig(0.3, 0.6, step_size=0.03, ema=0.3, gain=0.5)
    reference = EntropyController(config, 0.0, 1.0)
    _trace(reference, schedule, range(0, 40))
    state = json.loads(json.dumps(reference.state_dict()))  # what a checkpoint stores
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in state.values())

    resumed = EntropyController(config, 0.7, 0.7)  # different initial betas: the state must override them
    resumed.load_state_dict(state)
    assert resumed.state_dict() == reference.state_dict()
    assert _trace(resumed, schedule, range(40, 100)) == _trace(reference, schedule, range(40, 100))


def test_load_state_dict_rejects_missing_or_non_finite_values():
    controller = make()
    state = controller.state_dict()
    with pytest.raises(ValueError, match="missing"):
        controller.load_state_dict({k: v for k, v in state.items() if k != "offset_beta1"})
    with pytest.raises(ValueError, match="offset_beta2"):
        controller.load_state_dict({**state, "offset_beta2": float("nan")})


# ---------------------------------------------------------------------------------------------------------------
# Config validation and parsing
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, field",
    [
        (dict(target_low=-0.1), "target_low"),
        (dict(target_high=0.3), "target_high"),
        (dict(target_high=float("nan")), "target_high"),
        (dict(step_size=0), "step_size"),
        (dict(mode="entropy"), "mode"),
        (dict(beta1_min=-1), "beta1_min"),
        (dict(beta2_max=0.1), "beta2_max"),
        (dict(gain=0), "gain"),
        (dict(damping=-0.5), "damping"),
        (dict(ema=1.0), "ema"),
        (dict(ema=-0.1), "ema"),
        (dict(update_every=0), "update_every"),
        (dict(update_every=2.0), "update_every"),
    ],
)
def test_config_validation_names_the_field(overrides, field):
    kwargs = {"target_low": 0.3, "target_high": 0.6, **overrides}
    with pytest.raises(ValueError, match=f"`{field}`"):
        EntropyControllerConfig(**kwargs)


def test_parse_takes_the_configs_fields_as_a_mapping_or_json():
    expected = EntropyControllerConfig(0.3, 0.6, gain=2.0, damping=0.0, update_every=10, mode="beta2")
    fields = {"target_low": 0.3, "target_high": 0.6, "gain": 2, "damping": 0, "update_every": 10, "mode": "beta2"}
    assert parse_controller(fields) == expected  # YAML
    assert parse_controller(json.dumps(fields)) == expected  # a flag
    assert parse_controller(expected) is expected and parse_controller(None) is None


@pytest.mark.parametrize(
    "spec, problem",
    [
        ({"target_low": 0.6, "target_high": 0.3}, "`target_high` must be a number > target_low, got 0.3"),
        ({"target_low": 0.3}, "missing 1 required positional argument: 'target_high'"),
        ({"target_low": 0.3, "target_high": 0.6, "band": 1}, "unexpected keyword argument 'band'"),
        ({"target_low": 0.3, "target_high": 0.6, "update_every": 2.5}, "`update_every` must be an integer >= 1"),
        ("band=0.3-0.6", "is not JSON"),
        ("[0.3, 0.6]", "expected a mapping"),
    ],
)
def test_malformed_controller_spec_names_the_problem(spec, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_controller(spec)


# ---------------------------------------------------------------------------------------------------------------
# A coefficient the mode does not move passes through untouched (its bounds do not apply)
# ---------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nominal_beta2", [0.0, 2.0])  # both outside the default beta2 bounds 0.5-1.5
def test_mode_beta1_leaves_beta2_at_its_nominal(nominal_beta2):
    controller = make(mode="beta1", beta1=0.5, beta2=nominal_beta2)
    assert controller.apply(0.5, nominal_beta2) == (0.5, nominal_beta2)
    for entropy in (0.1, 0.1, 0.9, 0.9):  # below, then above the band: beta1 moves both ways
        beta1, beta2 = controller.update(entropy)
        assert beta2 == nominal_beta2
        assert controller.apply(0.5, nominal_beta2)[1] == nominal_beta2
    assert controller.offsets[1] == 0.0


@pytest.mark.parametrize("nominal_beta1", [1.5, 3.0])  # outside the default beta1 bounds 0-1
def test_mode_beta2_leaves_beta1_at_its_nominal(nominal_beta1):
    controller = make(mode="beta2", beta1=nominal_beta1, beta2=1.0)
    assert controller.apply(nominal_beta1, 1.0) == (nominal_beta1, 1.0)
    for entropy in (0.1, 0.9):
        assert controller.update(entropy)[0] == nominal_beta1
    assert controller.offsets[0] == 0.0


# ---------------------------------------------------------------------------------------------------------------------
# Through the trainer: the controller never changes the configured betas before it has measured anything
# ---------------------------------------------------------------------------------------------------------------------
def test_trainer_logs_the_configured_betas_until_the_first_controller_update(make_research_trainer):
    trainer = make_research_trainer(
        num_iterations=2, max_steps=2, gppo_beta1=0.0, gppo_beta2=0.0,
        entropy_controller={"target_low": 0.3, "target_high": 0.6, "update_every": 100, "beta2_min": 0},  # contains 0
    )  # fmt: skip
    trainer.train()
    logs = [h for h in trainer.state.log_history if "cegppo/beta2" in h]
    assert [(h["cegppo/beta1"], h["cegppo/beta2"]) for h in logs] == [(0.0, 0.0), (0.0, 0.0)]


# ---------------------------------------------------------------------------------------------------------------------
# Through `ResearchCEGPPOTrainer`: the betas it logs, its state across a resume, the config's checks
# ---------------------------------------------------------------------------------------------------------------------
def _step_logs(trainer):
    return [h for h in trainer.state.log_history if "cegppo/beta1" in h and "loss" in h]


def documented_controller_rule(
    entropies, *, low, high, step, damping, ema, beta1, beta2, bounds1, bounds2, raise_beta1=False
):
    """The update rule of the `cegppo_trl.research.controller` docstring (mode both, bang-bang push), written out from the
    docs without the library: the applied (beta1, beta2) before each update, for constant nominal betas."""
    if not raise_beta1:  # 7. beta1 never above its nominal
        bounds1 = (bounds1[0], min(bounds1[1], beta1))
    clamp = lambda x, lo, hi: min(max(x, lo), hi)  # noqa: E731
    applied, offset1, offset2, h = [], 0.0, 0.0, None
    for entropy in entropies:
        applied.append((clamp(beta1 + offset1, *bounds1), clamp(beta2 + offset2, *bounds2)))
        previous = entropy if h is None else h
        h = entropy if h is None else ema * h + (1 - ema) * entropy  # 1. smoothing
        distance = low - h if h < low else high - h if h > high else 0.0  # 2. signed distance to the band
        push = (step if distance > 0 else -step) if distance else 0.0  # 3. bang-bang push
        u = clamp(push - damping * (h - previous), -step, step)  # 4.-5. damping, bounded step
        if u:  # 6. anti-windup clamp before and after the step
            offset1 = clamp(offset1, bounds1[0] - beta1, bounds1[1] - beta1) - u
            offset2 = clamp(offset2, bounds2[0] - beta2, bounds2[1] - beta2) + u
            offset1 = clamp(offset1, bounds1[0] - beta1, bounds1[1] - beta1)
            offset2 = clamp(offset2, bounds2[0] - beta2, bounds2[1] - beta2)
    return applied


@pytest.mark.parametrize(
    "raise_beta1, beta1s", [(False, [0.5, 0.5, 0.5, 0.5, 0.5]), (True, [0.5, 0.75, 1.0, 1.0, 1.0])]
)
def test_controller_moves_beta_by_bounded_steps_toward_the_band(make_research_trainer, raise_beta1, beta1s):
    # A random tiny model has entropy ~4.6 nats, far above this band: "exploding", so the controller lowers beta2
    # (and with raise_beta1 raises beta1) by `step` per update until the bounds stop it. By default beta1 stays at
    # its nominal 0.5: raising it is the hazard of docs/entropy-study.md.
    spec = {"target_low": 1, "target_high": 2, "step_size": 0.25, "damping": 0, "raise_beta1": raise_beta1}
    trainer = make_research_trainer(num_iterations=2, max_steps=5, entropy_controller=spec)
    trainer.train()
    logs = _step_logs(trainer)
    assert [h["cegppo/beta1"] for h in logs] == pytest.approx(beta1s)
    assert [h["cegppo/beta2"] for h in logs] == pytest.approx([1.0, 0.75, 0.5, 0.5, 0.5])
    assert all(h["cegppo/controller/target_low"] == 1 and h["cegppo/controller/target_high"] == 2 for h in logs)
    # The controller measured each step's global entropy (window = 1 step) at the end of that step.
    for h in logs:
        assert h["cegppo/controller/entropy"] == pytest.approx(h["entropy"], rel=1e-6)
        assert h["cegppo/controller/entropy"] > 2


def test_logged_betas_replay_the_controller_rule_on_the_logged_entropy(make_research_trainer):
    # Default settings (damping on): feeding the logged global entropies to a fresh controller reproduces every
    # logged beta, i.e. the trainer applies exactly the documented rule, one update per optimizer step.
    spec = {"target_low": 1, "target_high": 2, "step_size": 0.1}
    trainer = make_research_trainer(num_iterations=2, max_steps=5, entropy_controller=spec)
    trainer.train()
    logs = _step_logs(trainer)
    replay = EntropyController(parse_controller(spec), 0.5, 1.0)
    for h in logs:
        assert (h["cegppo/beta1"], h["cegppo/beta2"]) == pytest.approx(replay.apply(0.5, 1.0))
        replay.update(h["entropy"])


def test_logged_betas_follow_the_documented_rule_written_out_independently(make_research_trainer):
    # The entropy of the tiny random model (~4.6) is above this band and changes between steps, so both the push
    # and the damping term act; ema=0.5 smooths; beta1 reaches its upper bound on the way (raise_beta1: the
    # symmetric rule; the default's cap is the same rule with bounds1 ending at the nominal).
    trainer = make_research_trainer(
        num_iterations=2, max_steps=5,
        entropy_controller={"target_low": 1, "target_high": 2, "step_size": 0.2, "damping": 2, "ema": 0.5,
                            "beta1_max": 0.9, "raise_beta1": True},
    )  # fmt: skip
    trainer.train()
    logs = _step_logs(trainer)
    expected = documented_controller_rule(
        [h["entropy"] for h in logs], low=1.0, high=2.0, step=0.2, damping=2.0, ema=0.5, beta1=0.5, beta2=1.0,
        bounds1=(0.0, 0.9), bounds2=(0.5, 1.5), raise_beta1=True,
    )  # fmt: skip
    assert [(h["cegppo/beta1"], h["cegppo/beta2"]) for h in logs] == [pytest.approx(b, abs=1e-6) for b in expected]
    assert expected[-1][0] == 0.9  # the bound was reached


@pytest.mark.slow
def test_step_and_percent_window_resolves_against_the_real_run_length(make_research_trainer):
    # 'linear:0->1@5-7' over 14 steps. Before training the run length is unknown: construction with a controller and
    # a read of the betas give the step-0 value.
    trainer = make_research_trainer(
        num_iterations=2, max_steps=14, gppo_beta1_schedule="linear:0->1@5-7",
        entropy_controller={"target_low": 0, "target_high": 10, "damping": 0},
    )  # fmt: skip
    assert trainer.current_gppo_betas() == (0.0, 1.0)
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == pytest.approx([0.0] * 6 + [0.5] + [1.0] * 7)


def test_controller_composes_with_a_schedule_as_an_offset(make_research_trainer):
    # beta1's nominal switches 0 -> 0.5 at step 2; the controller's offset (+0.1 per update, entropy above band)
    # rides on top of it (raise_beta1: the offset is positive).
    trainer = make_research_trainer(
        num_iterations=2, max_steps=4, gppo_beta1_schedule="piecewise:0@0,0.5@2",
        entropy_controller={"target_low": 1, "target_high": 2, "step_size": 0.1, "mode": "beta1", "damping": 0,
                            "raise_beta1": True},
    )  # fmt: skip
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == pytest.approx([0.0, 0.1, 0.7, 0.8])


@pytest.mark.slow
def test_resume_reproduces_betas_and_losses(make_research_trainer, tmp_path):
    kwargs = dict(
        num_iterations=2, max_steps=8, gppo_beta1_schedule="linear:0->0.5", save_strategy="steps", save_steps=4,
        entropy_controller={"target_low": 1, "target_high": 2, "step_size": 0.05, "mode": "both", "update_every": 3},
    )  # fmt: skip
    full = make_research_trainer(**kwargs)
    full.train()
    state = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())
    assert "EntropyControllerState" in state["stateful_callbacks"]  # transformers keeps the controller's state
    # Into a folder of its own: beside the full run's later checkpoint-8, a resume of checkpoint-4 is refused.
    resumed = make_research_trainer(**kwargs, output_dir=str(tmp_path / "resumed"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))

    keys = ["loss", "entropy", "cegppo/beta1", "cegppo/beta2", "cegppo/ratio/max"]
    after_full = [{k: h[k] for k in keys} for h in _step_logs(full) if h["step"] > 4]
    after_resumed = [{k: h[k] for k in keys} for h in _step_logs(resumed) if h["step"] > 4]
    assert len(after_full) == len(after_resumed) == 4
    assert after_resumed == after_full
    assert resumed.entropy_controller.state_dict() == full.entropy_controller.state_dict()


def test_invalid_controller_spec_names_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"`entropy_controller`: `target_high` must be a number > target_low"):
        ResearchCEGPPOConfig(
            output_dir=str(tmp_path), use_cpu=True, entropy_controller='{"target_low": 0.6, "target_high": 0.3}'
        )


@pytest.mark.parametrize(
    "fields, expected",
    [
        (  # the reported case: the default beta2 bounds 0.5-1.5 would apply beta2 = 0.5 from step 1
            dict(gppo_beta1=0, gppo_beta2=0, entropy_controller={"target_low": 0.3, "target_high": 0.6}),
            "beta2 bounds 0.5-1.5 exclude the configured beta2 (0-0)",
        ),
        (  # explicit bounds, beta1 above them
            dict(gppo_beta1=0.8, entropy_controller={"target_low": 0.3, "target_high": 0.6, "beta1_max": 0.5}),
            "beta1 bounds 0-0.5 exclude the configured beta1 (0.8-0.8)",
        ),
        (  # a schedule: every value it takes counts, not only the first
            dict(
                gppo_beta1_schedule="piecewise:0@0,1.5@50%", entropy_controller={"target_low": 0.3, "target_high": 0.6}
            ),
            "beta1 bounds 0-1 exclude the configured beta1 (0-1.5)",
        ),
        (
            dict(
                gppo_beta2_schedule="linear:2->1",
                entropy_controller={"target_low": 0.3, "target_high": 0.6, "mode": "beta2"},
            ),
            "beta2 bounds 0.5-1.5 exclude the configured beta2 (1-2)",
        ),
    ],
)
def test_controller_bounds_that_exclude_the_configured_beta_are_refused(tmp_path, fields, expected):
    with pytest.raises(ValueError, match=re.escape(expected) + ".*Widen"):
        ResearchCEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **fields)


@pytest.mark.parametrize(
    "fields",
    [
        dict(
            gppo_beta1=0,
            gppo_beta2=0,
            entropy_controller={
                "target_low": 0.3,
                "target_high": 0.6,
                "update_every": 100,
                "beta2_min": 0,
                "beta2_max": 1.5,
            },
        ),
        dict(
            gppo_beta2=0, entropy_controller={"target_low": 0.3, "target_high": 0.6, "mode": "beta1"}
        ),  # beta2 not moved: its bounds do not apply
        dict(gppo_beta1=3, entropy_controller={"target_low": 0.3, "target_high": 0.6, "mode": "beta2"}),
        dict(
            gppo_beta1_schedule="linear:0->1@10%-60%",
            gppo_beta2_schedule="linear:0.5->1.5@0-50",
            entropy_controller={"target_low": 0.3, "target_high": 0.6},
        ),
        dict(gppo_beta2=0, gppo_beta2_schedule="constant:1"),  # the schedule overrides the constant
    ],
)
def test_controller_bounds_that_contain_the_configured_betas_are_accepted(tmp_path, fields):
    ResearchCEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **fields)
