"""The β-response probe: how (β1, β2) move entropy on *your* model, measured from shared branch points.

    cegppo probe --config RECIPE [any `cegppo train` flag ...] --probe_arms "0,0;0.5,1" --probe_branch_points 6

Protocol (`run_probe`), in this order:

1. A fixed probe set is sampled once from the starting model (`probe_prompts` prompts, one completion each) with the
   run's own sampling settings (TRL's `generation_config`: temperature, `top_k`, `top_p`, `min_p`, repetition
   penalty, `generation_kwargs`) and a seed of its own; every generator it touches (CPU, every CUDA device's, Python,
   NumPy) is put back after, so training's random stream is untouched. Probe entropy is the mean full-vocabulary
   entropy of the policy TRL trains at every completion position of these fixed sequences (no grad), computed by
   TRL's own `_get_per_token_logps_and_entropies`, which divides the logits by `temperature` as the loss and TRL's
   logged `entropy` do. Every arm is measured on the same tokens, so which prefixes an arm sampled does not enter.
2. At each of K branch points (a rollout-batch boundary) the run's state is snapshotted in memory: weights,
   optimizer, lr scheduler, the torch RNG of the CPU and of every CUDA device, Python's and NumPy's, `trainer.state`,
   TRL's step counter, buffered rollout batch and vLLM weight-sync step, the trainer's run state, and the dataloader
   batches of the next rollout batch (pulled once). With `vllm_mode="server"` the server samples in another process,
   whose generator no snapshot reaches: the probe gives every request of a rollout batch a seed of that batch's
   instead (`_VllmRequestSeed`), the same for every arm. Colocated vLLM samples in this process, from the device
   generator the snapshot restores (neither vLLM path is exercised by the CPU tests: the batch-hash check below stops
   the probe if one does not hold).
3. Each arm restores that snapshot, sets its constant (β1, β2) and takes the run's optimizer steps for one rollout
   batch (`steps_per_generation × num_iterations / gradient_accumulation_steps`) through the trainer's own
   `training_step`, clipping, optimizer and scheduler, exactly as `Trainer`'s loop does. Restoring the RNG makes every
   arm generate the same rollout batch; the probe checks it (a hash of the completion ids each arm trained on) and
   stops if one differs. It records the probe-entropy change and the token shares of the four clip regions
   (A > 0 / A < 0 × r < 1 - ε_low / r > 1 + ε_high) over the arm's steps. The left-drift warning of an arm's step
   names the arm (its β is the arm's: the loss reads the schedules the probe sets).
4. The reference arm (the first arm, GRPO's (0, 0) by default) runs last; its end state is the base run's next state
   (not recomputed). Non-branch rollout batches (`branch_every` > 1) are trained with the reference arm.
5. Per arm: D = its probe-entropy change minus the reference arm's at the same branch point; over the K branch points
   the mean, a 95 % Student-t interval and the exact two-sided sign-flip p-value (`cegppo_trl.research.stats`), and how
   often the trainer's per-step predictor (`cegppo/predictor/entropy_change`, summed over the arm's steps, minus the
   reference arm's) had D's sign.

CPU fp32 is deterministic, so arms with identical β give bit-identical results (tests/test_probe.py; on a GPU, as far
as its kernels are deterministic: the batch-hash check says when they are not), and the only
variance left in D is how the effect varies across training states. One process only (no DDP / DeepSpeed); the
entropy controller is refused (it would move β away from the arm's values). The run must be off-policy
(`steps_per_generation × num_iterations > gradient_accumulation_steps`): on policy r ≡ 1, nothing is clipped and every
arm equals GRPO (a warning says so).
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .stats import sign_flip_p, t_interval

__all__ = [
    "DEFAULT_ARMS",
    "ProbeSettings",
    "ProbeSet",
    "arm_name",
    "build_probe_set",
    "parse_arms",
    "plot_probe",
    "probe_entropy",
    "probe_generation_config",
    "run_probe",
    "summarize_probe",
]

logger = logging.getLogger(__name__)

# The arms of docs/entropy-study.md's probe study; the first is the reference (CE-GPPO at (0, 0) has GRPO's gradient).
DEFAULT_ARMS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.0, 1.0), (0.5, 1.0), (0.75, 1.0))  # fmt: skip
REGIONS = ("pos_below", "pos_above", "neg_below", "neg_above")  # A>0 r<1-ε, A>0 r>1+ε (β2), A<0 r<1-ε (β1), A<0 r>1+ε


def arm_name(arm: Sequence) -> str:
    """`(0.5, 1)`: the arm's (β1, β2) as printed and used as a key; `(0, 1) raise` for an arm with a variant label."""
    return f"({arm[0]:g}, {arm[1]:g})" + (f" {arm[2]}" if len(arm) > 2 else "")


