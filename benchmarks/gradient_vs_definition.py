"""How far the trainer's gradient is from the definition's, per loss type and feature, in fp32 and fp64.

Trainer: `CEGPPOTrainer._compute_loss` (TRL's `_compute_loss` on the preserved advantages) on one hand-made OFF-POLICY
micro-batch of a tiny Llama, `gppo_beta1=0.5`, `gppo_beta2=1.0`. Definition: autograd through
`cegppo_trl.loss.cegppo_objective`, times TRL's masks (`get_off_policy_mask`, `get_high_entropy_mask`, the tool mask,
the vLLM importance-sampling ratio), plus TRL's KL term, normalised per loss type as TRL's documentation states it
(written out below, not taken from the trainer). Features: plain; `importance_sampling_level="sequence"`; KL
(`beta=0.04`); `top_entropy_quantile=0.5`; `off_policy_mask_threshold=0.5`; the vLLM IS correction (the batch carries
`sampling_per_token_logps` and the `importance_sampling_ratio` TRL's vLLM path derives from it, in TRL's default mode;
the trainer's `use_vllm` is switched on after construction: no vLLM is needed); tools (a `tool_mask`); `delta=1.3`
(dual clip); `delta_low=0.6` (left guard, cutoff and decay).

Honesty checks, each case fails loudly (exit 1) unless: tokens in the loss are clipped on the left and on the right
(and in the dual-clip / guard region where that feature is on); the preserved part of the gradient (the trainer's
minus `GRPOTrainer._compute_loss`'s on the same batch) is non-zero; the feature's mask does take something out; a
relative change of 1e-3 in beta1 or beta2 moves the definition's gradient by more than the difference (the comparison
can see the preserved part); and the fp64 difference is <= 1e-12. The batch is in the model's dtype (advantages too).

fp32 runs TRL's own fused LM head. TRL 1.16's fused head computes log-probs, entropies and their backward in fp32
whatever the model's dtype, so an fp64 model alone would compare two fp32 computations; the fp64 column therefore
replaces the head, on both sides, by a plain fp64 log-softmax (`exact_head`). The seam's code path is the same.

Run from the repository root: ``python benchmarks/gradient_vs_definition.py [--out FILE]``.
"""

from __future__ import annotations

import argparse
import datetime
import math
import platform
import sys
import tempfile
from types import SimpleNamespace

import torch
from _machine import cpu_name
from datasets import Dataset
from transformers import AutoTokenizer
from trl import GRPOTrainer
from trl import __version__ as trl_version

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama
from cegppo_trl.loss import cegppo_objective

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo")
EPS, BETA1, BETA2, KL_BETA, T = 0.2, 0.5, 1.0, 0.04, 12
MOVE = 1e-3  # the sensitivity check's relative change of beta1 / beta2
FEATURES = {  # name: CEGPPOConfig overrides
    "plain": {},
    "sequence": {"importance_sampling_level": "sequence"},
    "kl": {"beta": KL_BETA},
    "entropy_q": {"top_entropy_quantile": 0.5},
    "off_policy_mask": {"off_policy_mask_threshold": 0.5},
    "vllm_is": {},
    "tools": {},
    "delta": {"delta": 1.3},
    "delta_low": {"delta_low": 0.6},
    "delta_low_decay": {"delta_low": 0.6, "delta_low_mode": "decay"},
}
# Per row: advantage and a shift of log r, so that whole sequences (the sequence-level ratio) are clipped on both
# sides, one lies beyond `delta`, one below `delta_low` and beyond the off-policy mask's KL threshold.
ADVANTAGES = (1.0, -1.0, 0.5, -0.7, 0.0, 1.3, -1.2, 0.8)
LOG_R_SHIFT = (0.4, -0.4, -0.3, 0.4, 0.0, 0.1, -0.6, 0.0)


def reward(completions, **kwargs):
    return [float(len(c)) for c in completions]


