"""Verifiable tasks: built-in addition (plain or as chats), or a GSM8K-style Hub dataset; their rewards; greedy eval.

A task is a train split (RL prompts), a held-out split (greedy accuracy before, during and after training), a
TRL reward function and the exact-match check that the accuracy counts. Both splits have the columns `prompt`
(a string, or a list of chat messages for chat models) and `solution` (the reference answer, a string: the column
name `cegppo_trl.rewards` uses); TRL passes `solution` to the reward function as a keyword argument.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from datasets import Dataset

from ..rewards import completion_text, extract_gsm8k_answer, extract_gsm8k_gold, get_reward_func

__all__ = [
    "Task",
    "addition_is_correct",
    "addition_problems",
    "addition_reward",
    "addition_task",
    "chat_addition_is_correct",
    "chat_addition_reward",
    "chat_addition_task",
    "encode_prompts",
    "evaluate_accuracy",
    "generate_greedy",
    "hub_dataset_task",
    "numeric_is_correct",
]


@dataclass
class Task:
    """A verifiable task: prompts, reference answers, reward and exact-match check.

    Attributes:
        name: short name shown in summaries.
        train: RL prompts, columns `prompt` and `solution`.
        heldout: held-out prompts for the greedy accuracy, same columns, disjoint from `train`.
        reward_fn: TRL reward function `(completions, solution, **kwargs) -> list[float]`.
        is_correct: `(completion, solution) -> bool`, the held-out accuracy's criterion.
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
        `(train, heldout)`, lists of `{"prompt": "37+58=", "solution": "95"}`.
    """
    if num_digits < 1:
        raise ValueError(f"`num_digits` must be >= 1, got {num_digits}.")
    low, high = 10 ** (num_digits - 1), 10**num_digits
    problems = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(low, high) for b in range(low, high)]
    if not 0 < num_heldout < len(problems):
        raise ValueError(f"`num_heldout` must be in (0, {len(problems)}), got {num_heldout}.")
    random.Random(seed).shuffle(problems)
    return problems[num_heldout:], problems[:num_heldout]


def addition_is_correct(completion: str, solution: str) -> bool:
    """Exact match: the completion is the sum's digits and nothing else (surrounding whitespace ignored)."""
    return completion.strip() == str(solution).strip()


def addition_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """TRL reward for the addition task: 1.0 for the exact sum, 0.0 otherwise (wrong, malformed or truncated).

    A completion that runs out of tokens before EOS has extra characters or none, so it scores 0 like a wrong sum.

    Args:
        completions: generated completions, strings or chat-message lists (TRL's two formats).
        solution: reference sums, one per completion (TRL passes the dataset column).

    Returns:
        One reward per completion.
    """
    return [float(addition_is_correct(completion_text(c), s)) for c, s in zip(completions, solution, strict=True)]


addition_reward.reward_range = (0.0, 1.0)  # the zero-signal warning tells all-wrong from all-right with it


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
# Chat addition for a real pretrained model: "What is 3 + 5? Answer with just the number."
# ----------------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct answers this correctly about 60% of the time when decoding greedily but only about 1 time in 8
# when sampling at T = 1: the skill is there and RL can sharpen it. Its reward is non-zero from the first batch,
# which a task the model never solves would not give (a `\boxed{}` exact-answer reward on 1-20 addition scored 0
# in 96 samples).
_INTEGER = re.compile(r"-?\d+")


def chat_addition_is_correct(completion: str, solution: str) -> bool:
    """The reply's last integer equals the sum (a chat model may say "3 + 5 = 8." or just "8")."""
    numbers = _INTEGER.findall(completion)
    return bool(numbers) and numbers[-1] == str(solution).strip()


def chat_addition_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """TRL reward: 1.0 when the completion's last integer is the sum, else 0.0 (strings or chat messages)."""
    return [float(chat_addition_is_correct(completion_text(c), s)) for c, s in zip(completions, solution, strict=True)]


def chat_addition_task(
    num_digits: int = 1, num_heldout: int = 40, max_completion_length: int = 16, seed: int = 0
) -> Task:
    """Additions asked as one-turn chats: "What is 3 + 5? Answer with just the number." (operands 0 .. 10^d - 1).

    Args:
        num_digits: digits per operand (1: the 100 sums of 0-9 + 0-9).
        num_heldout: held-out prompts for the greedy accuracy.
        max_completion_length: completion budget in tokens.
        seed: shuffling seed of the split.

    Returns:
        A `Task` whose prompts are chat-message lists (TRL applies the chat template).
    """
    top = 10**num_digits
    problems = [
        {
            "prompt": [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}],
            "solution": str(a + b),
        }
        for a in range(top)
        for b in range(top)
    ]
    if not 0 < num_heldout < len(problems):
        raise ValueError(f"`num_heldout` must be in (0, {len(problems)}), got {num_heldout}.")
    random.Random(seed).shuffle(problems)
    return Task(
        name=f"chat addition ({num_digits}+{num_digits} digits)",
        train=Dataset.from_list(problems[num_heldout:]),
        heldout=Dataset.from_list(problems[:num_heldout]),
        reward_fn=chat_addition_reward,
        is_correct=chat_addition_is_correct,
        max_completion_length=max_completion_length,
    )


# ----------------------------------------------------------------------------------------------------------------
# Hub datasets with numeric answers (GSM8K-style)
# ----------------------------------------------------------------------------------------------------------------
def numeric_is_correct(completion: str, solution: str) -> bool:
    """The completion's final number (`\\boxed{}`, else after `####`, else the last number) equals the reference's.

    Uses the same extraction as the `gsm8k` rewards of `cegppo_trl.rewards`.
    """
    predicted = extract_gsm8k_answer(completion)
    return predicted is not None and predicted == extract_gsm8k_gold(solution)


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
    column whose final number (after `####`, else the last number in it) is the reference. A local data file
    (`.json`, `.jsonl`, `.csv`, `.parquet`, `.arrow`) or `save_to_disk` folder with the same columns works offline. The reward is
    `cegppo_trl.rewards`' `gsm8k_01`: 1 when the completion's final number matches, else 0.

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
        A `Task` with the `gsm8k_01` reward and `numeric_is_correct`.
    """
    from ..scripts import load_any_dataset  # the CLI's loader: Hub id, data file or saved dataset

    rows = load_any_dataset(name, config=config, train_split=split)[split]
    missing = {question_column, answer_column} - set(rows.column_names)
    if missing:
        raise ValueError(
            f"Dataset {name!r} has columns {rows.column_names}; missing {sorted(missing)}. Pass "
            "`--question-column` / `--answer-column` to name the prompt and reference-answer columns."
        )

    def to_example(row: dict) -> dict:
        text = str(row[question_column]) + instruction
        prompt = [{"role": "user", "content": text}] if chat else text
        return {"prompt": prompt, "solution": str(row[answer_column])}

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
        reward_fn=get_reward_func("gsm8k_01"),
        is_correct=numeric_is_correct,
        max_completion_length=max_completion_length,
    )


# ----------------------------------------------------------------------------------------------------------------
# Greedy evaluation
# ----------------------------------------------------------------------------------------------------------------
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
def generate_greedy(model, tokenizer, prompts: Sequence, *, max_new_tokens: int, batch_size: int = 256) -> list[str]:
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


def evaluate_accuracy(model, tokenizer, task: Task, *, dataset: Dataset | None = None, batch_size: int = 256) -> float:
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
    correct = [task.is_correct(c, s) for c, s in zip(completions, rows["solution"], strict=True)]
    return sum(correct) / max(1, len(correct))
