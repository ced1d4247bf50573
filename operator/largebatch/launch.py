"""The launch contract between the shells and the trainer, in one place: the command every worker node
runs (torchrun with its elastic settings) and the `LARGEBATCH_*` environment the trainer reads. Pure:
the local runner and the operator's pod builder call these, and the trainer reads the same names.
"""

from __future__ import annotations

from dataclasses import dataclass

from largebatch.api import LargeBatchJobSpec

# The trainer's settings beyond the job file (flags of `python -m largebatch_trainer` override them).
CHECKPOINT_DIR = "LARGEBATCH_CHECKPOINT_DIR"
DEVICE = "LARGEBATCH_DEVICE"
METRICS_PORT = "LARGEBATCH_METRICS_PORT"
PROGRESS_FILE = "LARGEBATCH_PROGRESS_FILE"
PROGRESS_KUBERNETES = "LARGEBATCH_PROGRESS_KUBERNETES"
REPORT_SECONDS = "LARGEBATCH_REPORT_SECONDS"

MAX_RESTARTS = 3
"""Worker-group restarts an agent makes before it gives up (lost peers and scale-downs use them up);
the shell then replaces the node."""
DIVERGED = "training diverged"
"""How the trainer words a NaN or infinite loss. The same steps from the same checkpoint would diverge
again, so an agent, a runner or the operator that reads it gives up at once instead of restarting."""

MODEL_DIR = "model"
"""Where, under the checkpoint directory, the trainer writes the trained model in its task's own format
(`largebatch_trainer.export`), for the runner and the docs to point at."""


@dataclass(frozen=True)
class Rendezvous:
    """Where the agents meet: a store that no worker hosts (the runner's, or the job's rendezvous pod)."""

    endpoint: str
    """host:port of the store."""
    run_id: str
    """Rendezvous id; agents that gave up close their round for good, so a fresh group needs a fresh id."""


def torchrun_args(
    spec: LargeBatchJobSpec, job_path: str, rendezvous: Rendezvous, python: str = "python", log_dir: str | None = None
) -> list[str]:
    """The command of one worker node: a torchrun agent (with largebatch's exit barrier) for
    `devicesPerWorker` trainer processes, elastic between workers.min and workers.max nodes. torchelastic
    keeps its error files in `log_dir`; without one, in a fresh temporary folder that nobody removes
    (a pod's goes with its container, a local run's would stay in /tmp)."""
    return [
        python, "-m", "largebatch_trainer.torchrun",
        f"--nnodes={spec.workers.min}:{spec.workers.max}",
        f"--nproc-per-node={spec.workers.devices_per_worker}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={rendezvous.endpoint}",
        f"--rdzv-id={rendezvous.run_id}",
        # is_host=false: the store is external. last_call_timeout=1: a node that joins is taken into the
        # next round within a second. join_timeout=600: a node waits that long for workers.min peers.
        "--rdzv-conf=is_host=false,last_call_timeout=1,join_timeout=600",
        f"--max-restarts={MAX_RESTARTS}",
        "--monitor-interval=1",
        *([f"--log-dir={log_dir}"] if log_dir else []),
        "-m", "largebatch_trainer", "--job", job_path,
    ]  # fmt: skip


def trainer_env(
    *,
    checkpoint_dir: str,
    metrics_port: int,
    progress_file: str | None = None,
    progress_kubernetes: str | None = None,
    report_seconds: float = 2.0,
    device: str = "auto",
) -> dict[str, str]:
    """The environment of a worker node's agent (its trainer processes inherit it). `metrics_port` is
    local rank 0's (0 disables); rank 0 reports progress to a file or to a job's status
    (`NAMESPACE/NAME`)."""
    env = {
        # An agent-hosted store hangs scale-up (docs/trainer.md); the store is the shell's.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "PYTHONUNBUFFERED": "1",
        CHECKPOINT_DIR: checkpoint_dir,
        METRICS_PORT: str(metrics_port),
        REPORT_SECONDS: str(report_seconds),
        DEVICE: device,
    }
    if progress_file:
        env[PROGRESS_FILE] = progress_file
    if progress_kubernetes:
        env[PROGRESS_KUBERNETES] = progress_kubernetes
    return env
