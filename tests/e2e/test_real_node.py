"""The images on a real node, as a platform engineer meets them: `make images` builds both (on a Debian
base, loaded into the node's containerd), `helm install` runs the chart's operator pod from its image on a kubelet
with containerd and runc, logged in with its in-cluster ServiceAccount token, under a read-only root
filesystem as uid 1000, ready by its probe; a job applied with `kubectl apply` runs its rendezvous and
workers in the trainer image on that node (Service names through CoreDNS, Service addresses through
kube-proxy), reads a data volume mounted read-only, writes its checkpoints to a volume the kubelet gave
its `fsGroup`, grows at the cut and
succeeds with every sample used; `kubectl logs` shows a worker's progress; a deleted worker (SIGTERM to
PID 1 of its container) checkpoints and the restart loses nothing; a failing worker's termination
message and a refused pull reach the job's conditions; `helm uninstall` stops the operator pod, whose
PID 1 takes the SIGTERM."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import torch
from kubernetes import client

from largebatch_trainer import checkpoint
from tests.cluster import node
from tests.e2e.jobs import CHART, apply, condition, contiguous, job_document, status_of
from tests.helpers import ROOT, simulated_task, wait_for

pytestmark = pytest.mark.e2e

TOTAL = 16 * 4_000
# Generous: in make test the node's containers share two cores with the process tests beside them, and a
# trainer in a container takes a thread per core (steps ran 5x slower there than alone).
WAIT = 900
FAST = {"reconcileSeconds": 0.5, "restartSeconds": 0, "unschedulableGraceSeconds": 3}  # the chart's values


def pods_of(core: client.CoreV1Api, namespace: str, selector: str, deleting: bool = False) -> list[client.V1Pod]:
    """The pods that match, and those being deleted when `deleting` (a kubelet keeps a pod until its
    containers have ended)."""
    return [p for p in core.list_namespaced_pod(namespace, label_selector=selector).items
            if deleting or not p.metadata.deletion_timestamp]  # fmt: skip


def ready(pod: client.V1Pod) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def explain(cluster, namespace: str, operator_namespace: str) -> str:
    """Everything a person would look at when the job did not get where it should."""
    parts = [cluster.kubectl("get", "pods,lbj", "-o", "wide", "-n", namespace, check=False).stdout,
             cluster.kubectl("get", "events", "-n", namespace, check=False).stdout[-3000:]]  # fmt: skip
    for ns in (namespace, operator_namespace):
        for name in cluster.kubectl("get", "pods", "-n", ns, "-o", "name", check=False).stdout.split():
            log = cluster.kubectl("logs", name, "-n", ns, "--tail=40", check=False).stdout
            parts.append(f"--- {ns}/{name}\n{log}")
    parts.append("--- kubelet\n" + cluster.node.log("kubelet")[-3000:])
    return "\n".join(parts)


def pod_memory(cluster, pod: str, namespace: str) -> int:
    """A pod's working set as its kubelet measures it (the summary API, through the API server)."""
    summary = json.loads(cluster.kubectl("get", "--raw", f"/api/v1/nodes/{node.NAME}/proxy/stats/summary").stdout)
    found = next(p for p in summary["pods"] if p["podRef"]["name"] == pod and p["podRef"]["namespace"] == namespace)
    return found["memory"]["workingSetBytes"]


def local_claim(cluster, core, namespace: str, name: str) -> Path:
    """A ReadWriteMany claim bound to a `local` volume: a folder of the real node that only root may write
    to, as an export is before the kubelet applies the pods' `fsGroup` to it (a `local` volume takes it;
    hostPath would not). The node is alone, so every pod on it shares the folder."""
    folder = cluster.directory / f"volume-{namespace}-{name}"
    folder.mkdir(mode=0o755)
    on_the_node = {"required": {"nodeSelectorTerms": [{"matchExpressions": [
        {"key": "kubernetes.io/hostname", "operator": "In", "values": [node.NAME]}]}]}}  # fmt: skip
    core.create_persistent_volume({
        "metadata": {"name": f"{namespace}-{name}"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                 "local": {"path": str(folder)}, "nodeAffinity": on_the_node,
                 "claimRef": {"namespace": namespace, "name": name}},
    })  # fmt: skip
    core.create_namespaced_persistent_volume_claim(namespace, {
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "manual",
                 "volumeName": f"{namespace}-{name}", "resources": {"requests": {"storage": "1Gi"}}},
    })  # fmt: skip
    return folder


@pytest.fixture
def checkpoints(cluster, core, namespace):
    yield local_claim(cluster, core, namespace, "checkpoints")
    core.delete_persistent_volume(f"{namespace}-checkpoints")


@pytest.fixture
def corpus(cluster, core, namespace):
    """A claim holding data, which a job mounts with workers.pod.volumes."""
    folder = local_claim(cluster, core, namespace, "corpus")
    (folder / "train.txt").write_text("the data volume\n")
    yield folder
    core.delete_persistent_volume(f"{namespace}-corpus")


