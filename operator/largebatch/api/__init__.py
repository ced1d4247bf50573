"""The LargeBatchJob API (`largebatch.io/v1alpha1`): the single source of truth for the CRD.
A package of modules by block (`base`, `workers`, `batch`, `spec`, `status`); every model is
imported from here.

Every field's docstring becomes its `description` in the CRD, so `kubectl explain` shows it. Cross-field
rules are declared once as `Rule`s: the CRD carries them as CEL (`x-kubernetes-validations`, checked by
the API server at `kubectl apply`) and pydantic checks the same rule in Python (the CLI and the local
runner), so a job file is judged the same way everywhere.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from largebatch.api.base import (  # noqa: F401
    API_VERSION,
    GROUP,
    KIND,
    MAX_ACCUMULATION,
    MAX_NAME_LENGTH,
    MAX_RAMP_LEVELS,
    MAX_TOTAL_SAMPLES,
    PLURAL,
    SHORT_NAME,
    VERSION,
    FreeForm,
    Quantity,
    Rule,
    _Model,
    _sub,
)
from largebatch.api.batch import (  # noqa: F401
    CAP_AT_CRITICAL_BATCH_DEFAULT,
    CRITICAL_MIN_STEPS_DEFAULT,
    CRITICAL_MULTIPLIER_DEFAULT,
    CRITICAL_SMOOTHING_DEFAULT,
    PRECONDITIONED_OPTIMIZERS,
    SEESAW_CAP_MULTIPLIER_DEFAULT,
    BatchSpec,
    CriticalBatchSpec,
    LinearRampSpec,
    PolicySpec,
    SeesawSpec,
)
from largebatch.api.spec import (  # noqa: F401
    CHECKPOINT_PATH_DEFAULT,
    CheckpointSpec,
    EvaluationSpec,
    LargeBatchJobSpec,
    MetricsSpec,
    OptimizerSpec,
    ParallelismSpec,
    ScheduleSpec,
)
from largebatch.api.status import (  # noqa: F401
    AllocationStatus,
    Condition,
    LargeBatchJobStatus,
    PlanStatus,
    ProgressStatus,
    QueueStatus,
    Rescale,
    RescalesStatus,
    Throughput,
    WorkersStatus,
)
from largebatch.api.workers import (  # noqa: F401
    BF16_BY_DEFAULT,
    JOB_DIR,
    SHM_DIR,
    DataVolume,
    PodOverrides,
    Resources,
    SecretName,
    TaskSpec,
    Toleration,
    WorkersSpec,
)


class ObjectMeta(BaseModel):
    """The metadata a job file needs; everything else in it is kept as written."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: str = Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    namespace: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    """Kueue's `kueue.x-k8s.io/queue-name` and `kueue.x-k8s.io/priority-class` put a job under Kueue."""


class LargeBatchJob(_Model):
    """A LargeBatchJob manifest as written in a job file."""

    api_version: Literal["largebatch.io/v1alpha1"]
    kind: Literal["LargeBatchJob"]
    metadata: ObjectMeta
    spec: LargeBatchJobSpec
    status: LargeBatchJobStatus | None = None

    @classmethod
    def from_object(cls, obj: dict[str, Any]) -> LargeBatchJob:
        """A job as the API server returns it: its spec, name and namespace (the status and the
        server-side metadata are the operator's and the API server's, not the user's)."""
        meta = {key: obj["metadata"][key] for key in ("name", "namespace", "labels") if obj["metadata"].get(key)}
        return cls.model_validate({k: v for k, v in obj.items() if k != "status"} | {"metadata": meta})
