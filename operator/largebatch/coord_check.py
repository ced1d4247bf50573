"""`lbctl coord-check`: μP's coordinate check, run in lbctl's process through the trainer's facade; the
table beside the picture as JSON, and the last step's outputs per layer and width on the terminal."""

from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape

from largebatch import sweep, trainer_facade
from largebatch.errors import JobError
from largebatch.tables import coordinates_table
from largebatch.terminal import check_folder, console, fail, load_job


def coord_check(job: Path, widths: str, steps: int, out: Path) -> None:
    manifest = load_job(job)
    try:
        width_list = sweep.parse_widths(widths)
    except ValueError as exc:
        raise fail(exc) from None
    check_folder("--out", out)
    try:
        table = trainer_facade.measure_coordinates(manifest.spec, width_list, steps)
    except JobError as exc:  # the task refused a width
        raise fail(exc) from None
    table_path = out.with_suffix(".json")
    table_path.write_text(json.dumps(table, indent=1))
    trainer_facade.plot_coordinates(table, out, title=f"{manifest.metadata.name}: coordinate check")
    console.print(coordinates_table(table, width_list, steps))
    console.print(f"Picture {escape(str(out))}, table {escape(str(table_path))}", soft_wrap=True)
