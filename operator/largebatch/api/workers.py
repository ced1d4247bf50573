"""The job's task and its workers: what runs, on how many pods, with which resources."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from largebatch.api.base import (
    FreeForm,
    Quantity,
    Rule,
    _Model,
    _sub,
)

# --- task -----------------------------------------------------------------------------------------


class TaskSpec(_Model):
    """What to train: user code that returns the model, the dataset and the loss."""

    entrypoint: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$", max_length=253)
    """Python callable as `module:callable`, for example `largebatch_trainer.tasks:pylm`."""
    args: FreeForm = Field(default_factory=dict)
    """Free-form keyword arguments passed to the entrypoint (model width, depth, data options)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the model initialisation (the same on every rank) and of the sample order."""
    compile: bool = False
    """Compile the model with `torch.compile` (TorchInductor) before training: the first steps take the
    compilation, later ones run fused kernels. docs/trainer.md ("Accelerators and precision") lists
    where it does not combine with the rest."""


# --- workers --------------------------------------------------------------------------------------

# The accelerator whose jobs train in bf16 unless `spec.precision` says otherwise.
BF16_BY_DEFAULT = "nvidia.com/gpu"


class Toleration(_Model):
    """A pod toleration, as in `core/v1`."""

    key: str | None = None
    """Taint key the toleration applies to; empty with operator Exists matches every key."""
    operator: Literal["Exists", "Equal"] | None = None
    """`Equal` (default) compares `value`; `Exists` matches any value."""
    value: str | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = Field(default=None, ge=0)
    """For NoExecute: how long the pod stays bound after the taint appears."""


class SecretName(_Model):
    """A Secret in the job's namespace, by name (a `core/v1` LocalObjectReference)."""

    name: str = Field(min_length=1, max_length=253)
    """The Secret's name."""


# Folders every worker pod mounts besides the checkpoints: the job file (a ConfigMap) and a larger /dev/shm.
JOB_DIR = "/etc/largebatch"
SHM_DIR = "/dev/shm"


class DataVolume(_Model):
    """A PersistentVolumeClaim mounted into every worker pod: a tokenized corpus, a tokenizer, a model to
    start from. Any volume type (NFS, CephFS, a CSI driver, a node's local disk) reaches the pods through a
    PersistentVolume bound to the claim."""

    claim_name: str = Field(min_length=1, max_length=253)
    """The PersistentVolumeClaim, in the job's namespace."""
    mount_path: str = Field(pattern=r"^(/[^/]+)+$", max_length=1024)
    """Where the workers find it: an absolute path, not the checkpoint path, /etc/largebatch or /dev/shm."""
    read_only: bool = True
    """Mounted read-only (the default: training reads its data and never writes it, and many pods may
    mount a ReadOnlyMany claim)."""


class PodOverrides(_Model):
    """Scheduling settings and data volumes merged into every worker pod."""

    node_selector: dict[str, str] = Field(default_factory=dict)
    """Node labels a worker pod requires."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=64)
    """Tolerations added to every worker pod."""
    affinity: FreeForm | None = None
    """A `core/v1` Affinity for every worker pod (node, pod and anti-affinity)."""
    priority_class_name: str | None = Field(default=None, max_length=253)
    """PriorityClass of the worker pods."""
    image_pull_secrets: list[SecretName] = Field(default_factory=list, max_length=16)
    """Secrets for pulling `spec.image` from a private registry (worker and rendezvous pods)."""
    volumes: list[DataVolume] = Field(default_factory=list, max_length=16)
    """Claims mounted into every worker pod beside the checkpoints (`task.args` name files on them)."""
    termination_grace_period_seconds: int = Field(default=60, ge=1, le=3600)
    """Seconds a worker has, once told to stop (a preemption, a suspend, a scale-down), to finish its step
    and write a checkpoint before it is killed: more than one step and one checkpoint of the model take
    (docs/operations.md, "Preemption")."""

    rules = (
        Rule(
            "!has(self.volumes) || self.volumes.all(v, self.volumes.exists_one(w, w.mountPath == v.mountPath))",
            "workers.pod.volumes: two volumes cannot share a mountPath: give each its own folder",
            lambda s: len({v.mount_path for v in s.volumes}) == len(s.volumes),
            lambda s: f"mountPaths={[v.mount_path for v in s.volumes]}",
            ".volumes",
        ),
    )


class Resources(_Model):
    """Container resources of a worker, as in `core/v1` ResourceRequirements."""

    requests: dict[str, Quantity] = Field(default_factory=dict)
    """Resources the scheduler reserves, for example `cpu: 8`, `memory: 64Gi`."""
    limits: dict[str, Quantity] = Field(default_factory=dict)
    """Upper limits; the accelerator count is set from `devicesPerWorker` and needs no entry here."""


class WorkersSpec(_Model):
    """The elastic worker group: one pod (torchrun agent) per worker."""

    min: int = Field(default=1, ge=1, le=4096)
    """Fewest workers the job runs with; below this it waits."""
    max: int = Field(default=1, ge=1, le=4096)
    """Most workers the job may use; more workers lower the gradient accumulation."""
    devices_per_worker: int = Field(default=1, ge=1, le=64)
    """Processes (devices) per worker, `torchrun --nproc-per-node`."""
    accelerator: Literal["nvidia.com/gpu", "google.com/tpu", "none"] = "nvidia.com/gpu"
    """Extended resource requested per device, or `none` to train on CPU."""
    resources: Resources | None = None
    """Container resources of each worker besides the accelerator."""
    pod: PodOverrides = _sub(PodOverrides)
    """Scheduling overrides for the worker pods."""
    collective_timeout_seconds: int = Field(default=120, ge=10, le=86_400)
    """How long a worker waits in a collective (an all-reduce, a barrier) for its peers before it gives up
    and its agent starts the group again: how long a job stalls when a node stops answering before the
    workers left go on without it (from their newest checkpoint). Longer than a step and a checkpoint save
    take on the slowest rank, or a slow save ends the run's group."""
    max_restarts: int = Field(default=3, ge=0, le=1000)
    """Worker pods replaced after they failed or were lost (torchrun's own restarts inside a pod do not
    count); one more failure and the job is Failed."""

    rules = (
        Rule(
            "self.min <= self.max",
            "workers.min must be <= workers.max: raise workers.max or lower workers.min",
            lambda s: s.min <= s.max,
            lambda s: f"min={s.min}, max={s.max}",
            ".min",
        ),
    )
