"""`lbctl prepare-data`: text files, or a Hugging Face `datasets` dataset saved with `save_to_disk`, tokenized
in parallel into a token file (`largebatch_trainer.token_files`).

Documents: each text file is one, tokenized whole (cutting a document would change its tokens under
some tokenizers: GPT-2's joins a newline with the spaces after it, SentencePiece's marks the start of a
text), files taken together into pieces of about 1 MiB, the unit of work; each row of a dataset is one
(its `text` column), a thousand rows to a piece. Documents are written in the order given, each
followed by the separator (the tokenizer's end-of-text token unless told otherwise), whatever order
the worker processes finish in. A text file must fit in a worker's memory: a corpus in a few huge
files is better saved as a dataset of documents.

Resumable: after each piece the file is flushed to disk and `<out>.partial.json` records the pieces
written, with a fingerprint of the inputs and the tokenizer. A run that finds it truncates the file to
what was recorded and continues; the description `<out>.json`, written last, marks the file complete.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from largebatch import files
from largebatch.errors import DataError
from largebatch_trainer.token_files import TokenMeta, dtype_for, meta_path

PIECE_BYTES = 1 << 20
PIECE_ROWS = 1000


@dataclass(frozen=True)
class Piece:
    """A unit of work: text files (one document each), or rows [start, stop) of a saved dataset."""

    files: tuple[str, ...] = ()
    dataset: str | None = None
    start: int = 0
    stop: int = 0


@dataclass(frozen=True)
class Summary:
    path: Path
    bytes: int
    tokens: int
    documents: int
    meta: TokenMeta
    resumed_at: int = 0
    """Pieces that an earlier, interrupted run had written."""


def _is_dataset(path: Path) -> bool:
    return path.is_dir() and ((path / "dataset_info.json").is_file() or (path / "dataset_dict.json").is_file())


def _load_dataset(path: str, split: str | None, text_column: str):
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path} is a saved dataset: reading it needs the datasets library (largebatch[hf])") from None
    loaded = datasets.load_from_disk(path)
    if isinstance(loaded, datasets.DatasetDict):
        if split is None and len(loaded) == 1:
            split = next(iter(loaded))
        if split not in loaded:
            raise DataError(f"{path} holds splits {sorted(loaded)}: choose one with --split")
        loaded = loaded[split]
    if text_column not in loaded.column_names:
        raise DataError(f"{path} has columns {loaded.column_names}, not {text_column!r}: name it with --text-column")
    return loaded


def pieces(inputs: list[Path], split: str | None, text_column: str) -> list[Piece]:
    """The work, in document order: text files gathered to PIECE_BYTES, datasets cut every PIECE_ROWS rows."""
    out: list[Piece] = []
    files: list[str] = []
    size = 0
    for path in inputs:
        if _is_dataset(path):
            out += [Piece(tuple(files))] if files else []
            files, size = [], 0
            rows = len(_load_dataset(str(path), split, text_column))
            out += [Piece((), str(path), a, min(a + PIECE_ROWS, rows)) for a in range(0, rows, PIECE_ROWS)]
        elif path.is_file():
            files.append(str(path))
            size += path.stat().st_size
            if size >= PIECE_BYTES:
                out.append(Piece(tuple(files)))
                files, size = [], 0
        else:
            raise DataError(f"{path}: not a text file or a dataset saved with save_to_disk (no dataset_info.json)")
    return out + ([Piece(tuple(files))] if files else [])


# --- the worker processes ------------------------------------------------------------------------------

_worker: dict = {}


def _start_worker(tokenizer: str, separator: int, dtype: str, split: str | None, text_column: str) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # the processes are the parallelism
    _worker.update(tokenizer=load_tokenizer(tokenizer), separator=separator, dtype=dtype, split=split,
                   column=text_column, datasets={})  # fmt: skip


def _tokenize(piece: Piece) -> tuple[bytes, int]:
    """The piece's tokens as the file's bytes, and its number of documents."""
    tokenizer, separator = _worker["tokenizer"], _worker["separator"]
    if piece.dataset is not None:
        if piece.dataset not in _worker["datasets"]:
            _worker["datasets"][piece.dataset] = _load_dataset(piece.dataset, _worker["split"], _worker["column"])
        texts = _worker["datasets"][piece.dataset][piece.start : piece.stop][_worker["column"]]
    else:
        texts = [Path(f).read_text(encoding="utf-8", errors="replace") for f in piece.files]
    ids: list[int] = []
    for encoded in tokenizer(texts, add_special_tokens=False)["input_ids"]:
        ids += [*encoded, separator]
    return np.asarray(ids, dtype=_worker["dtype"]).tobytes(), len(texts)


def load_tokenizer(directory: str):
    try:
        import transformers
    except ImportError:
        raise DataError("prepare-data needs transformers for the tokenizer: install largebatch[hf]") from None
    if not Path(directory, "tokenizer_config.json").is_file() and not Path(directory, "tokenizer.json").is_file():
        raise DataError(f"--tokenizer {directory}: not a tokenizer directory (no tokenizer.json or "
                        "tokenizer_config.json); save one with tokenizer.save_pretrained(DIR)")  # fmt: skip
    transformers.logging.set_verbosity_error()
    return transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)


# --- the writer ----------------------------------------------------------------------------------------


def _fingerprint(work: list[Piece], tokenizer: str, meta: TokenMeta) -> str:
    files = sorted({f for p in work for f in p.files} | {p.dataset for p in work if p.dataset})
    stats = [(f, os.stat(f).st_size, os.stat(f).st_mtime_ns) for f in files]
    tokenizer_files = sorted((p.name, p.stat().st_size) for p in Path(tokenizer).iterdir() if p.is_file())
    material = json.dumps([[asdict(p) for p in work], stats, tokenizer_files, asdict(meta)], default=str)
    return hashlib.sha256(material.encode()).hexdigest()


def _in_order(executor: ProcessPoolExecutor, work: list[Piece], window: int) -> Iterator[tuple[bytes, int]]:
    """Results in submission order, with at most `window` pieces in flight (memory stays bounded)."""
    pending: deque = deque()
    for piece in work:
        pending.append(executor.submit(_tokenize, piece))
        if len(pending) >= window:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def prepare(
    inputs: list[Path],
    tokenizer: str,
    out: Path,
    workers: int,
    separator: int | None = None,
    text_column: str = "text",
    split: str | None = None,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> Summary:
    """Tokenize `inputs` into `out` (see the module's docstring); `progress(pieces done, pieces)` as it goes."""
    loaded = load_tokenizer(tokenizer)
    separator = loaded.eos_token_id if separator is None else separator
    if separator is None:
        raise DataError(f"the tokenizer in {tokenizer} has no end-of-text token to put between documents: "
                        "name one with --separator ID")  # fmt: skip
    vocab = len(loaded)
    meta = TokenMeta(dtype_for(vocab), vocab, separator, tokenizer=str(Path(tokenizer).resolve()))
    work = pieces(inputs, split, text_column)
    fingerprint = _fingerprint(work, tokenizer, meta)
    state_path = out.with_name(out.name + ".partial.json")
    done, tokens, documents = 0, 0, 0
    if state_path.is_file():
        state = json.loads(state_path.read_text())
        if state.get("fingerprint") == fingerprint:
            done, tokens, documents = state["pieces"], state["tokens"], state["documents"]
    resumed_at = done
    meta_path(out).unlink(missing_ok=True)  # the file is incomplete from here until the end
    out.parent.mkdir(parents=True, exist_ok=True)
    itemsize = np.dtype(meta.dtype).itemsize
    progress(done, len(work))
    with open(out, "ab" if done else "wb") as handle:
        handle.truncate(tokens * itemsize)
        handle.seek(tokens * itemsize)
        arguments = (tokenizer, separator, meta.dtype, split, text_column)
        with ProcessPoolExecutor(max(1, workers), initializer=_start_worker, initargs=arguments) as executor:
            for data, ends in _in_order(executor, work[done:], 4 * max(1, workers)):
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
                done, tokens, documents = done + 1, tokens + len(data) // itemsize, documents + ends
                recorded = json.dumps({"fingerprint": fingerprint, "pieces": done, "tokens": tokens,
                                       "documents": documents})  # fmt: skip
                files.replace(state_path, lambda temporary, text=recorded: temporary.write_text(text))
                progress(done, len(work))
    meta = TokenMeta(**(asdict(meta) | {"tokens": tokens, "documents": documents}))
    meta.write(out)
    state_path.unlink(missing_ok=True)
    return Summary(out, out.stat().st_size, tokens, documents, meta, resumed_at)
