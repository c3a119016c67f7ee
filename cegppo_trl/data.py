"""The run's inputs, below both the pre-flight and the CLI: loading a dataset by name or path, mapping its columns onto
what TRL and the rewards read (prompt templates, the reference column, from the CLI's script arguments), and the
model-path check.

`cegppo_trl.scripts` (the CLI) and `cegppo_trl.preflight` both read from here; `offline` builds its tasks from the
same loader. Nothing here imports the trainer, the pre-flight or the CLI.
"""

from __future__ import annotations

import itertools
import logging
import os
from typing import TYPE_CHECKING, Any

from .rewards import REFERENCE_COLUMN, get_reward_func, likely_reference_column, reward_reads_reference

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from datasets import Dataset, DatasetDict, IterableDatasetDict


logger = logging.getLogger(__name__)

# Values a flag or YAML uses to mean "unset" for an optional string option (a flag cannot spell None).
NONE_STRINGS = ("", "none", "null")
SAMPLE_ROWS = 3
# What a model folder holds its weights in (transformers' and PEFT's files, sharded or not, and GGUF).
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")

# Files `datasets.load_dataset` reads with a packaged builder (a bare file path is not a dataset name).
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


def load_any_dataset(
    name: str | None, *, config: str | None = None, train_split: str = "train", streaming: bool = False
) -> DatasetDict | IterableDatasetDict:
    """Load `name` as a `DatasetDict`, from the Hub, a local dataset directory, a `save_to_disk` directory or a
    single data file (whose rows become the `train_split` split).

    With `streaming`, every source gives an `IterableDatasetDict`: rows are read as training consumes them (a
    `save_to_disk` directory is memory-mapped anyway, and is wrapped with `to_iterable_dataset`).
    """
    from datasets import Dataset, DatasetDict, IterableDatasetDict, load_dataset, load_from_disk

    if name is None:
        raise ValueError("`dataset_name` is required (a Hub id, a local directory, or a .json/.jsonl/.csv file).")
    if os.path.isdir(name) and any(
        os.path.exists(os.path.join(name, marker)) for marker in ("dataset_dict.json", "state.json")
    ):
        loaded = load_from_disk(name)
        if streaming:
            splits = loaded if isinstance(loaded, DatasetDict) else {train_split: loaded}
            return IterableDatasetDict({split: data.to_iterable_dataset() for split, data in splits.items()})
    elif os.path.isfile(name):
        builder = _FILE_BUILDERS.get(os.path.splitext(name)[1].lower())
        if builder is None:
            raise ValueError(f"Cannot load {name!r}: expected one of {sorted(_FILE_BUILDERS)}.")
        try:
            loaded = load_dataset(builder, data_files={train_split: name}, streaming=streaming)
        except Exception as error:  # datasets fails obscurely on empty files (StopIteration, ArrowInvalid, ...)
            if _data_file_is_empty(name, builder):
                raise ValueError(f"dataset {name!r} is empty (0 rows in the file).") from error
            raise
    else:  # a Hub id, or a path that is not there: datasets' own error says which
        loaded = load_dataset(name, name=config, streaming=streaming)
    if isinstance(loaded, Dataset):
        loaded = DatasetDict({train_split: loaded})
    return loaded


def _data_file_is_empty(path: str, builder: str) -> bool:
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(path).num_rows == 0
        except Exception:
            return False
    with open(path, "rb") as f:
        return not f.read(1 << 20).strip()  # nothing but whitespace in the first MiB: no rows


def _get_path(row: dict[str, Any], path: str) -> Any:
    value: Any = row  # a datasets row is a Mapping, not always a dict
    for key in path.split("."):
        try:
            value = value[key]
        except (KeyError, TypeError, IndexError):
            return None
    return value


