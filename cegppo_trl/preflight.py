"""The plan `cegppo check` prints and `cegppo train` runs before the model loads (`CEGPPOTrainer` never runs it):
what only a plan can show, and refusals of what would train on nothing; what TRL, transformers, torch or accelerate
refuse is left to them. Rewards of yours are called only with `--call_rewards`."""

from __future__ import annotations

import asyncio
import difflib
import inspect
import itertools
import math
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from .rewards import (
    REFERENCE_COLUMN,
    REWARD_FUNCS,
    TRAINER_KWARGS,
    TRL_REWARD_FUNCS,
    GSM8KReward,
    MathVerifyReward,
    extract_gsm8k_gold,
    from_trl,
    missing_reference_message,
    reward_value_range,
)

SECTIONS = {
    "model": "Model",
    "dataset": "Dataset (as the trainer sees it)",
    "prompts": "Prompts (as the model gets them)",
    "rewards": "Rewards (the columns each reads; the reference answer's score)",
    "batch": "Batch layout",
    "output_dir": "Output directory",
    "not_checked": "Not checked (TRL, transformers and torch check these when the trainer is built or trains)",
}
MADE_UP_COMPLETION = "Let me think step by step. The answer is 42."  # for a reward with no reference form
_LIKELY = {
    "prompt_column": ("question", "problem", "query", "instruction", "input", "messages", "text"),
    "solution_column": ("answer", "ground_truth", "reward_model", "final_answer", "reference", "target", "label"),
}
WEIGHTS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".pth")


class CEGPPOUsageError(ValueError):
    """A setting or input `cegppo train` refuses before the model loads: one line, exit status 2."""


class Finding(NamedTuple):
    """One problem: `severity` "error" or "warning"; `code` "trainer" marks a warning the trainer gives too."""

    severity: str
    section: str
    message: str
    code: str = ""


class Report:
    """What the run will see (`lines`, by section) and the findings."""

    def __init__(self) -> None:
        self.lines: dict[str, list[str]] = {}
        self.findings: list[Finding] = []

    def info(self, section: str, line: str) -> None:
        self.lines.setdefault(section, []).append(line)

    def error(self, section: str, message: str) -> None:
        self.findings.append(Finding("error", section, message))

    def warning(self, section: str, message: str, code: str = "") -> None:
        self.findings.append(Finding("warning", section, message, code))

    def collect(self, section: str, check: Callable, *args: Any, **kwargs: Any) -> Any:
        """`check(*args, **kwargs)`, or None with what it raised recorded as an error."""
        try:
            return check(*args, **kwargs)
        except (ValueError, RuntimeError, ImportError, OSError, TypeError) as error:
            return self.error(section, str(error))

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def raise_errors(self) -> None:
        if self.errors:
            raise CEGPPOUsageError("\n".join(f.message for f in self.errors))

    def format(self) -> str:
        """Each section's lines, the findings, and a one-line verdict."""
        out = [f"{title}\n" + "".join(f"  {line}\n" for line in self.lines[s]) for s, title in SECTIONS.items()
               if s in self.lines]  # fmt: skip
        out += [f"{f.severity.upper()} [{f.section}] {f.message}" for f in self.findings]
        verdict = "fix the errors above" if self.errors else "ready to train (what is listed as not checked aside)"
        return "\n".join([*out, f"{len(self.errors)} error(s), {len(self.warnings)} warning(s): {verdict}."])


def short_repr(value: Any, limit: int = 70) -> str:
    return text if len(text := repr(value)) <= limit else text[: limit - 3] + "..."


def type_name(value: Any) -> str:
    inner = sorted({type_name(v) for v in value[:3]}) if isinstance(value, list) else None
    return type(value).__name__ if not inner else f"list[{'|'.join(inner)}]"


def sample_rows(dataset: Any, n: int = 3) -> list[dict]:
    """The first `n` rows (a streaming dataset reads only those)."""
    return [dataset[i] for i in range(min(n, len(dataset)))] if hasattr(dataset, "__len__") else list(
        itertools.islice(iter(dataset), n))  # fmt: skip


