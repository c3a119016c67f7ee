"""Loss benchmark: TRL's clipped surrogate with CE-GPPO's advantage against without it, forward + backward.

A logits-free loss over ``(B, T)`` tensors: every implementation gets the same current log-probs (``requires_grad``),
old log-probs and advantages and returns d(loss)/d(logp) under the same incoming gradient (standing in for TRL's
mask and normaliser); no model, no vocabulary.

- ``cegppo``: what `CEGPPOTrainer` hands TRL per micro-batch: `cegppo_trl.loss.cegppo_regions`, `preserved_weight` and
  `preserved_advantages` (``A_hat``, value ``A``), then TRL's surrogate on ``A_hat``.
- ``cegppo+stats``: the same plus the step's statistics the trainer gathers per micro-batch
  (`cegppo_trl.monitoring.loss_statistics`: the default `cegppo/` metrics' on-device sums, no host sync).
- ``trl_clip``: TRL 1.16's own clipped surrogate alone (``GRPOTrainer._compute_loss``, loss types grpo/bnpo/dr_grpo/
  dapo/luspo), ``-min(r * A, clamp(r, 1 - eps_l, 1 + eps_h) * A)`` with ``r`` capped at ``delta``: GRPO's cost.
- ``authors``: the authors' formulation (docs/algorithm.md §5), written here from that description:
  ``beta * bound * A / sg(r) * r`` for the clipped branches, selected by boolean-mask assignment (``x[mask] = ...``),
  then the dual clip ``min(loss, -c * A)`` for negative advantages.

Timing is paired: every repetition times each implementation once, in alternating order, and the reported number
for each size is the median over repetitions of the per-repetition ratio ``time(cegppo) / time(baseline)``. Lone
absolute times on a shared machine mean little; ratios measured side by side do.

Run: ``python benchmarks/bench_loss.py`` (full grid) or ``python benchmarks/bench_loss.py --quick``.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import itertools
import statistics
import time
from collections.abc import Callable

import torch
from _machine import cpu_name

from cegppo_trl.loss import cegppo_regions, preserved_advantages, preserved_weight
from cegppo_trl.monitoring import loss_statistics

# The paper's clip range and 1.5B coefficients; the recipes' dual clip.
EPSILON_LOW, EPSILON_HIGH, BETA1, BETA2, DELTA = 0.2, 0.2, 0.5, 1.0, 10.0
FULL_SIZES = [(8, 512), (64, 4096), (8, 16384), (128, 8192)]
QUICK_SIZES = [(64, 4096), (8, 16384)]


def authors_form(logp, old_logp, advantages, *, epsilon_low, epsilon_high, beta1, beta2, delta):
    """The authors' formulation (docs/algorithm.md §5): ``bound / sg(r) * r`` with boolean-mask assignment."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    ratio = torch.exp(logp - old_logp)  # [B, T]
    pg_losses = -advantages * ratio  # [B, T]
    left = (advantages < 0) & (ratio < 1 - epsilon_low)
    right = (advantages > 0) & (ratio > 1 + epsilon_high)
    left_losses = -advantages * beta1 * (1 - epsilon_low) / ratio.detach() * ratio
    right_losses = -advantages * beta2 * (1 + epsilon_high) / ratio.detach() * ratio
    pg_losses[left] = left_losses[left]  # boolean indexing: a host sync (nonzero) and a gather/scatter each
    pg_losses[right] = right_losses[right]
    if delta is not None:  # dual clip for negative advantages
        pg_losses = torch.where(advantages < 0, torch.min(pg_losses, -delta * advantages), pg_losses)
    return pg_losses


