"""What a `pip install` user gets: the recipes and accelerate configs inside the wheel, found by name
(`cegppo train --config cpu_smoke`), launch lines that need no repository checkout, the license and project URLs."""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from cegppo_trl import cli, resources
from cegppo_trl.scripts import parse_args

ROOT = Path(__file__).resolve().parents[1]
# Repository folder -> the package it ships as.
SHIPPED = {"examples/recipes": "cegppo_trl.recipes", "accelerate_configs": "cegppo_trl.accelerate_configs"}


def _env(**extra) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return {**env, **extra}


# ----------------------------------------------------------------------------------------------------------------
# pyproject.toml: every package, every recipe and config, the license
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_package_data_ships_every_yaml_of_the_recipe_and_accelerate_config_folders(pyproject):
    setuptools = pyproject["tool"]["setuptools"]
    assert {v: k for k, v in setuptools["package-dir"].items()} == SHIPPED
    for folder, package in SHIPPED.items():
        assert package in setuptools["packages"]
        patterns = setuptools["package-data"][package]
        files = sorted(p.name for p in (ROOT / folder).iterdir() if p.suffix in (".yaml", ".yml"))
        assert files, folder
        missing = [name for name in files if not any(fnmatch.fnmatch(name, pat) for pat in patterns)]
        assert not missing, f"{folder}: not in package-data {patterns}: {missing}"


def test_every_python_package_is_listed(pyproject):
    # `packages` is an explicit list (the data packages are mapped, which `packages.find` cannot do): a new
    # subpackage must be added there or it is missing from the wheel.
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "cegppo_trl").rglob("__init__.py")}
    assert found <= set(pyproject["tool"]["setuptools"]["packages"])


def test_the_research_commands_are_entry_points_that_resolve(pyproject):
    # `cegppo probe` lives in the research layer: cli.py finds it by this entry point instead of importing it.
    import importlib

    commands = pyproject["project"]["entry-points"]["cegppo.commands"]
    assert commands == {"probe": "cegppo_trl.research.probe:main"}
    for target in commands.values():
        module, _, name = target.partition(":")
        assert callable(getattr(importlib.import_module(module), name)), target


def test_the_installed_metadata_has_the_entry_points_of_pyproject(pyproject):
    # A checkout installed before an entry point was added lacks it (`cegppo probe` would be "invalid choice").
    installed = {name: ep.value for name, ep in cli.extra_commands().items()}
    declared = pyproject["project"]["entry-points"]["cegppo.commands"]
    assert installed == declared, "the installed metadata is older than pyproject.toml: pip install -e . again"


