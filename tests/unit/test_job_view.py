"""What `lbctl status` and `lbctl describe` show of a job object, without a cluster."""

from __future__ import annotations

import datetime
import os
import signal

from largebatch import job_view, plan_report
from largebatch.api import LargeBatchJob
from tests.helpers import example

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.timezone.utc)


def job_object(status: dict | None = None) -> dict:
    job = example("seesaw.yaml").model_dump(mode="json", by_alias=True, exclude_none=True)
    job["metadata"] |= {"namespace": "team-a", "creationTimestamp": "2026-11-30T09:00:00Z"}
    if status is not None:
        job["status"] = status
    return job


RUNNING = {
    "phase": "Running",
    "workers": {"desired": 4, "ready": 2, "pending": 2},
    "capacity": 2,
    "plan": {"globalBatch": 1024, "microBatch": 256, "accumulationSteps": 2, "worldSize": 2, "lr": 0.00141,
             "policyPhase": "cut 2/4"},
    "progress": {"step": 5000, "samples": 13_000_000, "loss": 2.3456, "noiseScale": 1234.5,
                 "samplesPerSecond": 8123.4},
    "rescales": {"count": 3, "recent": []},
}  # fmt: skip


def test_a_row_has_the_numbers_that_matter():
    cells = dict(zip(job_view.COLUMNS, job_view.row(job_object(RUNNING), NOW), strict=True))
    assert cells == {
        "NAME": "pylm-seesaw", "PHASE": "Running", "WORKERS": "2/4", "BATCH": "1,024", "MICRO×ACC": "256×2",
        "LR": "0.00141", "STEP": "5,000", "SAMPLES/S": "8,123", "LOSS": "2.3456", "NOISE": "1,234", "AGE": "3h",
    }  # fmt: skip
    wide = dict(zip(job_view.WIDE_COLUMNS, job_view.row(job_object(RUNNING), NOW, wide=True), strict=True))
    assert (wide["NAMESPACE"], wide["POLICY"], wide["CAPACITY"], wide["RESCALES"]) == ("team-a", "cut 2/4", "2", "3")
    assert (wide["PRIORITY"], wide["ALLOCATED"]) == ("0", "-")
    shared = job_object(RUNNING | {"allocation": {"workers": 2, "demand": 8}})
    shared["spec"]["priority"] = 5
    wide = dict(zip(job_view.WIDE_COLUMNS, job_view.row(shared, NOW, wide=True), strict=True))
    assert (wide["PRIORITY"], wide["ALLOCATED"]) == ("5", "2/8")
    assert (wide["QUEUE"], wide["ADMITTED"]) == ("-", "-")
    queued = job_object(RUNNING | {"queue": {"name": "team-a-queue", "admitted": 2, "requested": 4}})
    wide = dict(zip(job_view.WIDE_COLUMNS, job_view.row(queued, NOW, wide=True), strict=True))
    assert (wide["QUEUE"], wide["ADMITTED"]) == ("team-a-queue", "2/4")


def test_a_new_job_shows_dashes_not_errors():
    cells = dict(zip(job_view.COLUMNS, job_view.row(job_object(), NOW), strict=True))
    assert cells["PHASE"] == "Pending" and cells["WORKERS"] == "-/-" and cells["LOSS"] == "-"


def test_ages_read_like_kubectl():
    assert [job_view.age(t, NOW) for t in ("2026-11-30T11:59:18Z", "2026-11-30T11:55:00Z", "2026-11-28T12:00:00Z")] == [
        "42s", "5m", "2d"]  # fmt: skip


def test_the_plan_ahead_starts_where_the_job_is():
    job = job_object(RUNNING)
    whole = plan_report.report(LargeBatchJob.from_object(job).spec, capacity=2)
    ahead = job_view.plan_ahead(job)
    assert ahead.rows[0].phase.start == 13_000_000 < ahead.rows[0].phase.end
    assert all(r.phase.end > 13_000_000 for r in ahead.rows)
    assert [r.phase.label for r in ahead.rows] == [r.phase.label for r in whole.rows if r.phase.end > 13_000_000]
    current = next(r for r in whole.rows if r.phase.start < 13_000_000 < r.phase.end)
    assert ahead.rows[0].phase.steps == -(-(current.phase.end - 13_000_000) // current.phase.global_batch)
    assert all(r.workers <= 2 for r in ahead.rows)  # capped by the capacity the cluster showed


def test_ctrl_c_while_following_ends_the_loop_instead_of_raising_inside_it():
    """A real SIGINT in the middle of a fetch (where an HTTP call runs) sets the flag the loop reads; a
    KeyboardInterrupt raised there instead could leave a lock of rich's or the client's taken."""
    from largebatch import cluster_commands

    fetches = []

    def fetch() -> list[dict]:
        fetches.append(job_object(RUNNING))
        if len(fetches) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return fetches[-1:]

    with cluster_commands.ctrl_c() as stop:
        assert cluster_commands.follow(fetch, "team-a", False, stop) is None  # never ends by itself: no `until`
    assert len(fetches) == 2 and stop.is_set()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C raises again afterwards


def test_into_a_pipe_the_jobs_table_keeps_every_cell_whole(monkeypatch):
    import io

    from rich.console import Console

    from largebatch import tables, terminal

    out = io.StringIO()
    monkeypatch.setattr(terminal, "console", Console(file=out, width=80))  # not a terminal: 80 columns
    long = job_object(RUNNING)
    long["metadata"]["namespace"] = "a-namespace-with-a-name-as-long-as-a-test-function-gives-it"
    terminal.print_whole(tables.jobs_table([long, job_object(RUNNING)], None, wide=True))
    assert long["metadata"]["namespace"] in out.getvalue() and "cut 2/4" in out.getvalue()
    assert "…" not in out.getvalue()
