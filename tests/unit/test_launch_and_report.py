"""The contract between the shells and the trainer: the node command, the environment the trainer
reads, and the report that carries progress and the batch policy's state back to the controller."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from largebatch import launch, report, schedule
from largebatch.api import PlanStatus, ProgressStatus
from largebatch_trainer.main import parse
from tests.helpers import make_spec


def test_a_node_runs_torchrun_elastic_between_min_and_max_against_an_external_store():
    spec = make_spec(workers={"min": 2, "max": 6, "devicesPerWorker": 4})
    command = launch.torchrun_args(spec, "/etc/job.yaml", launch.Rendezvous("rdzv:29400", "job-1"), python="py")
    assert command == [
        "py", "-m", "largebatch_trainer.torchrun", "--nnodes=2:6", "--nproc-per-node=4", "--rdzv-backend=c10d",
        "--rdzv-endpoint=rdzv:29400", "--rdzv-id=job-1",
        "--rdzv-conf=is_host=false,last_call_timeout=1,join_timeout=600", "--max-restarts=3",
        "--monitor-interval=1", "-m", "largebatch_trainer", "--job", "/etc/job.yaml",
    ]  # fmt: skip
    # A local run keeps torchelastic's error files in its run directory, not in a temporary folder.
    logged = launch.torchrun_args(spec, "/j.yaml", launch.Rendezvous("r:1", "j"), python="py", log_dir="/run/logs")
    assert logged[logged.index("-m", 3) - 1] == "--log-dir=/run/logs"


def test_the_trainer_reads_every_setting_the_shells_give_it(monkeypatch):
    env = launch.trainer_env(
        checkpoint_dir="/ckpt", metrics_port=9400, progress_kubernetes="ns/job", report_seconds=0.5, device="cpu"
    )
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = parse(["--job", "job.yaml"])
    assert (args.checkpoint_dir, args.metrics_port, args.device) == ("/ckpt", 9400, "cpu")
    assert (args.progress_kubernetes, args.progress_file, args.report_seconds) == ("ns/job", None, 0.5)
    monkeypatch.setenv(launch.PROGRESS_FILE, "/run/progress.json")
    assert parse(["--job", "job.yaml"]).progress_file == "/run/progress.json"


@given(
    samples=st.integers(0, 10**9),
    step=st.integers(0, 10**6),
    batch=st.none() | st.integers(1, 10**6),
    last_change=st.integers(0, 10**6),
    noise=st.none() | st.floats(0.01, 1e7),
)
def test_a_report_carries_the_progress_and_the_policy_state_exactly(samples, step, batch, last_change, noise):
    progress = schedule.Progress(
        samples=samples, step=step, batch=batch, last_change_step=last_change, noise_scale=noise
    )
    status = ProgressStatus(
        samples=samples, step=step, policy_batch=batch, last_change_step=last_change, noise_scale=noise, done=False
    )
    document = json.loads(json.dumps(report.report(status, PlanStatus(global_batch=batch))))  # through JSON
    read_status, plan = report.read(document)
    assert report.progress_from_status(read_status) == progress
    assert plan.global_batch == batch


def test_an_empty_report_is_the_start_of_training():
    status, plan = report.read(None)
    assert report.progress_from_status(status) == schedule.Progress()
    assert plan == PlanStatus()