def parse_arms(text: str) -> tuple[tuple[float, float], ...]:
    """`"0,0;0.5,1"` -> ((0.0, 0.0), (0.5, 1.0)): arms separated by `;`, each `beta1,beta2`; the first is the reference."""
    arms = []
    for part in text.split(";"):
        if not part.strip():
            continue
        values = part.split(",")
        if len(values) != 2:
            raise ValueError(f"`--probe_arms`: each arm is `beta1,beta2`, got {part!r} in {text!r}.")
        try:
            beta1, beta2 = float(values[0]), float(values[1])
        except ValueError:
            raise ValueError(f"`--probe_arms`: {part!r} is not two numbers (e.g. `0.5,1`).") from None
        if beta1 < 0 or beta2 < 0 or not (math.isfinite(beta1) and math.isfinite(beta2)):
            raise ValueError(f"`--probe_arms`: β must be finite and >= 0, got {part!r}.")
        arms.append((beta1, beta2))
    if len(arms) < 2:
        raise ValueError(f"`--probe_arms` needs a reference arm and at least one other, got {text!r}.")
    if len(set(arms)) != len(arms):
        raise ValueError(f"`--probe_arms` names an arm twice: {text!r}.")
    return tuple(arms)


@dataclass
class ProbeSettings:
    """What the probe does beyond the run's own settings.

    Attributes:
        arms: (β1, β2) per arm, or (β1, β2, label) for a variant of the loss that `run_probe`'s `arm_setup` applies;
            the first is the reference (its run is the base run's continuation).
        branch_points: K, the number of branch points.
        branch_every: rollout batches from one branch point to the next (1: every rollout batch).
        probe_prompts: prompts in the probe set (one sampled completion each).
        probe_seed: the seed of the probe set's sampling (a private RNG).
        max_seconds: stop after the branch point that ends past this many seconds (None: no limit).
    """

    arms: tuple[tuple[float, float], ...] = DEFAULT_ARMS
    branch_points: int = 6
    branch_every: int = 1
    probe_prompts: int = 32
    probe_seed: int = 1234
    max_seconds: float | None = None

    def __post_init__(self):
        if any(len(arm) not in (2, 3) for arm in self.arms):
            raise ValueError(f"ProbeSettings.arms: each arm is (β1, β2) or (β1, β2, label), got {self.arms}.")
        self.arms = tuple((float(arm[0]), float(arm[1]), *map(str, arm[2:])) for arm in self.arms)
        if len(self.arms) < 2 or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"ProbeSettings.arms: a reference and at least one other arm, no repeats: {self.arms}.")
        if self.branch_points < 1 or self.branch_every < 1 or self.probe_prompts < 1:
            raise ValueError("ProbeSettings: branch_points, branch_every and probe_prompts must be >= 1.")


# ----------------------------------------------------------------------------------------------------------------
# The probe set and its entropy
# ----------------------------------------------------------------------------------------------------------------
@dataclass
class ProbeSet:
    """Fixed sequences: left-padded prompts and right-padded completions (ids and masks, [N, P] and [N, C])."""

    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    def digest(self) -> str:
        """A hash of the token ids and masks: equal digests, the same probe set."""
        h = hashlib.sha256()
        for t in (self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask):
            h.update(t.to(torch.int64).contiguous().numpy().tobytes())
        return h.hexdigest()[:16]


def _prompt_text(tokenizer, prompt: Any) -> str:
    if isinstance(prompt, list):  # conversational: the chat template, as TRL applies it
        return tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return prompt


def probe_generation_config(trainer):
    """The `GenerationConfig` the trainer samples its rollouts with, for the probe set.

    TRL's own object where it has one (generation by the training model: temperature, `top_k`, `top_p`, `min_p`,
    repetition penalty, EOS ids and `generation_kwargs`, as TRL builds them). With vLLM, TRL samples through
    `SamplingParams` built from the same config fields; these become a transformers config here (`generation_kwargs`
    then holds vLLM keys, which `generate` does not take, so it is left out).
    """
    from transformers import GenerationConfig

    config = getattr(trainer, "generation_config", None)
    if isinstance(config, GenerationConfig):
        return config
    args = trainer.args
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    return GenerationConfig(
        max_new_tokens=args.max_completion_length, do_sample=True, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=getattr(trainer, "eos_token_ids", tokenizer.eos_token_id), temperature=args.temperature,
        top_p=args.top_p, top_k=args.top_k, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        disable_compile=True,
    )  # fmt: skip


