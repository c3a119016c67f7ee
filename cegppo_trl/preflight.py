"""Pre-flight checks: everything knowable before the model loads, in one report.

One implementation, three callers:

- `cegppo check` (`main`): the same arguments and recipe as `cegppo train`; loads the dataset, the tokenizer and the
  model config (never the weights), prints the report and exits non-zero on any error;
- `cegppo train` (`scripts.main`): runs `cli_checks` before the model loads and raises the errors;
- the Python API: `CEGPPOTrainer.__init__` runs `trainer_checks` on its arguments before `GRPOTrainer` loads the
  model (`run_checks` is shared by all three; only the wording of the fixes differs: flags for the command line,
  dataset and config changes for the API).

The report holds, per section, what the trainer will see (the dataset's rows, columns and types, a few prompts as
the model gets them and their token lengths, what each reward receives and how it scores the reference answer, the
batch layout, the engine, the extras and the output directory) and a list of findings (`error`, `warning`).
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .rewards import (
    REFERENCE_COLUMN,
    TRAINER_KWARGS,
    likely_reference_column,
    missing_reference_message,
    reference_completion,
    reward_needs_chat,
    reward_reads_reference,
    reward_required_columns,
    reward_value_range,
)

if TYPE_CHECKING:
    from trl import ModelConfig

    from .config import CEGPPOConfig
    from .scripts import CEGPPOScriptArguments

logger = logging.getLogger(__name__)

SECTIONS = {
    "model": "Model",
    "dataset": "Dataset (as the trainer sees it)",
    "prompts": "Prompts (as the model gets them)",
    "rewards": "Rewards (what each receives for those rows, and its score for the reference answer)",
    "batch": "Batch layout",
    "engine": "Engine",
    "extras": "Extras",
    "output_dir": "Output directory",
}
SAMPLE_ROWS = 3
# Optional packages a setting needs: (module, install line).
EXTRAS = {
    "vllm": ("vllm", 'pip install "cegppo-trl[vllm]"'),
    "tensorboard": ("tensorboard", 'pip install "cegppo-trl[tensorboard]"'),
    "bitsandbytes": ("bitsandbytes", 'pip install "cegppo-trl[quant]"'),
    "deepspeed": ("deepspeed", 'pip install "cegppo-trl[deepspeed]"'),
}


# ----------------------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Finding:
    """One problem: `severity` is `"error"` (the run would fail or train on nothing) or `"warning"`."""

    severity: str
    section: str
    message: str
    exception: type[Exception] = ValueError
    code: str = ""  # a stable tag for callers that handle a finding themselves (e.g. "on_policy")


@dataclass
class Report:
    """What the run will see, section by section, and the findings."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    engine: str | None = None  # the distributed engine the launch will use (`check_distributed_engine`), once checked

    def info(self, section: str, line: str) -> None:
        self.lines.setdefault(section, []).append(line)

    def error(self, section: str, message: str, exception: type[Exception] = ValueError, code: str = "") -> None:
        self.findings.append(Finding("error", section, message, exception, code))

    def warning(self, section: str, message: str, code: str = "") -> None:
        self.findings.append(Finding("warning", section, message, code=code))

    def collect(self, section: str, check: Callable, *args: Any) -> Any:
        """Run a check that raises; record what it raises as an error (with its exception type)."""
        try:
            return check(*args)
        except (ValueError, RuntimeError, ImportError, OSError, TypeError) as error:
            self.error(section, str(error), type(error))
            return None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def raise_errors(self) -> None:
        """Raise the first error's exception type, with every error's message (numbered when several)."""
        errors = self.errors
        if not errors:
            return
        if len(errors) == 1:
            raise errors[0].exception(errors[0].message)
        text = f"{len(errors)} problems found before loading the model:\n" + "\n".join(
            f"  {i}. {f.message}" for i, f in enumerate(errors, 1)
        )
        raise errors[0].exception(text)

    def format(self, width: int = 100) -> str:
        """The report as text: each section's lines, then the findings, then a one-line verdict."""
        import textwrap

        out = []
        for section, title in SECTIONS.items():
            lines = self.lines.get(section)
            if not lines:
                continue
            out.append(title)
            for line in lines:
                out.extend(textwrap.wrap(line, width, initial_indent="  ", subsequent_indent="      ") or [""])
            out.append("")
        for finding in self.findings:
            head = f"{finding.severity.upper()} [{finding.section}] "
            out.extend(textwrap.wrap(head + finding.message, width, subsequent_indent="    ", break_long_words=False))
        n_err, n_warn = len(self.errors), len(self.warnings)
        verdict = "ready to train" if not n_err else "would fail or train on nothing: fix the errors above"
        out.append(f"{n_err} error(s), {n_warn} warning(s): {verdict}.")
        return "\n".join(out)


