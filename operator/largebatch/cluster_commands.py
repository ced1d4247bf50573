"""lbctl's commands that talk to a cluster: `run` without --local (submit a job and follow it),
`status` and `describe`. Every cluster call goes through `read`, which turns the sentence of a
ClusterError (no cluster, no CRD, no job) into exit 1."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.markup import escape

from largebatch import jobfile, timestamps
from largebatch.api import LargeBatchJob, LargeBatchJobStatus, RescalesStatus
from largebatch.tables import jobs_table, plan_table
from largebatch.terminal import console, fail, load_job, print_whole


def submit(path: Path, namespace: str | None, context: str | None, detach: bool, local_only: dict) -> None:
    """Create the job in `path` (validated first, as `lbctl plan` validates it) and follow it to its end;
    `local_only` holds the flags of `run --local`, refused here when given."""
    manifest = load_job(path)
    given = [flag for flag, value in local_only.items() if value is not None]
    if given:
        raise fail(f"{', '.join(given)} only apply with --local (on a cluster the operator decides)")
    cluster = connect(context)
    ns = namespace or manifest.metadata.namespace or cluster.namespace
    name = manifest.metadata.name
    document = jobfile.read_document(path)
    created = read(cluster.submit, ns, document)
    with ctrl_c() as stop:
        console.print(f"largebatchjob {name} created in {ns} (generation {created['metadata'].get('generation')})")
        if detach:
            return
        ended = follow(lambda: [read(cluster.job, ns, name)], ns, wide=False, stop=stop, until=("Succeeded", "Failed"))
    if ended is None:
        console.print(f"Stopped following; {name} goes on. lbctl status {name} -n {ns} --watch to follow again, "
                      f"kubectl delete lbj {name} -n {ns} to stop it.")  # fmt: skip
        raise typer.Exit(130)
    status = LargeBatchJobStatus.of(ended[0])
    for cond in status.conditions:
        if cond.type in ("Failed", "Complete"):
            console.print(f"{cond.type}: {cond.message or ''}", highlight=False, markup=False)
    raise typer.Exit(0 if status.phase == "Succeeded" else 1)


@contextmanager
def ctrl_c() -> Iterator[threading.Event]:
    """An event that Ctrl-C (SIGINT) sets while the block runs. A flag the loop reads, not a
    KeyboardInterrupt: raised at an arbitrary point inside rich's live display or the HTTP client, the
    exception can leave a lock taken, and lbctl then hung instead of stopping (seen in the e2e test)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def follow(fetch, ns: str | None, wide: bool, stop: threading.Event, until: tuple[str, ...] = ()) -> list[dict] | None:
    """Keep the jobs' table up to date until every job is in a phase of `until` (then the jobs), or
    `stop` is set (then None)."""
    from rich.live import Live

    def ended(jobs: list[dict]) -> bool:
        return bool(until) and bool(jobs) and all(LargeBatchJobStatus.of(j).phase in until for j in jobs)

    jobs = fetch()
    with Live(jobs_table(jobs, ns, wide), console=console, refresh_per_second=1) as live:
        while not ended(jobs):
            if stop.wait(2):
                return None
            jobs = fetch()
            live.update(jobs_table(jobs, ns, wide))
    return jobs


def connect(context: str | None):
    """The cluster of kubeconfig context `context` (None: the current one)."""
    from largebatch.kube.jobs import Cluster

    return read(Cluster, context)


def read(call, *args):
    """`call(*args)`, or exit 1 with the sentence of a ClusterError (no cluster, no CRD, no job)."""
    from largebatch.kube.jobs import ClusterError

    try:
        return call(*args)
    except ClusterError as exc:
        raise fail(exc, 1) from None


