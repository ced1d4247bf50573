"""Observability on real components. The chart is installed with its ServiceMonitor, PodMonitor,
PrometheusRule and dashboards (the Prometheus Operator's CRDs present); an operator under that release's
RBAC reconciles a job; `lbctl run --local` trains the same job for real and grows from one worker to
two. A real Prometheus scrapes the workers and the operator and evaluates the chart's alerts. Every
endpoint passes `promtool check metrics`, and every query of every dashboard parses and returns a series.

The monitors themselves are not run (no Prometheus Operator here): Prometheus gets the equivalent static
scrape configs, and the test checks that the monitors' selectors match the Service and pods they are
meant for."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import urllib.request

import pytest
import yaml
from kubernetes import client

from tests.cluster.prometheus import Prometheus, promtool
from tests.e2e.jobs import CHART, apply, job_document
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import ROOT, bound, free_port, port_is_free, wait_for
from tests.integration.trainer_helpers import PYTHON, trainer_env, write_job

pytestmark = pytest.mark.e2e

RELEASE = "observed"
JOB = "observed"
MONITORING = "monitoring.serviceMonitor.enabled=true,monitoring.podMonitor.enabled=true,"
MONITORING += "monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true"
# What Grafana substitutes, with windows long enough for rate() over a short run scraped every second.
GRAFANA = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "5m"}


def dashboard_queries() -> dict[str, str]:
    """'dashboard / panel / legend' → PromQL, for every target of every panel and every annotation."""
    queries = {}
    for path in sorted((ROOT / "charts" / "largebatch" / "dashboards").glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                queries[f"{board['title']} / {panel['title']} / {target.get('legendFormat')}"] = target["expr"]
        for annotation in board["annotations"]["list"]:
            queries[f"{board['title']} / annotation {annotation['name']}"] = annotation["expr"]
    return queries


def substitute(expr: str, namespace: str) -> str:
    for name, value in GRAFANA.items():
        expr = expr.replace(name, value)
    return expr.replace("$namespace", namespace).replace("$job", JOB)


def two_free_ports() -> int:
    """A port P with P + 1 free too: the local run's two workers serve metrics on P and P + 1."""

    def adjacent() -> int | None:
        port = free_port()
        return port if port_is_free(port + 1) else None

    return wait_for(adjacent, what="two adjacent free ports")


