"""Cost of saving the rollout batch a checkpoint falls inside: file size and save time, as a ratio to the checkpoint.

1. `tiny`: a real `CEGPPOTrainer` run (tiny Llama, `--per_device` completions a micro-batch, `--spg` micro-batches a
   rollout batch, `save_steps=1`) at each completion length of `--lengths`: at every checkpoint inside a rollout batch,
   the size of `rollout_batch_0.pt` against the rest of the checkpoint folder, and the time of
   `rollout_state.save_rollout_batch` against the rest of `_save_checkpoint` (the marker's fsyncs included). Medians.
2. `smollm2`: SmolLM2-135M-Instruct's architecture (its config, random fp32 weights: the same tensors and bytes) with
   AdamW state, saved as transformers' checkpoint saves its bulk (`save_pretrained` safetensors and
   `torch.save(optimizer.state_dict())`, fsynced), against the rollout batch of the largest `--lengths` run (the
   batch file does not depend on the model, only on the batch's shapes). Medians of `--reps`.

Prints one JSON line. Run: ``python benchmarks/bench_rollout_batch.py`` (~2 min; `--skip_smollm2` for part 1 only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import tempfile
import time

import torch

# SmolLM2-135M-Instruct's config.json (Hub, HuggingFaceTB/SmolLM2-135M-Instruct): 134.5M parameters, tied embeddings
SMOLLM2_CONFIG = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0, rms_norm_eps=1e-5,
    tie_word_embeddings=True, hidden_act="silu",
)  # fmt: skip


def _folder_bytes(folder: str, but: str | None = None) -> int:
    return sum(
        os.path.getsize(os.path.join(r, n)) for r, _, files in os.walk(folder) for n in files if n != but
    )  # fmt: skip


def tiny_run(length: int, args, work: str) -> dict:
    from datasets import Dataset

    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
    from cegppo_trl import checkpoint_hooks as hooks
    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    out = os.path.join(work, f"tiny-{length}")
    config = CEGPPOConfig(
        output_dir=out, use_cpu=True, report_to="none", disable_tqdm=True, per_device_train_batch_size=args.per_device,
        num_generations=4, steps_per_generation=args.spg, gradient_accumulation_steps=1, max_completion_length=length,
        max_steps=args.spg * args.batches, save_strategy="steps", save_steps=1, logging_steps=1, seed=0,
    )  # fmt: skip
    prompts = Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(64)]})
    trainer = CEGPPOTrainer(
        model=build_tiny_llama(tokenizer, seed=0), reward_funcs=lambda completions, **kw: [float(len(c)) for c in completions],
        args=config, train_dataset=prompts, processing_class=tokenizer,
    )  # fmt: skip
    timings, batch = [], {}
    save_checkpoint, save_batch = trainer._save_checkpoint, hooks.save_rollout_batch

    def timed_batch(path, micro_batches, step, layout):
        start = time.perf_counter()
        save_batch(path, micro_batches, step, layout)
        batch["s"] = time.perf_counter() - start
        batch["inputs"] = micro_batches

    def timed_checkpoint(model, trial):
        batch.pop("s", None)
        start = time.perf_counter()
        save_checkpoint(model, trial)
        total = time.perf_counter() - start
        folder = os.path.join(out, f"checkpoint-{trainer.state.global_step}")
        path = os.path.join(folder, "rollout_batch_0.pt")
        if os.path.exists(path):
            rest = _folder_bytes(folder, but="rollout_batch_0.pt")
            timings.append((batch["s"], total - batch["s"], os.path.getsize(path), rest))

    hooks.save_rollout_batch, trainer._save_checkpoint = (
        timed_batch,
        timed_checkpoint,
    )  # the name `_save_checkpoint` calls
    trainer.train()
    completion = batch["inputs"][0]["completion_ids"].shape[1]
    result = {
        "completion_tokens": length, "padded_completion_length": completion, "checkpoints_inside_a_batch": len(timings),
        "batch_file_bytes": int(statistics.median(t[2] for t in timings)),
        "rest_of_checkpoint_bytes": int(statistics.median(t[3] for t in timings)),
        "size_ratio": statistics.median(t[2] / t[3] for t in timings),
        "batch_save_s": statistics.median(t[0] for t in timings),
        "rest_of_save_s": statistics.median(t[1] for t in timings),
        "time_ratio": statistics.median(t[0] / t[1] for t in timings),
    }  # fmt: skip
    shutil.rmtree(out, ignore_errors=True)
    return result, batch["inputs"]


def smollm2_run(inputs, args, work: str) -> dict:
    from transformers import LlamaConfig, LlamaForCausalLM

    from cegppo_trl.rollout_state import save_rollout_batch

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SMOLLM2_CONFIG))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # AdamW's two moments per parameter exist from the first step on
    folder = os.path.join(work, "smollm2-checkpoint")
    checkpoint_s, batch_s = [], []
    for _ in range(args.reps):
        shutil.rmtree(folder, ignore_errors=True)
        os.makedirs(folder)
        start = time.perf_counter()
        model.save_pretrained(folder, safe_serialization=True)
        torch.save(optimizer.state_dict(), os.path.join(folder, "optimizer.pt"))
        for name in os.listdir(folder):
            with open(os.path.join(folder, name), "rb+") as f:
                os.fsync(f.fileno())
        checkpoint_s.append(time.perf_counter() - start)
        path = os.path.join(folder, "rollout_batch_0.pt")
        start = time.perf_counter()
        save_rollout_batch(path, inputs, 1, {})
        with open(path, "rb+") as f:
            os.fsync(f.fileno())
        batch_s.append(time.perf_counter() - start)
    batch_bytes = os.path.getsize(path)
    rest = _folder_bytes(folder, but="rollout_batch_0.pt")
    shutil.rmtree(folder, ignore_errors=True)
    return {
        "parameters": sum(p.numel() for p in model.parameters()), "batch_file_bytes": batch_bytes,
        "checkpoint_bytes": rest, "size_ratio": batch_bytes / rest, "batch_save_s": statistics.median(batch_s),
        "checkpoint_save_s": statistics.median(checkpoint_s),
        "time_ratio": statistics.median(b / c for b, c in zip(batch_s, checkpoint_s)),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8, 512], help="max completion tokens")
    parser.add_argument("--per_device", type=int, default=8, help="completions a micro-batch")
    parser.add_argument("--spg", type=int, default=4, help="steps_per_generation (micro-batches a rollout batch)")
    parser.add_argument("--batches", type=int, default=3, help="rollout batches a tiny run trains")
    parser.add_argument("--reps", type=int, default=3, help="SmolLM2-shaped checkpoint saves")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip_smollm2", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = tempfile.mkdtemp(prefix="cegppo-bench-batch-")
    try:
        tiny, inputs = {}, None
        for length in args.lengths:
            tiny[length], inputs = tiny_run(length, args, work)
        result = {
            "date": datetime.date.today().isoformat(), "per_device": args.per_device, "spg": args.spg, "tiny": tiny,
            "smollm2": None if args.skip_smollm2 else {"completion_tokens": args.lengths[-1], **smollm2_run(inputs, args, work)},
        }  # fmt: skip
        print(json.dumps(result))
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
