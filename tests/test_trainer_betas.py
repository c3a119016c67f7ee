"""β schedules and the entropy controller inside real training runs, and their exact resume from checkpoints."""

from __future__ import annotations

import json

import pytest

from cegppo_trl.controller import EntropyController, parse_controller
from cegppo_trl.schedules import parse_schedule


def _step_logs(trainer):
    return [h for h in trainer.state.log_history if "cegppo/beta1" in h]


def test_piecewise_schedule_switches_beta1_at_the_boundary(make_trainer):
    # The paper's explore -> exploit switch, scaled down: (0, 1) until step 3, then (0.5, 1).
    trainer = make_trainer(num_iterations=2, max_steps=6, gppo_beta1_schedule="piecewise:0@0,0.5@3")
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == [0.0, 0.0, 0.0, 0.5, 0.5, 0.5]
    assert all(h["cegppo/beta2"] == 1.0 for h in _step_logs(trainer))


@pytest.mark.slow
def test_schedule_resolves_against_the_epoch_computed_total(make_trainer):
    # 32 prompts x 4 generations / 8 per step = 16 steps in one epoch; no max_steps given.
    trainer = make_trainer(num_iterations=2, num_train_epochs=1, gppo_beta2_schedule="linear:1->2")
    trainer.train()
    logs = _step_logs(trainer)
    total = trainer.state.max_steps
    assert total == len(logs) > 1
    schedule = parse_schedule("linear:1->2")
    assert [h["cegppo/beta2"] for h in logs] == pytest.approx([schedule(s, total) for s in range(total)])


@pytest.mark.parametrize(
    "raise_beta1, beta1s", [("false", [0.5, 0.5, 0.5, 0.5, 0.5]), ("true", [0.5, 0.75, 1.0, 1.0, 1.0])]
)
def test_controller_moves_beta_by_bounded_steps_toward_the_band(make_trainer, raise_beta1, beta1s):
    # A random tiny model has entropy ~4.6 nats, far above this band: "exploding", so the controller lowers beta2
    # (and with raise_beta1 raises beta1) by `step` per update until the bounds stop it. By default beta1 stays at
    # its nominal 0.5: raising it is the hazard of docs/entropy-study.md.
    spec = f"band=1-2,step=0.25,mode=both,beta1=0-1,beta2=0.5-1.5,damping=0,raise_beta1={raise_beta1}"
    trainer = make_trainer(num_iterations=2, max_steps=5, entropy_controller=spec)
    trainer.train()
    logs = _step_logs(trainer)
    assert [h["cegppo/beta1"] for h in logs] == pytest.approx(beta1s)
    assert [h["cegppo/beta2"] for h in logs] == pytest.approx([1.0, 0.75, 0.5, 0.5, 0.5])
    assert all(h["cegppo/controller/target_low"] == 1 and h["cegppo/controller/target_high"] == 2 for h in logs)
    # The controller measured each step's global entropy (window = 1 step) at the end of that step.
    for h in logs:
        assert h["cegppo/controller/entropy"] == pytest.approx(h["entropy"], rel=1e-6)
        assert h["cegppo/controller/entropy"] > 2


def test_logged_betas_replay_the_controller_rule_on_the_logged_entropy(make_trainer):
    # Default settings (damping on): feeding the logged global entropies to a fresh controller reproduces every
    # logged beta, i.e. the trainer applies exactly the documented rule, one update per optimizer step.
    spec = "band=1-2,step=0.1"
    trainer = make_trainer(num_iterations=2, max_steps=5, entropy_controller=spec)
    trainer.train()
    logs = _step_logs(trainer)
    replay = EntropyController(parse_controller(spec), 0.5, 1.0)
    for h in logs:
        assert (h["cegppo/beta1"], h["cegppo/beta2"]) == pytest.approx(replay.apply(0.5, 1.0))
        replay.update(h["entropy"])


