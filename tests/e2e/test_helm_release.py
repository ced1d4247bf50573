"""The chart on the real control plane: what it renders is valid for the API server (a server-side dry
run, with the default values and four other sets, one with every monitoring object on), and a release
installs, upgrades and uninstalls, with an operator under exactly the release's RBAC (namespaced Roles,
from `watchNamespaces`) training-side objects for a job in between; and an operator with the
environment the chart's Deployment gives it (every namespace, health endpoint) trains a job."""

from __future__ import annotations

import urllib.request

import pytest
from kubernetes import client

from tests.e2e.jobs import CHART, OPERATOR_NAMESPACE, RELEASE, apply, job_document
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import free_port, wait_for

pytestmark = pytest.mark.e2e

VALUE_SETS = {
    "defaults": [],
    "namespaced": ["--set", "watchNamespaces={NAMESPACE}"],
    "two-replicas-scheduled": [
        "--set",
        "replicas=2",
        "--set",
        "nodeSelector.pool=system",
        "--set",
        "tolerations[0].key=dedicated",
        "--set",
        "tolerations[0].operator=Exists",
        "--set",
        "resources.limits.cpu=1",
    ],  # fmt: skip
    "own-account-no-service": [
        "--set",
        "serviceAccount.create=false",
        "--set",
        "serviceAccount.name=ops",
        "--set",
        "metrics.service=false",
        "--set",
        "imagePullSecrets[0].name=registry",
    ],  # fmt: skip
    # The Prometheus Operator's CRDs are installed (fixture): the API server checks the monitors and the
    # rule against their schemas.
    "monitoring": [
        "--api-versions",
        "monitoring.coreos.com/v1",
        "--set",
        "monitoring.serviceMonitor.enabled=true,monitoring.podMonitor.enabled=true",
        "--set",
        "monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true",
        "--set",
        "monitoring.labels.release=kube-prometheus-stack",
        "--set",
        "watchNamespaces={NAMESPACE}",
    ],  # fmt: skip
}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_what_the_chart_renders_the_api_server_takes(crd, prometheus_operator_crds, namespace, values):
    values = [v.replace("NAMESPACE", namespace) for v in values]
    rendered = crd.helm("template", "dry", str(CHART), "--namespace", namespace, *values).stdout
    result = crd.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert result.returncode == 0, result.stderr
    assert "deployment.apps/dry-operator created (server dry run)" in result.stdout
    if "--api-versions" in values:
        for made in ("servicemonitor", "podmonitor", "prometheusrule"):
            assert f"{made}.monitoring.coreos.com/dry-operator" in result.stdout
        assert "configmap/dry-operator-dashboard-job created" in result.stdout


def test_install_upgrade_and_uninstall_with_namespaced_rights(crd, namespace, tmp_path):
    release, home = "scoped", f"{namespace[:40]}-ops"
    crd.helm("install", release, str(CHART), "--namespace", home, "--create-namespace",
             "--set", f"watchNamespaces={{{namespace}}}")  # fmt: skip
    rbac = client.RbacAuthorizationV1Api(crd.api)
    assert [r.metadata.name for r in rbac.list_namespaced_role(namespace).items] == [f"{release}-operator"]
    kubeconfig = crd.kubeconfig_for(f"{release}-operator", home, tmp_path)
    operator = OperatorProcess.start(kubeconfig, namespace, tmp_path / "operator.log")
    try:
        assert apply(crd, job_document("scoped", None), namespace).returncode == 0
        core = client.CoreV1Api(crd.api)
        wait_for(lambda: [p for p in core.list_namespaced_pod(namespace).items if p.metadata.name == "scoped-worker-0"],
                 what="the job's first worker, created under the Role")  # fmt: skip
        trainer = f"system:serviceaccount:{home}:{release}-operator"
        other = crd.kubectl("auth", "can-i", "create", "pods", f"--as={trainer}", "-n", "default", check=False)
        assert other.stdout.strip() == "no"  # rights only where it was asked to work

        crd.helm("upgrade", release, str(CHART), "--namespace", home, "--reuse-values",
                 "--set", "operator.reconcileSeconds=2")  # fmt: skip
        deployment = client.AppsV1Api(crd.api).read_namespaced_deployment(f"{release}-operator", home)
        env = {e.name: e.value for e in deployment.spec.template.spec.containers[0].env}
        assert env["LARGEBATCH_RECONCILE_SECONDS"] == "2" and env["LARGEBATCH_WATCH_NAMESPACES"] == namespace
        crd.kubectl("delete", "lbj", "scoped", "-n", namespace, "--timeout=60s")  # while an operator runs
    finally:
        operator.stop()
    crd.helm("uninstall", release, "--namespace", home, "--wait")
    assert not rbac.list_namespaced_role(namespace).items
    assert not [b for b in rbac.list_cluster_role_binding().items if b.metadata.name == f"{release}-operator"]
    assert crd.kubectl("get", "crd", "largebatchjobs.largebatch.io", check=False).returncode == 0  # CRDs stay


def test_the_charts_operator_settings_serve_every_namespace_and_answer_its_probes(crd, namespace, operator_kubeconfig,
                                                                                   tmp_path):  # fmt: skip
    """The operator with the environment of the session release's own Deployment (every namespace, the
    release's cluster peering, kopf's health endpoint) trains a job under the ClusterRole, and the
    endpoint both probes ask answers."""
    deployment = client.AppsV1Api(crd.api).read_namespaced_deployment(f"{RELEASE}-operator", OPERATOR_NAMESPACE)
    env = {e.name: e.value or "" for e in deployment.spec.template.spec.containers[0].env}  # "" reads as None
    assert env["LARGEBATCH_WATCH_NAMESPACES"] == "" and env["LARGEBATCH_PEERING"] == f"{RELEASE}-operator"
    health = f"http://127.0.0.1:{free_port()}/healthz"  # the chart's 0.0.0.0:8080, on a free port here
    env = env | {"LARGEBATCH_LIVENESS_ENDPOINT": health}
    env.pop("LARGEBATCH_OPERATOR_METRICS_PORT")  # a free port of the test's
    operator = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log", **env)
    try:
        wait_for(lambda: _answers(health), what=f"{health} to answer")
        assert apply(crd, job_document("everywhere", None), namespace).returncode == 0
        core = client.CoreV1Api(crd.api)
        wait_for(lambda: [p for p in core.list_namespaced_pod(namespace).items
                          if p.metadata.name == "everywhere-worker-0"],
                 what="the job's first worker, created by the cluster-wide operator")  # fmt: skip
        assert _answers(health)
        crd.kubectl("delete", "lbj", "everywhere", "-n", namespace, "--timeout=60s")  # while an operator runs
    finally:
        operator.stop()
    # It acted in the release's peering: said once at its start, before it met every other test's jobs (it
    # serves every namespace), so the whole log is read, not its tail.
    assert "Resuming operations" in operator.log.read_text(errors="replace"), operator.tail()


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False
