"""The pre-flight report of `cegppo check` and `cegppo train` (the command line only: `CEGPPOTrainer` never runs it).

`run_checks` returns a `Report`: what the run will see, section by section, and the findings, each with its fix as
data (`Fix`: the flag and the value that works). The rules, in the order the checks run:

1. Show what only a check before the model loads can tell, with the real inputs: the prompts as the model gets them,
   what each reward receives, the batch layout (on- or off-policy), the launch, the output folder.
2. Refuse only what `cegppo train` would fail on; where the host refuses, call its own validator (the optimizer, the
   generation config's warpers, `GenerationConfig`, the tracker callbacks) or raise its exception type and words.
3. No reward of yours is called: its signature says which columns it reads. The package's own rewards (and TRL's by
   name) score the reference answer. `--call_rewards` calls every reward on a rollout batch of real rows.
4. Say what was not checked (the `not_checked` section): a clean report is a verdict on what it checked only.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .data import check_model_path, sample_rows, short_repr, type_name
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

SECTIONS = {
    "model": "Model",
    "dataset": "Dataset (as the trainer sees it)",
    "prompts": "Prompts (as the model gets them)",
    "rewards": "Rewards (what each receives, read from its signature; the reference answer's score)",
    "batch": "Batch layout",
    "engine": "Engine",
    "output_dir": "Output directory",
    "not_checked": "Not checked (`cegppo train` finds these at load or at its first batches)",
}
PROMPT_ROWS_CHECKED = 100_000  # rows whose prompts are checked one by one (all up to this many)
MADE_UP_COMPLETION = "Let me think step by step. The answer is 42."  # for a reward with no reference form


@dataclass(frozen=True)
class Fix:
    """What fixes a finding: the setting and the value that works, worded as a flag (`--solution_column answer`)."""

    field: str
    value: Any = None

    def as_flag(self) -> str:
        value = self.value
        if value is None:
            return f"`--{self.field}`"
        if isinstance(value, bool):
            value = str(value).lower()
        elif isinstance(value, (list, tuple)):
            value = " ".join(map(str, value))
        return f"`--{self.field} {value}`"


@dataclass
class Finding:
    """One problem: `severity` is `"error"` or `"warning"`; `message` holds `{fix}` (`{fix1}`, ...) for its fixes."""

    severity: str
    section: str
    message: str
    exception: type[Exception] = ValueError
    code: str = ""  # a stable tag: "trainer" for a warning the trainer gives itself (`cegppo train` logs it once)
    fixes: tuple[Fix, ...] = ()

    def text(self) -> str:
        text = self.message
        for i, fix in enumerate(self.fixes):
            text = text.replace("{fix}" if i == 0 else f"{{fix{i}}}", fix.as_flag())
        return text


@dataclass
class Report:
    """What the run will see, section by section, and the findings."""

    lines: dict[str, list[str]] = field(default_factory=dict)
    findings: list[Finding] = field(default_factory=list)

    def info(self, section: str, line: str) -> None:
        self.lines.setdefault(section, []).append(line)

    def error(self, section: str, message: str, exception: type[Exception] = ValueError, code: str = "", fixes=()):
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

    def raise_errors(self, flags: bool = True) -> None:  # `flags`: the fixes are always worded as flags
        """Raise the first error's exception type, with every error's message (numbered when several)."""
        listed = "\n".join(f"  {i}. {f.text()}" for i, f in enumerate(self.errors, 1))
        if self.errors:
            one = len(self.errors) == 1
            raise self.errors[0].exception(self.errors[0].text() if one else f"{len(self.errors)} problems found "
                                           f"before loading the model:\n{listed}")  # fmt: skip

    def format(self, width: int = 100) -> str:
        """The report as text: each section's lines, then the findings, then a one-line verdict."""
        import functools
        import textwrap

        # Paths, flags and values stay whole (copy-pasteable): no break inside a word or at its hyphens.
        wrap = functools.partial(textwrap.wrap, width=width, break_long_words=False, break_on_hyphens=False)
        out = []
        for section, title in SECTIONS.items():
            if lines := self.lines.get(section):
                out.append(title)
                for line in lines:
                    out.extend(wrap(line, initial_indent="  ", subsequent_indent="      ") or [""])
                out.append("")
        for finding in self.findings:
            out.extend(
                wrap(f"{finding.severity.upper()} [{finding.section}] {finding.text()}", subsequent_indent="    ")
            )
        n_err, n_warn = len(self.errors), len(self.warnings)
        verdict = "ready to train (what is listed as not checked aside)" if not n_err else "fix the errors above"
        out.append(f"{n_err} error(s), {n_warn} warning(s): {verdict}.")
        return "\n".join(out)


