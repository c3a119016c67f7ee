"""`CEGPPOTrainer(...)` refuses nothing `GRPOTrainer` trains: each case the pre-flight used to refuse at
construction, or refused where TRL refuses in other words, runs through both trainers with the same script
(`test_drop_in.run_script`, CE-GPPO at beta1 = beta2 = 0) and must end alike: both train the same number of steps, or
both raise the same exception type with the same message."""

from __future__ import annotations

import json
import logging

import pytest
from datasets import Dataset
from test_drop_in import PAIR, differential, run_script, spread_reward
from trl import GRPOConfig, GRPOTrainer

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama


def assert_same_acceptance(grpo, cegppo, steps: int | None = None) -> None:
    """Both trained (the same number of optimizer steps), or both raised the same exception with the same words."""
    assert (cegppo.error, cegppo.message) == (grpo.error, grpo.message), (grpo.message, cegppo.message)
    if grpo.error is None:
        assert cegppo.trainer.state.global_step == grpo.trainer.state.global_step
        assert steps is None or grpo.trainer.state.global_step == steps


# ----------------------------------------------------------------------------------------------------------------
# Inputs the pre-flight refused and TRL trains
# ----------------------------------------------------------------------------------------------------------------
def rollout_with_a_hint(prompts, trainer):
    """TRL's `rollout_func`: fixed completions and an extra field (`hint`) that TRL hands the rewards."""
    tokenizer = trainer.processing_class
    prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    completion_ids = [tokenizer(str(i % 3) * (1 + i % 4), add_special_tokens=False)["input_ids"] for i in
                      range(len(prompts))]  # fmt: skip
    return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
            "logprobs": [[-1.0] * len(c) for c in completion_ids], "hint": ["1"] * len(prompts)}  # fmt: skip


def hint_reward(completions, hint, **kwargs):
    return [float(c.count(h)) for c, h in zip(completions, hint, strict=True)]


def test_a_rollout_func_field_that_a_reward_takes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    grpo, cegppo = differential(
        tmp_path, reward_funcs=hint_reward, trainer_kwargs=dict(rollout_func=rollout_with_a_hint)
    )
    assert grpo.error is None, grpo.message  # was: "Reward `hint_reward` needs the dataset column(s) ['hint']"
    assert_same_acceptance(grpo, cegppo, steps=2)


def test_a_chat_prompt_with_an_empty_user_message_under_a_template_that_renders_a_header(tmp_path):
    tokenizer = build_char_tokenizer()
    tokenizer.chat_template = ("{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
                               "{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}")  # fmt: skip
    data = Dataset.from_dict({"prompt": [[{"role": "user", "content": "" if i % 2 else f"{i}+1="}] for i in range(8)]})
    grpo, cegppo = differential(tmp_path, train_dataset=data, processing_class=tokenizer)
    assert_same_acceptance(grpo, cegppo, steps=2)  # was: "the prompt holds only empty messages"


class RewardWithAnAttribute:
    """A reward object that happens to carry a `required_columns` attribute naming a column the data lacks."""

    __name__ = "reward_with_an_attribute"
    required_columns = ["answer"]

    def __call__(self, completions, **kwargs):
        return spread_reward(completions)


def test_a_reward_object_that_carries_a_required_columns_attribute(tmp_path):
    grpo, cegppo = differential(tmp_path, reward_funcs=RewardWithAnAttribute())
    assert_same_acceptance(grpo, cegppo, steps=2)  # was: "needs the dataset column(s) ['answer']"


# ----------------------------------------------------------------------------------------------------------------
# Config values TRL trains on
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "setting",
    [dict(epsilon=1.0), dict(epsilon_high=1.5, loss_type="grpo"), dict(delta=1.1), dict(max_steps=0),
     dict(beta=-0.1, model="path")],
    ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()),
)  # fmt: skip
def test_config_values_trl_trains_on_are_trained(tmp_path, setting, model_dir):
    setting = {**setting, "model": model_dir} if "model" in setting else setting  # KL: TRL loads the reference
    grpo, cegppo = differential(tmp_path, **setting)
    assert grpo.error is None, grpo.message
    assert_same_acceptance(grpo, cegppo)


def test_an_epsilon_that_empties_the_left_region_warns_in_one_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        grpo, cegppo = differential(tmp_path, script=(), epsilon=1.0)
    assert grpo.error is None and cegppo.error is None
    lines = [r.getMessage() for r in caplog.records if "`epsilon=1` >= 1" in r.getMessage()]  # CE-GPPO's only
    assert len(lines) == 1 and "\n" not in lines[0] and "`gppo_beta1` has no effect" in lines[0]


