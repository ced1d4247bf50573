"""The operator under load, on the test control plane (tests/cluster: real API server, scheduler,
controller-manager; KWOK nodes): N jobs at once, each with one worker, then each job's rank-0 report
crosses its first Seesaw cut, where the batch doubles and the job wants a second worker.

    .venv/bin/python benchmarks/operator_scale.py [--jobs 1 100] [--gpu-nodes 4] [--gpus-per-node 64]

Measured per round, the baseline (one job) and the load (N jobs) side by side in one run:
- cut → pod: from the start of the status patch that crosses the cut (what rank 0 sends) to the new
  worker pod arriving on a watch of the namespace (p50, p99, max);
- reconcile duration (p50, p99), from the operator's own histogram `largebatch_operator_reconcile_seconds`,
  interpolated within its buckets as Prometheus' `histogram_quantile` does: over the whole round
  (the first reconciles of the jobs create their objects) and from the patches on (`cut_`: growing);
- the operator's CPU (cores used over the round, from /proc) and peak memory (VmHWM).
The operator runs as in the chart: a torch-free install, the chart's ServiceAccount, a reconcile every
second (`operator.reconcileSeconds`), one namespace watched.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from kubernetes import client, config, watch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from largebatch import api, schedule  # noqa: E402
from largebatch.api import LargeBatchJob  # noqa: E402
from tests.cluster.cluster import Cluster, tools  # noqa: E402
from tests.e2e.jobs import CHART, OPERATOR_NAMESPACE, RELEASE  # noqa: E402
from tests.e2e.operator_process import OperatorProcess  # noqa: E402

KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
SPEC = {
    "image": "largebatch-trainer:bench",
    "task": {"entrypoint": "largebatch_trainer.tasks:linreg"},
    "workers": {"min": 1, "max": 2, "accelerator": "nvidia.com/gpu", "pod": {"tolerations": [KWOK_TOLERATION]}},
    "batch": {"initial": 16, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "seesaw"}},
    "optimizer": {"name": "sgd", "lr": 0.05},
    "schedule": {"totalSamples": 1_000_000, "warmupSamples": 1_000, "decay": "cosine", "minLrRatio": 0.1},
}


def document(name: str) -> dict:
    return {"apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": api.KIND, "metadata": {"name": name}, "spec": SPEC}


def first_cut() -> int:
    job = LargeBatchJob.model_validate(document("x") | {"metadata": {"name": "x", "namespace": "x"}})
    return schedule.seesaw_cuts(job.spec)[0]


def quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets."""
    total = buckets[-1][1]
    rank = q * total
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * ((rank - below) / max(count - below, 1e-9))
        lower, below = upper, count
    return lower


