"""The `cegppo train` / `cegppo check` script (TRL's `grpo.py` shape, shared with `examples/cegppo.py`): every field
of (`CEGPPOScriptArguments`, `CEGPPOConfig`, `trl.ModelConfig`) a flag and a YAML key; `main()` runs the pre-flight."""

from __future__ import annotations

import difflib
import functools
import inspect
import logging
import os
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from trl import ModelConfig, ScriptArguments, TrlParser

from .checkpoints import COMMIT_FILE, other_runs, resolve
from .config import CEGPPOConfig
from .preflight import (
    CEGPPOUsageError,
    Report,
    column_problems,
    inspect_model,
    inspect_output_dir,
    missing_checkpoint,
    prompt_problem,
    run_checks,
)
from .resources import resolve_config
from .rewards import REWARD_FUNCS, TRL_REWARD_FUNCS, check_reward_name, get_reward_func, reward_value_range

if TYPE_CHECKING:
    from .trainer import CEGPPOTrainer

logger = logging.getLogger(__name__)
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


class RewardFailed(RuntimeError):
    """A reward function raised during `cegppo train`: one line naming it, exit status 5."""


def _option(default: Any, help: str) -> Any:
    return field(**{"default_factory" if callable(default) else "default": default}, metadata={"help": help})


@dataclass
class CEGPPOScriptArguments(ScriptArguments):
    """TRL's dataset arguments (`dataset_name`: a Hub id, a dataset folder or one data file), rewards and columns."""

    reward_funcs: list[str] = _option(lambda: ["math_verify"], "Reward functions by name (" + ", ".join(
        [*REWARD_FUNCS, *TRL_REWARD_FUNCS]) + ") or dotted import path; weight them with `--reward_weights`.")  # fmt: skip
    prompt_column: str = _option("prompt", "Dataset column holding the prompt (text or chat messages).")
    solution_column: str | None = _option("solution", "Column with the reference answer, passed to the rewards as "
                                          "`solution`; dotted paths read nested fields; `none`: no reference.")  # fmt: skip
    prompt_template: str | None = _option(None, "Template for the prompt text; `{prompt}` is replaced.")
    system_prompt: str | None = _option(None, "System message prepended to prompts that have none.")
    chat_prompts: bool = _option(True, "Wrap plain-text prompts as a user message (False for base models).")
    max_train_samples: int | None = _option(None, "Keep only the first N training rows.")
    overwrite_output_dir: bool = _option(False, "Let a new run delete the checkpoints already in `output_dir`.")

    def __post_init__(self):
        for name in ("solution_column", "prompt_template", "system_prompt"):  # a flag cannot spell None
            if str(getattr(self, name)).strip().lower() in ("", "none", "null"):
                setattr(self, name, None)
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ValueError(f"`prompt_template` must contain `{{prompt}}`, got {self.prompt_template!r}.")
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(f"`max_train_samples` must be >= 1 (or None), got {self.max_train_samples}.")
        self.reward_funcs = [self.reward_funcs] if isinstance(self.reward_funcs, str) else self.reward_funcs
        for name in self.reward_funcs:  # at parse time, not after the model has loaded
            check_reward_name(name)


