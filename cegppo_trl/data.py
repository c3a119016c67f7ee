"""The run's inputs: a dataset by name or path, its columns mapped onto what TRL and the rewards read (prompt
template, system prompt, the reference column, from the command line's script arguments), and the model-path check.

Read by the command line (`scripts`), its pre-flight and the demos; nothing here imports them or the trainer.
"""

from __future__ import annotations

import difflib
import itertools
import logging
import os
from typing import Any

from .rewards import REFERENCE_COLUMN, get_reward_func, likely_reference_column, reward_reads_reference

logger = logging.getLogger(__name__)

NONE_STRINGS = ("", "none", "null")  # what a flag or YAML value uses to mean "unset" (a flag cannot spell None)
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")  # transformers', PEFT's and GGUF weights files
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


def load_any_dataset(name: str | None, *, config: str | None = None, train_split: str = "train",
                     streaming: bool = False) -> Any:  # fmt: skip
    """`name` as a `DatasetDict` (an `IterableDatasetDict` with `streaming`): a Hub id, a local dataset directory,
    a `save_to_disk` directory or one data file (whose rows become the `train_split` split)."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict, load_dataset, load_from_disk

    if name is None:
        raise ValueError("`dataset_name` is required (a Hub id, a local directory, or a .json/.jsonl/.csv file).")
    if os.path.isdir(name) and any(os.path.exists(os.path.join(name, m)) for m in ("dataset_dict.json", "state.json")):
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
    return DatasetDict({train_split: loaded}) if isinstance(loaded, Dataset) else loaded


def _data_file_is_empty(path: str, builder: str) -> bool:
    if builder == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_metadata(path).num_rows == 0
        except Exception:
            return False
    with open(path, "rb") as f:
        return not f.read(1 << 20).strip()  # nothing but whitespace in the first MiB: no rows


def _get_path(row: Any, path: str) -> Any:
    value = row  # a datasets row is a Mapping, not always a dict
    for key in path.split("."):
        try:
            value = value[key]
        except (KeyError, TypeError, IndexError):
            return None
    return value


def prepare_dataset(dataset: Any, script_args: Any, reward_funcs: list | None = None) -> Any:
    """Give the rows the `prompt` (and `solution`) columns TRL and the rewards read, applying the prompt options.

    Other columns stay and reach the rewards as keyword arguments, as in TRL. With the default `solution_column` and
    data without it, no reference is mapped when no selected reward reads one.
    """
    from datasets import Dataset, IterableDataset

    funcs = [get_reward_func(name) for name in script_args.reward_funcs] if reward_funcs is None else reward_funcs
    limit = script_args.max_train_samples
    if limit is not None:
        streaming = isinstance(dataset, IterableDataset)
        dataset = dataset.take(limit) if streaming else dataset.select(range(min(limit, len(dataset))))
    if not isinstance(dataset, IterableDataset) and len(dataset) == 0:
        after = "" if limit is None else f" after `max_train_samples={limit}`"
        raise ValueError(f"dataset {script_args.dataset_name!r} is empty (0 rows{after}): nothing to train on.")
    prompt_col, solution_col = script_args.prompt_column, script_args.solution_column
    columns = dataset.column_names
    if solution_col == REFERENCE_COLUMN and columns is not None and REFERENCE_COLUMN not in columns:
        if funcs and all(reward_reads_reference(f) is False for f in funcs):
            solution_col = None  # no selected reward reads a reference
    readers = [n for n, f in zip(script_args.reward_funcs, funcs, strict=False) if reward_reads_reference(f)]
    if problems := column_problems(dataset, prompt_col, solution_col, readers):
        raise ValueError(" ".join(problems))
    system = script_args.system_prompt
    if system is not None and isinstance(dataset, Dataset):  # a prompt's own system message wins: say how often
        own = sum(
            _opens_with_system(_get_path(row, prompt_col))
            for row in dataset.select_columns([prompt_col.split(".")[0]])
        )
        if own:
            logger.warning(
                "`system_prompt` is not used for %d of %d prompts: they already open with a system message, which "
                "wins (the other %d get `system_prompt`). To use yours everywhere, drop the system messages from "
                "the data.", own, len(dataset), len(dataset) - own,
            )  # fmt: skip
    first_is_text = not isinstance(dataset, Dataset) or isinstance(dataset[0][prompt_col.split(".")[0]], str)
    if (prompt_col, script_args.prompt_template, system) == ("prompt", None, None) and solution_col in (
        None, REFERENCE_COLUMN) and not (script_args.chat_prompts and first_is_text):  # fmt: skip
        return dataset  # nothing to rewrite

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        out = {"prompt": _format_prompt(_get_path(row, prompt_col), script_args)}
        if solution_col is not None:
            gold = _get_path(row, solution_col)
            out["solution"] = None if gold is None else str(gold)
        return out

    return dataset.map(convert)


def _opens_with_system(prompt: Any) -> bool:
    return (
        isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) and prompt[0].get("role") == "system"
    )


def _format_prompt(prompt: Any, script_args: Any) -> Any:
    template, system = script_args.prompt_template, script_args.system_prompt
    if prompt is None or (isinstance(prompt, list) and not prompt):
        return prompt  # left for the pre-flight to name the row
    if isinstance(prompt, str):
        text = template.replace("{prompt}", prompt) if template else prompt
        if not (script_args.chat_prompts or system):
            return text
        messages = [{"role": "user", "content": text}]
    else:  # conversational: a list of {"role", "content"} messages; the template wraps the last user turn
        messages = [dict(m) for m in prompt]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if template and users:
            messages[users[-1]]["content"] = template.replace("{prompt}", str(messages[users[-1]]["content"]))
    if system and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages


def short_repr(value: Any, limit: int = 70) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def sample_rows(dataset: Any, n: int = 3) -> list[dict]:
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
    """Text, or chat messages (TRL's `is_conversational` reads `role`; a tool call may carry no `content`)."""
    if isinstance(value, str):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and ("role" in m or "content" in m)
                                                           for m in value)  # fmt: skip


