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
        ("sft_loss_coef", -1.0, r"`sft_loss_coef` must be a finite number >= 0"),
        ("delta_low", 0.9, r"`delta_low` \(the left guard\) must be in \(0, 1 - epsilon\]"),
        ("gppo_beta1_schedule", "linear:0->", r"`gppo_beta1_schedule`"),
        ("max_zero_signal_batches", None, r"`max_zero_signal_batches` must be an integer >= 0 \(0 never stops\)"),
        ("max_unscorable_batches", -1, r"`max_unscorable_batches` must be an integer >= 0 \(0 never stops\)"),
    ],
)
def test_invalid_cegppo_values_raise_naming_the_field(tmp_path, field, value, match):
    with pytest.raises(ValueError, match=match):
        make(tmp_path, **{field: value})


def test_a_callable_schedule_in_the_config_is_refused_with_the_trainer_route(tmp_path):
    # The config is pickled into training_args.bin at every save, which a lambda cannot be: refused at construction
    with pytest.raises(ValueError) as error:
        make(tmp_path, gppo_beta2_schedule=lambda step, total: 1.0)
    assert str(error.value) == (
        "`gppo_beta2_schedule` takes a string or a number: it is saved with the run's settings. Give a callable to "
        "the trainer instead: `trainer.beta2_schedule = parse_schedule(fn)` (`cegppo_trl.schedules`)."
    )


# TRL's fields are TRL's: every value `GRPOConfig` takes, `CEGPPOConfig` takes (what TRL refuses later, the trainer
# refuses in TRL's words; tests/test_constructor_drop_in.py runs them through both trainers).
@pytest.mark.parametrize(
    "setting",
    [dict(epsilon=1.0), dict(epsilon=0.0), dict(epsilon_high=1.5, loss_type="grpo"), dict(delta=1.1), dict(delta=0.5),
     dict(max_steps=0), dict(beta=-0.1), dict(num_iterations=0), dict(loss_type="ppo"),
     dict(importance_sampling_level="token_sequence")],
    ids=str,
)  # fmt: skip
def test_trls_fields_take_every_value_grpo_config_takes(tmp_path, setting):
    from trl import GRPOConfig

    GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", **setting)  # TRL takes it
    config = make(tmp_path, **setting)
    assert all(getattr(config, k) == v for k, v in setting.items())


def test_an_epsilon_that_empties_the_left_region_is_named_in_one_line(tmp_path):
    from cegppo_trl.config import vanishing_term_messages

    (message,) = vanishing_term_messages(make(tmp_path, epsilon=1.0))
    assert message.startswith("`epsilon=1` >= 1: the ratio is never below 1 - epsilon <= 0") and "\n" not in message
    assert "`gppo_beta1` has no effect" in message
    assert vanishing_term_messages(make(tmp_path, epsilon_high=1.5)) == []  # the right region is still there
    assert vanishing_term_messages(make(tmp_path, epsilon=1.0, loss_type="cispo")) == []  # TRL's objective


def test_cispo_may_use_a_large_epsilon_high(tmp_path):
    config = make(tmp_path, loss_type="cispo", epsilon_high=5.0)  # TRL's recommended CISPO value
    assert config.epsilon_high == 5.0


def test_zero_betas_are_valid(tmp_path):
    config = make(tmp_path, gppo_beta1=0, gppo_beta2=0)
    assert config.gppo_beta1 == 0


def test_num_generations_below_2_is_refused_by_grpo_config(tmp_path):
    with pytest.raises(ValueError, match="at least 2 generations"):
        CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, num_generations=1, per_device_train_batch_size=1)


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
    assert [f.message for f in report.warnings if f.code == "trainer"] == [on_policy_message(args)]


def test_core_trainer_refuses_research_fields_it_would_ignore(tmp_path):
    from cegppo_trl import CEGPPOTrainer
    from cegppo_trl.research.trainer import ResearchCEGPPOConfig, ResearchCEGPPOTrainer

    kw = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    args = ResearchCEGPPOConfig(**kw, gppo_beta_rule="entropy", log_predictor=True)
    with pytest.raises(ValueError) as error:  # refused before the model loads: the model name is never read
        CEGPPOTrainer("no/such-model", args=args)
    assert str(error.value) == (
        "`ResearchCEGPPOConfig` sets ['gppo_beta_rule', 'log_predictor'], which only `ResearchCEGPPOTrainer` reads: "
        "`CEGPPOTrainer` would ignore them. Use `ResearchCEGPPOTrainer`, or leave them at their defaults."
    )
    controlled = ResearchCEGPPOConfig(**kw, entropy_controller={"target_low": 0.3, "target_high": 0.6})
    with pytest.raises(ValueError, match=r"sets \['entropy_controller'\]"):
        CEGPPOConfig.for_trainer(None, controlled, CEGPPOTrainer)
    # the research trainer reads them (its super().__init__ checks again); at their defaults the core trainer may run
    assert CEGPPOConfig.for_trainer(None, args, ResearchCEGPPOTrainer) is args
    plain = ResearchCEGPPOConfig(**kw)
    assert CEGPPOConfig.for_trainer(None, plain, CEGPPOTrainer) is plain
