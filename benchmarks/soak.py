"""The soak: many small jobs on the test control plane (tests/cluster) with real training through the pod
runner, while a fault is thrown every 30 to 90 s, drawn from a seeded generator (the schedule is
printed as it goes):

- `apiserver` / `etcd`: the component stopped (SIGTERM) for 10 to 70 s, then started with its flags;
- `cut`: the operator cut off from the API server for 60 s (a proxy between them drops its connections);
- `worker`: a running worker pod of a random job deleted (SIGTERM, as a preemption or a drain);
- `rendezvous`: a random job's rendezvous pod deleted;
- `node`: a node with workers lost (its processes frozen, its KWOK stopped), deleted 60 s later (as a
  cloud's node controller does) and a fresh node added in its place.

    .venv/bin/python benchmarks/soak.py [--jobs 10] [--minutes 15] [--seed 1]

At the end every job must be Succeeded with `samples == totalSamples` and a contiguous step history
(read from its newest checkpoint), no two pods of one name may ever have existed at once (a watch of the
namespace sees every pod), and the operator must be the process it started as. Reported: the faults,
the samples redone per fault kind (a job's reported samples falling back: what its restarts redid, at
most one report interval short), the longest stall per fault kind (the longest time an affected job
wrote no checkpoint in the 5 minutes after the fault, against its usual interval) and the operator's
peak memory. It exits non-zero when any check fails, leaving every log (the control plane's, the
operator's, each pod's) in the folder it prints first. Not thrown here, each an e2e test of its own:
a preemption by the scheduler and a refused status write.
"""

from __future__ import annotations

import argparse
import itertools
import random
import shutil
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import urllib3
import yaml
from kubernetes import client, config, watch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from largebatch import api  # noqa: E402
from largebatch_trainer import checkpoint  # noqa: E402
from tests import helpers  # noqa: E402
from tests.cluster.cluster import Cluster, tools  # noqa: E402
from tests.cluster.pod_runner import PodRunner  # noqa: E402
from tests.cluster.proxy import Proxy  # noqa: E402
from tests.e2e.jobs import CHART, KWOK_TOLERATION, OPERATOR_NAMESPACE, RELEASE, job_document, shared_claim  # noqa: E402
from tests.e2e.operator_process import through_proxy  # noqa: E402

