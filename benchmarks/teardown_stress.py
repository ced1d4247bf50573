"""Teardown under load: launch short multi-rank trainings again and again beside a CPU hog and count the
launches in which any rank died at exit (a SIGABRT from gloo's threads, a non-zero exit), on a clean
finish and on SIGTERM.

    .venv/bin/python benchmarks/teardown_stress.py [--runs 30] [--ranks 3 4] [--modes clean sigterm]
                                                   [--hog N] [--launcher largebatch|torchrun]

A launch is one `torchrun --standalone --nproc-per-node=R` of the trainer (through largebatch's
launcher by default) on a small `pylm` job, several gradient buckets per step. "clean" runs to the end
and must exit 0; "sigterm" sends SIGTERM to the agent once the job has taken a few steps, as the
kubelet or the local runner do, and every rank must stop at the same step and exit 143. In both, no
worker may abort: the agent's log is searched for the C++ runtime's "terminate called", a fatal Python
error and a worker that ended on a signal. The hog is N busy processes (default: one per core).
Also reported: seconds from the last progress report to the launch's exit (p50 and max).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from load import cpu_hogs

PYTHON = sys.executable
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
ABORT = re.compile(r"terminate called|Fatal Python error|SIGABRT|SIGSEGV|exitcode\s*:\s*-\d+|Signal \d+ \(")


def job_file(directory: Path, ranks: int) -> Path:
    job = {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "teardown"},
        "spec": {
            "image": "bench",
            "task": {
                "entrypoint": "largebatch_trainer.tasks:pylm",
                "args": {"width": 32, "depth": 1, "heads": 2, "context": 16},
            },
            "workers": {"min": 1, "max": 4, "accelerator": "none"},
            "batch": {"initial": 8 * ranks, "max": 8 * ranks, "microBatchPerDevice": 4},
            "optimizer": {"name": "adamw", "lr": 0.003},
            "schedule": {"totalSamples": 8 * ranks * 60, "warmupSamples": 8 * ranks, "decay": "constant"},
            "checkpoint": {"path": str(directory / "ckpt"), "everySteps": 50},
        },
    }
    path = directory / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def launch(ranks: int, mode: str, launcher: str) -> dict:
    with tempfile.TemporaryDirectory(prefix="teardown-") as tmp:
        directory = Path(tmp)
        job, progress = job_file(directory, ranks), directory / "progress.json"
        head = [PYTHON, "-m", "largebatch_trainer.torchrun"] if launcher == "largebatch" else [TORCHRUN]
        command = [*head, "--standalone", f"--nproc-per-node={ranks}", "--max-restarts=0",
                   f"--log-dir={directory / 'torchelastic'}",
                   "-m", "largebatch_trainer", "--job", str(job)]  # fmt: skip
        env = dict(os.environ, OMP_NUM_THREADS="1", LARGEBATCH_DEVICE="cpu", LARGEBATCH_METRICS_PORT="0")
        env.update(LARGEBATCH_PROGRESS_FILE=str(progress), LARGEBATCH_REPORT_SECONDS="0.2")
        log = directory / "agent.log"
        with open(log, "w") as out:
            agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
            if mode == "sigterm":
                deadline = time.monotonic() + 300
                while time.monotonic() < deadline and agent.poll() is None and _step(progress) < 20:
                    time.sleep(0.05)
                agent.send_signal(signal.SIGTERM)
            try:
                code = agent.wait(timeout=600)
            except subprocess.TimeoutExpired:
                agent.kill()
                code = agent.wait()
        ended = time.time()
        text = log.read_text(errors="replace")
        report = _read(progress)
        tail = ended - progress.stat().st_mtime if progress.exists() else None
        stopped = report.get("progress", {}).get("done") is True if mode == "clean" else _all_stopped(text, ranks)
        ok = code == 0 if mode == "clean" else stopped
        aborted = bool(ABORT.search(text))
        return {"code": code, "ok": ok and not aborted, "aborted": aborted, "tail": tail, "log": text}


def _step(progress: Path) -> int:
    return _read(progress).get("progress", {}).get("step", 0)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _all_stopped(text: str, ranks: int) -> bool:
    """On SIGTERM each rank prints the step it stopped after; all must name the same one."""
    steps = re.findall(r"stopped after step (\d+)", text)
    return len(steps) == ranks and len(set(steps)) == 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 4])
    parser.add_argument("--modes", nargs="+", choices=["clean", "sigterm"], default=["clean", "sigterm"])
    parser.add_argument("--hog", type=int, default=os.cpu_count() or 1, help="busy processes beside the runs")
    parser.add_argument("--launcher", choices=["largebatch", "torchrun"], default="largebatch")
    parser.add_argument("--keep-failures", type=Path, help="write the logs of failed launches here")
    args = parser.parse_args()
    rows = []
    with cpu_hogs(args.hog):
        for mode in args.modes:
            for ranks in args.ranks:
                results = []
                for i in range(args.runs):
                    result = launch(ranks, mode, args.launcher)
                    results.append(result)
                    if not result["ok"] and args.keep_failures:
                        args.keep_failures.mkdir(parents=True, exist_ok=True)
                        (args.keep_failures / f"{mode}-{ranks}-{i}.log").write_text(result["log"])
                    print(f"{mode} ranks={ranks} #{i + 1}: exit {result['code']}"
                          f"{' ABORT' if result['aborted'] else ''}{'' if result['ok'] else ' FAILED'}",
                          file=sys.stderr, flush=True)  # fmt: skip
                tails = [r["tail"] for r in results if r["tail"] is not None]
                rows.append(
                    (mode, ranks, len(results), sum(not r["ok"] for r in results), sum(r["aborted"] for r in results),
                     statistics.median(tails) if tails else float("nan"), max(tails, default=float("nan")))
                )  # fmt: skip
    print(f"launcher {args.launcher}, {args.hog} hog processes, {os.cpu_count()} cores")
    print("| mode | ranks | launches | failed | aborted | s from last report to exit, p50 | max |")
    print("|---|---|---|---|---|---|---|")
    for mode, ranks, n, failed, aborted, p50, worst in rows:
        print(f"| {mode} | {ranks} | {n} | {failed} | {aborted} | {p50:.1f} | {worst:.1f} |")


if __name__ == "__main__":
    main()