def status(
    name: str | None, namespace: str | None, all_namespaces: bool, output: str | None, watch: bool, context: str | None
) -> None:
    """`lbctl status`: one job or a namespace's (every namespace's) as a table, kept up to date with
    `watch`, or as JSON or YAML."""
    import yaml

    if output not in (None, "wide", "json", "yaml"):
        raise fail(f"--output must be wide, json or yaml, got {output!r}")
    cluster = connect(context)
    ns = None if all_namespaces else (namespace or cluster.namespace)

    def fetch() -> list[dict]:
        if name:
            return [read(cluster.job, ns or cluster.namespace, name)]
        return read(cluster.jobs, ns)

    if output in ("json", "yaml"):
        jobs = fetch()
        document = jobs[0] if name else {"apiVersion": "v1", "kind": "List", "items": jobs}
        typer.echo(json.dumps(document, indent=2) if output == "json" else yaml.safe_dump(document, sort_keys=False))
        return

    if watch:
        with ctrl_c() as stop:
            follow(fetch, ns, output == "wide", stop)  # until Ctrl-C, which stops following; the jobs go on
    else:
        print_whole(jobs_table(fetch(), ns, output == "wide"))


def describe(name: str, namespace: str | None, context: str | None) -> None:
    """`lbctl describe`: one job in full: where it stands, the plan from here on, rescales, conditions
    and recent Events."""
    from largebatch import job_view

    cluster = connect(context)
    ns = namespace or cluster.namespace
    job = read(cluster.job, ns, name)
    events = read(cluster.events, ns, name)
    status = LargeBatchJobStatus.of(job)
    now = timestamps.now()
    c = dict(zip(job_view.WIDE_COLUMNS, job_view.row(job, now, wide=True), strict=True))
    lines = [
        f"[bold]{name}[/] in {ns}: {c['PHASE']}, workers {c['WORKERS']} (ready/desired), capacity {c['CAPACITY']}",
        f"step {c['STEP']}, {c['SAMPLES']} samples, loss {c['LOSS']}, {c['SAMPLES/S']} samples/s, "
        f"noise scale {c['NOISE']}",
        f"batch {c['BATCH']}, micro-batch × accumulation {c['MICRO×ACC']}, lr {c['LR']} ({c['POLICY']})",
    ]
    if status.allocation:
        share = status.allocation
        lines.append(f"priority {c['PRIORITY']}, allocated {c['ALLOCATED']} workers (given/wanted)"
                     + (f" since {share.time}: {escape(share.reason)}" if share.reason else ""))  # fmt: skip
    if status.queue:
        queue = status.queue
        where = f" (ClusterQueue {queue.cluster_queue})" if queue.cluster_queue else ""
        lines.append(f"Kueue: queue {queue.name}{where}, admitted {c['ADMITTED']} workers (admitted/asked), "
                     f"workload {queue.workload or '-'}")  # fmt: skip
    held_out = status.progress
    if held_out and held_out.eval_loss is not None:
        accuracy = held_out.eval_accuracy
        lines.append(
            f"held-out loss {held_out.eval_loss:.4f}"
            + (f", accuracy {accuracy:.1%}" if accuracy is not None else "")
            + f" (after step {'-' if held_out.eval_step is None else held_out.eval_step})"
        )
    ahead = job_view.plan_ahead(job)
    rescales = status.rescales or RescalesStatus()
    for line in lines:
        console.print(line, highlight=False)
    if ahead.rows:
        title = f"Plan from here on: {ahead.serial_steps:,} more steps"
        console.print(plan_table(LargeBatchJob.from_object(job).spec, ahead, title))
    console.print(f"[bold]Rescales[/] {rescales.count}", highlight=False)
    for r in rescales.recent:
        move = f"{r.from_workers} → {r.to_workers} workers"
        console.print(f"  {r.time or ''}  {move}  {r.kind or ''}: {r.reason or ''}", highlight=False, markup=False)
    console.print("[bold]Conditions[/]")
    for cond in status.conditions:
        console.print(f"  {cond.type}={cond.status}  {cond.reason or ''}: {cond.message or ''}",
                      highlight=False, markup=False)  # fmt: skip
    console.print("[bold]Events[/]")
    for event in events[-10:]:
        console.print(f"  {event.get('type', '')}  {event.get('reason', '')}: {event.get('message', '')}",
                      highlight=False, markup=False)  # fmt: skip
