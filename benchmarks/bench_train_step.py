"""Training-step benchmark: `CEGPPOTrainer` against TRL's `GRPOTrainer` (`loss_type="dapo"`), same everything else.

Both trainers get the same tiny local Llama (`cegppo_trl.demos.tiny`, same seed), the same prompts, reward, seed and
off-policy configuration (`num_iterations=2`: every rollout batch is used for two optimizer steps, so the second
step has ratios != 1 and CE-GPPO's clipped-token gradients are live). Generation is forced to the full completion
length (`min_new_tokens`) so both do the same work whatever their policies sample.

Measured:

- time per optimizer step (callback timestamps `on_step_begin` -> `on_step_end`, generation included), and the
  time inside `_compute_loss` (the only method CE-GPPO overrides: policy forward, surrogate, metrics). Runs are
  paired: each repetition trains CE-GPPO and GRPO for `--steps` steps, in alternating order, on fresh trainers; the
  ratio of the per-run median step times is taken per repetition and the median over repetitions is reported.
- peak memory: the peak of live bytes allocated by torch (CPU allocator, from the profiler's memory events) during
  the whole `train()` call, relative to its start (model gradients, optimizer state and activations included).
  `tracemalloc` would not see torch tensors, and peak RSS would be dominated by the ~1 GB of imported libraries.

Run: ``python benchmarks/bench_train_step.py`` (or ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import logging
import os
import statistics
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from _machine import cpu_name
from datasets import Dataset  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer  # noqa: E402
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama  # noqa: E402

TRAINERS = {"cegppo": (CEGPPOTrainer, CEGPPOConfig), "grpo": (GRPOTrainer, GRPOConfig)}
# Every timer's clock: wall time, or (`--clock cpu`) this thread's CPU time, which on a CPU shared with other jobs
# leaves out the time they hold the core (all the work runs on this thread with one torch thread and no GPU).
CLOCK = [time.perf_counter]


def token_sum_reward(completion_ids, **kwargs):
    """A reward with spread inside almost every group (so advantages are non-zero), for any vocabulary."""
    return [float(sum(ids) % 5) for ids in completion_ids]


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepTimer(TrainerCallback):
    """Wall time of each optimizer step, generation included (queued GPU work included)."""

    def __init__(self):
        self.durations: list[float] = []
        self._start = None

    def on_step_begin(self, args, state, control, **kwargs):
        _sync()
        self._start = CLOCK[0]()

    def on_step_end(self, args, state, control, **kwargs):
        _sync()
        self.durations.append(CLOCK[0]() - self._start)


def build_trainer(
    name: str,
    *,
    output_dir: str,
    steps: int,
    completion_length: int = 32,
    num_generations: int = 4,
    prompts_per_step: int = 2,
    hidden_size: int = 64,
    seed: int = 0,
    model_factory=None,
    tokenizer=None,
    **config_overrides,
):
    """A CE-GPPO or GRPO trainer (`name` in TRAINERS) with identical model, data and off-policy configuration.

    By default a tiny Llama from `cegppo_trl.demos.tiny` on CPU; `model_factory` (a callable returning a fresh
    model), `tokenizer` and `config_overrides` (e.g. ``use_cpu=False, bf16=True``) let `gpu_bench.py` reuse the same
    set-up at a real size.
    """
    trainer_cls, config_cls = TRAINERS[name]
    if tokenizer is None:
        tokenizer = build_char_tokenizer()
    if model_factory is not None:
        model = model_factory()
    else:
        model = build_tiny_llama(
            tokenizer,
            hidden_size=hidden_size,
            intermediate_size=2 * hidden_size,
            max_position_embeddings=512,
            seed=seed,
        )
    config_kwargs = dict(
        output_dir=output_dir,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        disable_tqdm=True,
        logging_steps=1,
        seed=seed,
        max_steps=steps,
        learning_rate=1e-3,
        per_device_train_batch_size=prompts_per_step * num_generations,
        num_generations=num_generations,
        max_completion_length=completion_length,
        generation_kwargs={"min_new_tokens": completion_length},  # same amount of work in both trainers
        num_iterations=2,  # off-policy: the second step on each rollout batch has ratio != 1
        loss_type="dapo",
        epsilon=0.2,
        delta=10.0,  # the authors' dual clip (TRL's two-sided clip for GRPO)
    )
    config_kwargs.update(config_overrides)
    prompts = Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(4 * steps * prompts_per_step)]})
    trainer = trainer_cls(
        model=model,
        reward_funcs=token_sum_reward,
        args=config_cls(**config_kwargs),
        train_dataset=prompts,
        processing_class=tokenizer,
    )
    trainer.remove_callback(PrinterCallback)  # logs stay in `trainer.state.log_history`, not on stdout
    return trainer


def timed_run(name: str, output_dir: str, steps: int, warmup: int, **kwargs) -> dict:
    """Train `steps` steps; mean step time and mean `_compute_loss` time per step, after `warmup` steps.

    Means, not medians: with `num_iterations=2` every other step generates (several times slower), so the mean over
    an even number of steps is the cost per optimizer step.
    """
    trainer = build_trainer(name, output_dir=output_dir, steps=steps, **kwargs)
    timer = StepTimer()
    trainer.add_callback(timer)
    loss_times: list[float] = []
    compute_loss = trainer._compute_loss

    def timed_compute_loss(*args, **kw):
        start = CLOCK[0]()
        out = compute_loss(*args, **kw)
        loss_times.append(CLOCK[0]() - start)
        return out

    trainer._compute_loss = timed_compute_loss
    on_cuda = next(trainer.model.parameters()).is_cuda
    if on_cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    durations = timer.durations[warmup:]
    loss_per_step = len(loss_times) // len(timer.durations)  # micro-batches per optimizer step
    loss_step_times = [sum(loss_times[i : i + loss_per_step]) for i in range(0, len(loss_times), loss_per_step)]
    history = trainer.state.log_history
    return {
        "step": statistics.mean(durations),
        "loss": statistics.mean(loss_step_times[warmup:]),
        "completion_length": statistics.mean(
            h["completions/mean_length"] for h in history if "completions/mean_length" in h
        ),
        "cuda_peak_bytes": torch.cuda.max_memory_allocated() if on_cuda else None,
    }


def peak_memory(name: str, output_dir: str, steps: int, **kwargs) -> int:
    """Peak live torch CPU bytes during `train()` (profiler memory events), relative to the start of `train()`."""
    from torch.profiler import ProfilerActivity, profile

    trainer = build_trainer(name, output_dir=output_dir, steps=steps, **kwargs)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        trainer.train()
    # Every allocation and free, in time order (`prof.events()` folds most of them into their enclosing ops).
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in events:
        live += nbytes
        peak = max(peak, live)
    return peak


def same_batch_loss_times(output_dir: str, reps: int, **kwargs) -> dict[str, list[float]]:
    """`_compute_loss` + backward of each trainer on one identical off-policy batch, paired, many repetitions.

    The batch is the second (off-policy) step of a short GRPO run; both trainers' models are the same initial
    weights.
    """
    from bench_loss import paired_times

    trainers = {name: build_trainer(name, output_dir=output_dir, steps=2, **kwargs) for name in TRAINERS}
    captured = []
    source = trainers["grpo"]
    compute_loss = source._compute_loss
    source._compute_loss = lambda model, inputs: captured.append(inputs) or compute_loss(model, inputs)
    for trainer in trainers.values():  # a short run sets the trainers' per-run state (accumulation steps, ...)
        trainer.train()
    source._compute_loss = compute_loss
    batch = captured[-1]  # step 2: old log-probs from before step 1's update, so ratio != 1
    models = {name: build_trainer(name, output_dir=output_dir, steps=2, **kwargs).model for name in TRAINERS}

    def call(name):
        trainer = trainers[name]
        trainer.model = models[name]  # fresh weights, training mode, identical for both
        trainer.model.train()

        def run():
            trainer._compute_loss(trainer.model, batch).backward()
            trainer.model.zero_grad(set_to_none=True)
            for values in trainer._metrics.values():
                values.clear()

        return run

    calls = {"cegppo": call("cegppo"), "grpo": call("grpo")}
    return paired_times(calls, reps, min_block_s=0.05, clock=CLOCK[0])


def compare(
    reps: int, steps: int, warmup: int, output_dir: str, verbose: bool = True, memory_reps: int = 3, **kwargs
) -> dict:
    """Paired timing (CE-GPPO / GRPO) over `reps` repetitions plus `memory_reps` profiled runs each for peak memory."""
    runs = {name: [] for name in TRAINERS}
    names = list(TRAINERS)
    for name in names:  # not counted: the first run in a process pays one-off initialisation
        timed_run(name, output_dir, 2, 0, **kwargs)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            runs[name].append(timed_run(name, output_dir, steps, warmup, **kwargs))
        if verbose:
            print(
                f"  rep {rep}: step ms cegppo {1e3 * runs['cegppo'][-1]['step']:.1f} / grpo "
                f"{1e3 * runs['grpo'][-1]['step']:.1f}",
                flush=True,
            )
    # Peak memory, paired the same way; a first profiled run is discarded (one-off lazy allocations).
    peak_memory(names[0], output_dir, 4, **kwargs)
    memory = {name: [] for name in names}
    for rep in range(min(reps, memory_reps)):
        for name in names if rep % 2 == 0 else reversed(names):
            memory[name].append(peak_memory(name, output_dir, 4, **kwargs))
    pairs = list(zip(runs["cegppo"], runs["grpo"]))
    ratio = {key: spread(c[key] / g[key] for c, g in pairs) for key in ("step", "loss")}
    same = same_batch_loss_times(output_dir, 3 * reps, **kwargs)
    same_ms = {name: 1e3 * statistics.median(times) for name, times in same.items()}
    return {
        "step_ms": {n: 1e3 * statistics.median(r["step"] for r in runs[n]) for n in names},
        "loss_ms": {n: 1e3 * statistics.median(r["loss"] for r in runs[n]) for n in names},
        "completion_length": {n: statistics.mean(r["completion_length"] for r in runs[n]) for n in names},
        "step_ratio": ratio["step"],
        "loss_ratio": ratio["loss"],
        "memory_mib": {n: statistics.median(memory[n]) / 2**20 for n in names},
        "memory_ratio": spread(c / g for c, g in zip(memory["cegppo"], memory["grpo"])),
        "same_batch_ms": same_ms,
        "same_batch_ratio": spread(a / b for a, b in zip(same["cegppo"], same["grpo"])),
    }


def spread(ratios) -> tuple[float, float, float]:
    """Median, min and max of paired ratios."""
    ratios = list(ratios)
    return statistics.median(ratios), min(ratios), max(ratios)


def print_table(result: dict, seconds: bool = False) -> None:
    """The comparison as a markdown table: medians, and each ratio's median (min-max) over the pairs."""
    scale, unit, digits = (1e-3, "s", 2) if seconds else (1.0, "ms", 1)

    def row(label, values, ratio, value_digits=digits):
        c, g = (f"{scale * values[n]:.{value_digits}f}" for n in ("cegppo", "grpo"))
        print(f"| {label} | {c} | {g} | {ratio[0]:.3f}x ({ratio[1]:.3f}-{ratio[2]:.3f}) |")

    print("| | CE-GPPO | GRPO | CE-GPPO / GRPO, median (min-max) of paired ratios |\n|---|---|---|---|")
    row(f"time per optimizer step, generation included ({unit})", result["step_ms"], result["step_ratio"])
    row(f"of which `_compute_loss` ({unit})", result["loss_ms"], result["loss_ratio"])
    row(f"`_compute_loss` + backward, identical batch ({unit})", result["same_batch_ms"], result["same_batch_ratio"],
        digits + 1)  # fmt: skip
    row("peak torch memory in `train()` (MiB)", {n: v / scale for n, v in result["memory_mib"].items()},
        result["memory_ratio"], 1)  # fmt: skip
    lengths = result["completion_length"]
    print(f"| mean completion length | {lengths['cegppo']:.1f} | {lengths['grpo']:.1f} | |")


