"""Recipes, accelerate configs, the training script and the `cegppo` CLI (no network; the Hub is never contacted)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from datasets import Dataset, DatasetDict

from cegppo_trl import CEGPPOConfig, cli
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama
from cegppo_trl.research.baselines import method_config
from cegppo_trl.rewards import REWARD_FUNCS
from cegppo_trl.scripts import CEGPPOScriptArguments, load_dataset_dict, parse_args, prepare_dataset

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "examples" / "recipes"
ACCELERATE_CONFIGS = ROOT / "accelerate_configs"
PAPER_1_5B = RECIPES / "cegppo_r1_distill_1.5b.yaml"
GSM8K_0_5B = RECIPES / "gsm8k_qwen2.5_0.5b_lora.yaml"
PAPER_GPUS = 8  # the paper recipes' batch layout is written for one 8-GPU node


def load_recipe(path: Path, *extra: str, tmp_path: Path | None = None):
    # The recipes set bf16: true, which TrainingArguments rejects on a machine without a bf16-capable GPU unless
    # `use_cpu` is set. Overriding `--use_cpu true` keeps bf16 as the recipe wrote it (bf16 autocast is legal on
    # CPU), so the test sees the recipe's own value; `--bf16 false` would hide it.
    output_dir = str(tmp_path or "/tmp/cegppo-recipe-test")
    return parse_args(["--config", str(path), "--output_dir", output_dir, "--use_cpu", "true", *extra])


def raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_recipe_directory_has_the_paper_gsm8k_and_baseline_recipes():
    names = sorted(p.name for p in RECIPES.glob("*.yaml"))
    assert names == [
        "baseline_cispo_r1_distill_1.5b.yaml",
        "baseline_dapo_r1_distill_1.5b.yaml",
        "baseline_grpo_r1_distill_1.5b.yaml",
        "baseline_gspo_r1_distill_1.5b.yaml",
        "cegppo_r1_distill_1.5b.yaml",
        "cegppo_r1_distill_1.5b_switch.yaml",
        "cegppo_r1_distill_7b.yaml",
        "cpu_smoke.yaml",  # a CPU smoke run (tests/test_cli.py runs it), not a training recipe
        "gsm8k_qwen2.5_0.5b_lora.yaml",
        "gsm8k_qwen2.5_1.5b_lora.yaml",
    ]


GPU_RECIPES = sorted(p for p in RECIPES.glob("*.yaml") if p.name != "cpu_smoke.yaml")


@pytest.mark.parametrize("path", GPU_RECIPES, ids=lambda p: p.stem)
def test_every_recipe_parses_into_a_valid_config(path, tmp_path):
    script_args, training_args, model_args = load_recipe(path, tmp_path=tmp_path)
    assert isinstance(training_args, CEGPPOConfig)
    assert model_args.model_name_or_path and script_args.dataset_name
    assert all(name in REWARD_FUNCS for name in script_args.reward_funcs)
    assert training_args.bf16 is True and model_args.dtype == "bfloat16"
    assert training_args.use_vllm is True
    # Off-policy, or CE-GPPO would be GRPO: some optimizer steps must reuse an older rollout batch.
    assert (
        training_args.gradient_accumulation_steps % (training_args.steps_per_generation * training_args.num_iterations)
        != 0
    )


def test_paper_1_5b_recipe_matches_the_papers_setting(tmp_path):
    script_args, args, model_args = load_recipe(PAPER_1_5B, tmp_path=tmp_path)
    assert model_args.model_name_or_path == "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B"
    assert (args.gppo_beta1, args.gppo_beta2) == (0.5, 1.0)
    assert (args.epsilon, args.epsilon_high, args.delta) == (0.2, 0.2, 10.0)
    assert args.loss_type == "dapo" and args.importance_sampling_level == "token"
    assert args.beta == 0.0 and args.entropy_coef == 0.0
    assert args.learning_rate == 1e-6 and args.weight_decay == 0.1 and args.max_grad_norm == 1.0
    assert args.num_generations == 8 and args.temperature == 1.0
    assert args.max_completion_length == 16384
    assert args.sft_loss_coef == 0.1 and args.dynamic_sampling is True
    assert script_args.reward_funcs == ["math_verify"]
    assert script_args.solution_column == "reward_model.ground_truth"


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*r1_distill*.yaml")), ids=lambda p: p.stem)
def test_paper_batch_layout_is_128_prompts_and_8_optimizer_steps_per_rollout_batch_on_8_gpus(path, tmp_path):
    _, args, _ = load_recipe(path, tmp_path=tmp_path)
    per_device = args.per_device_train_batch_size
    rollout_batch = per_device * PAPER_GPUS * args.steps_per_generation
    optimizer_batch = per_device * PAPER_GPUS * args.gradient_accumulation_steps
    assert rollout_batch == 128 * args.num_generations == 1024
    assert optimizer_batch == 16 * args.num_generations == 128
    assert args.steps_per_generation // args.gradient_accumulation_steps == 8


def test_7b_recipe_differs_from_1_5b_only_in_model_beta1_and_memory():
    diff = _differing_keys(raw(PAPER_1_5B), raw(RECIPES / "cegppo_r1_distill_7b.yaml"))
    assert diff == {"model_name_or_path", "gppo_beta1", "vllm_gpu_memory_utilization", "output_dir"}
    assert raw(RECIPES / "cegppo_r1_distill_7b.yaml")["gppo_beta1"] == 0.75


def test_switch_recipe_moves_beta1_from_0_to_half_at_the_papers_step_585_of_1000(tmp_path):
    from cegppo_trl.schedules import parse_schedule

    switch = RECIPES / "cegppo_r1_distill_1.5b_switch.yaml"
    assert _differing_keys(raw(PAPER_1_5B), raw(switch)) == {"gppo_beta1_schedule", "output_dir"}
    _, args, _ = load_recipe(switch, tmp_path=tmp_path)
    schedule = parse_schedule(args.gppo_beta1_schedule)
    steps_per_rollout_batch = args.steps_per_generation // args.gradient_accumulation_steps  # 8
    assert args.max_steps == 1000 * steps_per_rollout_batch
    switch_step = 585 * steps_per_rollout_batch
    assert schedule(switch_step - 1, args.max_steps) == 0.0 and schedule(switch_step, args.max_steps) == 0.5


def _differing_keys(a: dict, b: dict) -> set[str]:
    return {k for k in a.keys() | b.keys() if a.get(k, "<missing>") != b.get(k, "<missing>")}


BASELINE_RECIPES = {
    "baseline_grpo_r1_distill_1.5b.yaml": "grpo",
    "baseline_dapo_r1_distill_1.5b.yaml": "dapo",
    "baseline_cispo_r1_distill_1.5b.yaml": "cispo",
    "baseline_gspo_r1_distill_1.5b.yaml": "gspo",
}


def test_the_cegppo_recipe_is_the_cegppo_method_in_the_authors_recipe(tmp_path):
    _, args, _ = load_recipe(PAPER_1_5B, tmp_path=tmp_path)
    assert {k: getattr(args, k) for k in method_config("cegppo", "authors")} == method_config("cegppo", "authors")


@pytest.mark.parametrize("name", sorted(BASELINE_RECIPES))
def test_baseline_recipe_is_its_method_and_differs_from_cegppo_only_in_the_objective(name, tmp_path):
    # The fields come from `cegppo_trl.research.baselines` (the one map from a method to its settings), with the
    # authors' additions applied to every arm alike; the recipe may differ from the CE-GPPO recipe only where the method does.
    method = BASELINE_RECIPES[name]
    expected = method_config(method, "authors")
    _, args, _ = load_recipe(RECIPES / name, tmp_path=tmp_path)
    assert {k: getattr(args, k) for k in expected} == expected
    cegppo = method_config("cegppo", "authors")
    method_keys = {k for k in expected if expected[k] != cegppo[k]}
    # The left guard is CE-GPPO-only: it scales the beta1 gradient, so it is a no-op at the baselines' beta1 = 0, and
    # it is not defined for CISPO (refused there).
    cegppo_only = {"delta_low", "delta_low_mode"}
    assert _differing_keys(raw(PAPER_1_5B), raw(RECIPES / name)) == method_keys | {"output_dir"} | cegppo_only


@pytest.mark.parametrize("path", sorted(RECIPES.glob("gsm8k_*.yaml")), ids=lambda p: p.stem)
def test_gsm8k_recipes_use_lora_and_one_gpu_batches(path, tmp_path):
    script_args, args, model_args = load_recipe(path, tmp_path=tmp_path)
    assert model_args.model_name_or_path.startswith("Qwen/Qwen2.5-") and model_args.use_peft is True
    assert model_args.lora_target_modules == "all-linear"
    assert (script_args.dataset_name, script_args.dataset_config) == ("openai/gsm8k", "main")
    assert (script_args.prompt_column, script_args.solution_column) == ("question", "answer")
    assert script_args.reward_funcs == ["gsm8k"]
    assert args.world_size == 1 and args.generation_batch_size == 128  # 16 prompts x 8 rollouts on one GPU
    assert args.steps_per_generation // args.gradient_accumulation_steps == 4


def test_flags_override_the_yaml(tmp_path):
    _, args, model_args = load_recipe(
        PAPER_1_5B, "--gppo_beta1", "0.75", "--use_peft", "--lora_r", "8", tmp_path=tmp_path
    )
    assert args.gppo_beta1 == 0.75 and args.gppo_beta2 == 1.0
    assert model_args.use_peft is True and model_args.lora_r == 8


def test_unknown_reward_name_fails_at_parse_time(tmp_path):
    with pytest.raises(ValueError, match="Unknown reward function 'acuracy'"):
        load_recipe(PAPER_1_5B, "--reward_funcs", "acuracy", tmp_path=tmp_path)


def test_solution_column_none_from_a_flag_means_no_reference(tmp_path):
    script_args, _, _ = load_recipe(GSM8K_0_5B, "--solution_column", "none", tmp_path=tmp_path)
    assert script_args.solution_column is None


def test_unknown_yaml_key_is_an_error(tmp_path, capsys):
    bad = tmp_path / "typo.yaml"
    bad.write_text(PAPER_1_5B.read_text() + "\ngppo_beta_1: 0.3\n")
    with pytest.raises(SystemExit) as exit_info:
        load_recipe(bad, tmp_path=tmp_path)
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err  # one line, not TRL's `fail_with_unknown_args` advice
    assert "unknown key(s) in the --config YAML: `gppo_beta_1` (did you mean `gppo_beta1`?)" in err
    assert "fail_with_unknown_args" not in err


# ----------------------------------------------------------------------------------------------------------------
# accelerate configs
# ----------------------------------------------------------------------------------------------------------------
ACCELERATE_EXPECTED = {
    "single_gpu.yaml": ("NO", 1, 1),
    "multi_gpu.yaml": ("MULTI_GPU", 8, 1),
    "fsdp2.yaml": ("FSDP", 8, 1),
    "deepspeed_zero2.yaml": ("DEEPSPEED", 8, 1),
    "deepspeed_zero3.yaml": ("DEEPSPEED", 8, 1),
    "two_nodes.yaml": ("DEEPSPEED", 16, 2),
}


def test_accelerate_config_directory_lists_every_config():
    assert sorted(p.name for p in ACCELERATE_CONFIGS.glob("*.yaml")) == sorted(ACCELERATE_EXPECTED)
    readme = (ACCELERATE_CONFIGS / "README.md").read_text()
    for name in ACCELERATE_EXPECTED:
        assert f"`{name}`" in readme and f"config-path {name.removesuffix('.yaml')}" in readme


@pytest.mark.parametrize("name", sorted(ACCELERATE_EXPECTED))
def test_accelerate_config_parses_with_expected_distribution(name):
    from accelerate.commands.config.config_args import ClusterConfig

    distributed_type, num_processes, num_machines = ACCELERATE_EXPECTED[name]
    config = raw(ACCELERATE_CONFIGS / name)
    assert config["compute_environment"] == "LOCAL_MACHINE"
    assert (config["distributed_type"], config["num_processes"], config["num_machines"]) == (
        distributed_type,
        num_processes,
        num_machines,
    )
    assert config["mixed_precision"] == "bf16"
    # accelerate's own loader accepts it (unknown keys or a wrong structure raise here).
    loaded = ClusterConfig.from_yaml_file(str(ACCELERATE_CONFIGS / name))
    assert str(loaded.distributed_type).endswith(distributed_type)
    if name == "fsdp2.yaml":
        assert config["fsdp_config"]["fsdp_version"] == 2
    if name.startswith("deepspeed_zero"):
        assert config["deepspeed_config"]["zero_stage"] == int(name[-6])


# ----------------------------------------------------------------------------------------------------------------
# Data loading and column mapping
# ----------------------------------------------------------------------------------------------------------------
def test_dataset_loads_from_json_file_and_save_to_disk_directory(tmp_path):
    rows = [{"question": "1+1=", "answer": "#### 2"}, {"question": "2+2=", "answer": "#### 4"}]
    jsonl = tmp_path / "data.jsonl"
    jsonl.write_text("\n".join(json.dumps(r) for r in rows))
    from_file = load_dataset_dict(CEGPPOScriptArguments(dataset_name=str(jsonl)))
    assert from_file["train"]["question"] == ["1+1=", "2+2="]

    Dataset.from_list(rows).save_to_disk(str(tmp_path / "single"))
    assert load_dataset_dict(CEGPPOScriptArguments(dataset_name=str(tmp_path / "single")))["train"].num_rows == 2
    DatasetDict({"train": Dataset.from_list(rows), "test": Dataset.from_list(rows[:1])}).save_to_disk(
        str(tmp_path / "dict")
    )
    loaded = load_dataset_dict(CEGPPOScriptArguments(dataset_name=str(tmp_path / "dict")))
    assert set(loaded) == {"train", "test"}


def test_prepare_dataset_maps_columns_and_applies_template_and_system_prompt():
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": "What is 1+1?"}], "reward_model": {"ground_truth": "2"}}]
    )
    args = CEGPPOScriptArguments(
        dataset_name="x",
        solution_column="reward_model.ground_truth",
        prompt_template="{prompt} Put the answer in \\boxed{}.",
        system_prompt="Be brief.",
    )
    row = prepare_dataset(data, args)[0]
    assert row["prompt"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 1+1? Put the answer in \\boxed{}."},
    ]
    assert row["solution"] == "2"


def test_prepare_dataset_wraps_plain_prompts_for_the_chat_template_unless_disabled():
    data = Dataset.from_list([{"question": "1+1=", "answer": "#### 2"}])
    chat = CEGPPOScriptArguments(dataset_name="x", prompt_column="question", solution_column="answer")
    assert prepare_dataset(data, chat)[0]["prompt"] == [{"role": "user", "content": "1+1="}]
    text = CEGPPOScriptArguments(
        dataset_name="x", prompt_column="question", solution_column="answer", chat_prompts=False
    )
    row = prepare_dataset(data, text)[0]
    assert row["prompt"] == "1+1=" and row["solution"] == "#### 2"


def test_prepare_dataset_names_a_missing_column():
    data = Dataset.from_list([{"question": "1+1=", "answer": "#### 2"}])
    with pytest.raises(ValueError, match=r"`solution_column=gold`: .*pass `--solution_column answer`"):
        prepare_dataset(
            data, CEGPPOScriptArguments(dataset_name="x", prompt_column="question", solution_column="gold")
        )
    assert (
        "solution" not in prepare_dataset(data, CEGPPOScriptArguments(dataset_name="x", prompt_column="question"))[0]
    )


# ----------------------------------------------------------------------------------------------------------------
# End to end: the CLI and the shared training function on a tiny local model (in process, no subprocess)
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture
def tiny_model_dir(tmp_path):
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=0)
    path = tmp_path / "tiny-llama"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


TINY_RUN = [
    "--use_vllm", "false", "--bf16", "false", "--dtype", "float32",
    "--max_steps", "2", "--max_completion_length", "8", "--num_generations", "4",
    "--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "1", "--steps_per_generation", "2",
    "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true", "--warmup_steps", "0",
    "--vllm_max_model_length", "64", "--gradient_checkpointing", "false",
]  # fmt: skip


def test_cli_train_runs_the_paper_recipe_end_to_end_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    import cegppo_trl.scripts

    trainers = []
    shared_main = cegppo_trl.scripts.main
    monkeypatch.setattr(cegppo_trl.scripts, "main", lambda *a: trainers.append(shared_main(*a)) or trainers[-1])
    # verl-format rows, like the authors' dataset: chat-message prompts and a nested reference answer.
    data = tmp_path / "math.jsonl"
    rows = [
        {"prompt": [{"role": "user", "content": f"{i}+{i}="}], "reward_model": {"ground_truth": str(2 * i)}}
        for i in range(8)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    output_dir = tmp_path / "out"
    argv = ["train", "--config", str(PAPER_1_5B), "--model_name_or_path", tiny_model_dir]
    argv += ["--dataset_name", str(data), "--output_dir", str(output_dir), "--use_cpu", "true", *TINY_RUN]
    argv += ["--gppo_beta1", "0.75"]
    # A random tiny model answers no sum right: math_verify gives every completion -1, no step has a learning
    # signal, so the run ends with the "nothing to learn" status, its model saved.
    assert cli.main(argv) == 3
    assert (output_dir / "model.safetensors").exists() and (output_dir / "config.json").exists()
    (trainer,) = trainers
    assert trainer.state.global_step == 2
    assert trainer.args.gppo_beta1 == 0.75 and trainer.args.sft_loss_coef == 0.1  # flag over YAML, YAML over default
    assert trainer.train_dataset[0]["prompt"][-1]["content"].endswith("within \\boxed{}.")  # the recipe's template
    assert trainer.train_dataset[0]["solution"] == "0"  # from reward_model.ground_truth
    assert any("rewards/math_verify/mean" in entry for entry in trainer.state.log_history)


def test_example_script_trains_the_gsm8k_lora_recipe_on_a_tiny_model(tiny_model_dir, tmp_path, monkeypatch):
    import runpy
    import sys

    data = tmp_path / "gsm8k.jsonl"
    data.write_text("\n".join(json.dumps({"question": f"{i}*2=", "answer": f"...\n#### {2 * i}"}) for i in range(8)))
    output_dir = tmp_path / "out"
    argv = ["cegppo.py", "--config", str(GSM8K_0_5B), "--model_name_or_path", tiny_model_dir]
    argv += ["--dataset_name", str(data), "--output_dir", str(output_dir), "--use_cpu", "true", *TINY_RUN]
    argv += ["--lora_target_modules", "q_proj", "v_proj", "--reward_funcs", "gsm8k", "format"]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(ROOT / "examples" / "cegppo.py"), run_name="__main__")
    assert (output_dir / "adapter_model.safetensors").exists()  # --use_peft from the recipe: only the adapter


def test_cli_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "train" in out and "rewards" in out
    assert cli.main(["rewards"]) == 0
    assert "math_verify_01" in capsys.readouterr().out
