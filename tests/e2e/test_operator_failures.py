"""What goes wrong, on the real control plane: a worker that keeps failing fails the job with its own
last words, and bad input the CRD cannot judge (a claim or pull secret that does not exist, a
namespace quota), or a setting measured to cost accuracy, becomes a condition and an Event on the job
while the operator keeps running."""

from __future__ import annotations

import pytest
from kubernetes import client

from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import apply, condition, job_document, shared_claim, status_of
from tests.helpers import divergences_raised, wait_for

pytestmark = pytest.mark.e2e


def events(cluster, namespace: str, name: str) -> list[tuple[str, str, str]]:
    """(type, reason, message) of the job's Events. kopf posts Events from a queue of its own, after the
    status patch a test may already have seen: a test waits for an Event rather than reading it once."""
    found = client.CoreV1Api(cluster.api).list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return [(e.type, e.reason, e.message) for e in found.items]


def worker_pods(cluster, namespace: str, job: str) -> list[str]:
    pods = client.CoreV1Api(cluster.api).list_namespaced_pod(namespace, label_selector=f"largebatch.io/job={job}")
    return [p.metadata.name for p in pods.items if "-worker-" in p.metadata.name]


def test_a_worker_that_keeps_failing_fails_the_job_with_its_last_lines(crd, namespace, operator, tmp_path):
    """Beside it, a job whose loss becomes infinite fails at its first failure, restarted neither by its
    agent nor by the operator, although maxRestarts allows three: it would diverge again."""
    shared_claim(crd, namespace, "checkpoints")
    document = job_document("broken", "checkpoints", maxRestarts=0)
    document["spec"]["task"]["entrypoint"] = "largebatch_trainer.tasks:no_such_task"
    diverging = job_document("diverging", None, maxRestarts=3, max=1)
    diverging["spec"]["optimizer"]["lr"] = 100  # the most the API allows: the loss overflows within steps
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, document, namespace).returncode == 0
        assert apply(crd, diverging, namespace).returncode == 0
        failed = wait_for(lambda: condition(crd, namespace, "broken", "Failed"), timeout=240, what="Failed")
        diverged = wait_for(lambda: condition(crd, namespace, "diverging", "Failed"), timeout=240, what="diverged")
        assert pods.errors == []
        assert divergences_raised(pods.log("diverging-worker-0")) == 1  # its agent did not restart it
    assert pods.started.count("diverging-worker-0") == 1  # nor replaced by the operator
    assert diverged["reason"] == "Diverged" and "training diverged: the loss of step" in diverged["message"]
    assert status_of(crd, namespace, "diverging")["workers"]["restarts"] == 1
    assert status_of(crd, namespace, "broken")["phase"] == "Failed"
    assert failed["reason"] == "TooManyRestarts"
    # The worker's own words, from its termination message (the log tail, FallbackToLogsOnError).
    assert "1 worker failures, more than workers.maxRestarts 0" in failed["message"]
    assert "broken-worker-0:" in failed["message"] and "no_such_task" in failed["message"], failed["message"]
    wait_for(lambda: any(reason == "Failed" and "no_such_task" in message
                         for _, reason, message in events(crd, namespace, "broken")),
             what="the Failed Event")  # fmt: skip
    wait_for(lambda: not worker_pods(crd, namespace, "broken"), what="the pods removed")
    assert operator.process.poll() is None


def test_a_missing_claim_or_pull_secret_is_a_condition_and_an_event(crd, namespace, operator, tmp_path):
    """So is a setting the benchmarks measured to cost accuracy (largebatch.caveats), without stopping the job:
    the job without its claim also runs the critical-batch policy off the linear LR rule."""
    with PodRunner(crd, namespace, tmp_path / "pods"):
        noclaim = job_document("noclaim", "not-created-yet")
        noclaim["spec"]["batch"]["policy"] = {"type": "criticalBatch"}
        noclaim["spec"]["optimizer"]["scaling"] = "sqrt"
        assert apply(crd, noclaim, namespace).returncode == 0
        document = job_document("nosecret", None)
        document["spec"]["workers"]["pod"]["imagePullSecrets"] = [{"name": "registry-login"}]
        assert apply(crd, document, namespace).returncode == 0

        blocked = wait_for(lambda: condition(crd, namespace, "noclaim", "WorkersBlocked"), what="WorkersBlocked")
        assert (blocked["status"], blocked["reason"]) == ("True", "VolumeClaimNotFound")
        assert "checkpoint.claimName 'not-created-yet'" in blocked["message"]
        assert worker_pods(crd, namespace, "noclaim") == []  # no pods that could never start
        wait_for(lambda: ("Warning", "VolumeClaimNotFound", blocked["message"]) in events(crd, namespace, "noclaim"),
                 what="the VolumeClaimNotFound Event")  # fmt: skip
        reason = "CriticalBatchOffLinearRule"
        caveat = wait_for(lambda: condition(crd, namespace, "noclaim", reason), what="the caveat")
        assert caveat["status"] == "True" and "optimizer.scaling sqrt" in caveat["message"]
        wait_for(lambda: ("Warning", reason, caveat["message"]) in events(crd, namespace, "noclaim"),
                 what="the caveat's Event")  # fmt: skip

        stuck = wait_for(lambda: condition(crd, namespace, "nosecret", "WorkersBlocked"), what="the pull refused")
        assert (stuck["status"], stuck["reason"]) == ("True", "ErrImagePull")
        assert "nosecret-worker-0 cannot start" in stuck["message"] and "registry-login" in stuck["message"]

        shared_claim(crd, namespace, "not-created-yet")  # the fix: the claim appears, the workers follow
        wait_for(lambda: worker_pods(crd, namespace, "noclaim") == ["noclaim-worker-0"], what="the worker created")
        wait_for(lambda: condition(crd, namespace, "noclaim", "WorkersBlocked")["status"] == "False", what="unblocked")
    assert operator.process.poll() is None  # reported, never crashed on


def test_a_namespace_quota_is_a_condition_and_the_job_starts_when_it_is_raised(crd, namespace, operator):
    core = client.CoreV1Api(crd.api)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "pods"}, "spec": {"hard": {"pods": "1"}}})
    # The quota controller must have counted the namespace before the API server admits pods against it.
    wait_for(lambda: (core.read_namespaced_resource_quota("pods", namespace).status.hard or {}).get("pods") == "1",
             what="the quota counted")  # fmt: skip
    assert apply(crd, job_document("quota", None), namespace).returncode == 0  # the store fits; a worker not

    rejected = wait_for(lambda: condition(crd, namespace, "quota", "WorkersBlocked"), what="the pod refused")
    assert (rejected["status"], rejected["reason"]) == ("True", "PodRejected")
    assert "quota-worker-0" in rejected["message"] and "exceeded quota" in rejected["message"], rejected["message"]
    wait_for(lambda: any(reason == "PodRejected" for _, reason, _ in events(crd, namespace, "quota")),
             what="the PodRejected Event")  # fmt: skip

    core.patch_namespaced_resource_quota("pods", namespace, {"spec": {"hard": {"pods": "4"}}})
    wait_for(lambda: worker_pods(crd, namespace, "quota") == ["quota-worker-0"], what="the worker created")
    wait_for(lambda: condition(crd, namespace, "quota", "WorkersBlocked")["status"] == "False", what="unblocked")
    assert operator.process.poll() is None