def save_tiny_model() -> str:
    """The tiny Llama saved once: with `beta > 0` TRL loads its reference model from the policy's path."""
    folder, tokenizer = tempfile.mkdtemp(), build_char_tokenizer()
    build_tiny_llama(tokenizer, seed=0).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def make_trainer(model_dir: str, loss_type: str, feature: str, dtype: torch.dtype) -> CEGPPOTrainer:
    args = CEGPPOConfig(
        output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", save_strategy="no", disable_tqdm=True,
        per_device_train_batch_size=8, num_generations=4, max_completion_length=T, num_iterations=2, seed=0,
        loss_type=loss_type, epsilon=EPS, gppo_beta1=BETA1, gppo_beta2=BETA2, **FEATURES[feature],
    )  # fmt: skip
    trainer = CEGPPOTrainer(
        model=model_dir, reward_funcs=reward, args=args, train_dataset=Dataset.from_dict({"prompt": ["1+1="] * 8}),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )  # fmt: skip
    trainer.model.to(dtype)
    if dtype == torch.float64:
        exact_head(trainer.model, trainer.temperature)
    if feature == "vllm_is":  # what `use_vllm=True` sets, without a vLLM server: `_compute_loss` reads only these
        trainer.use_vllm, trainer.vllm_importance_sampling_correction = True, True
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    return trainer


def exact_head(model, temperature: float) -> None:
    """Log-probs and entropies by a plain log-softmax in the model's dtype, for the fp64 column: TRL 1.16's fused LM
    head (`add_fused_lm_head`) computes them, and their backward, in fp32 whatever the model's dtype, which would
    round both sides' per-token gradients to fp32 (and make any difference below that vanish)."""
    fused = model.forward

    def forward(*args, fused_lm_head=False, labels=None, **kwargs):
        if not fused_lm_head:
            return fused(*args, labels=labels, **kwargs)
        logits = type(model).forward(model, *args, use_cache=False, **kwargs).logits[:, :-1] / temperature
        labels = labels[:, 1:]
        all_logps = logits.log_softmax(-1)
        logps = all_logps.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1).masked_fill(labels == -100, 0)
        entropy = -(all_logps.exp() * all_logps).sum(-1).masked_fill(labels == -100, 0)
        return SimpleNamespace(log_probs=logps, entropy=entropy, aux_loss=None)

    model.forward = forward


def forward(trainer, batch):
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    logps, entropies, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, attention, T,
                                                                      compute_entropy=True)  # fmt: skip
    return logps, entropies


def make_batch(trainer, feature: str, dtype: torch.dtype) -> dict:
    """An off-policy micro-batch (old log-probs = current - shift -+0.6), as TRL's `_generate_and_score_completions`
    hands it over; the vLLM fields as TRL's vLLM path computes them (its default mode), a tool mask for `tools`."""
    g = torch.Generator().manual_seed(0)
    b, vocab = len(ADVANTAGES), trainer.model.config.vocab_size
    batch = {
        "prompt_ids": torch.randint(4, vocab, (b, 4), generator=g),
        "completion_ids": torch.randint(4, vocab, (b, T), generator=g),
        "prompt_mask": torch.ones(b, 4, dtype=torch.long),
        "completion_mask": torch.ones(b, T, dtype=torch.long),
        "advantages": torch.tensor(ADVANTAGES, dtype=dtype),
    }
    batch["prompt_mask"][0, 0] = 0  # left padding
    batch["completion_mask"][1, -3:] = 0  # shorter completions
    batch["completion_mask"][2, -1:] = 0
    with torch.no_grad():
        logps, _ = forward(trainer, batch)
    shift = torch.tensor(LOG_R_SHIFT, dtype=dtype).unsqueeze(1)
    batch["old_per_token_logps"] = logps - shift + (torch.rand(logps.shape, generator=g, dtype=dtype) * 1.2 - 0.6)
    mask = batch["completion_mask"]
    if feature == "tools":
        batch["tool_mask"] = torch.ones_like(mask)
        batch["tool_mask"][[0, 1, 3, 5, 6], 4:7] = 0  # tool outputs inside completions
        mask = mask * batch["tool_mask"]
    if feature == "kl":
        batch["ref_per_token_logps"] = logps + (torch.rand(logps.shape, generator=g, dtype=dtype) * 0.6 - 0.3)
    if feature == "vllm_is":  # TRL 1.16 `_generate_and_score_completions`, vLLM branch, verbatim in substance
        sampling = batch["old_per_token_logps"] + (torch.rand(logps.shape, generator=g, dtype=dtype) * 0.3 - 0.15)
        sampling[7, :] -= 0.2  # one sequence far enough from the sampler to be masked (ratio above clip_max = 3)
        diff = torch.nan_to_num((batch["old_per_token_logps"] - sampling) * mask, nan=0.0)
        mode = trainer.vllm_importance_sampling_mode
        ratio = torch.exp(diff.sum(-1, keepdim=True) if mode.startswith("sequence") else diff)
        lo, hi = trainer.vllm_importance_sampling_clip_min, trainer.vllm_importance_sampling_clip_max
        if mode.endswith("truncate"):
            ratio = ratio.clamp(min=lo, max=hi)
        else:
            ratio = ratio.masked_fill((ratio < (-math.inf if lo is None else lo)) | (ratio > hi), 0.0)
        batch["sampling_per_token_logps"], batch["importance_sampling_ratio"] = sampling, ratio
    batch["num_items_in_batch"] = mask.sum().to(dtype)  # TRL: the generation batch's loss tokens (here one batch)
    return batch


