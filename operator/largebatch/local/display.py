"""The live view of a local run (rich): a progress bar with ETA and the numbers that matter."""

from __future__ import annotations

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn
from rich.table import Table


def _fmt(value, spec: str = "", missing: str = "–") -> str:
    return missing if value is None else format(value, spec)


class LiveDisplay:
    def __init__(self, console: Console, name: str, total: int):
        self.console = console
        self.bar = Progress(
            TextColumn(f"[bold]{name}"),
            BarColumn(),
            TaskProgressColumn(),
            MofNCompleteColumn(),
            TextColumn("samples  ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self.task = self.bar.add_task(name, total=total)
        self.details = Table.grid(padding=(0, 2))
        self.reason = ""
        self.live = Live(Group(self.bar, self.details), console=console, refresh_per_second=4)

    def __enter__(self) -> LiveDisplay:
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.live.__exit__(*exc)

    def event(self, message: str) -> None:
        self.console.log(message, markup=False)  # paths and workers' words, printed as they are

    def update(self, run, progress, capacity: int) -> None:
        report = run.report
        p, plan = report.get("progress", {}), report.get("plan", {})
        self.bar.update(self.task, completed=progress.samples)
        grid = Table.grid(padding=(0, 2))
        world = plan.get("worldSize")
        grid.add_row(
            f"[bold]{escape(_fmt(plan.get('policyPhase')))}[/]",
            f"batch [bold]{_fmt(plan.get('globalBatch'), ',')}[/] = {_fmt(world)} ranks"
            f" × {_fmt(plan.get('microBatch'))} × {_fmt(plan.get('accumulationSteps'))} accum",
            f"lr [bold]{_fmt(plan.get('lr'), '.3g')}[/]",
        )
        grid.add_row(
            f"loss [bold]{_fmt(p.get('loss'), '.4f')}[/]",
            f"noise scale {_fmt(p.get('noiseScale'), ',.1f')}   {_fmt(p.get('samplesPerSecond'), ',.0f')} samples/s",
            f"nodes {len(run.nodes)}/{capacity}  rescales {len(run.state.rescales)}",
        )
        if p.get("evalLoss") is not None:
            accuracy = f"accuracy [bold]{p['evalAccuracy']:.1%}[/]  " if p.get("evalAccuracy") is not None else ""
            grid.add_row(
                f"held-out [bold]{p['evalLoss']:.4f}[/]", f"{accuracy}[dim]after step {_fmt(p.get('evalStep'))}[/]", ""
            )
        if self.reason:
            grid.add_row("", f"[dim]{escape(self.reason)}[/]", "")
        self.details = grid
        self.live.update(Group(self.bar, grid))