def test_a_grpo_config_as_args_is_converted_with_one_line(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        grpo, cegppo = (run_script(trainer, GRPOConfig, tmp_path) for trainer, _ in PAIR)
    assert_same_acceptance(grpo, cegppo, steps=2)
    assert type(cegppo.trainer.args) is CEGPPOConfig and cegppo.trainer.args.gppo_beta1 == 0.5  # CE-GPPO's defaults
    assert cegppo.trainer.args.steps_per_generation == grpo.trainer.args.steps_per_generation == 2
    said = [r.getMessage() for r in caplog.records if "`args` is a `GRPOConfig`" in r.getMessage()]
    assert len(said) == 1 and "converted to a `CEGPPOConfig`" in said[0]


# ----------------------------------------------------------------------------------------------------------------
# Where TRL refuses, its words (the two cases TRL's own test module caught)
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def remote_code_model(tmp_path_factory) -> str:
    """A model folder whose config names custom code (`auto_map`), as the Hub's `tiny-RemoteForCausalLM`."""
    path = tmp_path_factory.mktemp("remote")
    tokenizer = build_char_tokenizer()
    build_tiny_llama(tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "modeling_remote.py").write_text(
        "from transformers import LlamaConfig, LlamaForCausalLM\n"
        "class RemoteConfig(LlamaConfig):\n    model_type = 'remote'\n"
        "class RemoteForCausalLM(LlamaForCausalLM):\n    config_class = RemoteConfig\n"
    )
    config = json.loads((path / "config.json").read_text())
    config.update(model_type="remote", architectures=["RemoteForCausalLM"], auto_map={
        "AutoConfig": "modeling_remote.RemoteConfig", "AutoModelForCausalLM": "modeling_remote.RemoteForCausalLM"})  # fmt: skip
    (path / "config.json").write_text(json.dumps(config))
    return str(path)


def test_custom_code_without_trust_remote_code_is_trls_value_error(tmp_path, remote_code_model, monkeypatch):
    """TRL's own test (`test_trust_remote_code`): refused in transformers' words, trained with the flag."""
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO(""))  # transformers asks, on a terminal
    data = Dataset.from_dict({"prompt": ["1+1="] * 8})
    outcomes = []
    for trainer_cls, config_cls in PAIR:
        for trust in (False, True):
            args = config_cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", trust_remote_code=trust,
                              per_device_train_batch_size=4, num_generations=4)  # fmt: skip
            try:
                trainer = trainer_cls(remote_code_model, spread_reward, args=args, train_dataset=data)
                outcomes.append(type(trainer.model).__name__)
            except Exception as error:  # the outcome compared below
                outcomes.append((type(error), str(error)))
    grpo, cegppo = outcomes[:2], outcomes[2:]
    assert grpo[0][0] is ValueError and "trust_remote_code=True" in grpo[0][1]  # was: OSError from the pre-flight
    assert grpo[1] == "RemoteForCausalLM" and cegppo == grpo


def test_liger_with_a_lora_on_lm_head_is_trls_value_error(tmp_path):
    pytest.importorskip("peft")
    from peft import LoraConfig

    outcomes = [run_script(t, c, tmp_path, script=(), use_liger_kernel=True, trainer_kwargs=dict(
        peft_config=LoraConfig(r=4, target_modules=["q_proj", "lm_head"], task_type="CAUSAL_LM"))) for t, c in PAIR]  # fmt: skip
    grpo, cegppo = outcomes
    assert grpo.error is ValueError and "lm_head" in grpo.message  # was: ImportError for liger-kernel
    assert_same_acceptance(grpo, cegppo)


def test_a_dataset_without_prompts_fails_as_in_trl(tmp_path):
    """An already-tokenized dataset: both trainers build, and both fail at the first batch with TRL's `KeyError`."""
    tokenized = Dataset.from_dict({"input_ids": [[5, 6, 7]] * 8})
    grpo, cegppo = differential(tmp_path, train_dataset=tokenized)
    assert grpo.trainer is not None and grpo.error is KeyError
    assert cegppo.trainer is not None
    assert_same_acceptance(grpo, cegppo)


# ----------------------------------------------------------------------------------------------------------------
# The zero-signal stop counts every term of the loss (a constant reward: no reward spread in any group)
# ----------------------------------------------------------------------------------------------------------------
def constant_reward(completions, **kwargs):
    return [1.0] * len(completions)


