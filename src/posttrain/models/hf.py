"""The one module that knows model classes: build a tiny model from a config, load real ones.

Policies are causal LMs loaded with transformers (``AutoModelForCausalLM``); the critic
(``posttrain.learner.critic``) is the same backbone (``load_backbone``) with a scalar value head. A tiny Qwen2-shaped model is built from
a config for CPU runs (head_dim >= 32, which vLLM's CPU attention requires). Real models load
from a local directory or an ``s3://`` URI (downloaded first through ``posttrain.storage``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn


def build_tiny_model(
    out_dir: Path,
    vocab_size: int,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    intermediate_size: int = 256,
    max_position_embeddings: int = 1024,
    tie_word_embeddings: bool = False,
    seed: int = 0,
) -> Path:
    """Build a randomly initialised Qwen2-style causal LM and save it (safetensors) to ``out_dir``.

    Args:
        out_dir: Directory for ``config.json`` and ``model.safetensors``.
        vocab_size: Vocabulary size (tokens); must match the tokenizer.
        hidden_size: Model width; ``hidden_size / num_heads`` is the head dimension.
        num_layers: Transformer blocks.
        num_heads: Attention heads. Head dimension must be >= 32 (vLLM CPU attention).
        num_kv_heads: Key/value heads (grouped-query attention); divides ``num_heads``.
        intermediate_size: MLP width.
        max_position_embeddings: Longest sequence (tokens).
        tie_word_embeddings: Share the input embedding with the LM head.
        seed: Initialisation seed.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: head dimension below 32 or not an integer, or ``num_kv_heads`` not dividing ``num_heads``.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads or hidden_size // num_heads < 32:
        raise ValueError(
            f"hidden_size/num_heads: head_dim must be an integer >= 32, got {hidden_size}/{num_heads}"
        )
    if num_heads % num_kv_heads:
        raise ValueError(f"num_kv_heads: must divide num_heads={num_heads}, got {num_kv_heads}")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir), safe_serialization=True)
    return out_dir


def load_policy(path: Path | str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """Load a causal LM from a local HF directory (safetensors).

    Raises:
        FileNotFoundError: if ``path`` has no ``config.json``.
    """
    from transformers import AutoModelForCausalLM

    p = Path(path)
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"model path {p}: no config.json (expected a transformers model directory)")
    return AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype)


def load_tokenizer(path: Path | str) -> Any:
    """Load a tokenizer from a local directory; it must carry a chat template.

    Raises:
        FileNotFoundError: if ``path`` does not exist.
        ValueError: if the tokenizer has no chat template.
    """
    from transformers import AutoTokenizer

    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"tokenizer path {p} does not exist")
    tok = AutoTokenizer.from_pretrained(str(p))
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"tokenizer at {p}: no chat_template; posttrain renders chats with it")
    return tok


def load_backbone(path: Path | str, dtype: torch.dtype = torch.float32) -> Any:
    """Load the transformer backbone of a causal LM (no LM head) from a local HF directory.

    The SAO critic is this backbone with a value head (``posttrain.learner.critic``). Returns a
    transformers ``PreTrainedModel`` (its ``config.hidden_size`` sizes the head).

    Raises:
        FileNotFoundError: if ``path`` has no ``config.json``.
    """
    from transformers import AutoModel

    p = Path(path)
    if not (p / "config.json").exists():
        raise FileNotFoundError(f"model path {p}: no config.json (expected a transformers model directory)")
    return AutoModel.from_pretrained(str(p), dtype=dtype)
