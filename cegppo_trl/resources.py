"""The recipes and accelerate configs shipped with the package, found by name (`cegppo train --config cpu_smoke`).

In an installed wheel they are package data, `cegppo_trl/recipes/*.yaml` and `cegppo_trl/accelerate_configs/*.yaml`
(pyproject.toml maps the repository's `examples/recipes/` and `accelerate_configs/` there); in a source checkout or
an editable install they are those repository folders. Imports nothing heavy, so `cegppo --help` stays fast.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "accelerate_config_names",
    "accelerate_configs_dir",
    "config_path",
    "recipe_names",
    "recipes_dir",
    "resolve_accelerate_config",
    "resolve_config",
    "resolve_config_args",
]

_PACKAGE = Path(__file__).resolve().parent


def _shipped_dir(installed: str, *in_repository: str) -> Path:
    wheel = _PACKAGE / installed
    return wheel if wheel.is_dir() else _PACKAGE.parent.joinpath(*in_repository)


def recipes_dir() -> Path:
    """The folder of the shipped training recipes (`cegppo train --config NAME` reads `NAME.yaml` there)."""
    return _shipped_dir("recipes", "examples", "recipes")


def accelerate_configs_dir() -> Path:
    """The folder of the shipped accelerate configs (`accelerate launch --config_file <folder>/multi_gpu.yaml`)."""
    return _shipped_dir("accelerate_configs", "accelerate_configs")


def _yaml_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def recipe_names() -> list[str]:
    """Names of the shipped recipes (file names without `.yaml`), sorted."""
    return _yaml_names(recipes_dir())


def accelerate_config_names() -> list[str]:
    """Names of the shipped accelerate configs (file names without `.yaml`), sorted."""
    return _yaml_names(accelerate_configs_dir())


def resolve_accelerate_config(value: str) -> str:
    """The accelerate config `value` means: `value` itself when it is a file, else the shipped config of that name.

    A repository path that does not exist here (`accelerate_configs/deepspeed_zero3.yaml` after `pip install`, or
    run outside the repository) falls back to the shipped config with the same file name, so the repository's
    commands work from an installed package.

    Args:
        value: a path, or a shipped config's name with or without `.yaml` (`deepspeed_zero3`).

    Returns:
        A path to an existing file.

    Raises:
        ValueError: neither a file nor a shipped config; the message lists the shipped ones.
    """
    if os.path.isfile(value):
        return value
    name = Path(value).name.removesuffix(".yaml").removesuffix(".yml")
    if name in accelerate_config_names():
        return str(accelerate_configs_dir() / f"{name}.yaml")
    shipped = ", ".join(accelerate_config_names()) or "none found"
    raise ValueError(
        f"{value!r} is neither a file nor a shipped accelerate config. Shipped configs (in "
        f"{accelerate_configs_dir()}): {shipped}. Give one of these names or the path of your own accelerate config."
    )


def config_path(value: str) -> str:
    """The installed path of a shipped accelerate config or recipe, by name (`cegppo config-path deepspeed_zero2`).

    Accelerate configs are looked up first (`accelerate launch --config_file "$(cegppo config-path NAME)"`), then
    recipes; a path that exists is returned as it is.

    Raises:
        ValueError: no shipped config or recipe of that name; the message lists both.
    """
    try:
        return os.path.abspath(resolve_accelerate_config(value))
    except ValueError:
        pass
    try:
        return os.path.abspath(resolve_config(value))
    except ValueError:
        raise ValueError(
            f"{value!r} is neither a shipped accelerate config ({', '.join(accelerate_config_names())}) nor a shipped "
            f"recipe ({', '.join(recipe_names())})."
        ) from None


def resolve_config(value: str) -> str:
    """The YAML file `--config value` means: `value` itself when it is a file, else the shipped recipe of that name.

    Args:
        value: a path, or a recipe name with or without `.yaml` (`cpu_smoke`, `cpu_smoke.yaml`).

    Returns:
        A path to an existing file.

    Raises:
        ValueError: neither a file nor a shipped recipe; the message lists the shipped recipes and their folder.
    """
    if os.path.isfile(value):
        return value
    name = value.removesuffix(".yaml").removesuffix(".yml")
    names = recipe_names()
    has_folder = os.sep in value or "/" in value
    if not has_folder and name in names:
        return str(recipes_dir() / f"{name}.yaml")
    stem = Path(name).name
    hint = f" A recipe of that name ships with the package: `--config {stem}`." if has_folder and stem in names else ""
    shipped = ", ".join(names) if names else "none found"
    raise ValueError(
        f"--config {value!r} is neither a file nor a shipped recipe name.{hint} Shipped recipes (in "
        f"{recipes_dir()}): {shipped}. Give one of these names or the path of your own YAML file (`cegppo recipes` "
        "lists them)."
    )


def resolve_config_args(args: list[str]) -> list[str]:
    """`args` with the value of `--config` (also written `--config=value`) resolved by `resolve_config`.

    TRL's `TrlParser` reads `--config PATH` (as two arguments) before parsing; this runs first, so a recipe name
    works wherever a path does.

    Raises:
        ValueError: `--config` without a value, or a value `resolve_config` cannot resolve.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--config" or arg.startswith("--config="):
            if arg == "--config":
                if i + 1 >= len(args) or args[i + 1].startswith("--"):
                    raise ValueError("--config needs a value: a recipe name (`cegppo recipes` lists them) or a path.")
                value, i = args[i + 1], i + 2
            else:
                value, i = arg.partition("=")[2], i + 1
            out += ["--config", resolve_config(value)]
            continue
        out.append(arg)
        i += 1
    return out
