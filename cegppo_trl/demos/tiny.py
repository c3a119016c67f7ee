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
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
# A chat template that renders a whole tool-calling conversation in characters of `DEFAULT_CHARS`: the tool names,
# each assistant turn as `<a>...</s>` (the end of the turn is the end-of-sequence token, so a
# model's turn ends where its generation stops) with its calls as `<call>{"name": ..., "arguments": {...}}</call>`, each tool
# result as `<t>...</t>`. Earlier turns render the same whatever follows (TRL's multi-turn tool loop needs that).
TOOL_CHAT_TEMPLATE = (
    "{%- if tools %}{{ '<tools>' }}{% for tool in tools %}{{ tool['function']['name'] }};{% endfor %}"
    "{{ '</tools>' }}{% endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}{{ '<a>' + (message['content'] or '') }}"
    "{%- for call in message['tool_calls'] or [] %}{{ '<call>' + (call['function'] | tojson) + '</call>' }}"
    "{%- endfor %}{{ '</s>' }}"
    "{%- elif message['role'] == 'tool' %}{{ '<t>' + message['content'] + '</t>' }}"
    "{%- else %}{{ message['content'] }}{% endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<a>' }}{% endif %}"
)
# How `tokenizer.parse_response` (transformers >= 5.13, TRL's tool-call parser) reads an assistant turn of
# `TOOL_CHAT_TEMPLATE` back into a message with `tool_calls`.
TOOL_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<a>",
    "fields": {
        "tool_calls": {
            "open": "<call>",
            "close_pattern": r"</call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"</s>\s*", "content": "text"},
    },
}


def build_char_tokenizer(chars: str = DEFAULT_CHARS, *, tool_calling: bool = False) -> PreTrainedTokenizerFast:
    """A character-level fast tokenizer with left padding and a plain-text chat template.

    Args:
        chars: the vocabulary, one token per character (deduplicated, order kept).
        tool_calling: use `TOOL_CHAT_TEMPLATE` and set `TOOL_RESPONSE_TEMPLATE` as the tokenizer's
            `response_template`, so TRL's `tools=` and `environment_factory` render and parse tool calls.

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
    tokenizer.chat_template = TOOL_CHAT_TEMPLATE if tool_calling else PLAIN_CHAT_TEMPLATE
    if tool_calling:
        tokenizer.response_template = TOOL_RESPONSE_TEMPLATE
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
