"""The quickstart (`python -m cegppo_trl.demos.quickstart`): its task and reward, the default model's cache, the method
mapping, and `--fast` end-to-end runs in-process (built-in model, a local `--model` folder, a local `--dataset`)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys

import pytest
import torch

from cegppo_trl.demos.plots import PLOT_FILES
from cegppo_trl.demos.quickstart import main
from cegppo_trl.demos.tasks import addition_problems, addition_reward, generate_greedy, numeric_is_correct
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama
from cegppo_trl.demos.warmup import WarmupSettings, build_default_model

needs_matplotlib = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="needs matplotlib")


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    """Every quickstart test trains a tiny model: one thread, as the quickstart CLI itself uses."""


# ----------------------------------------------------------------------------------------------------------------
# Task and reward
# ----------------------------------------------------------------------------------------------------------------
def test_addition_reward_is_one_only_for_the_exact_sum():
    completions = ["95", " 95\n", "96", "095", "9 5", "95+1", "", "959"]
    assert addition_reward(completions, solution=["95"] * len(completions)) == [1, 1, 0, 0, 0, 0, 0, 0]


def test_addition_reward_reads_conversational_completions():
    completions = [[{"role": "assistant", "content": "122"}], [{"role": "assistant", "content": "121"}]]
    assert addition_reward(completions, solution=["122", "122"]) == [1.0, 0.0]


def test_addition_split_is_deterministic_disjoint_and_complete():
    train, heldout = addition_problems(num_digits=2, num_heldout=200, seed=0)
    again_train, again_heldout = addition_problems(num_digits=2, num_heldout=200, seed=0)
    assert (train, heldout) == (again_train, again_heldout)
    assert len(heldout) == 200 and len(train) + len(heldout) == 90 * 90
    assert not {p["prompt"] for p in train} & {p["prompt"] for p in heldout}
    a, b = heldout[0]["prompt"].rstrip("=").split("+")
    assert heldout[0]["solution"] == str(int(a) + int(b))


@pytest.mark.parametrize(
    ("completion", "solution", "correct"),
    [
        ("She has 3 + 4 = 7 apples.\n#### 7", "3 + 4 = <<3+4=7>>7\n#### 7", True),
        ("The total is 1,000 dollars.", "#### 1000", True),
        ("The answer is \\boxed{12}.", "#### 12", True),
        ("#### 8", "#### 7", False),
        ("I do not know.", "#### 7", False),  # malformed: no number at all
    ],
)
def test_numeric_is_correct_compares_final_numbers(completion, solution, correct):
    assert numeric_is_correct(completion, solution) is correct


def test_batched_greedy_decoding_matches_one_prompt_at_a_time():
    # Prompts of different lengths are left-padded in a batch; padding must not change any completion.
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=3)
    prompts = ["7+5=", "12+34=", "123+456=", "1+1="]
    batched = generate_greedy(model, tokenizer, prompts, max_new_tokens=5)
    single = [generate_greedy(model, tokenizer, [p], max_new_tokens=5)[0] for p in prompts]
    assert batched == single


# ----------------------------------------------------------------------------------------------------------------
# Default model
# ----------------------------------------------------------------------------------------------------------------
TINY_WARMUP = WarmupSettings(
    hidden_size=16, intermediate_size=32, max_steps=10, eval_every=5, warmup_problems=64, dev_problems=16
)


@pytest.mark.slow
def test_default_model_is_rebuilt_bit_for_bit_and_then_loaded_from_the_cache(tmp_path):
    model, _, info = build_default_model(TINY_WARMUP, cache_dir=tmp_path, log=None)
    assert not info["cached"] and info["steps"] == 10
    cached, _, cached_info = build_default_model(TINY_WARMUP, cache_dir=tmp_path, log=None)
    assert cached_info["cached"] and cached_info["path"] == info["path"]
    rebuilt, _, _ = build_default_model(TINY_WARMUP, cache_dir=tmp_path, rebuild=True, log=None)
    for (name, p), q, r in zip(
        model.state_dict().items(), cached.state_dict().values(), rebuilt.state_dict().values()
    ):
        assert torch.equal(p, q) and torch.equal(p, r), name


def test_cache_key_changes_with_any_setting():
    assert WarmupSettings().cache_key() != WarmupSettings(seed=1).cache_key()
    assert WarmupSettings().cache_key() == WarmupSettings().cache_key()


# ----------------------------------------------------------------------------------------------------------------
# End to end (--fast)
# ----------------------------------------------------------------------------------------------------------------
def _finite_numbers(history):
    return [v for entry in history for v in entry.values() if isinstance(v, (int, float)) and not isinstance(v, bool)]


@pytest.mark.slow
@needs_matplotlib
def test_fast_quickstart_writes_plots_and_finite_metrics(tmp_path):
    out = tmp_path / "out"
    summary = main(["--fast", "--output-dir", str(out), "--cache-dir", str(tmp_path / "cache"), "--no-progress"])

    for name in PLOT_FILES:
        assert (out / name).stat().st_size > 1000, name
    history = json.loads((out / "metrics.json").read_text())
    assert json.loads((out / "summary.json").read_text())["method"] == "cegppo"
    assert all(math.isfinite(v) for v in _finite_numbers(history))
    steps = [h for h in history if "loss" in h]
    assert len(steps) == summary["steps"] == 4
    for key in (
        "cegppo/beta1",
        "cegppo/beta2",
        "clip_ratio/low_mean",  # TRL's: the tokens whose gradient CE-GPPO keeps x beta1 (plot 4, the summary)
        "clip_ratio/high_mean",  # x beta2
        "entropy",
    ):
        assert all(key in h for h in steps), key
    assert {h["cegppo/beta1"] for h in steps} == {0.5} and {h["cegppo/beta2"] for h in steps} == {1.0}
    accuracies = [h["heldout/accuracy"] for h in history if "heldout/accuracy" in h]
    assert len(accuracies) >= 3 and all(0.0 <= a <= 1.0 for a in accuracies)
    assert accuracies[0] == summary["accuracy_before"] and accuracies[-1] == summary["accuracy_after"]
    # Off-policy by construction: the second optimizer step on each rollout batch sees a ratio away from 1.
    assert any(h["cegppo/ratio/min"] < 1.0 or h["cegppo/ratio/max"] > 1.0 for h in steps)


@pytest.mark.slow
def test_fast_quickstart_runs_a_baseline(tmp_path):
    summary = main(
        ["--fast", "--baseline", "grpo", "--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "c"),
         "--no-progress", "--steps", "2"]
    )  # fmt: skip
    history = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert summary["method"] == "grpo"
    assert {h["cegppo/beta1"] for h in history if "loss" in h} == {0.0}


@pytest.mark.slow
def test_fast_quickstart_without_matplotlib_keeps_its_numbers_and_names_the_extra(tmp_path, monkeypatch, capsys):
    # A base install has no matplotlib: the run must still write its metrics and summary, then say what to install.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ModuleNotFoundError
    out = tmp_path / "out"
    summary = main(
        ["--fast", "--steps", "2", "--output-dir", str(out), "--cache-dir", str(tmp_path / "c"), "--no-progress"]
    )
    printed = capsys.readouterr().out
    assert 'Plots skipped: matplotlib is not installed (pip install "cegppo-trl[plot]"' in printed
    assert "held-out accuracy (greedy)" in printed  # the summary table is printed as usual
    assert not any((out / name).exists() for name in PLOT_FILES)
    assert len([h for h in json.loads((out / "metrics.json").read_text()) if "loss" in h]) == 2
    written = json.loads((out / "summary.json").read_text())
    assert written["steps"] == summary["steps"] == 2 and written["plots"] == []
    assert written["accuracy_after"] == summary["accuracy_after"]


def test_dataset_without_model_is_refused_with_a_clear_message(capsys):
    with pytest.raises(SystemExit):
        main(["--fast", "--dataset", "openai/gsm8k"])
    assert "--dataset needs --model" in capsys.readouterr().err


@pytest.mark.slow
@needs_matplotlib
def test_fast_quickstart_with_a_local_model_folder_and_a_local_dataset(tmp_path):
    # The code paths of `--model <Hub id>` and `--dataset <Hub id>`, offline: a saved model and a JSONL file.
    tokenizer = build_char_tokenizer()
    model_dir = tmp_path / "model"
    build_tiny_llama(tokenizer, hidden_size=16, intermediate_size=32).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    rows = [
        {"question": f"Tom has {i} pens and buys {i + 1}.", "answer": f"{i}+{i + 1}\n#### {2 * i + 1}"}
        for i in range(24)
    ]
    data = tmp_path / "gsm8k_like.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows))

    summary = main(["--fast", "--model", str(model_dir), "--output-dir", str(tmp_path / "a"), "--no-progress"])
    assert summary["task"].startswith("addition") and summary["warmup"] is None
    summary = main(
        ["--fast", "--model", str(model_dir), "--dataset", str(data), "--num-heldout", "4",
         "--output-dir", str(tmp_path / "b"), "--no-progress"]
    )  # fmt: skip
    assert summary["task"] == str(data) and 0.0 <= summary["accuracy_after"] <= 1.0
    assert all((tmp_path / "b" / name).exists() for name in PLOT_FILES)


@pytest.mark.slow
def test_the_total_wall_time_counts_the_quickstart_not_what_the_shell_ran_before_it(tmp_path):
    """`bash -c "pip install ... && python -m cegppo_trl.demos.quickstart"` execs python in the shell's process: its
    creation time (what the summary counted from) is before the install. Counted from the quickstart's own start, a 3 s command
    before it is not in the total."""
    import os
    import shutil
    import subprocess

    if shutil.which("bash") is None:
        pytest.skip("needs bash")
    import time

    probe = "import cegppo_trl.demos.quickstart as q; print(repr(q.STARTED_AT))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    shell_started = time.time()
    out = subprocess.run(["bash", "-c", f"sleep 3 && exec {sys.executable} -c '{probe}'"], capture_output=True,
                         text=True, env=env, check=True, timeout=300).stdout  # fmt: skip
    assert float(out.split()[-1]) >= shell_started + 3, out  # the process itself was created before the sleep
