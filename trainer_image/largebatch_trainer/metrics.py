"""Prometheus metrics every worker serves on `metrics.port` (+ LOCAL_RANK), labelled with the job's
`namespace`, `job_name` and the process's `rank`. Listed in docs/metrics.md."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class Metrics:
    def __init__(self, namespace: str, job: str, rank: int, port: int | None):
        self.registry = CollectorRegistry()
        labels = {"namespace": namespace, "job_name": job, "rank": str(rank)}

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, list(labels), registry=self.registry).labels(**labels)

        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

        self.samples = counter("largebatch_samples", "Samples consumed by optimizer steps of this process")
        self.tokens = counter("largebatch_tokens", "Tokens consumed by optimizer steps of this process")
        self.steps = counter("largebatch_optimizer_steps", "Optimizer steps taken by this process")
        self.samples_per_second = gauge("largebatch_samples_per_second", "Global training throughput")
        self.tokens_per_second = gauge("largebatch_tokens_per_second", "Global training throughput in tokens")
        self.step_seconds = Histogram(
            "largebatch_step_duration_seconds",
            "Wall time of one optimizer step",
            list(labels),
            registry=self.registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        ).labels(**labels)
        self.loss = gauge("largebatch_loss", "Training loss of the last step (mean per sample)")
        self.lr = gauge("largebatch_learning_rate", "Learning rate of the last step")
        self.global_batch = gauge(
            "largebatch_global_batch_size", "Samples the last step consumed over all ranks (the actual global batch)"
        )
        self.global_batch_target = gauge(
            "largebatch_global_batch_size_target", "Global batch the batch policy set for the last step, in samples"
        )
        self.micro_batch = gauge("largebatch_micro_batch_size", "Largest micro-batch per device, in samples")
        self.accumulation = gauge("largebatch_accumulation_steps", "Gradient accumulation steps per optimizer step")
        self.world_size = gauge("largebatch_world_size", "Training processes in the current rendezvous")
        # Absent, not 0, until measured: a noise scale of 0 would read as "any batch is too large".
        self._noise_scale = Gauge(
            "largebatch_gradient_noise_scale",
            "Smoothed gradient noise scale B_simple",
            list(labels),
            registry=self.registry,
        )
        # Rank 0 evaluates; its gauges are absent until the first evaluation, and accuracy is absent for a
        # task that does not classify.
        self._eval_loss = Gauge(
            "largebatch_eval_loss",
            "Held-out loss of the latest evaluation (mean per sample)",
            list(labels),
            registry=self.registry,
        )
        self._eval_accuracy = Gauge(
            "largebatch_eval_accuracy_ratio",
            "Held-out accuracy of the latest evaluation, a fraction from 0 to 1",
            list(labels),
            registry=self.registry,
        )
        self._labels = labels
        self.progress = gauge("largebatch_progress_samples", "Samples consumed by the whole job")
        self.total = gauge("largebatch_total_samples", "The job's data budget (schedule.totalSamples)")
        self.checkpoint_seconds = gauge(
            "largebatch_checkpoint_duration_seconds", "Wall time of the last checkpoint write"
        )
        self.restarts = gauge(
            "largebatch_elastic_restarts", "Worker-group restarts so far (TORCHELASTIC_RESTART_COUNT)"
        )
        self.port = None
        if port:
            server, _ = start_http_server(port, registry=self.registry)
            self.port = server.server_address[1]

    def noise_scale(self, value: float) -> None:
        self._noise_scale.labels(**self._labels).set(value)

    def evaluation(self, loss: float, accuracy: float | None) -> None:
        self._eval_loss.labels(**self._labels).set(loss)
        if accuracy is not None:
            self._eval_accuracy.labels(**self._labels).set(accuracy)