# --- Data and prompts
def inspect_dataset(report: Report, dataset: Any, name: str = "train_dataset") -> list[dict]:
    """Rows, columns and types, and every prompt the trainer will read; returns a few rows."""
    from datasets import IterableDataset

    streaming = isinstance(dataset, IterableDataset)
    if not streaming and len(dataset) == 0:
        report.error("dataset", f"`{name}` is empty (0 rows): nothing to train on; check {{fix}}.",
                     fixes=[Fix("dataset_name")])  # fmt: skip
        return []
    rows = sample_rows(dataset)
    columns = dataset.column_names if dataset.column_names is not None else list(rows[0] if rows else [])
    shown = ", ".join(f"{c} ({type_name(rows[0].get(c)) if rows else '?'})" for c in columns)
    size = "streamed (length unknown)" if streaming else f"{len(dataset)} rows"
    report.info("dataset", f"{name}: {size}; columns: {shown or 'none'}")
    if "prompt" not in columns:
        likely = next((c for c in ("question", "problem", "query", "input", "text") if c in columns), "<column>")
        report.error("dataset", f"`{name}` has no `prompt` column (its columns: {', '.join(columns)}). Fix: {{fix}}.",
                     fixes=[Fix("prompt_column", likely)])  # fmt: skip
        return rows
    if streaming:
        prompts, scope = [r.get("prompt") for r in sample_rows(dataset, 64)], "the stream's first 64 rows"
    else:
        n = min(len(dataset), PROMPT_ROWS_CHECKED)
        prompts = list(dataset.select(range(n))["prompt"] if n < len(dataset) else dataset["prompt"])
        scope = f"all {n} rows" if n == len(dataset) else f"the first {n} rows"
    bad = [(i, problem) for i, p in enumerate(prompts) if (problem := prompt_problem(p)) is not None]
    if not bad:
        report.info("dataset", f"prompts: {scope} checked (none None, empty or malformed)")
        return rows
    (i, problem), more = bad[0], len(bad) - 1
    report.error(
        "dataset",
        f"`{name}` row {i}: the prompt {problem} ({f'{more} more of {scope} too' if more else f'{scope} checked'}): "
        "the tokenizer or the chat template fails on it at the first batch that draws it. Fix or drop those rows.",
    )
    return rows


def prompt_problem(prompt: Any) -> str | None:
    """What the tokenizer or the chat template would fail on in one prompt, or None. Chat messages whose content is
    empty are not refused: a template may render a header around them, and TRL trains them."""
    if prompt is None or isinstance(prompt, str):
        return "is None" if prompt is None else ("is empty" if not prompt.strip() else None)
    if not isinstance(prompt, list) or not prompt:
        return "is an empty list of messages" if isinstance(prompt, list) else f"is {type_name(prompt)}, not text"
    for j, message in enumerate(prompt):
        keys = sorted(k for k, v in message.items() if v is not None) if isinstance(message, dict) else None
        if keys is None or "role" not in keys or not isinstance(message["role"], str):  # TRL reads `role`
            what = type_name(message) if keys is None else f"with the keys {keys}"
            return f"message {j} is {what}, not a {{'role': ..., 'content': ...}} record"
    return None