def on_the_real_node(name: str, image: str, **workers) -> dict:
    placed = {"tolerations": [node.TOLERATION], "nodeSelector": node.SELECTOR}
    # A core each at most, so torch runs one thread per worker (OMP_NUM_THREADS from the limit), not one per
    # core of the machine; the small request leaves room on the node's two cores for both workers.
    one_core = {"requests": {"cpu": "100m"}, "limits": {"cpu": 1}}
    document = job_document(name, None, total=TOTAL, accelerator="none", pod=placed, resources=one_core, **workers)
    document["spec"]["image"] = image
    return document


def test_the_images_run_the_torch_the_tests_run_as_uid_1000(images, docker):
    pinned = next(line.split("==")[1] for line in (ROOT / "constraints.txt").read_text().splitlines()
                  if line.startswith("torch=="))  # fmt: skip
    assert torch.__version__.split("+")[0] == pinned  # make test's venv
    inside = docker.run("run", "--rm", "--network=none", images.trainer, "python", "-c",
                        "import torch, largebatch_trainer; print(torch.__version__)").stdout  # fmt: skip
    assert inside.strip() == torch.__version__
    for image in (images.operator, images.trainer):
        assert docker.run("image", "inspect", "--format={{.Config.User}}", image).stdout.strip() == "1000"


# In the trainer image, offline: a token file, a tiny Llama built by the causal_lm task, written with its
# save_model and loaded back by transformers with the same logits; and the library prepare-data reads.
HF_IN_THE_IMAGE = """
import pathlib, tempfile, numpy, torch, datasets
from transformers import AutoModelForCausalLM
from largebatch_trainer.tasks import load_task
from largebatch_trainer.token_files import TokenMeta
folder = pathlib.Path(tempfile.mkdtemp()); data = folder / "t.bin"
(numpy.arange(4000) % 64).astype(numpy.uint16).tofile(data); TokenMeta("uint16", 64, separator=0).write(data)
config = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
          "max_position_embeddings": 32}
task = load_task("largebatch_trainer.tasks:causal_lm", {"modelType": "llama", "config": config,
                 "data": str(data), "context": 16}, 0)
task.save_model(task.model.eval(), folder / "model"); x = task.dataset[0][None]
print(torch.equal(AutoModelForCausalLM.from_pretrained(folder / "model").eval()(x).logits, task.model(x).logits))
"""


def test_the_trainer_image_trains_and_writes_hugging_face_models_offline(images, docker):
    inside = docker.run("run", "--rm", "--network=none", images.trainer, "python", "-c", HF_IN_THE_IMAGE)
    assert inside.stdout.strip().splitlines()[-1] == "True", inside.stdout + inside.stderr


def test_the_real_node_runs_pods_through_containerd(real_node, core):
    info = core.read_node(node.NAME).status.node_info
    assert info.container_runtime_version.startswith("containerd://1.")
    assert info.kubelet_version == "v1.36.3"  # the control plane's own Kubernetes module


