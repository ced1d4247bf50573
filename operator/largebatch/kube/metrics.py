"""The operator's own Prometheus metrics (the trainers export theirs): jobs by phase, each job's phase,
workers, worker restarts, whether the cluster is capping it, its share of the accelerators against its
demand, the scale decisions made for it, and how long a reconcile takes. Per-job series carry
`namespace` and `job_name`, as the trainers' do, so that one selector reaches both. `serve(port)` exposes
them on `/metrics`."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from largebatch.controller import Kind

PHASES = ("Pending", "Queued", "Running", "Scaling", "Suspended", "Succeeded", "Failed")
WORKER_STATES = ("desired", "ready", "pending")
ALLOCATION_KINDS = {"allocated": "workers", "demand": "demand"}
"""The allocation gauge's `kind` label → the status.allocation field it shows."""
JOB = ["namespace", "job_name"]


class OperatorMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.jobs = Gauge("largebatch_operator_jobs", "LargeBatchJobs by phase", ["phase"], registry=r)
        # kube-state-metrics' convention: every phase present, 1 for the current one, so that an alert can
        # say `== 1` and a phase change is a value change rather than a series appearing.
        self.job_phase = Gauge(
            "largebatch_operator_job_phase",
            "1 for the job's current phase, 0 for the others",
            [*JOB, "phase"],
            registry=r,
        )
        self.workers = Gauge(
            "largebatch_operator_workers",
            "Worker pods of a job: desired (the controller's decision), ready (running), pending (not yet running)",
            [*JOB, "state"],
            registry=r,
        )
        self.worker_restarts = Gauge(
            "largebatch_operator_worker_restarts",
            "Worker pods of a job replaced after they failed or were lost (status.workers.restarts)",
            JOB,
            registry=r,
        )
        self.job_capacity_limited = Gauge(
            "largebatch_operator_job_capacity_limited",
            "1 while the cluster cannot place the workers the job's batch wants (CapacityLimited), else 0",
            JOB,
            registry=r,
        )
        self.capacity_limited = Gauge(
            "largebatch_operator_capacity_limited_jobs",
            "Jobs running fewer workers than their batch wants because the cluster cannot place more",
            registry=r,
        )
        self.allocation = Gauge(
            "largebatch_operator_job_allocation_workers",
            "A job's share of the accelerators shared across jobs: allocated (most workers the allocator gives "
            "it) and demand (workers its batch can use now)",
            [*JOB, "kind"],
            registry=r,
        )
        self.decisions = Counter(
            "largebatch_operator_scale_decisions",
            "Decisions that changed a job's number of workers, by reason (the controller's kind)",
            [*JOB, "reason"],
            registry=r,
        )
        self.reconcile_seconds = Histogram(
            "largebatch_operator_reconcile_seconds",
            "Duration of one reconcile of one job (observe, decide, apply)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
            registry=r,
        )
        self.reconcile_errors = Counter(
            "largebatch_operator_reconcile_errors", "Reconciles that failed (an API error; retried)", registry=r
        )
        for phase in PHASES:
            self.jobs.labels(phase).set(0)
        self._jobs: dict[tuple[str, str], tuple[str | None, bool]] = {}

    def record(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A job's status after a reconcile."""
        workers = status.get("workers") or {}
        for state in WORKER_STATES:
            self.workers.labels(namespace, name, state).set(workers.get(state) or 0)
        self.worker_restarts.labels(namespace, name).set(workers.get("restarts") or 0)
        phase = status.get("phase")
        for p in PHASES:
            self.job_phase.labels(namespace, name, p).set(1 if p == phase else 0)
        limited = phase not in ("Succeeded", "Failed") and any(
            c.get("type") == "CapacityLimited" and c.get("status") == "True" for c in status.get("conditions") or []
        )
        self.job_capacity_limited.labels(namespace, name).set(1 if limited else 0)
        allocation = status.get("allocation") or {}
        for kind, key in ALLOCATION_KINDS.items():
            if allocation.get(key) is not None:
                self.allocation.labels(namespace, name, kind).set(allocation[key])
            else:
                self._remove(self.allocation, namespace, name, kind)
        self._jobs[namespace, name] = (phase, limited)
        self._totals()

    def decided(self, namespace: str, name: str, reason: str) -> None:
        """A decision that changed the job's number of workers."""
        self.decisions.labels(namespace, name, reason).inc()

    def forget(self, namespace: str, name: str) -> None:
        """A job deleted: its series go."""
        self._jobs.pop((namespace, name), None)
        per_job = [
            (self.job_phase, PHASES),
            (self.workers, WORKER_STATES),
            (self.decisions, [kind.value for kind in Kind]),
            (self.worker_restarts, [None]),
            (self.job_capacity_limited, [None]),
            (self.allocation, list(ALLOCATION_KINDS)),
        ]
        for family, last_labels in per_job:
            for last in last_labels:
                self._remove(family, namespace, name, *([] if last is None else [last]))
        self._totals()

    @staticmethod
    def _remove(family, *labels: str) -> None:
        try:
            family.remove(*labels)
        except KeyError:  # a series the job never had
            pass

    def _totals(self) -> None:
        for phase in PHASES:
            self.jobs.labels(phase).set(sum(1 for p, _ in self._jobs.values() if p == phase))
        self.capacity_limited.set(sum(1 for _, limited in self._jobs.values() if limited))


def serve(metrics: OperatorMetrics, port: int) -> None:
    start_http_server(port, registry=metrics.registry)
