"""What a CPU run prints besides its own output: none of the noise the package causes (DeepSpeed's CPU notice
without DeepSpeed, transformers' `gradient_checkpointing` FutureWarnings, tracebacks for a refused setting), and
`--max_steps 0` refused instead of training one step at learning rate 0."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
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
    # The README's CPU command as a user runs it: Python's default warning filters (not pytest's), DeepSpeed
    # installed but not used, `save_strategy: no`.
    result = subprocess.run(
        [sys.executable, "-m", "cegppo_trl.cli", "train", "--config", "cpu_smoke", "--model_name_or_path", model_dir,
         "--dataset_name", data_file, "--output_dir", str(tmp_path / "out"), "--max_steps", "1"],
        check=False, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = result.stdout + result.stderr
    # One step of an untrained tiny model scores nothing: the documented "nothing to learn" status, not a success.
    assert result.returncode == 3, output[-3000:]
    assert "Setting accelerator to CPU" not in output
    assert "gradient_checkpointing" not in output and "FutureWarning" not in output
    for line in result.stderr.replace("\r", "\n").splitlines():  # nothing written into the progress bar's line
        assert "it/s]" not in line or line.rstrip().endswith("]"), line
    card = (tmp_path / "out" / "README.md").read_text()  # the final save writes the card without any checkpoint
    assert "## CE-GPPO settings" in card and "fine-tuned version of a local model (`tiny-llama" in card


def test_cegppo_config_does_not_trigger_the_gradient_checkpointing_deprecation():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        args = CEGPPOConfig(output_dir="unused", use_cpu=True, bf16=False, report_to="none")
    assert not [w for w in caught if "gradient_checkpointing" in str(w.message)]
    assert args.activation_checkpointing is True and args.gradient_checkpointing is True  # TRL's default kept
    # A user's own value under the deprecated name still counts (and transformers still tells them so).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        off = CEGPPOConfig(
            output_dir="unused", use_cpu=True, bf16=False, report_to="none", gradient_checkpointing=False
        )
    assert off.activation_checkpointing is False
    assert any("`gradient_checkpointing` is deprecated" in str(w.message) for w in caught)


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


def test_a_bug_keeps_its_traceback():
    from cegppo_trl.cli import _is_user_error

    def _inner_training_loop():  # where transformers' Trainer trains: an error there is not a refused setting
        raise ValueError("shapes do not match")

    def raise_from(function):
        try:
            function()
        except Exception as error:  # noqa: BLE001
            return error

    assert not _is_user_error(raise_from(_inner_training_loop))
    assert not _is_user_error(raise_from(lambda: [].pop()))  # IndexError is not a refusal
    assert not _is_user_error(raise_from(lambda: (_ for _ in ()).throw(RuntimeError("torch failed"))))
    assert _is_user_error(raise_from(lambda: CEGPPOConfig(output_dir="x", use_cpu=True, bf16=False, gppo_beta1=-1)))
    from cegppo_trl.distributed import check_distributed_engine

    refusal = raise_from(lambda: check_distributed_engine(object(), {"ACCELERATE_USE_FSDP": "1"}, "MULTI_GPU", "cuda"))
    assert isinstance(refusal, RuntimeError) and _is_user_error(refusal)  # the package's own refusal


@pytest.mark.slow
def test_cegppo_check_on_a_good_command_prints_the_report_and_exits_0(model_dir, data_file, tmp_path):
    # From the installed entry point, as a user runs it; a check trains nothing, so DeepSpeed's device notice is noise.
    result = subprocess.run(
        [sys.executable, "-m", "cegppo_trl.cli", "check", "--config", "cpu_smoke", "--model_name_or_path", model_dir,
         "--dataset_name", data_file, "--output_dir", str(tmp_path / "out")],
        check=False, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "Batch layout" in result.stdout and "0 error(s)" in result.stdout
    assert "Setting accelerator to CPU" not in output