def test_the_chart_and_a_job_run_in_their_images_on_the_real_node(crd, images, namespace, core, checkpoints, corpus):
    release, home = "real", f"{namespace[:40]}-ops"
    label = node.LABEL.replace(".", "\\.")  # helm --set reads dots as nesting
    # --set-json: --set reads 0.5 as a string, which the chart's schema refuses.
    crd.helm("install", release, str(CHART), "--namespace", home, "--create-namespace",
             "--set", f"image.repository={images.repository},image.tag={images.tag}",
             "--set", f"watchNamespaces={{{namespace}}}",
             "--set", f"nodeSelector.{label}=real",
             "--set", f"tolerations[0].key={node.LABEL},tolerations[0].value=real,tolerations[0].effect=NoSchedule",
             "--set-json", f"operator={json.dumps(FAST)}")  # fmt: skip
    operator_selector = f"app.kubernetes.io/instance={release}"
    try:
        # The operator's pod: on the real node, logged in with its mounted token, ready by its probe.
        pod = wait_for(lambda: next((p for p in pods_of(core, home, operator_selector) if ready(p)), None),
                       timeout=WAIT, what="the operator's pod ready on the real node")  # fmt: skip
        assert pod.spec.node_name == node.NAME and pod.status.container_statuses[0].image == images.operator
        operator_log = lambda: crd.kubectl("logs", pod.metadata.name, "-n", home, check=False).stdout  # noqa: E731
        wait_for(lambda: "Resuming operations" in operator_log(), timeout=WAIT, what="its peering")

        def state() -> dict:
            return status_of(crd, namespace, "real")

        def waited(condition, what: str, timeout: float = WAIT):
            try:
                return wait_for(condition, timeout=timeout, what=what)
            except AssertionError as timed_out:
                raise AssertionError(f"{timed_out}\n{state()}\n{explain(crd, namespace, home)}") from None

        document = on_the_real_node("real", images.trainer)
        document["spec"]["checkpoint"] = {"path": "/ckpt", "claimName": "checkpoints", "everySteps": 100_000}
        document["spec"]["workers"]["pod"]["volumes"] = [{"claimName": "corpus", "mountPath": "/data"}]
        # Samples that take a fixed time (a sleep, not compute): the run lasts about two minutes however
        # busy the machine is, long enough for what the test looks at while it trains (a small GPT's run
        # ended before the test saw the second worker, on an idle machine and under two CPU hogs alike).
        document["spec"]["task"] = simulated_task(0.002)
        created = time.monotonic()
        assert apply(crd, document, namespace).returncode == 0
        waited(lambda: state().get("progress", {}).get("step", 0) > 0, "the first step")
        first_step = time.monotonic() - created

        # Worker 0 while it trains; the other jobs below wait until it has succeeded.
        first_line = re.compile(r"^step \d+ samples \d+/\d+ batch 16 \(world 1 x accumulation 1\)", re.M)
        waited(lambda: first_line.search(crd.kubectl("logs", "real-worker-0", "-n", namespace).stdout),
               "worker 0 logging a step at batch 16 on one worker")  # fmt: skip
        threads = crd.kubectl("exec", "real-worker-0", "-n", namespace, "--", "python", "-c",
                              "import torch; print(torch.get_num_threads())").stdout  # fmt: skip
        assert threads.strip() == "1", threads  # its CPU limit, not the machine's cores
        # The data volume: readable, and read-only unless the job says otherwise.
        data = "from pathlib import Path as P; print(P('/data/train.txt').read_text().strip()); P('/data/x').touch()"
        wrote = crd.kubectl("exec", "real-worker-0", "-n", namespace, "--", "python", "-c", data, check=False)
        assert wrote.stdout.strip() == "the data volume" and "Read-only file system" in wrote.stderr, wrote

        # The cut: a second worker joins through the rendezvous Service (CoreDNS, kube-proxy).
        waited(lambda: state().get("plan", {}).get("worldSize") == 2, "two workers after the cut")
        waited(lambda: state()["progress"]["samples"] > TOTAL * 0.6 and state()["plan"]["worldSize"] == 2,
               "training at two workers")  # fmt: skip
        core.delete_namespaced_pod("real-worker-1", namespace)  # SIGTERM to PID 1 of its container
        # The group stops at one step and checkpoints it; worker 0's agent restarts its trainer, which
        # resumes from exactly that checkpoint (both lines in the same container's log).
        restarted = re.compile(r"stopped after step (\d+).*resumed from checkpoint \S+ at step (\d+)", re.S)
        found = waited(lambda: restarted.search(crd.kubectl("logs", "real-worker-0", "-n", namespace).stdout),
                       "worker 0 stopping at the SIGTERM and resuming from its checkpoint")  # fmt: skip
        assert found.group(1) == found.group(2), found.group(0)
        waited(lambda: state().get("phase") == "Succeeded", "the job to succeed")
        status = state()

        # Then what a real kubelet reports for a worker that fails and for an image it cannot pull.
        broken = on_the_real_node("broken", images.trainer, maxRestarts=0)
        broken["spec"]["task"]["entrypoint"] = "largebatch_trainer.tasks:no_such_task"
        assert apply(crd, broken, namespace).returncode == 0
        missing = images.trainer.rsplit(":", 1)[0] + ":not-loaded"  # and no registry answers for its domain
        assert apply(crd, on_the_real_node("nopull", missing), namespace).returncode == 0
        failed = waited(lambda: condition(crd, namespace, "broken", "Failed"), "the broken job failed")
        # Its worker's last words, from the termination message the kubelet took from its log.
        assert "broken-worker-0:" in failed["message"] and "no_such_task" in failed["message"], failed
        blocked = waited(lambda: condition(crd, namespace, "nopull", "WorkersBlocked"), "the pull refused")
        assert blocked["reason"] in ("ErrImagePull", "ImagePullBackOff") and "not-loaded" in blocked["message"], blocked
        crd.kubectl("delete", "lbj", "broken", "nopull", "-n", namespace)

        memory = pod_memory(crd, pod.metadata.name, home)
        print(f"the operator's pod: {memory / 2**20:.0f} MiB working set after the job")
        assert memory < 512 * 2**20  # the chart's limit
    finally:
        uninstalled = time.monotonic()
        crd.helm("uninstall", release, "--namespace", home, "--wait")
    wait_for(lambda: not pods_of(core, home, operator_selector, deleting=True), timeout=120,
             what="the operator's pod gone")  # fmt: skip
    # PID 1 of its container took the SIGTERM (a process that ignored it would be killed at the end of
    # the pod's 30 s grace period).
    assert time.monotonic() - uninstalled < 30

    assert status["progress"]["samples"] == TOTAL and status["progress"]["done"] is True
    runs = checkpoint.newest_intact(checkpoints)[1]["history"]
    assert contiguous(runs, TOTAL)  # nothing skipped or repeated across the SIGTERM and the restart
    worlds, batches = [run[3] for run in runs], [run[2] for run in runs]
    assert worlds[0] == 1 and worlds[-1] == 2 and batches[0] == 16 and batches[-1] == 32, runs
    print(f"a worker's first step {first_step:.1f} s after the job was applied")