def trl_clip(logp, old_logp, advantages, *, epsilon_low, epsilon_high, delta, **_):
    """TRL 1.16's clipped surrogate (token-level importance sampling), as in `GRPOTrainer._compute_loss`."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    coef_1 = torch.exp(logp - old_logp)
    coef_2 = torch.clamp(coef_1, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        coef_1 = torch.clamp(coef_1, max=delta)
    return -torch.min(coef_1 * advantages, coef_2 * advantages)


def cegppo_term(logp, old_logp, advantages, *, epsilon_low, epsilon_high, beta1, beta2, delta, stats=False, **guard):
    """The trainer's per-token loss: TRL's surrogate on the preserved advantages (`CEGPPOTrainer._preserve_gradient`);
    with `stats`, also the micro-batch's `loss_statistics` (the default metrics' per-micro-batch work)."""
    log_ratio = logp - old_logp
    bounds = dict(epsilon_low=epsilon_low, epsilon_high=epsilon_high)
    regions = cegppo_regions(log_ratio.detach(), advantages, delta=delta, delta_low=guard.get("delta_low"), **bounds)
    weight = preserved_weight(log_ratio.detach(), advantages, beta1=beta1, beta2=beta2, regions=regions, **bounds,
                              **guard)  # fmt: skip
    loss = trl_clip(logp, old_logp, preserved_advantages(advantages, log_ratio, weight), delta=delta, **bounds)
    if stats:
        loss_statistics(log_ratio.detach(), torch.ones_like(logp, dtype=torch.long), regions)
    return loss


IMPLEMENTATIONS: dict[str, Callable] = {
    "cegppo": cegppo_term,
    "cegppo+stats": functools.partial(cegppo_term, stats=True),
    "authors": authors_form,
    "trl_clip": trl_clip,
}


def make_inputs(
    batch: int, length: int, dtype: torch.dtype, spread: float, seed: int = 0, device="cpu", advantages="b1"
):
    """Log-ratios ~ N(0, spread); advantages of both signs with some exact zeros.

    `advantages`: ``"b1"`` (B, 1), one per sequence as TRL passes them, or ``"bt"`` (B, T), one per token.
    """
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 5  # log-probs in (-5, 0]
    logp = (old + spread * torch.randn(batch, length, generator=gen)).to(device, dtype).requires_grad_()
    adv = torch.randn(batch, length if advantages == "bt" else 1, generator=gen).round(decimals=1)  # some zeros
    grad_out = torch.rand(batch, length, generator=gen).to(device)  # stands in for mask / normaliser (fp32)
    return logp, old.to(device, dtype), adv.to(device), grad_out


def fwd_bwd(fn: Callable, logp, old, advantages, grad_out, kwargs) -> torch.Tensor:
    loss = fn(logp, old, advantages, **kwargs)
    (grad,) = torch.autograd.grad(loss, logp, grad_out.to(loss.dtype))
    return grad


def saved_bytes(fn: Callable, logp, old, advantages, kwargs) -> int:
    """Bytes of tensors autograd keeps for backward between the forward and the backward pass."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(logp, old, advantages, **kwargs)
    return total


def paired_times(
    calls: dict[str, Callable[[], object]],
    reps: int,
    min_block_s: float,
    sync: Callable[[], None] = lambda: None,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, list[float]]:
    """Seconds per call of each implementation, one block per implementation per repetition, order alternating.

    `sync` (e.g. `torch.cuda.synchronize`) runs before and after each timed block, so queued device work counts.
    `clock`: wall time by default; `time.thread_time` counts only this thread's CPU time, which on a shared CPU
    leaves out the time other jobs hold the core (CPU runs only: it does not see device work).
    """
    for call in calls.values():  # warm-up (allocator, lazy init)
        call()
        call()
    sync()
    start = clock()
    for call in calls.values():
        call()
    sync()
    number = max(1, int(min_block_s / max((clock() - start) / len(calls), 1e-9)))
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                call = calls[name]
                sync()
                t0 = clock()
                for _ in range(number):
                    call()
                sync()
                times[name].append((clock() - t0) / number)
    finally:
        if gc_was_enabled:
            gc.enable()
    return times


def check_same_objective(logp, old, advantages, grad_out, kwargs) -> None:
    """Sanity check: the authors' form is the same objective, so it has the same gradient (to rounding).

    Checked in fp32 only: with bf16 log-probs the trainer's regions are TRL's, compared on a bf16 ratio, so tokens
    near a clip bound fall on another side than in an fp32 reference.
    """
    if logp.dtype != torch.float32:
        return
    grad = fwd_bwd(cegppo_term, logp, old, advantages, grad_out, kwargs).float()
    logp32 = logp.detach().float().requires_grad_()
    grad_authors = fwd_bwd(authors_form, logp32, old.float(), advantages, grad_out, kwargs)
    tol = dict(rtol=1e-5, atol=1e-6) if logp.dtype == torch.float32 else dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(grad, grad_authors, **tol)


def clipped_fraction(logp, old, advantages, delta) -> float:
    left, right, dual, _ = cegppo_regions(
        logp.detach() - old, advantages, epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, delta=delta
    )
    return (left | right | dual).float().mean().item()


