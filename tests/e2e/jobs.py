"""Helpers for e2e tests that work with LargeBatchJobs on the test control plane."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import yaml
from kubernetes import client

from largebatch import api
from tests import helpers
from tests.cluster.pod_runner import PodRunner
from tests.helpers import EXAMPLES, ROOT, simulated_task, wait_for

CRD = ROOT / "crds" / "largebatchjobs.largebatch.io.yaml"
CHART = ROOT / "charts" / "largebatch"
RELEASE = "largebatch"
OPERATOR_NAMESPACE = "largebatch-system"


def apply(cluster, document: dict, namespace: str):
    """`kubectl apply` a document; the result says whether the API server took it."""
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document), check=False)


def seesaw() -> dict:
    return yaml.safe_load((EXAMPLES / "seesaw.yaml").read_text())


TOTAL = 16 * 8_000
"""Steps enough that a job outlasts what a test does to it: the suspend acted on (thousands of steps
after the test saw step 200), a lost worker replaced (the group stalls at min = max = 2 until it is), a
cut's new worker joined (a small GPT's steps, slow enough for that)."""
POOL_LABEL = "largebatch.io/test-pool"
"""On one test's GPU nodes, with the test's name: what its flavor or its operator's pool selects."""
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


GROWING_TOTAL = 16 * 800
"""The samples of growing_job: 800 steps at batch 16, its Seesaw cut at sample 7,008."""


def growing_job(name: str, claim: str, total: int = GROWING_TOTAL) -> dict:
    """A job that starts on one worker and grows to two at its Seesaw cut (batch 16 to 32), training the
    simulated task at 12 ms a sample: the part of the run after the cut takes one worker 70 s, which
    outlasts a new worker's start and rendezvous on a busy machine, without the CPU of a real model (a
    small GPT took 59 CPU s here). At 6 ms (35 s) the job ended before its second worker had printed a
    line in a cold run, where the images built beside five lanes (load 11 on two cores, 49e8092), and
    linreg finished first in CI before that. Slow steps, and few: a step's bookkeeping and all-reduce
    cost CPU whatever its sleep, so 800 steps of 96 ms (6 ms a sample) cost a tenth of 8,000 of 9.6 ms,
    and two workers stay faster than one on a busy machine (at 8 ms a step, the all-reduce's wait did not)."""
    document = job_document(name, claim, total)
    document["spec"]["task"] = simulated_task(0.012)
    return document


def on_nodes(nodes: list[str]) -> dict:
    """A worker affinity that requires one of `nodes`."""
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": nodes}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


@contextlib.contextmanager
def gpu_pool(cluster, namespace: str, count: int, losable: bool = False) -> Iterator[list[str]]:
    """`count` fake nodes of one GPU each, for one test's workers (`on_nodes`), removed afterwards. Their
    CPU (50m) is too little for the rendezvous pod (100m), which so stays on the shared nodes: a fault
    thrown at a pool node hits workers only. `losable`: each has a KWOK of its own (`Cluster.lose_node`)."""
    nodes = [f"{namespace[:40]}-{i}" for i in range(count)]
    try:
        for node in nodes:
            cluster.add_node(node, gpus=1, cpu="50m", losable=losable)
        yield nodes
    finally:
        for node in nodes:
            cluster.kubectl("delete", "node", node, "--ignore-not-found", "--wait=true")
            cluster.lose_node(node)


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


def status_of(cluster, namespace: str, name: str) -> dict:
    custom = client.CustomObjectsApi(cluster.api)
    return custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name).get("status") or {}


def explanation(headline: str, cluster, namespace: str, name: str, pods: PodRunner, log_path) -> str:
    """Why a wait failed: the headline, the job's status, the pods' logs, the namespace's latest Events
    (the scheduler's refusals among them) and the operator's log, without its retries of requests to an
    API server that was away (they would fill the tail)."""
    logs = "\n".join(f"--- {p}\n{pods.log(p)[-1500:]}" for p in dict.fromkeys(pods.started))
    events = sorted(client.CoreV1Api(cluster.api).list_namespaced_event(namespace).items,
                    key=lambda e: str(e.last_timestamp or e.event_time or ""))[-20:]  # fmt: skip
    said = "\n".join(f"{e.last_timestamp or e.event_time} {e.involved_object.name} {e.reason}: {e.message}"
                     for e in events)  # fmt: skip
    operator_log = "\n".join(line for line in log_path.read_text().splitlines() if "Request attempt #" not in line)
    return (f"{headline}\n{status_of(cluster, namespace, name)}\n{pods.errors}\n{logs}\n--- events\n{said}"
            f"\n--- operator\n{operator_log[-3000:]}")  # fmt: skip


def wait_or_explain(condition, what: str, cluster, namespace: str, name: str, pods: PodRunner, log_path, timeout=300):
    """wait_for, and on a timeout the job's status, the pods' logs and the operator's log."""
    try:
        return wait_for(condition, timeout=timeout, what=what)
    except AssertionError as timed_out:
        raise AssertionError(explanation(str(timed_out), cluster, namespace, name, pods, log_path)) from None


def wait_until_succeeded(cluster, namespace: str, name: str, pods: PodRunner, log_path, stall: float = 300) -> dict:
    """Wait for the job to succeed for as long as it trains: the test fails when the job fails or when its
    status counts no new sample for `stall` seconds, not after a fixed time for the whole run. How long
    the rest of a run takes depends on what else the machine runs (two workers trained at 700 samples/s
    beside the other tests in CI, 1,500 alone), so a bound on the whole run fails the slow machine and
    says nothing about the job."""
    seen, since = None, time.monotonic()
    while True:
        try:
            status = status_of(cluster, namespace, name)
        except OSError:
            status = {}
        if status.get("phase") == "Succeeded":
            return status
        samples = status.get("progress", {}).get("samples")
        if samples != seen:
            seen, since = samples, time.monotonic()
        if status.get("phase") == "Failed" or time.monotonic() - since > helpers.bound(stall):
            quiet = time.monotonic() - since
            headline = f"the job did not succeed: phase {status.get('phase')}, no new sample for {quiet:.0f} s"
            raise AssertionError(explanation(headline, cluster, namespace, name, pods, log_path))
        time.sleep(0.5)


def history(tmp_path, claim: str = "checkpoints") -> list[list[int]]:
    """The step history in the newest checkpoint on the shared claim, read on the host."""
    return helpers.newest_history(tmp_path / "pods" / f"pvc-{claim}")


def contiguous(runs: list[list[int]], total: int) -> bool:
    """The trainer's step history (first sample, batch, steps per run) covers the stream exactly."""
    return helpers.contiguous([(first, first + batch * steps) for _, first, batch, _, steps in runs], total,
                              last_batch=runs[-1][2])  # fmt: skip


def condition(cluster, namespace: str, name: str, kind: str) -> dict | None:
    found = [c for c in status_of(cluster, namespace, name).get("conditions", []) if c["type"] == kind]
    return found[0] if found else None


def world(cluster, namespace: str, name: str) -> int:
    """The job's world size, as rank 0 last reported it."""
    return status_of(cluster, namespace, name).get("plan", {}).get("worldSize", 0)


def finished_whole(cluster, namespace: str, name: str, total: int, tmp_path) -> None:
    """The job consumed `total` samples, each once and in order, on its own claim `ckpt-<name>`."""
    assert status_of(cluster, namespace, name)["progress"]["samples"] == total
    assert contiguous(history(tmp_path, f"ckpt-{name}"), total)
