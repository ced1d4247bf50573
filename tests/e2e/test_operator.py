"""The operator on the real control plane, with real training: `kubectl apply` a small job, the
operator creates the rendezvous store and the workers, the real scheduler places them on fake GPU
nodes, the pod runner trains them as local processes, rank 0 reports with its status-only token, the
operator adds a worker when the batch grows, and the job succeeds having used every sample."""

from __future__ import annotations

import pytest
from kubernetes import client

from largebatch import api
from largebatch_trainer import checkpoint
from tests import helpers
from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import apply
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

TOTAL = 16 * 8_000
"""Steps enough that a job outlasts what a test does to it: the suspend acted on (thousands of steps
after the test saw step 200), a lost worker replaced (the group stalls at min = max = 2 until it is), a
cut's new worker joined (a small GPT's steps, slow enough for that)."""
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def job_document(name: str, claim: str | None, total: int = TOTAL, **workers) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": name},
        "spec": {
            "image": "largebatch-trainer:test",
            "task": {"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"dim": 64, "samples": 65_536}},
            "workers": {"min": 1, "max": 2, "accelerator": "nvidia.com/gpu", "pod": {"tolerations": [KWOK_TOLERATION]}}
            | workers,
            "batch": {"initial": 16, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "seesaw"}},
            "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            "schedule": {"totalSamples": total, "warmupSamples": 320, "decay": "cosine", "minLrRatio": 0.1},
            "checkpoint": {"path": "/ckpt", "everySteps": 50} | ({"claimName": claim} if claim else {}),
        },
    }


def shared_claim(cluster, namespace: str, name: str) -> None:
    """A ReadWriteMany claim bound to a static volume (the pod runner gives it one shared folder)."""
    core = client.CoreV1Api(cluster.api)
    core.create_persistent_volume({
        "metadata": {"name": f"{namespace}-{name}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                 "hostPath": {"path": f"/tmp/{namespace}-{name}"},
                 "claimRef": {"namespace": namespace, "name": name}},
    })  # fmt: skip
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual", "volumeName": f"{namespace}-{name}",
                 "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    wait_for(lambda: core.read_namespaced_persistent_volume_claim(name, namespace).status.phase == "Bound",
             what="the claim bound")  # fmt: skip


@pytest.fixture
def operator(operator_kubeconfig, namespace, tmp_path):
    process = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log")
    yield process
    process.stop()


def status_of(cluster, namespace: str, name: str) -> dict:
    custom = client.CustomObjectsApi(cluster.api)
    return custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name).get("status") or {}


def test_an_applied_job_trains_grows_at_the_cut_and_succeeds(crd, namespace, operator, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        # A small GPT rather than linreg: steps slow enough that the half of the run after the cut outlasts
        # a new worker's start and rendezvous on a busy machine (linreg finished first in CI).
        document = job_document("grow", "checkpoints", total=TOTAL)
        document["spec"]["task"] = {"entrypoint": "largebatch_trainer.tasks:pylm",
                                    "args": {"width": 32, "depth": 1, "heads": 2, "context": 32}}  # fmt: skip
        document["spec"]["optimizer"] = {"name": "adamw", "lr": 0.003}
        assert apply(crd, document, namespace).returncode == 0
        try:
            # 8,000 steps on two workers beside the process tests and the real node's own: minutes (CI).
            wait_for(lambda: status_of(crd, namespace, "grow").get("phase") == "Succeeded", timeout=600,
                     what="the job to succeed")  # fmt: skip
        except AssertionError:
            logs = "\n".join(f"--- {p}\n{pods.log(p)[-2000:]}" for p in pods.started)
            raise AssertionError(f"{status_of(crd, namespace, 'grow')}\n{pods.errors}\n{logs}\n--- operator\n"
                                 f"{operator.tail(4000)}") from None  # fmt: skip
        assert pods.errors == []
        assert {"grow-rdzv", "grow-worker-0", "grow-worker-1"} <= set(pods.started)
    status = status_of(crd, namespace, "grow")
    assert status["progress"]["samples"] == TOTAL and status["progress"]["done"] is True
    assert status["rescales"]["count"] >= 1 and status["rescales"]["recent"][0]["to"] == 2
    state = checkpoint.newest_intact(tmp_path / "pods" / "pvc-checkpoints")[1]
    worlds = [run[3] for run in state["history"]]
    assert worlds[0] == 1 and 2 in worlds, state["history"]
    batches = [run[2] for run in state["history"]]
    assert batches[0] == 16 and batches[-1] == 32
    # Done: the workers and the store are gone, the status stays.
    core = client.CoreV1Api(crd.api)
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp],
             what="the job's pods removed")  # fmt: skip