# ----------------------------------------------------------------------------------------------------------------
# Helpers
# ----------------------------------------------------------------------------------------------------------------
def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _short(value: Any, limit: int = 70) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _sample(dataset: Any, n: int = SAMPLE_ROWS) -> list[dict]:
    """The first `n` rows (a streaming dataset reads only those)."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        return list(itertools.islice(iter(dataset), n))
    return [dataset[i] for i in range(min(n, len(dataset)))]


def _type_name(value: Any) -> str:
    if isinstance(value, list):
        inner = {_type_name(v) for v in value[:3]}
        return f"list[{'|'.join(sorted(inner))}]" if inner else "list"
    return type(value).__name__


def _is_prompt(value: Any) -> bool:
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
    rows = _sample(dataset)
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
                        f"`{option}={path}`: `{'.'.join(keys[: depth + 1])}` holds {_type_name(nested[0])} values, "
                        "not records with fields: a dotted path reads a nested field."
                    )
                    break
                available = sorted({k for v in nested for k in v}) if nested else None
        else:
            if option == "prompt_column" and values and not all(_is_prompt(v) for v in values):
                bad = next(v for v in values if not _is_prompt(v))
                text_columns = [c for c in top if c != path and rows and isinstance(rows[0].get(c), str)]
                hint = f" (text columns: {', '.join(text_columns)})" if text_columns else ""
                problems.append(
                    f"`prompt_column={path}` holds {_type_name(bad)} values (e.g. {_short(bad)}), not text or a list "
                    f"of chat messages: the tokenizer cannot read them. Name the column with the prompt text with "
                    f"`--prompt_column`{hint}."
                )
    return problems


# ----------------------------------------------------------------------------------------------------------------
# The shared checks
# ----------------------------------------------------------------------------------------------------------------
def inspect_dataset(
    report: Report, dataset: Any, *, cli: bool, name: str = "train_dataset", environments: bool = False
) -> list[dict]:
    """Rows, columns and types; the errors the trainer would hit late. Returns a few rows.

    With `environments` (an `environment_factory` is given) the `prompt` column is optional, as in TRL: each
    rollout's `reset()` supplies the prompt (a dataset may hold only the `environment` routing column).
    """
    from datasets import IterableDataset

    columns = dataset.column_names
    streaming = isinstance(dataset, IterableDataset)
    if not streaming and len(dataset) == 0:
        fix = (
            "check `--dataset_name`, `--dataset_train_split` and `--max_train_samples`"
            if cli
            else f"pass a dataset with rows as `{name}`"
        )
        report.error("dataset", f"`{name}` is empty (0 rows): nothing to train on; {fix}.")
        return []
    rows = _sample(dataset)
    features = getattr(dataset, "features", None)
    if features is not None:
        shown = ", ".join(f"{c} ({_feature_name(features[c])})" for c in features)
    else:
        shown = ", ".join(f"{c} ({_type_name(v)})" for c, v in (rows[0].items() if rows else []))
    size = "streamed (length unknown)" if streaming else f"{len(dataset)} rows"
    report.info("dataset", f"{name}: {size}; columns: {shown or 'none'}")
    if columns is None and rows:
        columns = list(rows[0])
    if columns is not None and "prompt" not in columns:
        if environments:
            report.info("dataset", f"{name}: no `prompt` column; each environment's `reset()` gives the prompt")
            return rows
        likely = next((c for c in ("question", "problem", "query", "input", "text") if c in columns), None)
        fix = (
            f"`--prompt_column {likely or '<column>'}`"
            if cli
            else f"`{name} = {name}.rename_column({(likely or '<column>')!r}, 'prompt')` (TRL reads prompts from the "
            "`prompt` column)"
        )
        report.error("dataset", f"`{name}` has no `prompt` column (its columns: {', '.join(columns)}). Fix: {fix}.")
        return rows
    bad = next((r["prompt"] for r in rows if not _is_prompt(r.get("prompt"))), None)
    if rows and bad is not None:
        fix = "`--prompt_column`" if cli else "a `prompt` column"
        report.error(
            "dataset",
            f"The `prompt` column of `{name}` holds {_type_name(bad)} values (e.g. {_short(bad)}), not text or a "
            f"list of chat messages (`{{'role': ..., 'content': ...}}`): the tokenizer cannot read them. Use {fix} "
            "with the prompt text.",
        )
    return rows


def _feature_name(feature: Any) -> str:
    dtype = getattr(feature, "dtype", None)
    if dtype is not None and type(feature).__name__ == "Value":
        return str(dtype)
    if isinstance(feature, dict):
        return "{" + ", ".join(f"{k}: {_feature_name(v)}" for k, v in feature.items()) + "}"
    inner = getattr(feature, "feature", None)
    if inner is not None:
        return f"list[{_feature_name(inner)}]"
    if isinstance(feature, list) and feature:
        return f"list[{_feature_name(feature[0])}]"
    return type(feature).__name__


def render_prompts(report: Report, rows: list[dict], processing_class: Any, args: Any, *, cli: bool) -> None:
    """Each sample prompt as the model gets it (chat template applied) and its token length."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    chat_rows = [r for r in rows if isinstance(r.get("prompt"), list)]
    template = getattr(processing_class, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if chat_rows and not template:
        fix = (
            "For a base model trained on raw text pass `--chat_prompts false` (and drop `--system_prompt`): "
            "plain-text prompts then stay text; prompts that are chat messages in the dataset need a template "
            "whatever the flag"
            if cli
            else "Give plain-text prompts (strings) for a base model"
        )
        report.error(
            "prompts",
            "The prompts are chat messages, but the tokenizer has no chat template (a base model), so they cannot be "
            f"rendered. {fix}; or use a model with a chat template (an instruct model), or set one on the tokenizer "
            "(`tokenizer.chat_template = ...`, then `save_pretrained`).",
        )
        return
    kwargs = dict(getattr(args, "chat_template_kwargs", None) or {})
    lengths = []
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        if prompt is None:  # an environment's `reset()` gives it (`inspect_dataset` refused it otherwise)
            continue
        try:
            if isinstance(prompt, list):
                text = processing_class.apply_chat_template(
                    prompt, tokenize=False, add_generation_prompt=True, **kwargs
                )
            else:
                text = prompt
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        except Exception as error:  # TRL renders some inputs (images, tools) its own way: say so, do not refuse
            report.warning(
                "prompts",
                f"Rendering the prompt of row {i} with the chat template failed here ({type(error).__name__}: "
                f"{error}); check that the template accepts these messages.",
            )
            return
        lengths.append(n)
        report.info("prompts", f"row {i}, {n} tokens: {text!r}")
    if lengths:
        report.info(
            "prompts",
            f"completions: up to {args.max_completion_length} tokens each (`max_completion_length`); TRL does not "
            "truncate prompts",
        )


def _reward_name(func: Any) -> str:
    if isinstance(func, str):
        return func.split("/")[-1]
    config = getattr(func, "config", None)
    if config is not None and hasattr(config, "_name_or_path"):
        return str(config._name_or_path).split("/")[-1]
    return getattr(func, "__name__", type(func).__name__)


def inspect_rewards(
    report: Report, reward_funcs: Sequence[Any], names: Sequence[str], rows: list[dict], columns: Sequence[str],
    *, cli: bool,
) -> None:  # fmt: skip
    """What each reward receives for the sample rows, and its score for the reference answer."""
    columns = list(columns)
    for name, func in zip(names, reward_funcs, strict=True):
        if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):
            report.info(
                "rewards",
                f"{name}: a reward model (scores prompt + completion with its own tokenizer); the reference test does "
                "not apply",
            )
            continue
        missing = [c for c in reward_required_columns(func) if c not in columns]
        if missing == [REFERENCE_COLUMN]:
            report.error("rewards", missing_reference_message(name, columns, cli=cli))
            continue
        if missing:
            fix = (
                "map one with `--solution_column` (it arrives as `solution`)"
                if cli
                else "add them to the dataset given to the trainer"
            )
            report.error(
                "rewards",
                f"Reward `{name}` needs the dataset column(s) {missing}, which the data lacks (columns: "
                f"{', '.join(columns)}). Add them, or {fix}.",
            )
            continue
        value_range = reward_value_range(func)
        span = "range not declared" if value_range is None else f"scores {value_range[0]:g} to {value_range[1]:g}"
        kwargs = [c for c in columns if c != "prompt"]
        reads = reward_reads_reference(func)
        report.info(
            "rewards",
            f"{name} ({span}): receives prompts, completions and the columns {', '.join(kwargs) or '(none)'} as "
            f"keyword lists{'' if reads else '; reads no reference'}",
        )
        if reward_needs_chat(func) and rows and isinstance(rows[0].get("prompt"), str):
            fix = "`--chat_prompts true`, a model with a chat template" if cli else "chat-message prompts"
            report.error(
                "rewards",
                f"TRL's {name} read(s) chat completions (`completion[0]['content']`), and the prompts are plain text, "
                f"so the completions will be too. Use chat prompts ({fix}), or this library's rewards, which read "
                "both (`math_verify_01` for accuracy_reward, `format` for a format check).",
            )
            continue
        if reference_completion(func, "0") is None:
            if reads is not False:
                report.info(
                    "rewards",
                    f"  the reference test does not apply: {name} does not say how a completion stating the reference "
                    "looks (define `reference_completion(solution)` on it to include it)",
                )
            for i, row in enumerate(rows):
                if REFERENCE_COLUMN in row and reads is not False:
                    report.info("rewards", f"  row {i}: solution={_short(row[REFERENCE_COLUMN])}")
            continue
        _score_references(report, name, func, rows, value_range, cli=cli)


