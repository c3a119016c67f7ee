"""What a CPU run prints besides its own output: its warnings on lines of their own above the progress bar, one line
for a refused setting (`CEGPPOUsageError`) and a traceback for anything else; `CEGPPOConfig` is field for field the
`GRPOConfig` of the same fields."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cegppo_trl import CEGPPOConfig, cli

ROOT = Path(__file__).resolve().parents[1]


def _env(**extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("CEGPPO_TRACEBACK", None)
    return {**env, **extra}


@pytest.mark.slow
def test_a_cpu_smoke_run_prints_no_package_caused_noise_and_saves_the_card(model_dir, data_file, tmp_path):
    # The README's CPU command as a user runs it: Python's default warning filters (not pytest's), `save_strategy: no`.
    result = subprocess.run(
        [sys.executable, "-m", "cegppo_trl.cli", "train", "--config", "cpu_smoke", "--model_name_or_path", model_dir,
         "--dataset_name", data_file, "--output_dir", str(tmp_path / "out"), "--max_steps", "1"],
        check=False, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    # One step of an untrained tiny model scores nothing: the documented "nothing to learn" status, not a success.
    assert result.returncode == 3, output[-3000:]
    for line in result.stderr.replace("\r", "\n").splitlines():  # none of ours written into the progress bar's line
        # The interpreter's own prefix (CI's venv is `/tmp/cegppo-ci-venv`) in a host warning's path is not ours.
        ours = "cegppo" in line.replace(sys.prefix, "").lower()
        assert "it/s]" not in line or line.rstrip().endswith("]") or not ours, line
    assert "No learning signal in this rollout batch" in result.stderr  # the trainer's warning, on its own line
    card = (tmp_path / "out" / "README.md").read_text()  # the final save writes the card without any checkpoint
    assert "## CE-GPPO settings" in card and "fine-tuned version of a local model" in card


def test_cegppo_config_leaves_transformers_checkpointing_fields_as_grpo_config_sets_them():
    """It moved TRL's default `gradient_checkpointing=True` to `activation_checkpointing` to hide transformers'
    FutureWarning, so a `CEGPPOConfig` differed from the `GRPOConfig` of the same fields."""
    from trl import GRPOConfig

    for extra in ({}, {"gradient_checkpointing": False}):
        kwargs = dict(output_dir="unused", use_cpu=True, bf16=False, report_to="none", **extra)
        ours, theirs = CEGPPOConfig(**kwargs), GRPOConfig(**kwargs)
        for name in ("gradient_checkpointing", "activation_checkpointing"):
            assert getattr(ours, name) == getattr(theirs, name), (extra, name)


def test_max_steps_0_is_taken_as_grpo_config_takes_it():
    """TRL's field: `CEGPPOConfig` takes what `GRPOConfig` takes (tests/test_constructor_drop_in.py trains it)."""
    assert CEGPPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none", max_steps=0).max_steps == 0
    assert CEGPPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none").max_steps == -1


def test_a_refused_setting_is_one_line_on_the_command_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CEGPPO_TRACEBACK", raising=False)
    argv = ["train", "--config", "cpu_smoke", "--output_dir", str(tmp_path), "--gppo_beta1", "-1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("cegppo train: error: `gppo_beta1` must be a finite number >= 0") and "Traceback" not in err
    assert err.count("\n") == 1
    # CEGPPO_TRACEBACK=1 shows the traceback (the error propagates as it did).
    monkeypatch.setenv("CEGPPO_TRACEBACK", "1")
    with pytest.raises(ValueError, match="gppo_beta1"):
        cli.main(argv)


@pytest.mark.parametrize("error", [ValueError("shapes do not match"), RuntimeError("torch failed")])
def test_anything_but_a_usage_error_keeps_its_traceback(tmp_path, monkeypatch, error):
    """Only `CEGPPOUsageError` (the pre-flight's refusals) is one line; a `ValueError` raised while training, where
    a traceback walk once looked for transformers' `_inner_training_loop`, propagates with its traceback."""
    from cegppo_trl import scripts
    from cegppo_trl.preflight import CEGPPOUsageError

    monkeypatch.delenv("CEGPPO_TRACEBACK", raising=False)
    argv = ["train", "--config", "cpu_smoke", "--output_dir", str(tmp_path)]
    monkeypatch.setattr(scripts, "main", lambda *a: (_ for _ in ()).throw(error))
    with pytest.raises(type(error), match=str(error)):
        cli.main(argv)
    monkeypatch.setattr(scripts, "main", lambda *a: (_ for _ in ()).throw(CEGPPOUsageError("`x`: refused")))
    assert cli.main(argv) == 2


@pytest.mark.slow
def test_cegppo_check_on_a_good_command_prints_the_report_and_exits_0(model_dir, data_file, tmp_path):
    # From the installed entry point, as a user runs it.
    result = subprocess.run(
        [sys.executable, "-m", "cegppo_trl.cli", "check", "--config", "cpu_smoke", "--model_name_or_path", model_dir,
         "--dataset_name", data_file, "--output_dir", str(tmp_path / "out")],
        check=False, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Batch layout" in result.stdout and "0 error(s)" in result.stdout
