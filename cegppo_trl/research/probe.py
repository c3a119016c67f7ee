"""The β-response probe: how (β1, β2) move entropy on *your* model, measured from shared branch points.

    cegppo probe --config RECIPE [any `cegppo train` flag ...] --probe_arms "0,0;0.5,1" --probe_branch_points 6

Protocol (`run_probe`):

1. A fixed probe set is sampled once from the starting model (one completion per prompt) with the run's sampling
   settings and a seed of its own; every global generator is put back after. Probe entropy is the mean full-vocabulary
   entropy at every completion position of these fixed sequences, by TRL's `_get_per_token_logps_and_entropies` (the
   logits divided by `temperature`, as TRL's loss and logged `entropy`): every arm is measured on the same tokens.
2. At each of K branch points (rollout-batch boundaries) the run's state is snapshotted in memory: weights, optimizer,
   scheduler, every global generator, `trainer.state`, TRL's step counter and buffered rollout batch, the run-state
   callbacks, and the dataloader batches of the next rollout batch. Server-mode vLLM samples in another process: its
   requests get a seed per rollout batch instead (`_VllmRequestSeed`), the same for every arm.
3. Each arm restores the snapshot, sets its constant (β1, β2) and takes the run's optimizer steps on one rollout batch
   through the trainer's own `training_step`, clipping, optimizer and scheduler, as `Trainer`'s loop does. Every arm
   must train on the same rollout batch (a hash of its completion ids; the probe stops if one differs). It records the
   probe-entropy change, the token shares of the four clip regions and the per-step predictor's entropy change.
4. The reference arm (the first, GRPO's (0, 0) by default) runs last: its end state is the next branch point's start.
5. Per arm: D = its probe-entropy change minus the reference's; over the K branch points the mean, a 95 % t-interval,
   the exact two-sided sign-flip p (`research.stats`) and how often the predictor had D's sign.

CPU fp32 is deterministic: arms with identical β give bit-identical results (tests/test_probe.py), and the only
variance left in D is how the effect varies across training states. One process only; the entropy controller is
refused (it would move β). The run must be off-policy, or every arm equals GRPO (a warning says so).
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

logger = logging.getLogger(__name__)

# The probe study's arms; the first is the reference (CE-GPPO at (0, 0) has GRPO's gradient).
DEFAULT_ARMS: tuple[tuple[float, float], ...] = ((0.0, 0.0), (0.5, 0.0), (1.0, 0.0), (0.0, 1.0), (0.5, 1.0), (0.75, 1.0))  # fmt: skip
REGIONS = ("pos_below", "pos_above", "neg_below", "neg_above")  # A>0 r<1-ε, A>0 r>1+ε (β2), A<0 r<1-ε (β1), A<0 r>1+ε


def arm_name(arm: Sequence) -> str:
    """`(0.5, 1)`: the arm's (β1, β2) as printed and used as a key; `(0, 1) raise` for an arm with a variant label."""
    return f"({arm[0]:g}, {arm[1]:g})" + (f" {arm[2]}" if len(arm) > 2 else "")


def parse_arms(text: str) -> tuple[tuple[float, float], ...]:
    """`"0,0;0.5,1"` -> ((0.0, 0.0), (0.5, 1.0)): arms separated by `;`, each `beta1,beta2`; the first is the reference."""
    try:
        arms = tuple((float(a), float(b)) for a, b in (arm.split(",") for arm in text.split(";") if arm.strip()))
    except ValueError:
        raise ValueError(f"`--probe_arms`: each arm is two numbers `beta1,beta2`, got {text!r}.") from None
    if not all(math.isfinite(b) and b >= 0 for arm in arms for b in arm):
        raise ValueError(f"`--probe_arms`: β must be finite and >= 0, got {text!r}.")
    ProbeSettings(arms=arms)  # a reference and another arm, no repeats
    return arms


