"""The repository speaks of itself only: what users and maintainers need is in its own docs, cited by path."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Documents that are not part of the repository, and the development process that is not either.
FOREIGN = re.compile(r"reference sheet|\bissue \d+\b|this project's sessions", re.IGNORECASE)


def tracked_text_files() -> list[Path]:
    try:
        names = subprocess.run(
            ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    suffixes = {".py", ".md", ".yaml", ".yml", ".toml", ".txt", ".sh", ".cfg"}
    return [ROOT / n for n in names if Path(n).suffix in suffixes or n.startswith(".ci/")]


def test_no_file_cites_a_document_outside_the_repository():
    hits = []
    for path in tracked_text_files():
        if path.name == Path(__file__).name or not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if FOREIGN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "cite docs/algorithm.md or the paper instead:\n" + "\n".join(hits)


def test_every_third_party_import_of_the_package_is_declared():
    # A module imported by cegppo_trl must be a declared dependency (or an extra), not one that happens to arrive
    # with another package (e.g. psutil through accelerate).
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = " ".join(project["dependencies"] + sum(project["optional-dependencies"].values(), []))
    declared_names = {re.split(r"[<>=\[ ;~!]", d)[0].lower().replace("-", "_") for d in declared.split()}
    import_names = {"math_verify": "math_verify", "yaml": "pyyaml"}  # import name -> distribution name
    stdlib = set(__import__("sys").stdlib_module_names)
    found = set()
    for path in (ROOT / "cegppo_trl").rglob("*.py"):
        for match in re.finditer(r"^\s*(?:from|import)\s+([a-zA-Z_][\w]*)", path.read_text(), re.MULTILINE):
            found.add(match.group(1))
    third_party = {m for m in found if m not in stdlib and m not in ("cegppo_trl", "__future__")}
    undeclared = sorted(
        m for m in third_party if import_names.get(m, m).lower().replace("-", "_") not in declared_names
    )
    assert not undeclared, f"imported by cegppo_trl but not declared in pyproject.toml: {undeclared}"


@pytest.mark.parametrize("command", [["check", "."], ["format", "--check", "."]], ids=["lint", "format"])
def test_ruff_finds_nothing(command):
    # The linter and formatter config is `[tool.ruff]` in pyproject.toml; `ruff check --fix . && ruff format .` fixes
    # most findings. Part of the suite so that CI (which runs README's test command) runs it too.
    ruff = pytest.importorskip("ruff")
    result = subprocess.run(
        [str(Path(ruff.find_ruff_bin())), *command], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