def _score_references(report, name, func, rows, value_range, *, cli: bool) -> None:
    failures = []
    for i, row in enumerate(rows):
        solution = row.get(REFERENCE_COLUMN)
        completion = reference_completion(func, "" if solution is None else solution)
        extra = {k: [v] for k, v in row.items() if k not in ("prompt", "completion") and k not in TRAINER_KWARGS}
        try:
            score = func(prompts=[row.get("prompt")], completions=[completion], **extra)[0]
        except Exception as error:
            report.error("rewards", f"Reward `{name}` raised on the reference answer of row {i}: "
                         f"{type(error).__name__}: {error}")  # fmt: skip
            return
        top = None if value_range is None else value_range[1]
        ok = score is not None and (top is None or abs(float(score) - top) <= 1e-6)
        mark = "top score" if ok else "NOT the top score"
        report.info("rewards", f"  row {i}: solution={_short(solution)} -> the reference scores {score} ({mark})")
        if not ok:
            failures.append((i, solution, score))
    if failures:
        i, solution, score = failures[0]
        fix = (
            "`--solution_column` (a dotted path reads a nested field)"
            if cli
            else "the `solution` column of the dataset"
        )
        report.error(
            "rewards",
            f"Reward `{name}` gives the reference answer itself (row {i}: solution={_short(solution)}) the score "
            f"{score}, not its top score {value_range[1]:g} ({len(failures)} of {len(rows)} rows checked): the "
            f"reference column does not hold what this reward reads, or the reward does not fit this data, and every "
            f"completion would be scored wrong. Check {fix} and the reward.",
        )