@torch.no_grad()
def build_probe_set(model, tokenizer, prompts: Sequence[Any], *, max_new_tokens: int | None = None,
                    temperature: float = 1.0, seed: int = 1234, generation_config=None) -> ProbeSet:  # fmt: skip
    """Sample one completion per prompt from `model` with a seed of its own; every global generator is restored after.

    Args:
        model: the starting policy.
        tokenizer: its tokenizer (left padding is used for the prompts whatever it is set to).
        prompts: plain strings or chat-message lists.
        max_new_tokens: the completion budget (the run's `max_completion_length`; overrides `generation_config`'s).
        temperature: the sampling temperature when no `generation_config` is given (then plain sampling: no top-k,
            no top-p).
        seed: the sampling seed.
        generation_config: the run's sampling settings (`probe_generation_config(trainer)`), used as they are.
    """
    from transformers import GenerationConfig

    if generation_config is None:
        generation_config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                             pad_token_id=tokenizer.pad_token_id,
                                             eos_token_id=tokenizer.eos_token_id, disable_compile=True)  # fmt: skip
    if max_new_tokens is not None:
        generation_config = copy.deepcopy(generation_config)  # the trainer's own is left as it is
        generation_config.max_new_tokens = max_new_tokens
    texts = [_prompt_text(tokenizer, p) for p in prompts]
    side = tokenizer.padding_side
    tokenizer.padding_side = "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    # `torch.manual_seed` seeds the CPU and every CUDA device: all of them (and Python's, NumPy's) are put back.
    state = _rng_state()
    try:
        torch.manual_seed(seed)
        out = model.generate(
            input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
            generation_config=generation_config,
        )  # fmt: skip
    finally:
        _set_rng_state(state)
        model.train(was_training)
    completion_ids = out[:, enc["input_ids"].shape[1] :].cpu()
    # Keep tokens up to and including the first EOS (TRL's completion mask), for any of the config's EOS ids.
    eos_ids = generation_config.eos_token_id if generation_config.eos_token_id is not None else tokenizer.eos_token_id
    eos = torch.isin(completion_ids, torch.tensor(eos_ids).reshape(-1))
    after_eos = (eos.cumsum(1) - eos.long()) > 0
    completion_mask = (~after_eos).long()
    return ProbeSet(enc["input_ids"], enc["attention_mask"], completion_ids, completion_mask)


