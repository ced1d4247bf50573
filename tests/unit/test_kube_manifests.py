"""The operator's objects, built without a cluster: names, labels and owners, the worker's launch
contract, accelerators and scheduling, checkpoints, and the trainer's status-only rights."""

from __future__ import annotations

import yaml

from largebatch import launch
from largebatch.api import LargeBatchJob
from largebatch.kube import manifests
from tests.helpers import spec_dict

UID = "0b7c-uid"


def job(**overrides) -> LargeBatchJob:
    return LargeBatchJob.model_validate(
        {
            "apiVersion": "largebatch.io/v1alpha1",
            "kind": "LargeBatchJob",
            "metadata": {"name": "bert", "namespace": "team-a"},
            "spec": spec_dict(**overrides),
        }
    )


def every_object(j: LargeBatchJob) -> list[dict]:
    return [
        manifests.job_config(j, UID),
        manifests.rendezvous_pod(j, UID),
        manifests.rendezvous_service(j, UID),
        manifests.workers_service(j, UID),
        manifests.worker_pod(j, UID, 0, 1),
        *manifests.trainer_rbac(j, UID),
    ]


def test_every_object_is_owned_by_the_job_labelled_and_in_its_namespace():
    for obj in every_object(job()):
        meta = obj["metadata"]
        assert meta["namespace"] == "team-a" and meta["name"].startswith("bert-")
        assert meta["ownerReferences"] == [
            {"apiVersion": "largebatch.io/v1alpha1", "kind": "LargeBatchJob", "name": "bert", "uid": UID,
             "controller": True, "blockOwnerDeletion": True}
        ]  # fmt: skip
        assert meta["labels"]["app.kubernetes.io/instance"] == "bert"
        assert meta["labels"]["app.kubernetes.io/managed-by"] == "largebatch-operator"
        assert meta["labels"][manifests.JOB_LABEL] == "bert"


def test_names_are_fixed_so_that_a_restarted_operator_finds_them():
    j = job()
    assert [manifests.worker_pod(j, UID, i, 1)["metadata"]["name"] for i in (0, 3)] == [
        "bert-worker-0",
        "bert-worker-3",
    ]
    assert manifests.worker_pod(j, UID, 3, 1)["metadata"]["labels"][manifests.INDEX_LABEL] == "3"
    assert manifests.worker_pod(j, UID, 0, 1) == manifests.worker_pod(j, UID, 0, 1)


