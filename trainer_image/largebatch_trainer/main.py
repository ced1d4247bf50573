"""`python -m largebatch_trainer --job job.yaml` (console script `largebatch-trainer`): one training
process, meant to run under torchrun. Settings beyond the job file come from flags or, for the
operator and the local runner, from LARGEBATCH_* environment variables.

The trainer's library code raises `largebatch.errors.JobError` for what a user must fix; `run()` turns
it into its message on stderr and exit code 1, with torchelastic's error file recorded. A
`DivergenceError` stays an exception with its traceback, which is what the agent, the logs and the
sweep look for."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from largebatch import jobfile, launch
from largebatch.errors import DivergenceError, JobError
from largebatch_trainer.lifeline import AGENT_PID, die_with_parent, name_process, parent_from
from largebatch_trainer.progress import make_sink

NAME_PREFIX = "trainer-r"
"""A worker's process name is this and its global rank (`ps -o pid,comm`)."""


def parse(argv: list[str] | None) -> argparse.Namespace:
    env = os.environ.get
    parser = argparse.ArgumentParser(prog="largebatch-trainer", description=__doc__)
    parser.add_argument("--job", required=True, help="LargeBatchJob YAML file")
    parser.add_argument("--checkpoint-dir", default=env(launch.CHECKPOINT_DIR), help="overrides checkpoint.path")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=env(launch.DEVICE, "auto"))
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env(launch.METRICS_PORT, "-1")),
        help="metrics port of local rank 0 (default: the job's metrics.port; 0 disables)",
    )
    parser.add_argument("--progress-file", default=env(launch.PROGRESS_FILE), help="rank 0 writes JSON here")
    parser.add_argument(
        "--progress-kubernetes",
        default=env(launch.PROGRESS_KUBERNETES),
        metavar="NAMESPACE/NAME",
        help="rank 0 patches this LargeBatchJob's status",
    )
    parser.add_argument("--report-seconds", type=float, default=float(env(launch.REPORT_SECONDS, "2")))
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    if "TORCHELASTIC_RUN_ID" in os.environ:
        # A rank outliving its agent would hold up the group that replaces it: die with the agent.
        die_with_parent(signal.SIGKILL, parent_from(AGENT_PID))
        name_process(f"{NAME_PREFIX}{os.environ.get('RANK', '0')}")
    args = parse(argv)
    try:
        job = jobfile.load(args.job)
    except jobfile.JobFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from largebatch_trainer.loop import Options, Trainer  # torch loads only for a valid job

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    port = job.spec.metrics.port if args.metrics_port < 0 else args.metrics_port
    options = Options(
        checkpoint_dir=Path(args.checkpoint_dir or job.spec.checkpoint.path),
        device=args.device,
        metrics_port=port + local_rank if port else None,
        sink=make_sink(args.progress_file, args.progress_kubernetes),
        report_seconds=args.report_seconds,
    )
    trainer = Trainer(job, options)
    finished, clean = False, False
    try:
        finished = trainer.run()
        clean = True  # finished, or every rank agreed to stop after the same step
    finally:
        trainer.close(clean)
    if finished:
        trainer.report_done()  # after close: every rank has finished, and none is left in the group
    if options.sink is not None:
        # The final report is what tells the operator the job is done: wait for it a while. A stopped
        # worker has only its grace period, and its next run reports again.
        options.sink.close(timeout=60 if finished else 5)
    return 0 if finished else 143  # 143: stopped by SIGTERM/SIGINT after a checkpoint


def exit_process(code: int) -> None:
    """End the process at once, once everything it owes is written (checkpoints are fsynced, progress
    reported, the process group left). gloo's threads cannot be joined (see `Trainer.close`), and a
    normal exit would finalise Python and run exit-time destructors while they still run: the moment
    at which ranks were seen dying with SIGABRT. Only a finished or a stopped run leaves this way; an
    exception takes the normal path, with its traceback and torchelastic's error file."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run() -> None:
    """The console script and `python -m largebatch_trainer`."""
    try:
        code = main()
    except DivergenceError as exc:  # its traceback is the record a diverged run leaves (docs/trainer.md)
        _record(exc)
        raise
    except JobError as exc:  # the trainer's own refusal: its reason, and exit code 1
        _record(exc)
        raise SystemExit(str(exc)) from None
    except Exception as exc:
        _record(exc)
        raise
    exit_process(code)


def _record(exc: BaseException) -> None:
    """torchelastic's error file (what its `@record` writes): the agent's failure summary, the last lines
    of a failed worker's log and so of the operator's Failed condition, then names the exception and
    its traceback instead of "error_file: <N/A>". torch is imported here, not before validation."""
    if "TORCHELASTIC_ERROR_FILE" in os.environ:
        from torch.distributed.elastic.multiprocessing.errors import get_error_handler

        handler = get_error_handler()
        handler.initialize()
        handler.record_exception(exc)


if __name__ == "__main__":
    run()