def likely_column(columns: Sequence[str], option: str) -> str | None:
    """The column that most likely holds the prompt (`option="prompt_column"`) or the reference answer."""
    found = next((c for c in _LIKELY[option] if c in columns), None)
    return "reward_model.ground_truth" if found == "reward_model" else found  # verl's layout


# --- Data and prompts
def column_problems(dataset: Any, prompt_column: str, solution_column: str | None) -> list[str]:
    """What is wrong with the columns in the first rows, a dotted path followed to its end (a typo passes `None`)."""
    rows = sample_rows(dataset)
    top = list(dataset.column_names) if dataset.column_names is not None else list(rows[0] if rows else [])
    problems = []
    for option, path in (("prompt_column", prompt_column), ("solution_column", solution_column)):
        if path is None or not top:
            continue
        keys, values, available = path.split("."), rows, top
        for depth, key in enumerate(keys):
            if available is not None and key not in available:
                where, names = ("the dataset", "columns") if depth == 0 else (f"`{'.'.join(keys[:depth])}`", "fields")
                close = difflib.get_close_matches(key, [str(a) for a in available], n=1, cutoff=0.6)
                likely = likely_column(available, option) if depth == 0 else None
                hint = (f" The {option[:-7]} looks like it is in `{likely}`: pass `--{option} {likely}`." if likely
                        else f" Did you mean `{'.'.join([*keys[:depth], close[0]])}`?" if close else "")  # fmt: skip
                problems.append(f"`{option}={path}`: `{key}` is not a {names[:-1]} of {where} (its {names}: "
                                f"{', '.join(map(str, available))}).{hint}")  # fmt: skip
                break
            values = [v.get(key) if isinstance(v, dict) else None for v in values]
            nested = [v for v in values if v is not None]  # a non-record on the way has no fields
            available = sorted({k for v in nested if isinstance(v, dict) for k in v}) if nested else None
        else:  # a None prompt is a row's problem: `inspect_dataset` names the row
            bad = next((v for v in values if not isinstance(v, str | list | None)), None)  # a list: `prompt_problem`
            if option == "prompt_column" and bad is not None:
                text = [c for c in top if c != path and rows and isinstance(rows[0].get(c), str)]
                problems.append(f"`prompt_column={path}` holds {type_name(bad)} values (e.g. {short_repr(bad)}), not "
                                f"text or chat messages: pass `--prompt_column` (text columns: {', '.join(text)}).")  # fmt: skip
    return problems


def inspect_dataset(report: Report, dataset: Any, name: str = "train_dataset") -> list[dict]:
    """Rows, columns and types, and whether every prompt is text or chat messages; returns a few rows."""
    if not (rows := sample_rows(dataset)):
        return report.error("dataset", f"`{name}` is empty (0 rows): check `--dataset_name`.") or []
    columns = dataset.column_names if dataset.column_names is not None else list(rows[0])
    size = f"{len(dataset)} rows" if hasattr(dataset, "__len__") else "streamed (length unknown)"
    types = ", ".join(f"{c} ({type_name(rows[0].get(c))})" for c in columns)
    report.info("dataset", f"{name}: {size}; columns: {types}")
    if "prompt" not in columns:
        return report.error("dataset", f"`{name}`: " + column_problems(dataset, "prompt", None)[0]) or rows
    prompts = dataset["prompt"] if hasattr(dataset, "__len__") else [r.get("prompt") for r in sample_rows(dataset, 64)]
    if bad := [(i, problem) for i, p in enumerate(prompts) if (problem := prompt_problem(p)) is not None]:
        scope = f"all {len(prompts)} rows" if hasattr(dataset, "__len__") else "the stream's first rows"
        more = f"{len(bad) - 1} more of {scope} too" if len(bad) > 1 else f"{scope} checked"
        report.error("dataset", f"`{name}` row {bad[0][0]}: the prompt {bad[0][1]} ({more}): fix or drop those rows.")
    return rows


