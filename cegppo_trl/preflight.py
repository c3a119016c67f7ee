"""Pre-flight checks: what only a check before the model loads can tell, in one report.

A layer below both callers, over what the trainer will be given (datasets, rewards, config, tokenizer, world size):
`run_checks` returns a `Report` of findings, each with its fix as data (`Fix`: the setting and the value that works),
and the caller words the fixes once (`cegppo check`/`train` as flags, `CEGPPOTrainer.__init__` as arguments). The
rules, in the order the checks run:

1. Keep what only the pre-flight can tell before the model loads: the prompt and reward columns, the chat template,
   the batch layout (on- or off-policy), the output folder, the launch and what is missing for it.
2. Where TRL, transformers, PEFT or datasets refuse clearly, theirs stands. A host check is run here only where it
   saves a model load, by calling the host's own validator (`GenerationConfig`, the tracker callbacks) or raising
   the host's exception type with its words.
3. No user reward is called: its signature says which columns it reads. The package's own rewards (and TRL's by
   name) score the reference answer. `cegppo check --call_rewards` opts in to calling every reward on a rollout
   batch of real rows.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .data import check_model_path, is_prompt, sample_rows, short_repr, type_name
from .rewards import (
    REFERENCE_COLUMN,
    REWARD_FUNCS,
    TRAINER_KWARGS,
    likely_reference_column,
    reference_completion,
    reward_needs_chat,
    reward_reads_reference,
    reward_required_columns,
    reward_value_range,
)

if TYPE_CHECKING:
    from .config import CEGPPOConfig

logger = logging.getLogger(__name__)

SECTIONS = {
    "model": "Model",
    "dataset": "Dataset (as the trainer sees it)",
    "prompts": "Prompts (as the model gets them)",
    "rewards": "Rewards (what each receives, read from its signature; the reference answer's score)",
    "batch": "Batch layout",
    "schedules": "Schedules",
    "engine": "Engine",
    "extras": "Extras",
    "output_dir": "Output directory",
}
# Rows whose prompts are checked one by one (None, empty, malformed chat messages): every row up to this many, else
# the first this many (reading one column of 100k rows takes well under a second).
PROMPT_ROWS_CHECKED = 100_000


# ----------------------------------------------------------------------------------------------------------------
# The report
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fix:
    """What fixes a finding: the setting and the value that works; the caller words it once.

    `cegppo check`/`train` word it as a flag (`--solution_column answer`), the Python API as an argument
    (`solution_column='answer'`), or as `api` where the API's remedy is not an argument (a dataset change).
    """

    field: str
    value: Any = None
    api: str | None = None

    def as_flag(self) -> str:
        if self.value is None:
            return f"`--{self.field}`"
        value = self.value
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple)):
            value = " ".join(map(str, value))
        return f"`--{self.field} {value}`"

    def as_argument(self) -> str:
        if self.api is not None:
            return self.api
        return f"`{self.field}`" if self.value is None else f"`{self.field}={self.value!r}`"


@dataclass
class Finding:
    """One problem: `severity` is `"error"` (the run would fail or train on nothing) or `"warning"`.

    `message` holds `{fix}` (and `{fix1}`, ...) where its `fixes` go, worded by `text`.
    """

    severity: str
    section: str
    message: str
    exception: type[Exception] = ValueError
    code: str = ""  # a stable tag for callers that handle a finding themselves (e.g. "on_policy")
    fixes: tuple[Fix, ...] = ()

    def text(self, flags: bool = False) -> str:
        """The message with its fixes worded as flags (`flags=True`, the command line) or as API arguments."""
        text = self.message
        for i, fix in enumerate(self.fixes):
            text = text.replace("{fix}" if i == 0 else f"{{fix{i}}}", fix.as_flag() if flags else fix.as_argument())
        return text


@dataclass
class Report:
    """What the run will see, section by section, and the findings."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)
    engine: str | None = None  # the distributed engine the launch will use (`check_distributed_engine`), once checked

    def info(self, section: str, line: str) -> None:
        self.lines.setdefault(section, []).append(line)

    def error(
        self, section: str, message: str, exception: type[Exception] = ValueError, code: str = "", fixes=()
    ) -> None:
        self.findings.append(Finding("error", section, message, exception, code, tuple(fixes)))

    def warning(self, section: str, message: str, code: str = "", fixes=()) -> None:
        self.findings.append(Finding("warning", section, message, code=code, fixes=tuple(fixes)))

    def collect(self, section: str, check: Callable, *args: Any, **kwargs: Any) -> Any:
        """Run a check that raises; record what it raises as an error (with its exception type)."""
        try:
            return check(*args, **kwargs)
        except (ValueError, RuntimeError, ImportError, OSError, TypeError) as error:
            self.error(section, str(error), type(error))
            return None

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def raise_errors(self, flags: bool = False) -> None:
        """Raise the first error's exception type, with every error's message (numbered when several)."""
        errors = self.errors
        if not errors:
            return
        if len(errors) == 1:
            raise errors[0].exception(errors[0].text(flags))
        text = f"{len(errors)} problems found before loading the model:\n" + "\n".join(
            f"  {i}. {f.text(flags)}" for i, f in enumerate(errors, 1)
        )
        raise errors[0].exception(text)

    def format(self, width: int = 100, flags: bool = True) -> str:
        """The report as text: each section's lines, then the findings, then a one-line verdict."""
        import functools
        import textwrap

        # Paths, flags and values stay whole (copy-pasteable): no break inside a word or at its hyphens.
        wrap = functools.partial(textwrap.wrap, width=width, break_long_words=False, break_on_hyphens=False)
        out = []
        for section, title in SECTIONS.items():
            lines = self.lines.get(section)
            if not lines:
                continue
            out.append(title)
            for line in lines:
                out.extend(wrap(line, initial_indent="  ", subsequent_indent="      ") or [""])
            out.append("")
        for finding in self.findings:
            head = f"{finding.severity.upper()} [{finding.section}] "
            out.extend(wrap(head + finding.text(flags), subsequent_indent="    "))
        n_err, n_warn = len(self.errors), len(self.warnings)
        verdict = "ready to train" if not n_err else "would fail or train on nothing: fix the errors above"
        out.append(f"{n_err} error(s), {n_warn} warning(s): {verdict}.")
        return "\n".join(out)


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


