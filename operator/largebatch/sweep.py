"""`lbctl sweep`: the learning-rate sweep of μTransfer. Short proxy runs of a job at a few widths over a grid
of learning rates, each a real `lbctl run --local`; the final loss of each, the best LR per width, and
the job with that LR for its own width. Under μP the best LR stays where it is as the width grows, so
the one found on a narrow proxy is the one to train the wide model with; under the standard
parametrization it moves (benchmarks/README.md measures both).

This module plans the runs and reads their records; it runs them as subprocesses of `lbctl run`, each in
its own run directory under the sweep's folder, so a sweep stopped half-way resumes where it was: a
run whose record says complete is read, not run again.
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

from largebatch import launch

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
    (largebatch_trainer.loop.DivergenceError), in its nodes' logs (lbctl's own output wraps lines)."""
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
    from largebatch_trainer.lifeline import die_with_parent

    sweeper = os.getpid()
    with open(folder / "lbctl.log", "wb") as log:
        # A proxy outliving a killed sweep would train on unseen; SIGTERM stops it as Ctrl-C would.
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: die_with_parent(signal.SIGTERM, sweeper))  # fmt: skip


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
