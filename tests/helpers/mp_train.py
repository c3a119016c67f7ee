"""Train a tiny CE-GPPO model for two optimizer steps and dump parameters and logs, once per loss type.

Run once as a single process and once under `torchrun --nproc_per_node 2` (gloo, CPU): both see the same global
batch, because completions come from a deterministic `rollout_func` keyed on the global position of each sample.
`dapo` normalises by the rollout batch's token count; `grpo` by its sequence count. With 2 processes the constant
group (dropped by dynamic sampling) sits on one process and the informative one on the other, so a per-process count
would weigh them differently from one process. Used by tests/test_multiprocess.py.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from datasets import Dataset

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer
from cegppo_trl.offline.tiny import build_char_tokenizer, build_tiny_llama

GLOBAL_BATCH = 8
NUM_GENERATIONS = 4
COMPLETION_LEN = 6
LOSS_TYPES = ("dapo", "grpo")


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    for loss_type in LOSS_TYPES:
        train(out_dir, loss_type)
    # Tear the gloo group down before interpreter exit: left to atexit, one rank can abort with "terminate called
    # without an active exception" while the other still holds the connection.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def train(out_dir: str, loss_type: str) -> None:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    tokenizer = build_char_tokenizer()
    model = build_tiny_llama(tokenizer, seed=0)
    vocab = len(tokenizer)

    def rollout_func(prompts, trainer):
        # Deterministic "sampling": completion tokens depend only on the sample's global position in the batch.
        rank, local = trainer.accelerator.process_index, len(prompts)
        prompt_ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        completion_ids = []
        for i in range(local):
            g = torch.Generator().manual_seed(1000 * trainer.state.global_step + rank * local + i)
            length = int(torch.randint(3, COMPLETION_LEN + 1, (1,), generator=g))
            completion_ids.append(torch.randint(4, vocab, (length,), generator=g).tolist())
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[0.0] * len(c) for c in completion_ids]}

    def reward(prompts, completions, **kwargs):
        # Groups of prompts starting with "0" are constant (dropped by dynamic sampling).
        return [1.0 if p.startswith("0") else float(sum(ch.isdigit() for ch in c)) for p, c in zip(prompts, completions)]

    dataset = Dataset.from_dict({"prompt": ["0+1=", "2+3=", "4+5=", "0+7="] * 4})
    args = CEGPPOConfig(
        output_dir=os.path.join(out_dir, loss_type),
        loss_type=loss_type,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        per_device_train_batch_size=GLOBAL_BATCH // world,
        num_generations=NUM_GENERATIONS,
        max_completion_length=COMPLETION_LEN,
        num_iterations=2,
        max_steps=2,
        learning_rate=5e-2,
        logging_steps=1,
        seed=0,
        delta=10.0,
        sft_loss_coef=0.1,
        dynamic_sampling=True,
        disable_tqdm=True,
    )
    trainer = CEGPPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer,
        rollout_func=rollout_func,
    )  # fmt: skip
    trainer.train()
    if trainer.accelerator.is_main_process:
        state = {k: v.detach().cpu() for k, v in trainer.accelerator.unwrap_model(trainer.model).state_dict().items()}
        torch.save(state, os.path.join(out_dir, f"params_{loss_type}.pt"))
        with open(os.path.join(out_dir, f"log_history_{loss_type}.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1])
