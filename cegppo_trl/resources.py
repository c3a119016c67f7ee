"""The shipped recipes and accelerate configs by name: a wheel's package data, or a checkout's folders."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def recipes_dir() -> Path:
    return _PACKAGE / "recipes" if (_PACKAGE / "recipes").is_dir() else _PACKAGE.parent / "examples" / "recipes"


def accelerate_configs_dir() -> Path:
    return _PACKAGE / "accelerate_configs" if (_PACKAGE / "accelerate_configs").is_dir() else _PACKAGE.parent / "accelerate_configs"  # fmt: skip


def recipe_names(folder: Path | None = None) -> list[str]:
    folder = recipes_dir() if folder is None else folder
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _resolve(value: str, folder: Path, what: str) -> str:
    """`value` when it is a file, else the shipped YAML of that name; a `ValueError` listing the shipped ones."""
    name, names = Path(value).name.removesuffix(".yaml").removesuffix(".yml"), recipe_names(folder)
    if os.path.isfile(value) or (name in names and "/" not in value):
        return value if os.path.isfile(value) else str(folder / f"{name}.yaml")
    hint = f" A {what} of that name ships with the package: `{name}`." if name in names else ""
    raise ValueError(f"{value!r} is neither a file nor a shipped {what} name.{hint} Shipped {what}s (in {folder}): "
                     f"{', '.join(names)}.")  # fmt: skip


def resolve_accelerate_config(value: str) -> str:
    return _resolve(value, accelerate_configs_dir(), "accelerate config")


def resolve_config(value: str) -> str:
    """The YAML `--config value` means: a path, or a shipped recipe's name (`cpu_smoke`)."""
    return _resolve(value, recipes_dir(), "recipe")
