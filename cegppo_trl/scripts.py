"""The `cegppo train` / `cegppo check` script (TRL's `trl/scripts/grpo.py` shape), shared with `examples/cegppo.py`.

`make_parser()` builds a `TrlParser` over (`CEGPPOScriptArguments`, `CEGPPOConfig`, `trl.ModelConfig`): every field
is settable from a YAML recipe (`--config recipe.yaml`) and by flags, and TRL's flags (`--use_peft`, `--dtype` ...)
mean what they mean in TRL. The dataset is loaded by name or path and its columns mapped onto what TRL and the rewards
read (`prompt`, `solution`). `main()` runs the pre-flight (`preflight`), then `CEGPPOTrainer`.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trl import ModelConfig, ScriptArguments, TrlParser

from .checkpoints import COMMIT_FILE, other_runs, resolve
from .config import CEGPPOConfig
from .preflight import (
    CEGPPOUsageError,
    Report,
    inspect_model,
    inspect_output_dir,
    likely_prompt_column,
    likely_reference_column,
    missing_checkpoint,
    reward_reads_reference,
    run_checks,
    sample_rows,
    short_repr,
    type_name,
)
from .resources import resolve_config_args
from .rewards import (
    REFERENCE_COLUMN,
    REWARD_FUNCS,
    TRL_REWARD_FUNCS,
    check_reward_name,
    get_reward_func,
    reward_value_range,
)

if TYPE_CHECKING:
    from .trainer import CEGPPOTrainer

logger = logging.getLogger(__name__)
NONE_STRINGS = ("", "none", "null")  # what a flag or YAML value uses to mean "unset" (a flag cannot spell None)
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


class RewardFailed(RuntimeError):
    """A reward function raised during `cegppo train`: one line naming it, exit status 5."""


def _option(default: Any, help: str) -> Any:
    return field(default_factory=default, metadata={"help": help}) if callable(default) else field(
        default=default, metadata={"help": help})  # fmt: skip


@dataclass
class CEGPPOScriptArguments(ScriptArguments):
    """TRL's dataset arguments (`dataset_name`: a Hub id, a dataset or `save_to_disk` directory, or one
    `.json`/`.jsonl`/`.csv`/`.parquet` file) plus the rewards and the column mapping."""

    reward_funcs: list[str] = _option(lambda: ["math_verify"], "Reward functions by name (" + ", ".join(
        [*REWARD_FUNCS, *TRL_REWARD_FUNCS]) + ") or dotted import path (`trl.rewards.<name>`, `my_lib.my_reward`). "
        "Weight them with `--reward_weights`.")  # fmt: skip
    prompt_column: str = _option("prompt", "Dataset column holding the prompt (text or chat messages).")
    solution_column: str | None = _option("solution", "Dataset column with the reference answer, passed to the "
        "rewards as `solution`. Dotted paths read nested fields (`reward_model.ground_truth`). `None`: no reference.")  # fmt: skip
    prompt_template: str | None = _option(None, "Template for the prompt text; `{prompt}` is replaced, other braces "
                                          "are literal.")  # fmt: skip
    system_prompt: str | None = _option(None, "System message prepended to every prompt; a prompt with its own "
                                        "system message keeps it.")  # fmt: skip
    chat_prompts: bool = _option(True, "Wrap plain-text prompts as a user message so the chat template is applied. "
                                 "False for base models.")  # fmt: skip
    max_train_samples: int | None = _option(None, "Keep only the first N training rows (smoke tests).")
    overwrite_output_dir: bool = _option(False, "Allow a new run (not resuming) into an `output_dir` that already "
        "holds checkpoints; they are deleted before training. Without it such a run is refused.")  # fmt: skip

    def __post_init__(self):
        # A flag cannot spell None: `none`/`null` (any case) or "" mean "unset" for every optional string option.
        for name in ("solution_column", "prompt_template", "system_prompt"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().lower() in NONE_STRINGS:
                setattr(self, name, None)
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ValueError(
                f"`prompt_template` must contain `{{prompt}}` (where the prompt text goes), got "
                f"{self.prompt_template!r}. Example: '{{prompt}}\\nPut your final answer within \\boxed{{}}.'; "
                "use `system_prompt` for text that does not wrap the prompt."
            )
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"`max_train_samples` must be >= 1 (or None for all rows), got {self.max_train_samples}: "
                             "the dataset would be empty.")  # fmt: skip
        self.reward_funcs = [self.reward_funcs] if isinstance(self.reward_funcs, str) else self.reward_funcs
        for name in self.reward_funcs:  # fail at parse time, not after the model has loaded
            check_reward_name(name)


def make_parser(prog: str | None = None, epilog: str | None = None) -> TrlParser:
    """The argument parser, with `--config` YAML support. An argument error is one line and a pointer to `--help`
    (argparse's default prints the whole usage first); `epilog` ends `--help` (`cegppo train`'s exit statuses)."""
    import argparse

    class Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
        """Each option's default (TrlParser's formatter) and the epilog's own line breaks."""

    parser = TrlParser((CEGPPOScriptArguments, CEGPPOConfig, ModelConfig), prog=prog, epilog=epilog,
                       formatter_class=Formatter)  # fmt: skip
    # argparse %-formats help strings; field help is prose (`linear:0->0.5@10%-60%`), so escape a lone `%`.
    for action in parser._actions:
        if action.help:
            action.help = re.sub(r"%%|%\(|%", lambda m: m.group() if len(m.group()) == 2 else "%%", action.help)
    parser.error = lambda message: parser.exit(  # type: ignore[method-assign]
        2, f"{parser.prog}: error: {message} (`{parser.prog} --help` lists every option)\n"
    )
    return parser


