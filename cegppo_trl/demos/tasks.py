"""Verifiable tasks: built-in addition (plain or as chats), or a GSM8K-style Hub dataset; their rewards; greedy eval.

Both splits of a task have the columns `prompt` (a string, or chat messages) and `solution` (the reference answer,
the column `cegppo_trl.rewards` reads; TRL passes it to the reward function as a keyword argument).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from datasets import Dataset

from ..rewards import completion_text, extract_gsm8k_answer, extract_gsm8k_gold, get_reward_func


@dataclass
class Task:
    """A verifiable task: `train` (RL prompts) and `heldout` splits with columns `prompt` and `solution`, a TRL reward
    function `(completions, solution, **kwargs) -> list[float]`, the held-out accuracy's `is_correct(completion,
    solution)`, and the completion budget in tokens."""

    name: str
    train: Dataset
    heldout: Dataset
    reward_fn: Callable[..., list[float]]
    is_correct: Callable[[str, str], bool]
    max_completion_length: int


def _reward(is_correct: Callable[[str, str], bool], name: str) -> Callable[..., list[float]]:
    """The TRL reward of an exact-match check: 1.0 where it holds, else 0.0 (strings or chat-message completions)."""

    def reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
        return [float(is_correct(completion_text(c), s)) for c, s in zip(completions, solution, strict=True)]

    reward.__name__ = reward.__qualname__ = name  # TRL logs each reward under its name
    reward.reward_range = (0.0, 1.0)  # the zero-signal warning tells all-wrong from all-right with it
    return reward


def _task(name: str, problems: list[dict], num_heldout: int, seed: int, is_correct, reward_fn, max_length) -> Task:
    if not 0 < num_heldout < len(problems):
        raise ValueError(f"`num_heldout` must be in (0, {len(problems)}), got {num_heldout}.")
    random.Random(seed).shuffle(problems)
    train, heldout = Dataset.from_list(problems[num_heldout:]), Dataset.from_list(problems[:num_heldout])
    return Task(name, train, heldout, reward_fn, is_correct, max_length)


# Built-in task: multi-digit addition, "37+58=" -> "95" then EOS. Operands have exactly `num_digits` digits, so every
# prompt has the same length and a character tokenizer needs no padding.
def addition_problems(num_digits: int = 2, num_heldout: int = 200, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """`(train, heldout)`: every `num_digits`-digit + `num_digits`-digit sum (2: 8100 problems), shuffled with `seed`
    and split, as `{"prompt": "37+58=", "solution": "95"}`."""
    task = addition_task(num_digits, num_heldout, seed)
    return task.train.to_list(), task.heldout.to_list()


def addition_is_correct(completion: str, solution: str) -> bool:
    """Exact match: the completion is the sum's digits and nothing else (surrounding whitespace ignored)."""
    return completion.strip() == str(solution).strip()


addition_reward = _reward(addition_is_correct, "addition_reward")


def addition_task(num_digits: int = 2, num_heldout: int = 200, seed: int = 0) -> Task:
    """`num_digits`-digit addition with an exact-match reward; completions are the sum's digits and EOS."""
    if num_digits < 1:
        raise ValueError(f"`num_digits` must be >= 1, got {num_digits}.")
    low, high = 10 ** (num_digits - 1), 10**num_digits
    problems = [{"prompt": f"{a}+{b}=", "solution": str(a + b)} for a in range(low, high) for b in range(low, high)]
    return _task(f"addition ({num_digits}+{num_digits} digits)", problems, num_heldout, seed, addition_is_correct,
                 addition_reward, num_digits + 2)  # fmt: skip


# Chat addition for a real pretrained model. SmolLM2-135M-Instruct answers it correctly about 60% of the time when
# decoding greedily but about 1 time in 8 when sampling at T = 1: the skill is there for RL to sharpen, and the reward
# is non-zero from the first batch (a `\boxed{}` reward on 1-20 addition scored 0 in 96 samples).
def chat_addition_is_correct(completion: str, solution: str) -> bool:
    """The reply's last integer equals the sum (a chat model may say "3 + 5 = 8." or just "8")."""
    numbers = re.findall(r"-?\d+", completion)
    return bool(numbers) and numbers[-1] == str(solution).strip()


chat_addition_reward = _reward(chat_addition_is_correct, "chat_addition_reward")


def chat_addition_task(num_digits: int = 1, num_heldout: int = 40, max_completion_length: int = 16,
                       seed: int = 0) -> Task:  # fmt: skip
    """Additions as one-turn chats, "What is 3 + 5? Answer with just the number." (operands 0 .. 10^d - 1)."""
    top = 10**num_digits
    question = "What is {} + {}? Answer with just the number."
    problems = [{"prompt": [{"role": "user", "content": question.format(a, b)}], "solution": str(a + b)}
                for a in range(top) for b in range(top)]  # fmt: skip
    return _task(f"chat addition ({num_digits}+{num_digits} digits)", problems, num_heldout, seed,
                 chat_addition_is_correct, chat_addition_reward, max_completion_length)  # fmt: skip


def numeric_is_correct(completion: str, solution: str) -> bool:
    """The completion's final number (`\\boxed{}`, else after `####`, else the last number) equals the reference's,
    by the extraction of `cegppo_trl.rewards`' `gsm8k` rewards."""
    predicted = extract_gsm8k_answer(completion)
    return predicted is not None and predicted == extract_gsm8k_gold(solution)


