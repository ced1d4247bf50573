"""The Kubernetes objects of one LargeBatchJob, as plain dicts: pure functions of the job (no API calls),
so that the operator only creates, patches and deletes what these return.

Per job: a ConfigMap with the job file the trainer reads; a rendezvous pod that no worker hosts (a
TCPStore, as `lbctl run --local` hosts one) with its Service; worker pods `<job>-worker-<n>`, each a
torchrun agent (`largebatch.launch`), behind a headless Service; and a ServiceAccount whose only right
is to patch this job's status, which rank 0 uses to report. Every object carries the standard
`app.kubernetes.io/*` labels, the job's label and an owner reference to the job, so that deleting the
job deletes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

from largebatch import api, launch
from largebatch.api import LargeBatchJob

JOB_LABEL = f"{api.GROUP}/job"
ROLE_LABEL = f"{api.GROUP}/role"
INDEX_LABEL = f"{api.GROUP}/worker-index"
ROUND_LABEL = f"{api.GROUP}/rendezvous-round"
RENDEZVOUS_PORT = 29400
JOB_DIR = api.JOB_DIR
JOB_FILE = "job.yaml"
TRAINER_UID = 1000  # the trainer image's user


@dataclass(frozen=True)
class Names:
    """Fixed names, so that a restarted operator finds what exists (no random suffixes)."""

    job: str

    @property
    def config(self) -> str:
        return f"{self.job}-job"

    @property
    def rendezvous(self) -> str:
        return f"{self.job}-rdzv"

    @property
    def workers(self) -> str:
        return f"{self.job}-workers"

    @property
    def trainer(self) -> str:
        """ServiceAccount, Role and RoleBinding of the trainer."""
        return f"{self.job}-trainer"

    def worker(self, index: int) -> str:
        return f"{self.job}-worker-{index}"


def labels(job: LargeBatchJob, component: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "largebatch",
        "app.kubernetes.io/instance": job.metadata.name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/managed-by": "largebatch-operator",
        JOB_LABEL: job.metadata.name,
        ROLE_LABEL: component,
    }


def owner_reference(job: LargeBatchJob, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{api.GROUP}/{api.VERSION}",
        "kind": api.KIND,
        "name": job.metadata.name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: LargeBatchJob, uid: str, name: str, component: str, **extra_labels: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": labels(job, component) | extra_labels,
        "ownerReferences": [owner_reference(job, uid)],
    }


def job_config(job: LargeBatchJob, uid: str) -> dict[str, Any]:
    """The job file every worker reads (`--job /etc/largebatch/job.yaml`): the job as applied, without
    its status."""
    document = job.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
    document["metadata"] = {"name": job.metadata.name, "namespace": job.metadata.namespace}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, uid, Names(job.metadata.name).config, "config"),
        "data": {JOB_FILE: yaml.safe_dump(document, sort_keys=False)},
    }


def _security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": TRAINER_UID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": False,  # torch and Python write caches under $HOME
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def rendezvous_pod(job: LargeBatchJob, uid: str) -> dict[str, Any]:
    """The rendezvous store: no worker hosts it, so losing any worker is survivable. It needs no
    accelerator; it takes the job's tolerations (a cluster whose every node is tainted still places it)
    but not its node selector or affinity, which usually point at accelerator nodes."""
    names = Names(job.metadata.name)
    tolerations = [t.model_dump(by_alias=True, exclude_none=True) for t in job.spec.workers.pod.tolerations]
    pull_secrets = _pull_secrets(job)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(job, uid, names.rendezvous, "rendezvous"),
        "spec": {
            **({"tolerations": tolerations} if tolerations else {}),
            **({"imagePullSecrets": pull_secrets} if pull_secrets else {}),
            "automountServiceAccountToken": False,
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": "rendezvous",
                    "image": job.spec.image,
                    "command": ["python", "-m", "largebatch_trainer.rendezvous", f"--port={RENDEZVOUS_PORT}"],
                    "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}],
                    "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}},
                    "securityContext": _security(),
                }
            ],
        },
    }


def _pull_secrets(job: LargeBatchJob) -> list[dict[str, str]]:
    return [{"name": secret.name} for secret in job.spec.workers.pod.image_pull_secrets]


def rendezvous_service(job: LargeBatchJob, uid: str) -> dict[str, Any]:
    names = Names(job.metadata.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, uid, names.rendezvous, "rendezvous"),
        "spec": {
            "selector": {JOB_LABEL: job.metadata.name, ROLE_LABEL: "rendezvous"},
            "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT, "targetPort": RENDEZVOUS_PORT}],
        },
    }


def workers_service(job: LargeBatchJob, uid: str) -> dict[str, Any]:
    """Headless: every worker pod gets a stable DNS name for the collectives between nodes."""
    names = Names(job.metadata.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, uid, names.workers, "worker"),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {JOB_LABEL: job.metadata.name, ROLE_LABEL: "worker"},
            "ports": [{"name": "metrics", "port": job.spec.metrics.port}],
        },
    }


def metrics_ports(spec: api.LargeBatchJobSpec) -> list[dict[str, Any]]:
    """A named port for each trainer process of a worker (local rank r serves on `metrics.port` + r), so
    that a PodMonitor finds them all: `metrics`, `metrics-1`, ..."""
    return [
        {"name": f"metrics-{rank}" if rank else "metrics", "containerPort": spec.metrics.port + rank}
        for rank in range(spec.workers.devices_per_worker)
    ]


def cpu_threads(resources: api.Resources, processes: int) -> int | None:
    """Threads per trainer process for a worker's CPU limit (else its request): torch sizes its thread
    pools by the host's cores, not by the container's share, so a worker limited to a few cores of a big
    node would spend its quota switching between a thread per core. None when the worker names no CPU."""
    quantity = resources.limits.get("cpu", resources.requests.get("cpu"))
    match = re.fullmatch(r"(\d+(?:\.\d*)?)(m?)", str(quantity)) if quantity is not None else None
    if not match:
        return None
    cores = float(match.group(1)) / (1000 if match.group(2) else 1)
    return max(1, int(cores // processes))


def run_id(job: str, uid: str, round_: int) -> str:
    """The rendezvous id of a job's round `round_` (`torchrun --rdzv-id`)."""
    return f"{job}-{uid[:8]}-{round_}"


