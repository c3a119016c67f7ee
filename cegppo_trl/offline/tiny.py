"""Tiny, locally built Llama models and character-level tokenizers (no Hub): for tests, examples and the quickstart.

Follows the traps listed in docs/algorithm.md §6: a Llama architecture (not Qwen2, whose tokenizer class silently
drops spaces from such a vocabulary) and a `tokenizers` WordLevel model that splits every character.
"""

from __future__ import annotations

import string

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

DEFAULT_CHARS = string.digits + string.ascii_letters + " +-*/=()<>.,:;!?#'\"\n_[]{}|\\^$%&@~`"
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}


def build_char_tokenizer(chars: str = DEFAULT_CHARS) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with left padding and a plain-text chat template.

    Args:
        chars: the vocabulary, one token per character (deduplicated, order kept).

    Returns:
        A `PreTrainedTokenizerFast` whose ids are stable for a given `chars` string.
    """
    specials = list(SPECIAL_TOKENS.values())
    vocab = {tok: i for i, tok in enumerate(specials)}
    for ch in dict.fromkeys(chars):
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, padding_side="left", **SPECIAL_TOKENS)
    # Conversational datasets work too: the template concatenates the turns as plain text.
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
    return tokenizer


def build_tiny_llama(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    intermediate_size: int = 64,
    max_position_embeddings: int = 256,
    seed: int = 0,
) -> LlamaForCausalLM:
    """A randomly initialised Llama causal LM sized for `tokenizer`, deterministic for a given seed."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model