def render_prompts(report: Report, rows: list[dict], processing_class: Any, args: Any) -> None:
    """Each sample prompt as the model gets it (chat template applied) and its token length."""
    tokenizer = getattr(processing_class, "tokenizer", processing_class)
    template = getattr(processing_class, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if any(isinstance(r.get("prompt"), list) for r in rows) and not template:
        report.error(
            "prompts",
            "The prompts are chat messages, but the tokenizer has no chat template (a base model). For raw text use "
            "{fix} with plain-text data, or a model with a chat template (an instruct model).",
            fixes=[Fix("chat_prompts", False)],
        )
        return
    kwargs = dict(getattr(args, "chat_template_kwargs", None) or {})
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        try:
            text = prompt if not isinstance(prompt, list) else processing_class.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True, **kwargs)  # fmt: skip
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        except Exception as error:  # TRL renders some inputs (images, tools) its own way: say so, do not refuse
            report.warning("prompts", f"Rendering the prompt of row {i} failed here ({type(error).__name__}: "
                           f"{error}); check that the chat template accepts these messages.")  # fmt: skip
            return
        report.info("prompts", f"row {i}, {n} tokens: {text!r}")
    report.info("prompts", f"completions: up to {args.max_completion_length} tokens each (`max_completion_length`)")


# --- Rewards
def _reward_name(func: Any) -> str:
    if isinstance(func, str):
        return func.split("/")[-1]
    return getattr(func, "__name__", type(func).__name__)


def is_own_reward(func: Any) -> bool:
    """This package's rewards and TRL's by name: the pre-flight may call them (no side effects, no user code)."""
    own = any(func is f for f in REWARD_FUNCS.values())
    return own or getattr(func, "__module__", "").startswith("trl.rewards")


def inspect_rewards(report: Report, funcs: Sequence[Any], names: Sequence[str], rows: list[dict],
                    columns: Sequence[str], call: list[dict] | None = None) -> None:  # fmt: skip
    """What each reward receives (read from its signature, not by calling it); the package's own rewards called on
    the reference answers of the sample `rows`; with `call` (`--call_rewards`) every reward on that rollout batch."""
    import difflib
    import inspect

    for name, func in zip(names, funcs, strict=True):
        if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):
            report.info("rewards", f"{name}: a reward model (TRL scores prompt + completion with its own tokenizer)")
            continue
        missing = [c for c in reward_required_columns(func) if c not in columns]
        if missing == [REFERENCE_COLUMN]:
            likely = likely_reference_column([c for c in columns if c not in TRAINER_KWARGS])
            report.error(
                "rewards",
                f"Reward `{name}` compares each completion with a reference answer, passed as the `solution` column, "
                f"and the data has none (its columns: {', '.join(columns)}). Name the column that holds it: {{fix}}. "
                "Without a reference, use a reference-free reward such as `format`.",
                fixes=[Fix("solution_column", likely or "<column>")],
            )
            continue
        if missing:
            close = {m: difflib.get_close_matches(m, list(columns), n=1, cutoff=0.6) for m in missing}
            hint = "".join(f" Did you mean `{c[0]}` for `{m}`?" for m, c in close.items() if c)
            report.error("rewards", f"Reward `{name}` needs the dataset column(s) {missing}, which the data lacks "
                         f"(columns: {', '.join(columns)}).{hint} Add them to the dataset.")  # fmt: skip
            continue
        value_range = reward_value_range(func)
        span = "range not declared" if value_range is None else f"scores {value_range[0]:g} to {value_range[1]:g}"
        kind = (
            "async, " if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__) else ""
        )
        given = ", ".join(c for c in columns if c != "prompt") or "(none)"
        report.info("rewards", f"{name} ({kind}{span}): receives prompts, completions and the columns {given} as "
                    f"keyword lists{'' if reward_reads_reference(func) else '; reads no reference'}")  # fmt: skip
        if reward_needs_chat(func) and rows and isinstance(rows[0].get("prompt"), str):
            report.error(
                "rewards",
                f"TRL's {name} reads chat completions (`completion[0]['content']`), and the prompts are plain text, so "
                "the completions will be too. Use chat prompts ({fix}, a model with a chat template), or this "
                "library's rewards, which read both (`math_verify_01` for accuracy_reward).",
                fixes=[Fix("chat_prompts", True)],
            )
        elif call is not None or is_own_reward(func):  # else the `not_checked` section says so
            _call_reward(report, name, func, rows if call is None else call, value_range, call is not None)