def definition(trainer, batch, beta1: float, beta2: float):
    """The definition's loss (and, for the checks, the per-token weights in the loss and the region masks)."""
    args, loss_type = trainer.args, trainer.loss_type
    logps, entropies = forward(trainer, batch)
    mask = batch["completion_mask"].to(logps.dtype)
    if "tool_mask" in batch:
        mask = mask * batch["tool_mask"]
    old, adv = batch["old_per_token_logps"], batch["advantages"].unsqueeze(1)
    log_r = logps - old
    if args.importance_sampling_level == "sequence":  # GSPO: one ratio per sequence, the masked mean log r
        log_r = ((log_r * mask).sum(-1) / mask.sum(-1).clamp(min=1)).unsqueeze(1)
    per_token = cegppo_objective(log_r, torch.zeros_like(log_r), adv, epsilon_low=EPS, epsilon_high=EPS, beta1=beta1,
                                 beta2=beta2, delta=args.delta, delta_low=args.delta_low,
                                 delta_low_mode=args.delta_low_mode).expand_as(mask)  # fmt: skip
    keep = torch.ones_like(mask)  # what TRL's masks leave of each token's weight
    if args.off_policy_mask_threshold is not None:
        sampling = batch.get("sampling_per_token_logps", old)
        keep = keep * GRPOTrainer.get_off_policy_mask(adv, logps, sampling, mask, args.off_policy_mask_threshold)
    if args.top_entropy_quantile < 1.0:
        keep = keep * trainer.get_high_entropy_mask(entropies.detach(), mask, 1 - args.top_entropy_quantile)
    if "importance_sampling_ratio" in batch:
        keep = keep * batch["importance_sampling_ratio"]
    per_token = per_token * keep
    if args.beta:  # TRL's k3 estimator of KL(pi || ref), with its importance-sampling correction
        d = batch["ref_per_token_logps"] - logps
        kl = torch.exp(d) - d - 1
        per_token = per_token + args.beta * (kl * torch.exp(log_r) if args.use_bias_correction_kl else kl)
    b = mask.size(0)
    weight = {  # d loss / d per-token loss, one process, one micro-batch per step (TRL's loss_type docs)
        "grpo": mask / mask.sum(-1, keepdim=True).clamp(min=1) / b,  # sequence means, averaged
        "bnpo": mask / mask.sum().clamp(min=1),  # token mean of the micro-batch
        "dr_grpo": mask / (b * args.max_completion_length),  # a constant
        "dapo": mask / batch["num_items_in_batch"].clamp(min=1) * args.steps_per_generation,  # token mean of the
        "luspo": mask / b,  # sequence sums, averaged                                         # generation batch
    }[loss_type]
    regions = {
        "left": ((adv < 0) & (log_r < math.log(1 - EPS))).expand_as(mask),
        "right": ((adv > 0) & (log_r > math.log(1 + EPS))).expand_as(mask),
        "dual": ((adv < 0) & (log_r > math.log(args.delta or math.inf))).expand_as(mask),
        "guard": ((adv < 0) & (log_r < math.log(args.delta_low or 1e-300))).expand_as(mask),
    }
    return (per_token * weight).sum(), mask * keep.detach(), regions


def grads(loss, trainer):
    return torch.autograd.grad(loss, [p for p in trainer.model.parameters() if p.requires_grad])


