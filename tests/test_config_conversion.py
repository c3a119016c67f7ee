"""`CEGPPOConfig.from_grpo_config`: an existing `trl.GRPOConfig` becomes a `CEGPPOConfig` with every field kept."""

from __future__ import annotations

import dataclasses

import pytest
from trl import GRPOConfig

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer


def _fields(tmp_path, **kw) -> dict:
    base = dict(
        output_dir=str(tmp_path), use_cpu=True, report_to="none", learning_rate=3e-6, num_generations=4,
        per_device_train_batch_size=8, loss_type="grpo", beta=0.04, num_iterations=2, hub_token="hf_secret",
        lr_scheduler_type="cosine", max_completion_length=64,
    )  # fmt: skip
    return {**base, **kw}


def _grpo(tmp_path, **kw) -> GRPOConfig:
    return GRPOConfig(**_fields(tmp_path, **kw))


def _grpo_fields() -> list[str]:
    return [f.name for f in dataclasses.fields(GRPOConfig) if f.init]


@pytest.mark.parametrize("layout", [{"steps_per_generation": 4}, {"generation_batch_size": 16}, {}])
def test_from_grpo_config_keeps_every_grpo_field_and_adds_the_cegppo_ones(tmp_path, layout):
    grpo = _grpo(tmp_path, **layout)
    with pytest.raises(ValueError, match="can not be both configured"):  # what the old advice led to
        CEGPPOConfig(**grpo.to_dict())
    config = CEGPPOConfig.from_grpo_config(grpo, gppo_beta1=0.75, delta_low=0.5)
    assert type(config) is CEGPPOConfig
    kept = _grpo_fields()
    assert {n: getattr(config, n) for n in kept} == {n: getattr(grpo, n) for n in kept}  # save_steps 500 too
    assert config.hub_token == "hf_secret"  # not to_dict()'s "<HUB_TOKEN>" mask
    assert (config.gppo_beta1, config.gppo_beta2, config.delta_low) == (0.75, 1.0, 0.5)
    # And back: a CEGPPOConfig converts to itself, CE-GPPO fields included.
    again = CEGPPOConfig.from_grpo_config(config)
    assert {f.name: getattr(again, f.name) for f in dataclasses.fields(CEGPPOConfig) if f.init} == {
        f.name: getattr(config, f.name) for f in dataclasses.fields(CEGPPOConfig) if f.init
    }


def test_save_and_eval_steps_anywhere_in_a_rollout_batch_are_transformers_values(tmp_path):
    # 3 optimizer steps per rollout batch: every checkpoint inside one holds the batch (tests/test_rollout_batch_saves.py)
    layout = dict(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                  num_generations=4, steps_per_generation=3, gradient_accumulation_steps=1)  # fmt: skip
    assert CEGPPOConfig(**layout).save_steps == GRPOConfig(**layout).save_steps == 500
    assert CEGPPOConfig(**layout, save_steps=1).save_steps == 1
    best = dict(save_strategy="best", eval_strategy="steps", eval_steps=1, metric_for_best_model="eval_loss")
    assert CEGPPOConfig(**layout, **best).eval_steps == 1
    assert CEGPPOConfig(**layout, save_steps=4, eval_strategy="steps", eval_steps=2, load_best_model_at_end=True)


def test_from_grpo_config_overrides_the_batch_layout_and_names_unknown_fields(tmp_path):
    grpo = _grpo(tmp_path, steps_per_generation=4)
    config = CEGPPOConfig.from_grpo_config(grpo, generation_batch_size=16)
    assert (config.generation_batch_size, config.steps_per_generation) == (16, 2)
    with pytest.raises(TypeError, match=r"has no field\(s\) \['gppo_beta3'\]"):
        CEGPPOConfig.from_grpo_config(grpo, gppo_beta3=1.0)
    with pytest.raises(ValueError, match="`gppo_beta1` must be a finite number >= 0"):  # CE-GPPO checks still apply
        CEGPPOConfig.from_grpo_config(grpo, gppo_beta1=-1.0)