def prompt_problem(prompt: Any) -> str | None:
    """What the tokenizer or the chat template would fail on in one prompt, or None (TRL trains empty contents)."""
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
    if any(isinstance(r.get("prompt"), list) for r in rows) and not getattr(tokenizer, "chat_template", None):
        return report.error("prompts", "The prompts are chat messages and the tokenizer has no chat template (a base "
                            "model): pass `--chat_prompts false`, or use an instruct model.")  # fmt: skip
    for i, row in enumerate(rows):
        prompt = row.get("prompt")
        try:
            text = prompt if not isinstance(prompt, list) else processing_class.apply_chat_template(
                prompt, tokenize=False, add_generation_prompt=True, **(args.chat_template_kwargs or {}))  # fmt: skip
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
        except Exception as error:  # TRL renders some inputs (images, tools) its own way: say so, do not refuse
            return report.warning("prompts", f"Rendering row {i}'s prompt failed ({type(error).__name__}: {error}).")
        report.info("prompts", f"row {i}, {n} tokens: {text!r}")
    report.info("prompts", f"completions: up to {args.max_completion_length} tokens each (`max_completion_length`)")


# --- Rewards: what each reads, from its signature
def is_own_reward(func: Any) -> bool:
    """This package's rewards and TRL's: the plan may call them (no side effects, no user code)."""
    return any(func is f for f in REWARD_FUNCS.values()) or from_trl(func)


def reward_required_columns(func: Callable) -> tuple[str, ...]:
    """Its `required_columns`, else its signature's parameters without a default that TRL does not pass itself."""
    if (declared := getattr(func, "required_columns", None)) is not None:
        return tuple(declared)
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # builtins and some C callables have no signature
        return ()
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return tuple(p.name for p in params if p.default is p.empty and p.kind in kinds and p.name not in TRAINER_KWARGS)


def reference_completion(func: Callable, solution: Any) -> Any:
    """A completion that states `solution` in the form `func` reads (it must score top), or None when unknown."""
    if isinstance(func, GSM8KReward):
        return f"#### {gold}" if (gold := extract_gsm8k_gold(solution)) is not None else str(solution)
    boxed = str(solution) if "\\boxed" in str(solution) else f"\\boxed{{{solution}}}"
    if isinstance(func, MathVerifyReward):
        return boxed
    think = {"accuracy_reward": "", "reasoning_accuracy_reward": "<think>\n</think>\n"}.get(
        getattr(func, "__name__", "") if from_trl(func) else "")  # fmt: skip
    return None if think is None else [{"role": "assistant", "content": think + boxed}]


def inspect_rewards(report: Report, funcs: Sequence[Any], names: Sequence[str], rows: list[dict],
                    columns: Sequence[str], call: Sequence[dict] = ()) -> None:  # fmt: skip
    """The columns each reward needs; the package's and TRL's called on `rows`, every reward on `call` if given."""
    alike = {}  # reward -> the one score it gave every completion it was called on
    for name, func in zip(names, funcs, strict=True):
        if isinstance(func, str) or not callable(func) or hasattr(func, "parameters"):
            report.info("rewards", f"{name}: a reward model (TRL scores prompt + completion with its own tokenizer)")
            continue
        needs = reward_required_columns(func)
        if REFERENCE_COLUMN in needs and REFERENCE_COLUMN not in columns:
            likely = likely_column([c for c in columns if c not in TRAINER_KWARGS], "solution_column")
            report.error("rewards", missing_reference_message(name, columns, likely or "COLUMN"))
            continue
        if missing := [c for c in needs if c not in columns]:
            close = {m: difflib.get_close_matches(m, list(columns), n=1, cutoff=0.6) for m in missing}
            hint = "".join(f" Did you mean `{c[0]}` for `{m}`?" for m, c in close.items() if c)
            report.error("rewards", f"Reward `{name}` needs the dataset column(s) {missing}, which the data lacks "
                         f"(columns: {', '.join(columns)}).{hint}")  # fmt: skip
            continue
        value_range = reward_value_range(func)
        span = "range not declared" if value_range is None else f"scores {value_range[0]:g} to {value_range[1]:g}"
        given = ", ".join(c for c in columns if c != "prompt") or "no other column"
        report.info("rewards", f"{name} ({span}): needs the columns {', '.join(needs) or '(none)'}; receives "
                    f"prompts, completions and {given}")  # fmt: skip
        trl_on_text = getattr(func, "__name__", "") in TRL_REWARD_FUNCS and isinstance(rows[0].get("prompt"), str)
        if from_trl(func) and trl_on_text:
            report.error("rewards", f"TRL's {name} reads chat completions and the prompts are plain text: "
                         "`--chat_prompts true` with a chat model, or `math_verify_01`.")  # fmt: skip
        elif call or is_own_reward(func):  # else the `not_checked` section says so
            alike[name] = _call_reward(report, name, func, list(call or rows), value_range, bool(call))
    if alike and None not in alike.values() and len(alike) == len(funcs):  # so would the run's total reward
        which = "; ".join(f"`{n}`: {score}" if len(alike) > 1 else score for n, score in alike.items())
        report.warning("rewards", f"Reward {', '.join(f'`{n}`' for n in alike)} gave every completion it was called on "
                       f"the same score ({which}): `cegppo train` stops with exit status 3 if the model's do too.")  # fmt: skip


