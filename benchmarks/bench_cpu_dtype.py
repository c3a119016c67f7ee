"""CPU cost of half-precision weights: CE-GPPO training steps with `--dtype float32` against `--dtype bfloat16` (or
`float16`, `--half float16`).

Runs the training script (`cegppo_trl.scripts.main`, the `cpu_smoke.yaml` recipe) on SmolLM2-135M-Instruct
(`cegppo_trl.demos.smollm2.smollm2_checkpoint`, offline), cut to its first `--layers` decoder layers so a repetition
takes seconds rather than minutes; vocabulary, width and tokenizer are the real ones. Each repetition trains once in each
dtype, alternating which goes first, and the reported figure is the median (and range) over repetitions of the
per-repetition ratio `train_runtime(half) / train_runtime(float32)`.

The ratio depends on the CPU: one with bfloat16 instructions (`avx512_bf16`, `amx_bf16` in /proc/cpuinfo; PyTorch's
`torch.ops.mkldnn._is_mkldnn_bf16_supported()`) runs bfloat16 matmuls natively, one without emulates them; likewise
float16 (`_is_mkldnn_fp16_supported()`).

Run: ``python benchmarks/bench_cpu_dtype.py`` (``--layers 30`` for the whole model, ``--reps 3``, ``--flags
'--use_peft true'`` for LoRA).
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import os
import platform
import shlex
import statistics
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    return sorted({flag for flag in ("avx512_bf16", "amx_bf16", "avx512f") if f" {flag}" in text})


def truncated_smollm2(layers: int, folder: Path) -> str:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cegppo_trl.demos.smollm2 import smollm2_checkpoint

    source = smollm2_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    model.model.layers = model.model.layers[:layers]
    model.config.num_hidden_layers = layers
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return str(folder)


def train_runtime(model: str, data: str, output_dir: str, dtype: str, steps: int, flags: list[str]) -> float:
    from cegppo_trl.scripts import main, parse_args

    args = parse_args(
        ["--config", str(ROOT / "examples" / "recipes" / "cpu_smoke.yaml"), "--model_name_or_path", model,
         "--dataset_name", data, "--output_dir", output_dir, "--overwrite_output_dir", "true", "--max_steps",
         str(steps), "--dtype", dtype, "--reward_funcs", "gsm8k", "--max_completion_length", "32",
         "--disable_tqdm", "true", *flags]
    )  # fmt: skip
    trainer = main(*args)
    return next(h["train_runtime"] for h in reversed(trainer.state.log_history) if "train_runtime" in h)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=4, help="decoder layers kept (SmolLM2-135M has 30)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per run (the first one generates)")
    parser.add_argument("--half", default="bfloat16", choices=("bfloat16", "float16"))
    parser.add_argument("--flags", default="", help="more training-script flags for both runs, e.g. '--use_peft true'")
    args = parser.parse_args()
    logging.getLogger("cegppo_trl.scripts").setLevel(logging.ERROR)  # the bf16 runs warn about exactly this

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        model = truncated_smollm2(args.layers, tmp / "model")
        rows = [{"prompt": f"What is {i} + {i % 5}? Answer with just the number.", "solution": str(i + i % 5)}
                for i in range(16)]  # fmt: skip
        data = tmp / "add.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
        ratios = []
        for rep in range(args.reps):
            order = ("float32", args.half) if rep % 2 == 0 else (args.half, "float32")
            flags = shlex.split(args.flags)
            times = {d: train_runtime(model, str(data), str(tmp / f"run-{d}"), d, args.steps, flags) for d in order}
            ratios.append(times[args.half] / times["float32"])
            print(f"rep {rep}: float32 {times['float32']:.1f} s, {args.half} {times[args.half]:.1f} s, "
                  f"ratio {ratios[-1]:.2f}", flush=True)  # fmt: skip
    print(
        f"{datetime.date.today()} {platform.processor() or platform.machine()} ({os.cpu_count()} cores, flags "
        f"{cpu_flags()}, native {args.half}: {cpu_computes_natively(args.half)}), SmolLM2-135M cut to {args.layers} layers, "
        f"{args.steps} steps per run: {args.half}/float32 "
        f"step-time ratio median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}, "
        f"{args.reps} paired repetitions{', flags ' + args.flags if args.flags else ''})"
    )


def cpu_computes_natively(dtype: str) -> bool:
    """Whether this CPU has instructions for `dtype` ("bfloat16" or "float16"), as PyTorch's oneDNN kernels see it
    (a private probe: False where this build lacks it)."""
    import torch

    probe = {"bfloat16": "_is_mkldnn_bf16_supported", "float16": "_is_mkldnn_fp16_supported"}[dtype]
    try:
        return bool(getattr(torch.ops.mkldnn, probe)())
    except (AttributeError, RuntimeError):
        return False


if __name__ == "__main__":
    main()
