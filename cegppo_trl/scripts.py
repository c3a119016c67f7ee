"""The training script shared by the `cegppo train` CLI and `examples/cegppo.py` (TRL's `trl/scripts/grpo.py` shape).

`make_parser()` builds a `TrlParser` over (`CEGPPOScriptArguments`, `CEGPPOConfig`, `trl.ModelConfig`), so every
field of the three dataclasses is settable from a YAML recipe (`--config recipe.yaml`) and overridable by flags, and
`--use_peft`, `--lora_r`, `--load_in_4bit`, `--dtype` ... mean exactly what they mean in TRL. `main()` loads the
dataset, maps its columns onto what the rewards read, and runs `CEGPPOTrainer`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from trl import ModelConfig, ScriptArguments, TrlParser

from .checkpoints import RESUME_COMPARED_FIELDS, start_run  # noqa: F401 (RESUME_COMPARED_FIELDS re-exported)
from .config import CEGPPOConfig
from .distributed import CPU_DDP_LAUNCH_LINE
from .resources import resolve_config_args
from .rewards import (
    REWARD_FUNCS,
    TRL_REWARD_FUNCS,
    check_reward_name,
    get_reward_func,
)

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict, IterableDatasetDict

    from .trainer import CEGPPOTrainer

logger = logging.getLogger(__name__)

# Values a flag or YAML uses to mean "unset" for an optional string option (a flag cannot spell None).
_NONE_STRINGS = ("", "none", "null")
CPU_LAUNCH_LINE = CPU_DDP_LAUNCH_LINE  # several CPU processes; one definition, in `distributed`

# Files `datasets.load_dataset` reads with a packaged builder (a bare file path is not a dataset name).
_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass
class CEGPPOScriptArguments(ScriptArguments):
    """
    Script arguments for CE-GPPO training: TRL's dataset arguments plus rewards and column mapping.

    Args:
        dataset_name (`str`):
            Hub dataset id, a local dataset directory, a directory written by `Dataset.save_to_disk`, or a single
            `.json`/`.jsonl`/`.csv`/`.parquet` file. `dataset_streaming` streams local files and directories too.
        reward_funcs (`list[str]`, *optional*, defaults to `["math_verify"]`):
            Reward functions by name from `cegppo_trl.rewards.REWARD_FUNCS` (`math_verify`, `math_verify_01`,
            `gsm8k`, `gsm8k_01`, `format`), TRL's by name (`accuracy_reward`, `reasoning_accuracy_reward`,
            `think_format_reward`), or dotted import paths. Weight them with `reward_weights`.
        prompt_column (`str`, *optional*, defaults to `"prompt"`):
            Dataset column holding the prompt (a string or a list of chat messages); renamed to `prompt`.
        solution_column (`str` or `None`, *optional*, defaults to `"solution"`):
            Dataset column holding the reference answer, passed to the rewards as `solution`. A dotted path reads
            a nested field (`reward_model.ground_truth` for verl-format data). `None` for reference-free rewards.
        prompt_template (`str` or `None`, *optional*):
            Template applied to the (last user turn of the) prompt; `{prompt}` is replaced by the prompt text. Other
            braces are literal, so `\\boxed{}` needs no escaping.
        system_prompt (`str` or `None`, *optional*):
            System message prepended to every prompt (turning plain-text prompts into chat prompts). A prompt that
            already opens with a system message keeps its own (a warning says how many do).
        chat_prompts (`bool`, *optional*, defaults to `True`):
            Wrap plain-text prompts as one user message, so the model's chat template is applied (instruct and
            reasoning models). Set `False` for base models trained on raw text.
        max_train_samples (`int` or `None`, *optional*):
            Keep only the first N training rows (smoke tests, quick sweeps).
    """

    reward_funcs: list[str] = field(
        default_factory=lambda: ["math_verify"],
        metadata={
            "help": f"Reward functions by name ({', '.join([*REWARD_FUNCS, *TRL_REWARD_FUNCS])}) or dotted import "
            "path (`trl.rewards.<name>`, `my_lib.rewards.my_reward`). Weight them with `--reward_weights`."
        },
    )
    prompt_column: str = field(
        default="prompt", metadata={"help": "Dataset column holding the prompt (text or chat messages)."}
    )
    solution_column: str | None = field(
        default="solution",
        metadata={
            "help": "Dataset column with the reference answer, passed to the rewards as `solution`. Dotted paths "
            "read nested fields (`reward_model.ground_truth`). `None` for reference-free rewards."
        },
    )
    prompt_template: str | None = field(
        default=None,
        metadata={"help": "Template for the prompt text; `{prompt}` is replaced, other braces are literal."},
    )
    system_prompt: str | None = field(
        default=None,
        metadata={"help": "System message prepended to every prompt; a prompt with its own system message keeps it."},
    )
    chat_prompts: bool = field(
        default=True,
        metadata={
            "help": "Wrap plain-text prompts as a user message so the chat template is applied. False for base models."
        },
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "Keep only the first N training rows (smoke tests)."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Allow a new run (not resuming) into an `output_dir` that already holds checkpoints; they are "
            "deleted before training. Without it such a run is refused."
        },
    )

    def __post_init__(self):
        # A flag cannot spell None: `none`/`null` (any case) or an empty string mean "unset" for every optional
        # string option, e.g. `--solution_column none` is "no reference column".
        for name in ("solution_column", "prompt_template", "system_prompt"):
            value = getattr(self, name)
            if isinstance(value, str) and value.strip().lower() in _NONE_STRINGS:
                setattr(self, name, None)
        if self.prompt_template is not None and "{prompt}" not in self.prompt_template:
            raise ValueError(
                f"`prompt_template` must contain `{{prompt}}` (where the prompt text goes), got "
                f"{self.prompt_template!r}. Example: '{{prompt}}\\nPut your final answer within \\boxed{{}}.'; "
                "use `system_prompt` for text that does not wrap the prompt."
            )
        if self.max_train_samples is not None and self.max_train_samples < 1:
            raise ValueError(
                f"`max_train_samples` must be >= 1 (or None for all rows), got {self.max_train_samples}: the dataset "
                "would be empty."
            )
        if isinstance(self.reward_funcs, str):
            self.reward_funcs = [self.reward_funcs]
        for name in self.reward_funcs:  # fail at parse time, not after the model has loaded
            check_reward_name(name)


def make_parser(prog: str | None = None) -> TrlParser:
    """The argument parser: script arguments, `CEGPPOConfig` and TRL's `ModelConfig`, with `--config` YAML support."""
    parser = TrlParser((CEGPPOScriptArguments, CEGPPOConfig, ModelConfig), prog=prog)
    # argparse %-formats help strings; field help is prose (`linear:0->0.5@10%-60%`), so escape a lone `%`.
    for action in parser._actions:
        if action.help:
            action.help = re.sub(r"%%|%\(|%", lambda m: m.group() if len(m.group()) == 2 else "%%", action.help)
    return parser


