"""`lbctl run --local`'s session: what the command settles before the runner starts (slots, capacity,
metrics ports, the task's preflight, the device), the run under a live display, and its end: the
record, the summary, and the exit code (0 complete, 1 failed, 2 a mistake or the run's files, >128
stopped by a signal)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

import typer
from rich.markup import escape

from largebatch import controller, launch, trainer_facade
from largebatch.api import LargeBatchJob, LargeBatchJobSpec
from largebatch.errors import JobError
from largebatch.tables import summary_table
from largebatch.terminal import console, fail, load_job, say_error

WORKER_START = "LARGEBATCH_WORKER_START"  # largebatch_trainer.forked's: fork (the default) or exec


def run_local(
    job: Path,
    slots: int | None,
    capacity: str | None,
    run_dir: Path | None,
    metrics_port: int | None,
    restart_cost: float | None,
) -> NoReturn:
    """Run the job in `job` on this machine to its end, or until stopped; exit with the run's code."""
    manifest = load_job(job)
    spec = manifest.spec
    slots = slots or max(1, (os.cpu_count() or 1) // spec.workers.devices_per_worker)
    steps = _capacity(capacity, slots, spec.workers.min)
    port = _metrics_port(spec, metrics_port)
    import torch

    zygote = _zygote()
    try:
        try:  # here, in seconds, rather than in a node's log after its launches fail
            trainer_facade.preflight_task(spec.task.entrypoint, spec.task.args, spec.task.seed)
        except JobError as exc:
            raise fail(exc) from None

        from largebatch.local.runner import RunOptions

        options = RunOptions(
            run_dir=run_dir or Path("runs") / manifest.metadata.name,
            slots=slots,
            capacity=steps,
            device=_device(spec, torch.cuda.is_available()),
            metrics_port=port,
            restart_seconds=restart_cost,
            zygote=zygote,
        )
        _session(manifest, job, options)
    finally:
        if zygote is not None:
            zygote.close()


def _zygote():
    """The process the nodes' agents are forked from (largebatch.local.zygote), forked now: this process
    has imported torch, and has started no thread and run no tensor operation yet (the task's preflight
    and the display do both). None where agents start as new interpreters: off Linux, or where
    LARGEBATCH_WORKER_START asks for exec (as it does of the trainers: largebatch_trainer.forked)."""
    if not sys.platform.startswith("linux") or os.environ.get(WORKER_START, "fork") != "fork":
        return None
    from largebatch.local.nodes import AGENT_MODULES, ZYGOTE_NAME
    from largebatch.local.zygote import Zygote

    return Zygote.fork(AGENT_MODULES, ZYGOTE_NAME)


def _capacity(capacity: str | None, slots: int, minimum: int) -> list | None:
    """The --capacity steps (None without the flag), checked against the slots and workers.min."""
    try:
        steps = controller.parse_capacity(capacity) if capacity is not None else None
        controller.check_capacity(steps or [], slots, minimum)
    except ValueError as exc:
        raise fail(exc) from None
    return steps


def _metrics_port(spec: LargeBatchJobSpec, metrics_port: int | None) -> int:
    """The first worker's metrics port (0: none); every process of the largest world takes the next one."""
    port = spec.metrics.port if metrics_port is None else metrics_port
    processes = spec.workers.max * spec.workers.devices_per_worker  # one metrics port each
    if port and port + processes - 1 > 65535:
        raise fail(f"metrics port {port}: the local run serves metrics on {processes} ports from it (workers.max "
                   f"{spec.workers.max} x devicesPerWorker {spec.workers.devices_per_worker}), past 65535: pass "
                   f"--metrics-port {65536 - processes} or lower, or 0 to serve none")  # fmt: skip
    return port


def _device(spec: LargeBatchJobSpec, cuda: bool) -> str:
    """cuda for a job on NVIDIA GPUs where torch sees one; else the CPU, with a note when the job asked
    for an accelerator."""
    if spec.workers.accelerator == "nvidia.com/gpu" and cuda:
        return "cuda"
    if spec.workers.accelerator != "none":
        console.print(f"[yellow]note:[/] no {spec.workers.accelerator} here; the workers train on the CPU")
    return "cpu"


def _session(manifest: LargeBatchJob, job: Path, options) -> NoReturn:
    """The run under the live display, then its record and summary; exits with the run's code."""
    from largebatch.local import record
    from largebatch.local.display import LiveDisplay
    from largebatch.local.rundir import RunDirError
    from largebatch.local.runner import LocalRun, RunFailed

    spec = manifest.spec
    try:
        with LiveDisplay(console, manifest.metadata.name, spec.schedule.total_samples) as display:
            runner = LocalRun(manifest, job, options, display)
            with runner.stopped_by_signals():
                record.write(runner.record(), runner.run_dir, with_plot=False)  # this session, from its start
                try:
                    code, failure = runner.run(), None
                except RunFailed as exc:
                    code, failure = 1, exc
                except OSError as exc:  # the run's own files (its logs, a node's start): a full or vanished disk
                    code, failure = 2, f"{exc.filename or runner.run_dir}: {exc.strerror or exc}"
    except (RunDirError, record.RecordError) as exc:
        raise fail(exc) from None
    if failure:
        say_error(failure)
    runner.end("complete" if code == 0 else "failed" if failure else "stopped")
    result = runner.record()
    try:
        json_path, png_path = record.write(result, runner.run_dir)
    except record.RecordError as exc:
        raise fail(exc, code or 2) from None
    console.print(summary_table(result, json_path, png_path))
    model = runner.run_dir / "checkpoints" / launch.MODEL_DIR
    if code == 0 and model.is_dir():
        console.print(f"The trained model, in its own format: {escape(str(model))}", soft_wrap=True)
    if code > 128:
        console.print("Stopped. Run the same command again to resume from the last checkpoint in "
                      f"{escape(str(runner.run_dir))}.")  # fmt: skip
    raise typer.Exit(code)