def measure(model_dir: str, loss_type: str, feature: str, dtype: torch.dtype) -> dict:
    trainer = make_trainer(model_dir, loss_type, feature, dtype)
    batch = make_batch(trainer, feature, dtype)
    trained = grads(trainer._compute_loss(trainer.model, dict(batch)), trainer)
    grpo = grads(GRPOTrainer._compute_loss(trainer, trainer.model, dict(batch)), trainer)  # TRL alone, same batch
    loss, in_loss, regions = definition(trainer, batch, BETA1, BETA2)
    reference = grads(loss, trainer)
    # Can the comparison see a difference at all? The definition with beta1, then beta2, moved by MOVE (relative).
    moved = [
        grads(definition(trainer, batch, b1, b2)[0], trainer)
        for b1, b2 in ((BETA1 * (1 + MOVE), BETA2), (BETA1, BETA2 * (1 + MOVE)))
    ]
    counted = {name: int(((in_loss != 0) & region).sum()) for name, region in regions.items()}
    return {
        **counted,
        "masked_out": int(((batch["completion_mask"] != 0) & (in_loss == 0)).sum()),
        "moved": min(max((a - b).abs().max().item() for a, b in zip(trained, g, strict=True)) for g in moved),
        "preserved_norm": torch.sqrt(sum(((a - b) ** 2).sum() for a, b in zip(trained, grpo, strict=True))).item(),
        "max_grad": max(g.abs().max().item() for g in reference),
        "diff": max((a - b).abs().max().item() for a, b in zip(trained, reference, strict=True)),
    }


def failures(feature: str, row: dict, dtype: torch.dtype) -> list[str]:
    wanted = ["left", "right"] + {"delta": ["dual"], "delta_low": ["guard"], "delta_low_decay": ["guard"]}.get(
        feature, []
    )
    problems = [f"no {name}-region token in the loss" for name in wanted if row[name] == 0]
    if row["preserved_norm"] == 0:
        problems.append("the preserved gradient is zero (the trainer's gradient is GRPO's)")
    if feature in ("entropy_q", "off_policy_mask", "vllm_is", "tools") and row["masked_out"] == 0:
        problems.append("the feature's mask takes no token out")
    if row["moved"] <= row["diff"] or (dtype == torch.float64 and row["moved"] <= 1e-12):
        problems.append(f"a {MOVE:g} change of beta1 or beta2 moves the gradient by only {row['moved']:.1e}")
    if dtype == torch.float64 and not row["diff"] <= 1e-12:
        problems.append(f"fp64 difference {row['diff']:.2e} > 1e-12")
    return problems


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lines = [
        f"# gradient vs definition, {datetime.datetime.now():%Y-%m-%d %H:%M} | {cpu_name()} | python {platform.python_version()} | torch {torch.__version__} | trl {trl_version}",
        "",
        "| loss_type | feature | left | right | dual | guard | masked out | preserved-gradient norm | max abs grad | "
        f"β ×(1+{MOVE:g}) moves it by | fp32 max abs diff | fp64 max abs diff |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    table, problems, model_dir = {}, [], save_tiny_model()
    for loss_type in LOSS_TYPES:
        for feature in FEATURES:
            rows = {dtype: measure(model_dir, loss_type, feature, dtype) for dtype in (torch.float32, torch.float64)}
            row64 = rows[torch.float64]
            for dtype, row in rows.items():
                problems += [f"{loss_type}/{feature}/{dtype}: {p}" for p in failures(feature, row, dtype)]
            table[loss_type, feature] = (rows[torch.float32]["diff"], row64["diff"])
            counts = " | ".join(str(row64[k]) for k in ("left", "right", "dual", "guard", "masked_out"))
            line = (f"| {loss_type} | {feature} | {counts} | {row64['preserved_norm']:.3e} | {row64['max_grad']:.3e} | "
                    f"{row64['moved']:.1e} | {rows[torch.float32]['diff']:.1e} | {row64['diff']:.1e} |")  # fmt: skip
            lines.append(line)
            print(line, flush=True)
    lines += ["", "max abs difference, fp32 / fp64:", "", "| loss_type | " + " | ".join(FEATURES) + " |",
              "|---|" + "---|" * len(FEATURES)]  # fmt: skip
    for loss_type in LOSS_TYPES:
        cells = [f"{table[loss_type, f][0]:.0e} / {table[loss_type, f][1]:.0e}" for f in FEATURES]
        lines.append(f"| {loss_type} | " + " | ".join(cells) + " |")
    lines += ["", "FAILED:" if problems else "all checks passed (clipped tokens on both sides, preserved gradient > 0, "
              "masks active, fp64 <= 1e-12)", *problems]  # fmt: skip
    print("\n".join(lines[-(len(LOSS_TYPES) + 6 + len(problems)) :]))
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines) + "\n")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