def hub_dataset_task(name: str, *, config: str | None = None, split: str = "train", question_column: str = "question",
                     answer_column: str = "answer", num_heldout: int = 200, max_train: int | None = None,
                     chat: bool = False, instruction: str = "\nGive the final answer as a number after '####'.",
                     max_completion_length: int = 256, seed: int = 0) -> Task:  # fmt: skip
    """A numeric-answer task from a Hub dataset, a local data file or a `save_to_disk` folder, GSM8K's layout
    (`load_dataset("openai/gsm8k", "main")`): a question column and an answer column whose final number is the
    reference; `cegppo_trl.rewards`' `gsm8k_01` reward.

    Args:
        name: Hub dataset id or local path.
        config: dataset configuration (GSM8K: `"main"`).
        split: split to read; the held-out prompts (at most half the rows) are carved out of it after a shuffle.
        question_column, answer_column: the prompt and reference-answer columns.
        num_heldout: held-out prompts.
        max_train: cap on the RL prompts (None: all).
        chat: each prompt as a one-turn chat, so TRL applies the chat template.
        instruction: appended to every question.
        max_completion_length: completion budget in tokens.
        seed: shuffling seed.
    """
    from ..scripts import load_any_dataset  # the CLI's loader: Hub id, data file or saved dataset

    rows = load_any_dataset(name, config=config, train_split=split)[split]
    if missing := {question_column, answer_column} - set(rows.column_names):
        raise ValueError(
            f"Dataset {name!r} has columns {rows.column_names}; missing {sorted(missing)}. Pass "
            "`--question-column` / `--answer-column` to name the prompt and reference-answer columns."
        )

    def to_example(row: dict) -> dict:
        text = str(row[question_column]) + instruction
        return {"prompt": [{"role": "user", "content": text}] if chat else text, "solution": str(row[answer_column])}

    examples = [to_example(row) for row in rows.shuffle(seed=seed)]
    num_heldout = max(1, min(num_heldout, len(examples) // 2))
    train = examples[num_heldout:][:max_train]
    return Task(name, Dataset.from_list(train), Dataset.from_list(examples[:num_heldout]),
                get_reward_func("gsm8k_01"), numeric_is_correct, max_completion_length)  # fmt: skip


# ----------------------------------------------------------------------------------------------------------------
# Greedy evaluation
# ----------------------------------------------------------------------------------------------------------------
def encode_prompts(tokenizer, prompts: Sequence) -> list[list[int]]:
    """Token ids of each prompt (a string, or chat messages rendered with a generation prompt), as TRL's
    `GRPOTrainer` tokenizes them for generation."""
    if len(prompts) and not isinstance(prompts[0], str):
        encoded = tokenizer.apply_chat_template(list(prompts), add_generation_prompt=True, tokenize=True,
                                                return_dict=True)  # fmt: skip
        return [list(ids) for ids in encoded["input_ids"]]
    return [list(ids) for ids in tokenizer(list(prompts))["input_ids"]]


@torch.no_grad()
def generate_greedy(model, tokenizer, prompts: Sequence, *, max_new_tokens: int, batch_size: int = 256) -> list[str]:
    """Greedy completions of `prompts` in left-padded batches of `batch_size`, decoded without special tokens (the
    model's training mode is restored after)."""
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
            output = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens,
                                    do_sample=False, temperature=None, top_p=None, top_k=None, pad_token_id=pad_id,
                                    eos_token_id=tokenizer.eos_token_id)  # fmt: skip
            completions += tokenizer.batch_decode(output[:, width:], skip_special_tokens=True)
    finally:
        model.train(was_training)
    return completions


def evaluate_accuracy(model, tokenizer, task: Task, *, dataset: Dataset | None = None, batch_size: int = 256) -> float:
    """Greedy exact-match accuracy (`task.is_correct`) on `dataset` (default: `task.heldout`), in [0, 1]."""
    rows = task.heldout if dataset is None else dataset
    completions = generate_greedy(model, tokenizer, rows["prompt"], max_new_tokens=task.max_completion_length,
                                  batch_size=batch_size)  # fmt: skip
    correct = [task.is_correct(c, s) for c, s in zip(completions, rows["solution"], strict=True)]
    return sum(correct) / max(1, len(correct))