def parse_args(args: list[str] | None = None, prog: str | None = None,
               epilog: str | None = None) -> tuple[CEGPPOScriptArguments, CEGPPOConfig, ModelConfig]:  # fmt: skip
    """Flags over `--config` YAML (a recipe or a path); a bad argument exits 2 (one line), a refused value raises."""
    import argparse

    # Each option's default (TrlParser's formatter) and the epilog's own line breaks.
    formatter = type("Formatter", (argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter), {})
    parser = TrlParser((CEGPPOScriptArguments, CEGPPOConfig, ModelConfig), prog=prog, epilog=epilog,
                       formatter_class=formatter)  # fmt: skip
    for action in parser._actions:  # argparse %-formats help; field help is prose (`@10%-60%`)
        action.help = action.help and action.help.replace("%%", "%").replace("%", "%%")  # TRL escapes some
    parser.error = lambda message: parser.exit(2, f"{parser.prog}: error: {message} (`{parser.prog} --help` lists "
                                               "every option)\n")  # type: ignore[method-assign]  # fmt: skip
    argv = sys.argv[1:] if args is None else args
    args = [a for arg in argv for a in (arg.split("=", 1) if arg.startswith("--config=") else [arg])]
    if (n := args.count("--config")) > 1:  # TrlParser reads one
        parser.error(f"`--config` given {n} times: one YAML per run; override its fields with flags")
    if n and ((i := args.index("--config") + 1) == len(args) or args[i].startswith("--")):
        parser.error("--config needs a value: a recipe name (`cegppo recipes` lists them) or a path.")
    if n:  # TRL's parser reads a path only
        try:
            args[i] = resolve_config(args[i])
        except ValueError as error:
            parser.error(f"--config {error}")
    try:
        *parsed, from_config, from_flags = parser.parse_args_and_config(args, return_remaining_strings=True,
                                                                        separate_remaining_strings=True)  # fmt: skip
    except ValueError as error:  # transformers' text names `use_cpu`, not the flags that work
        if "doesn't support bf16/gpu" in str(error):
            raise ValueError("`bf16`: this machine has no GPU: on CPU, `--use_cpu true --bf16 false`.") from error
        raise
    known = sorted({action.dest for action in parser._actions if action.dest != "help"})

    def named(keys: list[str]) -> str:
        close = {k: difflib.get_close_matches(k, known, n=1, cutoff=0.6) for k in keys}
        return ", ".join(f"`{k}`" + (f" (did you mean `{c[0]}`?)" if c else "") for k, c in close.items())

    if keys := [s[2:].split("=")[0] for s in from_config[::2]]:
        parser.error(f"unknown key(s) in the --config YAML: {named(keys)}")
    if from_flags:
        flags = [s.lstrip("-").split("=")[0] for s in from_flags if s.startswith("-")]
        parser.error(f"unrecognized argument(s): {named(flags) if flags else ' '.join(from_flags)}")
    return tuple(parsed)  # type: ignore[return-value]


# --- The dataset: loaded by name or path, its columns mapped onto `prompt` and `solution`
def load_any_dataset(name: str | None, *, config: str | None = None, train_split: str = "train",
                     streaming: bool = False) -> Any:  # fmt: skip
    """A Hub id, dataset folder or data file (its rows the `train_split` split) as a `(Iterable)DatasetDict`."""
    from datasets import Dataset, DatasetDict, IterableDatasetDict, load_dataset, load_from_disk

    if name is None:
        raise ValueError("`dataset_name` is required (a Hub id, a local directory, or a .json/.jsonl/.csv file).")
    if os.path.isdir(name) and any(os.path.exists(os.path.join(name, m)) for m in ("dataset_dict.json", "state.json")):
        loaded = load_from_disk(name)
        if streaming:
            splits = loaded if isinstance(loaded, DatasetDict) else {train_split: loaded}
            return IterableDatasetDict({split: data.to_iterable_dataset() for split, data in splits.items()})
    elif os.path.isfile(name):
        if (builder := _FILE_BUILDERS.get(os.path.splitext(name)[1].lower())) is None:
            raise ValueError(f"`dataset_name`: cannot load {name!r}: expected one of {sorted(_FILE_BUILDERS)}.")
        try:
            loaded = load_dataset(builder, data_files={train_split: name}, streaming=streaming)
        except Exception as error:  # datasets' words for an empty file do not say so
            raise ValueError(f"dataset {name!r} is empty (0 rows) or not {builder}: {error}") from error
    else:  # a Hub id, or a path that is not there: datasets' own error says which
        loaded = load_dataset(name, name=config, streaming=streaming)
    return DatasetDict({train_split: loaded}) if isinstance(loaded, Dataset) else loaded


def load_dataset_dict(script_args: CEGPPOScriptArguments) -> Any:
    return load_any_dataset(script_args.dataset_name, config=script_args.dataset_config,
                            train_split=script_args.dataset_train_split, streaming=script_args.dataset_streaming)  # fmt: skip