def inspect_reward_weights(report: Report, args: Any, n_rewards: int, *, cli: bool) -> None:
    weights = getattr(args, "reward_weights", None)
    if weights is None or len(weights) == n_rewards:
        return
    flag = "`--reward_weights`" if cli else "`reward_weights`"
    report.error(
        "rewards",
        f"{flag} has {len(weights)} value(s) ({', '.join(map(str, weights))}) for {n_rewards} reward function(s): "
        "give one weight per reward function, in the same order, or none (all 1).",
    )


def inspect_batch_layout(report: Report, args: Any, world_size: int) -> None:
    """Rollout batch, groups, optimizer steps per rollout batch, on- or off-policy, the divisibility rules."""
    from .config import CEGPPO_LOSS_TYPES, is_on_policy, on_policy_message

    per_device, spg, ga = args.per_device_train_batch_size, args.steps_per_generation, args.gradient_accumulation_steps
    rollout = args.generation_batch_size or per_device * world_size * spg
    groups = rollout // args.num_generations
    steps = spg * args.num_iterations / ga
    report.info(
        "batch",
        f"rollout batch: {rollout} completions = {groups} prompt(s) x {args.num_generations} generations "
        f"({per_device} per device x {world_size} process(es) x {spg} steps_per_generation)",
    )
    report.info(
        "batch",
        f"optimizer steps per rollout batch: {steps:g} (steps_per_generation {spg} x num_iterations "
        f"{args.num_iterations} / gradient_accumulation_steps {ga})",
    )
    if spg % ga:
        report.warning(
            "batch",
            f"`steps_per_generation={spg}` is not a multiple of `gradient_accumulation_steps={ga}`: optimizer steps "
            f"straddle two rollout batches (one step sums micro-batches of a batch generated before it and of one "
            f"generated after), and a rollout batch gives {steps:g} optimizer steps. Set `steps_per_generation` to a "
            f"multiple of {ga}.",
            code="divisibility",
        )
    if args.loss_type not in CEGPPO_LOSS_TYPES:
        report.info("batch", f"loss_type={args.loss_type}: TRL's objective, unchanged (a baseline)")
    elif is_on_policy(args):
        report.info("batch", "on-policy: the ratio is 1 at every step, so CE-GPPO is identical to GRPO")
        report.warning("batch", on_policy_message(args), code="on_policy")
    else:
        report.info("batch", "off-policy after the first optimizer step of each rollout batch: CE-GPPO acts")
    if getattr(args, "dynamic_sampling", False):
        report.info("batch", "dynamic sampling: groups whose rewards are all equal are dropped from the loss")


