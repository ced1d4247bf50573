"""The Helm chart: it lints, its CRD is the generated one, and what it renders is least privilege (no
Secrets, no wildcards), runs the operator as non-root with peering, and peers per watched namespace."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from largebatch import crd
from largebatch.kube import world
from tests.cluster.cluster import tools
from tests.helpers import ROOT

CHART = ROOT / "charts" / "largebatch"


@pytest.fixture(scope="module")
def helm() -> str:
    return str(tools() / "helm")


def render(helm: str, *values: str) -> list[dict]:
    out = subprocess.run([helm, "template", "lb", str(CHART), "-n", "lb-system", *values],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return [d for d in yaml.safe_load_all(out) if d]


def test_the_chart_lints(helm):
    result = subprocess.run([helm, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_charts_crd_is_the_generated_one():
    assert (CHART / "crds" / crd.CRD_FILE).read_text() == crd.crd_yaml(), "the chart's CRD drifted: run `make crds`"


@pytest.mark.parametrize("values", [[], ["--set", "watchNamespaces={team-a,team-b}"]], ids=["cluster", "namespaced"])
def test_the_operator_has_least_privilege(helm, values):
    documents = render(helm, *values)
    roles = [d for d in documents if d["kind"] in ("ClusterRole", "Role")]
    for rule in (rule for role in roles for rule in role["rules"]):
        assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
        assert "secrets" not in rule["resources"], rule
        if "pods" in rule["resources"]:
            assert set(rule["verbs"]) == {"get", "list", "watch", "create", "delete"}
    binding = next(d for d in documents if d["kind"] == "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "lb-operator", "namespace": "lb-system"}]


@pytest.mark.parametrize("values", [[], ["--set", "watchNamespaces={team-a}"]], ids=["cluster", "namespaced"])
def test_kueue_enabled_adds_the_rights_to_workloads_and_nothing_else(helm, values):
    def rules(*extra: str) -> list[dict]:
        documents = render(helm, *values, *extra)
        return [rule for d in documents if d["kind"] in ("ClusterRole", "Role") for rule in d["rules"]]

    without, with_kueue = rules(), rules("--set", "kueue.enabled=true")
    assert not any("kueue.x-k8s.io" in rule["apiGroups"] for rule in without)
    added = [rule for rule in with_kueue if rule not in without]
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in added} == {
        (("workloads",), ("list", "create", "patch", "delete")),
        (("workloads/status",), ("update",)),
        (("resourceflavors", "workloadpriorityclasses"), ("get",)),
    }
    assert all(rule["apiGroups"] == ["kueue.x-k8s.io"] for rule in added)


def test_the_deployment_runs_the_operator_as_non_root_with_peering(helm):
    documents = render(helm, "--set", "replicas=2", "--set", "resources.limits.cpu=2")
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert deployment["spec"]["replicas"] == 2 and pod["serviceAccountName"] == "lb-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert container["image"] == f"ghcr.io/largebatch/operator:{chart['appVersion']}"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["limits"] == {"cpu": 2, "memory": "512Mi"}
    # Both probes ask kopf's health endpoint, on the port the operator is told to serve it on.
    health = next(p for p in container["ports"] if p["name"] == "health")["containerPort"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["LARGEBATCH_LIVENESS_ENDPOINT"] == f"http://0.0.0.0:{health}/healthz"
    assert env["LARGEBATCH_PEERING"] == "lb-operator" and env["LARGEBATCH_WATCH_NAMESPACES"] == ""
    assert [d["metadata"]["name"] for d in documents if d["kind"] == "ClusterKopfPeering"] == ["lb-operator"]
    assert env["LARGEBATCH_SHARED_NODES"] == ""


def test_the_shared_nodes_reach_the_operator_as_one_selector(helm):
    documents = render(helm, "--set", "operator.sharedNodes.pool=gpu", "--set", "operator.sharedNodes.zone=a")
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert world.parse_selector(env["LARGEBATCH_SHARED_NODES"]) == {"pool": "gpu", "zone": "a"}


def test_every_name_fits_a_dns_label_for_the_longest_release_name(helm):
    release = "r" * 53  # Helm's own limit on a release name
    out = subprocess.run(
        [helm, "template", release, str(CHART), "-n", "lb-system", "--api-versions", "monitoring.coreos.com/v1",
         "--set", "monitoring.serviceMonitor.enabled=true,monitoring.podMonitor.enabled=true",
         "--set", "monitoring.prometheusRule.enabled=true,monitoring.dashboards.enabled=true"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    documents = [d for d in yaml.safe_load_all(out) if d]
    names = [d["metadata"]["name"] for d in documents]
    assert len(names) > 10
    assert max(len(n) for n in names) <= 63, [n for n in names if len(n) > 63]
    # The operator-down alert finds the operator by its metrics Service's (shortened) name.
    service = next(d["metadata"]["name"] for d in documents if d["kind"] == "Service")
    assert service.endswith("-metrics") and f'job="{service}"' in out


def test_every_value_is_explained():
    """values.yaml is the chart's manual: every value has a comment on its line, or above it (one comment
    may cover the keys right below it, and a block's comment its keys)."""
    lines = (CHART / "values.yaml").read_text().splitlines()

    def explained(i: int) -> bool:
        for above in reversed(lines[:i]):
            if above.lstrip().startswith("#"):
                return True
            if not above.strip() or "#" in above:
                return False  # a blank line, or a key with its own comment
        return False

    for i, line in enumerate(lines):
        key = line.split("#", 1)[0].rstrip()
        if key.endswith(":") or ":" not in key:
            continue  # a block (its keys are checked) or a comment
        assert "#" in line or explained(i), f"values.yaml line {i + 1} has no comment: {line.strip()}"