def parse_args(
    args: list[str] | None = None, prog: str | None = None
) -> tuple[CEGPPOScriptArguments, CEGPPOConfig, ModelConfig]:
    """Parse flags and `--config` YAML (flags win). Unknown keys in the YAML are an error, not silently dropped.

    `--config` takes a path or the name of a recipe shipped with the package (`cpu_smoke`, see `cegppo recipes`).
    """
    parser = make_parser(prog)
    try:
        args = resolve_config_args(list(sys.argv[1:] if args is None else args))
    except ValueError as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")  # before anything loads; the full usage would bury it
    return parser.parse_args_and_config(args)


# ----------------------------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------------------------
def load_dataset_dict(script_args: CEGPPOScriptArguments) -> DatasetDict:
    """Load `dataset_name` as a `DatasetDict` (see `load_any_dataset`)."""
    return load_any_dataset(
        script_args.dataset_name,
        config=script_args.dataset_config,
        train_split=script_args.dataset_train_split,
        streaming=script_args.dataset_streaming,
    )


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
    else:
        missing = _missing_local_path(name)
        if missing is not None:
            raise FileNotFoundError(missing)
        try:
            loaded = load_dataset(name, name=config, streaming=streaming)
        except ConnectionError as error:  # offline: neither a local path nor a cached Hub dataset
            raise FileNotFoundError(
                f"`dataset_name`: {name!r} is not a local file or directory ({os.path.abspath(name)} does not exist), "
                f"and not a Hub dataset available offline ({error}). Check the path, or run online once to cache it."
            ) from error
    if isinstance(loaded, Dataset):
        loaded = DatasetDict({train_split: loaded})
    return loaded


