"""Reward functions by name (`--reward_funcs math_verify format`), TRL's signature, the reference answer in the
`solution` column. A reward that needs one raises when the batch has no `solution` column (scoring every rollout
"wrong" would train on nothing without a word); a malformed completion or one unusable reference scores "wrong"."""

from __future__ import annotations

import difflib
import importlib
import logging
import os
import re
import sys
import threading
from collections.abc import Callable, Sequence
from fractions import Fraction
from typing import Any

logger = logging.getLogger(__name__)
REFERENCE_COLUMN = "solution"
# Keyword arguments TRL's GRPOTrainer passes to every reward besides the dataset columns.
TRAINER_KWARGS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric", "environments")  # fmt: skip


def completion_text(completion: Any) -> str:
    """The text of a completion: a string, a message, or the last assistant message of a list (text parts joined)."""
    if isinstance(completion, Sequence) and not isinstance(completion, str):
        messages = [m for m in completion if isinstance(m, dict)]
        chosen = [m for m in messages if m.get("role", "assistant") == "assistant"] or messages
        completion = chosen[-1] if chosen else None
    content = completion.get("content") if isinstance(completion, dict) else completion
    if isinstance(content, Sequence) and not isinstance(content, str):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return "" if content is None else str(content)


def last_boxed(text: str) -> str | None:
    r"""Content of the last balanced `\boxed{...}` (or `\fbox{...}`); `None` if none or unclosed (truncated)."""
    for start in reversed([m.end() for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text)]):
        depth = 1
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i]
    return None


def _answer_part(text: str) -> str | None:
    """The text after the reasoning block (a lone `</think>` too); `None` for malformed or unclosed tags."""
    opens, closes = text.count("<think>"), text.count("</think>")
    if opens > 1 or closes > 1 or opens > closes or (opens and text.index("<think>") > text.index("</think>")):
        return None
    return text.split("</think>", 1)[1] if closes else text


def missing_reference_message(reward: str, columns: Sequence[str], column: str = "COLUMN") -> str:
    """Why `reward` cannot score data without a `solution` column, and how to name one (`column`, when known)."""
    columns = [c for c in columns if c not in TRAINER_KWARGS]
    return (f"Reward `{reward}` compares with a reference answer, the `{REFERENCE_COLUMN}` column, and the data has "
            f"none (its columns: {', '.join(columns) or 'none'}): `--solution_column {column}` (Python: "
            f"`dataset.rename_column('{column}', 'solution')`), or a reference-free reward such as `format`.")  # fmt: skip


class _ReferenceReward:
    """`correct` when `score_one(text, reference)` says so, else `incorrect`; the parsed answers go to `log_extra`."""

    required_columns = (REFERENCE_COLUMN,)

    def __init__(self, correct: float, incorrect: float, name: str, rule: str):
        self.correct, self.incorrect, self.__name__ = correct, incorrect, name
        self.reward_range = (min(incorrect, correct), max(incorrect, correct))  # `reward_value_range` reads it
        self.description = f"{rule} with `solution`: {correct:+g} correct, {incorrect:g} otherwise."

    def __call__(self, completions: list, solution: list | None = None, log_extra: Callable | None = None, **kwargs):
        if solution is None:
            raise ValueError(missing_reference_message(self.__name__, list(kwargs)))
        scored = [self.score_one(completion_text(c), gold) for c, gold in zip(completions, solution, strict=True)]
        if log_extra is not None:
            log_extra(f"{self.__name__}_answer", [answer for _, answer in scored])
        return [self.correct if ok else self.incorrect for ok, _ in scored]


