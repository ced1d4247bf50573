"""`lbctl`: the command line. This module only declares the commands (their arguments, options and help);
each forwards to one function of the module that does the work: `plan_output` (plan), `local.session`
(run --local), `cluster_commands` (run on a cluster, status, describe), `coord_check`, `sweep`,
`model_data` (prepare-data, export). Those read
the files, call the core, and render the result through `terminal` and `tables`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer

from largebatch import cluster_commands
from largebatch.coord_check import coord_check as check_coordinates
from largebatch.local.session import run_local
from largebatch.model_data import export as export_model
from largebatch.model_data import prepare_data
from largebatch.plan_output import show_plan
from largebatch.sweep import sweep_local

app = typer.Typer(
    help="largebatch: large-batch PyTorch training with an adaptive global batch.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

JobPath = Annotated[Path, typer.Argument(help="A LargeBatchJob YAML file.", show_default=False)]


def _finite(value: float | None) -> float | None:
    """A float flag: NaN and infinities pass click's range check, so they are refused here."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number, got {value}")
    return value


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
    show_plan(job, workers, noise_scale, as_json, plot)


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
    if local:
        run_local(job, slots, capacity, run_dir, metrics_port, restart_cost)  # exits with the run's code
    local_only = {"--slots": slots, "--capacity": capacity, "--run-dir": run_dir, "--metrics-port": metrics_port,
                  "--restart-cost": restart_cost}  # fmt: skip
    cluster_commands.submit(job, namespace, context, detach, local_only)  # refuses local_only given


@app.command("coord-check")
def coord_check(
    job: JobPath,
    widths: Annotated[str, typer.Option(help="Widths (task.args.width) to compare.")] = "64,128,256,512",
    steps: Annotated[int, typer.Option(min=1, max=50, help="Training steps at each width.")] = 5,
    out: Annotated[Path, typer.Option(help="The picture (PNG); the table goes beside it as JSON.")] = Path("coord.png"),
) -> None:
    """μP's coordinate check: the mean |output| of every layer over the first training steps, at each width.
    Flat lines mean updates keep their size as the model widens (μP); rising ones mean they do not."""
    check_coordinates(job, widths, steps, out)


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
    sweep_local(job, widths, lr, local, parallel, samples, out_dir, apply)


@app.command("prepare-data")
def prepare_data_command(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="Text files (one document each) or datasets saved with save_to_disk.", show_default=False),
    ],
    tokenizer: Annotated[Path, typer.Option(help="A local tokenizer directory (save_pretrained).", show_default=False)],
    out: Annotated[Path, typer.Option(help="The token file; its description goes to OUT.json.", show_default=False)],
    workers: Annotated[int | None, typer.Option(min=1, help="Tokenizing processes (default: CPU cores).")] = None,
    separator: Annotated[
        int | None, typer.Option(min=0, help="Token id between documents (default: the tokenizer's end of text).")
    ] = None,
    text_column: Annotated[str, typer.Option(help="Datasets: the column holding the text.")] = "text",
    split: Annotated[str | None, typer.Option(help="Datasets: the split of a DatasetDict.")] = None,
) -> None:
    """Tokenize a corpus into a token file for the causal_lm task: in parallel, resumable (run it again after
    an interruption), then its size and token count."""
    prepare_data(inputs, tokenizer, out, workers, separator, text_column, split)


@app.command()
def export(
    job: JobPath,
    out: Annotated[Path, typer.Option(help="The directory to write the model to.", show_default=False)],
    step: Annotated[int | None, typer.Option(min=0, help="The checkpoint's step (default: the newest).")] = None,
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="Where the checkpoints are (default: checkpoint.path).")
    ] = None,
) -> None:
    """Write a checkpoint's model in its task's own format (causal_lm: save_pretrained, safetensors), so that
    AutoModelForCausalLM.from_pretrained loads it. Training writes the final one to CHECKPOINT/model itself."""
    export_model(job, checkpoint_dir, step, out)


# --- the cluster -------------------------------------------------------------------------------------

Namespace = Annotated[str | None, typer.Option("-n", "--namespace", help="Namespace (default: the context's).")]
Context = Annotated[str | None, typer.Option("--context", help="kubeconfig context (default: the current one).")]


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
    cluster_commands.status(name, namespace, all_namespaces, output, watch, context)


@app.command()
def describe(
    name: Annotated[str, typer.Argument(help="A job.")], namespace: Namespace = None, context: Context = None
) -> None:
    """One job in full: where it stands, the plan from here on, rescales, conditions and recent Events."""
    cluster_commands.describe(name, namespace, context)


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
