"""Token files: a corpus tokenized ahead of time, read through `numpy.memmap` so that it never has to fit in
memory.

The format is the one nanoGPT's and Megatron-style preprocessing write, a flat array of token ids
(`uint16` when the vocabulary fits, else `uint32`, in this machine's byte order: little-endian on every
platform torch supports), documents joined by a separator token, plus a small JSON file beside it,
`<file>.json` (`train.bin` → `train.bin.json`), that says how to read it:

    {"format": "largebatch.tokens/v1", "dtype": "uint16", "vocabSize": 50257, "separator": 50256,
     "tokens": 9035582198, "documents": 8013769, "tokenizer": "/data/gpt2-tokenizer"}

`dtype` and `vocabSize` are required; `separator` (the id between documents), `pad` (an id that marks
padding, whose positions are left out of the loss), `tokens` (checked against the file's size: a file
still being written is refused), `documents` and `tokenizer` (the directory it was made with) are
optional. `lbctl prepare-data` writes both files (`largebatch_trainer.prepare_data`).

`TokenWindows` is the dataset: window i is tokens [i·context, i·context + context + 1), inputs and the
next-token targets, so consecutive windows overlap by the one token that is the last target of one and
the first input of the next. Windows are read from the page cache on demand; the trainer's permutation
(`largebatch_trainer.shuffle`) never lists them.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from largebatch import files
from largebatch.errors import DataError

FORMAT = "largebatch.tokens/v1"
DTYPES = ("uint16", "uint32")


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + ".json")


def dtype_for(vocab_size: int) -> str:
    return "uint16" if vocab_size <= 1 << 16 else "uint32"


@dataclass(frozen=True)
class TokenMeta:
    dtype: str
    vocabSize: int  # the JSON's spelling, as job files spell fields
    separator: int | None = None
    pad: int | None = None
    tokens: int | None = None
    documents: int | None = None
    tokenizer: str | None = None
    format: str = FORMAT

    def write(self, path: Path) -> None:
        text = json.dumps({k: v for k, v in asdict(self).items() if v is not None}, indent=1) + "\n"
        files.replace(meta_path(path), lambda temporary: temporary.write_text(text))


def read_meta(path: Path, arg: str) -> TokenMeta:
    """The token file's description, checked against the file. `arg` names the task arg for errors."""
    if not path.is_file():
        raise DataError(f"{arg}: token file {path} does not exist: make it with `lbctl prepare-data` and put it on "
                        "a volume the job mounts (workers.pod.volumes, or the checkpoint claim)")  # fmt: skip
    described = meta_path(path)
    if not described.is_file():
        raise DataError(
            f"{arg}: {path} has no {described.name} beside it, which says how to read it. `lbctl prepare-data` "
            'writes one; for a file made elsewhere (nanoGPT\'s train.bin) write {"dtype": "uint16", '
            '"vocabSize": 50257, "separator": 50256} with your tokenizer\'s numbers'
        )
    try:
        fields = json.loads(described.read_text())
        meta = TokenMeta(**fields)
    except (ValueError, TypeError) as exc:
        raise DataError(f"{arg}: {described} is not a token file description: {exc}") from None
    if meta.dtype not in DTYPES:
        raise DataError(f"{arg}: {described} has dtype {meta.dtype!r}: use one of {', '.join(DTYPES)}")
    if meta.vocabSize < 1 or (meta.dtype == "uint16" and meta.vocabSize > 1 << 16):
        raise DataError(f"{arg}: {described} has vocabSize {meta.vocabSize}, which {meta.dtype} cannot hold")
    size, itemsize = path.stat().st_size, np.dtype(meta.dtype).itemsize
    if size % itemsize or (meta.tokens is not None and size != meta.tokens * itemsize):
        expected = f"{meta.tokens} tokens × {itemsize} bytes" if meta.tokens is not None else f"whole {meta.dtype}s"
        raise DataError(f"{arg}: {path} is {size} bytes, not {expected}: truncated, or still being written")
    return meta


class TokenWindows(torch.utils.data.Dataset):
    """Windows [first, end) of `context + 1` tokens over a token file, read through a read-only memmap."""

    def __init__(self, path: Path, meta: TokenMeta, context: int, first: int = 0, end: int | None = None):
        self.path, self.meta, self.context = path, meta, context
        self.tokens = np.memmap(path, dtype=meta.dtype, mode="r") if path.stat().st_size else np.zeros(0, meta.dtype)
        self.first = first
        self.end = windows_in(len(self.tokens), context) if end is None else end

    def __len__(self) -> int:
        return self.end - self.first

    def __getitem__(self, i: int) -> torch.Tensor:
        start = (self.first + i) * self.context
        window = np.asarray(self.tokens[start : start + self.context + 1], dtype=np.int64)
        if window.max(initial=0) >= self.meta.vocabSize:  # before an embedding meets it (a device-side assert)
            raise DataError(f"{self.path}: window {self.first + i} holds token {int(window.max())}, not below the "
                            f"vocabSize {self.meta.vocabSize} of {meta_path(self.path).name}")  # fmt: skip
        return torch.from_numpy(window)


def windows_in(tokens: int, context: int) -> int:
    return max(0, (tokens - 1) // context)