class MathVerifyReward(_ReferenceReward):
    r"""The last `\boxed{}` answer against the reference (bare, or a worked solution with `\boxed{}`) by
    `math_verify.verify`; `require_boxed=False`: the authors' fallback to un-boxed answers. Failures: `incorrect`."""

    def __init__(self, correct: float = 1.0, incorrect: float = -1.0, require_boxed: bool = True, name: str = ""):
        super().__init__(correct, incorrect, name or "math_verify", "math-verify equivalence of the last \\boxed{}")
        self.require_boxed = require_boxed

    def score_one(self, text: str, gold: Any) -> tuple[bool, str]:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify

        if gold is None or not str(gold).strip() or not text:
            return False, "[no answer]" if not text else "[no reference]"
        boxed = last_boxed(text)
        if self.require_boxed and boxed is None:
            return False, "[no boxed answer]"
        # math-verify's timeouts use signal.alarm, which raises off the main thread (async rewards): off there.
        timeout = 5 if threading.current_thread() is threading.main_thread() else None
        try:
            gold = str(gold).strip()
            gold_parsed = parse(gold if "\\boxed" in gold else f"\\boxed{{{gold}}}", parsing_timeout=timeout) or parse(
                gold, parsing_timeout=timeout)  # fmt: skip
            if not gold_parsed:
                return False, "[unparseable reference]"
            # Only the last box: math-verify joins all boxes into a set (a boxed intermediate result would be wrong).
            configs = [LatexExtractionConfig(boxed_match_priority=0)] + ([] if boxed else [ExprExtractionConfig()])
            pred = text if boxed is None else f"\\boxed{{{boxed}}}"
            answer = parse(pred, extraction_config=configs, extraction_mode="first_match", parsing_timeout=timeout)
            if not answer:
                return False, "[unparseable answer]"
            return bool(verify(gold_parsed, answer, timeout_seconds=timeout)), str(answer[-1])
        except Exception as error:  # math-verify raises on pathological LaTeX and on timeouts
            logger.debug("math_verify: %s on %r", type(error).__name__, text[-200:])
            return False, f"[{type(error).__name__}]"


# GSM8K's final number (math-verify has no "last number of a worked answer" rule): "1,234.5", "-3", ".5", \frac{a}{b}.
_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_FRAC_RE = re.compile(r"\\d?frac\s*\{\s*(" + _NUMBER + r")\s*\}\s*\{\s*(" + _NUMBER + r")\s*\}")


def _to_number(token: str) -> Fraction | None:
    try:
        return Fraction(token.replace(",", "").replace("+", ""))
    except (ValueError, ZeroDivisionError):
        return None


def _normalise(text: str) -> str:
    # Unicode minus signs and TeX's thousands separators ("1{,}000", "1\,000") are common in outputs.
    return text.replace("\u2212", "-").replace("\u2013", "-").replace("{,}", ",").replace("\\,", "").replace("\\!", "")


def parse_number(text: str | None) -> Fraction | None:
    r"""The last number in `text` as an exact `Fraction` (`"1,234.50"` → 2469/2, `"\frac{3}{4}"` → 3/4), or `None`."""
    text = _normalise(str(text or ""))
    fractions, numbers = list(_FRAC_RE.finditer(text)), list(_NUMBER_RE.finditer(text))
    if fractions and (not numbers or fractions[-1].end() >= numbers[-1].end()):
        num, den = _to_number(fractions[-1].group(1)), _to_number(fractions[-1].group(2))
        return num / den if num is not None and den else None
    return _to_number(numbers[-1].group()) if numbers else None


def extract_gsm8k_gold(answer: Any) -> Fraction | None:
    """The reference number of a GSM8K `answer` field (worked solution ending in `#### 72`), or of a bare number."""
    return None if answer is None else parse_number(str(answer).rsplit("####", 1)[-1])


def extract_gsm8k_answer(text: str) -> Fraction | None:
    r"""The last `\boxed{}`'s number, else that after the last `####`, else the last one (after `</think>`)."""
    text = _answer_part(_normalise(text or ""))
    if text is None:
        return None
    if (boxed := last_boxed(text)) is not None:
        return parse_number(re.sub(r"\\text\s*\{[^{}]*\}", " ", boxed))
    return parse_number(text.rsplit("####", 1)[1].split("\n", 1)[0] if "####" in text else text)


class GSM8KReward(_ReferenceReward):
    """Exact numeric match of the completion's final number with the GSM8K reference (`#### 72`)."""

    def __init__(self, correct: float = 1.0, incorrect: float = -1.0, name: str = "gsm8k"):
        super().__init__(correct, incorrect, name, "the final number")

    def score_one(self, text: str, gold: Any) -> tuple[bool, str]:
        predicted, reference = extract_gsm8k_answer(text), extract_gsm8k_gold(gold)
        return predicted is not None and predicted == reference, "[no number]" if predicted is None else str(predicted)


