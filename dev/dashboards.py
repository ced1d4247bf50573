"""The source of largebatch's two Grafana dashboards: "LargeBatch job" (one training job: throughput,
loss, batch size against the noise scale, workers, step time, checkpoints, progress) and "LargeBatch
operator" (the controller: jobs by phase, reconcile latency and errors, scale decisions, capacity).

This file owns them. `make dashboards` runs it; `charts/largebatch/dashboards/*.json` are its output and
are never edited by hand. `python dev/dashboards.py OUT_DIR` writes `largebatch-job.json` and
`largebatch-operator.json` into OUT_DIR; `render()` returns the same texts, so that a test can check the
files on disk are current. The dashboards are built with grafana-foundation-sdk, not written as JSON.

Every expression must stay valid PromQL once Grafana substitutes `$namespace`, `$job` and
`$__rate_interval`, and must return a series whenever a job has run (a test runs them against a real
Prometheus): no comparisons that filter series away, except in the rescale annotation, which marks events.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as models

# Every panel, query, variable and annotation reads from the data source the viewer picks, so the
# dashboards import into any Grafana whatever its Prometheus is called.
DATASOURCE = models.DataSourceRef(type_val="prometheus", uid="${datasource}")

# Trainer series are per process; job-level gauges (throughput, loss, batch, progress) are the same on
# every rank, and rank 0 is the one that reports them.
JOB = 'namespace="$namespace", job_name="$job"'
REPORTER = f'{JOB}, rank="0"'

WIDTH = 24  # Grafana's grid
HEIGHT = 8


def query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(DATASOURCE)


def series(metric: str, selector: str = "") -> str:
    return f"{metric}{{{selector}}}" if selector else metric


def quantile(q: float, bucket: str, selector: str = "") -> str:
    """A quantile over all the series of a histogram (every rank, or every reconcile)."""
    return f"histogram_quantile({q}, sum by (le) (rate({series(bucket, selector)}[$__rate_interval])))"


def mean(histogram: str, selector: str = "") -> str:
    def rate(suffix: str) -> str:
        return f"sum(rate({series(f'{histogram}_{suffix}', selector)}[$__rate_interval]))"

    return f"{rate('sum')} / {rate('count')}"


def dressed(panel, title: str, description: str, unit: str, queries: list[prometheus.Dataquery], width: int):
    """What every panel has: title, description, the chosen data source, unit, size and its queries."""
    panel.title(title).description(description).datasource(DATASOURCE).unit(unit).height(HEIGHT).span(width)
    # Grafana needs a distinct refId per query of a panel; A, B, C... is what its editor would give.
    for i, q in enumerate(queries):
        panel.with_target(q.ref_id(chr(ord("A") + i)))
    return panel


def graph(title: str, description: str, unit: str, queries: list[prometheus.Dataquery], width: int = 12):
    panel = (
        timeseries.Panel()
        .fill_opacity(10)
        .legend(
            common_builders.VizLegendOptions()
            .show_legend(True)
            .display_mode(common.LegendDisplayMode.TABLE)
            .placement(common.LegendPlacement.BOTTOM)
            .calcs(["lastNotNull", "max"])
        )
        .tooltip(common_builders.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.NONE))
    )
    return dressed(panel, title, description, unit, queries, width)


def single_value(title: str, description: str, unit: str, queries: list[prometheus.Dataquery], width: int = 6):
    panel = (
        stat.Panel()
        .graph_mode(common.BigValueGraphMode.AREA)
        .color_mode(common.BigValueColorMode.VALUE)
        # The last value, not the mean over the time range: these are states ("how far", "how many now").
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    return dressed(panel, title, description, unit, queries, width)


def thresholds(*steps: tuple[float | None, str]) -> dashboard.ThresholdsConfig:
    return (
        dashboard.ThresholdsConfig()
        .mode(models.ThresholdsMode.ABSOLUTE)
        .steps([models.Threshold(value=value, color=color) for value, color in steps])
    )


def datasource_variable() -> dashboard.DatasourceVariable:
    return dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus")


def label_variable(name: str, label: str, query_text: str) -> dashboard.QueryVariable:
    return (
        dashboard.QueryVariable(name)
        .label(label)
        .query(query_text)
        .datasource(DATASOURCE)
        # Jobs come and go: list the ones with data in the viewed range, not those of when it loaded.
        .refresh(models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(models.VariableSort.ALPHABETICAL_ASC)
    )


def new_dashboard(uid: str, title: str, description: str) -> dashboard.Dashboard:
    return (
        dashboard.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags(["largebatch"])
        .refresh("30s")
        .time("now-6h", "now")
        .timezone("browser")
        .tooltip(models.DashboardCursorSync.CROSSHAIR)
        # An empty list rather than the SDK's bare {}: Grafana adds its built-in annotation to the list.
        .annotations([])
        .with_variable(datasource_variable())
    )


def with_sections(board: dashboard.Dashboard, sections: list[tuple[str, list]]) -> dashboard.Dashboard:
    """Open rows with their panels after them (Grafana's layout for expanded rows). Panel ids are fixed
    here, in order, so that the output is the same on every run and panel links stay valid."""
    next_id = 1
    for title, panels in sections:
        board.with_row(dashboard.Row(title).id(next_id))
        next_id += 1
        for panel in panels:
            board.with_panel(panel.id(next_id))
            next_id += 1
    return board


# --- the job dashboard ----------------------------------------------------------------------------


def throughput_panels() -> list:
    return [
        graph(
            "Samples per second",
            "Training throughput of the whole job. 'reported' is the trainer's smoothed global figure; "
            "'from counters' sums every process's samples counter, so the two should agree. A dip that "
            "lines up with a Rescale annotation is the rendezvous after a change of workers.",
            "samples/s",
            [
                query(f"largebatch_samples_per_second{{{REPORTER}}}", "reported"),
                query(f"sum(rate(largebatch_samples_total{{{JOB}}}[$__rate_interval]))", "from counters"),
            ],
        ),
        graph(
            "Tokens per second",
            "Throughput in tokens, the trainer's smoothed global figure and the sum of every process's "
            "tokens counter. Tokens per sample is the ratio of this panel to 'Samples per second'.",
            "tokens/s",
            [
                query(f"largebatch_tokens_per_second{{{REPORTER}}}", "reported"),
                query(f"sum(rate(largebatch_tokens_total{{{JOB}}}[$__rate_interval]))", "from counters"),
            ],
        ),
        single_value(
            "Progress",
            "Samples the job has consumed as a share of its data budget (schedule.totalSamples). "
            "The job is done at 100%.",
            "percentunit",
            [query(f"largebatch_progress_samples{{{REPORTER}}} / largebatch_total_samples{{{REPORTER}}}", "progress")],
        )
        .min(0)
        .max(1),
        graph(
            "Optimizer steps per second",
            "Optimizer steps the job takes per second (rank 0's counter; every rank steps together). "
            "At a fixed throughput it falls as the global batch grows.",
            "steps/s",
            [query(f"rate(largebatch_optimizer_steps_total{{{REPORTER}}}[$__rate_interval])", "steps/s")],
            width=18,
        ),
    ]


def training_panels() -> list:
    return [
        graph(
            "Loss",
            "Training loss of the last optimizer step (mean per sample). It should fall; a jump after a "
            "rescale or a batch increase can mean the learning rate is too high for the new batch.",
            "short",
            [query(f"largebatch_loss{{{REPORTER}}}", "loss")],
        ),
        graph(
            "Learning rate",
            "Learning rate of the last step, after the schedule and any scaling with the global batch.",
            "sci",
            [query(f"largebatch_learning_rate{{{REPORTER}}}", "learning rate")],
        ),
        graph(
            "Global batch: target and actual",
            "'target' is the global batch the batch policy asks for; 'actual' is what the last step "
            "consumed over all ranks. Gradient accumulation keeps them equal whatever the cluster places; "
            "only the data budget's last step is shorter. Any other gap is a fault (alert "
            "LargeBatchJobBatchOffTarget).",
            "samples",
            [
                query(f"largebatch_global_batch_size_target{{{REPORTER}}}", "target"),
                query(f"largebatch_global_batch_size{{{REPORTER}}}", "actual"),
            ],
        ),
        graph(
            "Gradient noise scale and global batch",
            "The measured gradient noise scale (B_simple, in samples) against the actual global batch. "
            "A batch well below the noise scale can grow with little loss of sample efficiency; a batch "
            "above it wastes samples. The noise scale has no data until the trainer has measured it.",
            "samples",
            [
                query(f"largebatch_gradient_noise_scale{{{REPORTER}}}", "gradient noise scale"),
                query(f"largebatch_global_batch_size{{{REPORTER}}}", "global batch"),
            ],
        ),
        graph(
            "Micro-batch and accumulation",
            "How the global batch is made: the micro-batch per device (samples), the gradient "
            "accumulation steps, and their product times the world size, which should match the "
            "actual global batch.",
            "short",
            [
                query(f"largebatch_micro_batch_size{{{REPORTER}}}", "micro-batch"),
                query(f"largebatch_accumulation_steps{{{REPORTER}}}", "accumulation steps"),
                query(
                    f"largebatch_micro_batch_size{{{REPORTER}}} * largebatch_accumulation_steps{{{REPORTER}}}"
                    f" * largebatch_world_size{{{REPORTER}}}",
                    "micro-batch x accumulation x world size",
                ),
            ],
            width=24,
        ),
    ]


def worker_panels() -> list:
    return [
        graph(
            "Workers",
            "Worker pods as the operator sees them: 'desired' is its decision, 'ready' are running, "
            "'pending' wait to be placed. Pending that stays above zero means the cluster lacks capacity.",
            "short",
            [query(f"max by (state) (largebatch_operator_workers{{{JOB}}})", "{{state}}")],
        ),
        graph(
            "World size",
            "Training processes in the current rendezvous (workers times processes per worker). Each "
            "change is a rescale, also marked by the Rescale annotation.",
            "short",
            [query(f"largebatch_world_size{{{REPORTER}}}", "world size")],
            width=6,
        ),
        graph(
            "Restarts",
            "'elastic restarts' counts torchrun's worker-group restarts after a failure (a rescale is "
            "not one); "
            "'worker pods replaced' counts pods the operator replaced after they failed or were lost. "
            "Both only grow; a steady climb is a crash loop.",
            "short",
            [
                query(f"largebatch_elastic_restarts{{{REPORTER}}}", "elastic restarts"),
                query(f"max(largebatch_operator_worker_restarts{{{JOB}}})", "worker pods replaced"),
            ],
            width=6,
        ),
    ]


def step_panels() -> list:
    step = "largebatch_step_duration_seconds"
    return [
        graph(
            "Step time",
            "Wall time of one optimizer step over all ranks: median, 90th percentile and mean. A p90 far "
            "above the median points at stragglers or at checkpoint and rescale pauses.",
            "s",
            [
                query(quantile(0.5, f"{step}_bucket", JOB), "p50"),
                query(quantile(0.9, f"{step}_bucket", JOB), "p90"),
                query(mean(step, JOB), "mean"),
            ],
        ),
        graph(
            "Checkpoint duration",
            "Wall time of the last checkpoint write. Training stalls for about this long at each checkpoint.",
            "s",
            [query(f"largebatch_checkpoint_duration_seconds{{{REPORTER}}}", "last checkpoint")],
        ),
    ]


def rescale_annotation() -> dashboard.AnnotationQuery:
    return (
        dashboard.AnnotationQuery()
        .name("Rescale")
        .datasource(DATASOURCE)
        .enable(True)
        .icon_color("orange")
        # The one place a filter is wanted: an annotation marks only the moments the world size changed.
        .expr(f"changes(largebatch_world_size{{{REPORTER}}}[$__rate_interval]) > 0")
    )


def job_dashboard() -> dashboard.Dashboard:
    board = (
        new_dashboard(
            "largebatch-job",
            "LargeBatch job",
            "One LargeBatchJob: throughput, loss, global batch against the gradient noise scale, workers, "
            "step time and progress. Rescales are marked as annotations.",
        )
        .with_variable(label_variable("namespace", "Namespace", "label_values(largebatch_progress_samples, namespace)"))
        .with_variable(
            label_variable("job", "Job", 'label_values(largebatch_progress_samples{namespace="$namespace"}, job_name)')
        )
        .annotation(rescale_annotation())
    )
    return with_sections(
        board,
        [
            ("Throughput and progress", throughput_panels()),
            ("Training", training_panels()),
            ("Workers", worker_panels()),
            ("Steps and checkpoints", step_panels()),
        ],
    )


# --- the operator dashboard -----------------------------------------------------------------------

# Per-job operator series are aggregated by job so that a second scrape of the same operator (another
# replica, another service) does not double the lines.
PER_JOB = "namespace, job_name"


def job_panels() -> list:
    return [
        graph(
            "Jobs by phase",
            "LargeBatchJobs by phase, stacked: the height is the number of jobs the operator knows. "
            "Scaling means a rescale is in progress; Failed should stay at zero.",
            "short",
            [query("max by (phase) (largebatch_operator_jobs)", "{{phase}}")],
            width=18,
        ).stacking(common_builders.StackingConfig().mode(common.StackingMode.NORMAL)),
        single_value(
            "Capacity-limited jobs",
            "Jobs running fewer workers than their batch wants because the cluster cannot place more. "
            "Above zero: add nodes or lower the jobs' maximum workers.",
            "short",
            [query("max(largebatch_operator_capacity_limited_jobs)", "capacity-limited jobs")],
        ).thresholds(thresholds((None, "green"), (1, "orange"))),
        graph(
            "Capacity-limited, by job",
            "1 while the cluster cannot place the workers a job's batch wants, 0 otherwise; one line per job.",
            "short",
            [
                query(
                    f"max by ({PER_JOB}) (largebatch_operator_job_capacity_limited)",
                    "{{namespace}}/{{job_name}}",
                )
            ],
        )
        .min(0)
        .max(1),
        graph(
            "Worker restarts, by job",
            "Worker pods the operator replaced after they failed or were lost, per job. A steady climb is "
            "a crash loop; see that job's pods and its LargeBatch job dashboard.",
            "short",
            [query(f"max by ({PER_JOB}) (largebatch_operator_worker_restarts)", "{{namespace}}/{{job_name}}")],
        ),
    ]


def reconcile_panels() -> list:
    bucket = "largebatch_operator_reconcile_seconds_bucket"
    return [
        graph(
            "Reconcile latency",
            "Time one reconcile of one job takes (observe, decide, apply): median and 99th percentile. "
            "Seconds here usually mean a slow API server.",
            "s",
            [query(quantile(0.5, bucket), "p50"), query(quantile(0.99, bucket), "p99")],
        ),
        graph(
            "Reconciles and errors",
            "Reconciles per second and those that failed (an API error; they are retried). Errors that "
            "persist are in the operator's log.",
            "ops",
            [
                query("sum(rate(largebatch_operator_reconcile_seconds_count[$__rate_interval]))", "reconciles"),
                query("sum(rate(largebatch_operator_reconcile_errors_total[$__rate_interval]))", "errors"),
            ],
        ),
        graph(
            "Scale decisions by reason",
            "Decisions that changed a job's number of workers, per second, by the controller that made "
            "them. Zero while jobs are steady; bursts line up with batch increases or lost capacity.",
            "ops",
            [
                query(
                    "sum by (reason) (rate(largebatch_operator_scale_decisions_total[$__rate_interval]))",
                    "{{reason}}",
                )
            ],
            width=24,
        ),
    ]


def operator_dashboard() -> dashboard.Dashboard:
    board = new_dashboard(
        "largebatch-operator",
        "LargeBatch operator",
        "The largebatch operator: jobs by phase, capacity, worker restarts, reconcile latency and errors, "
        "and its scale decisions.",
    )
    return with_sections(board, [("Jobs", job_panels()), ("Reconciler", reconcile_panels())])


# --- output ---------------------------------------------------------------------------------------


def to_text(board: dashboard.Dashboard) -> str:
    # The SDK's models are not JSON-serializable themselves; its encoder calls their to_json().
    return json.dumps(board.build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def render() -> dict[str, str]:
    """File name -> the dashboard's JSON text, as written to charts/largebatch/dashboards/."""
    return {
        "largebatch-job.json": to_text(job_dashboard()),
        "largebatch-operator.json": to_text(operator_dashboard()),
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for name, text in render().items():
        (out / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
