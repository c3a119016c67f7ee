"""CEGPPOConfig: defaults and validation errors that name the field and the allowed range."""

from __future__ import annotations

import math

import pytest

from cegppo_trl import CEGPPOConfig


def make(tmp_path, **kw):
    return CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **kw)


def test_defaults_are_the_papers(tmp_path):
    config = make(tmp_path)
    assert (config.gppo_beta1, config.gppo_beta2) == (0.5, 1.0)
    assert config.loss_type == "dapo"  # token-mean, as in the authors' runs
    assert config.epsilon == 0.2 and config.delta is None


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("gppo_beta1", -0.1, r"`gppo_beta1` must be a finite number >= 0"),
        ("gppo_beta2", math.nan, r"`gppo_beta2` must be a finite number >= 0"),
        ("gppo_beta1", math.inf, r"`gppo_beta1` must be a finite number >= 0"),
        ("epsilon", 0.0, r"`epsilon` must be in the open interval \(0, 1\)"),
        ("epsilon", 1.0, r"`epsilon` must be in the open interval \(0, 1\)"),
        ("epsilon_high", 1.5, r"`epsilon_high` must be in the open interval \(0, 1\)"),
        ("delta", 1.0, r"`delta` \(the dual-clip constant c\) must be a finite number > 1.*recipes use 10"),
        ("delta", 0.5, r"`delta`"),
        ("loss_type", "ppo", r"`loss_type` must be one of \['grpo', 'bnpo', 'dr_grpo', 'dapo', 'luspo'\]"),
        ("importance_sampling_level", "token_sequence", r"`importance_sampling_level` must be one of"),
    ],
)
def test_invalid_values_raise_naming_the_field(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        make(tmp_path, **{field: value})


def test_cispo_may_use_a_large_epsilon_high(tmp_path):
    config = make(tmp_path, loss_type="cispo", epsilon_high=5.0)  # TRL's recommended CISPO value
    assert config.epsilon_high == 5.0


def test_zero_betas_are_valid(tmp_path):
    config = make(tmp_path, gppo_beta1=0, gppo_beta2=0)
    assert config.gppo_beta1 == 0


@pytest.mark.parametrize(
    "field, value, fix",
    [
        ("beta", -0.1, "Use `beta=0.0` for no KL term"),
        ("beta", float("nan"), "finite number >= 0"),
        ("temperature", 0.0, "finite number > 0"),
        ("temperature", -1.0, "finite number > 0"),
        ("num_iterations", 0, "must be >= 1"),
        ("steps_per_generation", 0, "must be >= 1 or None"),
        ("max_unscorable_batches", -1, "0 never stops"),
    ],
)
def test_inherited_fields_that_corrupt_a_run_fail_at_construction(tmp_path, field, value, fix):
    with pytest.raises(ValueError) as error:
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, **{field: value})
    assert f"`{field}`" in str(error.value) and fix in str(error.value)


def test_num_generations_below_2_is_refused_by_grpo_config(tmp_path):
    with pytest.raises(ValueError, match="at least 2 generations"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=1, per_device_train_batch_size=1)
