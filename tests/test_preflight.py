"""The pre-flight report (`cegppo_trl.preflight`) of `cegppo check` and `cegppo train`: what `cegppo train` would
fail on after the model loads (or never) comes before it, with the field and the fix as a flag; `check` says what it
did not check, and `check` and `train` agree on what it did. `CEGPPOTrainer` never runs it
(tests/test_constructor_drop_in.py, tests/test_layering.py)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from datasets import Dataset

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl import preflight as preflight_module
from cegppo_trl.cli import main as cegppo
from cegppo_trl.preflight import CEGPPOUsageError
from cegppo_trl.rewards import get_reward_func
from cegppo_trl.scripts import main as train
from cegppo_trl.scripts import parse_args

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "examples" / "recipes").glob("*.yaml"))


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def no_model_load(monkeypatch):
    """Fail if anything gets as far as loading the model's weights (TRL's `create_model_from_path`)."""
    import trl.trainer.grpo_trainer as grpo_trainer

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the check refused")

    monkeypatch.setattr(grpo_trainer, "create_model_from_path", refuse)


@pytest.fixture(scope="module")
def verl_file(tmp_path_factory) -> str:
    """The layout of the paper's recipe data: the reference nested as `reward_model.ground_truth`."""
    rows = [{"prompt": f"{i}+2=", "reward_model": {"ground_truth": str(i + 2), "style": "rule"}} for i in range(8)]
    return _jsonl(tmp_path_factory.mktemp("verl") / "verl.jsonl", rows)


@pytest.fixture(scope="module")
def gsm8k_file(tmp_path_factory) -> str:
    rows = [{"question": f"What is {i} + 2?", "answer": f"{i} + 2 = {i + 2}\n#### {i + 2}"} for i in range(8)]
    return _jsonl(tmp_path_factory.mktemp("gsm8k") / "gsm8k.jsonl", rows)


def cli_args(model_dir, data, out, *extra):
    return ["--config", "cpu_smoke", "--model_name_or_path", model_dir, "--dataset_name", data, "--output_dir",
            str(out), *extra]  # fmt: skip


def check(capsys, *argv) -> tuple[int, str]:
    status = cegppo(["check", *argv])
    return status, capsys.readouterr().out


# ----------------------------------------------------------------------------------------------------------------
# The nested reference path: every component is checked (today only the first was)
# ----------------------------------------------------------------------------------------------------------------
def test_a_misspelled_nested_solution_path_is_refused_naming_the_field(model_dir, verl_file, tmp_path, no_model_load):
    args = parse_args(cli_args(model_dir, verl_file, tmp_path, "--reward_funcs", "gsm8k_01",
                               "--solution_column", "reward_model.groundtruth"))  # fmt: skip
    with pytest.raises(ValueError, match=r"`solution_column=reward_model.groundtruth`: `groundtruth` is not a field of "
                       r"`reward_model` \(its fields: ground_truth, style\)\. Did you mean `reward_model.ground_truth`"):  # fmt: skip
        train(*args)


def test_the_correct_nested_path_passes_and_the_reference_scores_top(capsys, model_dir, verl_file, tmp_path):
    status, out = check(capsys, *cli_args(model_dir, verl_file, tmp_path, "--reward_funcs", "gsm8k_01", "format",
                                          "--solution_column", "reward_model.ground_truth"))  # fmt: skip
    assert status == 0, out
    assert "called on 3 completions of real rows: the reference answers score the top score [1.0, 1.0, 1.0]" in (
        " ".join(out.split())
    )
    assert "format (scores 0 to 1): needs the columns (none)" in " ".join(out.split())
    assert "0 error(s)" in out


# ----------------------------------------------------------------------------------------------------------------
# Reference scoring
# ----------------------------------------------------------------------------------------------------------------
def test_a_reference_the_reward_cannot_score_top_is_an_error(capsys, model_dir, verl_file, tmp_path):
    # `reward_model.style` exists ("rule") but is not the answer: gsm8k scores its own reference -1.
    status, out = check(capsys, *cli_args(model_dir, verl_file, tmp_path, "--reward_funcs", "gsm8k",
                                          "--solution_column", "reward_model.style"))  # fmt: skip
    assert status == 1
    out = " ".join(out.split())  # the report wraps to the terminal's width
    assert "ERROR [rewards] Reward `gsm8k` gives the reference answer itself (row 0: solution='rule') the score" in out
    assert "not its top score 1: the reference column does not hold what this reward reads" in out