def quiet() -> None:
    """Silence the per-step logs and the known warnings of a CPU run."""
    hf_logging.set_verbosity_error()
    logging.getLogger("trl").setLevel(logging.ERROR)
    logging.getLogger("cegppo_trl").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 repetitions of 8 steps")
    parser.add_argument("--reps", type=int, default=None, help="paired repetitions (default 7, quick 3)")
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per run (default 16, quick 8)")
    parser.add_argument("--completion-length", type=int, default=32)
    parser.add_argument("--num-generations", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument(
        "--threads", type=int, default=None, help="torch threads (default 1; smollm2: 2, 1 with cpu clock)"
    )
    parser.add_argument("--output-dir", default="/tmp/cegppo_bench_train_step")
    parser.add_argument(
        "--model",
        choices=["tiny", "smollm2"],
        default="tiny",
        help="tiny: the local tiny Llama; smollm2: SmolLM2-135M-Instruct "
        "(cegppo_trl.demos.smollm2.smollm2_checkpoint), fp32, 2 reps x 4 steps and 2 threads unless given",
    )
    parser.add_argument("--memory-reps", type=int, default=3, help="paired profiled runs for peak memory")
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall", help="wall time or this thread's CPU time")
    args = parser.parse_args(argv)
    CLOCK[0] = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.model == "smollm2":
        return smollm2_main(args)

    quiet()
    torch.set_num_threads(args.threads or 1)
    reps = args.reps or (3 if args.quick else 7)
    steps = args.steps or (8 if args.quick else 16)
    warmup = 2
    print(
        f"# bench_train_step: {datetime.date.today()} | {cpu_name()} | torch {torch.__version__} | "
        f"threads={torch.get_num_threads()} | {args.clock} clock | reps={reps} x {steps} steps (first {warmup} "
        f"dropped) | tiny Llama hidden={args.hidden_size}, batch {2 * args.num_generations} = 2 prompts x "
        f"{args.num_generations} generations, {args.completion_length} completion tokens, num_iterations=2, "
        "loss_type=dapo, delta=10"
    )
    result = compare(
        reps,
        steps,
        warmup,
        args.output_dir,
        completion_length=args.completion_length,
        num_generations=args.num_generations,
        hidden_size=args.hidden_size,
    )
    print_table(result)
    return result


def smollm2_main(args) -> dict:
    """The paired comparison on SmolLM2-135M-Instruct: same prompts (plain text), batch, seed and off-policy layout."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from cegppo_trl.demos.smollm2 import smollm2_checkpoint

    quiet()
    torch.set_num_threads(args.threads or (1 if args.clock == "cpu" else 2))
    path = smollm2_checkpoint()
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    reps, steps, warmup = args.reps or 2, args.steps or 4, 0
    length = args.completion_length if args.completion_length != 32 else 16
    print(
        f"# bench_train_step --model smollm2: {datetime.date.today()} | {cpu_name()} | torch "
        f"{torch.__version__} | threads={torch.get_num_threads()} | {args.clock} clock | reps={reps} x {steps} steps | "
        f"SmolLM2-135M-Instruct fp32, batch {2 * args.num_generations} = 2 prompts x {args.num_generations} "
        f"generations, {length} completion tokens (forced), num_iterations=2, loss_type=dapo, delta=10"
    )
    result = compare(
        reps, steps, warmup, args.output_dir, memory_reps=args.memory_reps, completion_length=length,
        num_generations=args.num_generations, tokenizer=tokenizer, learning_rate=1e-5,
        model_factory=lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
    )  # fmt: skip
    print_table(result, seconds=True)
    return result


if __name__ == "__main__":
    main()