@dataclass
class ProbeSettings:
    """What the probe does beyond the run's own settings.

    Attributes:
        arms: (β1, β2) per arm, or (β1, β2, label) for a variant of the loss that `run_probe`'s `arm_setup` applies;
            the first is the reference (its run is the base run's continuation).
        branch_points: K, the number of branch points (one per rollout batch).
        probe_prompts: prompts in the probe set (one sampled completion each).
        probe_seed: the seed of the probe set's sampling.
    """

    arms: tuple[tuple[float, float], ...] = DEFAULT_ARMS
    branch_points: int = 6
    probe_prompts: int = 32
    probe_seed: int = 1234

    def __post_init__(self):
        if any(len(arm) not in (2, 3) for arm in self.arms):
            raise ValueError(f"ProbeSettings.arms: each arm is (β1, β2) or (β1, β2, label), got {self.arms}.")
        self.arms = tuple((float(arm[0]), float(arm[1]), *map(str, arm[2:])) for arm in self.arms)
        if len(self.arms) < 2 or len(set(self.arms)) != len(self.arms):
            raise ValueError(f"ProbeSettings.arms: a reference and at least one other arm, no repeats: {self.arms}.")
        if self.branch_points < 1 or self.probe_prompts < 1:
            raise ValueError("ProbeSettings: branch_points and probe_prompts must be >= 1.")


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
        return _digest([self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask])