def test_a_reward_of_yours_is_called_only_when_check_is_asked_to(capsys, model_dir, data_file, tmp_path,
                                                                  monkeypatch):  # fmt: skip
    """No user reward is called before training by default (it may be a judge, a verifier, a counter): `check` reads
    its signature; `--call_rewards` calls it on a rollout batch of real rows, and says so."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent))
    counter = tmp_path / "calls"
    monkeypatch.setenv("REWARD_CALLS_FILE", str(counter))
    argv = cli_args(model_dir, data_file, tmp_path / "out", "--reward_funcs", "test_preflight.own_reference_reward")
    status, out = check(capsys, *argv)
    text = " ".join(out.split())
    assert status == 0 and not counter.exists(), out
    assert "needs the columns solution; receives prompts, completions and solution" in text
    assert "Not checked" in text and "rewards of yours (test_preflight.own_reference_reward): not called" in text
    status, out = check(capsys, "--call_rewards", *argv)
    text = " ".join(out.split())
    assert status == 0 and counter.read_text() == "8\n", out  # one rollout batch: 2 prompts x 4 completions
    assert "called (`--call_rewards`) on 8 completions of real rows: scores" in text
    assert "rewards of yours" not in text


def own_reference_reward(completions, solution, **kwargs):
    import os

    with open(os.environ["REWARD_CALLS_FILE"], "a") as f:  # a side effect: what the check must not cause unasked
        f.write(f"{len(completions)}\n")
    return [float(str(s) in str(c)) for c, s in zip(completions, solution)]


# ----------------------------------------------------------------------------------------------------------------
# The default `solution_column` gives the right advice, and is not needed by reference-free rewards
# ----------------------------------------------------------------------------------------------------------------
def test_default_solution_column_with_question_answer_data_names_the_answer_column(
    model_dir, gsm8k_file, tmp_path, no_model_load
):
    args = parse_args(cli_args(model_dir, gsm8k_file, tmp_path, "--prompt_column", "question",
                               "--reward_funcs", "gsm8k"))  # fmt: skip
    with pytest.raises(
        CEGPPOUsageError, match="Reward `gsm8k` compares with a reference answer.*`--solution_column answer`"
    ):
        train(*args)


def test_default_solution_column_is_not_required_when_no_reward_reads_it(capsys, model_dir, gsm8k_file, tmp_path):
    status, out = check(capsys, *cli_args(model_dir, gsm8k_file, tmp_path, "--prompt_column", "question",
                                          "--reward_funcs", "format"))  # fmt: skip
    assert status == 0, out
    assert "columns: question (str), answer (str), prompt" in out and "solution (" not in out


# ----------------------------------------------------------------------------------------------------------------
# Each late failure, now early: command line
# ----------------------------------------------------------------------------------------------------------------
def test_an_integer_prompt_column_is_refused_naming_the_column(model_dir, tmp_path, no_model_load):
    data = _jsonl(tmp_path / "ints.jsonl", [{"n": i, "text": f"{i}+1=", "solution": str(i + 1)} for i in range(4)])
    args = parse_args(cli_args(model_dir, data, tmp_path / "out", "--prompt_column", "n", "--reward_funcs", "format"))
    with pytest.raises(ValueError, match=r"`prompt_column=n` holds int values \(e.g. 0\).*\(text columns: text"):
        train(*args)


def test_an_output_dir_that_is_a_file_is_refused_before_the_model_loads(model_dir, data_file, tmp_path, no_model_load):
    (tmp_path / "afile").write_text("not a directory")
    args = cli_args(model_dir, data_file, tmp_path / "afile", "--reward_funcs", "format")
    with pytest.raises(CEGPPOUsageError, match=r"`output_dir` .*afile is a file, not a directory"):
        train(*parse_args(args))


@pytest.mark.parametrize("extra", [["--use_vllm", "true"], ["--use_liger_kernel", "true"], ["--report_to", "wandb"]])
def test_optional_packages_are_left_to_the_hosts_and_said_to_be_unchecked(capsys, model_dir, data_file, tmp_path,
                                                                          extra):  # fmt: skip
    """TRL and transformers refuse a missing package when the trainer is built, in their words (the pre-flight's
    own ImportError stood in front of TRL's `lm_head` refusal); the report says it did not check them."""
    status, out = check(capsys, *cli_args(model_dir, data_file, tmp_path, "--reward_funcs", "format", *extra))
    text = " ".join(out.split())
    assert status == 0, out
    assert "optional packages (vLLM, Liger, DeepSpeed), trackers and the Hub" in text


def test_steps_per_generation_not_a_multiple_of_gradient_accumulation_is_reported(
    capsys, model_dir, data_file, tmp_path
):
    status, out = check(capsys, *cli_args(model_dir, data_file, tmp_path, "--gradient_accumulation_steps", "2",
                                          "--steps_per_generation", "3", "--per_device_train_batch_size", "4"))  # fmt: skip
    text = " ".join(out.split())
    assert status == 0
    assert "WARNING [batch] `steps_per_generation=3` is not a multiple of `gradient_accumulation_steps=2`" in text
    assert "optimizer steps per rollout batch: 1.5" in text


def test_on_policy_layout_is_reported_as_a_no_op(capsys, model_dir, data_file, tmp_path):
    status, out = check(capsys, *cli_args(model_dir, data_file, tmp_path, "--steps_per_generation", "1"))
    assert status == 0
    assert "on-policy: the ratio is 1 at every step, so CE-GPPO is identical to GRPO" in " ".join(out.split())


def test_output_dir_with_checkpoints_is_reported(capsys, model_dir, data_file, tmp_path):
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-10").mkdir()
    status, out = check(capsys, *cli_args(model_dir, data_file, tmp_path))
    assert f"{tmp_path}: holds checkpoints (checkpoint-2, checkpoint-10)" in " ".join(out.split())


def test_what_the_hosts_refuse_clearly_is_left_to_them(tmp_path, tokenizer):
    """The LoRA targets (PEFT), the number of reward weights (TRL): not re-checked, so the exception a script
    catches is the host's own (PEFT's `ValueError` subclass, not a plain `ValueError`)."""
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    from cegppo_trl.demos.tiny import build_tiny_llama

    data = Dataset.from_dict({"prompt": ["1+1="] * 4})
    caught = []
    for trainer_cls, config_cls in ((GRPOTrainer, GRPOConfig), (CEGPPOTrainer, CEGPPOConfig)):
        args = config_cls(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                          num_generations=4, max_completion_length=8)  # fmt: skip
        for kwargs in (dict(peft_config=LoraConfig(target_modules=["qkv"])), dict(reward_weights=[1.0, 2.0])):
            args.reward_weights = kwargs.pop("reward_weights", None)
            try:
                trainer_cls(build_tiny_llama(tokenizer, seed=0), get_reward_func("format"), args=args,
                            train_dataset=data, processing_class=tokenizer, **kwargs)  # fmt: skip
            except Exception as error:
                caught.append((trainer_cls.__name__, type(error), str(error)[:40]))
    grpo, cegppo = caught[:2], caught[2:]
    assert [c[1:] for c in grpo] == [c[1:] for c in cegppo] and len(grpo) == 2, caught
    assert grpo[0][1] is not ValueError and issubclass(grpo[0][1], ValueError)  # PEFT's own subclass


def test_run_checks_from_python_gives_the_command_lines_report(model_dir):
    """From Python, `run_checks(...)` is the report `cegppo check` prints (a user asked for it: the trainer does not)."""
    from cegppo_trl.preflight import run_checks

    def needs_difficulty(completions, difficulty, **kwargs):
        return [0.0 for _ in completions]

    args = CEGPPOConfig(output_dir="unused-out", use_cpu=True, report_to="none", per_device_train_batch_size=4,
                        num_generations=4, max_completion_length=8)  # fmt: skip
    report = run_checks(Dataset.from_dict({"prompt": ["a"], "dificulty": [1]}), [needs_difficulty], args)
    assert len(report.errors) == 1
    assert re.search(r"needs the dataset column\(s\) \['difficulty'\].* Did you mean `dificulty` for `difficulty`\?",
                     report.errors[0].message)  # fmt: skip
    with pytest.raises(ValueError, match="needs the dataset column"):
        report.raise_errors()


# ----------------------------------------------------------------------------------------------------------------
# `cegppo check` on every shipped recipe, with a tiny local model and local data in the recipe's layout
# ----------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_cegppo_check_on_each_shipped_recipe_prints_a_readable_report(capsys, recipe, model_dir, tmp_path):
    raw = yaml.safe_load(recipe.read_text())
    prompt, solution = raw.get("prompt_column", "prompt"), raw.get("solution_column", "solution")
    rows = []
    for i in range(4):
        row = {prompt: f"What is {i} + 2?"}
        if solution:  # the reference in the recipe's layout (a dotted path is a nested field)
            *parents, leaf = solution.split(".")
            node = row
            for key in parents:
                node = node.setdefault(key, {})
            node[leaf] = f"{i} + 2 = {i + 2}\n#### {i + 2}" if "gsm8k" in raw.get("reward_funcs", []) else str(i + 2)
        rows.append(row)
    data = _jsonl(tmp_path / "data.jsonl", rows)
    status, out = check(capsys, "--config", str(recipe), "--model_name_or_path", model_dir, "--dataset_name", data,
                        "--output_dir", str(tmp_path / "out"), "--use_cpu", "true")  # fmt: skip
    for title in ("Model", "Dataset (as the trainer sees it)", "Prompts (as the model gets them)", "Rewards",
                  "Batch layout", "Output directory", "Not checked"):  # fmt: skip
        assert f"\n{title}" in "\n" + out, out
    assert "the reference answers score the top score" in " ".join(out.split()) or "needs the columns (none)" in out
    assert [line for line in out.splitlines() if line.startswith("ERROR")] == [] and status == 0, out


# ----------------------------------------------------------------------------------------------------------------
# `check` and `train` agree: each refusal is in the report (`check` exits 1) and is `train`'s one line (exit 2),
# before the model loads
# ----------------------------------------------------------------------------------------------------------------
def _rows_file(tmp_path, prompts) -> str:
    return _jsonl(tmp_path / "rows.jsonl", [{"prompt": p, "solution": "1"} for p in prompts])


def _weightless_model(model_dir, tmp_path) -> str:
    """A model folder whose weights file is missing (a copy cut short): config and tokenizer only."""
    import shutil

    folder = tmp_path / "no-weights"
    shutil.copytree(model_dir, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    return str(folder)


REFUSALS = {
    # `check` said "ready to train" where `train` refused (or failed after the model loaded)
    "batch_size_0": (["--per_device_train_batch_size", "0"], None,
                     r"`per_device_train_batch_size=0`: must be at least 1 .* `--per_device_train_batch_size 1`"),
    "learning_rate_0": (["--learning_rate", "0"], None, r"`learning_rate=0`: the optimizer would leave the weights "
                        r"as they are.*`--learning_rate 1e-6`"),  # trained to the end, exit 0, weights unchanged
    "output_dir_a_file": (["--output_dir", "FILE"], None, r"`output_dir` .*afile is a file, not a directory"),
    "model_folder_typo": (["--model_name_or_path", "tiny-modle"], None,
                          r"`model_name_or_path`: no model at .*tiny-modle \('tiny-modle' is not a local directory, "
                          r"and not a Hub id of the form `owner/name`\)"),
    "grad_accum_0": (["--gradient_accumulation_steps", "0", "--steps_per_generation", "1"], None,
                     r"`gradient_accumulation_steps=0`: must be at least 1"),
    "reward_weight_nan": (["--reward_funcs", "format", "gsm8k", "--reward_weights", "nan", "1.0"], None,
                          r"`reward_weights` \[nan, 1\.0\] holds a value that is not finite.*"
                          r"`--reward_weights 1\.0 1\.0`"),
    "resume_typo": (["--resume_from_checkpoint", "lats"], None, r"Can't find a valid checkpoint at lats"),  # theirs
    "prompt_none": (["--dataset_name", "ROWS:none"], None,
                    r"`train_dataset` row 2: the prompt is None \(all 4 rows checked\)"),
    "prompt_empty": (["--dataset_name", "ROWS:empty", "--chat_prompts", "false"], None,
                     r"`train_dataset` row 2: the prompt is empty"),  # as text (a chat template may add a header)
    "chat_key_typo": (["--dataset_name", "ROWS:rol"], None,
                      r"`train_dataset` row 1: the prompt message 0 is with the keys \['content', 'rol'\], not a "
                      r"\{'role': \.\.\., 'content': \.\.\.\} record"),
    # each was "ready to train" in `check` and a failure in `train`
    "model_without_weights": (["--model_name_or_path", "NOWEIGHTS"], None,
                              r"no file named model.safetensors or pytorch_model.bin .* found in directory"),
    "data_file_missing": (["--dataset_name", "data/nonexistent.jsonl"], None, r"data/nonexistent.jsonl"),  # datasets'
}  # fmt: skip
ROW_PROMPTS = {
    "none": ["1+1=", "2+2=", None, "3+3="],
    "empty": ["1+1=", "2+2=", "  ", "3+3="],
    "rol": [[{"role": "user", "content": "1+1="}], [{"rol": "user", "content": "2+2="}]],
}


def _check_then_train(capsys, argv) -> tuple[int, str, int, str]:
    status = cegppo(["check", *argv])
    out = " ".join(capsys.readouterr().out.split())
    train_status = cegppo(["train", *argv])
    return status, out, train_status, capsys.readouterr().err


@pytest.mark.parametrize("case", list(REFUSALS))
def test_check_and_train_give_the_same_verdict(
    capsys, model_dir, data_file, tmp_path, monkeypatch, no_model_load, case
):
    extra, setup, message = REFUSALS[case]
    (tmp_path / "afile").write_text("not a directory")
    swap = {"FILE": str(tmp_path / "afile"), "NOWEIGHTS": "NOWEIGHTS"}
    extra = [swap.get(e, e) for e in extra]
    extra = [_weightless_model(model_dir, tmp_path) if e == "NOWEIGHTS" else e for e in extra]
    extra = [_rows_file(tmp_path, ROW_PROMPTS[e[5:]]) if e.startswith("ROWS:") else e for e in extra]
    monkeypatch.chdir(tmp_path)  # `tiny-modle` is looked up here
    if setup is not None:
        setup(monkeypatch, tmp_path)
    argv = cli_args(model_dir, data_file, tmp_path / "out", "--reward_funcs", "format", *extra)
    status, out, train_status, err = _check_then_train(capsys, argv)
    assert status == 1 and "1 error(s)" in out, out
    assert re.search(message, out), out
    lines = [line for line in err.splitlines() if line.startswith("cegppo train: error: ")]
    assert train_status == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert re.search(message, lines[0]), lines[0]


def test_check_plans_the_resume_as_train_does_a_requeue_before_the_first_checkpoint_starts_fresh(
    capsys, model_dir, data_file, tmp_path
):
    out = tmp_path / "out"
    argv = cli_args(model_dir, data_file, out, "--reward_funcs", "format", "--resume_from_checkpoint", "last")
    status, text = check(capsys, *argv)  # `last` before any checkpoint: a requeued command line's first launch
    assert status == 0 and "holds no committed checkpoint: a fresh start" in " ".join(text.split()), text
    status, text = check(capsys, *argv[:-2], "--resume_from_checkpoint", str(out / "checkpoint-2"))  # not there
    assert status == 1 and "Can't find a valid checkpoint at" in " ".join(text.split()), text


# Rewards whose behaviour only a call shows: `check` calls no reward of yours unless asked (`--call_rewards`), so
# by default it says "not called"; asked, its verdict is `train`'s: a failure at the first batch (TRL's error), or
# a run that learns nothing (exit 3, or 4 when no completion got a reward).
def raising_reward(completions, **kwargs):
    raise KeyError("score")


def string_reward(completions, **kwargs):
    return ["good" for _ in completions]


def three_rewards(completions, **kwargs):
    return [1.0, 0.0, 1.0]


def some_infinite_reward(completions, **kwargs):
    return [float("inf") if i == 0 else 1.0 for i in range(len(completions))]


def none_reward(completions, **kwargs):
    return [None for _ in completions]


def nan_reward(completions, **kwargs):
    return [float("nan") for _ in completions]


CALLED = {  # reward: (what `check --call_rewards` says, what `train` does: an exception type or an exit status)
    "raising_reward": (r"Reward `test_preflight.raising_reward`, called \(`--call_rewards`\) on 8 completions of "
                       r"real rows, failed: KeyError: 'score'", 5),  # was exit 1 and a raw traceback
    "string_reward": (r"Reward `test_preflight.string_reward`, called .*failed: ValueError: could not convert "
                      r"string to float: 'good'", ValueError),
    "three_rewards": (r"Reward `test_preflight.three_rewards`, called .*returned 3 value\(s\) for 8 completions",
                      ValueError),
    "some_infinite_reward": (r"WARNING \[rewards\] Reward `test_preflight.some_infinite_reward`, called .*returned "
                             r"an infinite score", 3),  # a warning in both (train's at its first batch), then exit 3
    "none_reward": (r"Reward `test_preflight.none_reward`, called .*returned no score \(None or NaN\)", 4),
    "nan_reward": (r"Reward `test_preflight.nan_reward`, called .*returned no score \(None or NaN\)", 4),
}  # fmt: skip


@pytest.mark.parametrize(
    "reward",
    [pytest.param(r, marks=() if r in ("three_rewards", "raising_reward") else pytest.mark.slow) for r in CALLED],
)
def test_check_with_call_rewards_and_train_give_the_same_verdict(capsys, caplog, model_dir, data_file, tmp_path,
                                                                 monkeypatch, reward):  # fmt: skip
    monkeypatch.syspath_prepend(str(Path(__file__).parent))  # `test_preflight.<reward>` importable
    message, outcome = CALLED[reward]
    argv = cli_args(model_dir, data_file, tmp_path / "out", "--reward_funcs", f"test_preflight.{reward}")
    assert cegppo(["check", *argv]) == 0  # not called by default, and it says so
    assert f"rewards of yours (test_preflight.{reward}): not called" in " ".join(capsys.readouterr().out.split())
    warns = reward == "some_infinite_reward"
    assert cegppo(["check", "--call_rewards", *argv]) == (0 if warns else 1)
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(message, out), out
    if outcome == 5:  # a documented status, one line naming the reward, no traceback
        assert cegppo(["train", *argv]) == 5
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.startswith("cegppo train: error: ")]
        assert lines == [f"cegppo train: error: Reward `test_preflight.{reward}` raised KeyError: 'score'"], err
        assert "Traceback" not in err
    elif isinstance(outcome, int):
        with caplog.at_level("WARNING"):
            assert cegppo(["train", *argv]) == outcome
        assert "No optimizer step of this run had a learning signal" in capsys.readouterr().err or outcome == 4
        assert not warns or "returned an infinite score for" in caplog.text
    else:  # TRL's own error at the first batch, its traceback kept
        with pytest.raises(outcome):
            cegppo(["train", *argv])


def test_a_reward_named_by_a_string_in_the_api_is_the_built_in(model_dir, tmp_path):
    from cegppo_trl.rewards import REWARD_FUNCS

    args = CEGPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none", per_device_train_batch_size=4,
                        num_generations=4, max_completion_length=8)  # fmt: skip
    data = Dataset.from_dict({"prompt": ["1+1="] * 4, "solution": ["2"] * 4})
    trainer = CEGPPOTrainer(model_dir, reward_funcs="math_verify", args=args, train_dataset=data)
    assert trainer.reward_funcs == [REWARD_FUNCS["math_verify"]]
    with pytest.raises(ValueError, match=r"`reward_funcs`: 'math_verfy' is no reward function's name.*did you mean "
                       r"'math_verify'.*get_reward_func\('math_verify'\)"):  # fmt: skip
        CEGPPOTrainer(model_dir, reward_funcs=["format", "math_verfy"], args=args, train_dataset=data)


