"""`lbctl`: the command line. A thin shell: it reads files, calls the core, and renders the result."""

from __future__ import annotations

import json
import math
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from largebatch import caveats, controller, jobfile, plan_report, sweep, timestamps
from largebatch.api import LargeBatchJob

app = typer.Typer(
    help="largebatch: large-batch PyTorch training with an adaptive global batch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# A line that names a path is printed with soft_wrap=True: rich would fold a path longer than the
# terminal into pieces, with newlines inside it, that no longer paste into a shell.
console = Console()
errors = Console(stderr=True)

JobPath = Annotated[Path, typer.Argument(help="A LargeBatchJob YAML file.", show_default=False)]


def _finite(value: float | None) -> float | None:
    """A float flag: NaN and infinities pass click's range check, so they are refused here."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


def _fail(message: object, code: int = 2) -> typer.Exit:
    """Say `message` on stderr as it is (never taken for markup), and the exit to raise with `code`."""
    errors.print(f"[bold red]error:[/] {escape(str(message))}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def _check_folder(flag: str, path: Path) -> None:
    if not path.parent.is_dir():
        raise _fail(f"{flag}: the folder {path.parent} does not exist; create it or pick another path")


def _load(path: Path):
    try:
        manifest = jobfile.load(path)
    except jobfile.JobFileError as exc:
        raise _fail(exc) from None
    for caveat in caveats.caveats(manifest.spec):
        errors.print(f"[bold yellow]warning:[/] {escape(caveat.message)}", highlight=False, soft_wrap=True)
    return manifest


@app.command()
def plan(
    job: JobPath,
    workers: Annotated[
        int | None, typer.Option(min=1, help="Plan for a capacity of at most this many workers.")
    ] = None,
    noise_scale: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            callback=_finite,
            help="criticalBatch, seesaw.capAtCriticalBatch: the gradient noise scale to assume throughout.",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    plot: Annotated[Path | None, typer.Option(help="Draw batch and LR against samples to this PNG.")] = None,
) -> None:
    """Show the schedule a job will follow: batch, LR, workers and steps per phase."""
    manifest = _load(job)
    if plot is not None:
        _check_folder("--plot", plot)
    spec = manifest.spec
    result = plan_report.report(spec, capacity=workers, noise_scale=noise_scale)
    if plot is not None:
        from largebatch.plot import plot_plan

        try:
            plot_plan(spec, plot, title=f"{manifest.metadata.name}: planned batch and LR", noise_scale=noise_scale)
        except OSError as exc:
            raise _fail(f"--plot {plot}: {exc.strerror or exc}") from None
    assumed = plan_report.assumed_noise_scales(spec) if spec.measures_noise_scale and noise_scale is None else []
    if as_json:
        extra = {"assumedNoiseScales": [a.to_json() for a in assumed]} if assumed else {}
        typer.echo(json.dumps(result.to_json() | extra, indent=2))
        return
    total = spec.schedule.total_samples
    console.print(
        _plan_table(spec, result, f"{manifest.metadata.name}: {spec.batch.policy.type} plan, {total:,} samples")
    )
    changes = [b.phase for a, b in pairwise(result.rows) if b.phase.global_batch != a.phase.global_batch]
    if changes:
        warmup, after = spec.schedule.warmup_samples, total - spec.schedule.warmup_samples
        at = ", ".join(f"{(p.start - warmup) / after:.1%}" for p in changes)
        console.print(f"Batch increases at {at} of the samples after warmup.")
    console.print(
        f"Serial optimizer steps: [bold]{result.serial_steps:,}[/] against "
        f"{result.baseline_serial_steps:,} at constant batch {spec.batch.initial:,} with the same decay: "
        f"[bold]{result.saving:.1%}[/] fewer."
    )
    if assumed:
        console.print(_assumptions_table(assumed))
        console.print("The batch follows the gradient noise scale the trainer measures, so the plan above "
                      "(none measured yet) is only the start; pass --noise-scale to see the phases for one "
                      "value.")  # fmt: skip
    if plot is not None:
        console.print(f"Plot written to {escape(str(plot))}", soft_wrap=True)


@app.command()
def run(
    job: JobPath,
    local: Annotated[
        bool, typer.Option("--local", help="Run on this machine instead of submitting to the current context.")
    ] = False,
    namespace: Annotated[
        str | None,
        typer.Option("-n", "--namespace", help="Cluster: the namespace (default: the job's, else the context's)."),
    ] = None,
    context: Annotated[str | None, typer.Option("--context", help="Cluster: the kubeconfig context.")] = None,
    detach: Annotated[bool, typer.Option("-d", "--detach", help="Cluster: submit and return; do not follow.")] = False,
    slots: Annotated[
        int | None, typer.Option(min=1, help="Nodes this machine can hold (default: CPU cores / devicesPerWorker).")
    ] = None,
    capacity: Annotated[
        str | None,
        typer.Option(help="Capacity over the run, by fraction of totalSamples, e.g. 0:1,30%:3,70%:2."),
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="Where checkpoints, logs and the record go (default: runs/NAME).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(min=0, max=65535, help="Metrics port of the first worker (default: metrics.port); 0 disables."),
    ] = None,
    restart_cost: Annotated[
        float | None,
        typer.Option(
            min=0.0, callback=_finite, help="Seconds a rescale is assumed to cost until one is measured (default: 10)."
        ),
    ] = None,
) -> None:
    """Run a job: submit it to the current context and follow it (Ctrl-C stops following, not the job), or
    with --local on this machine: torchrun nodes, the same controller as on Kubernetes, live progress."""
    manifest = _load(job)
    if not local:
        local_only = {"--slots": slots, "--capacity": capacity, "--run-dir": run_dir, "--metrics-port": metrics_port,
                      "--restart-cost": restart_cost}  # fmt: skip
        given = [flag for flag, value in local_only.items() if value is not None]
        if given:
            raise _fail(f"{', '.join(given)} only apply with --local (on a cluster the operator decides)")
        _submit(job, manifest, namespace, context, detach)
        return
    spec = manifest.spec
    slots = slots or max(1, (os.cpu_count() or 1) // spec.workers.devices_per_worker)
    try:
        steps = controller.parse_capacity(capacity) if capacity is not None else None
        controller.check_capacity(steps or [], slots, spec.workers.min)
    except ValueError as exc:
        raise _fail(exc) from None
    port = spec.metrics.port if metrics_port is None else metrics_port
    processes = spec.workers.max * spec.workers.devices_per_worker  # one metrics port each
    if port and port + processes - 1 > 65535:
        raise _fail(f"metrics port {port}: the local run serves metrics on {processes} ports from it (workers.max "
                    f"{spec.workers.max} x devicesPerWorker {spec.workers.devices_per_worker}), past 65535: pass "
                    f"--metrics-port {65536 - processes} or lower, or 0 to serve none")  # fmt: skip
    import torch

    from largebatch_trainer.tasks import load_task

    try:  # here, in seconds, rather than in a node's log after its launches fail
        load_task(spec.task.entrypoint, spec.task.args, spec.task.seed)
    except SystemExit as exc:
        raise _fail(exc) from None

    from largebatch.local import record
    from largebatch.local.display import LiveDisplay
    from largebatch.local.rundir import RunDirError
    from largebatch.local.runner import LocalRun, RunFailed, RunOptions

    device = "cpu"
    if spec.workers.accelerator == "nvidia.com/gpu" and torch.cuda.is_available():
        device = "cuda"
    elif spec.workers.accelerator != "none":
        console.print(f"[yellow]note:[/] no {spec.workers.accelerator} here; the workers train on the CPU")
    options = RunOptions(
        run_dir=run_dir or Path("runs") / manifest.metadata.name,
        slots=slots,
        capacity=steps,
        device=device,
        metrics_port=port,
        restart_seconds=restart_cost,
    )
    try:
        with LiveDisplay(console, manifest.metadata.name, spec.schedule.total_samples) as display:
            runner = LocalRun(manifest, job, options, display)
            record.write(runner.record(), runner.run_dir, with_plot=False)  # this session, from its start
            try:
                code, failure = runner.run(), None
            except RunFailed as exc:
                code, failure = 1, exc
            except OSError as exc:  # the run's own files (its logs, a node's start): a full or vanished disk
                code, failure = 2, f"{exc.filename or runner.run_dir}: {exc.strerror or exc}"
    except (RunDirError, record.RecordError) as exc:
        raise _fail(exc) from None
    if failure:
        errors.print(f"[bold red]error:[/] {escape(str(failure))}", highlight=False, soft_wrap=True)
    runner.end("complete" if code == 0 else "failed" if failure else "stopped")
    result = runner.record()
    try:
        json_path, png_path = record.write(result, runner.run_dir)
    except record.RecordError as exc:
        raise _fail(exc, code or 2) from None
    _summary(result, json_path, png_path)
    if code > 128:
        console.print("Stopped. Run the same command again to resume from the last checkpoint in "
                      f"{escape(str(runner.run_dir))}.")  # fmt: skip
    raise typer.Exit(code)


@app.command("coord-check")
def coord_check(
    job: JobPath,
    widths: Annotated[str, typer.Option(help="Widths (task.args.width) to compare.")] = "64,128,256,512",
    steps: Annotated[int, typer.Option(min=1, max=50, help="Training steps at each width.")] = 5,
    out: Annotated[Path, typer.Option(help="The picture (PNG); the table goes beside it as JSON.")] = Path("coord.png"),
) -> None:
    """μP's coordinate check: the mean |output| of every layer over the first training steps, at each width.
    Flat lines mean updates keep their size as the model widens (μP); rising ones mean they do not."""
    manifest = _load(job)
    try:
        width_list = sweep.parse_widths(widths)
    except ValueError as exc:
        raise _fail(exc) from None
    _check_folder("--out", out)
    from largebatch_trainer import coord_check as check

    try:
        table = check.measure(manifest.spec, width_list, steps)
    except SystemExit as exc:  # the task refused a width
        raise _fail(exc) from None
    table_path = out.with_suffix(".json")
    table_path.write_text(json.dumps(table, indent=1))
    check.plot(table, out, title=f"{manifest.metadata.name}: coordinate check")
    rows = Table(title=f"Mean |output| at step {steps}", box=box.SIMPLE_HEAD, pad_edge=False)
    rows.add_column("Layer")
    for width in width_list:
        rows.add_column(f"width {width}", justify="right")
    rows.add_column(f"×{width_list[-1] // width_list[0]} width", justify="right")
    for layer, by_width in table["layers"].items():
        last = [by_width[w][-1] for w in width_list]
        growth = f"{last[-1] / last[0]:.2f}×" if last[0] else "–"
        rows.add_row(escape(layer), *(f"{v:.4g}" for v in last), growth)
    console.print(rows)
    console.print(f"Picture {escape(str(out))}, table {escape(str(table_path))}", soft_wrap=True)


@app.command("sweep")
def sweep_command(
    job: JobPath,
    widths: Annotated[str, typer.Option(help="Proxy widths (task.args.width), e.g. 64,256.")],
    lr: Annotated[str, typer.Option("--lr", help="Learning rates: LOW:HIGH:N (log-spaced) or A,B,C.")],
    local: Annotated[bool, typer.Option("--local", help="Run the proxies on this machine (required).")] = False,
    parallel: Annotated[int, typer.Option(min=1, max=64, help="Proxy runs at a time.")] = 1,
    samples: Annotated[
        int | None, typer.Option(min=1, help="Samples per proxy run (default: schedule.totalSamples).")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option(help="Where the runs and results go (default: runs/sweep-NAME).")
    ] = None,
    apply: Annotated[
        Path | None, typer.Option(help="Write the job with the LR found at the widest proxy width here.")
    ] = None,
) -> None:
    """μTransfer's LR sweep: short proxy runs at a few widths over a grid of learning rates, the final loss of
    each, the best LR per width, and (--apply) the job with that LR. Stopped sweeps resume."""
    if not local:
        raise _fail("sweeps run on this machine for now: pass --local")
    manifest = _load(job)
    try:
        width_list, lrs = sweep.parse_widths(widths), sweep.parse_grid(lr)
    except ValueError as exc:
        raise _fail(exc) from None
    if apply is not None:
        _check_folder("--apply", apply)
    document = jobfile.read_document(job)
    runs = sweep.trials(manifest.metadata.name, width_list, lrs)
    for trial in runs[:: len(lrs)]:  # each width once: a proxy the API would refuse fails here, not later
        try:
            LargeBatchJob.model_validate(sweep.proxy_document(document, trial, samples))
        except ValueError as exc:
            raise _fail(f"the proxy at width {trial.width} is not a valid job:\n{jobfile.describe(exc)}") from None
    from largebatch_trainer.tasks import load_task

    spec = manifest.spec
    try:  # once, in seconds, rather than as many failed runs
        load_task(spec.task.entrypoint, dict(spec.task.args) | {"width": width_list[0]}, spec.task.seed)
    except SystemExit as exc:
        raise _fail(exc) from None
    root = out_dir or Path("runs") / f"sweep-{manifest.metadata.name}"
    console.print(f"{len(runs)} proxy runs ({len(width_list)} widths × {len(lrs)} LRs), {parallel} at a time, in "
                  f"{escape(str(root))}", soft_wrap=True)  # fmt: skip

    def done(o: sweep.Outcome) -> None:
        loss = f"{o.loss:.4f}" if o.loss is not None else o.status
        console.print(f"  width {o.trial.width:>5}  lr {o.trial.lr:.3g}: {loss}", highlight=False)

    outcomes = sweep.run_all(document, runs, root, parallel, samples, done)
    found = sweep.best(outcomes)
    (root / "results.json").write_text(json.dumps({
        "runs": [o.to_json() for o in outcomes],
        "best": {str(w): o.trial.lr for w, o in found.items()},
    }, indent=1))  # fmt: skip
    sweep.plot(outcomes, root / "sweep.png", title=f"{manifest.metadata.name}: final loss against LR")
    console.print(_sweep_table(outcomes, width_list, lrs, found))
    console.print(
        f"Results {escape(str(root / 'results.json'))}, plot {escape(str(root / 'sweep.png'))}", soft_wrap=True
    )
    if len(found) < len(width_list):
        raise _fail(f"no proxy run finished at width(s) {sorted(set(width_list) - set(found))}: see the logs in "
                    f"{root}", code=1)  # fmt: skip
    if apply is not None:
        chosen = found[width_list[-1]]
        apply.write_text(yaml.safe_dump(sweep.transferred(document, chosen.trial.lr), sort_keys=False))
        target = spec.task.args.get("width", "the task's default")
        console.print(f"LR {chosen.trial.lr:.4g} (best at width {width_list[-1]}) written for width {target} to "
                      f"{escape(str(apply))}", soft_wrap=True)  # fmt: skip
        if spec.task.args.get("parametrization") != "mup":
            console.print("[yellow]note:[/] under the standard parametrization the best LR moves with width; "
                          "set task.args.parametrization: mup for an LR that transfers")  # fmt: skip


def _sweep_table(outcomes: list[sweep.Outcome], widths: list[int], lrs: list[float], found: dict) -> Table:
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


def _summary(result: dict, json_path: Path, png_path: Path) -> None:
    table = Table(title="Run summary", box=box.SIMPLE_HEAD, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    batches = sorted({h["globalBatch"] for h in result["history"]})
    worlds = [h["worldSize"] for h in result["history"]]
    rows = [
        ("samples", f"{result['samplesConsumed']:,} of {result['totalSamples']:,}"),
        ("optimizer steps", f"{result['serialSteps']:,}"),
        ("wall time", f"{result['wallSeconds']:.0f} s over {result['sessions']} session(s)"),
        ("final loss", f"{result['finalLoss']:.4f}" if result["finalLoss"] is not None else "–"),
        ("held-out loss", f"{result['evalLoss']:.4f}" if result["evalLoss"] is not None else "–"),
        ("held-out accuracy", f"{result['evalAccuracy']:.1%}" if result.get("evalAccuracy") is not None else "–"),
        ("global batches", " → ".join(f"{b:,}" for b in batches) or "–"),
        ("world sizes", " → ".join(str(w) for i, w in enumerate(worlds) if i == 0 or worlds[i - 1] != w) or "–"),
        ("rescales", str(len(result["rescales"]))),
        ("record", f"{json_path}, {png_path}"),
    ]
    for key, value in rows:
        table.add_row(key, escape(value))  # a path may hold brackets
    console.print(table)


def _assumptions_table(assumed: list[plan_report.Assumption]) -> Table:
    table = Table(title="If the measured noise scale were", box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("Noise scale", "Largest batch", "Steps", "Saving"):
        table.add_column(column, justify="right", no_wrap=True)
    for a in assumed:
        table.add_row(f"{a.noise_scale:,.1f}", f"{a.largest_batch:,}", f"{a.serial_steps:,}", f"{a.saving:.1%}")
    return table


def _plan_table(spec, result: plan_report.PlanReport, title: str) -> Table:
    total = spec.schedule.total_samples
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for column in ("Phase", "Samples %", "Batch", "LR", "Workers", "Micro×acc", "Steps"):
        table.add_column(column, justify="left" if column == "Phase" else "right", no_wrap=True)
    for row in result.rows:
        p = row.phase
        lr = f"{p.lr_start:.3g}" if p.lr_start == p.lr_end else f"{p.lr_start:.3g}→{p.lr_end:.3g}"
        table.add_row(
            p.label,
            f"{100 * p.start / total:.1f}–{100 * p.end / total:.1f}",
            f"{p.global_batch:,}",
            lr,
            f"{row.workers}×{spec.workers.devices_per_worker}",
            f"{row.micro_batch}×{row.accumulation_steps}",
            f"{p.steps:,}",
        )
    return table


# --- the cluster -------------------------------------------------------------------------------------

Namespace = Annotated[str | None, typer.Option("-n", "--namespace", help="Namespace (default: the context's).")]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context (default: the current one).")]


def _submit(path: Path, manifest: LargeBatchJob, namespace: str | None, context: str | None, detach: bool) -> None:
    """Create the job (validated already, as `lbctl plan` validates it) and follow it to its end."""
    cluster = _cluster(context)
    ns = namespace or manifest.metadata.namespace or cluster.namespace
    name = manifest.metadata.name
    document = jobfile.read_document(path)
    created = _read(cluster.submit, ns, document)
    with _ctrl_c() as stop:
        console.print(f"largebatchjob {name} created in {ns} (generation {created['metadata'].get('generation')})")
        if detach:
            return
        ended = _follow(
            lambda: [_read(cluster.job, ns, name)], ns, wide=False, stop=stop, until=("Succeeded", "Failed")
        )
    if ended is None:
        console.print(f"Stopped following; {name} goes on. lbctl status {name} -n {ns} --watch to follow again, "
                      f"kubectl delete lbj {name} -n {ns} to stop it.")  # fmt: skip
        raise typer.Exit(130)
    phase = (ended[0].get("status") or {}).get("phase")
    for cond in (ended[0].get("status") or {}).get("conditions", []):
        if cond.get("type") in ("Failed", "Complete"):
            console.print(f"{cond['type']}: {cond.get('message', '')}", highlight=False, markup=False)
    raise typer.Exit(0 if phase == "Succeeded" else 1)


def _jobs_table(jobs: list[dict], ns: str | None, wide: bool) -> Table | str:
    from largebatch import job_view

    if not jobs:
        return f"No LargeBatchJobs in {'any namespace' if ns is None else f'namespace {ns}'}."
    wide = wide or ns is None
    grid = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for column in job_view.WIDE_COLUMNS if wide else job_view.COLUMNS:
        grid.add_column(column, no_wrap=True, justify="left" if column in ("NAME", "NAMESPACE", "PHASE") else "right")
    now = timestamps.now()
    for job in jobs:
        grid.add_row(*(escape(cell) for cell in job_view.row(job, now, wide)))
    return grid


@contextmanager
def _ctrl_c() -> Iterator[threading.Event]:
    """An event that Ctrl-C (SIGINT) sets while the block runs. A flag the loop reads, not a
    KeyboardInterrupt: raised at an arbitrary point inside rich's live display or the HTTP client, the
    exception can leave a lock taken, and lbctl then hung instead of stopping (seen in the e2e test)."""
    stop = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        yield stop
    finally:
        signal.signal(signal.SIGINT, previous)


def _follow(fetch, ns: str | None, wide: bool, stop: threading.Event, until: tuple[str, ...] = ()) -> list[dict] | None:
    """Keep the jobs' table up to date until every job is in a phase of `until` (then the jobs), or
    `stop` is set (then None)."""
    from rich.live import Live

    def ended(jobs: list[dict]) -> bool:
        return bool(until) and bool(jobs) and all((j.get("status") or {}).get("phase") in until for j in jobs)

    jobs = fetch()
    with Live(_jobs_table(jobs, ns, wide), console=console, refresh_per_second=1) as live:
        while not ended(jobs):
            if stop.wait(2):
                return None
            jobs = fetch()
            live.update(_jobs_table(jobs, ns, wide))
    return jobs


def _cluster(context: str | None):
    from largebatch.kube.jobs import Cluster

    return _read(Cluster, context)


def _read(call, *args):
    """`call(*args)`, or exit 1 with the sentence of a ClusterError (no cluster, no CRD, no job)."""
    from largebatch.kube.jobs import ClusterError

    try:
        return call(*args)
    except ClusterError as exc:
        raise _fail(exc, 1) from None


@app.command()
def status(
    name: Annotated[str | None, typer.Argument(help="A job (default: every job of the namespace).")] = None,
    namespace: Namespace = None,
    all_namespaces: Annotated[bool, typer.Option("-A", "--all-namespaces", help="Jobs of every namespace.")] = False,
    output: Annotated[str | None, typer.Option("-o", "--output", help="wide, json or yaml.")] = None,
    watch: Annotated[bool, typer.Option("-w", "--watch", help="Keep the table up to date (Ctrl-C stops).")] = False,
    context: Context = None,
) -> None:
    """Jobs on the cluster: phase, workers, batch, micro-batch × accumulation, LR, step, throughput, loss."""
    import yaml

    if output not in (None, "wide", "json", "yaml"):
        raise _fail(f"--output must be wide, json or yaml, got {output!r}")
    cluster = _cluster(context)
    ns = None if all_namespaces else (namespace or cluster.namespace)

    def fetch() -> list[dict]:
        if name:
            return [_read(cluster.job, ns or cluster.namespace, name)]
        return _read(cluster.jobs, ns)

    if output in ("json", "yaml"):
        jobs = fetch()
        document = jobs[0] if name else {"apiVersion": "v1", "kind": "List", "items": jobs}
        typer.echo(json.dumps(document, indent=2) if output == "json" else yaml.safe_dump(document, sort_keys=False))
        return

    if watch:
        with _ctrl_c() as stop:
            _follow(fetch, ns, output == "wide", stop)  # until Ctrl-C, which stops following; the jobs go on
    else:
        console.print(_jobs_table(fetch(), ns, output == "wide"))


@app.command()
def describe(
    name: Annotated[str, typer.Argument(help="A job.")], namespace: Namespace = None, context: Context = None
) -> None:
    """One job in full: where it stands, the plan from here on, rescales, conditions and recent Events."""
    from largebatch import job_view

    cluster = _cluster(context)
    ns = namespace or cluster.namespace
    job = _read(cluster.job, ns, name)
    events = _read(cluster.events, ns, name)
    status = job.get("status") or {}
    now = timestamps.now()
    c = dict(zip(job_view.WIDE_COLUMNS, job_view.row(job, now, wide=True), strict=True))
    lines = [
        f"[bold]{name}[/] in {ns}: {c['PHASE']}, workers {c['WORKERS']} (ready/desired), capacity {c['CAPACITY']}",
        f"step {c['STEP']}, {c['SAMPLES']} samples, loss {c['LOSS']}, {c['SAMPLES/S']} samples/s, "
        f"noise scale {c['NOISE']}",
        f"batch {c['BATCH']}, micro-batch × accumulation {c['MICRO×ACC']}, lr {c['LR']} ({c['POLICY']})",
    ]
    held_out = status.get("progress") or {}
    if held_out.get("evalLoss") is not None:
        accuracy = held_out.get("evalAccuracy")
        lines.append(
            f"held-out loss {held_out['evalLoss']:.4f}"
            + (f", accuracy {accuracy:.1%}" if accuracy is not None else "")
            + f" (after step {held_out.get('evalStep', '-')})"
        )
    ahead = job_view.plan_ahead(job)
    rescales = status.get("rescales") or {}
    for line in lines:
        console.print(line, highlight=False)
    if ahead.rows:
        title = f"Plan from here on: {ahead.serial_steps:,} more steps"
        console.print(_plan_table(LargeBatchJob.from_object(job).spec, ahead, title))
    console.print(f"[bold]Rescales[/] {rescales.get('count', 0)}", highlight=False)
    for r in rescales.get("recent", []):
        move = f"{r.get('from')} → {r.get('to')} workers"
        console.print(f"  {r.get('time', '')}  {move}  {r.get('kind', '')}: {r.get('reason', '')}", highlight=False,
                      markup=False)  # fmt: skip
    console.print("[bold]Conditions[/]")
    for cond in status.get("conditions", []):
        console.print(f"  {cond['type']}={cond['status']}  {cond.get('reason', '')}: {cond.get('message', '')}",
                      highlight=False, markup=False)  # fmt: skip
    console.print("[bold]Events[/]")
    for event in events[-10:]:
        console.print(f"  {event.get('type', '')}  {event.get('reason', '')}: {event.get('message', '')}",
                      highlight=False, markup=False)  # fmt: skip


@app.command()
def operator() -> None:
    """Run the operator (kopf) for the current context: every namespace, or those in
    LARGEBATCH_WATCH_NAMESPACES. The same as `python -m largebatch.kube`."""
    from largebatch.kube.__main__ import main as run_operator

    run_operator()


@app.command()
def crd() -> None:
    """Print the LargeBatchJob CustomResourceDefinition (generated from the API models)."""
    from largebatch.crd import crd_yaml

    typer.echo(crd_yaml(), nl=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