@torch.no_grad()
def probe_entropy(policy, probe_set: ProbeSet, batch_size: int = 16, *, temperature: float = 1.0) -> float:
    """Token-mean entropy (nats) of the full next-token distribution at each completion position of the set.

    Args:
        policy: a `GRPOTrainer` (then TRL's `_get_per_token_logps_and_entropies` on its model: the distribution it
            trains and whose entropy it logs, logits divided by `args.temperature`, under its autocast dtype), or a
            bare model (its fp32 logits divided by `temperature`, as TRL divides them).
        probe_set: the fixed sequences.
        batch_size: sequences per forward pass.
        temperature: the bare model's temperature (a trainer uses its own).
    """
    trainer = policy if hasattr(policy, "_get_per_token_logps_and_entropies") else None
    model = trainer.model if trainer is not None else policy
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    total, count = 0.0, 0.0
    prompt_len, completion_len = probe_set.prompt_ids.shape[1], probe_set.completion_ids.shape[1]
    try:
        for start in range(0, probe_set.prompt_ids.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            ids = torch.cat([probe_set.prompt_ids[rows], probe_set.completion_ids[rows]], 1).to(device)
            attention = torch.cat([probe_set.prompt_mask[rows], probe_set.completion_mask[rows]], 1).to(device)
            if trainer is not None:
                _, entropy, _ = trainer._get_per_token_logps_and_entropies(
                    model, ids, attention, completion_len, compute_entropy=True
                )  # [B, C]
            else:
                logits = model(input_ids=ids, attention_mask=attention).logits[:, prompt_len - 1 : -1]  # [B, C, V]
                logp = torch.log_softmax(logits.float() / temperature, -1)
                entropy = -(logp.exp() * logp).sum(-1)  # [B, C]
            mask = probe_set.completion_mask[rows].to(device).float()
            total += float((entropy.float() * mask).sum())
            count += float(mask.sum())
    finally:
        model.train(was_training)
    return total / max(count, 1.0)


# ----------------------------------------------------------------------------------------------------------------
# Snapshots and one arm
# ----------------------------------------------------------------------------------------------------------------
def _clone(obj):
    """A deep copy with every tensor cloned (state dicts share storage with the live model otherwise)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return copy.deepcopy(obj)


def _numpy():
    """NumPy when something has imported it (transformers does), else None: its global RNG is snapshotted too (a
    reward function may draw from it), without making NumPy a dependency of the package."""
    return sys.modules.get("numpy")


def _rng_state() -> dict:
    """Every global generator a rollout batch or the probe set can draw from: torch's CPU generator, every CUDA (and
    XPU) device's and MPS's (sampling on an accelerator draws from the device's; `torch.manual_seed` seeds them all),
    Python's and NumPy's (reward functions may)."""
    np = _numpy()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "xpu": torch.xpu.get_rng_state_all() if torch.xpu.is_available() else None,
            "mps": torch.mps.get_rng_state() if torch.backends.mps.is_available() else None,
            "numpy": None if np is None else np.random.get_state()}  # fmt: skip


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])
    if state["xpu"] is not None:
        torch.xpu.set_rng_state_all(state["xpu"])
    if state["mps"] is not None:
        torch.mps.set_rng_state(state["mps"])
    random.setstate(state["python"])
    if state["numpy"] is not None:
        _numpy().random.set_state(state["numpy"])


def _snapshot(trainer) -> dict:
    return {
        "model": _clone(trainer.model.state_dict()),
        "optimizer": _clone(trainer.optimizer.state_dict()),
        "scheduler": _clone(trainer.lr_scheduler.state_dict()),
        "rng": _rng_state(),
        "state": copy.deepcopy(trainer.state),
        "step": trainer._step,
        "buffered": trainer._buffered_inputs,  # replaced, never mutated, by TRL: a reference is enough
        "vllm_loaded_step": getattr(trainer, "_last_loaded_step", None),  # vLLM: when its weights were last synced
        "run_state": [_clone(c.state()["attributes"]) for c in trainer._run_state_callbacks],
    }


def _restore(trainer, snap: dict) -> None:
    trainer.model.load_state_dict(snap["model"])
    trainer.optimizer.load_state_dict(_clone(snap["optimizer"]))
    trainer.lr_scheduler.load_state_dict(_clone(snap["scheduler"]))
    _set_rng_state(snap["rng"])
    trainer.state = copy.deepcopy(snap["state"])
    trainer._step = snap["step"]
    trainer._buffered_inputs = snap["buffered"]
    if snap["vllm_loaded_step"] is not None:
        trainer._last_loaded_step = snap["vllm_loaded_step"]
    for callback, state in zip(trainer._run_state_callbacks, snap["run_state"], strict=True):
        callback.load_state_dict(_clone(state))
    trainer.model.zero_grad(set_to_none=True)


def _set_betas(trainer, arm: tuple, arm_setup: Callable[[Any, tuple], None] | None = None) -> None:
    from ..schedules import parse_schedule

    trainer.beta1_schedule = parse_schedule(arm[0])
    trainer.beta2_schedule = parse_schedule(arm[1])
    trainer._schedules_checked_for = None
    if arm_setup is not None:
        arm_setup(trainer, arm)


class _Recorder:
    """Hooks the trainer's per-micro-batch metric call to count the four clip regions and hash the batch trained on.

    `CEGPPOTrainer` hands every micro-batch and the policy's log-probabilities to `_preserve_gradient` at TRL's
    forward pass; the recorder wraps that call (an instance attribute, so the class is untouched) and adds up token
    counts per region, weighted by the loss mask.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.original = trainer._preserve_gradient
        self.arm: tuple[float, float] | None = None  # the arm being trained: its name heads the drift warning
        self.reset()

    def reset(self) -> None:
        self.counts = dict.fromkeys(REGIONS, 0.0)
        self.tokens = 0.0

    def __enter__(self):
        trainer = self.trainer

        def hooked(batch, logps, entropies):
            if trainer.model.training and batch.get("old_per_token_logps") is not None:
                low, high = math.log(1 - trainer.epsilon_low), math.log1p(trainer.epsilon_high)
                mask = batch["completion_mask"] * batch.get("tool_mask", 1.0)
                log_ratio = logps.detach() - batch["old_per_token_logps"]
                advantages = batch["advantages"]
                advantages = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
                lr, adv, m = log_ratio, advantages.detach().expand_as(log_ratio), mask.detach().float()
                for name, region in (
                    ("pos_below", (adv > 0) & (lr < low)),
                    ("pos_above", (adv > 0) & (lr > high)),
                    ("neg_below", (adv < 0) & (lr < low)),
                    ("neg_above", (adv < 0) & (lr > high)),
                ):
                    self.counts[name] += float((region.float() * m).sum())
                self.tokens += float(m.sum())
            return self.original(batch, logps, entropies)

        trainer._preserve_gradient = hooked
        alarm = trainer.left_drift_alarm
        if alarm is not None:
            # The warning's β is the loss's (the arm's schedules); it says it is a probe arm, not the configured run.
            def labelled(*args, **kwargs):
                text = type(alarm).warning(alarm, *args, **kwargs)
                if text is None or self.arm is None:
                    return text
                return f"[cegppo probe, arm (β1, β2) = {arm_name(self.arm)}] {text}"

            alarm.warning = labelled
        return self

    def __exit__(self, *exc):
        del self.trainer._preserve_gradient  # back to the class's method
        if self.trainer.left_drift_alarm is not None:
            self.trainer.left_drift_alarm.__dict__.pop("warning", None)
        return False

    def shares(self) -> dict[str, float]:
        return {k: v / self.tokens if self.tokens else math.nan for k, v in self.counts.items()}


def _batch_digest(trainer) -> tuple[str, float]:
    """A hash of the buffered rollout batch's completion ids and masks (all micro-batches, in order), and its mean
    |advantage| (reported beside it)."""
    h = hashlib.sha256()
    for part in trainer._buffered_inputs:
        h.update(part["completion_ids"].to("cpu", torch.int64).contiguous().numpy().tobytes())
        h.update(part["completion_mask"].to("cpu", torch.int64).contiguous().numpy().tobytes())
    advantages = torch.cat([p["advantages"].reshape(-1) for p in trainer._buffered_inputs])
    return h.hexdigest()[:16], float(advantages.abs().mean())


class _VllmRequestSeed:
    """Server-mode vLLM samples in the server's process, out of the snapshot's reach: `set(seed)` before a rollout
    batch gives its requests that seed (`SamplingParams.seed`, through TRL's `generation_kwargs`) so that every arm of
    a branch point draws the same rollout batch; the user's `generation_kwargs` are put back on exit. Nothing changes
    without vLLM, with colocated vLLM (it samples in this process, from the restored device generator) or with a seed
    of the user's. A per-request seed gives two requests of the same prompt in one rollout batch the same samples."""

    def __init__(self, trainer):
        generation = getattr(trainer, "vllm_generation", None)
        server = getattr(trainer, "use_vllm", False) and getattr(generation, "mode", None) == "server"
        self.generation = generation if server and "seed" not in (generation.generation_kwargs or {}) else None

    def __enter__(self):
        if self.generation is not None:
            self.user_kwargs = self.generation.generation_kwargs
        return self

    def set(self, seed: int) -> None:
        if self.generation is not None:
            self.generation.generation_kwargs = {**(self.user_kwargs or {}), "seed": seed}  # a new dict each time

    def __exit__(self, *exc):
        if self.generation is not None:
            self.generation.generation_kwargs = self.user_kwargs
        return False


def _train_rollout_batch(trainer, batches: Sequence[dict], ga: int) -> tuple[list[float], float, dict]:
    """The run's optimizer steps on one rollout batch, as `Trainer._inner_training_loop` takes them; the losses, the
    entropy change the trainer's per-step predictor summed over them (`cegppo/predictor/entropy_change`) and the mean
    of its shares (`right_raise_frac`, `left_raise_frac` over the micro-batches that had such tokens)."""
    model = trainer.model
    losses = []
    for start in range(0, len(batches), ga):
        micro = batches[start : start + ga]
        trainer.current_gradient_accumulation_steps = len(micro)
        for i, inputs in enumerate(micro):
            trainer.accelerator.gradient_state._set_sync_gradients(i == len(micro) - 1)
            losses.append(float(trainer.training_step(model, inputs, None)))
        if trainer.args.max_grad_norm is not None and trainer.args.max_grad_norm > 0:
            trainer._clip_grad_norm(model)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()
        model.zero_grad(set_to_none=True)
        trainer.state.global_step += 1
    metrics = trainer._metrics["train"]
    predicted = sum(metrics.get("cegppo/predictor/entropy_change", []))
    shares = {side: sum(v) / len(v) for side in ("right_raise_frac", "left_raise_frac")
              if (v := metrics.get(f"cegppo/predictor/{side}"))}  # fmt: skip
    for values in trainer._metrics.values():  # TRL's log() would clear them; nothing is logged here
        values.clear()
    return losses, predicted, shares


# ----------------------------------------------------------------------------------------------------------------
# The probe
# ----------------------------------------------------------------------------------------------------------------
def _check_trainer(trainer) -> tuple[int, int]:
    """(micro-batches per rollout batch, gradient accumulation steps); refuses what the probe cannot branch."""
    args = trainer.args
    if trainer.accelerator.num_processes != 1:
        raise ValueError("`cegppo probe` runs in one process (no DDP / DeepSpeed launch).")
    if getattr(trainer, "entropy_controller", None) is not None:
        raise ValueError("`cegppo probe` sets β per arm; drop `--entropy_controller`.")
    ga = args.gradient_accumulation_steps
    per_batch = args.steps_per_generation * trainer.num_iterations
    if per_batch % ga:
        raise ValueError(
            f"steps_per_generation × num_iterations ({per_batch}) must be a multiple of gradient_accumulation_steps "
            f"({ga}): a branch point is a rollout-batch boundary that is also an optimizer-step boundary."
        )
    if per_batch == ga:
        logger.warning(
            "The run is on-policy (one optimizer step per rollout batch): r = 1, nothing is clipped, and every arm "
            "gives GRPO's update. Raise `steps_per_generation` to probe β."
        )
    return per_batch, ga


def run_probe(trainer, probe_prompts: Sequence[Any], settings: ProbeSettings | None = None, *,
              log: Callable[[str], None] | None = print,
              on_branch: Callable[[list[dict]], None] | None = None,
              arm_setup: Callable[[Any, tuple], None] | None = None) -> dict:  # fmt: skip
    """Run the β-response probe on a freshly built `CEGPPOTrainer` (see the module docstring for the protocol).

    Args:
        trainer: a `CEGPPOTrainer` that has not trained; its model is the starting point, its settings the run's.
        probe_prompts: the probe set's prompts (held-out prompts of the task).
        settings: arms and branch points.
        log: where progress lines go (None: silent).
        on_branch: called with the branch records so far after each branch point (e.g. to save partial results).
        arm_setup: called with the trainer and the arm after its β is set, before it trains (every arm, the reference
            too): applies a labelled arm's variant of the loss (e.g. an attribute a `preserved_gradient_coefficient`
            override reads).

    Returns:
        A JSON-ready dict: `settings`, `probe_set` (its digest and size), `branches` (per branch point: `step`,
        `h0`, `batch_hash`, and per arm `h_after`, `delta`, `clip` shares, `batch_hash`, `seconds`) and `summary`
        (`summarize_probe`).
    """
    settings = settings or ProbeSettings()
    if arm_setup is None and (labelled := [arm_name(a) for a in settings.arms if len(a) > 2]):
        raise ValueError(f"arms {labelled} name a variant of the loss: pass the `arm_setup` that applies it.")
    say = log or (lambda _: None)
    per_batch, ga = _check_trainer(trainer)
    steps_per_batch = per_batch // ga
    total_steps = settings.branch_points * settings.branch_every * steps_per_batch
    reference = settings.arms[0]
    others = settings.arms[1:]
    tokenizer = trainer.processing_class
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer

    probe_set = build_probe_set(
        trainer.model, tokenizer, list(probe_prompts)[: settings.probe_prompts],
        max_new_tokens=trainer.args.max_completion_length, seed=settings.probe_seed,
        generation_config=probe_generation_config(trainer),
    )  # fmt: skip
    say(f"probe set: {probe_set.prompt_ids.shape[0]} sequences, {int(probe_set.completion_mask.sum())} completion "
        f"tokens, digest {probe_set.digest()}")  # fmt: skip

    trainer.create_optimizer_and_scheduler(num_training_steps=total_steps)
    trainer.state.max_steps = total_steps
    trainer.model.train()
    dataloader = trainer.get_train_dataloader()
    iterator = iter(dataloader)

    def next_batches() -> list[dict]:
        nonlocal iterator
        out = []
        while len(out) < per_batch:
            try:
                out.append(next(iterator))
            except StopIteration:  # a new epoch, as the training loop starts one
                iterator = iter(dataloader)
        return out

    branches = []
    started = time.perf_counter()
    recorder = _Recorder(trainer)
    with recorder, _VllmRequestSeed(trainer) as vllm_seed:
        for k in range(settings.branch_points):
            for _ in range(settings.branch_every - 1):  # rollout batches between branch points: the reference arm
                _set_betas(trainer, reference, arm_setup)
                recorder.arm = reference
                vllm_seed.set(trainer.args.seed * 1_000_003 + trainer.state.global_step)  # one seed per rollout batch
                _train_rollout_batch(trainer, next_batches(), ga)
            batches = next_batches()
            h0 = probe_entropy(trainer, probe_set)
            snap = _snapshot(trainer)
            vllm_seed.set(trainer.args.seed * 1_000_003 + trainer.state.global_step)
            record: dict = {"branch": k, "step": trainer.state.global_step, "h0": h0, "arms": {}}
            for arm in (*others, reference):  # the reference last: its end state is the base run's next state
                t0 = time.perf_counter()
                _restore(trainer, snap)
                _set_betas(trainer, arm, arm_setup)
                recorder.reset()
                recorder.arm = arm
                losses, predicted, shares = _train_rollout_batch(trainer, batches, ga)
                digest, adv = _batch_digest(trainer)
                h = probe_entropy(trainer, probe_set)
                record["arms"][arm_name(arm)] = {
                    "beta1": arm[0], "beta2": arm[1], "variant": arm[2] if len(arm) > 2 else None, "h_after": h,
                    "delta": h - h0, "clip": recorder.shares(), "tokens": recorder.tokens, "batch_hash": digest, "mean_abs_advantage": adv,
                    "loss_mean": sum(losses) / len(losses), "predicted": predicted, "predictor_shares": shares,
                    "seconds": time.perf_counter() - t0,
                }  # fmt: skip
            hashes = {a["batch_hash"] for a in record["arms"].values()}
            if len(hashes) != 1:
                raise RuntimeError(
                    f"branch point {k}: the arms trained on different rollout batches ({sorted(hashes)}): the "
                    "snapshot did not restore everything generation depends on."
                )
            record["batch_hash"] = hashes.pop()
            del snap
            branches.append(record)
            if on_branch is not None:
                on_branch(branches)
            ref = record["arms"][arm_name(reference)]
            say(f"branch {k + 1}/{settings.branch_points} (step {record['step']}): H0 {h0:.4f}, ref ΔH "
                f"{ref['delta']:+.4f}; " + ", ".join(
                    f"{arm_name(a)} D {record['arms'][arm_name(a)]['delta'] - ref['delta']:+.4f}" for a in others
                ) + f" [{time.perf_counter() - started:.0f} s]")  # fmt: skip
            if settings.max_seconds is not None and time.perf_counter() - started > settings.max_seconds:
                say(f"stopping after {k + 1} branch points: past max_seconds={settings.max_seconds:g}")
                break
    result = {
        "settings": {"arms": [list(a) for a in settings.arms], "branch_points": settings.branch_points,
                     "branch_every": settings.branch_every, "probe_prompts": settings.probe_prompts,
                     "probe_seed": settings.probe_seed, "steps_per_rollout_batch": steps_per_batch},
        "probe_set": {"digest": probe_set.digest(), "sequences": int(probe_set.prompt_ids.shape[0]),
                      "tokens": int(probe_set.completion_mask.sum())},
        "branches": branches,
        "seconds": time.perf_counter() - started,
    }  # fmt: skip
    result["summary"] = summarize_probe(branches, reference)
    return result


def arm_differences(branches: Sequence[dict], arm: str, reference: str) -> list[float]:
    """D per branch point: the arm's probe-entropy change minus the reference arm's."""
    return [b["arms"][arm]["delta"] - b["arms"][reference]["delta"] for b in branches]


def summarize_probe(branches: Sequence[dict], reference: tuple[float, float] | str) -> dict[str, dict]:
    """Per non-reference arm: K, mean D, its 95 % t-interval, the exact two-sided sign-flip p, mean clip shares."""
    ref = reference if isinstance(reference, str) else arm_name(reference)
    out = {}
    arms = list(branches[0]["arms"]) if branches else []
    for arm in arms:
        clip = {r: sum(b["arms"][arm]["clip"][r] for b in branches) / len(branches) for r in REGIONS}
        if arm == ref:
            out[arm] = {"reference": True, "k": len(branches), "clip": clip,
                        "mean_delta": sum(b["arms"][arm]["delta"] for b in branches) / len(branches)}  # fmt: skip
            continue
        d = arm_differences(branches, arm, ref)
        mean, low, high = t_interval(d) if len(d) > 1 else (d[0], math.nan, math.nan)
        # The trainer's first-order predictor (docs/algorithm.md): does the sign of its summed entropy change, arm
        # minus reference, say which way D went? Counted where it predicts anything (not 0).
        predicted = [b["arms"][arm].get("predicted", 0.0) - b["arms"][ref].get("predicted", 0.0) for b in branches]
        called = [(p, x) for p, x in zip(predicted, d, strict=True) if p != 0]
        out[arm] = {"k": len(d), "mean": mean, "ci95": [low, high], "p_two_sided": sign_flip_p(d, "two-sided"),
                    "positive": sum(x > 0 for x in d), "clip": clip,
                    "predictor_agrees": sum((p > 0) == (x > 0) for p, x in called), "predictor_k": len(called)}  # fmt: skip
    return out


def format_summary(summary: dict[str, dict]) -> str:
    """The per-arm table `cegppo probe` prints."""
    lines = [f"{'arm (β1, β2)':<14}{'K':>4}{'mean D (nats)':>15}{'95% t-interval':>26}{'p (2-sided)':>13}"
             f"{'D > 0':>7}   clip shares A>0 r<1-ε / A>0 r>1+ε / A<0 r<1-ε / A<0 r>1+ε"]  # fmt: skip
    for arm, s in summary.items():
        clip = " / ".join(f"{s['clip'][r]:.4f}" for r in REGIONS)
        if s.get("reference"):
            lines.append(f"{arm:<14}{s['k']:>4}{'reference':>15}{'(ΔH ' + format(s['mean_delta'], '+.4f') + ')':>26}"
                         f"{'':>13}{'':>7}   {clip}")  # fmt: skip
            continue
        interval = f"[{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}]"
        predictor = (
            f"   predictor's sign = D's: {s['predictor_agrees']}/{s['predictor_k']}" if "predictor_k" in s else ""
        )
        lines.append(f"{arm:<14}{s['k']:>4}{s['mean']:>+15.4f}{interval:>26}{s['p_two_sided']:>13.4g}"
                     f"{str(s['positive']) + '/' + str(s['k']):>7}   {clip}{predictor}")  # fmt: skip
    lines.append("D = the arm's change in probe entropy over one rollout batch minus the reference arm's, per branch "
                 "point; p: exact two-sided sign-flip test over the branch points.")  # fmt: skip
    return "\n".join(lines)


def plot_probe(summary: dict[str, dict], path: str | Path, title: str = "β-response probe") -> Path:
    """Arms on the x axis, mean D with its 95 % t-interval on the y axis (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = [a for a, s in summary.items() if not s.get("reference")]
    means = [summary[a]["mean"] for a in arms]
    lows = [summary[a]["mean"] - summary[a]["ci95"][0] for a in arms]
    highs = [summary[a]["ci95"][1] - summary[a]["mean"] for a in arms]
    fig, ax = plt.subplots(figsize=(1.2 * len(arms) + 2, 3.5))
    ax.errorbar(range(len(arms)), means, yerr=[lows, highs], fmt="o", capsize=4)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xticks(range(len(arms)), arms)
    ax.set_xlabel("arm (β1, β2)")
    ax.set_ylabel("ΔH − ΔH(reference) (nats)")
    ax.set_title(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


# ----------------------------------------------------------------------------------------------------------------
# `cegppo probe`
# ----------------------------------------------------------------------------------------------------------------
def _probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="cegppo probe", add_help=False)
    parser.add_argument("--probe_arms", default=";".join(f"{a:g},{b:g}" for a, b in DEFAULT_ARMS),
                        help="arms as `beta1,beta2;...`; the first is the reference")  # fmt: skip
    parser.add_argument("--probe_branch_points", type=int, default=ProbeSettings.branch_points)
    parser.add_argument("--probe_branch_every", type=int, default=ProbeSettings.branch_every)
    parser.add_argument("--probe_prompts", type=int, default=ProbeSettings.probe_prompts)
    parser.add_argument("--probe_seed", type=int, default=ProbeSettings.probe_seed)
    parser.add_argument("--probe_out", default=None, help="folder for probe.json and probe.png (default: output_dir)")
    return parser


PROBE_HELP = """\
cegppo probe: the β-response probe (cegppo_trl.research.probe). Takes every `cegppo train` argument
(`cegppo train --help`) plus:
  --probe_arms "0,0;0.5,0;1,0;0,1;0.5,1;0.75,1"   arms (beta1,beta2); the first is the reference
  --probe_branch_points 6      K branch points (rollout-batch boundaries)
  --probe_branch_every 1       rollout batches between branch points (the reference arm trains the others)
  --probe_prompts 32           probe-set prompts (the test split's first rows, else the train split's)
  --probe_seed 1234            the probe set's sampling seed
  --probe_out DIR              where probe.json and probe.png go (default: output_dir)
"""


def main(argv: list[str] | None = None) -> int:
    """`cegppo probe`: parse `cegppo train`'s arguments plus the probe's, run the probe, print and save its table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(PROBE_HELP)
        return 0
    from ..scripts import check_command, parse_args

    probe_args, rest = _probe_parser().parse_known_args(argv)
    settings = ProbeSettings(
        arms=parse_arms(probe_args.probe_arms), branch_points=probe_args.probe_branch_points,
        branch_every=probe_args.probe_branch_every, probe_prompts=probe_args.probe_prompts,
        probe_seed=probe_args.probe_seed,
    )  # fmt: skip
    script_args, training_args, model_args = parse_args(rest, prog="cegppo probe")
    report, prepared = check_command(script_args, training_args, model_args)
    report.raise_errors()
    trainer = _build_trainer(script_args, training_args, model_args, prepared)
    prompts = _probe_prompts(script_args, prepared, settings.probe_prompts)
    result = run_probe(trainer, prompts, settings)
    out = Path(probe_args.probe_out or training_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "probe.json").write_text(json.dumps(result, indent=1))
    print(format_summary(result["summary"]))
    try:
        plot_probe(result["summary"], out / "probe.png")
    except ImportError:
        print("(matplotlib is not installed: no plot)")
    print(f"Wrote {out / 'probe.json'}" + (" and probe.png" if (out / "probe.png").exists() else ""))
    return 0


def _build_trainer(script_args, training_args, model_args, prepared):
    from trl import get_quantization_config

    from .trainer import ResearchCEGPPOConfig, ResearchCEGPPOTrainer

    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)  # fmt: skip
    model_init_kwargs.update(training_args.model_init_kwargs or {})
    training_args.model_init_kwargs = model_init_kwargs
    args = ResearchCEGPPOConfig.from_grpo_config(training_args, log_predictor=True)  # the per-step predictor
    return ResearchCEGPPOTrainer(
        model=model_args.model_name_or_path, reward_funcs=prepared.reward_funcs, args=args,
        train_dataset=prepared.train_dataset, quantization_config=get_quantization_config(model_args),
        peft_config=prepared.peft_config,
    )  # fmt: skip


def _probe_prompts(script_args, prepared, count: int) -> list:
    """The probe prompts: the test split's first `count` prompts, else (with a warning) the train split's."""
    from ..scripts import load_dataset_dict

    dataset = load_dataset_dict(script_args)
    split = script_args.dataset_test_split
    if split in dataset:
        rows = dataset[split]
        column = "prompt" if "prompt" in rows.column_names else None
        if column is not None:
            return list(rows[column][:count])
    logger.warning("No test split %r with a `prompt` column: the probe set uses the train split's prompts.", split)
    return list(prepared.train_dataset["prompt"][:count])
