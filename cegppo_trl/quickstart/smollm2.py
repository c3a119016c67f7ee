"""The quickstart on a real pretrained model: SmolLM2-135M-Instruct on small chat additions (`--model smollm2`).

SmolLM2-135M-Instruct answers "What is 3 + 5? Answer with just the number." correctly about 60% of the time when
decoding greedily but only about 1 time in 8 when sampling at T = 1: the skill is there and RL can sharpen it. Its
reward is non-zero from the first batch, which a task the model never solves would not give (a `\\boxed{}`
exact-answer reward on 1-20 addition scored 0 in 96 samples).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from datasets import Dataset

from ..rewards import completion_text
from .task import Task

__all__ = [
    "SMOLLM2_STEPS",
    "SMOLLM2_TRAINING",
    "chat_addition_is_correct",
    "chat_addition_reward",
    "chat_addition_task",
    "load_smollm2",
]

_INTEGER = re.compile(r"-?\d+")

# Training settings for `--model smollm2` on CPU (two cores), the CE-GPPO arm of examples/real_model_entropy.py:
# 4 prompts x 8 samples per rollout batch, <= 16-token answers, 8 optimizer steps of 4 completions per batch (the
# paper's 8 steps per batch: off-policy, so the ratio leaves 1 and clipping happens), constant lr 1e-5.
SMOLLM2_TRAINING: dict = {
    "per_device_train_batch_size": 4,
    "gradient_accumulation_steps": 1,
    "steps_per_generation": 8,
    "num_generations": 8,
    "temperature": 1.0,
    "learning_rate": 1e-5,
    "lr_scheduler_type": "constant",
    "warmup_steps": 0,
    "weight_decay": 0.0,
    "max_grad_norm": 1.0,
    "beta": 0.0,
}


# Optimizer steps of the default `--model smollm2` run: 6 rollout batches.
SMOLLM2_STEPS = 48


def chat_addition_is_correct(completion: str, solution: str) -> bool:
    """The reply's last integer equals the sum (a chat model may say "3 + 5 = 8." or just "8")."""
    numbers = _INTEGER.findall(completion)
    return bool(numbers) and numbers[-1] == str(solution).strip()


def chat_addition_reward(completions: Sequence, solution: Sequence[str], **kwargs) -> list[float]:
    """TRL reward: 1.0 when the completion's last integer is the sum, else 0.0 (strings or chat messages)."""
    return [
        float(chat_addition_is_correct(completion_text(c), s)) for c, s in zip(completions, solution, strict=True)
    ]


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


def load_smollm2(cache_dir=None):
    """SmolLM2-135M-Instruct in fp32 and its tokenizer (left padding), via `cegppo_trl.models.smollm2_checkpoint`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..models import smollm2_checkpoint

    path = smollm2_checkpoint(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return model, tokenizer, path