# ----------------------------------------------------------------------------------------------------------------
# The shared checks
# ----------------------------------------------------------------------------------------------------------------
def inspect_dataset(
    report: Report, dataset: Any, *, name: str = "train_dataset", environments: bool = False
) -> list[dict]:
    """Rows, columns and types; the errors the trainer would hit late. Returns a few rows.

    With `environments` (an `environment_factory` is given) the `prompt` column is optional, as in TRL: each
    rollout's `reset()` supplies the prompt.
    """
    from datasets import IterableDataset

    columns = dataset.column_names
    streaming = isinstance(dataset, IterableDataset)
    if not streaming and len(dataset) == 0:
        report.error(
            "dataset",
            f"`{name}` is empty (0 rows): nothing to train on; check {{fix}}.",
            fixes=[Fix("dataset_name", api=f"that you pass a dataset with rows as `{name}`")],
        )
        return []
    rows = sample_rows(dataset)
    features = getattr(dataset, "features", None)
    if features is not None:
        shown = ", ".join(f"{c} ({_feature_name(features[c])})" for c in features)
    else:
        shown = ", ".join(f"{c} ({type_name(v)})" for c, v in (rows[0].items() if rows else []))
    size = "streamed (length unknown)" if streaming else f"{len(dataset)} rows"
    report.info("dataset", f"{name}: {size}; columns: {shown or 'none'}")
    if columns is None and rows:
        columns = list(rows[0])
    if columns is not None and "prompt" not in columns:
        if environments:
            report.info("dataset", f"{name}: no `prompt` column; each environment's `reset()` gives the prompt")
            return rows
        likely = next((c for c in ("question", "problem", "query", "input", "text") if c in columns), None)
        rename = f"`{name} = {name}.rename_column({(likely or '<column>')!r}, 'prompt')` (TRL reads prompts from the "
        report.error(
            "dataset",
            f"`{name}` has no `prompt` column (its columns: {', '.join(columns)}). Fix: {{fix}}.",
            fixes=[Fix("prompt_column", likely or "<column>", api=rename + "`prompt` column)")],
        )
        return rows
    # A column of the wrong type (numbers, records); a None or empty prompt is a row's problem, named below.
    wrong = [r["prompt"] for r in rows if not is_prompt(r.get("prompt")) and r.get("prompt") not in (None, [])]
    if wrong and not isinstance(wrong[0], list):
        bad = wrong[0]
        report.error(
            "dataset",
            f"The `prompt` column of `{name}` holds {type_name(bad)} values (e.g. {short_repr(bad)}), not text or a "
            f"list of chat messages (`{{'role': ..., 'content': ...}}`): the tokenizer cannot read them. Use {{fix}} "
            "with the prompt text.",
            fixes=[Fix("prompt_column", api="a `prompt` column")],
        )
        return rows
    if rows:
        inspect_prompt_rows(report, dataset, name)
    return rows


