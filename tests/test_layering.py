"""The package reads one way: three layers, floors inside the core, and no import makes a circle.

- **Layers.** The core (every module of `cegppo_trl` outside `research/` and `demos/`: what `from cegppo_trl import
  CEGPPOTrainer, CEGPPOConfig` imports, the rewards, the checkpoints, `cegppo train` / `check`) imports nothing from
  the other two; `research/` (the probe, the statistics, the baselines) may import the core; `demos/` (the offline
  models and tasks, the quickstart) may import the core and `research/`. `cegppo probe` reaches the research layer
  through an entry point (pyproject.toml's `cegppo.commands`), not an import.
- **Floors.** Each core module imports only from its own floor or below (`FLOORS`); a new core module fails here
  until it is given a floor, a module that is gone may stay listed.

Each module's `from .x import` / `from ..x import` / `import cegppo_trl.x` lines and `importlib.import_module("...")`
calls are read from its source (top level, inside functions and under `TYPE_CHECKING` alike: a lazy import is still
an arrow) and resolved to module names.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "cegppo_trl"

# Layer of a module by its first dotted part; anything else is the core. A layer imports only its own and lower ones.
LAYERS = {"research": 1, "demos": 2}
LAYER_NAMES = {0: "core", 1: "research", 2: "demos"}

# Floor of each core module: higher floors import lower ones, never the reverse.
FLOORS = {
    # 0 pure math: tensors and numbers
    "loss": 0, "schedules": 0, "rollouts": 0,
    # 1 facts: settings, releases, the reward registry, shipped files
    "config": 1, "trl_compat": 1, "rewards": 1, "resources": 1,
    # 2 inputs: datasets, paths
    # 3 run safety: the run's inputs and files, never the command line
    "checkpoints": 3, "safe_load": 3, "rollout_state": 3, "monitoring": 3, "modelcard": 3,
    # 4 wiring: TRL's hooks
    "trainer": 4, "checkpoint_hooks": 4,
    # 5 entry points: arguments, YAML, printing
    "scripts": 5, "preflight": 5, "cli": 5,
}  # fmt: skip
# Package roots re-export (lazily) from any floor; they are not floors themselves.
ROOTS = {"", "research", "demos"}


def layer(module: str) -> int:
    return LAYERS.get(module.split(".")[0], 0)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _known(name: str, modules: set[str]) -> str | None:
    """`name` or the longest dotted prefix of it that is a module of the package (`x.y.attr` -> `x.y`)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name if name in modules else ("" if name == "" else None)


def _absolute(name: str) -> list[str]:
    """`cegppo_trl.x.y` -> [`x.y`]; a name outside the package -> []."""
    return [name.removeprefix("cegppo_trl").strip(".")] if name.split(".")[0] == "cegppo_trl" else []


def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (package roots left out)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom):  # `from STEM import NAME`: NAME may be a module of STEM
                if node.level:
                    base = package.split(".") if package else []
                    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                    stems = [".".join([*base, *(node.module.split(".") if node.module else [])])]
                else:
                    stems = _absolute(node.module or "")
                names = [f"{stem}.{a.name}".strip(".") for stem in stems for a in node.names]
            elif isinstance(node, ast.Import):
                names = [n for a in node.names for n in _absolute(a.name)]
            elif (
                isinstance(node, ast.Call)
                and (getattr(node.func, "attr", None) or getattr(node.func, "id", None)) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):  # importlib.import_module("cegppo_trl.x") or, with a package argument, (".x", ...)
                name = node.args[0].value
                names = _absolute(name) if not name.startswith(".") else [f"{package}{name}".strip(".")]
            else:
                continue
            targets.update(t for n in names if (t := _known(n, modules)) is not None)
        graph[module] = {t for t in targets if t not in ROOTS and t != module}
    return graph


def test_the_core_imports_nothing_from_research_or_demos_and_research_nothing_from_demos():
    upward = sorted(
        f"{module} ({LAYER_NAMES[layer(module)]}) -> {target} ({LAYER_NAMES[layer(target)]})"
        for module, targets in imports().items()
        for target in targets
        if layer(target) > layer(module)
    )
    assert not upward, "imports against the layers:\n" + "\n".join(upward)


def test_every_core_module_has_a_floor():
    unplaced = sorted(m for m in imports() if m not in ROOTS and layer(m) == 0 and m not in FLOORS)
    assert not unplaced, f"give these core modules a floor in FLOORS (or move them to research/ or demos/): {unplaced}"


def test_no_core_module_imports_one_above_it():
    upward = sorted(
        f"{module} (floor {FLOORS[module]}) -> {target} (floor {FLOORS[target]})"
        for module, targets in imports().items()
        if module in FLOORS
        for target in targets
        if target in FLOORS and FLOORS[target] > FLOORS[module]
    )
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_no_import_circle():
    graph = imports()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, "import circles:\n" + "\n".join(circles)