@pytest.mark.parametrize(
    "term", [dict(entropy_coef=0.05), dict(beta=0.1), dict(sft_loss_coef=0.1)], ids=lambda t: next(iter(t))
)
def test_a_constant_reward_with_another_loss_term_is_not_a_zero_signal_stop(tmp_path, term, model_dir):
    """The term has a gradient, so the run learns: it trains to the end as GRPOTrainer does (the SFT term is
    CE-GPPO's: GRPOTrainer runs without it)."""
    trl_term = {} if "sft_loss_coef" in term else term
    grpo = run_script(GRPOTrainer, GRPOConfig, tmp_path, model=model_dir, reward_funcs=constant_reward, **trl_term)
    cegppo = run_script(CEGPPOTrainer, CEGPPOConfig, tmp_path, model=model_dir, reward_funcs=constant_reward,
                        max_zero_signal_batches=1, **term)  # fmt: skip
    assert grpo.error is None and cegppo.error is None, cegppo.message
    assert cegppo.trainer.state.global_step == grpo.trainer.state.global_step == 2
    assert cegppo.trainer.stop_reason is None and cegppo.trainer.reward_monitor.learned


def test_a_constant_reward_and_no_other_term_is_still_a_zero_signal_stop(tmp_path):
    cegppo = run_script(CEGPPOTrainer, CEGPPOConfig, tmp_path, reward_funcs=constant_reward, max_zero_signal_batches=1)
    assert cegppo.error is None and cegppo.trainer.stop_reason == "zero_signal"


def test_an_sft_term_that_selects_no_completion_gives_no_signal(tmp_path):
    """A constant reward of 0: no completion is positive, so the SFT term trains nothing either."""
    zero = lambda completions, **kw: [0.0] * len(completions)  # noqa: E731
    cegppo = run_script(CEGPPOTrainer, CEGPPOConfig, tmp_path, reward_funcs=zero, max_zero_signal_batches=1,
                        sft_loss_coef=0.1)  # fmt: skip
    assert cegppo.error is None and cegppo.trainer.stop_reason == "zero_signal"


# ----------------------------------------------------------------------------------------------------------------
# An infinite reward: TRL trains on (that group's advantages become 0); CE-GPPO trains alike and says so once
# ----------------------------------------------------------------------------------------------------------------
def one_infinite_reward(completions, **kwargs):
    return [float("inf") if i == 0 else float(i % 3) for i in range(len(completions))]


def test_an_infinite_reward_trains_as_in_trl_and_warns_once(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        grpo, cegppo = differential(tmp_path, reward_funcs=one_infinite_reward, max_steps=4)
    assert_same_acceptance(grpo, cegppo, steps=4)
    said = [r.getMessage() for r in caplog.records if "returned an infinite score" in r.getMessage()]
    assert len(said) == 1 and "one_infinite_reward" in said[0] and "TRL sets to 0" in said[0]
    assert cegppo.trainer.stop_reason is None  # the other groups have spread: the run learns


# ----------------------------------------------------------------------------------------------------------------
# What `cegppo check` now refuses before the model loads, the trainers refuse alike, later, in the host's words
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("setting", "words"),
    [(dict(learning_rate=-1.0), "Invalid learning rate: -1.0"),
     (dict(temperature=0.0), "has to be a strictly positive float"),
     (dict(reward_weights=[1.0, 2.0]), "Number of reward weights (2) must match number of reward functions (1)")],
    ids=["learning_rate", "temperature", "reward_weights"],
)  # fmt: skip
def test_what_check_refuses_early_both_trainers_refuse_in_the_same_words(tmp_path, setting, words):
    grpo, cegppo = differential(tmp_path, **setting)
    assert grpo.error is ValueError and words in grpo.message, grpo.message
    assert_same_acceptance(grpo, cegppo)


def test_the_entropy_mask_hook_works_on_a_stand_in_trainer_as_trls_does():
    """TRL's own test module calls `GRPOTrainer.get_high_entropy_mask` on a `Mock(spec=GRPOTrainer)`: the override
    must give TRL's mask there too."""
    from unittest.mock import Mock

    import torch

    entropies = torch.tensor([[0.1, 0.9, 0.5, 0.7], [0.3, 0.2, 0.8, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    masks = []
    for trainer_cls, _ in PAIR:
        stand_in = Mock(spec=trainer_cls)
        stand_in.accelerator = Mock(num_processes=1, gather=lambda x: x)
        stand_in.accelerator.pad_across_processes = lambda x, dim, pad_index: x
        masks.append(trainer_cls.get_high_entropy_mask(stand_in, entropies, mask, 0.5))
    assert torch.equal(masks[0], masks[1])
