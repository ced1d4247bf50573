"""The operator's own Prometheus metrics (the trainers export theirs): jobs by phase, each job's
workers, the scale decisions by reason, how long a reconcile takes, and how many jobs the cluster is
capping. `serve(port)` exposes them on `/metrics`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

PHASES = ("Pending", "Running", "Scaling", "Suspended", "Succeeded", "Failed")
WORKER_STATES = ("desired", "ready", "pending")


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.jobs = Gauge("largebatch_operator_jobs", "LargeBatchJobs by phase", ["phase"], registry=self.registry)
        self.workers = Gauge(
            "largebatch_operator_workers",
            "Worker pods of a job: desired (the controller's decision), ready (running), pending (not yet running)",
            ["namespace", "job", "state"],
            registry=self.registry,
        )
        self.decisions = Counter(
            "largebatch_operator_scale_decisions_total",
            "Decisions that changed a job's number of workers, by reason (the controller's kind)",
            ["reason"],
            registry=self.registry,
        )
        self.reconcile_seconds = Histogram(
            "largebatch_operator_reconcile_seconds",
            "Duration of one reconcile of one job (observe, decide, apply)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "largebatch_operator_reconcile_errors_total",
            "Reconciles that failed (an API error; retried)",
            registry=self.registry,
        )
        self.capacity_limited = Gauge(
            "largebatch_operator_capacity_limited_jobs",
            "Jobs running fewer workers than their batch wants because the cluster cannot place more",
            registry=self.registry,
        )
        for phase in PHASES:
            self.jobs.labels(phase).set(0)
        self._jobs: dict[tuple[str, str], tuple[str | None, bool]] = {}

    def record(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A job's status after a reconcile."""
        workers = status.get("workers") or {}
        for state in WORKER_STATES:
            self.workers.labels(namespace, name, state).set(workers.get(state) or 0)
        limited = any(
            c.get("type") == "CapacityLimited" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        self._jobs[namespace, name] = (
            status.get("phase"),
            limited and status.get("phase") not in ("Succeeded", "Failed"),
        )
        self._totals()

    def forget(self, namespace: str, name: str) -> None:
        """A job deleted: its series go."""
        self._jobs.pop((namespace, name), None)
        for state in WORKER_STATES:
            try:
                self.workers.remove(namespace, name, state)
            except KeyError:
                pass
        self._totals()

    def _totals(self) -> None:
        for phase in PHASES:
            self.jobs.labels(phase).set(sum(1 for p, _ in self._jobs.values() if p == phase))
        self.capacity_limited.set(sum(1 for _, limited in self._jobs.values() if limited))


def serve(metrics: OperatorMetrics, port: int) -> None:
    start_http_server(port, registry=metrics.registry)