def test_the_layers_are_where_the_package_says():
    """The folders exist and hold what their names promise, so the checks above are not vacuous."""
    modules = set(imports())
    assert {"research.probe", "research.stats", "research.baselines"} <= modules
    assert {"demos.quickstart", "demos.tiny", "demos.tasks", "demos.runs"} <= modules
    assert {"trainer", "config", "loss", "cli"} <= {m for m in modules if layer(m) == 0}
    graph = imports()
    assert "research.stats" in graph["research.probe"] and "research.trainer" in graph["research.probe"]
    assert "trainer" in graph["research.trainer"]
    assert "research.baselines" in graph["demos.runs"] and "trainer" in graph["demos.runs"]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from .trainer import X", {"trainer"}),
        ("def f():\n    from .scripts import main", {"scripts"}),
        ("from . import preflight", {"preflight"}),
        ("from cegppo_trl.scripts import load_any_dataset", {"scripts"}),
        ("from cegppo_trl import research", set()),  # a package root re-exports nothing
        ("from cegppo_trl.research import probe", {"research.probe"}),
        ("from .research.probe import main", {"research.probe"}),
        ("import cegppo_trl.demos.tiny as tiny", {"demos.tiny"}),
        ("import importlib\nimportlib.import_module('cegppo_trl.research.probe')", {"research.probe"}),
        ("from importlib import import_module\nimport_module('.demos.tiny', 'cegppo_trl')", {"demos.tiny"}),
    ],
)
def test_the_reader_sees_top_level_lazy_absolute_and_dynamic_imports(tmp_path, monkeypatch, source, expected):
    """The checker itself: an arrow hidden in a function, written absolutely or by `import_module` is still found."""
    package = tmp_path / "cegppo_trl"
    for folder in ("research", "demos"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    for name in ("__init__", "trainer", "scripts", "preflight", "data", "cli", "research/probe", "demos/tiny"):
        (package / f"{name}.py").write_text("")
    (package / "cli.py").write_text(source + "\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", package)
    assert imports()["cli"] == expected
    if expected and layer(next(iter(expected))):
        with pytest.raises(AssertionError, match="imports against the layers"):
            test_the_core_imports_nothing_from_research_or_demos_and_research_nothing_from_demos()


def test_the_trainer_reaches_the_preflight_by_no_chain_of_imports():
    """The pre-flight is the command line's (floor 5): `CEGPPOTrainer` builds without it, so its constructor cannot
    enter it (it entered it 7 times before `GRPOTrainer` saw the model)."""
    graph, seen, todo = imports(), set(), ["trainer"]
    while todo:
        module = todo.pop()
        seen.add(module)
        todo += [t for t in graph.get(module, ()) if t not in seen]
    assert "preflight" not in seen and "scripts" not in seen, sorted(seen)
    assert FLOORS["preflight"] == 5


@pytest.mark.slow
def test_importing_the_trainer_and_running_the_cli_load_no_research_or_demo_module():
    """At run time too: `from cegppo_trl import CEGPPOTrainer, CEGPPOConfig`, a trainer's config and `cegppo --help`
    leave no `cegppo_trl.research*` or `cegppo_trl.demos*` module in `sys.modules` (`cegppo --help` lists the probe by
    its entry point, importing neither it nor its package)."""
    script = (
        "import sys, contextlib, io\n"
        "import cegppo_trl\n"
        "from cegppo_trl import CEGPPOTrainer, CEGPPOConfig\n"
        "CEGPPOConfig(output_dir='unused', use_cpu=True, bf16=False, report_to='none')\n"
        "from cegppo_trl import cli\n"
        "out = io.StringIO()\n"
        "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(out):\n"
        "    cli.main(['--help'])\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(('cegppo_trl.research', 'cegppo_trl.demos')))\n"
        "print(out.getvalue())\n"
        "print('trainer' if 'cegppo_trl.trainer' in sys.modules else 'no trainer', loaded)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split()[-2:] == ["trainer", "[]"], result.stdout
    help_text = " ".join(result.stdout.split())
    assert "probe `cegppo probe --help` (cegppo_trl.research.probe:main)" in help_text  # listed, not imported


def test_building_a_trainer_calls_nothing_in_the_preflight(make_trainer, monkeypatch):
    """At run time too: with every function of `preflight` replaced by one that records its call, a trainer is built
    and takes an optimizer step, and nothing was called."""
    import inspect

    from cegppo_trl import preflight

    calls = []
    for name, func in inspect.getmembers(preflight, inspect.isfunction):
        if func.__module__ == preflight.__name__:
            monkeypatch.setattr(preflight, name, lambda *a, _name=name, **k: calls.append(_name))
    make_trainer(max_steps=1).train()
    assert calls == []