def worker_pod(job: LargeBatchJob, uid: str, index: int, round_: int) -> dict[str, Any]:
    """Worker `index`: one torchrun agent with `devicesPerWorker` trainer processes, in rendezvous round
    `round_` (a fresh one whenever the job starts from no workers; labelled, so later workers join it)."""
    spec, names = job.spec, Names(job.metadata.name)
    rendezvous = launch.Rendezvous(f"{names.rendezvous}:{RENDEZVOUS_PORT}", run_id(names.job, uid, round_))
    env = launch.trainer_env(
        checkpoint_dir=spec.checkpoint.path,
        metrics_port=spec.metrics.port,
        progress_kubernetes=f"{job.metadata.namespace}/{job.metadata.name}",
        device="auto",
    )
    resources = spec.workers.resources or api.Resources()
    threads = cpu_threads(resources, spec.workers.devices_per_worker)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    # Quantities are strings on the wire ("8", "64Gi"); the API server takes numbers, clients may not.
    limits = {name: str(value) for name, value in resources.limits.items()}
    requests = {name: str(value) for name, value in resources.requests.items()}
    if spec.workers.accelerator != "none":
        limits[spec.workers.accelerator] = str(spec.workers.devices_per_worker)
        requests[spec.workers.accelerator] = str(spec.workers.devices_per_worker)
    checkpoints: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": spec.checkpoint.claim_name}}
        if spec.checkpoint.claim_name
        else {"emptyDir": {}}
    )
    pod = spec.workers.pod
    pod_spec: dict[str, Any] = {
        "serviceAccountName": names.trainer,  # its token may patch this job's status, nothing else
        "automountServiceAccountToken": True,
        "restartPolicy": "Never",  # torchrun restarts the trainer inside; a failed pod is replaced
        "hostname": names.worker(index),
        "subdomain": names.workers,
        "securityContext": {"runAsNonRoot": True, "runAsUser": TRAINER_UID, "fsGroup": TRAINER_UID},
        "containers": [
            {
                "name": "trainer",
                "image": spec.image,
                "command": launch.torchrun_args(spec, f"{JOB_DIR}/{JOB_FILE}", rendezvous),
                "env": [{"name": key, "value": value} for key, value in sorted(env.items())],
                "ports": metrics_ports(spec),
                "resources": {k: v for k, v in (("requests", requests), ("limits", limits)) if v},
                "securityContext": _security(),
                # The last lines of a failed worker's log become its termination message, which the
                # operator quotes in the job's Failed condition (no log-reading rights needed).
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "volumeMounts": [
                    {"name": "job", "mountPath": JOB_DIR, "readOnly": True},
                    {"name": "checkpoints", "mountPath": spec.checkpoint.path},
                    {"name": "shm", "mountPath": api.SHM_DIR},  # DataLoader and NCCL need more than 64 MiB
                    *(
                        {"name": f"data-{i}", "mountPath": v.mount_path, "readOnly": v.read_only}
                        for i, v in enumerate(pod.volumes)
                    ),
                ],
            }
        ],
        "volumes": [
            {"name": "job", "configMap": {"name": names.config}},
            {"name": "checkpoints", **checkpoints},
            {"name": "shm", "emptyDir": {"medium": "Memory"}},
            # Named by position: a user's name could clash with the operator's own volumes.
            *(
                {"name": f"data-{i}", "persistentVolumeClaim": {"claimName": v.claim_name, "readOnly": v.read_only}}
                for i, v in enumerate(pod.volumes)
            ),
        ],
        # For the checkpoint on SIGTERM of a preemption, a suspend or a scale-down.
        "terminationGracePeriodSeconds": pod.termination_grace_period_seconds,
    }
    if pod.node_selector:
        pod_spec["nodeSelector"] = dict(pod.node_selector)
    if pod.tolerations:
        pod_spec["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in pod.tolerations]
    if pod.affinity:
        pod_spec["affinity"] = pod.affinity
    if pod.priority_class_name:
        pod_spec["priorityClassName"] = pod.priority_class_name
    if pod.image_pull_secrets:
        pod_spec["imagePullSecrets"] = _pull_secrets(job)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(
            job, uid, names.worker(index), "worker", **{INDEX_LABEL: str(index), ROUND_LABEL: str(round_)}
        ),
        "spec": pod_spec,
    }


def trainer_rbac(job: LargeBatchJob, uid: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role and RoleBinding: rank 0 may get and patch this one job's status, nothing
    else (no secrets, no pods, no other job)."""
    names = Names(job.metadata.name)
    meta = _metadata(job, uid, names.trainer, "trainer")
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": meta,
            "rules": [
                {
                    "apiGroups": [api.GROUP],
                    "resources": [f"{api.PLURAL}/status"],
                    "resourceNames": [job.metadata.name],
                    "verbs": ["get", "patch"],
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": names.trainer},
            "subjects": [{"kind": "ServiceAccount", "name": names.trainer, "namespace": job.metadata.namespace}],
        },
    ]
