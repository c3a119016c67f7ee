"""The second study's testbed: "write 4 digits whose sum is S, each with its running total", many answers per prompt.

Why this task (examples/entropy_study/RESULTS.md, "Second study"): the first study's addition task has one right answer per
prompt and completions of at most 4 tokens, so entropy can only fall as accuracy rises. Here a prompt `4/18:` asks
for a trace like `5:5, 4:9, 7:16, 2:18` (19-23 tokens with EOS): four free digits (the forks, where low-probability
tokens live) and mostly determined tokens (running totals, separators), like a short reasoning trace. Each prompt
has 84-670 correct answers, so a policy can keep full reward while staying diverse or collapse onto a few, and 32
samples per prompt can tell the two apart. (Plain "16 digits summing to S" was tried first: ~10^14 answers per
prompt, so 32 samples were always 32 distinct strings and the diversity measure could not move.)

The pieces:

- `digit_task`: the RL prompts (every S in `SUMS`, repeated), the probe prompts and the reward.
- `build_testbed_model`: the quickstart's tiny character-level Llama, warmed up with teacher forcing on
  *uniformly random* correct strings (exact sampling by dynamic programming), so it starts diverse and with a
  non-zero reward; cached under the quickstart's cache root.
- `probe`: sampled diversity on a fixed probe set with a private RNG (training's random stream is untouched).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch
from datasets import Dataset

__all__ = [
    "NUM_DIGITS",
    "PROBE_SUMS",
    "SUMS",
    "DigitTask",
    "TestbedSettings",
    "build_testbed_model",
    "digit_reward",
    "digit_task",
    "is_valid",
    "pass_at_k",
    "probe",
    "sample_valid",
]

NUM_DIGITS = 4
# Sums 6..30: from 84 (S = 6, 30) to 670 (S = 18) correct answers per prompt, so 32 samples can show a collapse.
SUMS = tuple(range(6, 31))
PROBE_SUMS = tuple(range(6, 31, 2))  # 13 of them, spread over the range; also trained on (diversity, not transfer)


def prompt_text(target_sum: int, num_digits: int = NUM_DIGITS) -> str:
    """`4/18:` asks for 4 digits whose sum is 18, each followed by the running total."""
    return f"{num_digits}/{target_sum}:"


def format_trace(digits: Sequence[int]) -> str:
    """`[3, 5, 0, 9]` -> `3:3, 5:8, 0:8, 9:17`: each digit, a colon and the running total (18-22 characters)."""
    total, items = 0, []
    for d in digits:
        total += d
        items.append(f"{d}:{total}")
    return ", ".join(items)


def parse_trace(completion: str, num_digits: int = NUM_DIGITS) -> list[int] | None:
    """The digits of a well-formed trace with correct running totals, else None."""
    items = completion.strip().split(", ")
    if len(items) != num_digits:
        return None
    digits, total = [], 0
    for item in items:
        d, sep, t = item.partition(":")
        if not sep or len(d) != 1 or not d.isdigit() or not t.isdigit() or t != str(total + int(d)):
            return None
        total += int(d)
        digits.append(int(d))
    return digits


def is_valid(completion: str, target_sum: int, num_digits: int = NUM_DIGITS) -> bool:
    """A well-formed trace of exactly `num_digits` digits, every running total right, the last one `target_sum`."""
    digits = parse_trace(completion, num_digits)
    return digits is not None and sum(digits) == target_sum


def digit_reward(completions: Sequence, target_sum: Sequence[int], num_digits: Sequence[int], **kwargs) -> list[float]:
    """TRL reward: 1.0 for a correct trace, else 0.0 (wrong sum or total, malformed, truncated)."""
    from cegppo_trl.rewards import completion_text

    return [
        float(is_valid(completion_text(c), int(s), int(n)))
        for c, s, n in zip(completions, target_sum, num_digits, strict=True)
    ]


@cache
def _count(num_digits: int, target_sum: int) -> int:
    """Number of `num_digits`-digit strings (leading zeros allowed) whose digits sum to `target_sum`."""
    if num_digits == 0:
        return int(target_sum == 0)
    if target_sum < 0 or target_sum > 9 * num_digits:
        return 0
    return sum(_count(num_digits - 1, target_sum - d) for d in range(10))


def sample_valid(target_sum: int, rng: random.Random, num_digits: int = NUM_DIGITS) -> str:
    """A correct trace drawn uniformly from all correct ones (digit by digit, weighted by the completions left)."""
    if _count(num_digits, target_sum) == 0:
        raise ValueError(f"No {num_digits}-digit string sums to {target_sum}.")
    out, left = [], target_sum
    for position in range(num_digits, 0, -1):
        weights = [_count(position - 1, left - d) for d in range(10)]
        digit = rng.choices(range(10), weights=weights)[0]
        out.append(digit)
        left -= digit
    return format_trace(out)


@dataclass
class DigitTask:
    """RL prompts (`prompt`, `target_sum`, `num_digits` columns; TRL passes the last two to the reward), the probe
    sums, and the completion budget (at most 22 characters + EOS, plus slack so over-long ones are scored 0)."""

    train: Dataset
    probe_sums: tuple[int, ...]
    num_digits: int = NUM_DIGITS
    max_completion_length: int = 26
    reward_fn = staticmethod(digit_reward)


def digit_task(repeats: int = 400) -> DigitTask:
    """Every sum in `SUMS` repeated `repeats` times (TRL shuffles them with the run's data seed)."""
    rows = [
        {"prompt": prompt_text(s), "target_sum": s, "num_digits": NUM_DIGITS} for _ in range(repeats) for s in SUMS
    ]
    return DigitTask(train=Dataset.from_list(rows), probe_sums=PROBE_SUMS)


# ----------------------------------------------------------------------------------------------------------------
# Probes: sampled diversity on a fixed prompt set, private RNG
# ----------------------------------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples with `c` correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}.")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


@torch.no_grad()
def probe(model, tokenizer, sums: Sequence[int], *, samples: int = 32, seed: int = 1234, num_digits: int = NUM_DIGITS,
          max_new_tokens: int = 26) -> dict:  # fmt: skip
    """Sample `samples` completions per probe prompt at temperature 1 and measure their diversity.

    The sampling uses a forked RNG seeded with `seed`, so it neither draws from nor disturbs the training run's
    random stream (arms stay paired by seed) and every probe of every arm uses the same random numbers.

    Returns:
        `validity` (= pass@1, mean over prompts), `pass@8`, `distinct_correct` (distinct correct strings per prompt,
        mean over prompts; at most `samples`) and `distinct` (distinct strings of any kind per prompt).
    """
    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id
    prompts = [prompt_text(s, num_digits) for s in sums for _ in range(samples)]
    ids = tokenizer(prompts)["input_ids"]
    width = max(map(len, ids))
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    attention_mask = (input_ids != pad).long()
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = model.generate(
                input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, do_sample=True,
                temperature=1.0, top_p=1.0, top_k=0, pad_token_id=pad, eos_token_id=tokenizer.eos_token_id,
            )  # fmt: skip
    finally:
        model.train(was_training)
    texts = [t.strip() for t in tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)]
    validity, pass8, distinct_correct, distinct = [], [], [], []
    for i, s in enumerate(sums):
        group = texts[i * samples : (i + 1) * samples]
        ok = [t for t in group if is_valid(t, s, num_digits)]
        validity.append(len(ok) / samples)
        pass8.append(pass_at_k(samples, len(ok), min(8, samples)))
        distinct_correct.append(len(set(ok)))
        distinct.append(len(set(group)))

    def mean(xs):
        return sum(xs) / len(xs)

    return {
        "validity": mean(validity),
        "pass@8": mean(pass8),
        "distinct_correct": mean(distinct_correct),
        "distinct": mean(distinct),
    }