def _unknown_setting(parser: TrlParser, key: str) -> str:
    """`key` named as an unknown setting, with the closest known one."""
    known = sorted({action.dest for action in parser._actions if action.dest != "help"})
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"`{key}`" + (f" (did you mean `{close[0]}`?)" if close else "")


def parse_args(
    args: list[str] | None = None, prog: str | None = None, epilog: str | None = None
) -> tuple[CEGPPOScriptArguments, CEGPPOConfig, ModelConfig]:
    """Parse flags and `--config` YAML (a shipped recipe's name or a path; flags win). An unknown flag or YAML key
    (with a did-you-mean) or `--config` twice exits 2 with one `PROG: error: ...` line; a refused value raises the
    `ValueError` of the field's own check."""
    parser = make_parser(prog, epilog)
    args = list(sys.argv[1:] if args is None else args)
    configs = [a for a in args if a == "--config" or a.startswith("--config=")]
    if len(configs) > 1:  # TrlParser reads one YAML; the second would be "unrecognized" (`fsdp_config`?)
        parser.error(f"`--config` given {len(configs)} times: one YAML (or recipe) per run; override its fields "
                     "with flags, or merge the YAML files into one")  # fmt: skip
    try:
        args = resolve_config_args(args)
    except ValueError as error:
        parser.error(str(error))  # before anything loads
    try:
        *parsed, from_config, from_flags = parser.parse_args_and_config(
            args, return_remaining_strings=True, separate_remaining_strings=True
        )
    except ValueError as error:
        if "doesn't support bf16/gpu" in str(error):  # transformers' text names `use_cpu`, not the flags that work
            raise ValueError(
                "`bf16`: this machine has no GPU for it (a GPU recipe run on CPU?). On CPU pass "
                "`--use_cpu true --bf16 false` (the `cpu_smoke` recipe sets both)."
            ) from error
        raise
    if keys := [s[2:].split("=")[0] for s in from_config[::2]]:
        parser.error(f"unknown key(s) in the --config YAML: {', '.join(_unknown_setting(parser, k) for k in keys)}")
    if from_flags:
        flags = [s.lstrip("-").split("=")[0] for s in from_flags if s.startswith("-")]
        named = ", ".join(_unknown_setting(parser, k) for k in flags) if flags else " ".join(from_flags)
        parser.error(f"unrecognized argument(s): {named}")
    return tuple(parsed)  # type: ignore[return-value]


# --- The dataset: loaded by name or path, its columns mapped onto `prompt` and `solution`
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


def load_dataset_dict(script_args: CEGPPOScriptArguments) -> Any:
    """`dataset_name` as a `DatasetDict` (`load_any_dataset`)."""
    return load_any_dataset(script_args.dataset_name, config=script_args.dataset_config,
                            train_split=script_args.dataset_train_split, streaming=script_args.dataset_streaming)  # fmt: skip


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
    if (limit := script_args.max_train_samples) is not None:
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
        column = dataset.select_columns([prompt_col.split(".")[0]])
        if own := sum(_opens_with_system(_get_path(row, prompt_col)) for row in column):
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


