"""`lbctl sweep`: the learning-rate sweep of μTransfer. Short proxy runs of a job at a few widths over a grid
of learning rates, each a real `lbctl run --local`; the final loss of each, the best LR per width, and
the job with that LR for its own width. Under μP the best LR stays where it is as the width grows, so
the one found on a narrow proxy is the one to train the wide model with; under the standard
parametrization it moves (benchmarks/README.md measures both).

This module plans the runs and reads their records; it runs them as subprocesses of `lbctl run`, each in
its own run directory under the sweep's folder, so a sweep stopped half-way resumes where it was: a
run whose record says complete is read, not run again. `sweep_local`, at its end, is the command itself:
its checks, the results it writes and shows, and the job it writes with the LR found.
"""

from __future__ import annotations

import copy
import json
import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich import box
from rich.markup import escape
from rich.table import Table

from largebatch import jobfile, launch, trainer_facade
from largebatch.api import LargeBatchJob
from largebatch.errors import JobError
from largebatch.terminal import check_folder, console, fail, load_job

MAX_GRID = 64  # learning rates in one sweep


def parse_grid(text: str) -> list[float]:
    """`LOW:HIGH:N` (N learning rates evenly spaced in log from LOW to HIGH) or `A,B,C`."""
    try:
        if ":" in text:
            low, high, count = text.split(":")
            low, high, n = float(low), float(high), int(count)
            if not (0 < low < high and math.isfinite(high)) or not 2 <= n <= MAX_GRID:
                raise ValueError
            return [low * (high / low) ** (i / (n - 1)) for i in range(n)]
        values = sorted({float(v) for v in text.split(",")})
        if not values or len(values) > MAX_GRID or not all(0 < v and math.isfinite(v) for v in values):
            raise ValueError
        return values
    except ValueError:
        raise ValueError(
            f"--lr {text!r}: give LOW:HIGH:N (N from 2 to {MAX_GRID} rates, log-spaced, 0 < LOW < HIGH) or a "
            "comma-separated list of positive rates, e.g. 1e-4:3e-2:8"
        ) from None


def parse_widths(text: str) -> list[int]:
    try:
        widths = sorted({int(w) for w in text.split(",")})
        if not widths or widths[0] < 1:
            raise ValueError
        return widths
    except ValueError:
        raise ValueError(f"--widths {text!r}: give positive integers separated by commas, e.g. 64,256") from None


@dataclass(frozen=True)
class Trial:
    width: int
    lr: float
    name: str

    def folder(self, root: Path) -> Path:
        """The trial's job file and lbctl's output; its run directory is `run/` inside."""
        return root / self.name


@dataclass
class Outcome:
    trial: Trial
    loss: float | None  # held-out loss at the end (training loss when the task has no held-out set)
    status: str  # complete, diverged, failed

    def to_json(self) -> dict:
        return {"width": self.trial.width, "lr": self.trial.lr, "loss": self.loss, "status": self.status,
                "run": self.trial.name}  # fmt: skip


def trials(name: str, widths: list[int], lrs: list[float]) -> list[Trial]:
    return [Trial(w, lr, f"{name}-w{w}-lr{i}") for w in widths for i, lr in enumerate(lrs)]


def proxy_document(document: dict, trial: Trial, samples: int | None) -> dict:
    """The job as one proxy run: its width and LR set, on one node, optionally shortened to `samples`
    (warmup shortened in proportion, so the schedule keeps its shape)."""
    proxy = copy.deepcopy(document)
    spec = proxy["spec"]
    proxy["metadata"]["name"] = trial.name
    spec["task"].setdefault("args", {})["width"] = trial.width
    spec["optimizer"]["lr"] = trial.lr
    spec["workers"] = {**spec.get("workers", {}), "min": 1, "max": 1}
    if samples is not None:
        schedule = spec["schedule"]
        warmup = schedule.get("warmupSamples", 0) * samples // schedule["totalSamples"]
        schedule.update(totalSamples=samples, warmupSamples=warmup)
    return proxy