def test_a_worker_runs_the_launch_contract_against_the_rendezvous_service():
    j = job(workers={"min": 1, "max": 4, "devicesPerWorker": 8, "accelerator": "nvidia.com/gpu"})
    worker = manifests.worker_pod(j, UID, 2, 7)
    container = worker["spec"]["containers"][0]
    rendezvous = launch.Rendezvous("bert-rdzv:29400", f"bert-{UID[:8]}-7")
    assert worker["metadata"]["labels"][manifests.ROUND_LABEL] == "7"  # later workers join round 7
    assert container["command"] == launch.torchrun_args(j.spec, "/etc/largebatch/job.yaml", rendezvous)
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env[launch.PROGRESS_KUBERNETES] == "team-a/bert"
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    assert env[launch.CHECKPOINT_DIR] == j.spec.checkpoint.path
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    service = manifests.rendezvous_service(j, UID)
    assert service["metadata"]["name"] == "bert-rdzv" and service["spec"]["ports"][0]["port"] == 29400
    pod_labels = manifests.rendezvous_pod(j, UID)["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()


def test_accelerators_resources_and_scheduling_overrides_reach_the_pod():
    tpu = job(
        workers={
            "min": 1, "max": 2, "devicesPerWorker": 4, "accelerator": "google.com/tpu",
            "resources": {"requests": {"cpu": 8, "memory": "64Gi"}, "limits": {"memory": "64Gi"}},
            "pod": {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2"},
                    "tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}],
                    "priorityClassName": "training"},
        }
    )  # fmt: skip
    spec = manifests.worker_pod(tpu, UID, 0, 1)["spec"]
    # One named metrics port per trainer process, for a PodMonitor to find.
    assert spec["containers"][0]["ports"] == [
        {"name": name, "containerPort": 9404 + rank}
        for rank, name in enumerate(["metrics", "metrics-1", "metrics-2", "metrics-3"])
    ]
    resources = spec["containers"][0]["resources"]
    assert resources["limits"] == {"memory": "64Gi", "google.com/tpu": "4"}
    assert resources["requests"] == {"cpu": "8", "memory": "64Gi", "google.com/tpu": "4"}
    assert spec["nodeSelector"] == {"cloud.google.com/gke-tpu-topology": "2x2"}
    assert spec["tolerations"] == [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["priorityClassName"] == "training"
    cpu = manifests.worker_pod(job(workers={"accelerator": "none"}), UID, 0, 1)["spec"]
    assert "resources" not in cpu["containers"][0] or cpu["containers"][0]["resources"] == {}
    assert "nodeSelector" not in cpu and "tolerations" not in cpu


def test_checkpoints_go_to_the_claim_when_there_is_one():
    durable = manifests.worker_pod(job(checkpoint={"path": "/ckpt", "claimName": "shared"}), UID, 0, 1)["spec"]
    volumes = {v["name"]: v for v in durable["volumes"]}
    assert volumes["checkpoints"]["persistentVolumeClaim"] == {"claimName": "shared"}
    mounts = {m["name"]: m["mountPath"] for m in durable["containers"][0]["volumeMounts"]}
    assert mounts["checkpoints"] == "/ckpt" and mounts["job"] == "/etc/largebatch"
    scratch = manifests.worker_pod(job(), UID, 0, 1)["spec"]
    assert {v["name"]: v for v in scratch["volumes"]}["checkpoints"] == {"name": "checkpoints", "emptyDir": {}}


def test_data_volumes_are_mounted_read_only_unless_asked_beside_the_operators_own():
    volumes = [
        {"claimName": "corpus", "mountPath": "/data"},
        {"claimName": "scratch", "mountPath": "/job", "readOnly": False},
    ]
    pod = manifests.worker_pod(job(workers={"pod": {"volumes": volumes}}), UID, 0, 1)["spec"]
    claims = {v["name"]: v["persistentVolumeClaim"] for v in pod["volumes"] if "persistentVolumeClaim" in v}
    assert claims == {"data-0": {"claimName": "corpus", "readOnly": True},
                      "data-1": {"claimName": "scratch", "readOnly": False}}  # fmt: skip
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["data-0"] == {"name": "data-0", "mountPath": "/data", "readOnly": True}
    assert mounts["data-1"]["readOnly"] is False and {"job", "checkpoints", "shm"} <= set(mounts)


def test_workers_run_as_non_root_and_only_the_trainer_account_has_a_token():
    j = job()
    worker = manifests.worker_pod(j, UID, 0, 1)["spec"]
    assert worker["serviceAccountName"] == "bert-trainer"
    assert worker["securityContext"]["runAsNonRoot"] is True
    assert worker["containers"][0]["securityContext"]["allowPrivilegeEscalation"] is False
    assert worker["restartPolicy"] == "Never"
    rendezvous = manifests.rendezvous_pod(j, UID)["spec"]
    assert rendezvous["automountServiceAccountToken"] is False and "serviceAccountName" not in rendezvous


def test_the_trainer_may_patch_this_jobs_status_and_nothing_else():
    account, role, binding = manifests.trainer_rbac(job(), UID)
    assert account["kind"] == "ServiceAccount" and account["metadata"]["name"] == "bert-trainer"
    assert role["rules"] == [
        {"apiGroups": ["largebatch.io"], "resources": ["largebatchjobs/status"], "resourceNames": ["bert"],
         "verbs": ["get", "patch"]}
    ]  # fmt: skip
    assert binding["roleRef"]["name"] == "bert-trainer"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "bert-trainer", "namespace": "team-a"}]


def test_the_job_file_the_workers_read_is_the_job_as_applied():
    j = job()
    document = yaml.safe_load(manifests.job_config(j, UID)["data"]["job.yaml"])
    assert LargeBatchJob.model_validate(document).spec == j.spec
    assert "status" not in document


def test_pull_secrets_reach_both_pods_and_a_failed_worker_leaves_its_log_tail():
    j = job(workers={"pod": {"imagePullSecrets": [{"name": "registry-login"}]}})
    worker = manifests.worker_pod(j, "uid-1", 0, 1)
    assert worker["spec"]["imagePullSecrets"] == [{"name": "registry-login"}]
    assert manifests.rendezvous_pod(j, "uid-1")["spec"]["imagePullSecrets"] == [{"name": "registry-login"}]
    assert worker["spec"]["containers"][0]["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert "imagePullSecrets" not in manifests.worker_pod(job(), "uid-1", 0, 1)["spec"]


def test_a_worker_runs_as_many_threads_per_process_as_its_cpu_allows():
    def threads(devices: int, **resources) -> str | None:
        spec = job(workers={"devicesPerWorker": devices, "resources": resources, "accelerator": "none"})
        env = manifests.worker_pod(spec, "uid-1", 0, 0)["spec"]["containers"][0]["env"]
        return next((e["value"] for e in env if e["name"] == "OMP_NUM_THREADS"), None)

    assert threads(1, limits={"cpu": 4}) == "4"
    assert threads(2, limits={"cpu": "3"}, requests={"cpu": 1}) == "1"  # the limit, split between processes
    assert threads(1, requests={"cpu": "2500m"}) == "2"  # no limit: the request
    assert threads(4, limits={"cpu": "500m"}) == "1"  # never fewer than one
    assert threads(1, limits={"memory": "8Gi"}) is None  # no CPU named: torch's own default
