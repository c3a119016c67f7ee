"""The training script's checks before the model loads: rewards against the prepared data, chat template, CPU dtype,
streaming, and the wording of the schedule / eval-split / system-prompt messages.

Each refusal is asserted to come before `CEGPPOTrainer` is built (the model would load there).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cegppo_trl import CEGPPOConfig
from cegppo_trl.scripts import CEGPPOScriptArguments, load_any_dataset, parse_args, prepare_dataset
from cegppo_trl.scripts import main as train

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "examples" / "recipes" / "cpu_smoke.yaml"


def _save_tiny_model(path: Path, chat_template: bool = True) -> str:
    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    build_tiny_llama(tokenizer, seed=0).save_pretrained(path)
    if not chat_template:  # a base model: transformers saves no chat_template.jinja
        tokenizer.chat_template = None
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture(scope="module")
def base_model_dir(tmp_path_factory) -> str:
    return _save_tiny_model(tmp_path_factory.mktemp("tiny-base"), chat_template=False)


def _write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(scope="module")
def gsm8k_file(tmp_path_factory) -> str:
    """GSM8K's layout: `question` and `answer` (worked solution ending in `#### N`), no `solution` column."""
    rows = [{"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(8)]
    return _write_jsonl(tmp_path_factory.mktemp("gsm8k") / "gsm8k.jsonl", rows)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> str:
    rows = [{"prompt": f"{i}+{i % 5}=", "solution": str(i + i % 5)} for i in range(8)]
    return _write_jsonl(tmp_path_factory.mktemp("data") / "add.jsonl", rows)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if the script gets as far as building the trainer (which loads the model)."""
    from cegppo_trl.trainer import CEGPPOTrainer

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check refused")

    monkeypatch.setattr(CEGPPOTrainer, "__init__", refuse)


def smoke_args(model_dir, data_file, output_dir, *extra):
    return parse_args(
        ["--config", str(SMOKE), "--model_name_or_path", model_dir, "--dataset_name", data_file,
         "--output_dir", str(output_dir), "--max_steps", "2", *extra]
    )  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Item 5: a reward that needs a reference is refused before the model loads when the data has none
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reward", ["math_verify", "gsm8k", "accuracy_reward"])
def test_reward_needing_a_reference_without_one_is_refused_before_the_model_loads(
    reward, model_dir, gsm8k_file, tmp_path, no_model_load
):
    pytest.importorskip("math_verify")
    args = smoke_args(model_dir, gsm8k_file, tmp_path, "--prompt_column", "question", "--solution_column", "none",
                      "--reward_funcs", reward)  # fmt: skip
    with pytest.raises(ValueError, match=rf"Reward `{reward}` .*`solution` column.*`--solution_column answer`"):
        train(*args)


def test_reference_free_reward_without_a_reference_passes_the_check(model_dir, gsm8k_file, tmp_path, no_model_load):
    args = smoke_args(model_dir, gsm8k_file, tmp_path, "--prompt_column", "question", "--solution_column", "none",
                      "--reward_funcs", "format")  # fmt: skip
    with pytest.raises(AssertionError, match="the model was loaded"):  # got past every check to the trainer
        train(*args)


def test_a_custom_reward_is_checked_against_its_signature(model_dir, data_file, tmp_path, no_model_load):
    # `tests/helpers` is on sys.path (conftest imports from it); the reward declares a `difficulty` column
    args = smoke_args(model_dir, data_file, tmp_path, "--reward_funcs", "test_scripts_checks.difficulty_reward")
    with pytest.raises(ValueError, match=r"`test_scripts_checks.difficulty_reward` needs the dataset column\(s\) "
                       r"\['difficulty'\]"):  # fmt: skip
        train(*args)


def difficulty_reward(completions, difficulty, **kwargs):
    return [float(d) for d in difficulty]


def test_trl_reward_on_plain_text_prompts_is_refused(model_dir, data_file, tmp_path, no_model_load):
    # TRL's rewards read completion[0]["content"]: plain-text prompts give string completions, a TypeError there.
    args = smoke_args(model_dir, data_file, tmp_path, "--reward_funcs", "think_format_reward",
                      "--chat_prompts", "false")  # fmt: skip
    with pytest.raises(ValueError, match=r"TRL's think_format_reward reads chat completions.*`--chat_prompts true`"):
        train(*args)


# ----------------------------------------------------------------------------------------------------------------
# Item 9: a base model without a chat template, with the default chat prompts
# ----------------------------------------------------------------------------------------------------------------
def test_base_model_without_chat_template_is_refused_naming_chat_prompts_false(
    base_model_dir, data_file, tmp_path, no_model_load
):
    with pytest.raises(ValueError, match=r"has no chat template \(a base model\).*`--chat_prompts false`"):
        train(*smoke_args(base_model_dir, data_file, tmp_path))
    # with raw-text prompts it gets past every check (to the trainer, which this test stops)
    with pytest.raises(AssertionError, match="the model was loaded"):
        train(*smoke_args(base_model_dir, data_file, tmp_path, "--chat_prompts", "false"))


@pytest.mark.slow
def test_base_model_trains_on_raw_text_with_chat_prompts_false(base_model_dir, data_file, tmp_path):
    trainer = train(*smoke_args(base_model_dir, data_file, tmp_path, "--chat_prompts", "false", "--max_steps", "1"))
    assert trainer.state.global_step == 1


# ----------------------------------------------------------------------------------------------------------------
# Item 17: half-precision weights on a CPU run
# ----------------------------------------------------------------------------------------------------------------
def test_schedule_window_mixing_steps_and_percent_is_refused_naming_its_field():
    with pytest.raises(ValueError, match=r"^`gppo_beta2_schedule`: Invalid beta schedule 'linear:0->1@600-50%': .*mixes "
                       r"steps and percentages"):  # fmt: skip
        CEGPPOConfig(output_dir="/tmp/x", use_cpu=True, max_steps=1000, gppo_beta2_schedule="linear:0->1@600-50%")


def test_eval_split_error_prints_the_strategy_value_not_the_enum(model_dir, data_file, tmp_path, no_model_load):
    args = smoke_args(model_dir, data_file, tmp_path, "--eval_strategy", "steps", "--eval_steps", "2")
    with pytest.raises(ValueError) as error:
        train(*args)
    assert "eval_strategy='steps' but the dataset has no split 'test'" in str(error.value)
    assert "IntervalStrategy" not in str(error.value)


def test_system_prompt_goes_to_prompts_without_their_own_system_message():
    from datasets import Dataset

    own = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "1+1="}]
    data = Dataset.from_dict({"prompt": [own, [{"role": "user", "content": "2+2="}], own]})
    args = CEGPPOScriptArguments(dataset_name="x", system_prompt="Think step by step.", solution_column=None)
    out = prepare_dataset(data, args)
    assert [p[0]["content"] for p in out["prompt"]] == ["Be terse.", "Think step by step.", "Be terse."]


def test_dataset_streaming_streams_local_files_and_saved_datasets(data_file, tmp_path):
    from datasets import Dataset, IterableDataset, IterableDatasetDict

    streamed = load_any_dataset(data_file, streaming=True)
    assert isinstance(streamed, IterableDatasetDict) and isinstance(streamed["train"], IterableDataset)
    assert next(iter(streamed["train"])) == {"prompt": "0+0=", "solution": "0"}
    saved = tmp_path / "saved"
    Dataset.from_dict({"prompt": ["a", "b"]}).save_to_disk(saved)
    streamed = load_any_dataset(str(saved), streaming=True)
    assert isinstance(streamed["train"], IterableDataset) and [r["prompt"] for r in streamed["train"]] == ["a", "b"]
    assert isinstance(load_any_dataset(data_file)["train"], Dataset)  # without the flag, in memory as before
    # A stream has no length: transformers' own refusal (`max_steps` must be set) stands, not re-checked here.


@pytest.mark.slow
def test_dataset_streaming_trains_from_a_local_file(model_dir, data_file, tmp_path):
    trainer = train(*smoke_args(model_dir, data_file, tmp_path, "--dataset_streaming", "true", "--max_steps", "1"))
    assert trainer.state.global_step == 1