def _call_reward(report: Report, name: str, func: Callable, rows: list[dict], value_range, asked: bool) -> str | None:
    """`func` called as TRL does on `rows`' reference answers; the one score of made-up completions, if one."""
    from transformers import TrainerState

    texts = [reference_completion(func, row.get(REFERENCE_COLUMN) or "") for row in rows]
    completions = [[{"role": "assistant", "content": c}] if isinstance(c, str) and isinstance(r.get("prompt"), list)
                   else c for r, c in zip(rows, [t or MADE_UP_COMPLETION for t in texts], strict=True)]  # fmt: skip
    kwargs = {k: [row.get(k) for row in rows] for k in rows[0] if k not in ("prompt", "completion", *TRAINER_KWARGS)}
    kwargs.update(dict.fromkeys(("log_extra", "log_metric"), lambda *a, **k: None), trainer_state=TrainerState(),
                  completion_ids=[[0]] * len(rows))  # fmt: skip
    called = f"called{' (`--call_rewards`)' if asked else ''} on {len(rows)} completions of real rows"
    where = f"Reward `{name}`, {called}"
    try:
        scores = func(prompts=[row.get("prompt") for row in rows], completions=completions, **kwargs)
        scores = asyncio.run(scores) if asyncio.iscoroutine(scores) else scores  # TRL awaits async rewards
        values = [None if s is None else float(s) for s in scores]
    except Exception as error:
        return report.error("rewards", f"{where}, failed: {type(error).__name__}: {error}")
    top = value_range[1] if value_range is not None and None not in texts else None
    wrong = next((i for i, v in enumerate(values) if top is not None and (v is None or abs(v - top) > 1e-6)), None)
    if len(values) != len(rows):
        report.error("rewards", f"{where}, returned {len(values)} value(s) for {len(rows)} completions.")
    elif all(v is None or math.isnan(v) for v in values):
        report.error("rewards", f"{where}, returned no score (None or NaN): `cegppo train` would exit 4.")
    elif wrong is not None:
        report.error("rewards", f"Reward `{name}` gives the reference answer itself (row {wrong}: solution="
                     f"{short_repr(rows[wrong].get(REFERENCE_COLUMN))}) the score {values[wrong]}, not its top score "
                     f"{top:g}: the reference column does not hold what this reward reads.")  # fmt: skip
    elif any(v is not None and math.isinf(v) for v in values):
        report.warning("rewards", f"{where}, returned an infinite score: TRL sets that group's advantages to 0.")
    else:
        scored = "the reference answers score the top score" if top is not None else "scores"
        report.info("rewards", f"  {called}: {scored} {short_repr(values)}")
        if top is None and len(set(values)) == 1:  # a made-up completion, one score: said if every reward does
            return f"{values[0]:g}; the completion: {short_repr(completions[0])}"
    return None


