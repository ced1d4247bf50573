"""The operator on the real control plane, with real training: `kubectl apply` a small job, the
operator creates the rendezvous store and the workers, the real scheduler places them on fake GPU
nodes, the pod runner trains them as local processes, rank 0 reports with its status-only token, the
operator adds a worker when the batch grows, and the job succeeds having used every sample."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from kubernetes import client

from largebatch import api
from largebatch_trainer import checkpoint
from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import apply
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

TOTAL = 16 * 20_000
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def job_document(name: str, claim: str) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": name},
        "spec": {
            "image": "largebatch-trainer:test",
            "task": {"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"dim": 64, "samples": 65_536}},
            "workers": {"min": 1, "max": 2, "accelerator": "nvidia.com/gpu", "pod": {"tolerations": [KWOK_TOLERATION]}},
            "batch": {"initial": 16, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "seesaw"}},
            "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
            "schedule": {"totalSamples": TOTAL, "warmupSamples": 320, "decay": "cosine", "minLrRatio": 0.1},
            "checkpoint": {"path": "/ckpt", "claimName": claim, "everySteps": 50},
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
def operator(crd, namespace, tmp_path):
    env = dict(os.environ, KUBECONFIG=str(crd.kubeconfig), LARGEBATCH_WATCH_NAMESPACES=namespace,
               LARGEBATCH_RECONCILE_SECONDS="0.5", LARGEBATCH_RESTART_SECONDS="0",
               LARGEBATCH_UNSCHEDULABLE_GRACE_SECONDS="5")  # fmt: skip
    log = open(tmp_path / "operator.log", "wb")
    process = subprocess.Popen([sys.executable, "-m", "largebatch.kube"], env=env, stdout=log, stderr=subprocess.STDOUT)
    yield process, tmp_path / "operator.log"
    process.terminate()
    process.wait(timeout=30)


def status_of(cluster, namespace: str, name: str) -> dict:
    custom = client.CustomObjectsApi(cluster.api)
    return custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, name).get("status") or {}


def test_an_applied_job_trains_grows_at_the_cut_and_succeeds(crd, namespace, operator, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, job_document("grow", "checkpoints"), namespace).returncode == 0
        try:
            wait_for(lambda: status_of(crd, namespace, "grow").get("phase") == "Succeeded", timeout=150,
                     what="the job to succeed")  # fmt: skip
        except AssertionError:
            logs = "\n".join(f"--- {p}\n{pods.log(p)[-2000:]}" for p in pods.started)
            raise AssertionError(f"{status_of(crd, namespace, 'grow')}\n{pods.errors}\n{logs}\n--- operator\n"
                                 f"{operator[1].read_text()[-4000:]}") from None  # fmt: skip
        assert pods.errors == []
        assert {"grow-rdzv", "grow-worker-0", "grow-worker-1"} <= set(pods.started)
    status = status_of(crd, namespace, "grow")
    assert status["progress"]["samples"] == TOTAL and status["progress"]["done"] is True
    assert status["rescales"]["count"] >= 1 and status["rescales"]["recent"][0]["to"] == 2
    state = checkpoint.load(checkpoint.latest(tmp_path / "pods" / "pvc-checkpoints"))
    worlds = [run[3] for run in state["history"]]
    assert worlds[0] == 1 and 2 in worlds, state["history"]
    batches = [run[2] for run in state["history"]]
    assert batches[0] == 16 and batches[-1] == 32
    # Done: the workers and the store are gone, the status stays.
    core = client.CoreV1Api(crd.api)
    wait_for(lambda: not [p for p in core.list_namespaced_pod(namespace).items if not p.metadata.deletion_timestamp],
             what="the job's pods removed")  # fmt: skip