# ----------------------------------------------------------------------------------------------------------------
# Item 5: the docs claim only what the checks do; the model card cites the paper as the README does
# ----------------------------------------------------------------------------------------------------------------
def test_the_usage_doc_does_not_claim_check_flags_gsm8k_answers_for_math_verify():
    from cegppo_trl.rewards import REWARD_FUNCS

    text = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    assert "GSM8K answers given to `math_verify`" not in text
    # ... and rightly: math_verify scores a GSM8K worked answer ("#### 4") as correct, so no such error exists.
    assert REWARD_FUNCS["math_verify"](completions=["so \\boxed{4}"], solution=["2 + 2 = 4\n#### 4"]) == [1.0]


def test_the_model_card_eprint_is_the_readmes():
    eprint = re.compile(r"eprint\s*=\s*\{([^}]*)\}")
    readme = eprint.findall((ROOT / "README.md").read_text())
    assert readme and eprint.findall(CEGPPOTrainer._paper["citation"]) == readme[:1]


def test_cegppo_train_runs_the_checks_once_and_the_trainer_none(model_dir, data_file, tmp_path, monkeypatch):
    from cegppo_trl import scripts

    calls, trained = [], []
    original = preflight_module.run_checks

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    class Stop(Exception):
        pass

    def stop(self, *args, **kwargs):
        trained.append(self)
        raise Stop

    monkeypatch.setattr(preflight_module, "run_checks", counted)
    monkeypatch.setattr(scripts, "run_checks", counted)  # what `cegppo train` calls
    monkeypatch.setattr(CEGPPOTrainer, "train", stop)  # the model has loaded: enough
    with pytest.raises(Stop):
        train(*parse_args(cli_args(model_dir, data_file, tmp_path / "out", "--reward_funcs", "format")))
    assert len(calls) == 1 and len(trained) == 1