def documented_controller_rule(
    entropies, *, low, high, step, damping, ema, beta1, beta2, bounds1, bounds2, raise_beta1=False
):
    """The update rule of the `cegppo_trl.controller` docstring (mode both, bang-bang push), written out from the
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


def test_logged_betas_follow_the_documented_rule_written_out_independently(make_trainer):
    # The entropy of the tiny random model (~4.6) is above this band and changes between steps, so both the push
    # and the damping term act; ema=0.5 smooths; beta1 reaches its upper bound on the way (raise_beta1: the
    # symmetric rule; the default's cap is the same rule with bounds1 ending at the nominal).
    trainer = make_trainer(
        num_iterations=2, max_steps=5,
        entropy_controller="band=1-2,step=0.2,damping=2,ema=0.5,beta1=0-0.9,raise_beta1=true",
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
def test_step_and_percent_window_resolves_against_the_real_run_length(make_trainer):
    # 'linear:0->1@5-50%' is empty for a 1-step run (step 5 .. 0.5) but valid for 14 steps (steps 5 .. 7). Before
    # training the run length is unknown: construction with a controller and a read of the betas give the step-0
    # value instead of resolving the window against a made-up length.
    trainer = make_trainer(
        num_iterations=2, max_steps=14, gppo_beta1_schedule="linear:0->1@5-50%",
        entropy_controller="band=0-10,damping=0",
    )  # fmt: skip
    assert trainer.current_gppo_betas() == (0.0, 1.0)
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == pytest.approx([0.0] * 6 + [0.5] + [1.0] * 7)


def test_controller_composes_with_a_schedule_as_an_offset(make_trainer):
    # beta1's nominal switches 0 -> 0.5 at step 2; the controller's offset (+0.1 per update, entropy above band)
    # rides on top of it (raise_beta1: the offset is positive).
    trainer = make_trainer(
        num_iterations=2, max_steps=4, gppo_beta1_schedule="piecewise:0@0,0.5@2",
        entropy_controller="band=1-2,step=0.1,mode=beta1,beta1=0-1,damping=0,raise_beta1=true",
    )  # fmt: skip
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == pytest.approx([0.0, 0.1, 0.7, 0.8])


@pytest.mark.slow
def test_resume_reproduces_betas_and_losses(make_trainer, tmp_path):
    kwargs = dict(
        num_iterations=2, max_steps=8, gppo_beta1_schedule="linear:0->0.5", save_strategy="steps", save_steps=4,
        entropy_controller="band=1-2,step=0.05,mode=both,every=3",
    )  # fmt: skip
    full = make_trainer(**kwargs)
    full.train()
    saved = json.loads((tmp_path / "checkpoint-4" / "trainer_state.json").read_text())["stateful_callbacks"]
    assert {type(c).__name__ for c in full._run_state_callbacks} <= set(
        saved
    )  # the run state, as transformers keeps it
    # Into a folder of its own, as a copy of the checkpoint is resumed
    resumed = make_trainer(**kwargs, output_dir=str(tmp_path / "resumed"))
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))

    keys = ["loss", "entropy", "cegppo/beta1", "cegppo/beta2", "cegppo/ratio/mean"]
    after_full = [{k: h[k] for k in keys} for h in _step_logs(full) if h["step"] > 4]
    after_resumed = [{k: h[k] for k in keys} for h in _step_logs(resumed) if h["step"] > 4]
    assert len(after_full) == len(after_resumed) == 4
    assert after_resumed == after_full
    assert resumed.entropy_controller.state_dict() == full.entropy_controller.state_dict()


def test_invalid_schedule_and_controller_specs_name_the_field(tmp_path):
    from cegppo_trl import CEGPPOConfig

    with pytest.raises(ValueError, match=r"(?s)`gppo_beta1_schedule`: .*Accepted schedule forms"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, gppo_beta1_schedule="linear:0-0.5")
    with pytest.raises(ValueError, match=r"(?s)`entropy_controller`: .*Accepted entropy-controller forms"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_controller="band=0.6-0.3")
    assert parse_controller(None) is None