def prepare_dataset(dataset: Dataset, script_args: Any, reward_funcs: list | None = None) -> Dataset:
    """Give the rows the `prompt` (and `solution`) columns TRL and the rewards read, applying the prompt options.

    Other columns stay and reach the reward functions as keyword arguments, as in TRL. `reward_funcs` (resolved from
    `script_args.reward_funcs` when None) decide whether the default `solution_column` is needed: when the data has
    no `solution` column and no selected reward reads one, none is mapped.
    """
    from datasets import IterableDataset

    if reward_funcs is None:
        reward_funcs = [get_reward_func(name) for name in script_args.reward_funcs]
    if script_args.max_train_samples is not None:
        if isinstance(dataset, IterableDataset):
            dataset = dataset.take(script_args.max_train_samples)
        else:
            dataset = dataset.select(range(min(script_args.max_train_samples, len(dataset))))
    if not isinstance(dataset, IterableDataset) and len(dataset) == 0:
        limit = script_args.max_train_samples
        after = "" if limit is None else f" after `max_train_samples={limit}`"
        raise ValueError(f"dataset {script_args.dataset_name!r} is empty (0 rows{after}): nothing to train on.")
    prompt_col = script_args.prompt_column
    solution_col = resolve_solution_column(script_args.solution_column, dataset.column_names, reward_funcs)
    problems = source_column_problems(
        dataset, prompt_col, solution_col, script_args.reward_funcs[: len(reward_funcs)], reward_funcs
    )
    if problems:
        raise ValueError(" ".join(problems))

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        out = {"prompt": _format_prompt(_get_path(row, prompt_col), script_args)}
        if solution_col is not None:
            gold = _get_path(row, solution_col)
            out["solution"] = None if gold is None else str(gold)
        return out

    if script_args.system_prompt is not None:
        _warn_on_own_system_messages(dataset, prompt_col)
    unchanged = (
        prompt_col == "prompt"
        and solution_col in (None, "solution")
        and script_args.prompt_template is None
        and script_args.system_prompt is None
        and not (script_args.chat_prompts and _first_prompt_is_text(dataset))
    )
    if unchanged:  # skip rewriting every row of a large dataset for nothing
        return dataset
    return dataset.map(convert)


def _opens_with_system_message(prompt: Any) -> bool:
    return (
        isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and prompt[0].get("role") == "system"
    )


def _warn_on_own_system_messages(dataset: Dataset, prompt_col: str) -> None:
    """`system_prompt` only fills in prompts without a system message: say how many keep their own."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):  # counting would read the whole stream: look at its first row
        first = next(iter(dataset), None)
        if first is not None and _opens_with_system_message(_get_path(first, prompt_col)):
            logger.warning(
                "`system_prompt` is not used for prompts that already open with a system message (the stream's "
                "first one does): the dataset's own system message wins; the others get `system_prompt`."
            )
        return
    rows = dataset.select_columns([prompt_col.split(".")[0]])
    own = sum(_opens_with_system_message(_get_path(row, prompt_col)) for row in rows)
    if own:
        logger.warning(
            "`system_prompt` is not used for %d of %d prompts: they already open with a system message, which wins "
            "(the other %d get `system_prompt`). To use yours everywhere, drop the system messages from the data.",
            own,
            len(rows),
            len(rows) - own,
        )


def _first_prompt_is_text(dataset: Dataset) -> bool:
    from datasets import Dataset

    # Streaming datasets cannot be peeked cheaply; mapping them is lazy, so assume text.
    return not isinstance(dataset, Dataset) or isinstance(dataset[0]["prompt"], str)


def _format_prompt(prompt: Any, script_args: Any) -> Any:
    template, system = script_args.prompt_template, script_args.system_prompt
    if prompt is None or (isinstance(prompt, list) and not prompt):
        return prompt  # left for the pre-flight to name the row
    if isinstance(prompt, str):
        text = template.replace("{prompt}", prompt) if template else prompt
        if not (script_args.chat_prompts or system):
            return text
        messages = [{"role": "user", "content": text}]
    else:  # conversational: a list of {"role", "content"} messages
        messages = [dict(m) for m in prompt]
        if template:
            users = [i for i, m in enumerate(messages) if m.get("role") == "user"]  # none: the pre-flight says why
            if users:
                messages[users[-1]]["content"] = template.replace("{prompt}", str(messages[users[-1]]["content"]))
    if system and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages


def short_repr(value: Any, limit: int = 70) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sample_rows(dataset: Any, n: int = SAMPLE_ROWS) -> list[dict]:
    """The first `n` rows (a streaming dataset reads only those)."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        return list(itertools.islice(iter(dataset), n))
    return [dataset[i] for i in range(min(n, len(dataset)))]


