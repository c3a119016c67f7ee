"""The `cegppo train` / `cegppo check` script (TRL's `trl/scripts/grpo.py` shape), shared with `examples/cegppo.py`.

`make_parser()` builds a `TrlParser` over (`CEGPPOScriptArguments`, `CEGPPOConfig`, `trl.ModelConfig`): every field
is settable from a YAML recipe (`--config recipe.yaml`) and by flags, and TRL's flags (`--use_peft`, `--dtype` ...)
mean what they mean in TRL. `main()` runs the pre-flight (`preflight`), then `CEGPPOTrainer`.
"""

from __future__ import annotations

import logging
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trl import ModelConfig, ScriptArguments, TrlParser

from .checkpoints import COMMIT_FILE, other_runs, resolve
from .config import CEGPPOConfig
from .data import NONE_STRINGS, load_any_dataset, prepare_dataset
from .distributed import CPU_DDP_LAUNCH_LINE, check_launch
from .preflight import (  # noqa: F401 (cpu_computes_natively: the benchmark imports it from here)
    Fix,
    Report,
    cpu_computes_natively,
    inspect_engine,
    inspect_model,
    inspect_output_dir,
    missing_checkpoint,
    run_checks,
)  # fmt: skip
from .resources import resolve_config_args
from .rewards import REWARD_FUNCS, TRL_REWARD_FUNCS, check_reward_name, get_reward_func

if TYPE_CHECKING:
    from .trainer import CEGPPOTrainer

logger = logging.getLogger(__name__)
CPU_LAUNCH_LINE = CPU_DDP_LAUNCH_LINE  # several CPU processes; one definition, in `distributed`


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


def load_dataset_dict(script_args: CEGPPOScriptArguments) -> Any:
    """`dataset_name` as a `DatasetDict` (`data.load_any_dataset`)."""
    return load_any_dataset(script_args.dataset_name, config=script_args.dataset_config,
                            train_split=script_args.dataset_train_split, streaming=script_args.dataset_streaming)  # fmt: skip


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
    import difflib

    known = sorted({action.dest for action in parser._actions if action.dest != "help"})
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"`{key}`" + (f" (did you mean `{close[0]}`?)" if close else "")


def parse_args(
    args: list[str] | None = None, prog: str | None = None, epilog: str | None = None
) -> tuple[CEGPPOScriptArguments, CEGPPOConfig, ModelConfig]:
    """Parse flags and `--config` YAML (a shipped recipe's name or a path; flags win). Every refusal (an unknown flag
    or YAML key, with a did-you-mean; `--config` twice; a GPU setting on a machine without one) exits 2 with one
    `PROG: error: ...` line."""
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
    report.collect("engine", check_launch, training_args)
    inspect_engine(report, training_args)  # first: a launch that would run the wrong engine is wrong whatever else
    model_name = model_args.model_name_or_path
    if model_name is None:
        report.error("model", "`model_name_or_path` is required (a Hub id or a local directory).")
    else:
        inspect_model(report, model_name, training_args, model_args.dtype)
    if model_args.load_in_4bit and not __import__("torch").cuda.is_available():
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
                             "with {fix}" + (", or {fix1}." if why else "."),
                             fixes=[Fix(option, list(dataset)[0] if len(dataset) else None), Fix("eval_strategy", "no")])  # fmt: skip
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

    The pre-flight first (`cegppo check` prints the same report): its errors are raised before the model loads, its
    warnings logged. Then TRL's `grpo.py`: `ModelConfig` supplies `model_init_kwargs`, the quantization config and
    the LoRA config. A run refused before training does not leave behind an `output_dir` it created.
    """
    import os
    import shutil

    from .quiet import log_above_progress_bars

    log_above_progress_bars()
    report, prepared = check_command(script_args, training_args, model_args)
    report.raise_errors()
    for finding in report.warnings:
        if finding.code != "trainer":  # the trainer gives those itself
            logger.warning(finding.text())
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
        raise ValueError(missing)
    return _train(script_args, training_args, model_args, prepared, requested)


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
        reward_funcs=prepared.reward_funcs,
        args=training_args,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=prepared.peft_config,
    )
    trainer.train(resume_from_checkpoint=resume)
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
