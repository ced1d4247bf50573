"""The operator on the real control plane, with real training: `kubectl apply` a small job, the
operator creates the rendezvous store and the workers, the real scheduler places them on fake GPU
nodes, the pod runner trains them as local processes, rank 0 reports with its status-only token, the
operator adds a worker when the batch grows, and the job succeeds having used every sample."""

from __future__ import annotations

import pytest
from kubernetes import client

from largebatch import api
from largebatch_trainer import checkpoint
from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import (
    GROWING_TOTAL,
    KWOK_TOLERATION,
    apply,
    contiguous,
    growing_job,
    history,
    job_document,
    on_nodes,
    shared_claim,
    status_of,
    wait_or_explain,
    wait_until_succeeded,
)
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import simulated_task, wait_for

pytestmark = pytest.mark.e2e

TOTAL = 16 * 1_500
"""The samples of the jobs below that train the simulated task at SECONDS_PER_SAMPLE: 1,500 steps at
batch 16, 24 s on one worker. Steps that wait rather than compute (linreg trained flat out: 8,000 steps
and 26 to 64 CPU s a test), long enough for what each test does while the job runs, and no longer: the
control plane, the operator and the agents cost CPU for every second a test lasts."""
SECONDS_PER_SAMPLE = 0.001


def paced(name: str, claim: str | None, total: int = TOTAL, **workers) -> dict:
    """job_document training the simulated task at SECONDS_PER_SAMPLE."""
    document = job_document(name, claim, total, **workers)
    document["spec"]["task"] = simulated_task(SECONDS_PER_SAMPLE)
    return document


def test_an_applied_job_trains_grows_at_the_cut_and_succeeds(crd, namespace, operator, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, growing_job("grow", "checkpoints"), namespace).returncode == 0
        wait_until_succeeded(crd, namespace, "grow", pods, operator.log)
        assert pods.errors == []
        assert {"grow-rdzv", "grow-worker-0", "grow-worker-1"} <= set(pods.started)
    status = status_of(crd, namespace, "grow")
    assert status["progress"]["samples"] == GROWING_TOTAL and status["progress"]["done"] is True
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
        assert apply(crd, paced("pause", "checkpoints"), namespace).returncode == 0
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
        suspended = pods.log("pause-worker-0")  # a stop, not a crash: no traceback of the agent's
        assert "torchrun agent stopped by SIGTERM" in suspended and "Traceback" not in suspended, suspended
        stopped = status_of(crd, namespace, "pause")["progress"]["samples"]
        assert 0 < stopped < TOTAL
        assert checkpoint.newest_intact(tmp_path / "pods" / "pvc-checkpoints")[1]["progress"]["samples"] == stopped
        custom.patch_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "pause",
                                              {"spec": {"suspend": False}})  # fmt: skip
        wait_until_succeeded(**explain)
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
            assert apply(crd, paced("lose", "checkpoints", min=2, max=2), namespace).returncode == 0
            explain = dict(cluster=crd, namespace=namespace, name="lose", pods=pods, log_path=log_path)
            wait_or_explain(lambda: status_of(crd, namespace, "lose").get("plan", {}).get("worldSize") == 2
                            and status_of(crd, namespace, "lose")["progress"]["step"] > 300, "two workers training",
                            **explain)  # fmt: skip
            core.delete_namespaced_pod("lose-worker-1", namespace)  # a lost worker
            operator.stop(kill=True)  # and the operator, while it has to replace it
            operator = OperatorProcess.start(operator_kubeconfig, namespace, log_path)
            wait_until_succeeded(**explain)
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
    pod = {"tolerations": [KWOK_TOLERATION], "affinity": on_nodes(nodes)}
    total = 32 * 1_500  # at one worker with accumulation 2 (32 ms a step), long enough for a new worker to join
    document = paced("cap", "checkpoints", total=total, min=1, max=2, pod=pod)
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
            wait_until_succeeded(**explain)
    finally:
        for node in nodes:
            crd.kubectl("delete", "node", node, "--ignore-not-found", "--wait=true")
    runs = history(tmp_path)
    assert contiguous(runs, total)
    assert [world for *_, world, _ in runs][0] == 1 and runs[-1][3] == 2  # accumulation carried the batch, then 2
