"""`lbctl prepare-data` as a user runs it: text files and saved datasets into the token file the tokenizer
itself would give, in parallel, and a run killed half way that a second run finishes into the same file."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import numpy as np
import pytest

from largebatch_trainer.prepare_data import PIECE_BYTES, load_tokenizer
from largebatch_trainer.token_files import meta_path, read_meta
from tests.helpers import bound, wait_for
from tests.integration.hf_helpers import make_tokenizer, texts
from tests.integration.trainer_helpers import LBCTL

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    return make_tokenizer(tmp_path_factory.mktemp("tokenizer") / "tokenizer")


def prepare(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
    command = [*LBCTL, "prepare-data", *map(str, args)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=bound(timeout))
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def expected_tokens(tokenizer: Path, documents: list[str]) -> list[int]:
    loaded = load_tokenizer(str(tokenizer))
    out: list[int] = []
    for text in documents:
        out += loaded(text, add_special_tokens=False)["input_ids"] + [loaded.eos_token_id]
    return out


def test_text_files_become_the_tokens_the_tokenizer_gives_each_document(tmp_path, tokenizer):
    files = texts(12)
    big = tmp_path / "big.txt"  # a piece of its own, after one of the twelve small files
    big.write_bytes(b"".join(p.read_bytes() for p in texts(60)) * 2)
    assert big.stat().st_size > 2 * PIECE_BYTES
    out = tmp_path / "train.bin"
    result = prepare(*files, big, "--tokenizer", tokenizer, "--out", out, "--workers", "2")
    meta = read_meta(out, "out")
    tokens = np.fromfile(out, dtype=meta.dtype).tolist()
    documents = [p.read_text() for p in files] + [big.read_text()]
    assert tokens == expected_tokens(tokenizer, documents)
    assert (meta.tokens, meta.documents, meta.vocabSize, meta.separator) == (len(tokens), 13, 512, 0)
    assert f"{len(tokens):,} tokens in 13 documents" in result.stdout
    assert f"{out.stat().st_size / 1e6:,.1f} MB" in result.stdout


def test_a_saved_dataset_gives_one_document_per_row(tmp_path, tokenizer):
    import datasets

    rows = [p.read_text() for p in texts(30)]
    datasets.DatasetDict({
        "train": datasets.Dataset.from_dict({"body": rows[:25]}),
        "test": datasets.Dataset.from_dict({"body": rows[25:]}),
    }).save_to_disk(tmp_path / "saved")  # fmt: skip
    out = tmp_path / "val.bin"
    prepare(tmp_path / "saved", "--split", "test", "--text-column", "body", "--tokenizer", tokenizer, "--out", out)
    assert np.fromfile(out, dtype=np.uint16).tolist() == expected_tokens(tokenizer, rows[25:])
    assert read_meta(out, "out").documents == 5
    command = [*LBCTL, "prepare-data", str(tmp_path / "saved"), "--tokenizer", str(tokenizer), "--out", "x.bin"]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=bound(300), cwd=tmp_path)
    assert refused.returncode == 2 and "holds splits ['test', 'train']: choose one with --split" in refused.stderr


def test_a_run_killed_half_way_is_finished_by_the_next_into_the_same_file(tmp_path, tokenizer):
    text = b"".join(p.read_bytes() for p in texts(400))[:PIECE_BYTES]
    corpus = [tmp_path / f"doc-{i:02}.txt" for i in range(8)]  # 8 pieces, 0.6 s each
    for i, path in enumerate(corpus):
        path.write_bytes(text[i:])
    out, state = tmp_path / "train.bin", tmp_path / "train.bin.partial.json"
    command = [*LBCTL, "prepare-data", *map(str, corpus), "--tokenizer", str(tokenizer), "--out", str(out),
               "--workers", "2"]  # fmt: skip
    first = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: state.is_file() and json.loads(state.read_text())["pieces"] >= 3, timeout=120,
                 what="three pieces written")  # fmt: skip
        os.killpg(first.pid, signal.SIGSTOP)  # no piece more from here on
        written = json.loads(state.read_text())["pieces"]
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        first.wait()
    assert written < len(corpus) and not meta_path(out).exists()
    result = prepare(*corpus, "--tokenizer", tokenizer, "--out", out, "--workers", "2")
    assert f"resumed after {written} pieces" in result.stdout and not state.exists()
    fresh = tmp_path / "fresh.bin"
    prepare(*corpus, "--tokenizer", tokenizer, "--out", fresh, "--workers", "1")
    assert out.read_bytes() == fresh.read_bytes()
    assert read_meta(out, "out").tokens == read_meta(fresh, "out").tokens == out.stat().st_size // 2