def _get_path(row: Any, path: str) -> Any:
    for key in path.split("."):  # a datasets row is a Mapping, not always a dict
        row = row.get(key) if isinstance(row, Mapping) else None
    return row


def prepare_dataset(dataset: Any, script_args: Any) -> Any:
    """The rows with `prompt` (and `solution`) columns, the prompt options applied; other columns stay."""
    from datasets import Dataset, IterableDataset

    if (limit := script_args.max_train_samples) is not None:
        streaming = isinstance(dataset, IterableDataset)
        dataset = dataset.take(limit) if streaming else dataset.select(range(min(limit, len(dataset))))
    if not isinstance(dataset, IterableDataset) and len(dataset) == 0:
        raise ValueError(f"dataset {script_args.dataset_name!r} is empty (0 rows"
                         f"{'' if limit is None else f' after `max_train_samples={limit}`'}): check `--dataset_name`.")  # fmt: skip
    prompt_col, solution_col, system = script_args.prompt_column, script_args.solution_column, script_args.system_prompt  # fmt: skip
    if solution_col == "solution" and "solution" not in (dataset.column_names or ["solution"]):
        solution_col = None  # the default names a column the data lacks: the rewards that need one say so
    if problems := column_problems(dataset, prompt_col, solution_col):
        raise ValueError(" ".join(problems))
    first_is_text = not isinstance(dataset, Dataset) or isinstance(dataset[0][prompt_col.split(".")[0]], str)
    if (prompt_col, script_args.prompt_template, system) == ("prompt", None, None) and solution_col in (
        None, "solution") and not (script_args.chat_prompts and first_is_text):  # fmt: skip
        return dataset  # nothing to rewrite

    def convert(row: dict[str, Any]) -> dict[str, Any]:
        out = {"prompt": _format_prompt(_get_path(row, prompt_col), script_args)}
        if solution_col is not None:
            out["solution"] = None if (gold := _get_path(row, solution_col)) is None else str(gold)
        return out

    return dataset.map(convert)


def _format_prompt(prompt: Any, script_args: Any) -> Any:
    template, system = script_args.prompt_template, script_args.system_prompt
    if not isinstance(prompt, str) and prompt_problem(prompt):
        return prompt  # left for the pre-flight to name the row
    if isinstance(prompt, str):
        text = template.replace("{prompt}", prompt) if template else prompt
        if not (script_args.chat_prompts or system):
            return text
        messages = [{"role": "user", "content": text}]
    else:  # chat messages: the template wraps the last user turn
        messages = [dict(m) for m in prompt]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        if template and users:
            messages[users[-1]]["content"] = template.replace("{prompt}", str(messages[users[-1]]["content"]))
    if system and messages[0].get("role") != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages


