"""Two replicas of the operator (kopf peering, as the chart deploys them): only the one with the
higher priority acts, and the other takes over when it stops. Each replica's own metrics say which
one reconciled, and what it saw of the job."""

from __future__ import annotations

import pytest
from kubernetes import client

from largebatch import controller
from tests.e2e.jobs import RELEASE, apply, job_document
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

PEERING = f"{RELEASE}-operator"  # the chart's name for it


def paused(operator: OperatorProcess) -> bool:
    """Not acting: never resumed (each replica starts paused), or paused again since (a replica alone in
    the peering acts until a higher one appears)."""
    log = operator.tail(20_000)
    resumed = log.rfind("Resuming operations")
    return resumed < 0 or log.rfind("Pausing operations in favour of") > resumed


def reconciles(operator: OperatorProcess) -> float:
    return operator.metric("largebatch_operator_reconcile_seconds_count") or 0.0


def test_two_replicas_one_acts_and_the_other_takes_over(crd, namespace, operator_kubeconfig, tmp_path):
    custom = client.CustomObjectsApi(crd.api)
    core = client.CoreV1Api(crd.api)
    # An operator limited to namespaces peers in each of them (kopf's rule; the chart creates these).
    custom.create_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings",
                                           {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                            "metadata": {"name": PEERING}})  # fmt: skip

    def peers() -> dict:
        peering = custom.get_namespaced_custom_object("kopf.dev", "v1", namespace, "kopfpeerings", PEERING)
        return peering.get("status") or {}

    standby = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "standby.log",
                                    LARGEBATCH_PEERING=PEERING, LARGEBATCH_PEERING_PRIORITY="10")  # fmt: skip
    leader = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "leader.log",
                                   LARGEBATCH_PEERING=PEERING, LARGEBATCH_PEERING_PRIORITY="20")  # fmt: skip
    try:
        # Each replica starts paused and resumes once the peering shows no peer above it.
        wait_for(lambda: len(peers()) == 2, what="both replicas in the peering")
        wait_for(lambda: "Resuming operations" in leader.tail(), what="the leader to act")
        wait_for(lambda: paused(standby), what="the standby to stand by")

        assert apply(crd, job_document("peer", None), namespace).returncode == 0
        pods = lambda: sorted(p.metadata.name for p in core.list_namespaced_pod(namespace).items  # noqa: E731
                              if not p.metadata.deletion_timestamp)  # fmt: skip
        wait_for(lambda: pods() == ["peer-rdzv", "peer-worker-0"], what="the leader to start the job")
        peer = {"namespace": namespace, "job_name": "peer"}
        wait_for(lambda: leader.metric("largebatch_operator_workers", **peer, state="ready"),
                 what="the leader's metrics to show the worker ready")  # fmt: skip
        assert reconciles(leader) > 0 and reconciles(standby) == 0 and paused(standby)
        start = controller.Kind.START.value
        assert leader.metric("largebatch_operator_scale_decisions_total", **peer, reason=start) == 1
        assert leader.metric("largebatch_operator_workers", **peer, state="desired") == 1
        assert leader.metric("largebatch_operator_job_phase", **peer, phase="Running") == 1
        assert leader.metric("largebatch_operator_jobs", phase="Running") == 1
        assert leader.metric("largebatch_operator_capacity_limited_jobs") == 0

        leader.stop()  # a clean stop leaves the peering at once; the standby resumes
        wait_for(lambda: not paused(standby), what="the standby to resume")
        core.delete_namespaced_pod("peer-worker-0", namespace)  # a lost worker, for the new leader
        wait_for(lambda: reconciles(standby) > 0, what="the standby to reconcile")
        wait_for(lambda: pods() == ["peer-rdzv", "peer-worker-0"], what="the worker replaced")
        worker = core.read_namespaced_pod("peer-worker-0", namespace)
        assert worker.status.phase in ("Pending", "Running")
        assert standby.metric("largebatch_operator_workers", namespace=namespace, job_name="peer", state="desired") == 1
        # The jobs carry kopf's finalizer (its timers need one): deleted while an operator runs.
        crd.kubectl("delete", "lbj", "peer", "-n", namespace, "--timeout=60s")
        wait_for(lambda: standby.metric("largebatch_operator_workers", namespace=namespace, job_name="peer",
                                        state="desired") is None, what="the deleted job's series gone")  # fmt: skip
    finally:
        for operator in (standby, leader):
            if operator.process.poll() is None:
                operator.stop()