def prompt_problem(prompt: Any) -> str | None:
    """What the tokenizer or the chat template would fail on in one prompt, or None."""
    if prompt is None:
        return "is None"
    if isinstance(prompt, str):
        return "is empty" if not prompt.strip() else None
    if not isinstance(prompt, list):
        return f"is {type_name(prompt)}, not text or chat messages"
    if not prompt:
        return "is an empty list of messages"
    for j, message in enumerate(prompt):
        if not isinstance(message, dict):
            return f"message {j} is {type_name(message)}, not a {{'role': ..., 'content': ...}} record"
        keys = {k for k, v in message.items() if v is not None}  # a datasets row holds every field of the schema
        if "role" not in keys:  # TRL's `is_conversational` reads `role`; `content` may be absent (a tool call)
            other = sorted(keys - {"role", "content"})
            return f"message {j} has the keys {sorted(keys)}, not `role` and `content`" + (
                f" (a misspelling: {', '.join(map(repr, other))}?)" if other else ""
            )
        if not isinstance(message["role"], str):
            return f"message {j} has the role {short_repr(message['role'])}, not a string"
    if not any(isinstance(m.get("content"), str) and m["content"].strip() or isinstance(m.get("content"), list)
               or m.get("tool_calls") for m in prompt):  # fmt: skip
        return "holds only empty messages"
    return None


def inspect_prompt_rows(report: Report, dataset: Any, name: str) -> None:
    """Every prompt the trainer will read (up to `PROMPT_ROWS_CHECKED`; a stream: its first rows), one by one."""
    from datasets import IterableDataset

    if isinstance(dataset, IterableDataset):
        prompts, scope = [r.get("prompt") for r in sample_rows(dataset, 64)], "the stream's first 64 rows"
    else:
        n = min(len(dataset), PROMPT_ROWS_CHECKED)
        column = dataset.select(range(n))["prompt"] if n < len(dataset) else dataset["prompt"]
        prompts, scope = list(column), (f"all {n} rows" if n == len(dataset) else f"the first {n} rows")
    bad = [(i, problem) for i, p in enumerate(prompts) if (problem := prompt_problem(p)) is not None]
    if not bad:
        report.info("dataset", f"prompts: {scope} checked (none None, empty or malformed)")
        return
    (i, problem), more = bad[0], len(bad) - 1
    report.error(
        "dataset",
        f"`{name}` row {i}: the prompt {problem}" + (f" ({more} more of {scope} too)" if more else f" ({scope} "
        "checked)") + ": the tokenizer or the chat template fails on it, or the model is trained on an empty prompt, "
        "at the first batch that draws it. Fix or drop those rows (`dataset.filter(...)`).",
    )  # fmt: skip


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