def read_outcome(trial: Trial, root: Path) -> Outcome | None:
    """The outcome of a run that has ended for good: complete, or diverged (the same steps would diverge
    again). None for one that has not (never started, stopped or failed): it is to run."""
    try:
        record = json.loads((trial.folder(root) / "run" / "run.json").read_text())
    except (OSError, ValueError):
        return None
    if not record.get("complete"):
        return Outcome(trial, None, "diverged") if _diverged(trial, root) else None
    loss = record.get("evalLoss") if record.get("evalLoss") is not None else record.get("finalLoss")
    if loss is None or not math.isfinite(loss):
        return Outcome(trial, None, "diverged")
    return Outcome(trial, loss, "complete")


def _diverged(trial: Trial, root: Path) -> bool:
    """The trainer stops a run whose loss became NaN or infinite with "training diverged"
    (largebatch.errors.DivergenceError), in its nodes' logs (lbctl's own output wraps lines)."""
    logs = (trial.folder(root) / "run" / "logs").glob("*.log")
    return any(launch.DIVERGED in log.read_text(errors="replace") for log in logs)


def run_all(
    document: dict,
    runs: list[Trial],
    root: Path,
    parallel: int,
    samples: int | None,
    on_done: Callable[[Outcome], None],
) -> list[Outcome]:
    """Run every trial not already complete under `root`, `parallel` at a time; their outcomes in order."""
    outcomes: dict[Trial, Outcome] = {}
    waiting = []
    for trial in runs:
        found = read_outcome(trial, root)
        if found:
            outcomes[trial] = found
            on_done(found)
        else:
            waiting.append(trial)
    active: dict[Trial, subprocess.Popen] = {}
    try:
        while waiting or active:
            while waiting and len(active) < parallel:
                trial = waiting.pop(0)
                active[trial] = _start(document, trial, root, parallel, samples)
            # Until a proxy ends; WNOWAIT leaves it for its Popen to reap (the proxies are the only children).
            os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT)
            for trial, process in list(active.items()):
                if process.poll() is not None:
                    del active[trial]
                    outcome = read_outcome(trial, root) or Outcome(trial, None, "failed")
                    outcomes[trial] = outcome
                    on_done(outcome)
    finally:
        for process in active.values():
            process.terminate()
        for process in active.values():
            process.wait()
    return [outcomes[t] for t in runs]


def _start(document: dict, trial: Trial, root: Path, parallel: int, samples: int | None) -> subprocess.Popen:
    folder = trial.folder(root)
    folder.mkdir(parents=True, exist_ok=True)
    job = folder / "job.yaml"
    job.write_text(yaml.safe_dump(proxy_document(document, trial, samples), sort_keys=False))
    # --slots: this machine holds `parallel` runs of one node each, so each node gets its share of cores.
    command = [sys.executable, "-m", "largebatch", "run", str(job), "--local", "--run-dir", str(folder / "run"),
               "--slots", str(parallel), "--metrics-port", "0"]  # fmt: skip
    # A proxy outliving a killed sweep would train on unseen; SIGTERM stops it as Ctrl-C would.
    lifeline = trainer_facade.lifeline(signal.SIGTERM, os.getpid())
    with open(folder / "lbctl.log", "wb") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=lifeline)  # fmt: skip


def best(outcomes: list[Outcome]) -> dict[int, Outcome]:
    """The lowest-loss complete run of each width."""
    found: dict[int, Outcome] = {}
    for o in outcomes:
        if o.loss is not None and (o.trial.width not in found or o.loss < found[o.trial.width].loss):
            found[o.trial.width] = o
    return found


def transferred(document: dict, lr: float) -> dict:
    """The job with the LR found on the proxies, for its own width."""
    target = copy.deepcopy(document)
    target["spec"]["optimizer"]["lr"] = float(f"{lr:.6g}")
    return target


def plot(outcomes: list[Outcome], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for width in sorted({o.trial.width for o in outcomes}):
        points = [(o.trial.lr, o.loss) for o in outcomes if o.trial.width == width and o.loss is not None]
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=f"width {width}")
    for o in best(outcomes).values():
        ax.plot([o.trial.lr], [o.loss], marker="*", markersize=14, color="black")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final loss")
    ax.set_title(title)
    if ax.lines:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --- lbctl sweep ---------------------------------------------------------------------------------------