def column_problems(dataset: Any, prompt_column: str, solution_column: str | None, readers=()) -> list[str]:
    """What is wrong with `prompt_column` / `solution_column` in the loaded data: each component of a dotted path
    (`reward_model.ground_truth`) is followed through the first rows, so a misspelled nested field is named instead
    of passing `None` to every reward; a prompt column must hold text or chat messages."""
    rows = sample_rows(dataset)
    top = list(dataset.column_names) if dataset.column_names is not None else list(rows[0] if rows else [])
    problems = []
    for option, path in (("prompt_column", prompt_column), ("solution_column", solution_column)):
        if path is None or not top:
            continue
        keys, values, available = path.split("."), rows, top
        for depth, key in enumerate(keys):
            if available is not None and key not in available:
                where = "the dataset" if depth == 0 else f"`{'.'.join(keys[:depth])}`"
                close = difflib.get_close_matches(key, [str(a) for a in available], n=1, cutoff=0.6)
                likely = likely_reference_column(available) if option == "solution_column" and depth == 0 else None
                hint = (f" The reference answer looks like it is in `{likely}`: pass `--solution_column {likely}`."
                        if likely else f" Did you mean `{'.'.join([*keys[:depth], close[0]])}`?" if close else "")  # fmt: skip
                if option == "solution_column" and path == REFERENCE_COLUMN and readers:
                    hint += f" ({', '.join(readers)} read(s) the reference as `solution`.)"
                elif option == "solution_column" and depth == 0:
                    hint += " `solution_column: null` runs reference-free rewards only."
                kind, names = ("a column of", "columns") if depth == 0 else ("a field of", "fields")
                problems.append(f"`{option}={path}`: `{key}` is not {kind} {where} (its {names}: "
                                f"{', '.join(map(str, available))}).{hint}")  # fmt: skip
                break
            values = [v.get(key) if isinstance(v, dict) else None for v in values]
            nested = [v for v in values if v is not None]
            if depth < len(keys) - 1 and nested and not all(isinstance(v, dict) for v in nested):
                problems.append(f"`{option}={path}`: `{'.'.join(keys[: depth + 1])}` holds {type_name(nested[0])} "
                                "values, not records with fields: a dotted path reads a nested field.")  # fmt: skip
                break
            available = sorted({k for v in nested for k in v}) if depth < len(keys) - 1 and nested else None
        else:
            given = [v for v in values if v is not None]  # a None prompt is a row's problem: the pre-flight names it
            if option == "prompt_column" and given and not all(is_prompt(v) for v in given):
                bad = next(v for v in given if not is_prompt(v))
                text = [c for c in top if c != path and rows and isinstance(rows[0].get(c), str)]
                problems.append(
                    f"`prompt_column={path}` holds {type_name(bad)} values (e.g. {short_repr(bad)}), not text or a list "
                    "of chat messages: the tokenizer cannot read them. Name the column with the prompt text with "
                    "`--prompt_column`" + (f" (text columns: {', '.join(text)})." if text else ".")
                )
    return problems


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
    """Refuse, before any download, a model name that is neither a local directory nor a reachable Hub id (a
    mistyped folder: transformers would retry the Hub for minutes), and a local directory without a weights file."""
    expanded = os.path.expanduser(name)
    if os.path.isdir(expanded):
        if not any(f.endswith(WEIGHTS_SUFFIXES) for f in os.listdir(expanded)):  # transformers' type and words
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
    if looks_like_path or (not (name.count("/") == 1) and not _in_hub_cache(name)):
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
