"""The recipes and accelerate configs shipped with the package, found by name (`cegppo train --config cpu_smoke`).

In a wheel they are package data (`cegppo_trl/recipes/`, `cegppo_trl/accelerate_configs/`); in a checkout, the
repository's `examples/recipes/` and `accelerate_configs/`. Imports nothing heavy.
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _shipped_dir(installed: str, *in_repository: str) -> Path:
    return _PACKAGE / installed if (_PACKAGE / installed).is_dir() else _PACKAGE.parent.joinpath(*in_repository)


def recipes_dir() -> Path:
    return _shipped_dir("recipes", "examples", "recipes")


def accelerate_configs_dir() -> Path:
    return _shipped_dir("accelerate_configs", "accelerate_configs")


def recipe_names(folder: Path | None = None) -> list[str]:
    """The YAML files' names (without `.yaml`) in `folder`, the recipes by default, sorted."""
    folder = recipes_dir() if folder is None else folder
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _resolve(value: str, folder: Path, what: str) -> str:
    """`value` when it is a file, else the shipped YAML of that name (a repository path missing after `pip install`
    is named by its file name); `ValueError` listing the shipped ones otherwise."""
    if os.path.isfile(value):
        return value
    name, names = Path(value).name.removesuffix(".yaml").removesuffix(".yml"), recipe_names(folder)
    if name in names and (what != "recipe" or "/" not in value):
        return str(folder / f"{name}.yaml")
    hint = f" A recipe of that name ships with the package: `--config {name}`." if name in names else ""
    subject = f"--config {value!r}" if what == "recipe" else repr(value)
    raise ValueError(f"{subject} is neither a file nor a shipped {what} name.{hint} Shipped {what}s (in {folder}): "
                     f"{', '.join(names) or 'none found'}.")  # fmt: skip


def resolve_accelerate_config(value: str) -> str:
    """The accelerate config `value` means: a path, or a shipped config's name (`deepspeed_zero3`)."""
    return _resolve(value, accelerate_configs_dir(), "accelerate config")


def resolve_config(value: str) -> str:
    """The YAML `--config value` means: a path, or a shipped recipe's name (`cpu_smoke`)."""
    return _resolve(value, recipes_dir(), "recipe")


def config_path(value: str) -> str:
    """The installed path of a shipped accelerate config, else recipe, by name (`cegppo config-path deepspeed_zero2`)."""
    for resolve in (resolve_accelerate_config, resolve_config):
        try:
            return os.path.abspath(resolve(value))
        except ValueError:
            pass
    raise ValueError(f"{value!r} is neither a shipped accelerate config ({', '.join(recipe_names(accelerate_configs_dir()))}) "
                     f"nor a shipped recipe ({', '.join(recipe_names())}).")  # fmt: skip


def resolve_config_args(args: list[str]) -> list[str]:
    """`args` with the value of `--config` (or `--config=value`) resolved by `resolve_config`, before TRL's parser
    reads it (TRL's reads `--config PATH` only)."""
    out, rest = [], list(args)
    while rest:
        arg = rest.pop(0)
        if arg == "--config" and (not rest or rest[0].startswith("--")):
            raise ValueError("--config needs a value: a recipe name (`cegppo recipes` lists them) or a path.")
        if arg == "--config" or arg.startswith("--config="):
            out += ["--config", resolve_config(arg.partition("=")[2] or rest.pop(0))]
        else:
            out.append(arg)
    return out
