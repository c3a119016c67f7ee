"""The `_compute_loss` override is a copy of TRL's: fail loudly when the installed TRL's method changes."""

from __future__ import annotations

import pytest
import trl

from cegppo_trl import trainer as trainer_module


def test_installed_trl_compute_loss_is_the_one_the_override_was_copied_from():
    assert trainer_module.trl_compute_loss_sha256() in trainer_module.TRL_COMPUTE_LOSS_SHA256.values(), (
        f"trl {trl.__version__} changed GRPOTrainer._compute_loss: re-diff it against CEGPPOTrainer._compute_loss, "
        "port the change, and add the new hash to TRL_COMPUTE_LOSS_SHA256."
    )
    assert trl.__version__ in trainer_module.TRL_COMPUTE_LOSS_SHA256


def test_drift_refuses_to_train(monkeypatch):
    monkeypatch.setattr(trainer_module, "trl_compute_loss_sha256", lambda: "0" * 64)
    monkeypatch.delenv(trainer_module.SKIP_DRIFT_CHECK_ENV, raising=False)
    with pytest.raises(RuntimeError, match=r"changed in the installed trl .*CEGPPO_SKIP_TRL_DRIFT_CHECK=1"):
        trainer_module.check_trl_compatibility()


def test_drift_override_warns(monkeypatch):
    monkeypatch.setattr(trainer_module, "trl_compute_loss_sha256", lambda: "0" * 64)
    monkeypatch.setenv(trainer_module.SKIP_DRIFT_CHECK_ENV, "1")
    with pytest.warns(UserWarning, match="changed in the installed trl"):
        trainer_module.check_trl_compatibility()


def test_training_goes_through_the_overridden_loss(make_trainer, monkeypatch):
    # Guards against any dispatch path (e.g. a fused loss) that would train without the CE-GPPO surrogate.
    trainer = make_trainer(num_iterations=2, max_steps=2)
    calls = []
    original = type(trainer)._compute_loss
    monkeypatch.setattr(type(trainer), "_compute_loss", lambda self, m, i: calls.append(1) or original(self, m, i))
    trainer.train()
    assert len(calls) == 2
