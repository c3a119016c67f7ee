"""The two measurements behind `max_zero_signal_batches`' default (docs/configuration.md).

1. Drop-in use: TRL's own test `test_reward_metric_reflects_reward_weights` (TRL 1.16, tests/test_grpo_trainer.py)
   trains on two constant rewards with TRL's defaults over the 17 training prompts of `trl-internal-testing/zen`,
   3 completions per rollout batch (1 prompt), 3 epochs. The script runs that layout through `CEGPPOTrainer` (a tiny
   local model for TRL's tiny Qwen2, no Hub) and counts the consecutive zero-signal rollout batches: the default must
   be above it.
2. Sparse rewards: a policy that solves few prompts at first starts with a streak of all-wrong batches. The script
   warms the built-in tiny Llama up to a low greedy accuracy (`--warmup_accuracy`, the quickstart's `--fast` model),
   trains CE-GPPO on 2-digit addition (exact-match 1/0 reward) with small rollout batches, and records, per seed, the
   streak of zero-signal batches before the first batch with a learning signal and the longest streak.

    python benchmarks/bench_zero_signal.py --seeds 0,1,2 --batches 40
"""

from __future__ import annotations

import argparse
import copy
import tempfile
import time

import torch
from datasets import Dataset


def count_streaks(flags: list[bool]) -> tuple[int, int]:
    """(zero-signal batches before the first batch with signal, longest run of zero-signal batches)."""
    first = next((i for i, zero in enumerate(flags) if not zero), len(flags))
    longest = run = 0
    for zero in flags:
        run = run + 1 if zero else 0
        longest = max(longest, run)
    return first, longest


def record(trainer) -> list[bool]:
    """Wrap the trainer's monitor so that each training rollout batch appends whether it had no signal."""
    flags: list[bool] = []
    monitor = trainer.reward_monitor
    original = monitor.observe_signal

    def observe(*args, **kwargs):
        out = original(*args, **kwargs)
        flags.append(monitor.zero_signal_batches > 0)
        return out

    monitor.observe_signal = observe
    return flags


def trl_layout(out: str) -> int:
    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    def constant_reward_1(completions, **kwargs):
        return [1.0] * len(completions)

    def constant_reward_0(completions, **kwargs):
        return [0.0] * len(completions)

    tokenizer = build_char_tokenizer()
    args = CEGPPOConfig(
        output_dir=out, use_cpu=True, report_to="none", save_strategy="no", learning_rate=0.1,
        per_device_train_batch_size=3, num_generations=3, max_completion_length=8, reward_weights=[0.7, 0.3],
        disable_tqdm=True, logging_steps=1000, max_zero_signal_batches=0,
    )  # fmt: skip
    trainer = CEGPPOTrainer(
        model=build_tiny_llama(tokenizer, seed=0),
        reward_funcs=[constant_reward_1, constant_reward_0],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [f"{i}+{i}=" for i in range(17)]}),
        processing_class=tokenizer,
    )
    flags = record(trainer)
    trainer.train()
    return count_streaks(flags)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--batches", type=int, default=40, help="rollout batches per sparse run")
    parser.add_argument("--prompts_per_batch", type=int, default=1)
    parser.add_argument("--warmup_accuracy", type=float, default=0.02)
    ns = parser.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        print(f"TRL constant-reward test layout: {trl_layout(out)} consecutive zero-signal rollout batches "
              f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
        for seed in map(int, ns.seeds.split(",")):
            t0 = time.perf_counter()
            flags: list[bool] = []
            from cegppo_trl.monitoring import RewardSignalMonitor

            original = RewardSignalMonitor.observe_signal

            def observe(self, *args, _flags=flags, _original=original, **kwargs):
                out_ = _original(self, *args, **kwargs)
                _flags.append(self.zero_signal_batches > 0)
                return out_

            RewardSignalMonitor.observe_signal = observe
            try:
                start, result, info = sparse_start(seed, ns, out)
            finally:
                RewardSignalMonitor.observe_signal = original
            first, longest = count_streaks(flags)
            print(
                f"sparse start, seed {seed}: greedy held-out accuracy {start:.3f} at start, "
                f"{ns.prompts_per_batch} prompt(s) x 8 per rollout batch: first batch with signal after {first} "
                f"zero-signal batch(es), longest streak {longest}, {sum(flags)}/{len(flags)} batches without signal "
                f"({time.perf_counter() - t0:.1f} s)"
            )


def sparse_start(seed: int, ns, out: str):
    from cegppo_trl.demos.runs import FAST_MODEL_WARMUP, run_training
    from cegppo_trl.demos.tasks import addition_task, evaluate_accuracy
    from cegppo_trl.demos.warmup import WarmupSettings, build_default_model

    settings = WarmupSettings(**{**FAST_MODEL_WARMUP, "target_accuracy": ns.warmup_accuracy})
    model, tokenizer, info = build_default_model(settings, cache_dir=out, log=None)
    task = addition_task()
    start = evaluate_accuracy(model, tokenizer, task)
    result = run_training(
        {"per_device_train_batch_size": ns.prompts_per_batch * 8, "steps_per_generation": 1,
         "max_zero_signal_batches": 0, "warmup_steps": 0},
        model=copy.deepcopy(model), tokenizer=tokenizer, task=task, output_dir=out, max_steps=ns.batches, seed=seed,
        progress=False,
    )  # fmt: skip
    return start, result, info


if __name__ == "__main__":
    main()
