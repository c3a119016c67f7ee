"""The three benchmarks at a real size on one CUDA GPU: loss kernel, training step (time and peak memory), scaling.

1. Loss kernel: `bench_loss.run` on the GPU (CUDA-synchronised paired timing), B x T from 64 x 4096 to
   1024 x 16384, fp32 and bf16, log-ratio spreads 0.1 and 0.3.
2. Training step: `CEGPPOTrainer` vs `GRPOTrainer` (`loss_type="dapo"`, `num_iterations=2`, `delta=10`, bf16),
   paired runs on a ~0.5B model: by default a randomly initialised Llama with Qwen2.5-0.5B's shapes (hidden 896,
   24 layers, 14 heads / 2 KV heads, MLP 4864, vocabulary 151,936, tied embeddings), so no download is needed and
   the logits are full-vocabulary sized; ``--model`` loads a real checkpoint (Hub id or path) instead. Generation is
   forced to the full completion length. Peak memory is `torch.cuda.max_memory_allocated` over `train()`.
3. Scaling: step time against completion length and group size (``--skip-scaling`` to leave it out).

Results are printed as markdown tables and written to ``--out`` (JSON), with the GPU name, torch/TRL versions and
the date. ``--smoke`` runs every code path at toy sizes (also on CPU) to check the script itself.

Run: ``python benchmarks/gpu_bench.py --out gpu_results.json``. Defaults: 2 prompts x 8 generations x 512 tokens,
3 paired repetitions of 6 steps; with the scaling grid (lengths 128-1024, groups 4-16) expect tens of minutes, most of
it in `generate` (HF transformers, not vLLM); ``--skip-scaling`` and ``--reps 1`` shorten it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import subprocess

import bench_loss
import torch
from bench_train_step import quiet, timed_run

LOSS_SIZES = [(64, 4096), (256, 8192), (1024, 16384)]
SMOKE_LOSS_SIZES = [(8, 512)]


def qwen25_05b_shaped_llama(device: str, dtype: torch.dtype, seed: int = 0, smoke: bool = False):
    """A randomly initialised Llama with Qwen2.5-0.5B's shapes (~494M parameters), built directly on `device`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from cegppo_trl.demos.tiny import build_char_tokenizer

    tokenizer = build_char_tokenizer()  # ids beyond its 100 tokens decode to nothing; rewards use the ids
    if smoke:
        shapes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
        shapes.update(num_key_value_heads=2, vocab_size=1024)
    else:
        shapes = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14)
        shapes.update(num_key_value_heads=2, vocab_size=151936)
    config = LlamaConfig(
        **shapes,
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )

    def factory():
        torch.manual_seed(seed)
        with torch.device(device):
            model = LlamaForCausalLM(config).to(dtype)
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        return model

    return factory, tokenizer


def pretrained(model_id: str, device: str, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_id, padding_side="left")

    def factory():
        return AutoModelForCausalLM.from_pretrained(model_id, dtype=dtype).to(device)

    return factory, tokenizer


