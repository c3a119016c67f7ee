"""CEGPPOConfig: defaults and validation errors that name the field and the allowed range."""

from __future__ import annotations

import math

import pytest

from cegppo_trl import CEGPPOConfig
from cegppo_trl.config import on_policy_message


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
        ("max_zero_signal_batches", None, r"`max_zero_signal_batches` must be an integer >= 0 \(0 never stops\)"),
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


# ---------------------------------------------------------------------------------------------------------------------
# delta: with TRL's two-sided clamp, 1 < delta <= 1 + epsilon_high would freeze positive advantages; refused
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("delta, epsilon_high", [(1.1, None), (1.2, None), (1.25, 0.28), (1.28, 0.28)])
def test_delta_at_or_below_1_plus_epsilon_high_is_refused_naming_the_range(tmp_path, delta, epsilon_high):
    with pytest.raises(ValueError) as error:
        make(tmp_path, delta=delta, epsilon_high=epsilon_high)
    bound = 1 + (0.2 if epsilon_high is None else epsilon_high)
    message = str(error.value)
    assert f"`delta` must be > 1 + epsilon_high = {bound:g}" in message and f"got {delta}" in message
    assert "beta1 = beta2 = 0 would no longer be GRPO" in message and "`delta=10`" in message


def test_delta_above_1_plus_epsilon_high_and_passthrough_losses_are_accepted(tmp_path):
    assert make(tmp_path, delta=1.3).delta == 1.3
    assert make(tmp_path, delta=10.0, epsilon_high=0.28).delta == 10.0
    assert make(tmp_path, delta=1.1, loss_type="cispo", epsilon_high=5.0).delta == 1.1  # TRL's objective, unchanged


# ---------------------------------------------------------------------------------------------------------------------
# The entropy controller's bounds must contain the configured betas, or it would replace them before measuring
# ---------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fields, expected",
    [
        (  # the reported case: the default beta2 bounds 0.5-1.5 would apply beta2 = 0.5 from step 1
            dict(gppo_beta1=0, gppo_beta2=0, entropy_controller="band=0.3-0.6,every=100"),
            [
                "`gppo_beta2=0`, outside the `entropy_controller` bounds beta2=0.5-1.5",
                "Set `beta2=0-1.5` in `entropy_controller`",
                "set `gppo_beta2` within 0.5-1.5",
                "`mode=beta1`",
            ],
        ),
        (  # explicit bounds, beta1 above them
            dict(gppo_beta1=0.8, entropy_controller="band=0.3-0.6,beta1=0-0.5"),
            ["`gppo_beta1=0.8`, outside the `entropy_controller` bounds beta1=0-0.5", "Set `beta1=0-0.8`"],
        ),
        (  # a schedule: every value it takes counts, not only the first
            dict(gppo_beta1_schedule="piecewise:0@0,1.5@50%", entropy_controller="band=0.3-0.6"),
            [
                "`gppo_beta1_schedule='piecewise:0@0,1.5@50%'` takes values 0-1.5, outside the `entropy_controller` "
                "bounds beta1=0-1",
                "Set `beta1=0-1.5`",
                "keep `gppo_beta1_schedule` within 0-1",
            ],
        ),
        (
            dict(gppo_beta2_schedule="cosine:2->1", entropy_controller={"band": [0.3, 0.6], "mode": "beta2"}),
            ["`gppo_beta2_schedule='cosine:2->1'` takes values 1-2", "bounds beta2=0.5-1.5", "Set `beta2=0.5-2`"],
        ),
    ],
)
def test_controller_bounds_that_exclude_the_configured_beta_are_refused(tmp_path, fields, expected):
    with pytest.raises(ValueError) as error:
        make(tmp_path, **fields)
    for text in expected:
        assert text in str(error.value)


@pytest.mark.parametrize(
    "fields",
    [
        dict(gppo_beta1=0, gppo_beta2=0, entropy_controller="band=0.3-0.6,every=100,beta2=0-1.5"),
        dict(gppo_beta2=0, entropy_controller="band=0.3-0.6,mode=beta1"),  # beta2 not moved: its bounds do not apply
        dict(gppo_beta1=3, entropy_controller="band=0.3-0.6,mode=beta2"),
        dict(
            gppo_beta1_schedule="linear:0->1@10%-60%",
            gppo_beta2_schedule="warmup:0.5->1.5@50",
            entropy_controller="band=0.3-0.6",
        ),
        dict(gppo_beta2=0, gppo_beta2_schedule="constant:1"),  # the schedule overrides the constant
    ],
)
def test_controller_bounds_that_contain_the_configured_betas_are_accepted(tmp_path, fields):
    make(tmp_path, **fields)


def test_every_cegppo_field_has_a_help_string_of_at_most_two_lines():
    # `--help` prints these; detail belongs in the docs they link to.
    import dataclasses

    from trl import GRPOConfig

    inherited = {f.name for f in dataclasses.fields(GRPOConfig)}
    added = [f for f in dataclasses.fields(CEGPPOConfig) if f.name not in inherited]
    assert {"gppo_beta1", "gppo_beta2", "delta_low", "left_drift_warning"} <= {f.name for f in added}
    too_long = {f.name: len(f.metadata["help"]) for f in added if len(f.metadata.get("help", "")) > 2 * 119}
    assert not too_long, too_long
    assert all(f.metadata.get("help") for f in added)


def test_on_policy_message_only_for_a_cegppo_loss_with_one_optimizer_step_per_rollout_batch(tmp_path):
    # gradient_accumulation_steps 2 is a multiple of steps_per_generation 2 x num_iterations 1: on-policy.
    on_policy = make(tmp_path, gradient_accumulation_steps=2, steps_per_generation=2)
    message = on_policy_message(on_policy)
    assert message.startswith("CE-GPPO is identical to GRPO with this configuration")
    assert "(gradient_accumulation_steps=2 is a multiple of steps_per_generation=2 x num_iterations=1)" in message
    assert "vLLM" not in message and "vLLM importance-sampling correction" in on_policy_message(on_policy, True)
    assert (
        on_policy_message(make(tmp_path, gradient_accumulation_steps=2, steps_per_generation=2, num_iterations=2))
        is None
    )
    assert on_policy_message(make(tmp_path, gradient_accumulation_steps=2, steps_per_generation=4)) is None
    assert on_policy_message(make(tmp_path, loss_type="cispo", epsilon_high=5.0)) is None  # TRL's objective


def test_preflight_gives_the_trainers_on_policy_message(tmp_path):
    from cegppo_trl.preflight import Report, inspect_batch_layout

    args = make(tmp_path, gradient_accumulation_steps=2, steps_per_generation=2)
    report = Report()
    inspect_batch_layout(report, args, 1)
    assert [f.message for f in report.warnings if f.code == "on_policy"] == [on_policy_message(args)]