def _digest(tensors) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.to("cpu", torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def probe_generation_config(trainer):
    """The `GenerationConfig` the trainer samples its rollouts with: TRL's own where it generates with the training
    model; with vLLM, one built from the config fields TRL builds its `SamplingParams` from (`generation_kwargs` then
    holds vLLM keys, left out)."""
    from transformers import GenerationConfig

    if isinstance(config := getattr(trainer, "generation_config", None), GenerationConfig):
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
        tokenizer: its tokenizer (prompts are left-padded whatever it is set to).
        prompts: plain strings or chat-message lists (rendered with the chat template, as TRL does).
        max_new_tokens: the completion budget (overrides `generation_config`'s).
        temperature: plain sampling's temperature when no `generation_config` is given.
        seed: the sampling seed.
        generation_config: the run's sampling settings (`probe_generation_config(trainer)`).
    """
    from transformers import GenerationConfig

    if generation_config is None:
        generation_config = GenerationConfig(do_sample=True, temperature=temperature, top_k=0, top_p=1.0,
                                             pad_token_id=tokenizer.pad_token_id,
                                             eos_token_id=tokenizer.eos_token_id, disable_compile=True)  # fmt: skip
    if max_new_tokens is not None:
        generation_config = copy.deepcopy(generation_config)  # the trainer's own is left as it is
        generation_config.max_new_tokens = max_new_tokens
    texts = [p if isinstance(p, str) else tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
             for p in prompts]  # fmt: skip
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        enc = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    state = _rng_state()  # `torch.manual_seed` seeds the CPU and every device: all of them are put back
    try:
        torch.manual_seed(seed)
        out = model.generate(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                             generation_config=generation_config)  # fmt: skip
    finally:
        _set_rng_state(state)
        model.train(was_training)
    completion_ids = out[:, enc["input_ids"].shape[1] :].cpu()
    # Tokens up to and including the first EOS (TRL's completion mask), for any of the config's EOS ids.
    eos_ids = generation_config.eos_token_id if generation_config.eos_token_id is not None else tokenizer.eos_token_id
    eos = torch.isin(completion_ids, torch.tensor(eos_ids).reshape(-1))
    completion_mask = ((eos.cumsum(1) - eos.long()) == 0).long()
    return ProbeSet(enc["input_ids"], enc["attention_mask"], completion_ids, completion_mask)


@torch.no_grad()
def probe_entropy(policy, probe_set: ProbeSet, batch_size: int = 16, *, temperature: float = 1.0) -> float:
    """Token-mean entropy (nats) of the full next-token distribution at each completion position of the set.

    Args:
        policy: a `GRPOTrainer` (TRL's `_get_per_token_logps_and_entropies` on its model: the distribution it trains
            and logs the entropy of), or a bare model (its fp32 logits divided by `temperature`).
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
def _rng_state() -> dict:
    """Every global generator a rollout batch or the probe set can draw from: torch's CPU generator and every CUDA
    device's (sampling on a GPU draws from the device's), Python's and NumPy's (reward functions may)."""
    numpy = sys.modules.get("numpy")  # transformers imports it; not a dependency of the package
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "numpy": None if numpy is None else numpy.random.get_state()}  # fmt: skip


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None:
        torch.cuda.set_rng_state_all(state["cuda"])
    random.setstate(state["python"])
    if state["numpy"] is not None:
        sys.modules["numpy"].random.set_state(state["numpy"])


def _snapshot(trainer) -> dict:
    return {
        # deepcopy clones the tensors (a state dict shares storage with the live model)
        "model": copy.deepcopy(trainer.model.state_dict()),
        "optimizer": copy.deepcopy(trainer.optimizer.state_dict()),
        "scheduler": copy.deepcopy(trainer.lr_scheduler.state_dict()),
        "rng": _rng_state(),
        "state": copy.deepcopy(trainer.state),
        "step": trainer._step,
        "buffered": trainer._buffered_inputs,  # replaced, never mutated, by TRL: a reference is enough
        "vllm_loaded_step": getattr(trainer, "_last_loaded_step", None),  # vLLM: when its weights were last synced
        "run_state": [copy.deepcopy(c.state()["attributes"]) for c in trainer._run_state_callbacks],
    }


def _restore(trainer, snap: dict) -> None:
    trainer.model.load_state_dict(snap["model"])
    trainer.optimizer.load_state_dict(copy.deepcopy(snap["optimizer"]))
    trainer.lr_scheduler.load_state_dict(copy.deepcopy(snap["scheduler"]))
    _set_rng_state(snap["rng"])
    trainer.state = copy.deepcopy(snap["state"])
    trainer._step = snap["step"]
    trainer._buffered_inputs = snap["buffered"]
    if snap["vllm_loaded_step"] is not None:
        trainer._last_loaded_step = snap["vllm_loaded_step"]
    for callback, state in zip(trainer._run_state_callbacks, snap["run_state"], strict=True):
        callback.load_state_dict(copy.deepcopy(state))
    trainer.model.zero_grad(set_to_none=True)


def _set_betas(trainer, arm: tuple, arm_setup: Callable[[Any, tuple], None] | None = None) -> None:
    from ..schedules import parse_schedule

    trainer.beta1_schedule = parse_schedule(arm[0])
    trainer.beta2_schedule = parse_schedule(arm[1])
    trainer._schedules_checked_for = None
    if arm_setup is not None:
        arm_setup(trainer, arm)


class _Recorder:
    """Counts the four clip regions' tokens (weighted by the loss mask) of every training micro-batch, by wrapping the
    trainer's `_preserve_gradient` (an instance attribute: the class is untouched), and heads the left-drift warning
    with the arm it comes from (its β is the arm's)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.original = trainer._preserve_gradient
        self.arm: tuple[float, float] | None = None
        self.reset()

    def reset(self) -> None:
        self.counts = dict.fromkeys(REGIONS, 0.0)
        self.tokens = 0.0

    def __enter__(self):
        trainer = self.trainer

        def hooked(batch, logps, entropies):
            if trainer.model.training and batch.get("old_per_token_logps") is not None:
                low, high = math.log(1 - trainer.epsilon_low), math.log1p(trainer.epsilon_high)
                mask = (batch["completion_mask"] * batch.get("tool_mask", 1.0)).detach().float()
                lr = logps.detach() - batch["old_per_token_logps"]
                adv = batch["advantages"].detach()
                adv = (adv.unsqueeze(-1) if adv.dim() == 1 else adv).expand_as(lr)
                for name, region in zip(REGIONS, ((adv > 0) & (lr < low), (adv > 0) & (lr > high),
                                                  (adv < 0) & (lr < low), (adv < 0) & (lr > high))):  # fmt: skip
                    self.counts[name] += float((region.float() * mask).sum())
                self.tokens += float(mask.sum())
            return self.original(batch, logps, entropies)

        trainer._preserve_gradient = hooked
        if (alarm := trainer.left_drift_alarm) is not None:

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


def _batch_digest(trainer) -> str:
    """A hash of the buffered rollout batch's completion ids and masks (all micro-batches, in order)."""
    return _digest(t for part in trainer._buffered_inputs for t in (part["completion_ids"], part["completion_mask"]))


class _VllmRequestSeed:
    """Server-mode vLLM samples out of the snapshot's reach: `set(seed)` before a rollout batch gives its requests
    that seed (`SamplingParams.seed`, through TRL's `generation_kwargs`), so every arm of a branch point draws the same
    batch; the user's `generation_kwargs` come back on exit. A no-op without vLLM, with colocated vLLM (which samples
    with the restored device generator) or with a seed of the user's."""

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


def _train_rollout_batch(trainer, batches: Sequence[dict], ga: int) -> tuple[float, dict]:
    """The run's optimizer steps on one rollout batch, as `Trainer._inner_training_loop` takes them; the entropy
    change the per-step predictor summed over them (`cegppo/predictor/entropy_change`) and the mean of its shares."""
    model = trainer.model
    for start in range(0, len(batches), ga):
        micro = batches[start : start + ga]
        trainer.current_gradient_accumulation_steps = len(micro)
        for i, inputs in enumerate(micro):
            trainer.accelerator.gradient_state._set_sync_gradients(i == len(micro) - 1)
            trainer.training_step(model, inputs, None)
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
    return predicted, shares


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
    """Run the β-response probe on a freshly built `CEGPPOTrainer` (the module docstring gives the protocol).

    Args:
        trainer: a trainer that has not trained (`ResearchCEGPPOTrainer` with `log_predictor` for the predictor); its
            model is the starting point, its settings the run's.
        probe_prompts: the probe set's prompts (held-out prompts of the task).
        settings: arms and branch points.
        log: where progress lines go (None: silent).
        on_branch: called with the branch records so far after each branch point (e.g. to save partial results).
        arm_setup: called with the trainer and the arm after its β is set, before it trains (every arm): applies a
            labelled arm's variant of the loss.

    Returns:
        A JSON-ready dict: `settings`, `probe_set` (its digest and size), `branches` (per branch point: `step`, `h0`,
        `batch_hash`, and per arm `h_after`, `delta`, `clip` shares, `tokens`, `predicted`, `predictor_shares`,
        `seconds`) and `summary` (`summarize_probe`).
    """
    settings = settings or ProbeSettings()
    if arm_setup is None and (labelled := [arm_name(a) for a in settings.arms if len(a) > 2]):
        raise ValueError(f"arms {labelled} name a variant of the loss: pass the `arm_setup` that applies it.")
    say = log or (lambda _: None)
    per_batch, ga = _check_trainer(trainer)
    steps_per_batch = per_batch // ga
    total_steps = settings.branch_points * steps_per_batch
    reference, others = settings.arms[0], settings.arms[1:]
    tokenizer = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)  # a processor's tokenizer
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
            batches = next_batches()
            h0 = probe_entropy(trainer, probe_set)
            snap = _snapshot(trainer)
            vllm_seed.set(trainer.args.seed * 1_000_003 + trainer.state.global_step)  # one seed per rollout batch
            record: dict = {"branch": k, "step": trainer.state.global_step, "h0": h0, "arms": {}}
            for arm in (*others, reference):  # the reference last: its end state is the base run's next state
                t0 = time.perf_counter()
                _restore(trainer, snap)
                _set_betas(trainer, arm, arm_setup)
                recorder.reset()
                recorder.arm = arm
                predicted, shares = _train_rollout_batch(trainer, batches, ga)
                h = probe_entropy(trainer, probe_set)
                record["arms"][arm_name(arm)] = {
                    "beta1": arm[0], "beta2": arm[1], "variant": arm[2] if len(arm) > 2 else None, "h_after": h,
                    "delta": h - h0, "clip": recorder.shares(), "tokens": recorder.tokens,
                    "batch_hash": _batch_digest(trainer), "predicted": predicted, "predictor_shares": shares,
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
    result = {
        "settings": {"arms": [list(a) for a in settings.arms], "branch_points": settings.branch_points,
                     "probe_prompts": settings.probe_prompts, "probe_seed": settings.probe_seed,
                     "steps_per_rollout_batch": steps_per_batch},
        "probe_set": {"digest": probe_set.digest(), "sequences": int(probe_set.prompt_ids.shape[0]),
                      "tokens": int(probe_set.completion_mask.sum())},
        "branches": branches,
        "seconds": time.perf_counter() - started,
    }  # fmt: skip
    result["summary"] = summarize_probe(branches, reference)
    return result


def summarize_probe(branches: Sequence[dict], reference: tuple[float, float] | str) -> dict[str, dict]:
    """Per arm: K, mean D, its 95 % t-interval, the exact two-sided sign-flip p, mean clip shares, and how often the
    predictor's summed entropy change (arm minus reference, where it predicts anything) had D's sign."""
    ref = reference if isinstance(reference, str) else arm_name(reference)
    out = {}
    for arm in list(branches[0]["arms"]) if branches else []:
        clip = {r: sum(b["arms"][arm]["clip"][r] for b in branches) / len(branches) for r in REGIONS}
        if arm == ref:
            out[arm] = {"reference": True, "k": len(branches), "clip": clip,
                        "mean_delta": sum(b["arms"][arm]["delta"] for b in branches) / len(branches)}  # fmt: skip
            continue
        d = [b["arms"][arm]["delta"] - b["arms"][ref]["delta"] for b in branches]
        mean, low, high = t_interval(d) if len(d) > 1 else (d[0], math.nan, math.nan)
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
                         f"{'':>20}   {clip}")  # fmt: skip
            continue
        interval = f"[{s['ci95'][0]:+.4f}, {s['ci95'][1]:+.4f}]"
        lines.append(f"{arm:<14}{s['k']:>4}{s['mean']:>+15.4f}{interval:>26}{s['p_two_sided']:>13.4g}"
                     f"{str(s['positive']) + '/' + str(s['k']):>7}   {clip}"
                     f"   predictor's sign = D's: {s['predictor_agrees']}/{s['predictor_k']}")  # fmt: skip
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
    errors = [[m - summary[a]["ci95"][0] for a, m in zip(arms, means)],
              [summary[a]["ci95"][1] - m for a, m in zip(arms, means)]]  # fmt: skip
    fig, ax = plt.subplots(figsize=(1.2 * len(arms) + 2, 3.5))
    ax.errorbar(range(len(arms)), means, yerr=errors, fmt="o", capsize=4)
    ax.axhline(0, color="gray", lw=0.8)
    ax.set_xticks(range(len(arms)), arms)
    ax.set(xlabel="arm (β1, β2)", ylabel="ΔH − ΔH(reference) (nats)", title=title)
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
    parser = argparse.ArgumentParser(
        prog="cegppo probe", add_help=False, description="The β-response probe (cegppo_trl.research.probe). Takes "
        "every `cegppo train` argument (`cegppo train --help`) plus:")  # fmt: skip
    add = parser.add_argument
    add("--probe_arms", default=";".join(f"{a:g},{b:g}" for a, b in DEFAULT_ARMS),
        help="arms `beta1,beta2;...`; the first is the reference (default: %(default)s)")  # fmt: skip
    add("--probe_branch_points", type=int, default=ProbeSettings.branch_points, help="K rollout-batch boundaries")
    add("--probe_prompts", type=int, default=ProbeSettings.probe_prompts,
        help="probe-set prompts (the test split's first rows, else the train split's)")  # fmt: skip
    add("--probe_seed", type=int, default=ProbeSettings.probe_seed, help="the probe set's sampling seed")
    add("--probe_out", default=None, help="folder for probe.json and probe.png (default: output_dir)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """`cegppo probe`: parse `cegppo train`'s arguments plus the probe's, run the probe, print and save its table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _probe_parser()
    if "-h" in argv or "--help" in argv:
        parser.print_help()
        return 0
    from ..scripts import check_command, parse_args

    probe_args, rest = parser.parse_known_args(argv)
    settings = ProbeSettings(arms=parse_arms(probe_args.probe_arms), branch_points=probe_args.probe_branch_points,
                             probe_prompts=probe_args.probe_prompts, probe_seed=probe_args.probe_seed)  # fmt: skip
    script_args, training_args, model_args = parse_args(rest, prog="cegppo probe")
    report, prepared = check_command(script_args, training_args, model_args)
    report.raise_errors()
    trainer = _build_trainer(training_args, model_args, prepared)
    result = run_probe(trainer, _probe_prompts(script_args, prepared, settings.probe_prompts), settings)
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


def _build_trainer(training_args, model_args, prepared):
    from trl import get_quantization_config

    from .trainer import ResearchCEGPPOConfig, ResearchCEGPPOTrainer

    model_init_kwargs = dict(revision=model_args.model_revision, trust_remote_code=training_args.trust_remote_code,
                             attn_implementation=model_args.attn_implementation, dtype=model_args.dtype)  # fmt: skip
    training_args.model_init_kwargs = {**model_init_kwargs, **(training_args.model_init_kwargs or {})}
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
    if split in dataset and "prompt" in dataset[split].column_names:
        return list(dataset[split]["prompt"][:count])
    logger.warning("No test split %r with a `prompt` column: the probe set uses the train split's prompts.", split)
    return list(prepared.train_dataset["prompt"][:count])