def rollout_rows(dataset: Any, args: Any) -> list[dict]:
    """A rollout batch as TRL draws it: `generation_batch_size / num_generations` rows, each `num_generations` times."""
    size = args.generation_batch_size or args.per_device_train_batch_size * args.world_size * args.steps_per_generation
    return [
        row for row in sample_rows(dataset, max(1, size // args.num_generations)) for _ in range(args.num_generations)
    ]


def _call_reward(report: Report, name: str, func: Callable, rows: list[dict], value_range, asked: bool) -> None:
    """`func` called as TRL calls it on `rows`, each completion the row's reference answer where the reward says how
    one looks (a made-up one otherwise). What TRL fails on (an exception, the wrong number of scores) is an error, as
    is no score at all (`cegppo train` exits 4) and a reference answer without the top score (the column or the
    reward is wrong); an infinite score is the warning `cegppo train` gives at its first batch."""
    import asyncio

    from transformers import TrainerState

    texts = [reference_completion(func, row.get(REFERENCE_COLUMN) or "") for row in rows]
    completions = [
        [{"role": "assistant", "content": t or MADE_UP_COMPLETION}] if isinstance(r.get("prompt"), list) else t
        or MADE_UP_COMPLETION for r, t in zip(rows, texts, strict=True)
    ]  # fmt: skip
    extra = {k: [row.get(k) for row in rows] for k in rows[0] if k not in ("prompt", "completion", *TRAINER_KWARGS)}
    trainer = dict(completion_ids=[[0]] * len(rows), trainer_state=TrainerState(), log_extra=lambda *a, **k: None,
                   log_metric=lambda *a, **k: None)  # fmt: skip
    where = f"called{' (`--call_rewards`)' if asked else ''} on {len(rows)} completions of real rows"
    try:
        scores = func(prompts=[row.get("prompt") for row in rows], completions=completions, **trainer, **extra)
        scores = asyncio.run(scores) if asyncio.iscoroutine(scores) else scores  # TRL awaits async rewards
        values = [None if s is None else float(s) for s in scores]
    except Exception as error:
        report.error("rewards", f"Reward `{name}`, {where}, failed: {type(error).__name__}: {error}")
        return
    top = value_range[1] if value_range is not None and all(t is not None for t in texts) else None
    wrong = [i for i, v in enumerate(values) if top is not None and (v is None or abs(v - top) > 1e-6)]
    if len(values) != len(rows):
        problem = f"returned {len(values)} value(s) for {len(rows)} completions (one float or None each)"
    elif all(v is None or math.isnan(v) for v in values):
        problem = "returned no score (None or NaN) for any completion: nothing would train (`cegppo train` exits 4)"
    elif wrong:
        i = wrong[0]
        report.error(
            "rewards",
            f"Reward `{name}` gives the reference answer itself (row {i}: solution="
            f"{short_repr(rows[i].get(REFERENCE_COLUMN))}) the score {values[i]}, not its top score {top:g}: the "
            "reference column does not hold what this reward reads, or the reward does not fit this data. Check "
            "{fix} and the reward.",
            fixes=[Fix("solution_column")],
        )
        return
    else:
        problem = None
    if problem:
        report.error("rewards", f"Reward `{name}`, {where}, {problem} ({short_repr(list(scores))}).")
        return
    if any(v is not None and math.isinf(v) for v in values):
        report.warning("rewards", f"Reward `{name}`, {where}, returned an infinite score ({short_repr(values)}): TRL "
                       "sets that group's advantages to 0, so it trains on nothing; `cegppo train` warns the same.")  # fmt: skip
    scored = "the reference answers score the top score" if top is not None else "scores"
    report.info("rewards", f"  {where}: {scored} {short_repr(values)}")


def inspect_reward_weights(report: Report, args: Any, num_rewards: int) -> None:
    """TRL's count rule (its words, after the model loads) and finite weights (else every reward is NaN)."""
    weights = getattr(args, "reward_weights", None)
    if weights is None:
        return
    if len(weights) != num_rewards:
        report.error("rewards", f"Number of reward weights ({len(weights)}) must match number of reward functions "
                     f"({num_rewards}): give one weight per `--reward_funcs` entry, e.g. {{fix}}.",
                     fixes=[Fix("reward_weights", [1.0] * num_rewards)])  # fmt: skip
    elif not all(math.isfinite(float(w)) for w in weights):
        finite = [w if math.isfinite(float(w)) else 1.0 for w in weights]
        report.error("rewards", f"`reward_weights` {list(weights)} holds a value that is not finite: every reward "
                     "would be NaN (no gradient for the whole run). Give finite weights, e.g. {fix}.",
                     fixes=[Fix("reward_weights", finite)])  # fmt: skip


# --- The run's settings: batch layout, optimizer, generation, engine, extras
def inspect_batch_layout(report: Report, args: Any, world_size: int) -> None:
    """Rollout batch, groups, optimizer steps per rollout batch, on- or off-policy."""
    from .config import CEGPPO_LOSS_TYPES, is_on_policy, on_policy_message, vanishing_term_messages

    per_device, spg, ga = args.per_device_train_batch_size, args.steps_per_generation, args.gradient_accumulation_steps
    sizes = dict(per_device_train_batch_size=per_device, gradient_accumulation_steps=ga, steps_per_generation=spg,
                 num_iterations=args.num_iterations)  # fmt: skip
    if below := [name for name, value in sizes.items() if value is None or value < 1]:
        report.error("batch", f"`{below[0]}={sizes[below[0]]}`: must be at least 1 (the trainer fails after the model "
                     "loads). Use e.g. {fix}.", fixes=[Fix(below[0], 1)])  # fmt: skip
        return
    rollout = args.generation_batch_size or per_device * world_size * spg
    steps = spg * args.num_iterations / ga
    report.info("batch", f"rollout batch: {rollout} completions = {rollout // args.num_generations} prompt(s) x "
                f"{args.num_generations} generations ({per_device} per device x {world_size} process(es) x {spg} "
                "steps_per_generation)")  # fmt: skip
    report.info("batch", f"optimizer steps per rollout batch: {steps:g} (steps_per_generation {spg} x num_iterations "
                f"{args.num_iterations} / gradient_accumulation_steps {ga})")  # fmt: skip
    if spg % ga:
        report.warning("batch", f"`steps_per_generation={spg}` is not a multiple of `gradient_accumulation_steps={ga}`:"
                       " optimizer steps straddle two rollout batches. Set `steps_per_generation` to a multiple of "
                       f"{ga}.", code="divisibility")  # fmt: skip
    if args.loss_type not in CEGPPO_LOSS_TYPES:
        report.info("batch", f"loss_type={args.loss_type}: TRL's objective, unchanged (a baseline)")
    elif is_on_policy(args):
        report.info("batch", "on-policy: the ratio is 1 at every step, so CE-GPPO is identical to GRPO")
        report.warning("batch", on_policy_message(args), code="trainer")  # the trainer gives it too
    else:
        report.info("batch", "off-policy after the first optimizer step of each rollout batch: CE-GPPO acts")
    for message in vanishing_term_messages(args):
        report.warning("batch", message, code="trainer")


def inspect_optimizer(report: Report, args: Any) -> None:
    """The optimizer as transformers builds it (`Trainer.get_optimizer_cls_and_kwargs`), on one dummy parameter: its
    own refusal (`Invalid learning rate: -1`) comes here instead of after the model loads."""
    import torch
    from transformers import Trainer

    try:
        cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(args)
        cls([torch.nn.Parameter(torch.zeros(1))], **kwargs)
    except ValueError as error:  # the fix: the setting the host's words name
        fix = "learning_rate" if "learning rate" in str(error) else "optim_args"
        report.error("engine", f"The optimizer ({args.optim}, built after the model loads): {error}. Fix {{fix}}.",
                     fixes=[Fix(fix)])  # fmt: skip
    except Exception as error:  # an optimizer that needs the model or a package: it is built at train()
        report.info("not_checked", f"optimizer {args.optim}: not built here ({type(error).__name__})")
    else:
        report.info("engine", f"optimizer: {cls.__name__}, learning rate {args.learning_rate:g}")


def inspect_generation(report: Report, args: Any) -> None:
    """TRL's sampling settings through transformers' own validators: `GenerationConfig` (e.g. `max_new_tokens > 0`)
    and the logits warpers `generate` builds at the first batch (e.g. a temperature > 0)."""
    from transformers import GenerationConfig
    from transformers.generation import logits_process as lp

    if args.use_vllm:
        report.info("engine", f"generation: vLLM ({args.vllm_mode}), up to {args.max_completion_length} tokens")
        return
    warpers = [("temperature", lp.TemperatureLogitsWarper, args.temperature != 1.0),
               ("top_k", lp.TopKLogitsWarper, bool(args.top_k)), ("top_p", lp.TopPLogitsWarper, args.top_p < 1.0),
               ("min_p", lp.MinPLogitsWarper, args.min_p is not None),
               ("repetition_penalty", lp.RepetitionPenaltyLogitsProcessor, args.repetition_penalty != 1.0)]  # fmt: skip
    name = "max_completion_length"
    try:
        GenerationConfig(max_new_tokens=args.max_completion_length)
        for name, warper, used in warpers:
            if used:
                warper(getattr(args, name))
    except ValueError as error:
        report.error("engine", f"`{name}={getattr(args, name)}`: {error} (transformers refuses it at the first "
                     "generation). Fix {fix}.", fixes=[Fix(name)])  # fmt: skip
        return
    report.info("engine", f"generation: transformers `generate`, up to {args.max_completion_length} tokens a "
                f"completion, temperature {args.temperature:g}")  # fmt: skip


def inspect_engine(report: Report, args: Any) -> None:
    """The installed TRL, the engine the launch will really run (`distributed`) and its mixed precision."""
    from .distributed import check_distributed_engine
    from .trl_compat import check_trl_compatibility

    report.collect("engine", check_trl_compatibility, args)
    try:
        engine = check_distributed_engine(args)
    except RuntimeError as error:
        report.error("engine", str(error), RuntimeError)
        return
    where = f"{engine or 'DDP'} on {args.device.type}, {args.world_size} processes"
    report.info("engine", f"one process on {args.device.type}" if engine is None and args.world_size == 1 else where)
    # transformers takes the launch's mixed precision when the config sets neither bf16 nor fp16
    launched = os.environ.get("ACCELERATE_MIXED_PRECISION", "no").strip().lower()
    if not (args.bf16 or args.fp16) and launched in ("bf16", "fp16"):
        report.warning(
            "engine",
            f"The launch asks for {launched} mixed precision (ACCELERATE_MIXED_PRECISION={launched}: `mixed_precision:"
            f" {launched}` in the accelerate config) and the training config for none: transformers follows the "
            f"launch, so this run trains under {launched} autocast. To train in float32 set `mixed_precision: 'no'` "
            "in the accelerate config; to mean it, {fix}.",
            code="mixed_precision",
            fixes=[Fix(launched, True)],
        )


# --- Model and output directory
def inspect_model(report: Report, model: str, args: Any, dtype: Any = None) -> None:
    """A path or Hub id: there, with a weights file (`data.check_model_path`); its architecture from its config; and
    on CPU, weights in a half precision this CPU has no instructions for (every matmul emulated: a warning)."""
    from transformers import AutoConfig

    errors = len(report.errors)
    report.collect("model", check_model_path, model)
    if len(report.errors) > errors:
        return
    try:
        init = args.model_init_kwargs or {}
        config = AutoConfig.from_pretrained(
            model, revision=init.get("revision"), trust_remote_code=args.trust_remote_code
        )
    except Exception as error:  # the model load fails on the same: its exception type and words
        report.error("model", f"Cannot read the config of `{model}`: {error}", type(error))
        return
    report.info("model", f"{model}: {', '.join(getattr(config, 'architectures', None) or [config.model_type])}")
    dtype = init.get("dtype", dtype)
    name = str(getattr(config, "dtype", None) if dtype == "auto" else dtype).removeprefix("torch.")
    if args.device.type == "cpu" and name in ("bfloat16", "float16") and not cpu_computes_natively(name):
        report.warning("model", f"The weights load as {name} (`dtype: {dtype}`) on a CPU without {name} instructions, "
                       "so every matmul is emulated (measured 1.7-2.5 times slower than float32). Pass {fix}.",
                       code="cpu_dtype", fixes=[Fix("dtype", "float32")])  # fmt: skip


def cpu_computes_natively(dtype: str) -> bool:
    """Whether this CPU has instructions for `dtype` ("bfloat16" or "float16"), as PyTorch's oneDNN kernels see it
    (without them half-precision matmuls are emulated, slower than float32: `benchmarks/bench_cpu_dtype.py`)."""
    import torch

    probe = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):  # a private probe: assume the slow path if this build lacks it
        return False


def inspect_output_dir(report: Report, args: Any, overwrite: bool = False, plan: bool = True) -> None:
    """Fresh, holds checkpoints, or a file; and (`plan`) the checkpoint `cegppo train` will resume
    (`checkpoints.resolve`): what the trainer refuses is refused here."""
    from .checkpoints import checkpoint_folders, other_runs, refusal, resolve

    path = args.output_dir
    if os.path.isfile(path):
        report.error("output_dir", f"`output_dir` {path} is a file, not a directory: the trainer writes checkpoints "
                     "and the model into it. Pick another `output_dir`.", FileExistsError)  # fmt: skip
        return
    names = [os.path.basename(f) for f in checkpoint_folders(path)] if os.path.isdir(path) else []
    state = "fresh (will be created)" if not os.path.isdir(path) else "exists, no checkpoints"
    report.info("output_dir", f"{path}: " + (f"holds checkpoints ({', '.join(names[-3:])})" if names else state))
    planned = report.collect("output_dir", resolve, path, args.resume_from_checkpoint) if plan else None
    if planned is None:
        return
    checkpoint, messages = planned
    if (missing := missing_checkpoint(checkpoint)) is not None:
        report.error("output_dir", missing)
    elif checkpoint is None and (others := other_runs(path, set())) and not overwrite:
        report.error("output_dir", refusal(path, others), fixes=[Fix("overwrite_output_dir", True)])
    elif checkpoint is not None:
        report.info("output_dir", f"resumes {checkpoint}")
    else:
        for message in messages:  # `last` with no checkpoint yet: the fresh start's notice
            report.info("output_dir", message)


def missing_checkpoint(checkpoint: str | None) -> str | None:
    """transformers' refusal (a `ValueError`, after the model loads) of a resume path that is not a folder."""
    return f"Can't find a valid checkpoint at {checkpoint}" if checkpoint and not os.path.isdir(checkpoint) else None


# --- The report
def run_checks(train_dataset: Any, reward_funcs: Sequence[Any], args: Any, *, eval_dataset: Any = None,
               reward_names: Sequence[str] | None = None, processing_class: Any = None, call_rewards: bool = False,
               report: Report | None = None) -> Report:  # fmt: skip
    """The checks of what `cegppo train` hands the trainer (datasets as the trainer sees them, rewards, config,
    tokenizer); `call_rewards`: `--call_rewards`. From Python, `run_checks(...).format()` prints the same report."""
    report = Report() if report is None else report
    funcs = [f for f in reward_funcs if f is not None]
    names = list(reward_names) if reward_names is not None else [_reward_name(f) for f in funcs]
    for split, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
        errors = len(report.errors)
        rows = [] if dataset is None or isinstance(dataset, dict) else inspect_dataset(report, dataset, name=split)
        if len(report.errors) > errors or not rows:
            continue
        if split == "train_dataset" and processing_class is not None:
            render_prompts(report, rows, processing_class, args)
        call = rollout_rows(dataset, args) if call_rewards and split == "train_dataset" else None
        columns = dataset.column_names if dataset.column_names is not None else list(rows[0])
        inspect_rewards(sub := Report(), funcs, names, rows, columns, call)  # evaluation rollouts are scored too
        seen = {f.message for f in report.findings}
        report.findings += [
            f for f in sub.findings if (split == "train_dataset" or f.severity == "error") and f.message not in seen
        ]
        for line in sub.lines.get("rewards", []) if split == "train_dataset" else []:
            report.info("rewards", line)
    inspect_reward_weights(report, args, len(funcs))
    inspect_batch_layout(report, args, args.world_size)
    inspect_optimizer(report, args)
    inspect_generation(report, args)
    yours = [n for n, f in zip(names, funcs, strict=True) if callable(f) and not is_own_reward(f)]
    if yours and not call_rewards:
        report.info("not_checked", f"rewards of yours ({', '.join(yours)}): not called (`--call_rewards` calls them on "
                    "a rollout batch of real rows: a reward that raises or scores nothing is found there)")  # fmt: skip
    report.info("not_checked", "the model's weights: not read (a truncated or corrupt weights file fails at load)")
    report.info("not_checked", "optional packages (vLLM, Liger, bitsandbytes, DeepSpeed), trackers and the Hub: "
                "TRL and transformers check them when the trainer is built, in their words")  # fmt: skip
    return report
