"""Settings the benchmarks measured to cost accuracy, for the shells to say where a job is read: `lbctl`
prints them, the operator puts each on the job once as a condition and a Warning Event. Not refused: a
user may choose them knowingly, and the measurements are of small models. Pure: no I/O."""

from __future__ import annotations

from dataclasses import dataclass

from largebatch.api import LargeBatchJobSpec


@dataclass(frozen=True)
class Caveat:
    reason: str
    """A CamelCase reason, the condition type and the Event reason on the cluster."""
    message: str


def caveats(spec: LargeBatchJobSpec) -> list[Caveat]:
    """What the benchmarks say about this job's settings that its author should know."""
    found = []
    if spec.batch.policy.type == "criticalBatch" and spec.optimizer.scaling != "linear":
        found.append(
            Caveat(
                "CriticalBatchOffLinearRule",
                f"batch.policy criticalBatch with optimizer.scaling {spec.optimizer.scaling}: the LR grows less "
                "than the batch, and on a configuration held out from tuning (pylm width 96, AdamW, three seeds) "
                "the grown batch ended 0.029 worse in held-out loss than constant batch under the square-root "
                'rule, and 0.008 better under the linear rule (benchmarks/README.md, "The critical-batch '
                'policy under the square-root rule"); set optimizer.scaling: linear, or use the seesaw policy',
            )
        )
    if spec.batch.policy.type == "criticalBatch" and spec.optimizer.name == "sgd":
        found.append(
            Caveat(
                "CriticalBatchWithSGD",
                "batch.policy criticalBatch with optimizer sgd: on configurations held out from tuning (pylm "
                "width 96, and width 48 depth 3, three seeds each) the grown batch ended 0.020 and 0.009 worse in "
                "held-out loss than constant batch under the linear rule, where AdamW ended 0.008 and 0.017 "
                'better (benchmarks/README.md, "The critical-batch policy under the square-root rule"); use '
                "optimizer adamw, or the seesaw policy, which held its loss with SGD",
            )
        )
    return found