def inspect_engine(report: Report, args: Any) -> None:
    from .distributed import check_distributed_engine

    try:
        engine = check_distributed_engine(args)
    except RuntimeError as error:
        report.error("engine", str(error), RuntimeError)
        return
    report.engine = engine
    world_size = args.world_size
    device = args.device.type
    if engine is None and world_size == 1:
        report.info("engine", f"one process on {device}")
    else:
        report.info("engine", f"{engine or 'DDP'} on {device}, {world_size} processes")
    if args.use_vllm:
        report.info("engine", f"generation: vLLM ({args.vllm_mode})")
    else:
        report.info("engine", "generation: the training model (transformers `generate`)")


def inspect_extras(report: Report, args: Any, *, cli: bool, quantized: bool = False) -> None:
    """Optional packages the settings need and that are not installed, with this package's install line."""
    from .distributed import _flag

    needed = []
    if args.use_vllm:
        needed.append(("vllm", "`use_vllm=True`"))
    report_to = args.report_to if isinstance(args.report_to, list) else [args.report_to]
    if "tensorboard" in report_to:
        needed.append(("tensorboard", "`report_to` includes tensorboard"))
    if quantized:
        needed.append(("bitsandbytes", "4-/8-bit loading (`load_in_4bit` / `load_in_8bit`)"))
    if getattr(args, "deepspeed", None) or _flag(os.environ, "ACCELERATE_USE_DEEPSPEED"):
        needed.append(("deepspeed", "a DeepSpeed launch"))
    for extra, why in needed:
        module, line = EXTRAS[extra]
        if _installed(module):
            report.info("extras", f"{extra}: installed ({why})")
        else:
            report.info("extras", f"{extra}: NOT installed ({why}): `{line}`")
            report.error(
                "extras", f"{why} needs `{module}`, which is not installed. Install it with `{line}`.", ImportError
            )
    if not needed:
        report.info("extras", "none needed by these settings")


