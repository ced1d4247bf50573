"""`lbctl prepare-data` and `lbctl export`: a corpus into a token file, a checkpoint into the model's own
format. Both run the trainer's code in lbctl's process (through `largebatch.trainer_facade`); this
module reads the arguments and renders the progress and the result."""

from __future__ import annotations

import os
from pathlib import Path

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from largebatch import trainer_facade
from largebatch.errors import JobError
from largebatch.terminal import check_folder, console, fail, load_job


def prepare_data(
    inputs: list[Path],
    tokenizer: Path,
    out: Path,
    workers: int | None,
    separator: int | None,
    text_column: str,
    split: str | None,
) -> None:
    check_folder("--out", out)
    columns = (TextColumn("tokenizing"), BarColumn(), MofNCompleteColumn(), TextColumn("pieces"), TimeRemainingColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("tokenizing", total=None)
        try:
            summary = trainer_facade.prepare_tokens(
                inputs, str(tokenizer), out, workers or os.cpu_count() or 1, separator, text_column, split,
                lambda done, total: bar.update(task, completed=done, total=total),
            )  # fmt: skip
        except JobError as exc:
            raise fail(exc) from None
    if summary.resumed_at:
        console.print(f"resumed after {summary.resumed_at} pieces an earlier run had written")
    meta = summary.meta
    console.print(
        f"{escape(str(summary.path))}: {summary.bytes / 1e6:,.1f} MB, {summary.tokens:,} tokens in "
        f"{summary.documents:,} documents ({meta.dtype}, vocabulary {meta.vocabSize:,}, separator {meta.separator}); "
        f"described in {escape(summary.path.name)}.json",
        soft_wrap=True,
    )


def export(job: Path, checkpoint_dir: Path | None, step: int | None, out: Path) -> None:
    manifest = load_job(job)
    check_folder("--out", out)
    directory = checkpoint_dir or Path(manifest.spec.checkpoint.path)
    try:
        written, path = trainer_facade.export_model(manifest.spec, directory, step, out)
    except JobError as exc:
        raise fail(exc) from None
    console.print(f"wrote the model of step {written} to {escape(str(path))}", soft_wrap=True)
