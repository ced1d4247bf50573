"""`lbctl status` and `lbctl describe` against a real API server, with the kubeconfig found as kubectl
finds it, and their answers when there is no cluster or no such job."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from kubernetes import client

from largebatch import api
from tests.e2e.jobs import CHART, apply, seesaw
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.e2e

STATUS = {
    "phase": "Running",
    "workers": {"desired": 4, "ready": 2, "pending": 2},
    "capacity": 2,
    "allocation": {"workers": 2, "demand": 4, "time": "2026-12-03T10:00:00Z",
                   "reason": "4 → 2 workers (−2 GPUs) to team-b/urgent (batch 4,096): higher priority"},
    "plan": {"globalBatch": 512, "microBatch": 256, "accumulationSteps": 1, "worldSize": 2, "lr": 0.0014,
             "policyPhase": "cut 1/4"},
    "progress": {"step": 9000, "samples": 14_000_000, "loss": 2.25, "noiseScale": 700.0, "samplesPerSecond": 5000.0},
    "rescales": {"count": 1, "recent": [{"from": 1, "to": 2, "kind": "CapacityLimited",
                                         "reason": "batch 512 needs 2 workers, 2 fit: accumulation 1"}]},
    "conditions": [{"type": "CapacityLimited", "status": "True", "reason": "Unschedulable",
                    "message": "batch 1024 needs 4 workers, 2 fit: accumulation 2"}],
}  # fmt: skip


def lbctl(*args: str, kubeconfig) -> subprocess.CompletedProcess:
    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "largebatch", *args], capture_output=True, text=True, env=env)


@pytest.fixture
def running_job(crd, namespace):
    assert apply(crd, seesaw(), namespace).returncode == 0
    custom = client.CustomObjectsApi(crd.api)
    custom.patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "pylm-seesaw", {"status": STATUS}
    )
    job = custom.get_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL, "pylm-seesaw")
    client.CoreV1Api(crd.api).create_namespaced_event(
        namespace,
        {
            "metadata": {"generateName": "pylm-seesaw-"},
            "involvedObject": {"apiVersion": "largebatch.io/v1alpha1", "kind": "LargeBatchJob", "name": "pylm-seesaw",
                               "namespace": namespace, "uid": job["metadata"]["uid"]},
            "reason": "CapacityLimited", "message": "batch 512 needs 2 workers, 2 fit: accumulation 1",
            "type": "Normal", "source": {"component": "largebatch-operator"},
        },
    )  # fmt: skip
    return crd, namespace


def test_status_shows_the_numbers_of_each_job(running_job):
    cluster, namespace = running_job
    result = lbctl("status", "-n", namespace, kubeconfig=cluster.kubeconfig)
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines() if line.strip() and set(line.strip()) - {"─", " "}]
    header, row = lines[:2]
    assert header[:3] == ["NAME", "PHASE", "WORKERS"]
    assert row[:8] == ["pylm-seesaw", "Running", "2/4", "512", "256×1", "0.0014", "9,000", "5,000"]
    wide = lbctl("status", "-A", "-o", "wide", kubeconfig=cluster.kubeconfig)
    assert namespace in wide.stdout and "cut 1/4" in wide.stdout
    header = next(line.split() for line in wide.stdout.splitlines() if "ALLOCATED" in line)
    row = next(line.split() for line in wide.stdout.splitlines() if "pylm-seesaw" in line)
    at = {name: i - len(header) for i, name in enumerate(header)}  # from the end: "cut 1/4" is two words
    assert (row[at["PRIORITY"]], row[at["ALLOCATED"]]) == ("0", "2/4")
    as_json = json.loads(
        lbctl("status", "pylm-seesaw", "-n", namespace, "-o", "json", kubeconfig=cluster.kubeconfig).stdout
    )
    assert as_json["status"]["progress"]["step"] == 9000
    listed = yaml.safe_load(lbctl("status", "-n", namespace, "-o", "yaml", kubeconfig=cluster.kubeconfig).stdout)
    assert [j["metadata"]["name"] for j in listed["items"]] == ["pylm-seesaw"]


def test_describe_shows_the_plan_ahead_rescales_conditions_and_events(running_job):
    cluster, namespace = running_job
    result = lbctl("describe", "pylm-seesaw", "-n", namespace, kubeconfig=cluster.kubeconfig)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "Plan from here on" in out and "cut 6/6" in out and "warmup" not in out  # warmup is behind it
    assert "1 → 2 workers" in out and "CapacityLimited" in out
    assert "batch 1024 needs 4 workers, 2 fit: accumulation 2" in out  # the condition
    assert "batch 512 needs 2 workers, 2 fit: accumulation 1" in out  # the Event
    assert "priority 0, allocated 2/4 workers (given/wanted) since 2026-12-03T10:00:00Z: 4 → 2 workers" in out
    assert "team-b/urgent (batch 4,096): higher priority" in out


def test_clear_answers_when_the_job_or_the_cluster_is_missing(crd, namespace, tmp_path):
    missing = lbctl("status", "no-such-job", "-n", namespace, kubeconfig=crd.kubeconfig)
    assert missing.returncode == 1 and f"largebatchjob no-such-job in namespace {namespace} not found" in missing.stderr
    assert "Traceback" not in missing.stderr
    empty = lbctl("status", "-n", namespace, kubeconfig=crd.kubeconfig)
    assert empty.returncode == 0 and f"No LargeBatchJobs in namespace {namespace}" in empty.stdout
    dead = tmp_path / "dead.kubeconfig"
    config = yaml.safe_load(crd.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead.write_text(yaml.safe_dump(config))
    unreachable = lbctl("status", kubeconfig=dead)
    assert unreachable.returncode == 1 and "cannot reach the cluster at https://127.0.0.1:" in unreachable.stderr
    unconfigured = lbctl("status", kubeconfig=tmp_path / "none")
    assert unconfigured.returncode == 1 and "no cluster configured" in unconfigured.stderr
    assert "Traceback" not in unreachable.stderr + unconfigured.stderr


def test_a_clear_answer_when_the_crd_is_not_installed(crd, namespace):
    """Removes the CRD for a moment (and puts it back): what a user sees before `helm install`."""
    name = f"{api.PLURAL}.{api.GROUP}"
    # Jobs left by earlier tests keep kopf's finalizer once their operator is gone; they would hold the CRD.
    for job in client.CustomObjectsApi(crd.api).list_cluster_custom_object(api.GROUP, api.VERSION, api.PLURAL)["items"]:
        patched = crd.kubectl("patch", "lbj", job["metadata"]["name"], "-n", job["metadata"]["namespace"],
                              "--type=merge", "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
        # An earlier test's namespace may finish its deletion between the list and the patch (CI, stop 28).
        assert patched.returncode == 0 or "NotFound" in patched.stderr, patched.stderr
    crd.kubectl("delete", "crd", name, "--wait=true", "--timeout=60s")
    try:
        result = lbctl("status", "-n", namespace, kubeconfig=crd.kubeconfig)
        assert result.returncode == 1 and "Traceback" not in result.stderr
        assert f"the LargeBatchJob CRD ({name}) is not installed" in result.stderr
        assert "helm install the largebatch chart" in result.stderr
    finally:
        crd.kubectl("apply", "-f", str(CHART / "crds" / f"{name}.yaml"))
        crd.wait_established(name)
        wait_for(lambda: lbctl("status", "-n", namespace, kubeconfig=crd.kubeconfig).returncode == 0,
                 what="the CRD served again")  # fmt: skip