def type_name(value: Any) -> str:
    if isinstance(value, list):
        inner = {type_name(v) for v in value[:3]}
        return f"list[{'|'.join(sorted(inner))}]" if inner else "list"
    return type(value).__name__


def is_prompt(value: Any) -> bool:
    if isinstance(value, str):
        return True
    # TRL's `is_conversational` reads the `role` key (a tool-calling assistant turn may carry no `content`)
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(m, dict) and ("role" in m or "content" in m) for m in value)
    )


# ----------------------------------------------------------------------------------------------------------------
# Source data (command line): the columns the options name, before they are mapped onto `prompt` / `solution`
# ----------------------------------------------------------------------------------------------------------------
def resolve_solution_column(
    solution_column: str | None, columns: Sequence[str] | None, reward_funcs: Sequence[Callable]
) -> str | None:
    """The reference column to map: None when the default `solution` is absent and no selected reward reads it."""
    if solution_column != REFERENCE_COLUMN or columns is None or REFERENCE_COLUMN in columns:
        return solution_column
    if reward_funcs and all(reward_reads_reference(func) is False for func in reward_funcs):
        return None
    return solution_column


def source_column_problems(
    dataset: Any,
    prompt_column: str,
    solution_column: str | None,
    reward_names: Sequence[str] = (),
    reward_funcs: Sequence[Callable] = (),
) -> list[str]:
    """What is wrong with `prompt_column` / `solution_column` in the loaded data, every path component checked.

    A dotted path (`reward_model.ground_truth`) is followed field by field through the first rows (a `datasets` row
    holds every field of the schema, `None` where a record lacks it), so a misspelled nested field is named instead of
    passing `None` to every reward.
    """
    import difflib

    columns = dataset.column_names
    rows = sample_rows(dataset)
    problems = []
    readers = [n for n, f in zip(reward_names, reward_funcs, strict=False) if reward_reads_reference(f)]
    for option, path in (("prompt_column", prompt_column), ("solution_column", solution_column)):
        if path is None:
            continue
        keys = path.split(".")
        top = list(columns) if columns is not None else (list(rows[0]) if rows else None)
        if top is None:
            continue
        values: list[Any] = rows
        available = top
        for depth, key in enumerate(keys):
            if available is not None and key not in available:
                where = "the dataset" if depth == 0 else f"`{'.'.join(keys[:depth])}`"
                close = difflib.get_close_matches(key, [str(a) for a in available], n=1, cutoff=0.6)
                likely = likely_reference_column(available) if option == "solution_column" and depth == 0 else None
                if likely:
                    hint = f" The reference answer looks like it is in `{likely}`: pass `--solution_column {likely}`."
                elif close:
                    hint = f" Did you mean `{'.'.join([*keys[:depth], close[0]])}`?"
                elif option == "solution_column" and depth == 0:
                    hint = " Name the column that holds the reference answer with `--solution_column`."
                else:
                    hint = ""
                if option == "solution_column" and path == REFERENCE_COLUMN and readers:
                    hint += f" ({', '.join(readers)} read(s) the reference as `solution`.)"
                elif option == "solution_column" and depth == 0:
                    hint += " `solution_column: null` runs reference-free rewards only."
                kind = "a column of" if depth == 0 else "a field of"
                problems.append(
                    f"`{option}={path}`: `{key}` is not {kind} {where} (its {'columns' if depth == 0 else 'fields'}: "
                    f"{', '.join(map(str, available))}).{hint}"
                )
                break
            values = [v.get(key) if isinstance(v, dict) else None for v in values]
            nested = [v for v in values if v is not None]
            if depth < len(keys) - 1:
                if nested and not all(isinstance(v, dict) for v in nested):
                    problems.append(
                        f"`{option}={path}`: `{'.'.join(keys[: depth + 1])}` holds {type_name(nested[0])} values, "
                        "not records with fields: a dotted path reads a nested field."
                    )
                    break
                available = sorted({k for v in nested for k in v}) if nested else None
        else:
            given = [
                v for v in values if v is not None
            ]  # a None prompt is a row's problem: the pre-flight names the row
            if option == "prompt_column" and given and not all(is_prompt(v) for v in given):
                bad = next(v for v in given if not is_prompt(v))
                text_columns = [c for c in top if c != path and rows and isinstance(rows[0].get(c), str)]
                hint = f" (text columns: {', '.join(text_columns)})" if text_columns else ""
                problems.append(
                    f"`prompt_column={path}` holds {type_name(bad)} values (e.g. {short_repr(bad)}), not text or a list "
                    f"of chat messages: the tokenizer cannot read them. Name the column with the prompt text with "
                    f"`--prompt_column`{hint}."
                )
    return problems


