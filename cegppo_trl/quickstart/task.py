"""The quickstart's tasks: built-in multi-digit addition, or a GSM8K-style Hub dataset; their rewards; greedy eval.

A task is a train split (RL prompts), a held-out split (greedy accuracy before, during and after training), a
TRL reward function and the exact-match check that the accuracy counts. Both splits have the columns `prompt`
(a string, or a list of chat messages for chat models) and `answer` (the reference answer, a string); TRL passes
`answer` to the reward function as a keyword argument.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from datasets import Dataset

__all__ = [
    "Task",
    "addition_problems",
    "addition_task",
    "addition_is_correct",
    "addition_reward",
    "extract_final_number",
    "numeric_is_correct",
    "numeric_reward",
    "hub_dataset_task",
    "encode_prompts",
    "generate_greedy",
    "evaluate_accuracy",
]


@dataclass
class Task:
    """A verifiable task: prompts, reference answers, reward and exact-match check.

    Attributes:
        name: short name shown in summaries.
        train: RL prompts, columns `prompt` and `answer`.
        heldout: held-out prompts for the greedy accuracy, same columns, disjoint from `train`.
        reward_fn: TRL reward function `(completions, answer, **kwargs) -> list[float]`.
        is_correct: `(completion, answer) -> bool`, the held-out accuracy's criterion.
        max_completion_length: completion budget in tokens for sampling and evaluation.
    """

    name: str
    train: Dataset
    heldout: Dataset
    reward_fn: Callable[..., list[float]]
    is_correct: Callable[[str, str], bool]
    max_completion_length: int


# ----------------------------------------------------------------------------------------------------------------
# Built-in task: multi-digit addition, "37+58=" -> "95" then EOS
# ----------------------------------------------------------------------------------------------------------------
def addition_problems(num_digits: int = 2, num_heldout: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Every `num_digits`-digit + `num_digits`-digit sum, shuffled and split into train and held-out.

    Operands have exactly `num_digits` digits (no leading zeros), so every prompt has the same length and a
    character tokenizer needs no padding.

    Args:
        num_digits: digits per operand (2 gives 8100 problems).
        num_heldout: size of the held-out split.
        seed: shuffling seed; the split is a pure function of the three arguments.

    Returns:
        `(train, heldout)`, lists of `{"prompt": "37+58=", "answer": "95"}`.
    """
    if num_digits < 1:
        raise ValueError(f"`num_digits` must be >= 1, got {num_digits}.")
    low, high = 10 ** (num_digits - 1), 10**num_digits
    problems = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(low, high) for b in range(low, high)]
    if not 0 < num_heldout < len(problems):
        raise ValueError(f"`num_heldout` must be in (0, {len(problems)}), got {num_heldout}.")
    random.Random(seed).shuffle(problems)
    return problems[num_heldout:], problems[:num_heldout]


def addition_is_correct(completion: str, answer: str) -> bool:
    """Exact match: the completion is the answer's digits and nothing else (surrounding whitespace ignored)."""
    return completion.strip() == answer


def addition_reward(completions: Sequence, answer: Sequence[str], **kwargs) -> list[float]:
    """TRL reward for the addition task: 1.0 for the exact sum, 0.0 otherwise (wrong, malformed or truncated).

    Args:
        completions: generated completions, strings (or chat messages, whose last `content` is used).
        answer: reference sums, one per completion (TRL passes the dataset column).

    Returns:
        One reward per completion.
    """
    return [float(addition_is_correct(_completion_text(c), a)) for c, a in zip(completions, answer, strict=True)]


def addition_task(num_digits: int = 2, num_heldout: int = 200, seed: int = 0) -> Task:
    """The built-in task: `num_digits`-digit addition with an exact-match reward.

    Args:
        num_digits: digits per operand.
        num_heldout: held-out prompts for the greedy accuracy.
        seed: split seed.

    Returns:
        A `Task` whose completions are at most `num_digits + 2` tokens (the sum's digits and EOS).
    """
    train, heldout = addition_problems(num_digits, num_heldout, seed)
    return Task(
        name=f"addition ({num_digits}+{num_digits} digits)",
        train=Dataset.from_list(train),
        heldout=Dataset.from_list(heldout),
        reward_fn=addition_reward,
        is_correct=addition_is_correct,
        max_completion_length=num_digits + 2,
    )


# ----------------------------------------------------------------------------------------------------------------
# Hub datasets with numeric answers (GSM8K-style)
# ----------------------------------------------------------------------------------------------------------------
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def extract_final_number(text: str) -> str | None:
    """The final numeric answer of a GSM8K-style text: the number after the last `####`, else the last number.

    Thousands separators are removed and trailing `.0`s are normalised (`"1,000.00"` -> `"1000"`).

    Args:
        text: a completion or a reference answer.

    Returns:
        The number as a canonical string, or `None` if the text has no number.
    """
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    numbers = _NUMBER.findall(text)
    if not numbers:
        return None
    number = numbers[-1].replace(",", "")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return "0" if number in ("-0", "") else number


def numeric_is_correct(completion: str, answer: str) -> bool:
    """True when the completion's final number equals the reference's final number."""
    predicted = extract_final_number(completion)
    return predicted is not None and predicted == extract_final_number(answer)


def numeric_reward(completions: Sequence, answer: Sequence[str], **kwargs) -> list[float]:
    """TRL reward for numeric-answer datasets: 1.0 when the final number matches the reference, else 0.0."""
    return [float(numeric_is_correct(_completion_text(c), a)) for c, a in zip(completions, answer, strict=True)]


