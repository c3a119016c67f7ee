"""`.ci/run`, the CI entry point: the oldest-TRL and vLLM steps run by default; skipping vLLM takes a loud opt-out.

The script runs for real in a scratch copy of the repository where `python3`, the venv and `.ci/vllm.sh` are stubs
that record what was called (no install, no network)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

FAKE_PYTHON3 = """#!/usr/bin/env bash
# `python3 -m venv DIR`: a venv whose python does nothing and whose activate defines `deactivate`.
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
  mkdir -p "$3/bin"
  printf '#!/usr/bin/env bash\\nexit 0\\n' > "$3/bin/python"
  chmod +x "$3/bin/python"
  printf 'PATH="%s/bin:$PATH"\\ndeactivate() { echo deactivated >> "$CI_TEST_LOG"; }\\n' "$3" > "$3/bin/activate"
fi
"""


def _run_ci(tmp_path: Path, **env_extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / ".ci" / "vllm.sh").write_text('echo "vllm.sh ran" >> "$CI_TEST_LOG"\n')
    (repo / ".ci" / "trl_oldest.sh").write_text('echo "trl_oldest.sh ran" >> "$CI_TEST_LOG"\n')
    (repo / "README.md").write_text('<!-- test-command -->\n```bash\necho "main suite ran" >> "$CI_TEST_LOG"\n```\n')
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(FAKE_PYTHON3)
    (bin_dir / "python3").chmod(stat.S_IRWXU)
    log = tmp_path / "log.txt"
    log.touch()
    env = {k: v for k, v in os.environ.items() if k != "CEGPPO_CI_VLLM"}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", CI_TEST_LOG=str(log),
               CEGPPO_CI_VENV=str(tmp_path / "venv"), **env_extra)  # fmt: skip
    ci = ["bash", str(repo / ".ci" / "run")]
    result = subprocess.run(ci, check=False, env=env, capture_output=True, text=True, timeout=60)
    return result, log.read_text().splitlines()


@pytest.mark.slow
def test_ci_runs_the_vllm_step_by_default(tmp_path):
    result, calls = _run_ci(tmp_path)
    assert result.returncode == 0, result.stderr
    assert calls == ["main suite ran", "deactivated", "trl_oldest.sh ran", "vllm.sh ran"]
    assert "SKIPPED" not in result.stderr


@pytest.mark.slow
def test_ci_vllm_opt_out_is_explicit_and_says_so(tmp_path):
    result, calls = _run_ci(tmp_path, CEGPPO_CI_VLLM="0")
    assert result.returncode == 0, result.stderr
    assert calls == ["main suite ran", "deactivated", "trl_oldest.sh ran"], "the oldest-TRL step still runs"
    assert "vLLM step SKIPPED (CEGPPO_CI_VLLM=0): the vLLM generation path was NOT checked" in result.stderr
