"""The quickstart's default policy: a seeded tiny Llama, warmed up with supervised learning on part of the task.

An RL run on a distilled model starts from a policy that solves some prompts but far from all. The default model
copies that: a character-level Llama (`demos.tiny`) is teacher-forced on a subset of the addition problems until its
greedy accuracy on a dev set (train-split problems outside the subset, never the held-out split) reaches
`target_accuracy`. It is built at first run and cached under a hash of its settings.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from .smollm2 import default_cache_dir
from .tasks import Task, addition_task, evaluate_accuracy
from .tiny import build_char_tokenizer, build_tiny_llama

# Bump when the warm-up procedure changes, so stale cached models are not reused.
WARMUP_FORMAT_VERSION = 1


@dataclass(frozen=True)
class WarmupSettings:
    """Everything that determines the default model (its cache key hashes these fields): the addition task
    (`num_digits`, `num_heldout`, `task_seed`: the split must be the RL run's), the Llama's size, the supervised
    subset (`warmup_problems`) and the dev set that decides when to stop (`dev_problems`, `target_accuracy`,
    `eval_every` steps, at most `max_steps`), AdamW's constant `learning_rate`, `batch_size` and the `seed`."""

    num_digits: int = 2
    num_heldout: int = 200
    task_seed: int = 0
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 256
    warmup_problems: int = 2000
    dev_problems: int = 200
    target_accuracy: float = 0.3
    max_steps: int = 1500
    eval_every: int = 25
    batch_size: int = 64
    learning_rate: float = 1e-3
    seed: int = 0

    def cache_key(self) -> str:
        """A short hash of the settings and the warm-up format version."""
        payload = json.dumps({"version": WARMUP_FORMAT_VERSION, **dataclasses.asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def _teacher_forcing_batch(tokenizer, rows: list[dict]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`prompt + solution + EOS`, left-padded; labels only on the solution and EOS (the prompt is given)."""
    sequences, labels = [], []
    for row in rows:
        prompt = tokenizer(row["prompt"])["input_ids"]
        target = tokenizer(row["solution"])["input_ids"] + [tokenizer.eos_token_id]
        sequences.append(prompt + target)
        labels.append([-100] * len(prompt) + target)
    width = max(len(s) for s in sequences)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in sequences])  # [B, T]
    label_ids = torch.tensor([[-100] * (width - len(x)) + x for x in labels])  # [B, T]
    attention_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in sequences])  # [B, T]
    return input_ids, attention_mask, label_ids


def supervised_warmup(model, tokenizer, task: Task, settings: WarmupSettings, *, log=print) -> dict:
    """Teacher-forced training of `model` in place on a seeded subset of `task.train` until the dev accuracy reaches
    the target; `{"steps", "dev_accuracy", "seconds"}`. `log`: where progress lines go (None: silent)."""
    rng = random.Random(settings.seed)
    order = list(range(len(task.train)))
    rng.shuffle(order)
    subset = [task.train[i] for i in order[: settings.warmup_problems]]
    dev = Dataset.from_list([task.train[i] for i in order[settings.warmup_problems :][: settings.dev_problems]])

    torch.manual_seed(settings.seed)
    generator = torch.Generator().manual_seed(settings.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    model.train()
    start = time.perf_counter()
    step, dev_accuracy = 0, evaluate_accuracy(model, tokenizer, task, dataset=dev)
    while dev_accuracy < settings.target_accuracy and step < settings.max_steps:
        for _ in range(settings.eval_every):
            index = torch.randint(len(subset), (settings.batch_size,), generator=generator)
            input_ids, attention_mask, labels = _teacher_forcing_batch(tokenizer, [subset[i] for i in index])
            loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            step += 1
        dev_accuracy = evaluate_accuracy(model, tokenizer, task, dataset=dev)
        if log is not None:
            log(f"  warm-up step {step:4d}  loss {loss.item():.3f}  dev accuracy {dev_accuracy:.1%}")
    model.eval()
    return {"steps": step, "dev_accuracy": dev_accuracy, "seconds": time.perf_counter() - start}


def build_default_model(
    settings: WarmupSettings | None = None,
    *,
    cache_dir: str | os.PathLike | None = None,
    rebuild: bool = False,
    log=print,
) -> tuple[torch.nn.Module, PreTrainedTokenizerFast, dict]:
    """The quickstart's default policy, from `<cache_dir>/quickstart/<hash>/` (default root `default_cache_dir()`) or
    built deterministically and cached there (always with `rebuild`).

    Returns:
        `(model, tokenizer, info)`: the Llama in eval mode, its character tokenizer and the warm-up record (`steps`,
        `dev_accuracy`, `seconds`, `cached`, `path`, `settings`, `num_parameters`).
    """
    settings = settings or WarmupSettings()
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path = root / "quickstart" / settings.cache_key()
    record_file = path / "warmup.json"
    if record_file.exists() and not rebuild:
        model = AutoModelForCausalLM.from_pretrained(path)
        tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
        info = json.loads(record_file.read_text())
        if log is not None:
            log(f"Loaded the warmed-up default model from {path}")
        return model.eval(), tokenizer, {**info, "cached": True, "path": str(path)}

    if log is not None:
        log(f"Building the default model (seeded tiny Llama + supervised warm-up), cached in {path}")
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, hidden_size=settings.hidden_size, num_layers=settings.num_layers,
                             num_heads=settings.num_heads, intermediate_size=settings.intermediate_size,
                             max_position_embeddings=64, seed=settings.seed)  # fmt: skip
    task = addition_task(settings.num_digits, settings.num_heldout, settings.task_seed)
    info = supervised_warmup(model, tokenizer, task, settings, log=log)
    info["settings"] = dataclasses.asdict(settings)
    info["num_parameters"] = sum(p.numel() for p in model.parameters())
    # Write to a temporary folder and rename, so an interrupted run never leaves a half-written cache entry.
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "warmup.json").write_text(json.dumps(info, indent=2))
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return model, tokenizer, {**info, "cached": False, "path": str(path)}
