"""LargeBatchJobs under the real Kueue (tests/cluster/kueue.py) on the test control plane, with real
training through the pod runner: a job labelled kueue.x-k8s.io/queue-name waits for its queue's quota,
runs on the admitted flavor's nodes, grows within the quota through a new Workload slice, gives the quota
back when it ends, and, preempted, checkpoints and resumes with nothing lost. A job without the label is
none of Kueue's business.

Each test has GPU nodes of its own, a ResourceFlavor that selects them by a label (the jobs say nothing
about where to run: the flavor places them), a ClusterQueue with the test's quota and a LocalQueue."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import yaml
from kubernetes import client

from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import (
    POOL_LABEL,
    apply,
    condition,
    finished_whole,
    gpu_pool,
    history,
    job_document,
    on_nodes,
    shared_claim,
    status_of,
    wait_or_explain,
    wait_until_succeeded,
    world,
)
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import simulated_task

pytestmark = pytest.mark.e2e

KUEUE = "kueue.x-k8s.io"
QUEUE = "team"


def resource_groups(flavor: str, gpus: int) -> list[dict]:
    """A ClusterQueue's quota: `gpus` GPUs of `flavor`, and CPU and memory enough."""
    quota = {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}
    resources = [{"name": name, "nominalQuota": value} for name, value in quota.items()]
    return [{"coveredResources": list(quota), "flavors": [{"name": flavor, "resources": resources}]}]


@contextlib.contextmanager
def queue(cluster, namespace: str, gpus: int, quota: int, priorities: dict[str, int] | None = None,
          ) -> Iterator[tuple[str, list[str]]]:  # fmt: skip
    """`gpus` one-GPU nodes, a flavor of them, a ClusterQueue (named after the namespace) with `quota`
    GPUs that preempts lower priorities within itself, the LocalQueue `team` in `namespace` and the
    WorkloadPriorityClasses `priorities` (name → value, each prefixed with the queue's name)."""
    name = namespace[:40].strip("-")
    objects = [
        {"kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {"nodeLabels": {POOL_LABEL: name}}},
        {"kind": "ClusterQueue", "metadata": {"name": name}, "spec": {
            "namespaceSelector": {},  # in v1beta2 an absent selector matches no namespace
            "preemption": {"withinClusterQueue": "LowerPriority"},
            "resourceGroups": resource_groups(name, quota)}},
        {"kind": "LocalQueue", "metadata": {"name": QUEUE, "namespace": namespace}, "spec": {"clusterQueue": name}},
        *({"kind": "WorkloadPriorityClass", "metadata": {"name": f"{name}-{p}"}, "value": v}
          for p, v in (priorities or {}).items()),
    ]  # fmt: skip
    documents = [{"apiVersion": f"{KUEUE}/v1beta2"} | o for o in objects]
    with gpu_pool(cluster, namespace, gpus) as nodes:
        for node in nodes:
            cluster.kubectl("label", "node", node, f"{POOL_LABEL}={name}")
        cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))
        try:
            yield name, nodes
        finally:
            cluster.kubectl("delete", "--ignore-not-found", "--wait=false", "-f", "-", input=yaml.safe_dump_all(
                [d for d in documents if d["kind"] != "LocalQueue"]))  # fmt: skip


SECONDS_PER_SAMPLE = 0.005
"""The simulated trainers' speed: a micro-batch of 16 takes 0.08 s on any worker, slow enough that a job
outlasts what a test looks at (linreg trained 45,000 samples/s: a job was over before a reconcile saw it)."""


def queued(name: str, batch: int, total: int, labels: dict[str, str] | None = None, **batch_spec) -> dict:
    """A job of simulated training (tasks:simulated) at `batch` (micro-batches of 16: a worker per 16), in
    the queue `team` unless `labels` say otherwise, checkpointing on a claim of its own; nothing in it says
    where its workers run."""
    document = job_document(name, f"ckpt-{name}", total=total, min=1, max=2)
    document["spec"]["task"] = simulated_task(SECONDS_PER_SAMPLE)
    policy = {"type": "constant"}
    document["spec"]["batch"] = {
        "initial": batch,
        "max": batch,
        "microBatchPerDevice": 16,
        "policy": policy,
    } | batch_spec
    document["metadata"]["labels"] = {f"{KUEUE}/queue-name": QUEUE} if labels is None else labels
    return document