def inspect_output_dir(report: Report, args: Any) -> None:
    """Fresh, holds checkpoints, or a file (the checkpoint rules themselves are `checkpoints`' and `scripts`')."""
    path = args.output_dir
    if path is None:
        return
    if os.path.isfile(path):
        report.error(
            "output_dir",
            f"`output_dir` {path} is a file, not a directory: the trainer writes checkpoints and the model into it. "
            "Pick another `output_dir` (or move the file).",
            FileExistsError,
        )
        return
    if not os.path.isdir(path):
        report.info("output_dir", f"{path}: fresh (will be created)")
        return
    from .checkpoints import checkpoint_folders

    checkpoints = [os.path.basename(folder) for folder in checkpoint_folders(path)]
    if checkpoints:
        report.info(
            "output_dir",
            f"{path}: holds checkpoints ({', '.join(checkpoints[-3:])}{', ...' if len(checkpoints) > 3 else ''}); "
            f"resume_from_checkpoint={args.resume_from_checkpoint!r}",
        )
    else:
        report.info("output_dir", f"{path}: exists, no checkpoints{'' if os.listdir(path) else ' (empty)'}")


def _lora_targets_matched(targets: Any, module_names: Sequence[str], linear_names: Sequence[str]) -> list[str]:
    """The LoRA targets no module of the model matches (PEFT's rules: a list matches a name or a `.name` suffix, a
    string is a full-match regex, `all-linear` every linear layer)."""
    import re

    if targets is None:
        return []
    if isinstance(targets, str):
        if targets == "all-linear":
            return [] if linear_names else [targets]
        return [] if any(re.fullmatch(targets, n) for n in module_names) else [targets]
    return [t for t in targets if not any(n == t or n.endswith("." + t) for n in module_names)]


def inspect_model(report: Report, model: Any, args: Any, peft_config: Any, *, cli: bool) -> None:
    """The model's class and size from its config (meta device: no weights), and LoRA targets it lacks."""
    import torch

    if isinstance(model, str):
        from transformers import AutoConfig, AutoModelForCausalLM

        init = args.model_init_kwargs or {}
        try:
            config = AutoConfig.from_pretrained(
                model, revision=init.get("revision"), trust_remote_code=args.trust_remote_code
            )
        except Exception as error:  # the model load reports it with its own message; the CLI checks the path first
            report.error("model", f"Cannot read the config of `{model}`: {type(error).__name__}: {error}", OSError)
            return
        if peft_config is None:
            report.info(
                "model", f"{model}: {', '.join(getattr(config, 'architectures', None) or [config.model_type])}"
            )
            return
        try:
            with torch.device("meta"):
                instance = AutoModelForCausalLM.from_config(config, trust_remote_code=args.trust_remote_code)
        except Exception as error:
            logger.debug("inspect_model: cannot build %s on the meta device: %s", model, error)
            return
    else:
        instance = model
    names = [n for n, _ in instance.named_modules() if n]
    linear = [n for n, m in instance.named_modules() if isinstance(m, torch.nn.Linear)]
    params = sum(p.numel() for p in instance.parameters())
    report.info("model", f"{type(instance).__name__}: {params:,} parameters, {len(linear)} linear layers")
    if peft_config is None:
        return
    targets = getattr(peft_config, "target_modules", None)
    missing = _lora_targets_matched(targets, names, linear)
    suffixes = sorted({n.rsplit(".", 1)[-1] for n in linear})
    if missing:
        flag = "`--lora_target_modules`" if cli else "`target_modules` of the `peft_config`"
        report.error(
            "model",
            f"LoRA target module(s) {missing} match no module of {type(instance).__name__}: PEFT would refuse "
            f"after loading the model. Its linear layers are named {', '.join(suffixes)}; set {flag} to some of "
            "them, or `all-linear`.",
        )
    else:
        report.info("model", f"LoRA targets {targets}: found (linear layers: {', '.join(suffixes)})")