def reconcile_buckets(operator: OperatorProcess) -> list[tuple[float, float]]:
    return sorted(
        (float(dict(labels)["le"]), value)
        for (sample, labels), value in operator.metrics().items()
        if sample == "largebatch_operator_reconcile_seconds_bucket"
    )


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / 100.0  # utime + stime, in clock ticks of 1/100 s


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_round(cluster: Cluster, kubeconfig: Path, jobs: int, folder: Path) -> dict:
    core = client.CoreV1Api(cluster.api)
    custom = client.CustomObjectsApi(cluster.api)
    namespace = f"bench-{jobs}"
    core.create_namespace({"metadata": {"name": namespace}})
    while not [a for a in core.list_namespaced_service_account(namespace).items if a.metadata.name == "default"]:
        time.sleep(0.2)
    operator = OperatorProcess.start(kubeconfig, namespace, folder / f"operator-{jobs}.log",
                                     LARGEBATCH_RECONCILE_SECONDS="1")  # fmt: skip
    names = [f"job-{i:03d}" for i in range(jobs)]
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch_pods() -> None:
        stream = watch.Watch()
        try:
            for event in stream.stream(core.list_namespaced_pod, namespace, timeout_seconds=600):
                name = event["object"].metadata.name
                if event["type"] == "ADDED" and name.endswith("-worker-1"):
                    seen.setdefault(name.removesuffix("-worker-1"), time.monotonic())
                if stop.is_set():
                    stream.stop()
        except Exception:  # the control plane stopping under the watch at the end
            if not stop.is_set():
                raise

    try:
        started_cpu, started = cpu_seconds(operator.process.pid), time.monotonic()
        for name in names:
            custom.create_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, document(name))

        def running() -> int:
            pods = core.list_namespaced_pod(namespace, label_selector="largebatch.io/role=worker").items
            return sum(1 for p in pods if p.status.phase == "Running")

        deadline = time.monotonic() + 600
        while running() < jobs:
            if time.monotonic() > deadline or operator.process.poll() is not None:
                raise SystemExit(f"the jobs did not start:\n{operator.tail()}")
            time.sleep(0.5)
        started_all = time.monotonic() - started
        watcher = threading.Thread(target=watch_pods, daemon=True)
        watcher.start()
        time.sleep(1)  # the watch is open before the first patch
        before_cut = reconcile_buckets(operator)
        cut = first_cut()
        patched: dict[str, float] = {}
        for name in names:  # as each job's rank 0 would report crossing the cut
            patched[name] = time.monotonic()
            progress = {"step": cut // 16 + 1, "samples": cut + 16, "samplesPerSecond": 1000.0}
            custom.patch_namespaced_custom_object_status(api.GROUP, api.VERSION, namespace, api.PLURAL, name,
                                                         {"status": {"progress": progress}})  # fmt: skip
        deadline = time.monotonic() + 600
        while len(seen) < jobs and time.monotonic() < deadline:
            time.sleep(0.2)
        stop.set()
        wall = time.monotonic() - started
        cores = (cpu_seconds(operator.process.pid) - started_cpu) / wall
        latencies = sorted(seen[n] - patched[n] for n in names if n in seen)
        buckets = reconcile_buckets(operator)
        at_cut = [(le, count - earlier) for (le, count), (_, earlier) in zip(buckets, before_cut, strict=True)]
        return {
            "jobs": jobs,
            "grown": len(latencies),
            "all_started_s": round(started_all, 1),
            "cut_to_pod_p50_s": round(statistics.median(latencies), 3),
            "cut_to_pod_p99_s": round(latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 3),
            "cut_to_pod_max_s": round(latencies[-1], 3),
            "reconcile_p50_ms": round(1000 * quantile(0.5, buckets), 1),
            "reconcile_p99_ms": round(1000 * quantile(0.99, buckets), 1),
            "reconciles": int(buckets[-1][1]),
            "cut_reconcile_p50_ms": round(1000 * quantile(0.5, at_cut), 1),
            "cut_reconcile_p99_ms": round(1000 * quantile(0.99, at_cut), 1),
            "operator_cores": round(cores, 2),
            "operator_peak_mib": round(peak_rss_mib(operator.process.pid), 1),
        }
    finally:
        operator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 100])
    parser.add_argument("--gpu-nodes", type=int, default=4)
    parser.add_argument("--gpus-per-node", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="operator-scale-") as tmp:
        folder = Path(tmp)
        cluster = Cluster(folder / "cluster", tools())
        try:
            cluster.start(gpu_nodes=args.gpu_nodes, gpus_per_node=args.gpus_per_node, cpu_nodes=1)
            cluster.api = config.new_client_from_config(str(cluster.kubeconfig))
            cluster.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace")
            cluster.kubectl("wait", "--for=condition=Established", "crd/largebatchjobs.largebatch.io")
            kubeconfig = cluster.kubeconfig_for(f"{RELEASE}-operator", OPERATOR_NAMESPACE, folder)
            results = [one_round(cluster, kubeconfig, jobs, folder) for jobs in args.jobs]
        finally:
            cluster.stop()
    keys = list(results[0])
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for row in results:
        print("| " + " | ".join(str(row[k]) for k in keys) + " |")
    if len(results) > 1:
        base, load = results[0], results[-1]
        keys = ("cut_to_pod_p50_s", "cut_to_pod_p99_s", "reconcile_p99_ms", "cut_reconcile_p99_ms")
        ratio = {k: round(load[k] / base[k], 2) for k in keys if base[k]}
        print(f"ratio {load['jobs']} jobs / {base['jobs']} job: {json.dumps(ratio)}")


if __name__ == "__main__":
    main()