def run(
    sizes,
    dtypes,
    spreads,
    reps: int,
    min_block_s: float,
    delta: float | None,
    device="cpu",
    advantages="b1",
    clock: Callable[[], float] = time.perf_counter,
):
    kwargs = dict(epsilon_low=EPSILON_LOW, epsilon_high=EPSILON_HIGH, beta1=BETA1, beta2=BETA2, delta=delta)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    rows = []
    for spread, dtype, (batch, length) in itertools.product(spreads, dtypes, sizes):
        logp, old, adv, grad_out = make_inputs(batch, length, dtype, spread, device=device, advantages=advantages)
        if IMPLEMENTATIONS["cegppo"] is cegppo_term:  # the guard changes the objective: nothing to compare
            check_same_objective(logp, old, adv, grad_out, kwargs)
        calls = {
            name: functools.partial(fwd_bwd, fn, logp, old, adv, grad_out, kwargs)
            for name, fn in IMPLEMENTATIONS.items()
        }
        times = paired_times(calls, reps, min_block_s, sync, clock)
        ratios = {
            base: statistics.median(c / b for c, b in zip(times["cegppo"], times[base]))
            for base in times
            if base != "cegppo"
        }
        saved = {name: saved_bytes(fn, logp, old, adv, kwargs) for name, fn in IMPLEMENTATIONS.items()}
        row = dict(
            spread=spread,
            clipped=clipped_fraction(logp, old, adv, delta),
            dtype=str(dtype).removeprefix("torch."),
            size=f"{batch}x{length}",
            numel=batch * length,
            ms_cegppo=1e3 * statistics.median(times["cegppo"]),
            vs_authors=ratios["authors"],
            vs_trl=ratios["trl_clip"],
            vs_trl_range=paired_range(times["cegppo"], times["trl_clip"]),
            stats_vs_trl=statistics.median(c / b for c, b in zip(times["cegppo+stats"], times["trl_clip"])),
            stats_vs_trl_range=paired_range(times["cegppo+stats"], times["trl_clip"]),
            saved_cegppo=saved["cegppo"] / (batch * length),
            saved_authors=saved["authors"] / (batch * length),
            saved_trl=saved["trl_clip"] / (batch * length),
        )
        rows.append(row)
        print(_format_row(row), flush=True)
        del logp, old, adv, grad_out, calls
        gc.collect()
    return rows


def paired_range(a: list[float], b: list[float]) -> tuple[float, float]:
    ratios = [x / y for x, y in zip(a, b)]
    return min(ratios), max(ratios)


def header() -> str:
    columns = ["log-ratio std (clipped)", "dtype", "B x T", "cegppo ms (median)", "cegppo / TRL clip (min-max)"]
    columns += ["cegppo+stats / TRL clip (min-max)", "cegppo / authors", "saved B/token: cegppo / authors / TRL"]
    return "| " + " | ".join(columns) + " |\n" + "|---" * len(columns) + "|"


def _format_row(row) -> str:
    cells = [
        f"{row['spread']} ({100 * row['clipped']:.1f}%)",
        row["dtype"],
        row["size"],
        f"{row['ms_cegppo']:.2f}",
        f"{row['vs_trl']:.2f}x ({row['vs_trl_range'][0]:.2f}-{row['vs_trl_range'][1]:.2f})",
        f"{row['stats_vs_trl']:.2f}x ({row['stats_vs_trl_range'][0]:.2f}-{row['stats_vs_trl_range'][1]:.2f})",
        f"{row['vs_authors']:.2f}x",
        f"{row['saved_cegppo']:.0f} / {row['saved_authors']:.0f} / {row['saved_trl']:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"sizes {QUICK_SIZES} and fewer repetitions")
    parser.add_argument("--reps", type=int, default=None, help="paired repetitions per size (default 15, quick 7)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    parser.add_argument(
        "--spread",
        type=float,
        nargs="+",
        default=[0.1, 0.3],
        help="std of the log-ratio: 0.1 ~ typical off-policy drift (a few %% of tokens clipped), 0.3 ~ stress (~25%%)",
    )
    parser.add_argument(
        "--advantages", choices=["b1", "bt"], default="b1", help="(B, 1) per-sequence (default) or (B, T) per-token"
    )
    parser.add_argument("--no-delta", action="store_true", help="disable the dual clip (delta=None) in all three")
    parser.add_argument(
        "--delta-low",
        type=float,
        default=None,
        help="time cegppo with the left guard (e.g. 0.75: about 8%% of tokens at --spread 0.3)",
    )
    parser.add_argument("--delta-low-mode", choices=["cutoff", "decay"], default="cutoff")
    parser.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="wall time (default) or this thread's CPU time: steadier on a CPU shared with other jobs",
    )
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    reps = args.reps or (7 if args.quick else 15)
    dtypes = [torch.float32, torch.bfloat16] if args.dtype == "both" else [getattr(torch, args.dtype)]
    delta = None if args.no_delta else DELTA
    print(
        f"# bench_loss: {datetime.date.today()} | {cpu_name()} | "
        f"torch {torch.__version__} | threads={torch.get_num_threads()} | reps={reps} | {args.clock} clock | "
        f"eps={EPSILON_LOW}/{EPSILON_HIGH} beta1={BETA1} beta2={BETA2} delta={delta} | forward+backward, "
        f"advantages {'(B, 1)' if args.advantages == 'b1' else '(B, T)'}; "
        f"ratios are medians of paired per-repetition ratios"
    )
    if args.delta_low is not None:
        guard = dict(delta_low=args.delta_low, delta_low_mode=args.delta_low_mode)
        IMPLEMENTATIONS["cegppo"] = functools.partial(cegppo_term, **guard)
        IMPLEMENTATIONS["cegppo+stats"] = functools.partial(cegppo_term, stats=True, **guard)
        print(f"# cegppo with the left guard {guard}; the other implementations without")
    print(header())
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    run(sizes, dtypes, args.spread, reps, min_block_s=0.02, delta=delta, advantages=args.advantages, clock=clock)


if __name__ == "__main__":
    main()