# ----------------------------------------------------------------------------------------------------------------
# The warmed-up model
# ----------------------------------------------------------------------------------------------------------------
WARMUP_FORMAT_VERSION = 2  # 2: the running-total trace format


@dataclass(frozen=True)
class TestbedSettings:
    """Everything that determines the starting policy (the cache key hashes these fields).

    The architecture is the quickstart's default tiny Llama (hidden 64, 2 layers, 4 heads, MLP 256). The warm-up
    trains with teacher forcing on uniformly random correct strings for random sums in `SUMS` and stops once the
    sampled validity on the probe set reaches `target_validity`: the policy then solves some prompts, spread over
    a huge number of different strings (high entropy), like a distilled model before RL.
    """

    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    target_validity: float = 0.2
    max_steps: int = 3000
    eval_every: int = 50
    batch_size: int = 64
    learning_rate: float = 2e-3
    seed: int = 0

    def cache_key(self) -> str:
        payload = json.dumps({"version": WARMUP_FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


# The small model for tests and --quick (a ~30 k parameter Llama, a few seconds of warm-up; barely valid).
SMALL_TESTBED = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "target_validity": 0.02,
    "max_steps": 200,
    "eval_every": 50,
}


def _warmup(model, tokenizer, settings: TestbedSettings, log) -> dict:
    rng = random.Random(settings.seed)
    torch.manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    start = time.perf_counter()
    step, stats = 0, probe(model, tokenizer, PROBE_SUMS, samples=16, seed=settings.seed)
    while stats["validity"] < settings.target_validity and step < settings.max_steps:
        model.train()
        for _ in range(settings.eval_every):
            sequences, labels = [], []
            for _ in range(settings.batch_size):
                s = rng.choice(SUMS)
                prompt = tokenizer(prompt_text(s))["input_ids"]
                target = tokenizer(sample_valid(s, rng))["input_ids"] + [eos]
                sequences.append(prompt + target)
                labels.append([-100] * len(prompt) + target)
            width = max(map(len, sequences))
            input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in sequences])
            label_ids = torch.tensor([[-100] * (width - len(x)) + x for x in labels])
            loss = model(input_ids=input_ids, attention_mask=(input_ids != pad).long(), labels=label_ids).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        stats = probe(model, tokenizer, PROBE_SUMS, samples=16, seed=settings.seed)
        if log is not None:
            log(f"  warm-up step {step:4d}  loss {loss.item():.3f}  sampled validity {stats['validity']:.1%}  "
                f"distinct correct/prompt {stats['distinct_correct']:.1f}")  # fmt: skip
    model.eval()
    return {"steps": step, "seconds": time.perf_counter() - start, **{f"probe_{k}": v for k, v in stats.items()}}


