"""Settings the benchmarks measured to cost accuracy are said, not refused: `lbctl` warns on stderr and
goes on; the pure list the operator also reads names only the measured combinations."""

from __future__ import annotations

import pytest

from largebatch.caveats import caveats
from tests.helpers import EXAMPLES, job_file, lbctl, make_spec, set_in


@pytest.mark.parametrize(
    ("policy", "optimizer", "scaling", "warned"),
    [
        ("criticalBatch", "adamw", "sqrt", ["CriticalBatchOffLinearRule"]),
        ("criticalBatch", "adamw", "none", ["CriticalBatchOffLinearRule"]),
        ("criticalBatch", "adamw", "linear", []),
        ("criticalBatch", "sgd", "linear", ["CriticalBatchWithSGD"]),
        ("criticalBatch", "sgd", "sqrt", ["CriticalBatchOffLinearRule", "CriticalBatchWithSGD"]),
        ("criticalBatch", "lamb", "linear", []),
        ("seesaw", "adamw", "sqrt", []),
        ("seesaw", "sgd", "linear", []),
        ("constant", "sgd", "sqrt", []),
    ],
)
def test_only_the_measured_losing_combinations_are_caveats(policy, optimizer, scaling, warned):
    spec = make_spec(batch={"policy": {"type": policy}}, optimizer={"name": optimizer, "lr": 0.1, "scaling": scaling})
    found = {c.reason: c.message for c in caveats(spec)}
    assert list(found) == warned
    if "CriticalBatchOffLinearRule" in found:
        assert f"optimizer.scaling {scaling}" in found["CriticalBatchOffLinearRule"]
        assert "optimizer.scaling: linear" in found["CriticalBatchOffLinearRule"]
    if "CriticalBatchWithSGD" in found:
        assert "optimizer sgd" in found["CriticalBatchWithSGD"] and "seesaw" in found["CriticalBatchWithSGD"]


def test_lbctl_warns_and_goes_on(tmp_path):
    path = job_file(tmp_path, set_in("batch.policy", {"type": "criticalBatch"}))
    result = lbctl("plan", str(path))
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "optimizer.scaling sqrt" in result.stderr
    assert "warning:" not in lbctl("plan", str(EXAMPLES / "critical-batch.yaml")).stderr