def test_the_report_sections_are_the_documented_ones():
    """docs/usage.md lists the report's sections (`- **Model**: ...`), in the report's order."""
    text = (ROOT / "docs" / "usage.md").read_text()
    section = text.split("## Pre-flight: `cegppo check`", 1)[1].split("\n## ", 1)[0]
    documented = re.findall(r"^- \*\*([A-Z][a-z]+(?: [a-z]+)?)\*\*:", section, re.MULTILINE)
    assert documented == [title.split(" (")[0] for title in preflight_module.SECTIONS.values()]


def test_check_says_it_did_not_read_the_weights_and_train_fails_on_a_truncated_file(capsys, model_dir, data_file,
                                                                                      tmp_path):  # fmt: skip
    """A `model.safetensors` cut short: `check` does not read weights, and says so (exit 0 is a verdict on what it
    checked); `train` fails at load, in safetensors' words."""
    import shutil

    folder = tmp_path / "truncated"
    shutil.copytree(model_dir, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    argv = cli_args(str(folder), data_file, tmp_path / "out", "--reward_funcs", "format")
    status, out = check(capsys, *argv)
    text = " ".join(out.split())
    assert status == 0 and "Not checked" in text and "the model's weights: not read (a truncated" in text, out
    with pytest.raises(Exception, match="(?i)safetensor|header|deserializ|incomplete"):
        train(*parse_args(argv))


# ----------------------------------------------------------------------------------------------------------------
# Found when tried as a new user would: each with `check` and `train` agreeing
# ----------------------------------------------------------------------------------------------------------------
ALIKE = r"Reward `format` gave every completion it was called on the same score \(0;.*exit status 3"


def test_a_reward_that_scores_every_completion_alike_is_a_warning_in_check_and_in_train(capsys, caplog, model_dir,
                                                                                     data_file, tmp_path, monkeypatch):  # fmt: skip
    """The README's smoke line: `check` said "ready" while its only reward scored 0 on every row it tried, then
    `train` exited 3. Both now warn, with the same words (`train` from the main process only)."""
    argv = cli_args(model_dir, data_file, tmp_path / "out")  # cpu_smoke: `format`, the tiny model writes no box
    status, out = check(capsys, *argv)
    assert status == 0 and re.search(r"WARNING \[rewards\] " + ALIKE, " ".join(out.split())), out
    assert "0 error(s), 1 warning(s)" in out
    # Another reward that tells the completions apart (gsm8k scores the reference answers top) gives the run spread.
    status, out = check(capsys, *argv, "--reward_funcs", "format", "gsm8k_01")
    assert status == 0 and "the same score" not in out and "0 error(s), 0 warning(s)" in out, out

    class Stop(Exception):
        pass

    monkeypatch.setattr(CEGPPOTrainer, "train", lambda *a, **k: (_ for _ in ()).throw(Stop()))
    with caplog.at_level("WARNING"), pytest.raises(Stop):
        train(*parse_args(argv))
    assert re.search(ALIKE, caplog.text), caplog.text
    # With several processes, the warning is logged once: by process 0 (it printed once per process).
    caplog.clear()
    monkeypatch.setattr(CEGPPOConfig, "process_index", property(lambda self: 1))
    with caplog.at_level("WARNING"), pytest.raises(Stop):
        train(*parse_args(argv))
    assert not re.search(ALIKE, caplog.text), caplog.text


def test_a_missing_prompt_column_names_the_prompt_column_flag_in_check_and_train(capsys, model_dir, gsm8k_file,
                                                                               tmp_path, no_model_load):  # fmt: skip
    argv = cli_args(model_dir, gsm8k_file, tmp_path / "out", "--reward_funcs", "gsm8k", "--solution_column", "answer")
    status, out, train_status, err = _check_then_train(capsys, argv)
    message = r"`prompt_column=prompt`: `prompt` is not a column of the dataset \(its columns: question, answer\)\. " \
        r"The prompt looks like it is in `question`: pass `--prompt_column question`\."  # fmt: skip
    assert status == 1 and re.search(message, out), out
    assert train_status == 2 and re.search(message, err) and "Traceback" not in err, err


def test_a_reward_that_raises_in_train_is_named_by_its_own_exit_status(monkeypatch):
    """`RewardFailed` names the reward and keeps the reward's exception as its cause; what TRL sees is the reward
    itself (its name for the metrics, its kind, its score range)."""
    from cegppo_trl.rewards import REWARD_FUNCS
    from cegppo_trl.scripts import RewardFailed, named_failures

    def broken(completions, **kwargs):
        raise KeyError("score")

    async def broken_async(completions, **kwargs):
        raise ZeroDivisionError("judge")

    guarded, fmt, mv, coro = named_failures([broken, REWARD_FUNCS["format"], REWARD_FUNCS["math_verify"], broken_async],
                                            ["my.broken", "format", "math_verify", "my.judge"])  # fmt: skip
    with pytest.raises(RewardFailed, match=r"^Reward `my.broken` raised KeyError: 'score'$") as error:
        guarded(completions=["a"])
    assert isinstance(error.value.__cause__, KeyError)
    assert fmt(completions=["\\boxed{1}", "no"]) == [1.0, 0.0] and fmt.__name__ == "format_reward"
    assert mv.__name__ == "math_verify" and mv.reward_range == (-1.0, 1.0) and fmt.reward_range == (0.0, 1.0)
    import asyncio
    import inspect

    assert inspect.iscoroutinefunction(coro)
    with pytest.raises(RewardFailed, match=r"Reward `my.judge` raised ZeroDivisionError: judge"):
        asyncio.run(coro(completions=["a"]))


def test_the_usage_doc_lists_every_subcommand():
    from cegppo_trl.cli import _build_parser

    commands = next(a for a in _build_parser()._actions if a.dest == "command").choices
    listed = re.search(r"cegppo --help +# subcommands: (.*)", (ROOT / "docs" / "usage.md").read_text()).group(1)
    assert sorted(listed.split(", ")) == sorted(commands)