def run_checks(
    train_dataset: Any,
    reward_funcs: Any,
    args: CEGPPOConfig,
    *,
    eval_dataset: Any = None,
    reward_names: Sequence[str] | None = None,
    model: Any = None,
    peft_config: Any = None,
    processing_class: Any = None,
    quantized: bool = False,
    cli: bool = False,
    engine: bool = True,
    environments: bool = False,
    report: Report | None = None,
) -> Report:
    """The checks shared by `cegppo check`, `cegppo train` and `CEGPPOTrainer`, on what the trainer is given.

    Args:
        train_dataset: the dataset as the trainer sees it (`prompt` column, dataset columns as reward kwargs).
        reward_funcs: a reward function, model id or model, or a list of them.
        args: the `CEGPPOConfig`.
        eval_dataset: checked like `train_dataset` (rewards and columns) when given.
        reward_names: names for the messages (the CLI's `--reward_funcs`); the functions' names otherwise.
        model: a model id or path (its config is read, the model is built on the meta device) or a model instance,
            for the LoRA targets; None skips the model section.
        peft_config: the LoRA config, if any.
        processing_class: a tokenizer/processor to render the sample prompts with; None skips the rendering.
        quantized: 4-/8-bit loading (needs bitsandbytes).
        cli: word the fixes as `cegppo train` flags (else as dataset / config changes for the Python API).
        engine: check the distributed engine (the CLI checks it first, before loading the data).
        environments: an `environment_factory` is given (the datasets need no `prompt` column).
        report: a report to add to (the CLI's own checks come first).

    Returns:
        The report; `report.raise_errors()` raises when it holds errors.
    """
    report = Report() if report is None else report
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    funcs = [f for f in funcs if f is not None]
    names = list(reward_names) if reward_names is not None else [_reward_name(f) for f in funcs]
    if model is not None:
        inspect_model(report, model, args, peft_config, cli=cli)
    for split, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if dataset is None or isinstance(dataset, dict):  # a dict of eval datasets: TRL checks each itself
            continue
        errors_before = len(report.errors)
        rows = inspect_dataset(report, dataset, cli=cli, name=split, environments=environments)
        if len(report.errors) > errors_before or not rows:
            continue
        if split == "train_dataset" and processing_class is not None:
            render_prompts(report, rows, processing_class, args, cli=cli)
        columns = dataset.column_names if dataset.column_names is not None else list(rows[0])
        if split == "train_dataset":
            inspect_rewards(report, funcs, names, rows, columns, cli=cli)
        else:  # the rewards score the evaluation rollouts too: the columns they need must be there
            sub = Report()
            inspect_rewards(sub, funcs, names, rows, columns, cli=cli)
            report.findings.extend(f for f in sub.errors if f.message not in {g.message for g in report.errors})
    inspect_reward_weights(report, args, len(funcs), cli=cli)
    inspect_batch_layout(report, args, args.world_size)
    if engine:
        inspect_engine(report, args)
    inspect_extras(report, args, cli=cli, quantized=quantized)
    inspect_output_dir(report, args)
    return report


# ----------------------------------------------------------------------------------------------------------------
# Caller 1: the Python API
# ----------------------------------------------------------------------------------------------------------------
def trainer_checks(model: Any, reward_funcs: Any, args: CEGPPOConfig, *pargs: Any, **kwargs: Any) -> Report:
    """`run_checks` on `CEGPPOTrainer`'s arguments (those of `GRPOTrainer.__init__`); logs the warnings and raises
    the errors, before the model loads. The on-policy warning is left to the trainer, which gives it after init."""
    import inspect

    from trl import GRPOTrainer

    bound = inspect.signature(GRPOTrainer.__init__).bind(None, model, reward_funcs, args, *pargs, **kwargs).arguments
    quantized = bool((args.model_init_kwargs or {}).get("quantization_config"))
    report = run_checks(
        bound.get("train_dataset"),
        reward_funcs,
        args,
        eval_dataset=bound.get("eval_dataset"),
        model=model if bound.get("peft_config") is not None else None,
        peft_config=bound.get("peft_config"),
        processing_class=bound.get("processing_class"),
        quantized=quantized,
        environments=bound.get("environment_factory") is not None,
    )
    for finding in report.warnings:
        if finding.code != "on_policy":
            logger.warning(finding.message)
    report.raise_errors()
    return report


# ----------------------------------------------------------------------------------------------------------------
# Callers 2 and 3: the command line (`cegppo train`, `cegppo check`)
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class Prepared:
    """What `cli_checks` loaded for the trainer."""

    train_dataset: Any = None
    eval_dataset: Any = None
    reward_funcs: list = field(default_factory=list)
    peft_config: Any = None