def test_trainer_given_a_grpo_config_converts_it_as_from_grpo_config_does(tmp_path, tokenizer, prompt_dataset):
    from cegppo_trl.demos.tiny import build_tiny_llama

    grpo = _grpo(tmp_path, beta=0.0)  # no reference model to load (the tiny model has no Hub name)
    trainer = CEGPPOTrainer(model=build_tiny_llama(tokenizer), reward_funcs=lambda completions, **_: [0.0] * len(
        completions), args=grpo, train_dataset=prompt_dataset, processing_class=tokenizer)  # fmt: skip
    converted = CEGPPOConfig.from_grpo_config(grpo)
    assert type(trainer.args) is CEGPPOConfig and trainer.args.to_dict() == converted.to_dict()
    CEGPPOTrainer(
        model=build_tiny_llama(tokenizer), reward_funcs=lambda completions, **_: [0.0] * len(completions),
        args=CEGPPOConfig.from_grpo_config(grpo, gppo_beta1=0.5), train_dataset=prompt_dataset,
        processing_class=tokenizer,
    )  # fmt: skip


def _layout(config) -> tuple[int, int]:
    return config.steps_per_generation, config.generation_batch_size


@pytest.mark.parametrize(
    "source, overrides",
    [
        ({}, dict(gradient_accumulation_steps=4, num_iterations=2)),  # the derived layout follows the new value
        ({}, dict(per_device_train_batch_size=4)),
        ({"gradient_accumulation_steps": 2}, dict(gradient_accumulation_steps=4, per_device_train_batch_size=4)),
        ({"steps_per_generation": 8}, dict(gradient_accumulation_steps=4)),  # a layout that was set stays
        ({"generation_batch_size": 32}, dict(gradient_accumulation_steps=2)),
    ],
)
def test_from_grpo_config_derives_the_rollout_batch_as_a_config_built_with_the_same_fields(
    tmp_path, source, overrides
):
    # `from_grpo_config(GRPOConfig(**source), **overrides)` is `CEGPPOConfig(**source, **overrides)`. It kept the
    # source's derived steps_per_generation=1 (rollout batch 8, on-policy) where the constructor derives 4 (32).
    converted = CEGPPOConfig.from_grpo_config(_grpo(tmp_path, **source), **overrides)
    built = CEGPPOConfig(**_fields(tmp_path, **{**source, **overrides}))
    assert _layout(converted) == _layout(built)
    assert converted.to_dict() == built.to_dict()


def test_from_grpo_config_converts_the_issue_example_to_four_micro_batches_per_rollout_batch(tmp_path):
    config = CEGPPOConfig.from_grpo_config(_grpo(tmp_path, num_iterations=1), gradient_accumulation_steps=4,
                                           num_iterations=2)  # fmt: skip
    assert _layout(config) == (4, 32)  # per_device_train_batch_size 8 x 4 micro-batches, one process


def test_from_grpo_config_asks_which_layout_to_keep_when_the_batch_size_changes_a_set_layout(tmp_path):
    grpo = _grpo(tmp_path, steps_per_generation=4)  # rollout batch 32 = 8 x 4; the source cannot say which was set
    with pytest.raises(ValueError, match=r"Pass one of them .*`steps_per_generation=4`.*`generation_batch_size=32`"):
        CEGPPOConfig.from_grpo_config(grpo, per_device_train_batch_size=4)
    assert _layout(CEGPPOConfig.from_grpo_config(grpo, per_device_train_batch_size=4, steps_per_generation=4)) == (
        4, 16,
    )  # fmt: skip
    assert _layout(CEGPPOConfig.from_grpo_config(grpo, per_device_train_batch_size=4, generation_batch_size=32)) == (
        8, 32,
    )  # fmt: skip