# --- The pre-flight of a command: `cegppo check` prints it, `cegppo train` raises its errors before the model loads
def check_command(script_args: CEGPPOScriptArguments, training_args: CEGPPOConfig, model_args: ModelConfig,
                  call_rewards: bool = False, plan_resume: bool = False) -> tuple[Report, SimpleNamespace]:  # fmt: skip
    """The pre-flight of a `cegppo train` command and the data and rewards it prepared for the trainer."""
    from transformers import AutoProcessor
    from trl import get_peft_config

    report, prepared = Report(), SimpleNamespace(train_dataset=None, eval_dataset=None, peft_config=None)
    if (model_name := model_args.model_name_or_path) is None:
        report.error("model", "`model_name_or_path` is required (a Hub id or a local directory).")
    else:
        inspect_model(report, model_name, training_args)
    if model_args.load_in_4bit and not __import__("torch").cuda.is_available():  # bitsandbytes loads, never trains
        report.error("model", "`--load_in_4bit` (4-bit QLoRA) needs a CUDA GPU: on CPU, `--use_peft true` without it.")
    prepared.reward_funcs = [f for n in script_args.reward_funcs
                             if (f := report.collect("rewards", get_reward_func, n))]  # fmt: skip
    dataset = report.collect("dataset", load_dataset_dict, script_args)
    if dataset is not None and len(prepared.reward_funcs) == len(script_args.reward_funcs):
        for attribute in ("train_dataset", "eval_dataset")[: 1 + (training_args.eval_strategy != "no")]:
            option = "dataset_train_split" if attribute == "train_dataset" else "dataset_test_split"
            if (split := getattr(script_args, option)) not in dataset:
                strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
                why = f"eval_strategy={strategy!r} but " if attribute == "eval_dataset" else ""
                report.error("dataset", f"{why}the dataset has no split {split!r} (splits: {list(dataset)}): "
                             f"`--{option} {next(iter(dataset), '<split>')}`" + (" or `--eval_strategy no`." if why else "."))  # fmt: skip
                continue
            setattr(prepared, attribute, report.collect("dataset", prepare_dataset, dataset[split], script_args))
    loads = model_name is not None and not any(f.section == "model" for f in report.errors)  # as the trainer loads it
    processing_class = report.collect("model", AutoProcessor.from_pretrained, model_name, revision=model_args.model_revision,
                                      trust_remote_code=training_args.trust_remote_code) if loads else None  # fmt: skip
    prepared.peft_config = report.collect("model", get_peft_config, model_args)
    run_checks(prepared.train_dataset, prepared.reward_funcs, training_args, eval_dataset=prepared.eval_dataset,
               reward_names=script_args.reward_funcs[: len(prepared.reward_funcs)], processing_class=processing_class,
               call_rewards=call_rewards, report=report)  # fmt: skip
    inspect_output_dir(report, training_args, script_args.overwrite_output_dir, plan_resume)
    return report, prepared


def main(script_args: CEGPPOScriptArguments, training_args: CEGPPOConfig, model_args: ModelConfig) -> CEGPPOTrainer:
    """Train as configured after the pre-flight (`CEGPPOUsageError`), save to `output_dir`, return the trainer."""
    from accelerate import PartialState

    report, prepared = check_command(script_args, training_args, model_args)
    report.raise_errors()
    for finding in [f for f in report.warnings if f.code != "trainer"] if training_args.process_index == 0 else []:
        logger.warning(finding.message)  # once, however many processes; the trainer gives the "trainer" ones itself
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
    """Each reward raising `RewardFailed` naming it; TRL sees the same name, kind (sync or async) and range."""

    def wrap(func: Any, name: str) -> Any:
        if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):  # a reward model
            return func

        async def guarded_async(*args, **kwargs):
            try:
                return await func(*args, **kwargs)
            except Exception as error:
                raise RewardFailed(f"Reward `{name}` raised {type(error).__name__}: {error}") from error

        def guarded(*args, **kwargs):
            try:
                return func(*args, **kwargs)
            except Exception as error:
                raise RewardFailed(f"Reward `{name}` raised {type(error).__name__}: {error}") from error

        is_async = inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)
        wrapped = functools.update_wrapper(guarded_async if is_async else guarded, func)  # name, module, attributes
        wrapped.reward_range = reward_value_range(func)
        return wrapped

    return [wrap(func, name) for func, name in zip(funcs, names, strict=True)]


def _train(script_args, training_args, model_args, prepared, resume) -> CEGPPOTrainer:
    from trl import get_quantization_config

    from .trainer import CEGPPOTrainer

    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)  # fmt: skip
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}
    trainer = CEGPPOTrainer(model=model_args.model_name_or_path, args=training_args,
                            reward_funcs=named_failures(prepared.reward_funcs, script_args.reward_funcs),
                            train_dataset=prepared.train_dataset, eval_dataset=prepared.eval_dataset,
                            quantization_config=get_quantization_config(model_args), peft_config=prepared.peft_config)  # fmt: skip
    trainer.train(resume_from_checkpoint=resume)
    trainer.create_model_card()  # before the weights: a PEFT adapter's save adds its metadata to the card
    trainer.save_model(training_args.output_dir)
    trainer.accelerator.print(f"Model saved to {training_args.output_dir}.")
    if training_args.push_to_hub:
        trainer.push_to_hub(dataset_name=script_args.dataset_name)
    # Every process gets here before the group goes (left to interpreter exit, it can hang a gloo run).
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()  # the trackers, then the process group (what `Trainer.end` does)
    return trainer
