"""Cost of the checkpoint commit step: time per save with and without it, paired.

One process, a CE-GPPO trainer on a local Llama built by `cegppo_trl.offline.tiny` (`--hidden`/`--layers` set its
size, so the checkpoint's weights and AdamW state are ~`--hidden`² × layers × 12 floats each), one training step for
a real optimizer state, then `--reps` pairs of saves of a new `checkpoint-<n>` folder: one through
`CEGPPOTrainer._save_checkpoint` as shipped (the barrier, the commit record with every file's size, fsync of the
record and the folder), one with the commit step switched off (`held_until_commit` and `commit_after_save` replaced
by no-ops: transformers' save plus `cegppo_state.json`), alternating which goes first. Each folder is deleted after
its save. Reported: the median and range of the per-pair difference and of each side's time per save.

In one process the barrier is a no-op; under DDP it adds one collective per save (one round trip). The fsync of the
commit record makes the filesystem write back what it holds of the checkpoint first (ext4 `data=ordered`), so the
figure grows with the checkpoint's size on a slow disk.

`--measure checksum` pairs the shipped save with the same save whose commit record carries sizes only (the CRC-32
of each file, `checkpoints._crc32`, replaced by a constant): the cost of the checksum alone.

Run: ``python benchmarks/bench_commit.py`` (``--reps 20 --hidden 256 --layers 4 --measure commit``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import shutil
import statistics
import tempfile
import time

import torch
from datasets import Dataset

import cegppo_trl.checkpoints as checkpoints_module
import cegppo_trl.trainer as trainer_module
from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.offline.tiny import build_char_tokenizer, build_tiny_llama


def _no_commit():
    @contextlib.contextmanager
    def held(args):
        yield {}

    return held, lambda *a, **k: None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--measure", choices=("commit", "checksum"), default="commit")
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = tempfile.mkdtemp(prefix="cegppo-bench-commit-")
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(
        tokenizer, hidden_size=args.hidden, num_layers=args.layers, intermediate_size=4 * args.hidden
    )
    config = CEGPPOConfig(
        output_dir=out, use_cpu=True, bf16=False, report_to="none", save_strategy="no", max_steps=1,
        per_device_train_batch_size=4, num_generations=4, max_completion_length=4, logging_steps=1,
        disable_tqdm=True,
    )  # fmt: skip
    trainer = CEGPPOTrainer(
        model=model, reward_funcs=lambda completions, **k: [float(len(c)) for c in completions], args=config,
        train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 8}), processing_class=tokenizer,
    )  # fmt: skip
    trainer.train()
    shipped = (trainer_module.held_until_commit, trainer_module.commit_after_save)
    crc32 = checkpoints_module._crc32
    times: dict[str, list[float]] = {"with commit": [], "without commit": []}
    step = 1000

    def save(with_commit: bool) -> float:
        nonlocal step
        step += 1
        trainer.state.global_step = step
        if args.measure == "commit":
            trainer_module.held_until_commit, trainer_module.commit_after_save = (
                shipped if with_commit else _no_commit()
            )
        else:
            checkpoints_module._crc32 = crc32 if with_commit else (lambda path: 0)
        began = time.perf_counter()
        trainer._save_checkpoint(trainer.model, None)
        elapsed = time.perf_counter() - began
        folder = os.path.join(out, f"checkpoint-{step}")
        size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(folder) for f in fs)
        shutil.rmtree(folder)
        save.size = size
        return elapsed

    save(True), save(False)  # warm-up
    for rep in range(args.reps):
        order = (True, False) if rep % 2 == 0 else (False, True)
        for with_commit in order:
            times["with commit" if with_commit else "without commit"].append(save(with_commit))
    trainer_module.held_until_commit, trainer_module.commit_after_save = shipped
    checkpoints_module._crc32 = crc32
    shutil.rmtree(out, ignore_errors=True)
    diffs = [a - b for a, b in zip(times["with commit"], times["without commit"])]

    def ms(values):
        return {
            "median_ms": round(1e3 * statistics.median(values), 2),
            "range_ms": [round(1e3 * min(values), 2), round(1e3 * max(values), 2)],
        }

    print(json.dumps({
        "date": datetime.date.today().isoformat(),
        "checkpoint_bytes": save.size,
        "reps": args.reps,
        "measure": args.measure,
        "with_commit": ms(times["with commit"]),
        "without_commit": ms(times["without commit"]),
        "difference": ms(diffs),
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()
