"""What takes a running job's pods away on a real cluster: its rendezvous pod deleted, a worker preempted
by the real scheduler for a pod of higher priority, a node lost (its heartbeats stopped, then the node
deleted). Real training through the pod runner, on one-GPU nodes of the test's own."""

from __future__ import annotations

import time

import pytest
from kubernetes import client

from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import (
    KWOK_TOLERATION,
    apply,
    condition,
    contiguous,
    gpu_pool,
    history,
    job_document,
    on_nodes,
    shared_claim,
    status_of,
    wait_or_explain,
    wait_until_succeeded,
)
from tests.helpers import resumed_steps, resumed_where_stopped, simulated_task, wait_for

pytestmark = pytest.mark.e2e

TOTAL = 32 * 1_200
"""1,200 steps of the simulated task at 2 ms a sample (32 ms a step at two workers, 64 at one): long
enough for both faults of the first test, in a tenth of linreg's 12,000 steps flat out. Not longer: an
e2e test's control plane, operator and agents cost CPU for every second it lasts (3,000 steps here took
254 s and 70 CPU s against linreg's 108 s and 56)."""
EVERY = 50  # checkpoint.everySteps of job_document


def two_worker_job(
    name: str,
    nodes: list[str],
    tolerations: tuple[dict, ...] = (),
    total: int = TOTAL,
    seconds_per_sample: float = 0.002,
) -> dict:
    """Batch 32 of micro-batches of 16: two one-GPU workers, or one with accumulation 2."""
    pod = {"tolerations": [KWOK_TOLERATION, *tolerations], "affinity": on_nodes(nodes)}
    document = job_document(name, "checkpoints", total=total, min=1, max=2, pod=pod)
    document["spec"]["batch"] = {"initial": 32, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "constant"}}
    document["spec"]["task"] = simulated_task(seconds_per_sample)
    return document


def plan(cluster, namespace: str, name: str) -> dict:
    return status_of(cluster, namespace, name).get("plan", {})


def step(cluster, namespace: str, name: str) -> int:
    return status_of(cluster, namespace, name).get("progress", {}).get("step", 0)


def create_once_admitted(create) -> None:
    """`create` a pod naming a PriorityClass just made: the API server's Priority admission reads classes
    from its informer's cache, which can lag the class's creation, and refuses the pod (403, "no
    PriorityClass with name ... was found") until the cache has it (CI, 2026-12-04)."""

    def created() -> bool:
        try:
            create()
        except client.ApiException as exc:
            if exc.status == 403 and "no PriorityClass" in (exc.body or ""):
                return False
            raise
        return True

    wait_for(created, what="the API server to admit a pod of the new PriorityClass")