# ----------------------------------------------------------------------------------------------------------------
# Paths and lengths
# ----------------------------------------------------------------------------------------------------------------
def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the local Hugging Face cache holds `repo_id`'s `config.json` (no network)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(repo_id, "config.json"), str)
    except Exception:  # not a valid repo id for the cache either
        return False


def check_model_path(name: str, field: str = "model_name_or_path") -> None:
    """Refuse a model name that is neither a local directory nor reachable as a Hub id, before any download, and a
    local directory without a weights file.

    A missing path that looks like one (`./`, `../`, `/`, `~`, an existing parent folder) or a name without the
    `owner/name` form of a Hub id, that the local cache does not hold, is a mistyped local folder: transformers would
    retry the Hub for minutes and then report an invalid repo id. Offline (`HF_HUB_OFFLINE=1`), a Hub id that is not
    cached is refused the same way.
    """
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        weights = [f for f in os.listdir(expanded) if f.endswith(WEIGHTS_SUFFIXES)]
        if not weights:  # transformers fails the same after the trainer starts: its type (OSError), its words
            raise OSError(
                f"`{field}`: no file named model.safetensors or pytorch_model.bin (or another weights file: "
                f"{', '.join(WEIGHTS_SUFFIXES)}) found in directory {expanded}: the model cannot load. Point to the "
                "folder `save_pretrained` wrote, or finish copying it."
            )
        return
    if os.path.exists(expanded):
        return
    parent = os.path.dirname(expanded.rstrip("/"))
    looks_like_path = name.startswith(("./", "../", "/", "~")) or (parent != "" and os.path.isdir(parent))
    repo_form = name.count("/") == 1 and not looks_like_path
    if looks_like_path or (not repo_form and not _in_hub_cache(name)):
        raise ValueError(
            f"`{field}`: no model at {os.path.abspath(expanded)} ({name!r} is not a local directory, and not a Hub id "
            "of the form `owner/name`). Give a local directory written by `save_pretrained` or a Hub id such as "
            "`Qwen/Qwen2.5-0.5B-Instruct`."
        )
    if _hub_offline() and not _in_hub_cache(name):
        raise ValueError(
            f"`{field}`: {name!r} is not a local directory, and HF_HUB_OFFLINE=1 while the Hub cache does not hold "
            "it. Check the path, or run once online (unset HF_HUB_OFFLINE) to download it."
        )
