"""Settings the benchmarks measured to cost accuracy are said, not refused: `lbctl` warns on stderr and
goes on; the pure list the operator also reads names only the measured combination."""

from __future__ import annotations

import pytest

from largebatch.caveats import caveats
from tests.helpers import EXAMPLES, job_file, lbctl, make_spec, set_in


@pytest.mark.parametrize(
    ("policy", "scaling", "warned"),
    [
        ("criticalBatch", "sqrt", True),
        ("criticalBatch", "none", True),
        ("criticalBatch", "linear", False),
        ("seesaw", "sqrt", False),
        ("constant", "sqrt", False),
    ],
)
def test_the_critical_batch_policy_off_the_linear_rule_is_the_one_caveat(policy, scaling, warned):
    spec = make_spec(batch={"policy": {"type": policy}}, optimizer={"lr": 0.1, "scaling": scaling})
    found = caveats(spec)
    assert [c.reason for c in found] == (["CriticalBatchOffLinearRule"] if warned else [])
    if warned:
        assert f"optimizer.scaling {scaling}" in found[0].message and "optimizer.scaling: linear" in found[0].message


def test_lbctl_warns_and_goes_on(tmp_path):
    path = job_file(tmp_path, set_in("batch.policy", {"type": "criticalBatch"}))
    result = lbctl("plan", str(path))
    assert result.returncode == 0, result.stderr
    assert "warning:" in result.stderr and "optimizer.scaling sqrt" in result.stderr
    assert "warning:" not in lbctl("plan", str(EXAMPLES / "critical-batch.yaml")).stderr
