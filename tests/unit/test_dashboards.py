"""The Grafana dashboards: the files the chart ships are what dev/dashboards.py generates (`make
dashboards`), every query reads the data source variable and the job selector, and the chart turns each
into a ConfigMap the Grafana sidecar picks up. Their PromQL is run against a real Prometheus in
tests/e2e/test_prometheus.py."""

from __future__ import annotations

import json
import subprocess

import yaml

from dev import dashboards
from tests.cluster.cluster import tools
from tests.helpers import ROOT

FOLDER = ROOT / "charts" / "largebatch" / "dashboards"


def test_the_shipped_dashboards_are_the_generated_ones():
    generated = dashboards.render()
    assert sorted(generated) == sorted(p.name for p in FOLDER.glob("*.json"))
    for name, text in generated.items():
        assert (FOLDER / name).read_text() == text, f"{name} drifted from dev/dashboards.py: run `make dashboards`"


def panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_every_query_reads_the_chosen_data_source_and_job():
    job = json.loads((FOLDER / "largebatch-job.json").read_text())
    operator = json.loads((FOLDER / "largebatch-operator.json").read_text())
    assert [v["name"] for v in job["templating"]["list"]] == ["datasource", "namespace", "job"]
    for board in (job, operator):
        assert len(panels(board)) >= 6
        for panel in panels(board):
            assert panel["datasource"]["uid"] == "${datasource}" and panel["targets"], panel["title"]
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == "${datasource}"
                if board is job:
                    assert 'namespace="$namespace", job_name="$job"' in target["expr"], panel["title"]
    assert [a["name"] for a in job["annotations"]["list"]] == ["Rescale"]
    # What the issue asked each dashboard to show (rescales are the annotation above).
    assert {p["title"] for p in panels(job)} >= {
        "Samples per second", "Tokens per second", "Loss", "Global batch: target and actual",
        "Micro-batch and accumulation", "Workers", "Learning rate", "Gradient noise scale and global batch",
        "Step time", "Checkpoint duration",
    }  # fmt: skip
    assert {p["title"] for p in panels(operator)} >= {
        "Jobs by phase", "Reconcile latency", "Scale decisions by reason", "Capacity-limited jobs",
    }  # fmt: skip


def test_the_chart_ships_each_dashboard_to_the_grafana_sidecar():
    command = [str(tools() / "helm"), "template", "lb", str(ROOT / "charts" / "largebatch"), "-n", "lb-system",
               "--set", "monitoring.dashboards.enabled=true,monitoring.dashboards.folder=Training"]  # fmt: skip
    documents = [d for d in yaml.safe_load_all(subprocess.run(command, check=True, capture_output=True,
                                                              text=True).stdout) if d]  # fmt: skip
    maps = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ConfigMap"}
    assert sorted(maps) == ["lb-operator-dashboard-job", "lb-operator-dashboard-operator"]
    for config_map in maps.values():
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "Training"}
        ((name, text),) = config_map["data"].items()
        assert json.loads(text) == json.loads((FOLDER / name).read_text())