def workloads(cluster, namespace: str, job: str) -> list[dict]:
    custom = client.CustomObjectsApi(cluster.api)
    found = custom.list_namespaced_custom_object(KUEUE, "v1beta2", namespace, "workloads",
                                                 label_selector=f"largebatch.io/job={job}")  # fmt: skip
    return sorted(found["items"], key=lambda w: w["metadata"]["creationTimestamp"])


def conditions(workload: dict) -> dict[str, tuple[str, str]]:
    """A Workload's conditions: type → (status, reason)."""
    return {c["type"]: (c["status"], c["reason"]) for c in workload.get("status", {}).get("conditions", [])}


def worker_pods(cluster, namespace: str, job: str) -> list[dict]:
    core = client.CoreV1Api(cluster.api)
    selector = f"largebatch.io/job={job},largebatch.io/role=worker"
    return [p.to_dict() for p in core.list_namespaced_pod(namespace, label_selector=selector).items]


def second_started(cluster, namespace: str) -> str:
    return status_of(cluster, namespace, "second")["startTime"]


def step(cluster, namespace: str, job: str) -> int:
    return status_of(cluster, namespace, job).get("progress", {}).get("step", 0)


def test_a_job_waits_for_its_queue_and_starts_when_the_first_ends(kueue, namespace, operator_kubeconfig, tmp_path):
    """Two jobs of 2 GPUs each in a queue of 2: the second waits, with the condition that says for what,
    and starts when the first's Workload is finished. A third job without the label runs beside them on a
    third GPU, with no Workload."""
    first_total, second_total, free_total = 32 * 300, 32 * 300, 16 * 300
    for name in ("first", "second", "free"):
        shared_claim(kueue, namespace, f"ckpt-{name}")
    with queue(kueue, namespace, gpus=3, quota=2) as (cluster_queue, nodes), \
            PodRunner(kueue, namespace, tmp_path / "pods") as pods:  # fmt: skip
        operator = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log")
        explain = dict(cluster=kueue, namespace=namespace, pods=pods, log_path=operator.log)
        try:
            assert apply(kueue, queued("first", 32, first_total), namespace).returncode == 0
            wait_or_explain(lambda: world(kueue, namespace, "first") == 2, "the first job on its 2 GPUs",
                            name="first", **explain)  # fmt: skip
            # Its workers run where the flavor put them, and only as many as Kueue admitted.
            first = status_of(kueue, namespace, "first")
            assert first["queue"]["admitted"] == 2 and first["queue"]["clusterQueue"] == cluster_queue
            assert all(p["spec"]["node_selector"] == {POOL_LABEL: cluster_queue}
                       for p in worker_pods(kueue, namespace, "first"))  # fmt: skip
            # Its trainers held still while the others are looked at, however fast this machine trains.
            with contextlib.ExitStack() as held:
                for worker in ("first-worker-0", "first-worker-1"):
                    held.enter_context(pods.paused(worker))
                assert apply(kueue, queued("second", 32, second_total), namespace).returncode == 0
                free = queued("free", 16, free_total, labels={})
                free["spec"]["workers"]["pod"]["affinity"] = on_nodes(nodes)
                assert apply(kueue, free, namespace).returncode == 0

                waiting = lambda: (condition(kueue, namespace, "second", "QueuedByKueue") or {}).get("status") == "True"  # noqa: E731
                wait_or_explain(waiting, "the second job to wait for its queue", name="second", **explain)
                said = condition(kueue, namespace, "second", "QueuedByKueue")
                assert said["reason"] == "QueuedByKueue"
                assert said["message"].startswith(f"waiting in {QUEUE} for 2 nvidia.com/gpu"), said
                second = status_of(kueue, namespace, "second")
                assert second["phase"] == "Queued" and second["queue"] == {"name": QUEUE, "admitted": 0, "requested": 2,
                                                                           "workload": "second-0"}  # fmt: skip
                wait_or_explain(lambda: world(kueue, namespace, "free") == 1, "the unlabelled job training",
                                name="free", **explain)  # fmt: skip
                assert workloads(kueue, namespace, "free") == [] and "queue" not in status_of(kueue, namespace, "free")

                assert worker_pods(kueue, namespace, "second") == []

            wait_until_succeeded(kueue, namespace, "first", pods, operator.log)
            assert conditions(workloads(kueue, namespace, "first")[-1])["Finished"] == ("True", "Succeeded")
            wait_until_succeeded(kueue, namespace, "second", pods, operator.log)
            wait_until_succeeded(kueue, namespace, "free", pods, operator.log)
            assert conditions(workloads(kueue, namespace, "second")[-1])["Finished"] == ("True", "Succeeded")
            ended, started = status_of(kueue, namespace, "first")["completionTime"], second_started(kueue, namespace)
            assert started >= ended, (started, ended)
            assert pods.errors == []
        finally:
            operator.stop()
    for name, total in (("first", first_total), ("second", second_total), ("free", free_total)):
        finished_whole(kueue, namespace, name, total, tmp_path)


