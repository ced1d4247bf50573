"""`lbctl plan`: the schedule a job will follow, as a table (with the noise scales it assumes), as JSON,
or drawn to a PNG."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import typer
from rich.markup import escape

from largebatch import plan_report
from largebatch.tables import assumptions_table, plan_table
from largebatch.terminal import check_folder, console, fail, load_job


def show_plan(job: Path, workers: int | None, noise_scale: float | None, as_json: bool, plot: Path | None) -> None:
    manifest = load_job(job)
    if plot is not None:
        check_folder("--plot", plot)
    spec = manifest.spec
    result = plan_report.report(spec, capacity=workers, noise_scale=noise_scale)
    if plot is not None:
        from largebatch.plot import plot_plan

        try:
            plot_plan(spec, plot, title=f"{manifest.metadata.name}: planned batch and LR", noise_scale=noise_scale)
        except OSError as exc:
            raise fail(f"--plot {plot}: {exc.strerror or exc}") from None
    assumed = plan_report.assumed_noise_scales(spec) if spec.measures_noise_scale and noise_scale is None else []
    if as_json:
        extra = {"assumedNoiseScales": [a.to_json() for a in assumed]} if assumed else {}
        typer.echo(json.dumps(result.to_json() | extra, indent=2))
        return
    total = spec.schedule.total_samples
    console.print(
        plan_table(spec, result, f"{manifest.metadata.name}: {spec.batch.policy.type} plan, {total:,} samples")
    )
    changes = [b.phase for a, b in pairwise(result.rows) if b.phase.global_batch != a.phase.global_batch]
    if changes:
        warmup, after = spec.schedule.warmup_samples, total - spec.schedule.warmup_samples
        at = ", ".join(f"{(p.start - warmup) / after:.1%}" for p in changes)
        console.print(f"Batch increases at {at} of the samples after warmup.")
    console.print(
        f"Serial optimizer steps: [bold]{result.serial_steps:,}[/] against "
        f"{result.baseline_serial_steps:,} at constant batch {spec.batch.initial:,} with the same decay: "
        f"[bold]{result.saving:.1%}[/] fewer."
    )
    if assumed:
        console.print(assumptions_table(assumed))
        console.print("The batch follows the gradient noise scale the trainer measures, so the plan above "
                      "(none measured yet) is only the start; pass --noise-scale to see the phases for one "
                      "value.")  # fmt: skip
    if plot is not None:
        console.print(f"Plot written to {escape(str(plot))}", soft_wrap=True)
