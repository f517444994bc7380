"""Shared test fixture: a tiny Qwen2-style model with a tokenizer trained locally on GSM8K lines.

Import the fixture from ``tests/conftest.py``. Building it takes about a second: a byte-level BPE
tokenizer (vocabulary 1024) trained on 300 lines of ``data/gsm8k/train.jsonl``, and a random
2-layer model (hidden 128, 2 heads -> head_dim 64, 1 KV head) saved as safetensors in the same
directory, so the directory is both the model and the tokenizer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
GSM8K_TRAIN = REPO_ROOT / "data" / "gsm8k" / "train.jsonl"


@dataclass(frozen=True)
class TinyModel:
    """A tiny model directory (config, safetensors weights and tokenizer) and its facts."""

    path: Path
    vocab_size: int
    im_end_id: int
    im_start_id: int
    pad_id: int


def gsm8k_lines(limit: int = 300) -> list[str]:
    """The first ``limit`` GSM8K training questions and answers as plain text lines."""
    texts = []
    with GSM8K_TRAIN.open(encoding="utf-8") as fh:
        for i, line in enumerate(fh):
            if i >= limit:
                break
            row = json.loads(line)
            texts.append(row["question"])
            texts.append(row["answer"])
    return texts


def build_tiny(out_dir: Path, seed: int = 0, tie_word_embeddings: bool = False) -> TinyModel:
    """Train the tokenizer and build the model in ``out_dir``."""
    from posttrain.data.tokenizer import train_tokenizer
    from posttrain.models.hf import build_tiny_model, load_tokenizer

    train_tokenizer(gsm8k_lines(), out_dir, vocab_size=1024)
    tok = load_tokenizer(out_dir)
    build_tiny_model(out_dir, vocab_size=len(tok), seed=seed, tie_word_embeddings=tie_word_embeddings)
    return TinyModel(
        path=out_dir,
        vocab_size=len(tok),
        im_end_id=tok.convert_tokens_to_ids("<|im_end|>"),
        im_start_id=tok.convert_tokens_to_ids("<|im_start|>"),
        pad_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    )


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    """A tiny untied model plus tokenizer, built once per test session."""
    return build_tiny(tmp_path_factory.mktemp("tiny_model"))
