"""β schedules and the entropy controller inside real training runs, and their exact resume from checkpoints."""

from __future__ import annotations

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


def test_schedule_resolves_against_the_epoch_computed_total(make_trainer):
    # 32 prompts x 4 generations / 8 per step = 16 steps in one epoch; no max_steps given.
    trainer = make_trainer(num_iterations=2, num_train_epochs=1, gppo_beta2_schedule="linear:1->2")
    trainer.train()
    logs = _step_logs(trainer)
    total = trainer.state.max_steps
    assert total == len(logs) > 1
    schedule = parse_schedule("linear:1->2")
    assert [h["cegppo/beta2"] for h in logs] == pytest.approx([schedule(s, total) for s in range(total)])


def test_controller_moves_beta_by_bounded_steps_toward_the_band(make_trainer):
    # A random tiny model has entropy ~4.6 nats, far above this band: "exploding", so the controller raises beta1
    # and lowers beta2 by `step` per update until the bounds stop it.
    spec = "band=1-2,step=0.25,mode=both,beta1=0-1,beta2=0.5-1.5,damping=0"  # damping=0: plain bounded steps
    trainer = make_trainer(num_iterations=2, max_steps=5, entropy_controller=spec)
    trainer.train()
    logs = _step_logs(trainer)
    assert [h["cegppo/beta1"] for h in logs] == pytest.approx([0.5, 0.75, 1.0, 1.0, 1.0])
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


def test_controller_composes_with_a_schedule_as_an_offset(make_trainer):
    # beta1's nominal switches 0 -> 0.5 at step 2; the controller's offset (+0.1 per update, entropy above band)
    # rides on top of it.
    trainer = make_trainer(
        num_iterations=2, max_steps=4, gppo_beta1_schedule="piecewise:0@0,0.5@2",
        entropy_controller="band=1-2,step=0.1,mode=beta1,beta1=0-1,damping=0",
    )  # fmt: skip
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == pytest.approx([0.0, 0.1, 0.7, 0.8])


def test_resume_reproduces_betas_and_losses(make_trainer, tmp_path):
    kwargs = dict(
        num_iterations=2, max_steps=8, gppo_beta1_schedule="linear:0->0.5", save_strategy="steps", save_steps=4,
        entropy_controller="band=1-2,step=0.05,mode=both,every=3",
    )  # fmt: skip
    full = make_trainer(**kwargs)
    full.train()
    assert (tmp_path / "checkpoint-4" / "cegppo_state.json").exists()
    resumed = make_trainer(**kwargs)
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-4"))

    keys = ["loss", "entropy", "cegppo/beta1", "cegppo/beta2", "cegppo/ratio/mean"]
    after_full = [{k: h[k] for k in keys} for h in _step_logs(full) if h["step"] > 4]
    after_resumed = [{k: h[k] for k in keys} for h in _step_logs(resumed) if h["step"] > 4]
    assert len(after_full) == len(after_resumed) == 4
    assert after_resumed == after_full
    assert resumed.entropy_controller.state_dict() == full.entropy_controller.state_dict()


def test_resume_without_controller_state_is_an_error(make_trainer, tmp_path):
    plain = make_trainer(num_iterations=2, max_steps=2, save_strategy="steps", save_steps=2)
    plain.train()
    with_controller = make_trainer(num_iterations=2, max_steps=4, entropy_controller="band=1-2")
    with pytest.raises(FileNotFoundError, match="cegppo_state.json is missing"):
        with_controller.train(resume_from_checkpoint=str(tmp_path / "checkpoint-2"))


def test_invalid_schedule_and_controller_specs_name_the_field(tmp_path):
    from cegppo_trl import CEGPPOConfig

    with pytest.raises(ValueError, match=r"(?s)`gppo_beta1_schedule`: .*Accepted schedule forms"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, gppo_beta1_schedule="linear:0-0.5")
    with pytest.raises(ValueError, match=r"(?s)`entropy_controller`: .*Accepted entropy-controller forms"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, entropy_controller="band=0.6-0.3")
    assert parse_controller(None) is None
