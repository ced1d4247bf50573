"""The chart's alerts, rendered from its PrometheusRule with the default values, pass `promtool check
rules` and promtool's unit tests (tests/unit/alerts.promtool.yaml: each alert firing and not firing)."""

from __future__ import annotations

import shutil
import subprocess

import yaml

from tests.cluster.cluster import tools
from tests.cluster.prometheus import promtool
from tests.helpers import ROOT

CHART = ROOT / "charts" / "largebatch"
ALERTS = ("LargeBatchJobCapacityLimited", "LargeBatchJobThroughputCollapsed", "LargeBatchJobBatchOffTarget",
          "LargeBatchJobNoProgress", "LargeBatchJobWorkerRestartLoop", "LargeBatchOperatorDown")  # fmt: skip


def rendered_rules() -> dict:
    command = [str(tools() / "helm"), "template", "lb", str(CHART), "-n", "lb-system", "--api-versions",
               "monitoring.coreos.com/v1", "--set", "monitoring.prometheusRule.enabled=true"]  # fmt: skip
    documents = yaml.safe_load_all(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
    rule = next(d for d in documents if d and d["kind"] == "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def test_every_alert_fires_when_it_should_and_only_then(tmp_path):
    rules = rendered_rules()
    assert sorted(r["alert"] for g in rules["groups"] for r in g["rules"]) == sorted(ALERTS)
    (tmp_path / "alerts.rules.yaml").write_text(yaml.safe_dump(rules))
    checked = promtool("check", "rules", str(tmp_path / "alerts.rules.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    shutil.copy(ROOT / "tests" / "unit" / "alerts.promtool.yaml", tmp_path)
    tested = promtool("test", "rules", str(tmp_path / "alerts.promtool.yaml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tests = yaml.safe_load((tmp_path / "alerts.promtool.yaml").read_text())["tests"]
    for alert in ALERTS:  # each has a case where it fires and one where it must not
        cases = [case for test in tests for case in test["alert_rule_test"] if case["alertname"] == alert]
        assert any(case["exp_alerts"] for case in cases) and any(not case["exp_alerts"] for case in cases), alert