def format_reward(completions: list, **kwargs) -> list[float]:
    r"""1.0 for a non-empty, closed `\boxed{...}` after a well-formed `<think>` block (or none), else 0.0."""
    answers = [_answer_part(completion_text(c)) for c in completions]
    return [float(a is not None and bool((last_boxed(a) or "").strip())) for a in answers]


format_reward.reward_range = (0.0, 1.0)
format_reward.description = "1 for a closed, non-empty \\boxed{} after a well-formed <think> block (or none), else 0."

REWARD_FUNCS: dict[str, Callable] = {
    "math_verify": MathVerifyReward(1.0, -1.0, name="math_verify"),
    "math_verify_01": MathVerifyReward(1.0, 0.0, name="math_verify_01"),
    "gsm8k": GSM8KReward(1.0, -1.0, name="gsm8k"),
    "gsm8k_01": GSM8KReward(1.0, 0.0, name="gsm8k_01"),
    "format": format_reward,
}
# TRL's rewards by bare name (as TRL's `grpo.py`), each with its `cegppo rewards` line (listing them imports no TRL).
TRL_REWARD_FUNCS: dict[str, str] = {
    "accuracy_reward": "math-verify equivalence with `solution`: 1 or 0, None when the reference does not parse.",
    "reasoning_accuracy_reward": "accuracy_reward on the text after </think>; 0 when the reasoning is not closed.",
    "think_format_reward": "1 if the completion opens with one <think>...</think> block, else 0; no reference.",
}


def from_trl(func: Any) -> bool:
    return getattr(func, "__module__", "").startswith("trl.rewards")


def check_reward_name(name: str) -> None:
    """Refuse (`ValueError`) a bare name `get_reward_func` cannot resolve, importing nothing (parse time)."""
    if name not in REWARD_FUNCS and name not in TRL_REWARD_FUNCS and "." not in name:
        close = difflib.get_close_matches(name, [*REWARD_FUNCS, *TRL_REWARD_FUNCS], n=1, cutoff=0.6)
        raise ValueError(f"Unknown reward function {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}. "
                         f"Built-in: {', '.join(REWARD_FUNCS)}; TRL's: {', '.join(TRL_REWARD_FUNCS)} (others as "
                         "`trl.rewards.<name>`); or a dotted import path (`my_lib.rewards.my_reward`).")  # fmt: skip


def get_reward_func(name: str) -> Callable:
    """A reward by registry name, TRL's name or dotted import path (the current directory too); else `ValueError`."""
    check_reward_name(name)
    if name in REWARD_FUNCS:
        return REWARD_FUNCS[name]
    module_path, attr = ("trl.rewards", name) if name in TRL_REWARD_FUNCS else name.rsplit(".", 1)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(module_path), attr)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"Could not import reward function {name!r}: {error}") from error


def resolve_reward_names(reward_funcs: Any) -> Any:
    """`reward_funcs`' names resolved (`get_reward_func`); TRL reads a folder or `owner/name` as a reward model."""
    if isinstance(reward_funcs, (list, tuple)):
        return [resolve_reward_names(f) for f in reward_funcs]
    if not isinstance(item := reward_funcs, str) or item.count("/") == 1 or os.path.isdir(os.path.expanduser(item)):
        return item
    try:
        return get_reward_func(item)
    except ValueError as error:
        raise ValueError(f"`reward_funcs`: {item!r} is no reward function's name, no local reward model folder and "
                         f"not a Hub id (`owner/name`). {error} In Python pass the function itself: "
                         "`cegppo_trl.rewards.get_reward_func('math_verify')`.") from None  # fmt: skip


def reward_value_range(func: Callable) -> tuple[float, float] | None:
    """`(lowest, top)` score: a `reward_range` attribute (yours may declare one), 0/1 for TRL's by name, else None."""
    if (declared := getattr(func, "reward_range", None)) is not None:
        return float(declared[0]), float(declared[1])
    return (0.0, 1.0) if from_trl(func) and getattr(func, "__name__", "") in TRL_REWARD_FUNCS else None
