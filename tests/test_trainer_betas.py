"""β schedules and the entropy controller inside real training runs, and their exact resume from checkpoints."""

from __future__ import annotations

import pytest

from cegppo_trl.schedules import parse_schedule


def _step_logs(trainer):
    return [h for h in trainer.state.log_history if "cegppo/beta1" in h]


def test_piecewise_schedule_switches_beta1_at_the_boundary(make_trainer):
    # The paper's explore -> exploit switch, scaled down: (0, 1) until step 3, then (0.5, 1).
    trainer = make_trainer(num_iterations=2, max_steps=6, gppo_beta1_schedule="piecewise:0@0,0.5@3")
    trainer.train()
    assert [h["cegppo/beta1"] for h in _step_logs(trainer)] == [0.0, 0.0, 0.0, 0.5, 0.5, 0.5]
    assert all(h["cegppo/beta2"] == 1.0 for h in _step_logs(trainer))


def test_a_python_callable_on_the_trainer_drives_the_betas(make_trainer):
    # The Python API: any fn(step, total_steps); here beta2 = 1 + step / total over a 4-step run
    trainer = make_trainer(num_iterations=2, max_steps=4)
    trainer.beta2_schedule = parse_schedule(lambda step, total: 1 + step / total)
    trainer.train()
    assert [h["cegppo/beta2"] for h in _step_logs(trainer)] == [1.0, 1.25, 1.5, 1.75]


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


def test_invalid_schedule_spec_names_the_field(tmp_path):
    from cegppo_trl import CEGPPOConfig

    with pytest.raises(ValueError, match=r"(?s)`gppo_beta1_schedule`: .*Accepted schedule forms"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, gppo_beta1_schedule="linear:0-0.5")
