"""push_to_hub through Trainer's real code path (the Hub client is replaced by a recorder: no network), the model
card's CE-GPPO content, reloading the saved folder (full model and LoRA adapter), and TensorBoard scalars."""

from __future__ import annotations

import json
import os
from concurrent.futures import Future
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import transformers.trainer
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from cegppo_trl.demos.tiny import build_tiny_llama


class RecordingHubApi:
    """Stands in for `huggingface_hub.HfApi`: records calls and snapshots the folder that would be uploaded."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id))
        return SimpleNamespace(repo_id=repo_id)

    def upload_folder(self, repo_id, folder_path, **kwargs):
        files = {
            p.relative_to(folder_path).as_posix(): p.read_bytes() for p in Path(folder_path).rglob("*") if p.is_file()
        }
        self.calls.append(("upload_folder", repo_id, files, kwargs))
        done = Future()  # checkpoint pushes ask for `run_as_future=True`
        done.set_result(None)
        return done


@pytest.fixture
def hub(monkeypatch):
    api = RecordingHubApi()
    monkeypatch.setattr(transformers.trainer, "hf_api", lambda: api)
    return api


def test_push_to_hub_uploads_model_and_cegppo_card(make_trainer, hub):
    trainer = make_trainer(
        num_iterations=2, max_steps=2, gppo_beta1_schedule="piecewise:0@0,0.5@585", delta=10.0,
        push_to_hub=True, hub_model_id="me/tiny-cegppo",
    )  # fmt: skip
    trainer.train()
    trainer.push_to_hub(dataset_name="toy-arithmetic")

    upload = [c for c in hub.calls if c[0] == "upload_folder"][-1]
    _, repo_id, files, kwargs = upload
    assert repo_id == "me/tiny-cegppo"
    assert {"config.json", "model.safetensors", "README.md", "tokenizer.json"} <= set(files)
    card = files["README.md"].decode()
    assert "- cegppo" in card and "- grpo" in card  # tags in the YAML header
    assert "https://huggingface.co/papers/2509.20712" in card
    assert "@inproceedings{su2026cegppo" in card
    assert "## CE-GPPO settings" in card
    assert "| `beta1` | `piecewise:0@0,0.5@585` |" in card
    assert "| `beta2` | `constant:1.0` |" in card  # gppo_beta2=1.0, as written
    assert "| `delta` | `10.0` |" in card
    assert card.index("## CE-GPPO settings") < card.index("## Citations")


def test_pushed_checkpoint_holds_the_controller_state(make_research_trainer, hub):
    # hub_strategy="checkpoint" uploads each checkpoint folder as it is written; resuming from that copy needs the
    # controller state inside it.
    trainer = make_research_trainer(
        num_iterations=2, max_steps=4, entropy_controller={"target_low": 1, "target_high": 2, "step_size": 0.1},
        save_strategy="steps", save_steps=2,
        push_to_hub=True, hub_model_id="me/tiny-cegppo", hub_strategy="checkpoint",
    )  # fmt: skip
    trainer.train()
    uploads = [c for c in hub.calls if c[0] == "upload_folder"]
    checkpoint_pushes = [c for c in uploads if c[3].get("path_in_repo") == "last-checkpoint"]
    assert len(checkpoint_pushes) == 2
    for _, _, files, _ in checkpoint_pushes:
        assert "trainer_state.json" in files
        assert not any("pending" in name for name in files)  # the copy resumes as another trainer's checkpoint
    pushed = json.loads(checkpoint_pushes[-1][2]["trainer_state.json"])["stateful_callbacks"]
    assert pushed["EntropyControllerState"]["attributes"] == trainer.entropy_controller.state_dict()


def _assert_cegppo_card(card: str) -> None:
    assert "## CE-GPPO settings" in card and "| `beta1` | `constant:0.5` |" in card
    assert "@inproceedings{su2026cegppo" in card and "https://huggingface.co/papers/2509.20712" in card
    assert card.index("## CE-GPPO settings") < card.index("## Citations")
    assert "- cegppo" in card  # TRL's tags in the YAML header
    assert "[None]" not in card and "huggingface.co/None" not in card and 'model="None"' not in card


def test_saved_model_reloads_for_generation(make_trainer, tmp_path, tokenizer):
    trainer = make_trainer(num_iterations=2, max_steps=1, output_dir=str(tmp_path / "final"))
    trainer.train()  # save_strategy "no": no checkpoint wrote a card
    assert not (tmp_path / "final" / "README.md").exists()
    trainer.create_model_card()  # as `cegppo train` does, before the final save
    trainer.save_model()
    card = (tmp_path / "final" / "README.md").read_text()
    _assert_cegppo_card(card)
    assert "fine-tuned version of a local model." in card  # built in memory: no name, no link
    assert "# Model Card for final" in card  # TRL's checkpoints' name: the output folder's
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    tok = PreTrainedTokenizerFast.from_pretrained(tmp_path / "final")
    for name, param in trainer.model.state_dict().items():
        torch.testing.assert_close(model.state_dict()[name], param)
    out = model.generate(**tok(["1+1="], return_tensors="pt"), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 8)


def test_lora_adapter_saves_and_reloads(make_trainer, tmp_path, tokenizer, prompt_dataset):
    from helpers.batches import base_config_kwargs, count_ones_reward
    from peft import AutoPeftModelForCausalLM, LoraConfig

    from cegppo_trl import CEGPPOConfig, CEGPPOTrainer

    base_dir = tmp_path / "base"
    build_tiny_llama(tokenizer, seed=0).save_pretrained(base_dir)  # the adapter config points at its base
    trainer = CEGPPOTrainer(
        model=str(base_dir),
        reward_funcs=count_ones_reward,
        args=CEGPPOConfig(**base_config_kwargs(tmp_path / "adapter", num_iterations=2, max_steps=2)),
        train_dataset=prompt_dataset,
        processing_class=tokenizer,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainer.train()
    trainer.create_model_card()  # before the weights, as `cegppo train` does: PEFT's save adds to it
    trainer.save_model()
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()
    # Our card, not PEFT's blank template; PEFT's metadata kept.
    card = (tmp_path / "adapter" / "README.md").read_text()
    _assert_cegppo_card(card)
    assert "Provide a quick summary" not in card and "library_name: peft" in card and "- PEFT " in card
    reloaded = AutoPeftModelForCausalLM.from_pretrained(tmp_path / "adapter")
    trained = {k: v for k, v in trainer.model.state_dict().items() if "lora_B" in k}
    assert trained and any(v.abs().sum() > 0 for v in trained.values())
    for name, value in trained.items():
        torch.testing.assert_close(reloaded.state_dict()[name], value)
    merged = reloaded.merge_and_unload()
    out = merged.generate(**tokenizer(["1+1="], return_tensors="pt"), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 7)


@pytest.mark.slow
def test_tensorboard_event_file_holds_cegppo_scalars(make_trainer, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logdir = tmp_path  # transformers 5 writes TensorBoard events under output_dir
    trainer = make_trainer(num_iterations=2, max_steps=2, report_to="tensorboard")
    trainer.train()
    event_files = [os.path.join(r, f) for r, _, fs in os.walk(logdir) for f in fs if "tfevents" in f]
    assert event_files
    acc = EventAccumulator(os.path.dirname(event_files[0]))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for name in (
        "cegppo/beta1",
        "cegppo/beta2",
        "cegppo/ratio/min",
        "cegppo/ratio/max",
        "clip_ratio/low_mean",
    ):
        assert f"train/{name}" in tags, sorted(tags)
    beta1 = [e.value for e in acc.Scalars("train/cegppo/beta1")]
    assert beta1 == [0.5, 0.5]


def test_model_card_rewrite_adds_the_section_before_the_citations():
    from cegppo_trl.modelcard import rewrite_card

    trl_card = (
        "# Model Card for run\n\nThis model is a fine-tuned version of [None](https://huggingface.co/None).\n\n"
        '```python\ngenerator = pipeline("text-generation", model="None")\n```\n\n## Citations\n\nCite TRL\n'
    )
    card = rewrite_card(trl_card, {"beta1": "constant:0.5"})
    assert "| `beta1` | `constant:0.5` |" in card and card.index("## CE-GPPO settings") < card.index("## Citations")
    assert "fine-tuned version of a local model." in card and 'model="path/to/this/folder"' in card
    assert "Stopped early" not in card
    stopped = rewrite_card(trl_card, {"beta1": "constant:0.5", "stopped_early": "at step 3: no spread"})
    assert "**Stopped early, for lack of a learning signal**, at step 3: no spread" in stopped
    assert "stopped_early" not in stopped  # a line, not a table row
    hub = "fine-tuned version of [Qwen/Qwen2.5-0.5B](https://huggingface.co/Qwen/Qwen2.5-0.5B)"
    assert hub in rewrite_card(hub + "\n", {})  # a Hub model keeps its link


def test_every_card_trl_writes_carries_the_settings_of_the_subclass(make_research_trainer, tmp_path):
    # TRL writes its card at each checkpoint (`_save_checkpoint`); `cegppo_settings()` is the trainer's method, so a
    # subclass's rows (the research layer's) are on it.
    trainer = make_research_trainer(gppo_beta_rule="entropy", max_steps=1, save_strategy="steps", save_steps=1)
    trainer.train()
    card = (Path(trainer.args.output_dir) / "README.md").read_text()
    _assert_cegppo_card(card)
    assert "| `gppo_beta_rule` | `entropy` |" in card