def render_prompts(report: Report, rows: list[dict], processing_class: Any, args: Any) -> None:
    """Each sample prompt as the model gets it (chat template applied) and its token length."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    chat_rows = [r for r in rows if isinstance(r.get("prompt"), list)]
    template = getattr(processing_class, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if chat_rows and not template:
        report.error(
            "prompts",
            "The prompts are chat messages, but the tokenizer has no chat template (a base model), so they cannot be "
            "rendered. For a base model trained on raw text give plain-text prompts ({fix}; prompts that are chat "
            "messages in the dataset need a template whatever the setting); or use a model with a chat template (an "
            "instruct model), or set one on the tokenizer (`tokenizer.chat_template = ...`, then `save_pretrained`).",
            fixes=[Fix("chat_prompts", False, api="strings in the `prompt` column")],
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


def is_own_reward(func: Any) -> bool:
    """This package's rewards and TRL's by name: the pre-flight may call them (no side effects, no user code)."""
    return any(func is own for own in REWARD_FUNCS.values()) or getattr(func, "__module__", "").startswith(
        "trl.rewards"
    )


def inspect_rewards(
    report: Report, reward_funcs: Sequence[Any], names: Sequence[str], rows: list[dict], columns: Sequence[str],
    call: list[dict] | None = None,
) -> None:  # fmt: skip
    """What each reward receives (read from its signature, not by calling it), and the reference answer's score for
    the rewards the package may call. `call` (the opt-in of `cegppo check --call_rewards`): a rollout batch of real
    rows on which every reward is called as TRL calls it."""
    columns = list(columns)
    for name, func in zip(names, reward_funcs, strict=True):
        if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):
            report.info("rewards", f"{name}: a reward model (TRL scores prompt + completion with its own tokenizer)")
            continue
        missing = [c for c in reward_required_columns(func) if c not in columns]
        if missing == [REFERENCE_COLUMN]:
            _missing_reference(report, name, columns)
            continue
        if missing:
            import difflib

            close = {m: difflib.get_close_matches(m, columns, n=1, cutoff=0.6) for m in missing}
            hint = "; ".join(f"did you mean `{c[0]}` for `{m}`?" for m, c in close.items() if c)
            report.error(
                "rewards",
                f"Reward `{name}` needs the dataset column(s) {missing}, which the data lacks (columns: "
                f"{', '.join(columns)}){f' ({hint})' if hint else ''}. Add them to the dataset, or {{fix}}.",
                fixes=[Fix("solution_column", api="rename the column (`dataset.rename_column(old, new)`)")],
            )
            continue
        value_range = reward_value_range(func)
        span = "range not declared" if value_range is None else f"scores {value_range[0]:g} to {value_range[1]:g}"
        kind = "async, " if _is_async(func) else ""
        reads = reward_reads_reference(func)
        kwargs = [c for c in columns if c != "prompt"]
        report.info(
            "rewards",
            f"{name} ({kind}{span}): receives prompts, completions and the columns {', '.join(kwargs) or '(none)'} as "
            f"keyword lists{'' if reads else '; reads no reference'}",
        )
        if reward_needs_chat(func) and rows and isinstance(rows[0].get("prompt"), str):
            report.error(
                "rewards",
                f"TRL's {name} read(s) chat completions (`completion[0]['content']`), and the prompts are plain text, "
                "so the completions will be too. Use chat prompts ({fix}, a model with a chat template), or this "
                "library's rewards, which read both (`math_verify_01` for accuracy_reward, `format` for a format "
                "check).",
                fixes=[Fix("chat_prompts", True, api="chat-message prompts")],
            )
            continue
        own = is_own_reward(func)
        if call is not None and not _call_reward(report, name, func, call):
            continue
        if not own and call is None:
            report.info("rewards", "  not called (your code: `cegppo check --call_rewards` calls it on real rows)")
            continue
        if reference_completion(func, "0") is None:
            if reads is not False:
                report.info("rewards", f"  the reference test does not apply: {name} does not say how a completion "
                            "stating the reference looks (define `reference_completion(solution)` on it)")  # fmt: skip
            continue
        _score_references(report, name, func, rows, value_range)


def _is_async(func: Any) -> bool:
    import inspect

    return inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__)


def _missing_reference(report: Report, name: str, columns: Sequence[str]) -> None:
    columns = [c for c in columns if c not in TRAINER_KWARGS]
    likely = likely_reference_column(columns)
    top = (likely or "<column>").split(".")[0]
    api = (
        f"give the trainer a dataset whose `{REFERENCE_COLUMN}` column holds the reference answer, e.g. "
        f"`train_dataset = train_dataset.rename_column({top!r}, {REFERENCE_COLUMN!r})`"
        + (" (a nested field: `.map(lambda row: {'solution': row['reward_model']['ground_truth']})`)"
           if likely and "." in likely else "")
    )  # fmt: skip
    report.error(
        "rewards",
        f"Reward `{name}` compares each completion with a reference answer, passed as the `{REFERENCE_COLUMN}` "
        f"column, and the data has none (its columns: {', '.join(columns) or 'none'}). Name the column that holds "
        "the reference: {fix}. Without a reference, use a reference-free reward such as `format`.",
        fixes=[Fix("solution_column", likely or "<column>", api=api)],
    )


# What a made-up completion says when a reward has no reference form: a plain sentence with a number.
MADE_UP_COMPLETION = "Let me think step by step. The answer is 42."


def rollout_rows(dataset: Any, args: Any) -> list[dict]:
    """A rollout batch as TRL draws it: `generation_batch_size / num_generations` real rows, each `num_generations`
    times (for `cegppo check --call_rewards`)."""
    size = args.generation_batch_size or args.per_device_train_batch_size * args.world_size * args.steps_per_generation
    rows = sample_rows(dataset, max(1, size // args.num_generations))
    return [row for row in rows for _ in range(args.num_generations)]


def _call_reward(report: Report, name: str, func: Callable, rows: list[dict]) -> bool:
    """The opt-in call: `func` on a rollout batch of real rows, as TRL calls it (a made-up completion, or the
    reference where the reward says how one looks). Whatever would fail or train on nothing is an error."""
    import asyncio

    from transformers import TrainerState

    completions = []
    for row in rows:
        solution = row.get(REFERENCE_COLUMN)
        text = reference_completion(func, solution) if solution is not None else None
        text = MADE_UP_COMPLETION if text is None else text
        completions.append([{"role": "assistant", "content": text}] if isinstance(row.get("prompt"), list) else text)
    extra = {k: [row.get(k) for row in rows] for k in rows[0] if k not in ("prompt", "completion", *TRAINER_KWARGS)}
    trainer = dict(completion_ids=[[0]] * len(rows), trainer_state=TrainerState(), log_extra=lambda *a, **k: None,
                   log_metric=lambda *a, **k: None)  # fmt: skip
    where = f"called (`--call_rewards`) on a rollout batch of {len(rows)} completions of real rows"
    try:
        scores = func(prompts=[row.get("prompt") for row in rows], completions=completions, **trainer, **extra)
        if asyncio.iscoroutine(scores):  # TRL awaits async rewards
            scores = asyncio.run(scores)
        values = [None if s is None else float(s) for s in scores]
    except Exception as error:
        report.error("rewards", f"Reward `{name}`, {where}, failed: {type(error).__name__}: {error}")
        return False
    problem = None
    if len(values) != len(rows):
        problem = (
            f"returned {len(values)} value(s) for {len(rows)} completions (a reward returns one float or None each)"
        )
    elif any(v is not None and math.isinf(v) for v in values):
        problem = "returned an infinite score: the group's advantages would be NaN"
    elif all(v is None or math.isnan(v) for v in values):
        problem = "returned no score (None or NaN) for any completion: nothing would train"
    if problem:
        report.error("rewards", f"Reward `{name}`, {where}, {problem} ({short_repr(list(scores))}).")
        return False
    report.info("rewards", f"  {where}: {short_repr(values)}")
    return True


def _score_references(report, name, func, rows, value_range) -> None:
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
        report.info("rewards", f"  row {i}: solution={short_repr(solution)} -> the reference scores {score} ({mark})")
        if not ok:
            failures.append((i, solution, score))
    if failures:
        i, solution, score = failures[0]
        report.error(
            "rewards",
            f"Reward `{name}` gives the reference answer itself (row {i}: solution={short_repr(solution)}) the score "
            f"{score}, not its top score {value_range[1]:g} ({len(failures)} of {len(rows)} rows checked): the "
            "reference column does not hold what this reward reads, or the reward does not fit this data, and every "
            "completion would be scored wrong. Check {fix} and the reward.",
            fixes=[Fix("solution_column", api="the `solution` column of the dataset")],
        )


def inspect_reward_weights(report: Report, args: Any) -> None:
    """A weight that is not finite makes every reward NaN: no run learns (TRL checks their count itself)."""
    weights = getattr(args, "reward_weights", None)
    if weights is not None and not all(math.isfinite(float(w)) for w in weights):
        finite = [w if math.isfinite(float(w)) else 1.0 for w in weights]
        report.error(
            "rewards",
            f"`reward_weights` {list(weights)} holds a value that is not finite: every reward would be NaN (loss 0, "
            "no gradient, for the whole run). Give finite weights, e.g. {fix}.",
            fixes=[Fix("reward_weights", finite)],
        )


def inspect_batch_layout(report: Report, args: Any, world_size: int) -> None:
    """Rollout batch, groups, optimizer steps per rollout batch, on- or off-policy, the divisibility rules."""
    from .config import CEGPPO_LOSS_TYPES, is_on_policy, on_policy_message

    per_device, spg, ga = args.per_device_train_batch_size, args.steps_per_generation, args.gradient_accumulation_steps
    for name, value in (("per_device_train_batch_size", per_device), ("gradient_accumulation_steps", ga),
                        ("steps_per_generation", spg), ("num_iterations", args.num_iterations)):  # fmt: skip
        if value is None or value < 1:
            report.error(
                "batch",
                f"`{name}={value}`: must be at least 1 (the trainer would fail after the model loads). Use e.g. {{fix}}.",
                fixes=[Fix(name, 1)],
            )
    if report.errors and any(f.section == "batch" for f in report.errors):
        return
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


def inspect_schedules(report: Report, args: Any) -> None:
    """Each β schedule (`CEGPPOConfig` has refused a malformed one, or one whose window `max_steps` leaves empty)."""
    for beta in ("gppo_beta1", "gppo_beta2"):
        if spec := getattr(args, f"{beta}_schedule", None):
            report.info("schedules", f"{beta}_schedule: {spec}")


def inspect_engine(report: Report, args: Any) -> None:
    """The engine the launch will really run (`distributed`), its mixed precision, and how completions are made."""
    from transformers import GenerationConfig

    from .distributed import check_distributed_engine

    try:
        engine = check_distributed_engine(args)
    except RuntimeError as error:
        report.error("engine", str(error), RuntimeError)
        return
    report.engine = engine
    if engine is None and args.world_size == 1:
        report.info("engine", f"one process on {args.device.type}")
    else:
        report.info("engine", f"{engine or 'DDP'} on {args.device.type}, {args.world_size} processes")
    # transformers takes the launch's mixed precision (ACCELERATE_MIXED_PRECISION, from the accelerate config) when
    # the config sets neither bf16 nor fp16: a GPU launch config on a float32 recipe trains under autocast, silently.
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if not (args.bf16 or args.fp16) and launched in ("bf16", "fp16"):
        report.warning(
            "engine",
            f"The launch asks for {launched} mixed precision (ACCELERATE_MIXED_PRECISION={launched}: "
            f"`mixed_precision: {launched}` in the accelerate config) and the training config for none (`bf16` and "
            f"`fp16` false): transformers follows the launch, so this run trains under {launched} autocast. To train "
            f"in float32 set `mixed_precision: 'no'` in the accelerate config (or launch with `--mixed_precision no`); "
            "to mean it, {fix}.",
            code="mixed_precision",
            fixes=[Fix(launched, True)],
        )
    # transformers' own validation of what TRL builds at init (e.g. `max_new_tokens` must be > 0), without the model
    try:
        GenerationConfig(max_new_tokens=args.max_completion_length)
    except ValueError as error:
        report.error(
            "engine", f"`max_completion_length={args.max_completion_length}` (TRL's `max_new_tokens`): {error}"
        )
    generation = f"vLLM ({args.vllm_mode})" if args.use_vllm else "the training model (transformers `generate`)"
    report.info("engine", f"generation: {generation}, up to {args.max_completion_length} tokens a completion")


def inspect_extras(report: Report, args: Any, *, quantized: bool = False) -> None:
    """Packages the settings need: TRL and transformers refuse a missing one only after the model loads; here it is
    refused before, with their exception types (ImportError; a tracker's own callback raises RuntimeError)."""
    from transformers.integrations import get_reporting_integration_callbacks

    from .distributed import _flag

    deepspeed = bool(getattr(args, "deepspeed", None) or _flag(os.environ, "ACCELERATE_USE_DEEPSPEED"))
    for wanted, module, why, line in (
        (args.use_vllm, "vllm", "`use_vllm=True`", 'pip install "cegppo-trl[vllm]"'),
        (getattr(args, "use_liger_kernel", False), "liger_kernel", "`use_liger_kernel=True`", "pip install liger-kernel"),
        (quantized, "bitsandbytes", "4-/8-bit loading", 'pip install "cegppo-trl[quant]"'),
        (deepspeed, "deepspeed", "a DeepSpeed launch", 'pip install "cegppo-trl[deepspeed]"'),
    ):  # fmt: skip
        if not wanted:
            continue
        report.info("extras", f"{module}: {'installed' if _installed(module) else 'NOT installed'} ({why})")
        if not _installed(module):
            report.error("extras", f"{why} needs `{module}`, which is not installed: `{line}`.", ImportError)
    # Each tracker's callback checks its package when built (transformers builds them at `Trainer.__init__`)
    for callback in report.collect("extras", get_reporting_integration_callbacks, args.report_to) or []:
        if report.collect("extras", callback) is not None:
            report.info("extras", f"report_to: {callback.__name__} ready")
    if "extras" not in report.lines and not any(f.section == "extras" for f in report.findings):
        report.info("extras", "none needed by these settings")


def inspect_hub(report: Report, args: Any) -> None:
    """`push_to_hub`: the trainer creates the Hub repository when it is built, after the model loads; offline or
    without a token that fails (huggingface_hub's `OfflineModeIsEnabled`, an `OSError`). The command line's check
    (the API may be given a Hub client of its own)."""
    from huggingface_hub import get_token
    from huggingface_hub.errors import OfflineModeIsEnabled

    from .data import _hub_offline

    if not getattr(args, "push_to_hub", False):
        return
    if _hub_offline():
        why, kind = "HF_HUB_OFFLINE=1 is set", OfflineModeIsEnabled
    elif not (getattr(args, "hub_token", None) or get_token()):
        why, kind = "no Hugging Face token is set (`hf auth login`, or HF_TOKEN)", OSError
    else:
        report.info("extras", f"push_to_hub: to {args.hub_model_id or os.path.basename(args.output_dir)}")
        return
    report.error(
        "extras",
        f"`push_to_hub=True` but {why}: the trainer creates the Hub repository when it starts, which fails without "
        "the Hub, after the model loads. Log in (or unset HF_HUB_OFFLINE), or train without it: {fix}.",
        kind,
        fixes=[Fix("push_to_hub", False)],
    )


def inspect_output_dir(report: Report, args: Any) -> None:
    """Fresh, holds checkpoints, or a file (an error: the trainer writes into it)."""
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

    names = [os.path.basename(folder) for folder in checkpoint_folders(path)]
    shown = f"holds checkpoints ({', '.join(names[-3:])}{', ...' if len(names) > 3 else ''})" if names else None
    report.info(
        "output_dir", f"{path}: {shown or 'exists, no checkpoints' + ('' if os.listdir(path) else ' (empty)')}"
    )


def inspect_resume(report: Report, args: Any, overwrite: bool = False) -> None:
    """The resume `cegppo train` will plan (`checkpoints.plan_resume`, without its lock or deletions): what it
    refuses (a torn or `save_only_model` folder, another run's checkpoints in `output_dir`) is refused here; a path
    that is not there is refused in transformers' words. The command line only: the API is told the resume at
    `train()`."""
    from .checkpoints import plan_resume, refusal

    if args.output_dir is None or os.path.isfile(args.output_dir):
        return
    planned = report.collect("output_dir", plan_resume, args.output_dir, args.resume_from_checkpoint, args)
    if planned is None:
        return
    plan, blocking = planned
    if (missing := missing_checkpoint(plan.checkpoint)) is not None:
        report.error("output_dir", missing)
        return
    if blocking and not overwrite:
        report.error("output_dir", refusal(plan, blocking, args.output_dir), fixes=[Fix("overwrite_output_dir", True)])
    elif plan.checkpoint is not None:
        report.info("output_dir", f"resumes {plan.checkpoint}" + (" (nothing left to train)" if plan.finished else ""))
    else:
        for message in plan.messages:  # `last` with no checkpoint yet: the fresh start's notice
            report.info("output_dir", message)


def missing_checkpoint(checkpoint: str | None) -> str | None:
    """transformers' refusal (a `ValueError`, after the model loads) of a resume path that is not a folder."""
    if checkpoint is not None and not os.path.isdir(checkpoint):
        return f"Can't find a valid checkpoint at {checkpoint}"
    return None


def inspect_model(report: Report, model: Any, args: Any, field: str = "model") -> None:
    """A path or Hub id: there, with weights (`data.check_model_path`), and its architecture from the config (no
    weights read); an instance: its class and size."""
    if not isinstance(model, str):
        params = sum(p.numel() for p in model.parameters())
        report.info("model", f"{type(model).__name__}: {params:,} parameters")
        return
    errors = len(report.errors)
    report.collect("model", check_model_path, model, field)
    if len(report.errors) > errors:
        return
    from transformers import AutoConfig

    init = args.model_init_kwargs or {}
    try:
        config = AutoConfig.from_pretrained(
            model, revision=init.get("revision"), trust_remote_code=args.trust_remote_code
        )
    except Exception as error:  # the model load fails on the same: its exception type and words
        report.error(
            "model",
            f"Cannot read the config of `{model}`: {error}",
            type(error) if isinstance(error, OSError) else OSError,
        )
        return
    report.info("model", f"{model}: {', '.join(getattr(config, 'architectures', None) or [config.model_type])}")


def inspect_trl(report: Report, args: Any) -> None:
    """The installed TRL against the tested releases (`trl_compat`): the trainer refuses the same before loading."""
    from .trl_compat import check_trl_compatibility

    report.collect("engine", check_trl_compatibility, args)


def run_checks(
    train_dataset: Any,
    reward_funcs: Any,
    args: CEGPPOConfig,
    *,
    eval_dataset: Any = None,
    reward_names: Sequence[str] | None = None,
    model: Any = None,
    processing_class: Any = None,
    quantized: bool = False,
    environments: bool = False,
    engine: bool = True,
    call_rewards: bool = False,
    report: Report | None = None,
) -> Report:
    """The checks of what the trainer is given, shared by `cegppo check`, `cegppo train` and `CEGPPOTrainer`.

    `train_dataset` / `eval_dataset` as the trainer sees them; `reward_funcs` as TRL takes them (`reward_names` for
    the messages); `model` a path or Hub id (there, with weights, its config read) or an instance; a
    `processing_class` renders the sample prompts; `quantized`: 4-/8-bit loading; `environments`: an
    `environment_factory` is given (no `prompt` column needed); `engine`: check TRL and the launch (the command line
    does it first); `call_rewards`: `cegppo check --call_rewards`; `report`: one to add to. Returns the report
    (`report.raise_errors()` raises its errors).
    """
    report = Report() if report is None else report
    funcs = list(reward_funcs) if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    funcs = [f for f in funcs if f is not None]
    names = list(reward_names) if reward_names is not None else [_reward_name(f) for f in funcs]
    if engine:  # first: a launch that would run the wrong engine, or a refused TRL, is wrong whatever else
        inspect_trl(report, args)
        inspect_engine(report, args)
    if model is not None:
        inspect_model(report, model, args)
    for split, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        if dataset is None or isinstance(dataset, dict):  # a dict of eval datasets: TRL checks each itself
            continue
        errors_before = len(report.errors)
        rows = inspect_dataset(report, dataset, name=split, environments=environments)
        if len(report.errors) > errors_before or not rows:
            continue
        if split == "train_dataset" and processing_class is not None and "prompt" in rows[0]:
            render_prompts(report, rows, processing_class, args)
        columns = dataset.column_names if dataset.column_names is not None else list(rows[0])
        if split == "train_dataset":
            call = rollout_rows(dataset, args) if call_rewards else None
            inspect_rewards(report, funcs, names, rows, columns, call)
        else:  # the rewards score the evaluation rollouts too: the columns they need must be there
            sub = Report()
            inspect_rewards(sub, funcs, names, rows, columns)
            report.findings.extend(f for f in sub.errors if f.message not in {g.message for g in report.errors})
    inspect_reward_weights(report, args)
    inspect_batch_layout(report, args, args.world_size)
    inspect_schedules(report, args)
    inspect_extras(report, args, quantized=quantized)
    inspect_output_dir(report, args)
    return report


# ----------------------------------------------------------------------------------------------------------------
# Caller 1: the Python API
# ----------------------------------------------------------------------------------------------------------------
def trainer_checks(model: Any, reward_funcs: Any, args: CEGPPOConfig, *pargs: Any, **kwargs: Any) -> Report:
    """`run_checks` on `CEGPPOTrainer`'s arguments (those of `GRPOTrainer.__init__`); logs the warnings and raises
    the errors (fixes worded as arguments), before the model loads. The on-policy warning is left to the trainer,
    which gives it after init."""
    import inspect

    from trl import GRPOTrainer

    bound = inspect.signature(GRPOTrainer.__init__).bind(None, model, reward_funcs, args, *pargs, **kwargs).arguments
    quantized = bool((args.model_init_kwargs or {}).get("quantization_config") or bound.get("quantization_config"))
    report = run_checks(
        bound.get("train_dataset"),
        reward_funcs,
        args,
        eval_dataset=bound.get("eval_dataset"),
        model=model,
        processing_class=bound.get("processing_class"),
        quantized=quantized,
        environments=bound.get("environment_factory") is not None,
    )
    log_warnings(report)
    report.raise_errors(flags=False)
    return report


def log_warnings(report: Report, flags: bool = False) -> None:
    """Log the report's warnings (not the on-policy one: the trainer gives it after init, naming vLLM's correction)."""
    for finding in report.warnings:
        if finding.code != "on_policy":
            logger.warning(finding.text(flags))