def local_job(tmp_path, namespace: str):
    """The cluster job's twin for `lbctl run --local`: same namespace and name, so one dashboard selection
    shows the trainers' series and the operator's. Large enough to outlast the test."""
    path = write_job(
        tmp_path,
        JOB,
        task={"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"dim": 8, "samples": 4096}},
        workers={"min": 1, "max": 2},
        batch={"initial": 16, "max": 64, "microBatchPerDevice": 8, "policy": {"type": "seesaw"}},
        schedule={"totalSamples": 20_000_000, "warmupSamples": 160, "minLrRatio": 0.1},
        checkpoint={"everySteps": 200},
    )
    document = yaml.safe_load(path.read_text())
    document["metadata"]["namespace"] = namespace
    path.write_text(yaml.safe_dump(document))
    return path


def selects(selector: dict, labels: dict) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions with Exists and In) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        if operator == "Exists" and key not in labels:
            return False
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
    return True


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def test_prometheus_scrapes_real_runs_and_every_dashboard_query_answers(prometheus_operator_crds, namespace, tmp_path):
    cluster, home = prometheus_operator_crds, f"{namespace[:40]}-ops"
    custom, core = client.CustomObjectsApi(cluster.api), client.CoreV1Api(cluster.api)
    installed = cluster.helm("install", RELEASE, str(CHART), "--namespace", home, "--create-namespace",
                             "--set", f"watchNamespaces={{{namespace}}}", "--set", MONITORING)  # fmt: skip
    assert "Prometheus scrapes the operator and every trainer" in installed.stdout  # NOTES.txt
    operator = runner = prometheus = None
    try:
        # The release made its monitoring objects, because the cluster serves monitoring.coreos.com/v1.
        def monitoring(plural: str, name: str) -> dict:
            return custom.get_namespaced_custom_object("monitoring.coreos.com", "v1", home, plural, name)

        service_monitor = monitoring("servicemonitors", f"{RELEASE}-operator")
        pod_monitor = monitoring("podmonitors", f"{RELEASE}-operator-trainers")
        rules = {"groups": monitoring("prometheusrules", f"{RELEASE}-operator")["spec"]["groups"]}
        dashboards = core.list_namespaced_config_map(home, label_selector="grafana_dashboard=1").items
        assert len(dashboards) == 2
        service = core.read_namespaced_service(f"{RELEASE}-operator-metrics", home)
        assert selects(service_monitor["spec"]["selector"], service.metadata.labels)
        assert service_monitor["spec"]["endpoints"][0]["port"] in [p.name for p in service.spec.ports]

        operator = OperatorProcess.start(cluster.kubeconfig_for(f"{RELEASE}-operator", home, tmp_path), namespace,
                                         tmp_path / "operator.log")  # fmt: skip
        assert apply(cluster, job_document(JOB, None), namespace).returncode == 0
        selector = {"namespace": namespace, "job_name": JOB}
        wait_for(lambda: operator.metric("largebatch_operator_workers", **selector, state="ready"), timeout=120,
                 what="the operator to report the job's worker ready")  # fmt: skip
        worker = core.read_namespaced_pod(f"{JOB}-worker-0", namespace)
        assert selects(pod_monitor["spec"]["selector"], worker.metadata.labels)
        keep = pod_monitor["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["regex"]
        assert [p.name for p in worker.spec.containers[0].ports if re.fullmatch(keep, p.name)] == ["metrics"]

        port = two_free_ports()
        command = [PYTHON, "-m", "largebatch", "run", str(local_job(tmp_path, namespace)), "--local",
                   "--run-dir", str(tmp_path / "run"), "--metrics-port", str(port), "--capacity", "0:1,0.2%:2",
                   "--restart-cost", "0"]  # fmt: skip
        runner = subprocess.Popen(command, env=trainer_env(), stdout=open(tmp_path / "run.log", "wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
        prometheus = Prometheus.start(
            tmp_path / "prometheus",
            {"trainers": [f"127.0.0.1:{port}", f"127.0.0.1:{port + 1}"],
             # The job and namespace labels a ServiceMonitor's scrape would give: the operator-down alert
             # looks for them.
             f"{RELEASE}-operator-metrics": [f"127.0.0.1:{operator.metrics_port}"]},
            rules=rules,
            target_labels={f"{RELEASE}-operator-metrics": {"namespace": home}},
        )  # fmt: skip
        job = f'namespace="{namespace}", job_name="{JOB}"'
        wait_for(lambda: prometheus.query(f'largebatch_world_size{{{job}, rank="1"}} == 2'), timeout=300,
                 what=f"the local run to grow to two workers, scraped (log: {tmp_path / 'run.log'})")  # fmt: skip

        # promtool's lint on every endpoint: both trainer processes and the operator.
        for endpoint in (port, port + 1, operator.metrics_port):
            checked = promtool("check", "metrics", stdin=scrape(endpoint))
            assert checked.returncode == 0, f"port {endpoint}: {checked.stdout}{checked.stderr}"

        # Every query of every dashboard answers. Rates need two scrapes of the grown run: wait for them
        # (a state, not a time), then require all at once.
        queries = {name: substitute(expr, namespace) for name, expr in dashboard_queries().items()}
        # The rescale annotation marks a change, found over Grafana's time range rather than one rate
        # interval: give it the range a dashboard shows, or the grow would leave its window before every
        # other query has its two scrapes.
        for name in [n for n in queries if "/ annotation " in n]:
            queries[name] = substitute(dashboard_queries()[name].replace("$__rate_interval", "15m"), namespace)
        assert len(queries) >= 25
        empty = lambda: [name for name, expr in queries.items() if not prometheus.query(expr)]  # noqa: E731
        wait_for(lambda: not empty(), timeout=120, what="every dashboard query to return a series")
        for name in ("namespace", "job_name"):  # the dashboard's variables: label_values() over this metric
            values = {s[name] for s in prometheus.api("series", **{"match[]": "largebatch_progress_samples"})}
            assert {"namespace": namespace, "job_name": JOB}[name] in values

        # Every trainer series names its job and process; the actual batch is the target.
        def count(selector: str) -> str:
            (result,) = prometheus.query(f'count({{job="trainers", __name__=~"largebatch_.+"{selector}}})')
            return result["value"][1]

        assert int(count("")) > 40 and count("") == count(f', {job}, rank=~"0|1"')
        assert prometheus.query(
            f'largebatch_global_batch_size{{{job}, rank="0"}} == largebatch_global_batch_size_target{{{job}, rank="0"}}'
        )

        # The chart's alerts evaluate cleanly on the real series, and a healthy job pages no one.
        def evaluated() -> list[dict]:
            found = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
            return found if found and all(r.get("lastEvaluation", "").startswith("2") for r in found) else []

        evaluated_rules = wait_for(evaluated, what="every alert rule evaluated")
        assert len(evaluated_rules) == 6 and all(r["health"] == "ok" for r in evaluated_rules), evaluated_rules
        assert [a for a in prometheus.api("alerts")["alerts"] if a["state"] == "firing"] == []
    finally:
        if runner is not None:
            os.killpg(runner.pid, signal.SIGINT)  # Ctrl-C: the run checkpoints and stops
            try:
                runner.wait(timeout=bound(120))
            except subprocess.TimeoutExpired:
                os.killpg(runner.pid, signal.SIGKILL)
        if prometheus is not None:
            prometheus.stop()
        if operator is not None:
            cluster.kubectl("delete", "lbj", JOB, "-n", namespace, "--timeout=60s", check=False)
            operator.stop()
        cluster.helm("uninstall", RELEASE, "--namespace", home, "--wait")
