"""Train a small byte-level BPE tokenizer locally, with a ChatML chat template.

No hub access exists at run time, so the demo and the tests train their own tokenizer on the
text they will see (GSM8K, the synthetic tasks). Real runs load a real model's tokenizer from a
local path or S3 instead (``posttrain.models.hf.load_tokenizer``).

Run: ``python -m posttrain.data.tokenizer OUT_DIR FILE [FILE ...]``.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
"""Special tokens: end of text (also padding), ChatML turn start and end."""

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""ChatML: ``<|im_start|>role\\ncontent<|im_end|>\\n`` per message; the assistant turn is opened on request."""


def train_tokenizer(texts: Iterable[str], out_dir: Path, vocab_size: int = 2048) -> Path:
    """Train a byte-level BPE tokenizer and save it as a transformers tokenizer directory.

    Args:
        texts: Training corpus (strings).
        out_dir: Directory to write ``tokenizer.json`` and ``tokenizer_config.json`` into.
        vocab_size: Target vocabulary size (tokens), including the 256 byte tokens and specials.

    Returns:
        ``out_dir``.

    Raises:
        ValueError: if ``vocab_size`` is below 300 (too small for bytes plus merges).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 300:
        raise ValueError(f"vocab_size: must be >= 300, got {vocab_size}")
    tok = Tokenizer(models.BPE())
    # Digits are split one per token (as Qwen does), so arithmetic is learnable by tiny models.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    fast.chat_template = CHATML_TEMPLATE
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Command-line entry: train on the given text/JSONL files (one text per line)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2:
        print("usage: python -m posttrain.data.tokenizer OUT_DIR FILE [FILE ...]", file=sys.stderr)
        return 2
    out, files = Path(args[0]), [Path(f) for f in args[1:]]
    lines = (line for f in files for line in f.read_text(encoding="utf-8").splitlines())
    train_tokenizer(lines, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