def build_testbed_model(settings: TestbedSettings | None = None, *, cache_dir=None, log=print):
    """Load the warmed-up testbed policy from the cache, or build it (deterministic for given settings) and cache it.

    Returns:
        `(model, tokenizer, info)`; `info` has the warm-up record, `num_parameters` and `cached`.
    """
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama
    from cegppo_trl.demos.warmup import default_cache_dir

    settings = settings or TestbedSettings()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "entropy_study_digits" / settings.cache_key()
    if (path / "warmup.json").exists():
        info = json.loads((path / "warmup.json").read_text())
        model = AutoModelForCausalLM.from_pretrained(path).eval()
        return model, PreTrainedTokenizerFast.from_pretrained(path), {**info, "cached": True}
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(
        tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers, num_heads=settings.num_heads,
        intermediate_size=settings.intermediate_size, max_position_embeddings=64, seed=settings.seed,
    )  # fmt: skip
    if log is not None:
        log(f"Warming up the testbed model (cached in {path})")
    info = _warmup(model, tokenizer, settings, log)
    info["num_parameters"] = sum(p.numel() for p in model.parameters())
    info["settings"] = dataclasses.asdict(settings)
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmup.json").write_text(json.dumps(info, indent=2))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        import shutil

        shutil.rmtree(path)
    tmp.rename(path)
    return model, tokenizer, {**info, "cached": False}