def wait_or_explain(condition, what: str, cluster, namespace: str, name: str, pods: PodRunner, log_path, timeout=300):
    """wait_for, and on a timeout the job's status, the pods' logs and the operator's log."""
    try:
        return wait_for(condition, timeout=timeout, what=what)
    except AssertionError:
        logs = "\n".join(f"--- {p}\n{pods.log(p)[-1500:]}" for p in dict.fromkeys(pods.started))
        raise AssertionError(f"timed out waiting for {what}\n{status_of(cluster, namespace, name)}\n{pods.errors}\n"
                             f"{logs}\n--- operator\n{log_path.read_text()[-3000:]}") from None  # fmt: skip


def history(tmp_path) -> list[list[int]]:
    return checkpoint.newest_intact(tmp_path / "pods" / "pvc-checkpoints")[1]["history"]


def contiguous(runs: list[list[int]], total: int) -> bool:
    """The trainer's step history (first sample, batch, steps per run) covers the stream exactly."""
    return helpers.contiguous([(first, first + batch * steps) for _, first, batch, _, steps in runs], total,
                              last_batch=runs[-1][2])  # fmt: skip


def test_the_trainers_token_may_patch_its_jobs_status_and_nothing_else(crd, namespace, operator):
    assert apply(crd, job_document("rights", None), namespace).returncode == 0
    core = client.CoreV1Api(crd.api)
    accounts = lambda: core.list_namespaced_service_account(namespace, field_selector="metadata.name=rights-trainer")  # noqa: E731
    wait_for(lambda: accounts().items, what="the trainer account")
    trainer = f"system:serviceaccount:{namespace}:rights-trainer"

    def can(*args: str) -> bool:
        result = crd.kubectl("auth", "can-i", f"--as={trainer}", "-n", namespace, *args, check=False)
        return result.stdout.strip() == "yes"

    wait_for(lambda: can("patch", "largebatchjobs.largebatch.io/rights", "--subresource=status"), what="the binding")
    assert can("get", "largebatchjobs.largebatch.io/rights", "--subresource=status")
    assert not can("patch", "largebatchjobs.largebatch.io/other", "--subresource=status")
    assert not can("patch", "largebatchjobs.largebatch.io/rights")  # the spec: no
    assert not can("get", "secrets") and not can("list", "pods") and not can("list", "largebatchjobs.largebatch.io")


def test_suspend_resume_and_delete(crd, namespace, operator, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    core = client.CoreV1Api(crd.api)
    custom = client.CustomObjectsApi(crd.api)
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, job_document("pause", "checkpoints"), namespace).returncode == 0
        explain = dict(cluster=crd, namespace=namespace, name="pause", pods=pods, log_path=operator.log)
        wait_or_explain(lambda: status_of(crd, namespace, "pause").get("progress", {}).get("step", 0) > 200,
                        "training", **explain)  # fmt: skip
        custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "pause",
                                              {"spec": {"suspend": True}})  # fmt: skip
        wait_or_explain(lambda: status_of(crd, namespace, "pause").get("phase") == "Suspended"
                        and not [p for p in core.list_namespaced_pod(namespace).items if "worker" in p.metadata.name],
                        "the workers gone", **explain)  # fmt: skip
        # KWOK removes a deleted pod at once; a kubelet would keep it until its process ended. Wait for that.
        wait_for(lambda: not [n for n in pods.running if "worker" in n], what="the workers' processes to end")
        stopped = status_of(crd, namespace, "pause")["progress"]["samples"]
        assert 0 < stopped < TOTAL
        assert checkpoint.newest_intact(tmp_path / "pods" / "pvc-checkpoints")[1]["progress"]["samples"] == stopped
        custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "pause",
                                              {"spec": {"suspend": False}})  # fmt: skip
        wait_or_explain(lambda: status_of(crd, namespace, "pause").get("phase") == "Succeeded", "the job to succeed",
                        **explain)  # fmt: skip
    assert status_of(crd, namespace, "pause")["progress"]["samples"] == TOTAL
    assert contiguous(history(tmp_path), TOTAL)  # resumed at the exact sample: nothing skipped or repeated
    crd.kubectl("delete", "lbj", "pause", "-n", namespace, "--wait=true")
    rbac = client.RbacAuthorizationV1Api(crd.api)
    wait_for(
        lambda: (
            not core.list_namespaced_config_map(namespace, label_selector="largebatch.io/job=pause").items
            and not core.list_namespaced_service(namespace, label_selector="largebatch.io/job=pause").items
            and not core.list_namespaced_service_account(namespace, label_selector="largebatch.io/job=pause").items
            and not rbac.list_namespaced_role(namespace, label_selector="largebatch.io/job=pause").items
        ),
        what="everything the job created removed",
    )