# --- The batch layout
def inspect_batch_layout(report: Report, args: Any, world_size: int) -> None:
    """Rollout batch, groups, optimizer steps per rollout batch, on- or off-policy; a learning rate of 0."""
    from .config import CEGPPO_LOSS_TYPES, is_on_policy, on_policy_message, vanishing_term_messages

    per_device, spg, ga = args.per_device_train_batch_size, args.steps_per_generation, args.gradient_accumulation_steps
    sizes = dict(per_device_train_batch_size=per_device, gradient_accumulation_steps=ga, steps_per_generation=spg,
                 num_iterations=args.num_iterations)  # fmt: skip
    if below := [name for name, value in sizes.items() if value is None or value < 1]:  # the trainer fails after load
        return report.error("batch", f"`{below[0]}={sizes[below[0]]}`: must be at least 1 (e.g. `--{below[0]} 1`).")
    rollout = args.generation_batch_size or per_device * world_size * spg
    report.info("batch", f"rollout batch: {rollout} completions = {rollout // args.num_generations} prompt(s) x "
                f"{args.num_generations} generations ({per_device} per device x {world_size} process(es) on "
                f"{args.device.type} x {spg} steps_per_generation)")  # fmt: skip
    report.info("batch", f"optimizer steps per rollout batch: {spg * args.num_iterations / ga:g} (steps_per_generation "
                f"x num_iterations / gradient_accumulation_steps), learning rate {args.learning_rate:g}")  # fmt: skip
    if args.learning_rate == 0:  # the run would train to its end and change nothing
        report.error("batch", "`learning_rate=0`: the optimizer would leave the weights as they are: e.g. "
                     "`--learning_rate 1e-6`.")  # fmt: skip
    if spg % ga:
        report.warning("batch", f"`steps_per_generation={spg}` is not a multiple of `gradient_accumulation_steps={ga}`:"
                       f" optimizer steps straddle two rollout batches.")  # fmt: skip
    if args.loss_type not in CEGPPO_LOSS_TYPES:
        report.info("batch", f"loss_type={args.loss_type}: TRL's objective, unchanged (a baseline)")
    elif is_on_policy(args):
        report.info("batch", "on-policy: the ratio is 1 at every step, so CE-GPPO is identical to GRPO")
        report.warning("batch", on_policy_message(args), code="trainer")
    else:
        report.info("batch", "off-policy after the first optimizer step of each rollout batch: CE-GPPO acts")
    for message in vanishing_term_messages(args):
        report.warning("batch", message, code="trainer")


# --- Model and output directory
def inspect_model(report: Report, model: str, args: Any) -> None:
    """A local folder with a weights file, or a config transformers can read; its architecture."""
    from transformers import AutoConfig

    path = os.path.expanduser(model)
    if os.path.isdir(path) and not any(f.endswith(WEIGHTS_SUFFIXES) for f in os.listdir(path)):
        return report.error("model", f"`model_name_or_path`: no file named model.safetensors or pytorch_model.bin "
                            f"(or another {'/'.join(WEIGHTS_SUFFIXES)}) found in directory {path}.")  # fmt: skip
    local = model.startswith(("./", "../", "/", "~")) or os.path.isdir(os.path.dirname(path.rstrip("/")))
    try:
        if local and not os.path.exists(path):  # transformers would try it as a Hub id
            raise OSError
        config = AutoConfig.from_pretrained(model, revision=(args.model_init_kwargs or {}).get("revision"),
                                            trust_remote_code=args.trust_remote_code)  # fmt: skip
    except Exception as error:  # the model load fails on the same
        what = error if os.path.exists(path) or not (local or model.count("/") != 1) else (
            f"no model at {os.path.abspath(path)} ({model!r} is not a local directory, and not a Hub id of the form "
            "`owner/name`).")  # fmt: skip
        return report.error("model", f"`model_name_or_path`: {what}")
    report.info("model", f"{model}: {', '.join(getattr(config, 'architectures', None) or [config.model_type])}")


