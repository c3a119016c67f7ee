"""One training run of one trainer in a process of its own, for whole-process comparisons (wall time, peak RSS).

`bench_train_step.build_trainer`'s set-up (the same model, prompts, reward, seed, off-policy layout and forced
completion length for both trainers), `--steps` optimizer steps. Time it against the other trainer from outside, e.g.
with ``/usr/bin/time -v`` alternately, A B A B ...; it prints its own peak RSS (``ru_maxrss``) and train() time.

Run: ``python benchmarks/train_once.py cegppo --model tiny --steps 8`` (or ``grpo``; ``--model smollm2``).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time

import torch
from bench_train_step import build_trainer, quiet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trainer", choices=["cegppo", "grpo"])
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    quiet()
    torch.set_num_threads(args.threads)
    kwargs = {}
    if args.model == "smollm2":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from cegppo_trl.demos.smollm2 import smollm2_checkpoint

        path = smollm2_checkpoint()
        kwargs = dict(
            tokenizer=AutoTokenizer.from_pretrained(path), completion_length=16, learning_rate=1e-5,
            model_factory=lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        )  # fmt: skip
    trainer = build_trainer(args.trainer, output_dir=tempfile.mkdtemp(), steps=args.steps, **kwargs)
    start = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - start
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{args.trainer} {args.model}: train() {seconds:.2f} s, peak RSS {peak_mib:.1f} MiB")


if __name__ == "__main__":
    main()