def test_a_growing_job_runs_with_accumulation_until_its_quota_allows_more(
    kueue, namespace, operator_kubeconfig, tmp_path
):
    """A job whose batch grows from 16 to 32 in a queue of one GPU asks Kueue for a second worker (a new
    Workload slice) and, until the quota is raised, trains at batch 32 on one worker with two micro-batches
    per step; then it grows to two, and Kueue finishes the slice the new one replaced."""
    total = 16 * 100 + 32 * 400
    shared_claim(kueue, namespace, "ckpt-grower")
    ramp = {"type": "linearRamp", "linearRamp": {"increment": 16, "rampSamples": 16 * 100}}
    with queue(kueue, namespace, gpus=2, quota=1) as (cluster_queue, _), \
            PodRunner(kueue, namespace, tmp_path / "pods") as pods:  # fmt: skip
        operator = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log")
        explain = dict(cluster=kueue, namespace=namespace, pods=pods, log_path=operator.log, name="grower")
        try:
            document = queued("grower", 16, total, policy=ramp)
            document["spec"]["batch"]["max"] = 32
            assert apply(kueue, document, namespace).returncode == 0

            def accumulating() -> bool:
                plan = status_of(kueue, namespace, "grower").get("plan", {})
                asking = (condition(kueue, namespace, "grower", "QueuedByKueue") or {}).get("status") == "True"
                return asking and (plan.get("globalBatch"), plan.get("worldSize"), plan.get("accumulationSteps")) == (
                    32, 1, 2)  # fmt: skip

            wait_or_explain(accumulating, "batch 32 on one worker, two micro-batches a step, asking for more",
                            **explain)  # fmt: skip
            said = condition(kueue, namespace, "grower", "QueuedByKueue")
            assert said["status"] == "True" and "waiting for 1 more nvidia.com/gpu" in said["message"], said
            assert status_of(kueue, namespace, "grower")["queue"] | {"workload": None} == {
                "name": QUEUE,
                "clusterQueue": cluster_queue,
                "admitted": 1,
                "requested": 2,
                "workload": None,
            }
            slices = workloads(kueue, namespace, "grower")
            assert [s["spec"]["podSets"][0]["count"] for s in slices] == [1, 2]
            assert slices[1]["metadata"]["annotations"][f"{KUEUE}/workload-slice-replacement-for"] == \
                f"{namespace}/{slices[0]['metadata']['name']}"  # fmt: skip
            assert len(worker_pods(kueue, namespace, "grower")) == 1  # never more than admitted

            raised = {"spec": {"resourceGroups": resource_groups(cluster_queue, 2)}}
            kueue.kubectl("patch", "clusterqueue", cluster_queue, "--type=merge", "-p", yaml.safe_dump(raised))
            wait_or_explain(lambda: world(kueue, namespace, "grower") == 2, "the job grown to two workers", **explain)
            slices = workloads(kueue, namespace, "grower")
            assert conditions(slices[0])["Finished"] == ("True", "WorkloadSliceReplaced")
            assert conditions(slices[1])["Admitted"][0] == "True"
            assert condition(kueue, namespace, "grower", "QueuedByKueue")["status"] == "False"
            wait_until_succeeded(kueue, namespace, "grower", pods, operator.log)
            assert conditions(workloads(kueue, namespace, "grower")[-1])["Finished"] == ("True", "Succeeded")
            assert pods.errors == []
        finally:
            operator.stop()
    finished_whole(kueue, namespace, "grower", total, tmp_path)
    runs = history(tmp_path, "ckpt-grower")
    assert {(batch, workers) for _, _, batch, workers, _ in runs} >= {(32, 1), (32, 2)}