def inspect_output_dir(report: Report, args: Any, overwrite: bool = False, plan: bool = True) -> None:
    """Fresh, holds checkpoints, or a file; and (`plan`) the checkpoint `cegppo train` will resume, or its refusal."""
    from .checkpoints import checkpoint_folders, other_runs, refusal, resolve

    path = args.output_dir
    if os.path.isfile(path):
        return report.error("output_dir", f"`output_dir` {path} is a file, not a directory: pick another one.")
    names = [os.path.basename(f) for f in checkpoint_folders(path)] if os.path.isdir(path) else []
    state = "fresh (will be created)" if not os.path.isdir(path) else "exists, no checkpoints"
    report.info("output_dir", f"{path}: " + (f"holds checkpoints ({', '.join(names[-3:])})" if names else state))
    if (planned := report.collect("output_dir", resolve, path, args.resume_from_checkpoint) if plan else None) is None:
        return
    checkpoint, messages = planned
    if (missing := missing_checkpoint(checkpoint)) is not None:
        report.error("output_dir", missing)
    elif checkpoint is None and (others := other_runs(path, set())) and not overwrite:
        report.error("output_dir", refusal(path, others))
    for line in [f"resumes {checkpoint}"] if checkpoint else messages:  # `last` with no checkpoint: a fresh start
        report.info("output_dir", line)


def missing_checkpoint(checkpoint: str | None) -> str | None:
    """transformers' refusal (after the model loads) of a resume path that is not a folder, in its words."""
    return f"Can't find a valid checkpoint at {checkpoint}" if checkpoint and not os.path.isdir(checkpoint) else None


# --- The report
def run_checks(train_dataset: Any, reward_funcs: Sequence[Any], args: Any, *, eval_dataset: Any = None,
               reward_names: Sequence[str] | None = None, processing_class: Any = None, call_rewards: bool = False,
               report: Report | None = None) -> Report:  # fmt: skip
    """The plan of what `cegppo train` hands the trainer; `run_checks(...).format()` is `cegppo check`'s report."""
    from .trl_compat import check_trl_compatibility

    report = Report() if report is None else report
    funcs = [f for f in reward_funcs if f is not None]
    names = list(reward_names) if reward_names is not None else [getattr(f, "__name__", str(f)) for f in funcs]
    if eval_dataset is not None and not isinstance(eval_dataset, dict):
        inspect_dataset(report, eval_dataset, name="eval_dataset")
    errors = len(report.errors)
    if train_dataset is not None and (rows := inspect_dataset(report, train_dataset)) and len(report.errors) == errors:
        if processing_class is not None:
            render_prompts(report, rows, processing_class, args)
        columns = train_dataset.column_names if train_dataset.column_names is not None else list(rows[0])
        n = args.num_generations  # `--call_rewards`: a rollout batch as TRL draws it
        batch = sample_rows(train_dataset, max(1, args.generation_batch_size // n)) if call_rewards else []
        inspect_rewards(report, funcs, names, rows, columns, [row for row in batch for _ in range(n)])
    weights = getattr(args, "reward_weights", None)  # a NaN weight makes every reward NaN; TRL checks their count
    if weights is not None and not all(math.isfinite(float(w)) for w in weights):
        finite = " ".join(str(w if math.isfinite(float(w)) else 1.0) for w in weights)
        report.error("rewards", f"`reward_weights` {list(weights)} holds a value that is not finite: e.g. "
                     f"`--reward_weights {finite}`.")  # fmt: skip
    inspect_batch_layout(report, args, args.world_size)
    report.collect("batch", check_trl_compatibility, args)  # the trainer's own refusal, before the model loads
    yours = [n for n, f in zip(names, funcs, strict=True) if callable(f) and not is_own_reward(f)]
    if yours and not call_rewards:
        report.info("not_checked", f"rewards of yours ({', '.join(yours)}): not called (`--call_rewards` calls them on "
                    "a rollout batch of real rows)")  # fmt: skip
    report.info("not_checked", "the model's weights: not read (a truncated or corrupt weights file fails at load)")
    report.info("not_checked", "the settings TRL, transformers and torch validate themselves, optional packages "
                "(vLLM, Liger, DeepSpeed), trackers and the Hub")  # fmt: skip
    return report