_DATA_EXTENSIONS = (*_FILE_BUILDERS, ".txt", ".tsv", ".json.gz", ".jsonl.gz", ".zst")


def _missing_local_path(name: str) -> str | None:
    """Why `name`, which does not exist locally, is a mistyped local path rather than a Hub id; None if it may be
    a Hub id.

    A data-file extension, a `./`, `../`, `/` or `~` start, more than one `/` (a Hub id has one) or an existing
    parent directory make it a path: `datasets` would look it up on the Hub and fail with a network error (or retry
    for half a minute) instead of saying the file is missing.
    """
    expanded = os.path.expanduser(name)
    parent = os.path.dirname(expanded.rstrip("/"))
    looks_like_path = (
        name.lower().endswith(_DATA_EXTENSIONS)
        or name.startswith(("./", "../", "/", "~"))
        or name.count("/") > 1
        or os.sep != "/"
        and os.sep in name
        or (parent != "" and os.path.isdir(parent))
    )
    if not looks_like_path:
        return None
    where = os.path.abspath(expanded)
    return (
        f"`dataset_name`: no file or directory at {where} ({name!r} looks like a local path, not a Hub dataset id). "
        "Give an existing .json/.jsonl/.csv/.parquet file, a dataset directory, or a Hub id such as `openai/gsm8k`."
    )


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


def prepare_dataset(dataset: Dataset, script_args: CEGPPOScriptArguments, reward_funcs: list | None = None) -> Dataset:
    """Give the rows the `prompt` (and `solution`) columns TRL and the rewards read, applying the prompt options.

    Other columns stay and reach the reward functions as keyword arguments, as in TRL. `reward_funcs` (resolved from
    `script_args.reward_funcs` when None) decide whether the default `solution_column` is needed: when the data has
    no `solution` column and no selected reward reads one, none is mapped.
    """
    from datasets import IterableDataset

    from .preflight import resolve_solution_column, source_column_problems

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


def _format_prompt(prompt: Any, script_args: CEGPPOScriptArguments) -> Any:
    template, system = script_args.prompt_template, script_args.system_prompt
    if isinstance(prompt, str):
        text = template.replace("{prompt}", prompt) if template else prompt
        if not (script_args.chat_prompts or system):
            return text
        messages = [{"role": "user", "content": text}]
    else:  # conversational: a list of {"role", "content"} messages
        messages = [dict(m) for m in prompt]
        if template:
            last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
            messages[last_user]["content"] = template.replace("{prompt}", messages[last_user]["content"])
    if system and messages[0]["role"] != "system":
        messages.insert(0, {"role": "system", "content": system})
    return messages