NAMESPACE = "soak"
KINDS = ("apiserver", "etcd", "cut", "worker", "rendezvous", "node")
GPUS_PER_NODE = 4
AFTERMATH = 300.0  # seconds after a fault in which its stall is measured
TOLERATIONS = [KWOK_TOLERATION] + [
    {"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 10}
    for taint in ("unreachable", "not-ready")
]


def job(i: int) -> dict:
    """Alternately linreg and a small GPT, Seesaw and critical batch; one or two workers."""
    name = f"soak-{i}"
    document = job_document(name, f"ckpt-{name}", total=16 * 48_000)
    document["spec"]["workers"]["pod"] = {"tolerations": TOLERATIONS}
    if i % 2:
        document["spec"]["task"] = {"entrypoint": "largebatch_trainer.tasks:pylm",
                                    "args": {"width": 32, "depth": 1, "heads": 2, "context": 32}}  # fmt: skip
        document["spec"]["optimizer"] = {"name": "adamw", "lr": 0.003}
        document["spec"]["schedule"]["totalSamples"] = 16 * 16_000
    if i % 4 >= 2:
        document["spec"]["batch"]["policy"] = {"type": "criticalBatch",
                                               "criticalBatch": {"minStepsBetweenChanges": 200}}  # fmt: skip
    return document


class Observer:
    """Polls every job's status and newest checkpoint each second, and watches the namespace's pods."""

    def __init__(self, cluster: Cluster, names: list[str], pods_dir: Path):
        self.cluster, self.names, self.pods_dir = cluster, names, pods_dir
        self.custom = client.CustomObjectsApi(cluster.api)
        self.high: dict[str, int] = defaultdict(int)  # most samples a job reported
        self.redone: list[tuple[float, str, int]] = []  # (time, job, samples reported again)
        self.checkpoints: dict[str, list[tuple[float, int]]] = defaultdict(list)  # job → (time, step) written
        self.overlaps: list[str] = []  # a pod created while one of its name still existed
        self.created: dict[str, int] = defaultdict(int)
        self.status: dict[str, dict] = {}
        self._stop = threading.Event()
        for target in (self._poll_checkpoints, self._poll_status, self._watch):
            threading.Thread(target=target, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _poll_checkpoints(self) -> None:
        """On the host's folders, apart from the API server: training goes on while it is away."""
        while not self._stop.wait(1.0):
            for name in self.names:
                newest = max(checkpoint.all_checkpoints(self.pods_dir / f"pvc-ckpt-{name}"), default=None)
                step = int(newest.stem.split("-")[1]) if newest else 0
                if not self.checkpoints[name] or self.checkpoints[name][-1][1] != step:
                    self.checkpoints[name].append((time.monotonic(), step))

    def _poll_status(self) -> None:
        while not self._stop.wait(1.0):
            for name in self.names:
                try:
                    status = (
                        self.custom.get_namespaced_custom_object(
                            api.GROUP, api.VERSION, NAMESPACE, api.PLURAL, name, _request_timeout=5
                        ).get("status")
                        or {}
                    )
                except (urllib3.exceptions.HTTPError, client.ApiException):
                    continue  # the API server away: a fault of the soak's
                self.status[name] = status
                samples = status.get("progress", {}).get("samples", 0)
                if samples < self.high[name]:
                    self.redone.append((time.monotonic(), name, self.high[name] - samples))
                self.high[name] = max(self.high[name], samples)

    def _watch(self) -> None:
        core, version = client.CoreV1Api(self.cluster.api), None
        alive: dict[str, str] = {}  # name → uid
        while not self._stop.is_set():
            try:
                for event in watch.Watch().stream(core.list_namespaced_pod, NAMESPACE, resource_version=version,
                                                  timeout_seconds=10):  # fmt: skip
                    pod = event["object"].metadata
                    version = pod.resource_version
                    if event["type"] == "ADDED" and alive.get(pod.name) != pod.uid:  # a relist repeats the known
                        if pod.name in alive:
                            self.overlaps.append(pod.name)
                        alive[pod.name] = pod.uid
                        self.created[pod.name] += 1
                    elif event["type"] == "DELETED":
                        alive.pop(pod.name, None)
            except client.ApiException as exc:
                if exc.status == 410:
                    version = None  # too old to resume from: list again
                time.sleep(1)
            except urllib3.exceptions.HTTPError:
                time.sleep(1)  # the API server away: resume from the last event seen


class Faults:
    def __init__(self, cluster: Cluster, pods: PodRunner, proxy: Proxy, names: list[str], rng: random.Random):
        self.cluster, self.pods, self.proxy, self.names, self.rng = cluster, pods, proxy, names, rng
        self.core = client.CoreV1Api(cluster.api)
        self.nodes = 0

    def add_node(self) -> None:
        self.cluster.add_node(f"pool-{self.nodes}", gpus=GPUS_PER_NODE, cpu="50m", losable=True)
        self.nodes += 1

    def running_workers(self) -> list[tuple[str, str]]:
        pods = self.core.list_namespaced_pod(NAMESPACE, label_selector="largebatch.io/role=worker").items
        return [(p.metadata.name, p.spec.node_name) for p in pods
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp]  # fmt: skip

    def throw(self, kind: str) -> tuple[str, list[str]]:
        """Throw one fault: (what it hit, the jobs it hit)."""
        if kind in ("apiserver", "etcd"):
            seconds = self.rng.uniform(10, 70)
            with self.cluster.stopped("kube-apiserver" if kind == "apiserver" else "etcd"):
                time.sleep(seconds)
            return f"{seconds:.0f} s", self.names
        if kind == "cut":
            with self.proxy.cut_off():
                time.sleep(60)
            return "60 s", self.names
        if kind == "rendezvous":
            name = self.rng.choice(self.names)
            self.core.delete_namespaced_pod(f"{name}-rdzv", NAMESPACE)
            return name, [name]
        workers = self.running_workers()
        if not workers:
            return "nothing running", []
        pod, node = self.rng.choice(workers)
        if kind == "worker":
            self.core.delete_namespaced_pod(pod, NAMESPACE)
            return pod, [job_of(pod)]
        frozen = self.pods.lose_node(node)
        self.cluster.lose_node(node)
        time.sleep(60)
        self.cluster.kubectl("delete", "node", node, "--wait=false")
        self.add_node()
        return f"{node} ({', '.join(frozen)})", sorted({job_of(p) for p in frozen})


def job_of(pod: str) -> str:
    return pod.rsplit("-", 2)[0]  # soak-3-worker-1


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def longest_gap(points: list[tuple[float, int]], start: float, end: float) -> float:
    """The longest time without a new checkpoint within [start, end], while the job still trained (its
    last checkpoint ends it)."""
    end = min(end, points[-1][0]) if points else end
    if end <= start:
        return 0.0
    times = [start] + [t for t, _ in points if start < t < end] + [end]
    return max(b - a for a, b in itertools.pairwise(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--minutes", type=float, default=15)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    names = [f"soak-{i}" for i in range(args.jobs)]
    folder = Path(tempfile.mkdtemp(prefix="soak-"))
    print(f"logs (kept unless the soak passes): {folder}", flush=True)
    cluster = Cluster(folder / "cluster", tools())
    try:
        cluster.start(gpu_nodes=0, cpu_nodes=1)
        cluster.api = config.new_client_from_config(str(cluster.kubeconfig))
        cluster.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace")
        cluster.wait_established("largebatchjobs.largebatch.io", "kopfpeerings.kopf.dev")
        cluster.kubectl("create", "namespace", NAMESPACE)
        helpers.wait_for(lambda: "default" in cluster.kubectl("get", "sa", "-n", NAMESPACE).stdout)
        kubeconfig = cluster.kubeconfig_for(f"{RELEASE}-operator", OPERATOR_NAMESPACE, folder)
        operating = through_proxy(cluster, kubeconfig, NAMESPACE, folder / "operator.log")
        with operating as (operator, proxy), PodRunner(cluster, NAMESPACE, folder / "pods") as pods:
            faults = Faults(cluster, pods, proxy, names, rng)
            for _ in range(-(-2 * args.jobs // GPUS_PER_NODE) + 1):  # room for every job at two workers
                faults.add_node()
            for i, name in enumerate(names):
                shared_claim(cluster, NAMESPACE, f"ckpt-{name}")
                cluster.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=yaml.safe_dump(job(i)))
            observer = Observer(cluster, names, folder / "pods")
            thrown = run_faults(faults, observer, rng, args.minutes * 60)
            done = lambda: all(observer.status.get(n, {}).get("phase") in ("Succeeded", "Failed") for n in names)  # noqa: E731
            try:
                helpers.wait_for(done, timeout=1800, what="every job to end")
            except AssertionError:
                pass  # the report names the jobs that did not end
            observer.stop()
            passed = report(observer, thrown, names, folder, operator, pods)
    finally:
        cluster.stop()
    if not passed:
        sys.exit(f"the soak failed: its logs are in {folder}")
    shutil.rmtree(folder, ignore_errors=True)


def run_faults(faults: Faults, observer: Observer, rng: random.Random, seconds: float) -> list[tuple]:
    """Throw faults until `seconds` have passed or every job is done: [(kind, start, jobs hit)]."""
    started, thrown = time.monotonic(), []
    while time.monotonic() - started < seconds:
        time.sleep(rng.uniform(30, 90))
        if all(observer.status.get(n, {}).get("phase") == "Succeeded" for n in observer.names):
            break
        kind = rng.choice(KINDS)
        start = time.monotonic()
        what, jobs = faults.throw(kind)
        thrown.append((kind, start, jobs))
        print(f"{start - started:6.0f} s  {kind:10} {what}", flush=True)
    return thrown


def report(observer: Observer, thrown: list[tuple], names: list[str], folder: Path, operator, pods) -> bool:
    """Prints the report; whether the soak passed."""
    failures = []
    for name in names:
        status = observer.status.get(name, {})
        total = job(int(name.split("-")[1]))["spec"]["schedule"]["totalSamples"]
        found = checkpoint.newest_intact(folder / "pods" / f"pvc-ckpt-{name}")
        runs = found[1]["history"] if found else []
        spans = [(first, first + batch * steps) for _, first, batch, _, steps in runs]
        if status.get("phase") != "Succeeded" or status.get("progress", {}).get("samples") != total:
            failures.append(f"{name}: {status.get('phase')}, {status.get('progress', {}).get('samples')} of {total}")
        elif not helpers.contiguous(spans, total, last_batch=runs[-1][2]):
            failures.append(f"{name}: history not contiguous: {runs}")
    usual = sorted(b - a for points in observer.checkpoints.values()
                   for (a, _), (b, _) in itertools.pairwise(points))  # fmt: skip
    print(f"\njobs {len(names)}, faults {len(thrown)}, pods created {sum(observer.created.values())}")
    print(f"usual time between checkpoints: median {usual[len(usual) // 2]:.1f} s" if usual else "")
    print("| fault | thrown | samples redone | longest stall, s |")
    print("|---|---|---|---|")
    # Samples redone count against the latest fault that hit the job before; a stall is the longest time
    # without a checkpoint of a job the fault hit, in the AFTERMATH after it (a later fault may overlap).
    redone: dict[str, int] = defaultdict(int)
    for when, name, samples in observer.redone:
        hits = [kind for kind, start, jobs in thrown if start <= when and name in jobs]
        redone[hits[-1] if hits else "none"] += samples
    now = time.monotonic()
    for kind in (*KINDS, "none"):
        mine = [(start, jobs) for k, start, jobs in thrown if k == kind]
        if not mine and not redone.get(kind):
            continue
        stall = max((longest_gap(observer.checkpoints[name], start, min(start + AFTERMATH, now))
                     for start, jobs in mine for name in jobs), default=0.0)  # fmt: skip
        print(f"| {kind} | {len(mine)} | {redone.get(kind, 0):,} | {stall:.0f} |")
    print(f"operator: peak RSS {peak_rss_mib(operator.process.pid):.0f} MiB, "
          f"{'still the process it started as' if operator.process.poll() is None else 'EXITED'}")  # fmt: skip
    print(f"pod runner errors: {pods.errors or 'none'}; pods of one name at once: {observer.overlaps or 'never'}")
    print("every job Succeeded, complete and contiguous" if not failures else "FAILED:\n" + "\n".join(failures))
    return not failures and operator.process.poll() is None and not pods.errors and not observer.overlaps


if __name__ == "__main__":
    main()