def _is_prompt(value: Any) -> bool:
    """Text, or chat messages (TRL's `is_conversational` reads `role`; a tool call may carry no `content`)."""
    return isinstance(value, str) or (isinstance(value, list) and bool(value) and all(
        isinstance(m, dict) and ("role" in m or "content" in m) for m in value))  # fmt: skip


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
                likely = (likely_reference_column if option == "solution_column" else likely_prompt_column)(
                    available) if depth == 0 else None  # fmt: skip
                what = "reference answer" if option == "solution_column" else "prompt"
                hint = (f" The {what} looks like it is in `{likely}`: pass `--{option} {likely}`." if likely
                        else f" Did you mean `{'.'.join([*keys[:depth], close[0]])}`?" if close else "")  # fmt: skip
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
            if option == "prompt_column" and given and not all(_is_prompt(v) for v in given):
                bad = next(v for v in given if not _is_prompt(v))
                text = [c for c in top if c != path and rows and isinstance(rows[0].get(c), str)]
                problems.append(
                    f"`prompt_column={path}` holds {type_name(bad)} values (e.g. {short_repr(bad)}), not text or a list "
                    "of chat messages: the tokenizer cannot read them. Name the column with the prompt text with "
                    "`--prompt_column`" + (f" (text columns: {', '.join(text)})." if text else ".")
                )
    return problems


# --- The pre-flight of a command: `cegppo check` prints it, `cegppo train` raises its errors before the model loads
@dataclass
class Prepared:
    """What `check_command` loaded for the trainer."""

    train_dataset: Any = None
    eval_dataset: Any = None
    reward_funcs: list = field(default_factory=list)
    peft_config: Any = None


def check_command(script_args: CEGPPOScriptArguments, training_args: CEGPPOConfig, model_args: ModelConfig,
                  call_rewards: bool = False, plan_resume: bool = False) -> tuple[Report, Prepared]:  # fmt: skip
    """Every check of a `cegppo train` command before the model loads, and the data and rewards it prepared, as
    `cegppo train` hands them to the trainer. `call_rewards`: `--call_rewards`; `plan_resume`: `cegppo check` makes
    the resume `cegppo train` plans (`checkpoints.resolve`)."""
    from trl import get_peft_config

    report, prepared = Report(), Prepared()
    model_name = model_args.model_name_or_path
    if model_name is None:
        report.error("model", "`model_name_or_path` is required (a Hub id or a local directory).")
    else:
        inspect_model(report, model_name, training_args)
    if model_args.load_in_4bit and not __import__("torch").cuda.is_available():  # bitsandbytes loads, never trains
        report.error("model", "`--load_in_4bit` (4-bit QLoRA) needs a CUDA GPU, and none is available: bitsandbytes' "
                     "CPU path loads 4-bit weights but does not train them. On CPU drop `--load_in_4bit` and train "
                     "LoRA on the full-precision model (`--use_peft true`).")  # fmt: skip
    prepared.reward_funcs = [
        f for n in script_args.reward_funcs if (f := report.collect("rewards", get_reward_func, n))
    ]
    dataset = report.collect("dataset", load_dataset_dict, script_args)
    if dataset is not None and len(prepared.reward_funcs) == len(script_args.reward_funcs):
        splits = [("train_dataset", script_args.dataset_train_split, "dataset_train_split")]
        if training_args.eval_strategy != "no":
            splits.append(("eval_dataset", script_args.dataset_test_split, "dataset_test_split"))
        for attribute, split, option in splits:
            if split not in dataset:
                strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
                why = f"eval_strategy={strategy!r} but " if attribute == "eval_dataset" else ""
                report.error("dataset", f"{why}the dataset has no split {split!r} (splits: {list(dataset)}): name it "
                             f"with `--{option} {list(dataset)[0] if len(dataset) else '<split>'}`"
                             + (", or `--eval_strategy no`." if why else "."))  # fmt: skip
                continue
            loaded = report.collect("dataset", prepare_dataset, dataset[split], script_args, prepared.reward_funcs)
            setattr(prepared, attribute, loaded)
    processing_class = None
    if model_name is not None and not any(f.section == "model" for f in report.errors):
        processing_class = report.collect("model", _load_processing_class, model_args, training_args)
    prepared.peft_config = report.collect("model", get_peft_config, model_args)
    run_checks(prepared.train_dataset, prepared.reward_funcs, training_args, eval_dataset=prepared.eval_dataset,
               reward_names=script_args.reward_funcs[: len(prepared.reward_funcs)], processing_class=processing_class,
               call_rewards=call_rewards, report=report)  # fmt: skip
    inspect_output_dir(report, training_args, script_args.overwrite_output_dir, plan_resume)
    return report, prepared