# ----------------------------------------------------------------------------------------------------------------
# Training
# ----------------------------------------------------------------------------------------------------------------
def main(script_args: CEGPPOScriptArguments, training_args: CEGPPOConfig, model_args: ModelConfig) -> CEGPPOTrainer:
    """Train with CE-GPPO as configured, save the model to `output_dir`, and return the trainer.

    Follows TRL's `grpo.py`: `ModelConfig` supplies `model_init_kwargs` (revision, attention implementation,
    dtype), the quantization config (`--load_in_4bit` / `--load_in_8bit`) and the LoRA config (`--use_peft`).
    Model placement is TRL's: `device_map=None` under DDP/DeepSpeed, `"auto"` on one GPU.
    """
    from .preflight import cli_checks
    from .quiet import log_above_progress_bars

    log_above_progress_bars()
    # Before the model loads (`cegppo check` prints the same report): each problem would otherwise fail, or train on
    # nothing, after it.
    report, prepared = cli_checks(script_args, training_args, model_args)
    report.raise_errors()
    # The launch's one resume plan, before the model loads (a refusal costs nothing then); it holds the `output_dir`
    # lock until the run ends, and the trainer follows it without planning again.
    plan = start_run(training_args, training_args.resume_from_checkpoint, logger.warning,
                     overwrite=script_args.overwrite_output_dir)  # fmt: skip
    training_args.resume_from_checkpoint = plan.checkpoint
    try:
        return _train(script_args, training_args, model_args, prepared, plan)
    finally:
        plan.release()


def _train(script_args, training_args, model_args, prepared, plan) -> CEGPPOTrainer:
    import torch
    import transformers
    from packaging.version import Version
    from trl import get_quantization_config

    from .trainer import CEGPPOTrainer

    reward_funcs, train_dataset, eval_dataset = prepared.reward_funcs, prepared.train_dataset, prepared.eval_dataset

    model_init_kwargs = dict(
        revision=model_args.model_revision,
        trust_remote_code=training_args.trust_remote_code,
        attn_implementation=model_args.attn_implementation,
        dtype=model_args.dtype,
    )
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    check_cpu_dtype(model_args, training_args)

    trainer = CEGPPOTrainer(
        model=model_args.model_name_or_path,
        reward_funcs=reward_funcs,
        args=training_args,
        train_dataset=train_dataset,
        eval_dataset=eval_dataset,
        quantization_config=get_quantization_config(model_args),
        peft_config=prepared.peft_config,
    )
    trainer.train(resume_from_checkpoint=plan)
    if not plan.finished:  # else `train()` wrote it from the checkpoint, if it was missing
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


# ----------------------------------------------------------------------------------------------------------------
# Checks before loading anything heavy: each names what is wrong and the fix
# ----------------------------------------------------------------------------------------------------------------
def check_model_path(name: str) -> None:
    """Refuse a path-looking model name with nothing there (the Hub would report an invalid repo id instead)."""
    expanded = os.path.expanduser(name)
    parent = os.path.dirname(expanded.rstrip("/"))
    looks_like_path = name.startswith(("./", "../", "/", "~")) or (parent != "" and os.path.isdir(parent))
    if looks_like_path and not os.path.exists(expanded):
        raise ValueError(
            f"`model_name_or_path`: no model at {expanded} (a path that does not exist). Give a local directory "
            "written by `save_pretrained` or a Hub id such as `Qwen/Qwen2.5-0.5B-Instruct`."
        )


def check_quantization(model_args: ModelConfig) -> None:
    """4-bit QLoRA needs a CUDA GPU: bitsandbytes loads 4-bit weights on CPU, but its CPU path does not train."""
    import torch

    if model_args.load_in_4bit and not torch.cuda.is_available():
        raise ValueError(
            "`--load_in_4bit` (4-bit QLoRA) needs a CUDA GPU, and none is available: bitsandbytes' CPU path loads "
            "4-bit weights but its kernels do not train them. On CPU drop `--load_in_4bit` and train LoRA on the "
            "full-precision model (`--use_peft true`)."
        )


