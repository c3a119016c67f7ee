"""Reward functions for CE-GPPO runs, selectable by name (`--reward_funcs math_verify format`).

Every reward follows TRL's signature `f(completions, **kwargs) -> list[float | None]`: `completions` are strings or
conversational message lists, dataset columns arrive as keyword lists (the reference answer as `solution`). A reward
that compares with a reference raises when the batch has no `solution` column at all (as TRL's `accuracy_reward`
does), naming the column to map: scoring every rollout "wrong" would train on nothing without a word. Within a batch,
a malformed completion or one row's missing or unusable reference gets the "wrong" score, so that group has
all-equal rewards, zero advantage, and no policy gradient.

Registry (`REWARD_FUNCS`):

| name             | scores                                                     | reference column         |
|------------------|------------------------------------------------------------|--------------------------|
| `math_verify`    | +1 correct, -1 otherwise (the CE-GPPO authors' convention) | `solution` (LaTeX/plain) |
| `math_verify_01` | 1 correct, 0 otherwise                                     | `solution`               |
| `gsm8k`          | +1 / -1 on the final number                                | `solution` (`#### 42`)   |
| `gsm8k_01`       | 1 / 0 on the final number                                  | `solution`               |
| `format`         | 1 if the answer is a well-formed `\\boxed{}` (and any       | none                     |
|                  | `<think>` block is closed before it), else 0               |                          |

TRL's reward functions are accepted by name too (`TRL_REWARD_FUNCS`: `accuracy_reward`, `reasoning_accuracy_reward`,
`think_format_reward`, as TRL's `grpo.py` accepts them), and any reward by dotted import path (`trl.rewards.<name>`,
`my_lib.rewards.my_reward`).
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

logger = logging.getLogger(__name__)

# math-verify bounds each parse/verify with signal.alarm (seconds). Signals only work in the main thread, and
# math-verify raises ValueError elsewhere (async reward workers, thread pools), so off the main thread the
# timeouts are disabled, as TRL's own `accuracy_reward` does.
MATH_VERIFY_TIMEOUT_S = 5


# --- Text helpers
def completion_text(completion: Any) -> str:
    """The generated text of one completion, whatever form TRL hands it in.

    Args:
        completion: a string (standard format), a list of messages (conversational format; the last assistant
            message is used, its content a string or a list of `{"type": "text", "text": ...}` parts), a single
            message dict, or `None`.

    Returns:
        The text, `""` when there is none.
    """
    if completion is None:
        return ""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return _content_text(completion.get("content"))
    if isinstance(completion, Sequence):
        messages = [m for m in completion if isinstance(m, dict)]
        assistant = [m for m in messages if m.get("role", "assistant") == "assistant"]
        chosen = assistant or messages
        return _content_text(chosen[-1].get("content")) if chosen else ""
    return str(completion)


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return str(content)


def last_boxed(text: str) -> str | None:
    r"""Content of the last `\boxed{...}` (or `\fbox{...}`) with balanced braces; `None` if there is none or it is
    unclosed (a completion truncated inside its answer)."""
    starts = [m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]
    for start in reversed(starts):
        depth = 1
        for i in range(start, len(text)):
            if text[i] == "{":
                depth += 1
            elif text[i] == "}":
                depth -= 1
                if depth == 0:
                    return text[start:i]
    return None


def _answer_part(text: str) -> str | None:
    """The text after the reasoning block; `None` when the think tags are malformed or the block never closes."""
    opens, closes = text.count("<think>"), text.count("</think>")
    if opens > 1 or closes > 1 or (opens == 1 and closes == 0):
        return None
    if closes == 1:
        if opens == 1 and text.index("<think>") > text.index("</think>"):
            return None
        return text.split("</think>", 1)[1]
    return text  # no think tags (or the template already opened <think> in the prompt and it was closed above)


def _main_thread_timeout() -> int | None:
    return MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


# --- The reference column and the math-verify dependency
REFERENCE_COLUMN = "solution"
# Keyword arguments TRL's GRPOTrainer passes to every reward besides the dataset columns.
TRAINER_KWARGS = (
    "prompts",
    "completions",
    "completion_ids",
    "trainer_state",
    "log_extra",
    "log_metric",
    "environments",
)


def missing_reference_message(reward: str, columns: Sequence[str]) -> str:
    """Why `reward` cannot score a batch without a `solution` column, and how to give it one."""
    columns = [c for c in columns if c not in TRAINER_KWARGS]
    return (
        f"Reward `{reward}` compares each completion with a reference answer, passed as the `{REFERENCE_COLUMN}` "
        f"column, and the data has none (its columns: {', '.join(columns) or 'none'}). Name the column that holds it "
        "(`cegppo train --solution_column COLUMN`), or in Python give the trainer a dataset with a `solution` column "
        "(`dataset.rename_column(COLUMN, 'solution')`). Without a reference, use a reference-free reward such as "
        "`format`."
    )


def require_math_verify(reward: str) -> None:
    """Raise an `ImportError` naming the package when `math-verify` cannot be imported."""
    try:
        import math_verify  # noqa: F401
    except ImportError as error:
        raise ImportError(
            f"Reward `{reward}` checks answers with the `math-verify` package, which cannot be imported ({error}). "
            "Install it with `pip install math-verify` (a dependency of cegppo-trl, missing when installed with "
            "`--no-deps`)."
        ) from error


# --- Math (math-verify)
class MathVerifyReward:
    r"""Correctness of a final boxed answer against a reference, checked by `math-verify`.

    The reference (`solution` column) may be a bare answer (`"\frac{1}{2}"`, `"42"`, `"x^2+1"`), which is wrapped as
    `\boxed{...}` before parsing like the authors' reward does, or a full worked solution containing `\boxed{}`.
    The completion's last closed `\boxed{}` is parsed with math-verify's LaTeX extraction and compared with
    `math_verify.verify` (symbolic and numeric equivalence).

    Scores `correct` or `incorrect`. `incorrect` also covers: no boxed answer (unless `require_boxed=False`), an
    unclosed or unparseable box, an empty completion, a row whose reference is `None`/empty/unparseable, and any
    math-verify error or timeout. Called without a `solution` column at all, it raises a `ValueError` naming the
    column to map; without `math-verify` installed, an `ImportError` naming the package.

    Deviation from the authors' reward (plain `math_verify.parse` of the whole response): by default a boxed answer is
    required, so "the answer is 7" without a box is wrong; `require_boxed=False` restores their fallback to un-boxed
    expressions.

    Args:
        correct: score of a correct answer.
        incorrect: score of everything else (`-1.0` for the authors' convention, `0.0` for a 0/1 reward).
        require_boxed: score completions without a closed `\boxed{}` as incorrect without parsing them.
        name: the name TRL logs the reward under (`rewards/<name>/mean`).
    """

    def __init__(self, correct: float = 1.0, incorrect: float = -1.0, require_boxed: bool = True, name: str = ""):
        self.correct = correct
        self.incorrect = incorrect
        self.require_boxed = require_boxed
        self.__name__ = name or "math_verify"

    required_columns = (REFERENCE_COLUMN,)

    @property
    def reward_range(self) -> tuple[float, float]:
        """`(lowest, top)` score: what `cegppo check` and the zero-signal warning compare with."""
        return (min(self.incorrect, self.correct), max(self.incorrect, self.correct))

    def reference_completion(self, solution: Any) -> str:
        """A completion whose answer is `solution` (boxed unless it already holds a box): it must score `correct`."""
        return _boxed_reference(solution)

    def __call__(self, completions: list, solution: list | None = None, log_extra: Callable | None = None, **kwargs):
        if solution is None:
            raise ValueError(missing_reference_message(self.__name__, list(kwargs)))
        require_math_verify(self.__name__)
        rewards, answers = [], []
        for completion, gold in zip(completions, solution, strict=True):
            ok, answer = self.score_one(completion_text(completion), gold)
            rewards.append(self.correct if ok else self.incorrect)
            answers.append(answer)
        if log_extra is not None:
            log_extra(f"{self.__name__}_answer", answers)
        return rewards

    def score_one(self, text: str, gold: Any) -> tuple[bool, str]:
        """Whether `text` answers `gold`, and the parsed answer (for the completions table)."""
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        if gold is None or not str(gold).strip() or not text:
            return False, "[no answer]" if not text else "[no reference]"
        boxed = last_boxed(text)
        if self.require_boxed and boxed is None:
            return False, "[no boxed answer]"
        timeout = _main_thread_timeout()
        try:
            gold = str(gold).strip()
            gold_parsed = parse(gold if "\\boxed" in gold else f"\\boxed{{{gold}}}", parsing_timeout=timeout)
            if not gold_parsed:
                gold_parsed = parse(gold, parsing_timeout=timeout)
            if not gold_parsed:
                logger.debug("math_verify: unparseable reference %r", gold)
                return False, "[unparseable reference]"
            # Only the last box is parsed: math-verify joins *all* boxes of a text into a set ("\boxed{3} ...
            # \boxed{5}" -> {3, 5}), which would mark a reasoning trace that boxes an intermediate result wrong. It
            # also keeps parsing cheap on 16k-token completions.
            if boxed is not None:
                pred, extraction = f"\\boxed{{{boxed}}}", [LatexExtractionConfig(boxed_match_priority=0)]
            else:
                pred, extraction = text, [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]
            answer = parse(pred, extraction_config=extraction, extraction_mode="first_match", parsing_timeout=timeout)
            if not answer:
                return False, "[unparseable answer]"
            return bool(verify(gold_parsed, answer, timeout_seconds=timeout)), str(answer[-1])
        except Exception as error:  # math-verify raises on pathological LaTeX and on timeouts
            logger.debug("math_verify: %s on %r", type(error).__name__, text[-200:])
            return False, f"[{type(error).__name__}]"


# --- GSM8K
# A number: thousands groups "1,234,567" or plain digits, optional decimals, optional sign; or ".5".
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_FRAC_RE = re.compile(r"\\d?frac\s*\{\s*(" + _NUMBER + r")\s*\}\s*\{\s*(" + _NUMBER + r")\s*\}")


def _to_number(token: str) -> Fraction | None:
    try:
        return Fraction(token.replace(",", "").replace("+", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _normalise(text: str) -> str:
    # Unicode minus signs and TeX's thin-space thousands separator ("1{,}000", "1\,000") are common in outputs.
    return text.replace("\u2212", "-").replace("\u2013", "-").replace("{,}", ",").replace("\\,", "").replace("\\!", "")


def parse_number(text: str | None) -> Fraction | None:
    r"""The last number in `text` as an exact `Fraction` (`"1,234.50"` → 2469/2, `"\frac{3}{4}"` → 3/4); `None` if
    there is none."""
    if not text:
        return None
    text = _normalise(str(text))
    fractions = list(_FRAC_RE.finditer(text))
    numbers = list(_NUMBER_RE.finditer(text))
    if fractions and (not numbers or fractions[-1].end() >= numbers[-1].end()):
        num, den = _to_number(fractions[-1].group(1)), _to_number(fractions[-1].group(2))
        return num / den if num is not None and den else None
    return _to_number(numbers[-1].group()) if numbers else None


def extract_gsm8k_gold(answer: Any) -> Fraction | None:
    """The reference number of a GSM8K `answer` field (worked solution ending in `#### 72`), or of a bare number."""
    if answer is None:
        return None
    answer = str(answer)
    return parse_number(answer.rsplit("####", 1)[1] if "####" in answer else answer)


def extract_gsm8k_answer(text: str) -> Fraction | None:
    r"""The model's final number: the last `\boxed{}` if any, else the text after the last `####`, else the last
    number in the text. Only the text after a closed `</think>` counts; an unclosed or repeated think block gives
    `None`."""
    text = _answer_part(_normalise(text or ""))
    if text is None:
        return None
    boxed = last_boxed(text)
    if boxed is not None:
        return parse_number(re.sub(r"\\text\s*\{[^{}]*\}", " ", boxed))
    if "####" in text:
        return parse_number(text.rsplit("####", 1)[1].split("\n", 1)[0])
    return parse_number(text)


class GSM8KReward:
    """Exact numeric match of the completion's final number with the GSM8K reference (`#### 72`).

    `incorrect` also covers completions with no number and a row whose reference is missing or has no number.
    Called without a `solution` column at all, it raises a `ValueError` naming the column to map.
    """

    def __init__(self, correct: float = 1.0, incorrect: float = -1.0, name: str = "gsm8k"):
        self.correct = correct
        self.incorrect = incorrect
        self.__name__ = name

    required_columns = (REFERENCE_COLUMN,)

    @property
    def reward_range(self) -> tuple[float, float]:
        """`(lowest, top)` score: what `cegppo check` and the zero-signal warning compare with."""
        return (min(self.incorrect, self.correct), max(self.incorrect, self.correct))

    def reference_completion(self, solution: Any) -> str:
        """A completion whose final number is that of `solution`: it must score `correct`."""
        return f"#### {extract_gsm8k_gold(solution)}" if extract_gsm8k_gold(solution) is not None else str(solution)

    def __call__(self, completions: list, solution: list | None = None, log_extra: Callable | None = None, **kwargs):
        if solution is None:
            raise ValueError(missing_reference_message(self.__name__, list(kwargs)))
        rewards, answers = [], []
        for completion, gold in zip(completions, solution, strict=True):
            predicted, reference = extract_gsm8k_answer(completion_text(completion)), extract_gsm8k_gold(gold)
            ok = predicted is not None and reference is not None and predicted == reference
            rewards.append(self.correct if ok else self.incorrect)
            answers.append("[no number]" if predicted is None else str(predicted))
        if log_extra is not None:
            log_extra(f"{self.__name__}_answer", answers)
        return rewards


# --- Format
def format_reward(completions: list, **kwargs) -> list[float]:
    r"""1.0 if the completion contains a non-empty, closed `\boxed{...}` answer and any `<think>` block is well formed
    (at most one, closed, the box after it), else 0.0.

    Reasoning models whose chat template opens `<think>` in the prompt produce completions with only `</think>`;
    those are accepted.
    """
    rewards = []
    for completion in completions:
        answer = _answer_part(completion_text(completion))
        boxed = last_boxed(answer) if answer is not None else None
        rewards.append(1.0 if boxed is not None and boxed.strip() else 0.0)
    return rewards


format_reward.reward_range = (0.0, 1.0)


# --- Registry
REWARD_FUNCS: dict[str, Callable] = {
    "math_verify": MathVerifyReward(1.0, -1.0, name="math_verify"),
    "math_verify_01": MathVerifyReward(1.0, 0.0, name="math_verify_01"),
    "gsm8k": GSM8KReward(1.0, -1.0, name="gsm8k"),
    "gsm8k_01": GSM8KReward(1.0, 0.0, name="gsm8k_01"),
    "format": format_reward,
}


# TRL's reward functions accepted by bare name (TRL's `grpo.py` accepts the same three), with the line `cegppo rewards`
# prints for each (static: listing them must not import TRL). All three read conversational completions only.
TRL_REWARD_FUNCS: dict[str, str] = {
    "accuracy_reward": "math-verify equivalence of the completion with `solution`. Scores 1 correct, 0 otherwise, "
    "None (row skipped) when the reference does not parse. Chat prompts only.",
    "reasoning_accuracy_reward": "accuracy_reward on the text after </think>; 0 when the reasoning is not closed. "
    "Chat prompts only.",
    "think_format_reward": "1 if the completion opens with one <think>...</think> block, else 0; reads no "
    "reference. Chat prompts only.",
}
_MATH_VERIFY_REWARDS = ("math_verify", "math_verify_01", "accuracy_reward", "reasoning_accuracy_reward")


def _unknown_reward_message(name: str) -> str:
    import difflib

    known = [*REWARD_FUNCS, *TRL_REWARD_FUNCS]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return (
        f"Unknown reward function {name!r}{hint}. Built-in: {', '.join(REWARD_FUNCS)} (`cegppo rewards` describes "
        f"them); TRL's: {', '.join(TRL_REWARD_FUNCS)}, or any other as `trl.rewards.<name>`; or a dotted import path "
        "to your own (`my_lib.rewards.my_reward`)."
    )


def check_reward_name(name: str) -> None:
    """Refuse a reward name that `get_reward_func` cannot resolve, without importing anything (parse time).

    Raises:
        ValueError: an unknown bare name.
    """
    if name not in REWARD_FUNCS and name not in TRL_REWARD_FUNCS and "." not in name:
        raise ValueError(_unknown_reward_message(name))


def get_reward_func(name: str) -> Callable:
    """A reward function by registry name, by the name of one of TRL's (`accuracy_reward`, `think_format_reward`,
    ...), or by dotted import path (`trl.rewards.accuracy_reward`, `my_pkg.rewards.my_reward`, resolved from the
    current directory too, like TRL's `grpo.py`).

    Raises:
        ValueError: an unknown name that is not an importable `module.attribute` path.
        ImportError: the reward needs `math-verify` and it is not installed (raised here, before any model loads,
            rather than at the first rollout).
    """
    import importlib

    check_reward_name(name)
    if name in REWARD_FUNCS:
        func = REWARD_FUNCS[name]
    elif name in TRL_REWARD_FUNCS:
        func = getattr(importlib.import_module("trl.rewards"), name)
    else:
        import os
        import sys

        module_path, attr = name.rsplit(".", 1)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            func = getattr(importlib.import_module(module_path), attr)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"Could not import reward function {name!r}: {error}") from error
    from_trl = getattr(func, "__module__", "").startswith("trl.rewards")
    if (key := getattr(func, "__name__", name) if from_trl else name) in _MATH_VERIFY_REWARDS:
        require_math_verify(key)
    return func


def resolve_reward_names(reward_funcs: Any) -> Any:
    """`reward_funcs` as `CEGPPOTrainer` passes it to TRL, with each string naming a reward function resolved.

    TRL reads a string as a reward model's Hub id or path: `"math_verify"` would be looked up (and retried) on the
    Hub. A registry name (`math_verify`, TRL's `accuracy_reward`, ...) is resolved here; another string without the
    `owner/name` form of a Hub id, and no local folder of that name, is refused pointing to `get_reward_func`.
    """
    import os

    def resolve(item: Any) -> Any:
        if not isinstance(item, str) or os.path.isdir(os.path.expanduser(item)):
            return item
        if item in REWARD_FUNCS or item in TRL_REWARD_FUNCS:
            return get_reward_func(item)
        if item.count("/") != 1:
            raise ValueError(
                f"`reward_funcs`: {item!r} is no reward function's name, no local reward model folder and not a Hub "
                f"id (`owner/name`). {_unknown_reward_message(item)} In Python pass the function itself, e.g. "
                "`cegppo_trl.rewards.get_reward_func('math_verify')`."
            )
        return item

    if isinstance(reward_funcs, (list, tuple)):
        return [resolve(item) for item in reward_funcs]
    return resolve(reward_funcs)


# Score ranges and reference completions of TRL's rewards accepted by name (they declare neither).
_TRL_REWARD_RANGES = {
    "accuracy_reward": (0.0, 1.0),
    "reasoning_accuracy_reward": (0.0, 1.0),
    "think_format_reward": (0.0, 1.0),
}


def _boxed_reference(solution: Any) -> str:
    text = str(solution)
    return text if "\\boxed" in text else f"\\boxed{{{text}}}"


def reward_value_range(func: Callable) -> tuple[float, float] | None:
    """`(lowest, top)` score of a reward: its `reward_range` attribute if it declares one (this package's rewards
    do; a reward of yours can too), TRL's 0/1 rewards by name; None when unknown."""
    declared = getattr(func, "reward_range", None)
    if declared is not None:
        low, high = declared
        return float(low), float(high)
    if getattr(func, "__module__", "").startswith("trl.rewards"):
        return _TRL_REWARD_RANGES.get(getattr(func, "__name__", ""))
    return None