def _load_processing_class(model_args: ModelConfig, training_args: CEGPPOConfig) -> Any:
    """The tokenizer/processor as TRL's trainer loads it (not the weights)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model_args.model_name_or_path, revision=model_args.model_revision,
                                             trust_remote_code=training_args.trust_remote_code)  # fmt: skip
    except Exception as error:
        raise OSError(f"Cannot load the tokenizer of `{model_args.model_name_or_path}` (`model_name_or_path`): "
                      f"{type(error).__name__}: {error}") from error  # fmt: skip


# --- Training
def main(script_args: CEGPPOScriptArguments, training_args: CEGPPOConfig, model_args: ModelConfig) -> CEGPPOTrainer:
    """Train with CE-GPPO as configured, save the model to `output_dir`, and return the trainer.

    The pre-flight first (`cegppo check` prints the same report): its errors are raised as `CEGPPOUsageError` before
    the model loads, its warnings logged once (by the main process). Then TRL's `grpo.py`: `ModelConfig` supplies
    `model_init_kwargs`, the quantization config and the LoRA config. A reward that raises while training raises
    `RewardFailed`, naming it. A run refused before training does not leave behind an `output_dir` it created.
    """
    import shutil

    report, prepared = check_command(script_args, training_args, model_args)
    report.raise_errors()
    if training_args.process_index == 0:  # one copy of each warning, however many processes the launch started
        for finding in report.warnings:
            if finding.code != "trainer":  # the trainer gives those itself
                logger.warning(finding.message)
    from accelerate import PartialState

    output_dir, requested = training_args.output_dir, training_args.resume_from_checkpoint
    checkpoint, _ = resolve(output_dir, requested)  # the trainer resolves it again, saying what it passed over
    if checkpoint is None and script_args.overwrite_output_dir and PartialState().is_main_process:
        for folder in other_runs(output_dir, set()):
            os.remove(os.path.join(folder, COMMIT_FILE))  # the marker first: a kill mid-delete leaves no checkpoint
            shutil.rmtree(folder)
            logger.warning(f"`overwrite_output_dir`: deleted {folder}.")
    PartialState().wait_for_everyone()
    if (missing := missing_checkpoint(checkpoint)) is not None:  # transformers' words, before the load
        raise CEGPPOUsageError(missing)
    return _train(script_args, training_args, model_args, prepared, requested)


def named_failures(funcs: list, names: list[str]) -> list:
    """Each reward function wrapped so that an exception it raises becomes `RewardFailed` naming it; TRL sees the same
    name (its metrics), kind (sync or async) and score range."""
    import functools
    import inspect

    def wrap(func: Any, name: str) -> Any:
        if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):  # a reward model
            return func

        def failed(error: Exception) -> RewardFailed:
            return RewardFailed(f"Reward `{name}` raised {type(error).__name__}: {error}")

        if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):

            async def guarded(*args, **kwargs):
                try:
                    return await func(*args, **kwargs)
                except Exception as error:
                    raise failed(error) from error
        else:

            def guarded(*args, **kwargs):
                try:
                    return func(*args, **kwargs)
                except Exception as error:
                    raise failed(error) from error

        functools.update_wrapper(guarded, func)  # `__name__` (TRL's metric names), `__module__`, attributes
        guarded.reward_range = reward_value_range(func)
        return guarded

    return [wrap(func, name) for func, name in zip(funcs, names, strict=True)]


def _train(script_args, training_args, model_args, prepared, resume) -> CEGPPOTrainer:
    import torch
    import transformers
    from packaging.version import Version
    from trl import get_quantization_config

    from .trainer import CEGPPOTrainer

    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)  # fmt: skip
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    trainer = CEGPPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=named_failures(prepared.reward_funcs, script_args.reward_funcs),
        args=training_args,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=prepared.peft_config,
    )
    trainer.train(resume_from_checkpoint=resume)
    trainer.create_model_card()  # before the weights: a PEFT adapter's save adds its metadata to the card
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    # Every process reaches this point before the group goes: destroying it while another rank still saves, or
    # leaving it to interpreter exit, can hang a gloo (CPU) run after training finished.
    trainer.accelerator.wait_for_everyone()
    if Version(transformers.__version__) >= Version("5.18.0"):
        trainer.end()  # finish the trackers and destroy the process group
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return trainer