def check_launch(training_args: CEGPPOConfig) -> None:
    """Fail fast when a launcher started several processes but accelerate set up a single-process run in each.

    Each copy would train on its own and write to the same `output_dir`. Two launches do this without GPUs:
    `accelerate launch --multi_gpu --num_processes N` (WORLD_SIZE=N, yet accelerate finds no GPU and falls back to one
    process) and `accelerate launch --cpu --num_processes N` (starts one process only).
    """
    _ = training_args.device  # sets up accelerate's distributed state
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size > 1 and training_args.world_size == 1:
        raise RuntimeError(
            f"The launcher started {world_size} processes (WORLD_SIZE={world_size}, "
            f"LOCAL_RANK={os.environ.get('LOCAL_RANK')}) but accelerate set up a single-process run in each: they "
            "would train independently and overwrite each other's `output_dir`. On a machine without GPUs, launch "
            f"several CPU processes with:\n    {CPU_LAUNCH_LINE}"
        )
    cpu_flag = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
    if cpu_flag and "MASTER_ADDR" in os.environ and "WORLD_SIZE" not in os.environ and training_args.world_size == 1:
        # `accelerate launch --cpu --num_processes N` (N > 1) sets MASTER_ADDR but starts one plain process.
        raise RuntimeError(
            "`accelerate launch --cpu --num_processes N` starts only one process (MASTER_ADDR is set, WORLD_SIZE is "
            "not). For one CPU process drop `--num_processes`; for several use:\n    " + CPU_LAUNCH_LINE
        )


def check_streaming_length(train_dataset: Dataset, training_args: CEGPPOConfig) -> None:
    """A streamed dataset has no length, so the number of steps must be given."""
    from datasets import IterableDataset

    if isinstance(train_dataset, IterableDataset) and training_args.max_steps <= 0:
        raise ValueError(
            "`dataset_streaming` reads the rows as training goes, so the run length cannot come from "
            "`num_train_epochs`: set `--max_steps N`, or drop `--dataset_streaming`."
        )


def cpu_computes_natively(dtype: str) -> bool:
    """Whether this CPU has instructions for `dtype` ("bfloat16" or "float16"), as PyTorch's oneDNN kernels see it.

    Without them half-precision matmuls are emulated, slower than float32; with them, bfloat16 is faster
    (`benchmarks/bench_cpu_dtype.py` measures the ratio).
    """
    import torch

    probe = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):  # a private probe: assume the slow path if this build lacks it
        return False


def check_cpu_dtype(model_args: ModelConfig, training_args: CEGPPOConfig) -> None:
    """Warn when a CPU run loads its weights in a half precision this CPU has no instructions for (emulated: every
    matmul is slower than in float32).

    A GPU recipe (`dtype: bfloat16`) run on CPU keeps its dtype: the setting is the user's, so it is not changed, but
    the warning says why it is slow and gives the flag. Where the CPU has the instructions, bfloat16 weights are
    faster than float32 (full fine-tuning and LoRA alike, `benchmarks/bench_cpu_dtype.py`): nothing to warn about.
    """
    configured = (training_args.model_init_kwargs or {}).get("dtype", model_args.dtype)
    if training_args.device.type != "cpu":
        return
    dtype = configured
    if dtype == "auto":  # the checkpoint's own dtype (config.json), cheap to read
        from transformers import AutoConfig

        try:
            config = AutoConfig.from_pretrained(
                model_args.model_name_or_path,
                revision=model_args.model_revision,
                trust_remote_code=training_args.trust_remote_code,
            )
        except Exception as error:  # the model load reports the real problem
            logger.debug("check_cpu_dtype: could not read the config: %s", error)
            return
        dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    name = str(dtype).removeprefix("torch.")
    if name not in ("bfloat16", "float16") or cpu_computes_natively(name):
        return
    logger.warning(
        "The model's weights load as %s (`dtype: %s`) on a CPU run, and this CPU has no %s instructions, so every "
        "matmul is emulated: each step is slower than with float32 weights (measured 1.7-2.5 times slower for "
        "float16 on a CPU that emulates it). Pass `--dtype float32`. CPU launch: `--use_cpu true --bf16 false --dtype "
        "float32` (or start from the shipped recipe: `--config cpu_smoke`); several CPU processes: %s",
        name,
        configured,
        name,
        CPU_LAUNCH_LINE,
    )
