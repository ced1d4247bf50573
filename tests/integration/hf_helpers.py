"""Helpers for the Hugging Face tests: a tokenizer trained here from text (no download) and the text."""

from __future__ import annotations

import sysconfig
from pathlib import Path

SEPARATOR = "<|endoftext|>"


def texts(count: int) -> list[Path]:
    """`count` source files of the standard library: text every Python installation has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.glob("*.py"))[:count]


def make_tokenizer(directory: Path, vocab: int = 512) -> Path:
    """A byte-level BPE tokenizer of `vocab` ids trained on a few standard-library files (a second or two),
    saved as transformers saves one, with the separator as its end-of-text token."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    trained = ByteLevelBPETokenizer()
    trained.train_from_iterator(
        (path.read_text(errors="replace") for path in texts(20)), vocab_size=vocab, special_tokens=[SEPARATOR]
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=trained._tokenizer, eos_token=SEPARATOR)
    wrapped.save_pretrained(directory)
    return directory