def hub_dataset_task(
    name: str,
    *,
    config: str | None = None,
    split: str = "train",
    question_column: str = "question",
    answer_column: str = "answer",
    num_heldout: int = 200,
    max_train: int | None = None,
    chat: bool = False,
    instruction: str = "\nGive the final answer as a number after '####'.",
    max_completion_length: int = 256,
    seed: int = 0,
) -> Task:
    """A numeric-answer task from a Hub dataset (or a local file) loaded with `datasets.load_dataset`.

    The expected layout is GSM8K's (`load_dataset("openai/gsm8k", "main")`): a `question` column and an `answer`
    column whose final number (after `####`, else the last number in it) is the reference. A local `.json`,
    `.jsonl`, `.csv` or `.parquet` file with the same columns works offline.

    Args:
        name: Hub dataset id or local data file.
        config: dataset configuration (GSM8K: `"main"`).
        split: split to read; the held-out prompts are carved out of it.
        question_column: column holding the prompt text.
        answer_column: column holding the reference answer.
        num_heldout: held-out prompts (taken after a seeded shuffle; capped at half the rows).
        max_train: cap on the RL prompts, `None` for all.
        chat: wrap each prompt as a one-turn chat (`[{"role": "user", ...}]`) so TRL applies the chat template.
        instruction: appended to every question.
        max_completion_length: completion budget in tokens.
        seed: shuffling seed.

    Returns:
        A `Task` with `numeric_reward`.
    """
    from datasets import load_dataset

    local_formats = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}
    suffix = next((s for s in local_formats if name.endswith(s)), None)
    if suffix is not None:
        rows = load_dataset(local_formats[suffix], data_files=name, split="train")
    else:
        rows = load_dataset(name, config, split=split)
    missing = {question_column, answer_column} - set(rows.column_names)
    if missing:
        raise ValueError(
            f"Dataset {name!r} has columns {rows.column_names}; missing {sorted(missing)}. Pass "
            "`--question-column` / `--answer-column` to name the prompt and reference-answer columns."
        )

    def to_example(row: dict) -> dict:
        text = str(row[question_column]) + instruction
        prompt = [{"role": "user", "content": text}] if chat else text
        return {"prompt": prompt, "answer": str(row[answer_column])}

    rows = rows.shuffle(seed=seed)
    examples = [to_example(row) for row in rows]
    num_heldout = max(1, min(num_heldout, len(examples) // 2))
    train, heldout = examples[num_heldout:], examples[:num_heldout]
    if max_train is not None:
        train = train[:max_train]
    return Task(
        name=name,
        train=Dataset.from_list(train),
        heldout=Dataset.from_list(heldout),
        reward_fn=numeric_reward,
        is_correct=numeric_is_correct,
        max_completion_length=max_completion_length,
    )


# ----------------------------------------------------------------------------------------------------------------
# Greedy evaluation
# ----------------------------------------------------------------------------------------------------------------
def _completion_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    return str(completion[-1]["content"])  # conversational: the assistant turn


def encode_prompts(tokenizer, prompts: Sequence) -> list[list[int]]:
    """Token ids of each prompt, exactly as TRL's `GRPOTrainer` tokenizes them for generation.

    Args:
        tokenizer: the model's tokenizer.
        prompts: strings, or chat-message lists (rendered with the chat template and a generation prompt).

    Returns:
        One list of token ids per prompt.
    """
    if len(prompts) and not isinstance(prompts[0], str):
        encoded = tokenizer.apply_chat_template(
            list(prompts), add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return [list(ids) for ids in encoded["input_ids"]]
    return [list(ids) for ids in tokenizer(list(prompts))["input_ids"]]


@torch.no_grad()
def generate_greedy(
    model, tokenizer, prompts: Sequence, *, max_new_tokens: int, batch_size: int = 256
) -> list[str]:
    """Greedy completions of `prompts` (left-padded batches), decoded without special tokens.

    Args:
        model: a causal LM (`generate` is used; training mode is restored afterwards).
        tokenizer: its tokenizer; `pad_token_id` and `eos_token_id` must be set.
        prompts: strings or chat-message lists.
        max_new_tokens: completion budget.
        batch_size: prompts per `generate` call.

    Returns:
        One decoded completion per prompt.
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    completions: list[str] = []
    try:
        all_ids = encode_prompts(tokenizer, prompts)
        for start in range(0, len(all_ids), batch_size):
            chunk = all_ids[start : start + batch_size]
            width = max(len(ids) for ids in chunk)
            input_ids = torch.tensor([[pad_id] * (width - len(ids)) + ids for ids in chunk], device=device)
            attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in chunk], device=device)
            output = model.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                temperature=None,
                top_p=None,
                top_k=None,
                pad_token_id=pad_id,
                eos_token_id=tokenizer.eos_token_id,
            )
            completions += tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
    finally:
        model.train(was_training)
    return completions


def evaluate_accuracy(
    model, tokenizer, task: Task, *, dataset: Dataset | None = None, batch_size: int = 256
) -> float:
    """Greedy exact-match accuracy on the task's held-out prompts (deterministic: no sampling).

    Args:
        model: the policy.
        tokenizer: its tokenizer.
        task: supplies the held-out split, the completion budget and `is_correct`.
        dataset: prompts to score instead of `task.heldout` (same columns).
        batch_size: prompts per `generate` call.

    Returns:
        The fraction of prompts answered correctly, in [0, 1].
    """
    rows = task.heldout if dataset is None else dataset
    completions = generate_greedy(
        model, tokenizer, rows["prompt"], max_new_tokens=task.max_completion_length, batch_size=batch_size
    )
    correct = [task.is_correct(c, a) for c, a in zip(completions, rows["answer"], strict=True)]
    return sum(correct) / max(1, len(correct))