def test_a_preempted_job_checkpoints_waits_and_resumes_with_nothing_lost(
    kueue, namespace, operator_kubeconfig, tmp_path
):
    """A low-priority job holds the queue's 2 GPUs; a high-priority one arrives; Kueue preempts the low
    one, whose workers checkpoint and stop, and which gives its reservation back; the high job runs to the
    end, then the low one is admitted again and finishes, every sample once, in order."""
    low_total, high_total = 32 * 600, 32 * 300
    for name in ("low", "high"):
        shared_claim(kueue, namespace, f"ckpt-{name}")
    with queue(kueue, namespace, gpus=2, quota=2, priorities={"low": 10, "high": 1000}) as (cluster_queue, _), \
            PodRunner(kueue, namespace, tmp_path / "pods") as pods:  # fmt: skip
        operator = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log")
        explain = dict(cluster=kueue, namespace=namespace, pods=pods, log_path=operator.log)

        def job(name: str, total: int) -> dict:
            labels = {f"{KUEUE}/queue-name": QUEUE, f"{KUEUE}/priority-class": f"{cluster_queue}-{name}"}
            return queued(name, 32, total, labels=labels)

        try:
            assert apply(kueue, job("low", low_total), namespace).returncode == 0
            training = lambda: world(kueue, namespace, "low") == 2 and step(kueue, namespace, "low") > 100  # noqa: E731
            wait_or_explain(training, "the low job training on both GPUs", name="low", **explain)
            assert workloads(kueue, namespace, "low")[0]["spec"]["priority"] == 10

            # Its trainers held still until Kueue has preempted it, however fast this machine trains.
            with contextlib.ExitStack() as held:
                for worker in ("low-worker-0", "low-worker-1"):
                    held.enter_context(pods.paused(worker))
                assert apply(kueue, job("high", high_total), namespace).returncode == 0
                evicted = lambda: (condition(kueue, namespace, "low", "QueuedByKueue") or {}).get("reason") == "Evicted"  # noqa: E731
                wait_or_explain(evicted, "Kueue to preempt the low job", name="low", **explain)
            stopped = step(kueue, namespace, "low")
            said = condition(kueue, namespace, "low", "QueuedByKueue")["message"]
            assert said.startswith("evicted by Kueue (Preempted)"), said
            wait_or_explain(lambda: world(kueue, namespace, "high") == 2, "the high job on the 2 GPUs", name="high",
                            **explain)  # fmt: skip
            low = workloads(kueue, namespace, "low")[0]
            assert (
                conditions(low)["Requeued"] == ("True", "Preempted") and conditions(low)["QuotaReserved"][0] == "False"
            )
            wait_until_succeeded(kueue, namespace, "high", pods, operator.log)

            # Admitted again, it goes on from its checkpoint: no report goes back before where it stopped.
            steps = []
            going_on = lambda: steps.append(step(kueue, namespace, "low")) or steps[-1] > stopped + 20  # noqa: E731
            wait_or_explain(going_on, "the low job training again", name="low", **explain)
            assert min(steps) >= stopped, (stopped, steps)
            wait_until_succeeded(kueue, namespace, "low", pods, operator.log)
            assert status_of(kueue, namespace, "low")["workers"]["round"] == 2  # a second start, from no workers
            assert pods.errors == []
        finally:
            operator.stop()
    for name, total in (("low", low_total), ("high", high_total)):
        finished_whole(kueue, namespace, name, total, tmp_path)
