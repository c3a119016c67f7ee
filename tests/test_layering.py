"""The house reads one way: every module imports only from its own floor or below, and no import makes a circle.

Each module's `from .x import` / `from ..x import` / `import cegppo_trl.x` lines are read from its source (top level,
inside functions and under `TYPE_CHECKING` alike: a lazy import is still an arrow), resolved to module names, and
checked against `FLOORS`. A new module fails here until it is given a floor.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "cegppo_trl"

# Floor of each module (a package's modules by their dotted path): higher floors import lower ones, never the reverse.
FLOORS = {
    # 0 pure math: tensors and numbers
    "_spec": 0, "loss": 0, "aggregation": 0, "schedules": 0, "controller": 0, "rollouts": 0, "baselines": 0, "stats": 0,
    # 1 facts: settings, releases, the reward registry, shipped files
    "config": 1, "trl_compat": 1, "rewards": 1, "resources": 1,
    # 2 inputs: datasets, paths; offline tasks, models and tokenizers built from floors 0-2
    "offline.tasks": 2, "offline.tiny": 2, "offline.plots": 2, "offline.smollm2": 2, "offline.warmup": 2,
    # 3 run safety: the run's inputs and files, never the command line
    "checkpoints": 3, "safe_load": 3, "rollout_state": 3, "monitoring": 3, "modelcard": 3,
    # 4 wiring: TRL's hooks
    "trainer": 4, "checkpoint_hooks": 4,
    # 5 entry points: arguments, YAML, printing
    "scripts": 5, "preflight": 5, "cli": 5, "probe": 5, "offline.runs": 5, "quickstart.run": 5, "quickstart.__main__": 5,
}  # fmt: skip
# Package roots re-export (lazily) from any floor; they are not floors themselves.
ROOTS = {"", "offline", "quickstart"}


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


def imports() -> dict[str, set[str]]:
    """Module -> the package modules it imports (package roots left out)."""
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                stem = ".".join([*base, *(node.module.split(".") if node.module else [])])
                names = [f"{stem}.{a.name}".strip(".") for a in node.names] if node.module is None else [stem]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cegppo_trl"):
                names = [node.module.removeprefix("cegppo_trl").strip(".")]
            elif isinstance(node, ast.Import):
                names = [a.name.removeprefix("cegppo_trl").strip(".") for a in node.names
                         if a.name.split(".")[0] == "cegppo_trl"]  # fmt: skip
            else:
                continue
            targets.update(t for n in names if (t := _known(n, modules)) is not None)
        graph[module] = {t for t in targets if t not in ROOTS and t != module}
    return graph


def test_every_module_has_a_floor():
    unplaced = sorted(m for m in imports() if m not in ROOTS and m not in FLOORS)
    assert not unplaced, f"give these modules a floor in FLOORS: {unplaced}"


def test_no_module_imports_one_above_it():
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


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from .trainer import X", {"trainer"}),
        ("def f():\n    from .scripts import main", {"scripts"}),
        ("from . import preflight", {"preflight"}),
        ("from cegppo_trl.data import load_any_dataset", {"data"}),
    ],
)
def test_the_reader_sees_top_level_lazy_and_absolute_imports(tmp_path, monkeypatch, source, expected):
    """The checker itself: an arrow hidden in a function or written absolutely is still found."""
    package = tmp_path / "cegppo_trl"
    package.mkdir()
    for name in ("__init__", "trainer", "scripts", "preflight", "data"):
        (package / f"{name}.py").write_text("")
    (package / "probe.py").write_text(source + "\n")
    monkeypatch.setattr(f"{__name__}.PACKAGE", package)
    assert imports()["probe"] == expected


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