def sweep_local(
    job: Path,
    widths: str,
    lr: str,
    local: bool,
    parallel: int,
    samples: int | None,
    out_dir: Path | None,
    apply: Path | None,
) -> None:
    """`lbctl sweep`: check the proxies and the task first, run them, write results.json and sweep.png,
    show the table; exit 1 when a width has no finished run, else write the job with the LR (--apply)."""
    if not local:
        raise fail("sweeps run on this machine for now: pass --local")
    manifest = load_job(job)
    try:
        width_list, lrs = parse_widths(widths), parse_grid(lr)
    except ValueError as exc:
        raise fail(exc) from None
    if apply is not None:
        check_folder("--apply", apply)
    document = jobfile.read_document(job)
    runs = trials(manifest.metadata.name, width_list, lrs)
    _check_proxies(document, runs[:: len(lrs)], samples)
    spec = manifest.spec
    try:  # once, in seconds, rather than as many failed runs
        trainer_facade.preflight_task(
            spec.task.entrypoint, dict(spec.task.args) | {"width": width_list[0]}, spec.task.seed
        )
    except JobError as exc:
        raise fail(exc) from None
    root = out_dir or Path("runs") / f"sweep-{manifest.metadata.name}"
    console.print(f"{len(runs)} proxy runs ({len(width_list)} widths × {len(lrs)} LRs), {parallel} at a time, in "
                  f"{escape(str(root))}", soft_wrap=True)  # fmt: skip
    outcomes = run_all(document, runs, root, parallel, samples, _say_done)
    found = best(outcomes)
    _write_results(outcomes, found, root, manifest.metadata.name)
    console.print(sweep_table(outcomes, width_list, lrs, found))
    console.print(
        f"Results {escape(str(root / 'results.json'))}, plot {escape(str(root / 'sweep.png'))}", soft_wrap=True
    )
    if len(found) < len(width_list):
        raise fail(f"no proxy run finished at width(s) {sorted(set(width_list) - set(found))}: see the logs in "
                   f"{root}", code=1)  # fmt: skip
    if apply is not None:
        _apply(document, spec, found[width_list[-1]], width_list[-1], apply)


def _check_proxies(document: dict, each_width: list[Trial], samples: int | None) -> None:
    """Each width once: a proxy the API would refuse fails here, not later."""
    for trial in each_width:
        try:
            LargeBatchJob.model_validate(proxy_document(document, trial, samples))
        except ValueError as exc:
            raise fail(f"the proxy at width {trial.width} is not a valid job:\n{jobfile.describe(exc)}") from None


def _say_done(o: Outcome) -> None:
    loss = f"{o.loss:.4f}" if o.loss is not None else o.status
    console.print(f"  width {o.trial.width:>5}  lr {o.trial.lr:.3g}: {loss}", highlight=False)


def _write_results(outcomes: list[Outcome], found: dict[int, Outcome], root: Path, name: str) -> None:
    (root / "results.json").write_text(json.dumps({
        "runs": [o.to_json() for o in outcomes],
        "best": {str(w): o.trial.lr for w, o in found.items()},
    }, indent=1))  # fmt: skip
    plot(outcomes, root / "sweep.png", title=f"{name}: final loss against LR")


def _apply(document: dict, spec, chosen: Outcome, width: int, path: Path) -> None:
    """Write the job with the LR found at the widest proxy width (`chosen`) to `path`."""
    path.write_text(yaml.safe_dump(transferred(document, chosen.trial.lr), sort_keys=False))
    target = spec.task.args.get("width", "the task's default")
    console.print(f"LR {chosen.trial.lr:.4g} (best at width {width}) written for width {target} to "
                  f"{escape(str(path))}", soft_wrap=True)  # fmt: skip
    if spec.task.args.get("parametrization") != "mup":
        console.print("[yellow]note:[/] under the standard parametrization the best LR moves with width; "
                      "set task.args.parametrization: mup for an LR that transfers")  # fmt: skip


def sweep_table(outcomes: list[Outcome], widths: list[int], lrs: list[float], found: dict) -> Table:
    table = Table(title="Final loss (* best at its width)", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("LR", justify="right")
    for width in widths:
        table.add_column(f"width {width}", justify="right")
    by = {(o.trial.width, o.trial.lr): o for o in outcomes}
    for rate in lrs:
        cells = []
        for width in widths:
            o = by[(width, rate)]
            mark = "*" if found.get(width) is o else ""
            cells.append(f"{o.loss:.4f}{mark}" if o.loss is not None else o.status)
        table.add_row(f"{rate:.3g}", *cells)
    return table
