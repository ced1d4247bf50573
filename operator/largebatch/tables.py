"""The rich tables lbctl prints: a plan and the noise scales it assumes (`plan`, `describe`), the jobs on
a cluster (`status`, `run`), a local run's summary (`run --local`) and the coordinate check's last step
(`coord-check`). Each function builds a table from what it is given and prints nothing."""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.markup import escape
from rich.table import Table

from largebatch import plan_report, timestamps


def plan_table(spec, result: plan_report.PlanReport, title: str) -> Table:
    total = spec.schedule.total_samples
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("Phase", "Samples %", "Batch", "LR", "Workers", "Micro×acc", "Steps"):
        table.add_column(column, justify="left" if column == "Phase" else "right", no_wrap=True)
    for row in result.rows:
        p = row.phase
        lr = f"{p.lr_start:.3g}" if p.lr_start == p.lr_end else f"{p.lr_start:.3g}→{p.lr_end:.3g}"
        table.add_row(
            p.label,
            f"{100 * p.start / total:.1f}–{100 * p.end / total:.1f}",
            f"{p.global_batch:,}",
            lr,
            f"{row.workers}×{spec.workers.devices_per_worker}",
            f"{row.micro_batch}×{row.accumulation_steps}",
            f"{p.steps:,}",
        )
    return table


def assumptions_table(assumed: list[plan_report.Assumption]) -> Table:
    table = Table(title="If the measured noise scale were", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("Noise scale", "Largest batch", "Steps", "Saving"):
        table.add_column(column, justify="right", no_wrap=True)
    for a in assumed:
        table.add_row(f"{a.noise_scale:,.1f}", f"{a.largest_batch:,}", f"{a.serial_steps:,}", f"{a.saving:.1%}")
    return table


def jobs_table(jobs: list[dict], ns: str | None, wide: bool) -> Table | str:
    from largebatch import job_view

    if not jobs:
        return f"No LargeBatchJobs in {'any namespace' if ns is None else f'namespace {ns}'}."
    wide = wide or ns is None
    grid = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in job_view.WIDE_COLUMNS if wide else job_view.COLUMNS:
        grid.add_column(column, no_wrap=True, justify="left" if column in ("NAME", "NAMESPACE", "PHASE") else "right")
    now = timestamps.now()
    for job in jobs:
        grid.add_row(*(escape(cell) for cell in job_view.row(job, now, wide)))
    return grid


def summary_table(result: dict, json_path: Path, png_path: Path) -> Table:
    """A local run's record, as `lbctl run --local` ends."""
    table = Table(title="Run summary", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    batches = sorted({h["globalBatch"] for h in result["history"]})
    worlds = [h["worldSize"] for h in result["history"]]
    rows = [
        ("samples", f"{result['samplesConsumed']:,} of {result['totalSamples']:,}"),
        ("optimizer steps", f"{result['serialSteps']:,}"),
        ("wall time", f"{result['wallSeconds']:.0f} s over {result['sessions']} session(s)"),
        ("final loss", f"{result['finalLoss']:.4f}" if result["finalLoss"] is not None else "–"),
        ("held-out loss", f"{result['evalLoss']:.4f}" if result["evalLoss"] is not None else "–"),
        ("held-out accuracy", f"{result['evalAccuracy']:.1%}" if result.get("evalAccuracy") is not None else "–"),
        ("global batches", " → ".join(f"{b:,}" for b in batches) or "–"),
        ("world sizes", " → ".join(str(w) for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w) or "–"),
        ("rescales", str(len(result["rescales"]))),
        ("record", f"{json_path}, {png_path}"),
    ]
    for key, value in rows:
        table.add_row(key, escape(value))  # a path may hold brackets
    return table


def coordinates_table(table: dict, widths: list[int], steps: int) -> Table:
    """The coordinate check's mean |output| per layer at its last step, per width, and its growth."""
    rows = Table(title=f"Mean |output| at step {steps}", box=box.SIMPLE_HEAD, pad_edge=False)
    rows.add_column("Layer")
    for width in widths:
        rows.add_column(f"width {width}", justify="right")
    rows.add_column(f"×{widths[-1] // widths[0]} width", justify="right")
    for layer, by_width in table["layers"].items():
        last = [by_width[w][-1] for w in widths]
        growth = f"{last[-1] / last[0]:.2f}×" if last[0] else "–"
        rows.add_row(escape(layer), *(f"{v:.4g}" for v in last), growth)
    return rows