def test_the_rendezvous_pod_deleted_then_a_worker_preempted_lose_nothing(crd, namespace, operator, tmp_path):
    """The rendezvous pod deleted while two workers train: the operator starts another behind the same
    Service, and the agents, which trained on without it, rejoin it after a checkpoint; no worker fails.
    Then a pod of higher priority needs a GPU: the scheduler preempts a worker with its grace period, the
    worker stops after a checkpoint, and the job goes on at one worker with accumulation 2 (its
    replacement cannot be placed), having redone no step."""
    shared_claim(crd, namespace, "checkpoints")
    core, scheduling = client.CoreV1Api(crd.api), client.SchedulingV1Api(crd.api)
    workers = ["faults-worker-0", "faults-worker-1"]
    with gpu_pool(crd, namespace, 2) as nodes, PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, two_worker_job("faults", nodes), namespace).returncode == 0
        explain = dict(cluster=crd, namespace=namespace, name="faults", pods=pods, log_path=operator.log)
        wait_or_explain(lambda: plan(crd, namespace, "faults").get("worldSize") == 2
                        and step(crd, namespace, "faults") > 200, "two workers training", **explain)  # fmt: skip

        core.delete_namespaced_pod("faults-rdzv", namespace)
        wait_or_explain(lambda: pods.started.count("faults-rdzv") == 2, "the rendezvous pod recreated", **explain)
        wait_or_explain(lambda: all("back: the workers stop after a checkpoint" in pods.log(w) for w in workers),
                        "both agents to rejoin the new store", **explain)  # fmt: skip
        rejoined = step(crd, namespace, "faults")
        wait_or_explain(lambda: plan(crd, namespace, "faults").get("worldSize") == 2
                        and step(crd, namespace, "faults") > rejoined + 100, "two workers training again",
                        **explain)  # fmt: skip
        assert [pods.started.count(w) for w in workers] == [1, 1]  # the agents rejoined; no pod was replaced

        urgent = f"{namespace[:40]}-urgent"
        scheduling.create_priority_class({"metadata": {"name": urgent}, "value": 1_000_000})
        try:
            create_once_admitted(lambda: core.create_namespaced_pod(namespace, {
                "metadata": {"name": "urgent"},
                "spec": {"priorityClassName": urgent, "tolerations": [KWOK_TOLERATION], "affinity": on_nodes(nodes),
                         "containers": [{"name": "main", "image": "serving",
                                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            }))  # fmt: skip
            events = lambda: core.list_namespaced_event(namespace).items  # noqa: E731
            preempted = wait_for(lambda: [e.involved_object.name for e in events() if e.reason == "Preempted"],
                                 what="the scheduler to preempt a worker")  # fmt: skip
            assert preempted[0] in workers
            wait_or_explain(lambda: plan(crd, namespace, "faults").get("accumulationSteps") == 2
                            and plan(crd, namespace, "faults").get("worldSize") == 1,
                            "the job to go on at one worker with accumulation 2", **explain)  # fmt: skip
            # The trainer can go on at one worker before the operator has seen the replacement refused for its
            # grace period: wait for the condition rather than read it once.
            wait_or_explain(lambda: (condition(crd, namespace, "faults", "CapacityLimited") or {}).get("status")
                            == "True", "the job marked CapacityLimited", **explain)  # fmt: skip
            wait_until_succeeded(**explain)
        finally:
            scheduling.delete_priority_class(urgent)
        assert pods.errors == [] and operator.process.poll() is None
        logs = "".join(pods.log(w) for w in workers)
    resumed_where_stopped(logs)
    status = status_of(crd, namespace, "faults")
    assert status["workers"]["restarts"] == 0  # neither fault counted against workers.maxRestarts
    assert status["progress"]["samples"] == TOTAL
    assert contiguous(history(tmp_path), TOTAL)


LONGER = 32 * 1_500
SECONDS_PER_SAMPLE = 0.004
"""Simulated training (a sleep per sample, 128 ms a step at one worker): once the survivor goes on alone,
its rest of the run lasts about three minutes, long enough for the replacement to join it on a busy
machine (about a minute after the loss), and it uses little CPU meanwhile (linreg trained flat out for
the whole of this test's 210 s). Few slow steps: a step costs CPU whatever its sleep, and 6,000 steps of
a quarter the time took 89 CPU s on a busy machine."""
COLLECTIVE_TIMEOUT = 20
"""workers.collectiveTimeoutSeconds: the survivor stalls this long, not the default 120 s."""
UNREACHABLE_AFTER = 10
"""tolerationSeconds of the job's tolerations for an unreachable or not-ready node: the API server's
default (DefaultTolerationSeconds) is 300."""


def test_a_lost_node_stalls_the_job_until_its_peers_time_out_and_its_worker_is_replaced(
    crd, namespace, operator, tmp_path
):
    """A node stops answering (its processes frozen, its heartbeats stopped): the other worker waits in its
    collective until that times out (the job's workers.collectiveTimeoutSeconds) and its agent restarts it
    alone, from the newest checkpoint, with accumulation 2. The node-lifecycle controller marks the node
    unreachable at most 50 s after its last heartbeat and evicts its worker after the job's toleration of
    10 s; the evicted pod stays (Terminating) while its node exists. Once the node is deleted (as a
    cloud's node controller does when the machine is gone), the pod garbage collector removes the evicted
    pod and the operator places its replacement on the spare node."""
    shared_claim(crd, namespace, "checkpoints")
    core = client.CoreV1Api(crd.api)
    tolerations = tuple({"key": f"node.kubernetes.io/{taint}", "operator": "Exists", "effect": "NoExecute",
                         "tolerationSeconds": UNREACHABLE_AFTER} for taint in ("unreachable", "not-ready"))  # fmt: skip
    with gpu_pool(crd, namespace, 3, losable=True) as nodes, PodRunner(crd, namespace, tmp_path / "pods") as pods:
        document = two_worker_job("lost", nodes, tolerations, LONGER, SECONDS_PER_SAMPLE)
        document["spec"]["workers"]["collectiveTimeoutSeconds"] = COLLECTIVE_TIMEOUT
        assert apply(crd, document, namespace).returncode == 0
        explain = dict(cluster=crd, namespace=namespace, name="lost", pods=pods, log_path=operator.log)
        wait_or_explain(lambda: plan(crd, namespace, "lost").get("worldSize") == 2
                        and step(crd, namespace, "lost") > 200 and history(tmp_path), "two workers training",
                        **explain)  # fmt: skip
        node = core.read_namespaced_pod("lost-worker-1", namespace).spec.node_name
        assert pods.lose_node(node) == ["lost-worker-1"]
        crd.lose_node(node)
        lost_at, at_step = time.monotonic(), step(crd, namespace, "lost")
        alone = lambda: plan(crd, namespace, "lost").get("worldSize") == 1  # noqa: E731
        wait_or_explain(lambda: alone() and plan(crd, namespace, "lost").get("accumulationSteps") == 2,
                        "the survivor going on alone, its collective timed out", timeout=180, **explain)  # fmt: skip
        alone_after = time.monotonic() - lost_at

        def evicted() -> bool:
            pod = core.read_namespaced_pod("lost-worker-1", namespace)
            return pod.spec.node_name == node and pod.metadata.deletion_timestamp is not None

        wait_or_explain(evicted, "the taint manager to evict the lost node's worker", timeout=180, **explain)
        evicted_after = time.monotonic() - lost_at
        crd.kubectl("delete", "node", node, "--wait=false")
        wait_or_explain(lambda: pods.started.count("lost-worker-1") == 2, "the worker replaced on the spare node",
                        timeout=180, **explain)  # fmt: skip
        wait_or_explain(lambda: plan(crd, namespace, "lost").get("worldSize") == 2, "two workers training again",
                        **explain)  # fmt: skip
        together_after = time.monotonic() - lost_at
        wait_until_succeeded(**explain)
        assert pods.errors == [] and operator.process.poll() is None
        survivor = pods.log("lost-worker-0")
    print(f"\nnode lost: the survivor alone after {alone_after:.0f} s, the worker evicted after {evicted_after:.0f} s, "
          f"two workers again after {together_after:.0f} s")  # fmt: skip
    # Alone once the job's timeout ran out (and its agent's rendezvous without the lost agent), well before
    # the default 120 s would have.
    assert COLLECTIVE_TIMEOUT < alone_after < 100, alone_after
    # Marked unreachable within the node-monitor-grace-period (50 s from its last heartbeat), then evicted after
    # the toleration: never before the toleration ran out, nor 300 s later (the API server's default).
    assert UNREACHABLE_AFTER < evicted_after < 50 + UNREACHABLE_AFTER + 30, evicted_after
    resumed = resumed_steps(survivor)
    assert resumed and resumed[-1] >= at_step - EVERY, (at_step, resumed)  # at most one checkpoint interval redone
    status = status_of(crd, namespace, "lost")
    assert status["progress"]["samples"] == LONGER
    assert contiguous(history(tmp_path), LONGER)