def test_license_file_and_project_urls_are_declared(pyproject):
    project = pyproject["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text and "END OF TERMS AND CONDITIONS" in text
    assert project["urls"] and all(url.startswith("https://") for url in project["urls"].values())


# ----------------------------------------------------------------------------------------------------------------
# --config NAME
# ----------------------------------------------------------------------------------------------------------------
def _resources_in(package_dir: Path):
    """`cegppo_trl.resources` loaded from a copy at `package_dir` (another install layout)."""
    package_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(Path(resources.__file__), package_dir / "resources.py")
    spec = importlib.util.spec_from_file_location("layout_resources", package_dir / "resources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_wheel_layout_finds_a_recipe_by_name(tmp_path):
    # In a wheel the recipes sit in the package (`cegppo_trl/recipes/`), with no `examples/` folder beside it.
    package = tmp_path / "site-packages" / "cegppo_trl"
    (package / "recipes").mkdir(parents=True)
    (package / "accelerate_configs").mkdir()
    shutil.copy(ROOT / "examples" / "recipes" / "cpu_smoke.yaml", package / "recipes")
    wheel = _resources_in(package)
    assert wheel.recipes_dir() == package / "recipes"
    assert wheel.accelerate_configs_dir() == package / "accelerate_configs"
    assert wheel.recipe_names() == ["cpu_smoke"]
    assert (
        wheel.resolve_config("cpu_smoke")
        == wheel.resolve_config("cpu_smoke.yaml")
        == str(package / "recipes" / "cpu_smoke.yaml")
    )


def test_source_checkout_finds_the_repository_folders():
    assert resources.recipes_dir() == ROOT / "examples" / "recipes"
    assert resources.accelerate_configs_dir() == ROOT / "accelerate_configs"
    assert resources.recipe_names() == sorted(p.stem for p in (ROOT / "examples" / "recipes").glob("*.yaml"))


def test_config_by_name_equals_config_by_path(tmp_path):
    by_path = parse_args(["--config", str(ROOT / "examples/recipes/cpu_smoke.yaml"), "--output_dir", str(tmp_path)])
    by_name = parse_args(["--config", "cpu_smoke", "--output_dir", str(tmp_path)])
    with_equals = parse_args(["--config=cpu_smoke", "--output_dir", str(tmp_path)])
    for parsed in (by_name, with_equals):
        assert [vars(a) for a in parsed[::2]] == [vars(a) for a in by_path[::2]]  # script and model arguments
        assert parsed[1].to_dict() == by_path[1].to_dict()
    assert by_name[1].use_cpu and by_name[0].reward_funcs == ["format"]  # the recipe's own values


def test_unknown_recipe_name_lists_the_shipped_ones(capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--config", "cpu_smok", "--output_dir", "/tmp/unused"], prog="cegppo train")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cegppo train: error: --config 'cpu_smok' is neither a file nor a shipped recipe name.")
    assert f"Shipped recipes (in {resources.recipes_dir()}): " in err and "cpu_smoke, gsm8k_qwen2.5_0.5b_lora" in err
    assert "usage:" not in err  # the one line, not buried under the full usage


def test_missing_repository_path_points_to_the_shipped_name(tmp_path, monkeypatch, capsys):
    # After `pip install`, outside the repository: the README's path form is missing, the name works.
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        parse_args(["--config", "examples/recipes/cpu_smoke.yaml"])
    assert "A recipe of that name ships with the package: `cpu_smoke`." in capsys.readouterr().err


def test_config_without_a_value_is_refused(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--config", "--output_dir", "x"])
    assert "--config needs a value" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# What the commands say
# ----------------------------------------------------------------------------------------------------------------
def test_cegppo_recipes_lists_every_recipe_and_the_accelerate_configs(capsys):
    cli.main(["recipes"])
    out = capsys.readouterr().out
    assert str(resources.recipes_dir()) in out and str(resources.accelerate_configs_dir()) in out
    assert ", ".join(resources.recipe_names()) in out
    assert "multi_gpu" in out and "two_nodes" in out


def test_cegppo_config_path_prints_a_shipped_files_path(capsys):
    """`cegppo config-path NAME` exited 2 (its subcommand was parsed without its argument)."""
    assert cli.main(["config-path", "multi_gpu"]) == 0
    assert capsys.readouterr().out.strip() == str(resources.accelerate_configs_dir() / "multi_gpu.yaml")


def test_launch_lines_work_without_a_repository_checkout(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    assert "examples/cegppo.py" not in out
    assert '--config_file "$(cegppo config-path multi_gpu)" -m cegppo_trl.cli train' in out
    assert "cegppo train --config cpu_smoke" in out


@pytest.mark.slow
def test_python_m_cegppo_trl_cli_help_runs(tmp_path):
    # The module form that `torchrun -m` and `accelerate launch -m` run, from outside the repository.
    result = subprocess.run(
        [sys.executable, "-m", "cegppo_trl.cli", "--help"], check=False, cwd=tmp_path, env=_env(),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage: cegppo") and "recipes" in result.stdout


# ----------------------------------------------------------------------------------------------------------------
# The real wheel
# ----------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The wheel built from a copy of this checkout (no build isolation: no download), `pip install --no-deps
    --target` into a plain folder: `{"wheel", "site", "env", "cwd"}`, `cwd` a folder outside the repository.

    The copy leaves out setuptools' `build/` folder: modules left there by an earlier build would ship in the wheel
    (a module since moved, or one missing from `packages`, would still be found)."""
    tmp_path = tmp_path_factory.mktemp("wheel")
    source = tmp_path / "source"
    outputs = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", "outputs")
    shutil.copytree(ROOT, source, ignore=outputs)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "--no-build-isolation", "-q", "-w",
         str(tmp_path / "dist")], check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("cegppo_trl-*.whl")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target", str(tmp_path / "site"),
         str(wheel)], check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-3000:]
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    return {"wheel": wheel, "site": tmp_path / "site", "env": _env(PYTHONPATH=str(tmp_path / "site")), "cwd": cwd}


def _run_installed(installed, command: str) -> subprocess.CompletedProcess:
    """`command` run by bash from outside the repository, `python` and the wheel's `bin/` first on PATH."""
    env = dict(installed["env"])
    env["PATH"] = os.pathsep.join([str(installed["site"] / "bin"), str(Path(sys.executable).parent), env["PATH"]])
    return subprocess.run(
        ["bash", "-c", command], check=False, cwd=installed["cwd"], env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_built_wheel_ships_the_recipes_and_configs_and_finds_them_by_name(installed):
    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for folder, package in SHIPPED.items():
        for path in (ROOT / folder).glob("*.yaml"):
            assert f"{package.replace('.', '/')}/{path.name}" in names, path
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "examples/")) for n in names)
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "cegppo_trl").rglob("*.py")}
    assert not sources - names, f"modules missing from the wheel: {sorted(sources - names)}"

    found = _run_installed(
        installed, "python -c 'from cegppo_trl import resources; print(resources.resolve_config(\"cpu_smoke\"))'"
    )
    assert found.returncode == 0, found.stderr[-2000:]
    assert found.stdout.strip() == str(installed["site"] / "cegppo_trl" / "recipes" / "cpu_smoke.yaml")

    # The README's first command after `pip install`: the quickstart and the `cegppo_trl.demos` modules it imports.
    quickstart = _run_installed(installed, "python -m cegppo_trl.demos.quickstart --help")
    assert quickstart.returncode == 0, quickstart.stderr[-2000:]
    assert quickstart.stdout.startswith("usage: python -m cegppo_trl.demos.quickstart")


@pytest.mark.slow
def test_the_installed_wheel_runs_cegppo_probe(installed):
    listed = _run_installed(installed, "cegppo --help")
    assert listed.returncode == 0 and "probe `cegppo probe --help`" in " ".join(listed.stdout.split()), listed.stdout
    probe = _run_installed(installed, "cegppo probe --help")
    assert probe.returncode == 0, probe.stderr[-2000:]
    assert probe.stdout.startswith("usage: cegppo probe") and "--probe_arms" in probe.stdout


@pytest.mark.slow
def test_launch_commands_of_the_docs_and_messages_work_from_the_installed_wheel(installed):
    shipped = installed["site"] / "cegppo_trl" / "accelerate_configs"
    # `accelerate launch --config_file "$(cegppo config-path NAME)"`: the installed file, by name, from anywhere.
    for name in ("deepspeed_zero2", "deepspeed_zero3.yaml", "fsdp2", "multi_gpu"):
        result = _run_installed(installed, f"cegppo config-path {name}")
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip() == str(shipped / (name.removesuffix(".yaml") + ".yaml"))
    result = _run_installed(installed, "cegppo config-path cpu_smoke")  # a recipe's path too
    assert result.stdout.strip() == str(installed["site"] / "cegppo_trl" / "recipes" / "cpu_smoke.yaml")
    result = _run_installed(installed, "cegppo config-path zero9")
    assert result.returncode == 2 and "deepspeed_zero2, deepspeed_zero3, fsdp2" in result.stderr
    assert "Traceback" not in result.stderr

    # Help that names no file a pip install lacks.
    for command in ("cegppo --help", "cegppo check --help"):
        result = _run_installed(installed, command)
        assert result.returncode == 0 and not _REPOSITORY_ONLY.search(result.stdout), (command, result.stdout)


# ----------------------------------------------------------------------------------------------------------------
# Pointers a pip user can follow
# ----------------------------------------------------------------------------------------------------------------
# Paths and install lines that exist only in a repository checkout.
_REPOSITORY_ONLY = re.compile(r"docs/|examples/|benchmarks/|-e \.|-e [\"']\.")


def _message_strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module except docstrings: messages, help texts, launch lines."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_package_messages_and_shipped_files_point_at_what_a_pip_install_has():
    found = [
        f"{path.relative_to(ROOT)}:{line}: {text[:100]!r}"
        for path in sorted((ROOT / "cegppo_trl").rglob("*.py"))
        for line, text in _message_strings(path)
        if _REPOSITORY_ONLY.search(text)
    ]
    for folder in SHIPPED:  # the recipes' and configs' comments, and the README shipped beside the configs
        for path in sorted((ROOT / folder).iterdir()):
            if path.suffix in (".yaml", ".md"):
                found += [
                    f"{path.relative_to(ROOT)}:{i}: {line}"
                    for i, line in enumerate(path.read_text().splitlines(), 1)
                    if _REPOSITORY_ONLY.search(line)
                ]
    assert not found, "repository-only paths where a pip user reads them:\n" + "\n".join(found)
