"""`lbctl run JOB` without --local: validated first, submitted to the current context, followed until
it ends (exit 0 when it succeeded, 1 when it failed); Ctrl-C stops following, not the job. The
test plays the operator by writing the job's status, as only the CLI is under test here."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest
import yaml
from kubernetes import client

from largebatch import api
from tests.e2e.jobs import seesaw
from tests.helpers import bound, wait_for

pytestmark = pytest.mark.e2e


def start(*args: str, kubeconfig) -> subprocess.Popen:
    env = {"KUBECONFIG": str(kubeconfig), "PATH": "/usr/bin:/bin", "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "largebatch", "run", *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip


def job_file(tmp_path, name: str, **spec) -> str:
    document = seesaw()
    document["metadata"]["name"] = name
    document["spec"] |= spec
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(document))
    return str(path)


def get(cluster, namespace: str, name: str) -> dict | None:
    custom = client.CustomObjectsApi(cluster.api)
    found = custom.list_namespaced_custom_object(api.GROUP, api.VERSION, namespace, api.PLURAL)["items"]
    return next((j for j in found if j["metadata"]["name"] == name), None)


def test_run_submits_and_follows_the_job_to_its_end(crd, namespace, tmp_path):
    follower = start(job_file(tmp_path, "followed"), "-n", namespace, kubeconfig=crd.kubeconfig)
    job = wait_for(lambda: get(crd, namespace, "followed"), what="the job submitted")
    assert job["spec"]["batch"]["policy"]["type"] == "seesaw"
    done = {"phase": "Succeeded", "progress": {"step": 10, "samples": 4096, "done": True},
            "conditions": [{"type": "Complete", "status": "True", "reason": "Complete",
                            "message": "trained 4,096 samples in 10 steps"}]}  # fmt: skip
    client.CustomObjectsApi(crd.api).patch_namespaced_custom_object_status(
        api.GROUP, api.VERSION, namespace, api.PLURAL, "followed", {"status": done}
    )
    out, err = follower.communicate(timeout=bound(60))
    assert follower.returncode == 0, err
    assert f"largebatchjob followed created in {namespace}" in out
    assert "Succeeded" in out and "Complete: trained 4,096 samples in 10 steps" in out

    again = start(job_file(tmp_path, "followed"), "-n", namespace, "--detach", kubeconfig=crd.kubeconfig)
    _, err = again.communicate(timeout=bound(60))
    assert again.returncode == 1 and f"largebatchjob followed in namespace {namespace} already exists" in err


def test_ctrl_c_stops_following_not_the_job(crd, namespace, tmp_path):
    follower = start(job_file(tmp_path, "kept"), "-n", namespace, kubeconfig=crd.kubeconfig)
    assert "largebatchjob kept created" in follower.stdout.readline()  # submitted, now following
    follower.send_signal(signal.SIGINT)
    out, err = follower.communicate(timeout=bound(60))
    assert follower.returncode == 130, err
    assert "Stopped following; kept goes on" in out
    assert get(crd, namespace, "kept") is not None


def test_a_bad_job_is_refused_before_anything_is_submitted(crd, namespace, tmp_path):
    bad = start(job_file(tmp_path, "bad", workers={"min": 4, "max": 2}), "-n", namespace, kubeconfig=crd.kubeconfig)
    _, err = bad.communicate(timeout=bound(60))
    assert bad.returncode == 2 and "workers.min must be <= workers.max" in err and "Traceback" not in err
    assert get(crd, namespace, "bad") is None
    local_only = start(job_file(tmp_path, "flags"), "-n", namespace, "--slots", "2", kubeconfig=crd.kubeconfig)
    _, err = local_only.communicate(timeout=bound(60))
    assert local_only.returncode == 2 and "--slots only apply with --local" in err
    assert get(crd, namespace, "flags") is None