def cli_checks(
    script_args: CEGPPOScriptArguments, training_args: CEGPPOConfig, model_args: ModelConfig
) -> tuple[Report, Prepared]:
    """Every check of a `cegppo train` command before the model loads; the data and rewards it prepared."""
    from trl import get_peft_config

    from . import scripts

    report = Report()
    prepared = Prepared()
    model_name = model_args.model_name_or_path
    if model_name is None:
        report.error("model", "`model_name_or_path` is required (a Hub id or a local directory).")
    else:
        report.collect("model", scripts.check_model_path, model_name)
    report.collect("extras", scripts.check_quantization, model_args)
    report.collect("engine", scripts.check_launch, training_args)
    inspect_engine(report, training_args)  # first: a launch that would run the wrong engine is wrong whatever else
    for name in script_args.reward_funcs:
        func = report.collect("rewards", scripts.get_reward_func, name)
        if func is not None:
            prepared.reward_funcs.append(func)
    rewards_ok = len(prepared.reward_funcs) == len(script_args.reward_funcs)
    dataset = report.collect("dataset", scripts.load_dataset_dict, script_args)
    if dataset is not None and rewards_ok:
        split = script_args.dataset_train_split
        if split not in dataset:
            report.error(
                "dataset",
                f"The dataset has no split {split!r} (splits: {list(dataset)}): name it with `--dataset_train_split`.",
            )
        else:
            prepared.train_dataset = report.collect(
                "dataset", scripts.prepare_dataset, dataset[split], script_args, prepared.reward_funcs
            )
        if training_args.eval_strategy != "no":
            if script_args.dataset_test_split not in dataset:
                strategy = getattr(training_args.eval_strategy, "value", training_args.eval_strategy)
                report.error(
                    "dataset",
                    f"eval_strategy={strategy!r} but the dataset has no split {script_args.dataset_test_split!r} "
                    f"(splits: {list(dataset)}). Name the split with `--dataset_test_split`, or `--eval_strategy no`.",
                )
            else:
                prepared.eval_dataset = report.collect(
                    "dataset",
                    scripts.prepare_dataset,
                    dataset[script_args.dataset_test_split],
                    script_args,
                    prepared.reward_funcs,
                )
    if prepared.train_dataset is not None:
        report.collect("dataset", scripts.check_streaming_length, prepared.train_dataset, training_args)
    model_ok = model_name is not None and not any(f.section == "model" for f in report.errors)
    processing_class = None
    if model_ok:
        processing_class = report.collect("model", _load_processing_class, model_args, training_args)
        model_ok = processing_class is not None
    prepared.peft_config = report.collect("model", get_peft_config, model_args)
    run_checks(
        prepared.train_dataset,
        prepared.reward_funcs,
        training_args,
        eval_dataset=prepared.eval_dataset,
        reward_names=script_args.reward_funcs[: len(prepared.reward_funcs)],
        model=model_name if model_ok else None,
        peft_config=prepared.peft_config,
        processing_class=processing_class,
        quantized=bool(model_args.load_in_4bit or model_args.load_in_8bit),
        cli=True,
        engine=False,
        report=report,
    )
    return report, prepared


def _load_processing_class(model_args: ModelConfig, training_args: CEGPPOConfig) -> Any:
    """The tokenizer/processor as TRL's trainer loads it (not the weights)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(
            model_args.model_name_or_path,
            revision=model_args.model_revision,
            trust_remote_code=training_args.trust_remote_code,
        )
    except Exception as error:
        raise OSError(
            f"Cannot load the tokenizer of `{model_args.model_name_or_path}` (`model_name_or_path`): "
            f"{type(error).__name__}: {error}"
        ) from error


def main(argv: list[str] | None = None) -> int:
    """`cegppo check`: the report for a `cegppo train` command line; 1 when it holds errors, else 0."""
    import shutil

    from .quiet import quiet_unused_deepspeed
    from .scripts import parse_args

    quiet_unused_deepspeed()  # a check trains nothing: DeepSpeed's device notice is noise whatever the engine
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        script_args, training_args, model_args = parse_args(argv, prog="cegppo check")
    except ValueError as error:
        print(f"cegppo check: error: {error}", file=sys.stderr)
        return 2
    report, _ = cli_checks(script_args, training_args, model_args)
    width = max(60, min(shutil.get_terminal_size((100, 20)).columns, 119))
    print(report.format(width))
    return 1 if report.errors else 0