def test_a_lost_worker_and_a_killed_operator_lose_nothing(crd, namespace, operator_kubeconfig, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    core = client.CoreV1Api(crd.api)
    log_path = tmp_path / "operator.log"
    operator = OperatorProcess.start(operator_kubeconfig, namespace, log_path)
    try:
        with PodRunner(crd, namespace, tmp_path / "pods") as pods:
            assert apply(crd, job_document("lose", "checkpoints", min=2, max=2), namespace).returncode == 0
            explain = dict(cluster=crd, namespace=namespace, name="lose", pods=pods, log_path=log_path)
            wait_or_explain(lambda: status_of(crd, namespace, "lose").get("plan", {}).get("worldSize") == 2
                            and status_of(crd, namespace, "lose")["progress"]["step"] > 300, "two workers training",
                            **explain)  # fmt: skip
            core.delete_namespaced_pod("lose-worker-1", namespace)  # a lost worker
            operator.stop(kill=True)  # and the operator, while it has to replace it
            operator = OperatorProcess.start(operator_kubeconfig, namespace, log_path)
            wait_or_explain(lambda: status_of(crd, namespace, "lose").get("phase") == "Succeeded",
                            "the job to succeed", **explain)  # fmt: skip
            assert pods.started.count("lose-worker-1") == 2  # replaced once, under its own name
            assert pods.started.count("lose-worker-0") == 1 and pods.started.count("lose-rdzv") == 1
    finally:
        operator.stop()
    assert status_of(crd, namespace, "lose")["progress"]["samples"] == TOTAL
    assert contiguous(history(tmp_path), TOTAL)


def test_too_few_gpus_caps_the_job_and_a_new_node_lets_it_grow(crd, namespace, operator, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    nodes = [f"{namespace[:40]}-a", f"{namespace[:40]}-b"]
    crd.add_node(nodes[0], gpus=1)
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}]}}}  # fmt: skip
    pod = {"tolerations": [KWOK_TOLERATION], "affinity": affinity}
    total = 32 * 10_000  # at one worker with accumulation 2, long enough for the second node's worker to join
    document = job_document("cap", "checkpoints", total=total, min=1, max=2, pod=pod)
    document["spec"]["batch"] = {"initial": 32, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "constant"}}
    try:
        with PodRunner(crd, namespace, tmp_path / "pods") as pods:
            assert apply(crd, document, namespace).returncode == 0  # batch 32 wants 2 one-GPU workers; 1 fits
            explain = dict(cluster=crd, namespace=namespace, name="cap", pods=pods, log_path=operator.log)

            def limited() -> dict | None:
                status = status_of(crd, namespace, "cap")
                conditions = status.get("conditions", [])
                return (
                    status
                    if any(c["type"] == "CapacityLimited" and c["status"] == "True" for c in conditions)
                    else None
                )

            status = wait_or_explain(limited, "CapacityLimited", **explain)
            condition = next(c for c in status["conditions"] if c["type"] == "CapacityLimited")
            assert condition["message"] in (
                "batch 32 needs 2 workers, 1 fit: accumulation 2",
                "capacity fell to 1 workers",
            )
            assert status["capacity"] == 1  # measured in the same reconcile that set the condition
            wait_or_explain(lambda: status_of(crd, namespace, "cap").get("plan", {}).get("accumulationSteps") == 2,
                            "one worker training with accumulation 2", **explain)  # fmt: skip
            assert status_of(crd, namespace, "cap")["plan"]["worldSize"] == 1
            crd.add_node(nodes[1], gpus=1)
            wait_or_explain(lambda: status_of(crd, namespace, "cap").get("plan", {}).get("worldSize") == 2,
                            "the job to grow on the new node", **explain)  # fmt: skip
            wait_or_explain(lambda: status_of(crd, namespace, "cap").get("phase") == "Succeeded",
                            "the job to succeed", **explain)  # fmt: skip
    finally:
        for node in nodes:
            crd.kubectl("delete", "node", node, "--ignore-not-found", "--wait=true")
    runs = history(tmp_path)
    assert contiguous(runs, total)
    assert [world for *_, world, _ in runs][0] == 1 and runs[-1][3] == 2  # accumulation carried the batch, then 2