def test_watched_namespaces_get_roles_and_peer_in_each(helm):
    documents = render(helm, "--set", "watchNamespaces={team-a,team-b}")
    peerings = [d for d in documents if d["kind"] == "KopfPeering"]
    assert sorted(d["metadata"]["namespace"] for d in peerings) == ["team-a", "team-b"]
    roles = {d["metadata"]["namespace"]: d for d in documents if d["kind"] == "Role"}
    bindings = {d["metadata"]["namespace"]: d for d in documents if d["kind"] == "RoleBinding"}
    assert sorted(roles) == sorted(bindings) == ["team-a", "team-b"]
    assert any("pods" in rule["resources"] for rule in roles["team-a"]["rules"])
    cluster_role = next(d for d in documents if d["kind"] == "ClusterRole")
    cluster_wide = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    assert cluster_wide == {"nodes", "customresourcedefinitions"}  # nothing namespaced, cluster-wide
    assert not [d for d in documents if d["kind"] == "ClusterKopfPeering"]
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    env = {e["name"]: e["value"] for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["LARGEBATCH_WATCH_NAMESPACES"] == "team-a,team-b"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("replicas=-1", "/replicas"),
        ("operatr.reconcileSeconds=1", "additional properties 'operatr' not allowed"),
        ("watchNamespaces={Team_A}", "/watchNamespaces/0"),
        ("image.pullPolicy=Sometimes", "/image/pullPolicy"),
        ("monitoring.prometheusRule.throughputDropRatio=2", "/monitoring/prometheusRule/throughputDropRatio"),
        ("monitoring.prometheusRule.noProgressFor=15 minutes", "/monitoring/prometheusRule/noProgressFor"),
        # Asked for, but the cluster has no Prometheus Operator: stopped with the way out, not left out.
        (
            "monitoring.podMonitor.enabled=true",
            "monitoring.podMonitor.enabled is true but the cluster has no monitoring.coreos.com/v1 API",
        ),
        ("monitoring.serviceMonitor.enabled=true,metrics.service=false", "needs metrics.service=true"),
    ],
)
def test_a_wrong_value_is_refused_with_its_field(helm, value, said):
    api = ["--api-versions", "monitoring.coreos.com/v1"] if "metrics.service" in value else []
    result = subprocess.run([helm, "template", "lb", str(CHART), "--set", value, *api], capture_output=True, text=True)
    assert result.returncode != 0 and said in result.stderr, result.stderr