def train_pair(reps: int, steps: int, output_dir: str, **kwargs) -> dict:
    """Paired CE-GPPO / GRPO runs: median step times, ratio, and peak GPU memory."""
    runs = {"cegppo": [], "grpo": []}
    names = list(runs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            runs[name].append(timed_run(name, output_dir, steps, warmup=2, **kwargs))
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    result = {
        "step_ms": {n: 1e3 * statistics.median(r["step"] for r in runs[n]) for n in names},
        "loss_ms": {n: 1e3 * statistics.median(r["loss"] for r in runs[n]) for n in names},
        "step_ratio": statistics.median(c["step"] / g["step"] for c, g in zip(runs["cegppo"], runs["grpo"])),
    }
    if runs["cegppo"][0]["cuda_peak_bytes"] is not None:
        peak = {n: max(r["cuda_peak_bytes"] for r in runs[n]) for n in names}
        result["peak_gib"] = {n: peak[n] / 2**30 for n in names}
        result["memory_ratio"] = peak["cegppo"] / peak["grpo"]
    return result


def environment(device: str) -> dict:
    import transformers
    import trl

    info = {
        "date": str(datetime.date.today()),
        "torch": torch.__version__,
        "trl": trl.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    if torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
        try:
            info["nvidia_smi"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default=None, help="Hub id or local path (default: random Qwen2.5-0.5B shapes)")
    parser.add_argument("--completion-length", type=int, default=512)
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per training run (first 2 dropped)")
    parser.add_argument("--reps", type=int, default=3, help="paired repetitions (training runs per trainer)")
    parser.add_argument("--loss-reps", type=int, default=15, help="paired repetitions per loss-kernel size")
    parser.add_argument("--skip-loss", action="store_true")
    parser.add_argument("--skip-train", action="store_true")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="toy sizes: checks the script, measures nothing")
    parser.add_argument("--out", default="gpu_bench_results.json")
    parser.add_argument("--output-dir", default="/tmp/cegppo_gpu_bench")
    args = parser.parse_args(argv)

    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run on a GPU machine, or use `--device cpu --smoke` to check the script")
    quiet()
    on_cuda = torch.device(args.device).type == "cuda"
    if not on_cuda:
        torch.set_num_threads(1)  # a shared CPU: see bench_loss.py
    if args.smoke:
        args.completion_length, args.num_generations, args.prompts_per_step = 16, 2, 2
        args.steps, args.reps, args.loss_reps = 4, 1, 3
    results = {"environment": environment(args.device), "args": vars(args)}
    print(f"# gpu_bench: {json.dumps(results['environment'])}")

    if not args.skip_loss:
        print("\n## Loss kernel (forward + backward, paired, CUDA-synchronised)")
        print(bench_loss.header())
        results["loss_kernel"] = bench_loss.run(
            SMOKE_LOSS_SIZES if args.smoke else LOSS_SIZES,
            [torch.float32, torch.bfloat16],
            [0.1, 0.3],
            args.loss_reps,
            min_block_s=0.02,
            delta=bench_loss.DELTA,
            device=args.device,
        )

    dtype = torch.bfloat16
    if args.model:
        factory, tokenizer = pretrained(args.model, args.device, dtype)
    else:
        factory, tokenizer = qwen25_05b_shaped_llama(args.device, dtype, smoke=args.smoke)
    train_kwargs = dict(
        model_factory=factory,
        tokenizer=tokenizer,
        prompts_per_step=args.prompts_per_step,
        use_cpu=not on_cuda,
        bf16=on_cuda,
        learning_rate=1e-6,
    )

    if not args.skip_train:
        print(
            f"\n## Training step ({args.model or 'random Qwen2.5-0.5B-shaped Llama'}, bf16, "
            f"{args.prompts_per_step} prompts x {args.num_generations} generations, {args.completion_length} "
            f"tokens, num_iterations=2, dapo, delta=10)"
        )
        result = train_pair(
            args.reps,
            args.steps,
            args.output_dir,
            completion_length=args.completion_length,
            num_generations=args.num_generations,
            **train_kwargs,
        )
        results["train_step"] = result
        print("| | CE-GPPO | GRPO (dapo) | CE-GPPO / GRPO |\n|---|---|---|---|")
        ms, ratio = result["step_ms"], result["step_ratio"]
        print(f"| time per optimizer step (ms) | {ms['cegppo']:.0f} | {ms['grpo']:.0f} | {ratio:.3f}x |")
        ms = result["loss_ms"]
        print(f"| of which `_compute_loss` (ms) | {ms['cegppo']:.0f} | {ms['grpo']:.0f} | |")
        if "peak_gib" in result:
            gib = result["peak_gib"]
            print(
                f"| peak GPU memory (GiB) | {gib['cegppo']:.2f} | {gib['grpo']:.2f} | {result['memory_ratio']:.3f}x |"
            )

    if not args.skip_scaling:
        print("\n## Scaling (ms per optimizer step)")
        print("| completion length | group size | CE-GPPO | GRPO | CE-GPPO / GRPO |\n|---|---|---|---|---|")
        lengths = (8, 16) if args.smoke else (128, 256, 512, 1024)
        groups = (2,) if args.smoke else (4, 8, 16)
        points = [(length, args.num_generations) for length in lengths]
        points += [(args.completion_length, g) for g in groups if (args.completion_length, g) not in points]
        results["scaling"] = []
        for length, group in points:
            result = train_pair(
                max(1, args.reps - 1),
                min(args.steps, 4),
                args.output_dir,
                completion_length=length,
                num_generations=group,
                **train_kwargs,
            )
            result.update(length=length, group=group)
            results["scaling"].append(result)
            ms = result["step_ms"]
            print(
                f"| {length} | {group} | {ms['cegppo']:.0f} | {ms['grpo']:.0f} | {result['step_ratio']:.3f}x |",
                flush=True,
            )

    with open(args.out, "w") as f:
        json.dump(results, f, indent=2, default=str)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
