"""A real control plane for the e2e tests (tests/cluster), one per xdist worker that runs them
(tests/conftest.py says which lanes there are), started when its first test asks for it. The one real node
a machine has joins the control plane of the worker whose tests ask for it (`real_node`)."""

from __future__ import annotations

import re

import pytest
from kubernetes import client, config

from tests.cluster import images as container_images
from tests.cluster.cluster import Cluster, tools
from tests.cluster.kueue import Kueue
from tests.cluster.node import RealNode
from tests.e2e.jobs import CHART, OPERATOR_NAMESPACE, RELEASE
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import wait_for


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    """The control plane and KWOK's fake nodes, its API server listening where a real node's pods reach it
    should a test of this worker's ask for the real node."""
    handle = Cluster(tmp_path_factory.mktemp("cluster"), tools())
    try:
        handle.start(gpu_nodes=2, gpus_per_node=8, cpu_nodes=1, reachable_from_pods=True)
        handle.api = config.new_client_from_config(str(handle.kubeconfig))
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def real_node(cluster):
    """The cluster with the machine's one real node (tests/cluster/node.py): only the tests of one lane ask
    for it (tests/conftest.py), so no two workers start one."""
    cluster.add_real_node(RealNode)
    return cluster


@pytest.fixture(scope="session")
def docker(tmp_path_factory):
    """A Docker engine whose data (built layers, the debootstrap base) is kept in the per-user cache."""
    handle = container_images.Docker(tmp_path_factory.mktemp("docker"))
    yield handle
    handle.stop()


@pytest.fixture(scope="session")
def images(docker, real_node):
    """The operator and trainer images, built by `make images` on the debootstrap base and loaded into the
    real node's containerd (tests/cluster/images.py)."""
    built = container_images.build(docker)
    container_images.load(built, docker, real_node.node)
    return built


@pytest.fixture
def core(cluster) -> client.CoreV1Api:
    return client.CoreV1Api(cluster.api)


@pytest.fixture
def namespace(core, request) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower())[-50:].strip("-")
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # Pods need the namespace's default service account, which the controller-manager creates.
    wait_for(lambda: any(sa.metadata.name == "default" for sa in core.list_namespaced_service_account(name).items))
    yield name
    core.delete_namespace(name)


@pytest.fixture(scope="session")
def crd(cluster):
    """The cluster with the chart installed: the CRDs, the operator's ServiceAccount and ClusterRole. Its
    Deployment stays Pending (no fake node takes it); the tests run the operator as a local process
    with the chart's ServiceAccount token (`operator_kubeconfig`)."""
    cluster.helm("install", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--create-namespace")
    cluster.wait_established("largebatchjobs.largebatch.io", "kopfpeerings.kopf.dev")
    return cluster


@pytest.fixture(scope="session")
def operator_kubeconfig(crd, tmp_path_factory):
    """Credentials of the chart's operator ServiceAccount: an operator using them proves the chart's RBAC."""
    return crd.kubeconfig_for(f"{RELEASE}-operator", OPERATOR_NAMESPACE, tmp_path_factory.mktemp("operator"))


@pytest.fixture(scope="session")
def prometheus_operator_crds(cluster):
    """The Prometheus Operator's ServiceMonitor, PodMonitor and PrometheusRule CRDs, from its published
    module (tests/cluster/build_tools.sh): what a cluster with kube-prometheus-stack has."""
    folder = tools() / "crds"
    cluster.kubectl("apply", "--server-side", "-f", str(folder))
    cluster.wait_established(
        *(f"{name}.monitoring.coreos.com" for name in ("servicemonitors", "podmonitors", "prometheusrules"))
    )
    return cluster


@pytest.fixture(scope="session")
def kueue(crd):
    """Kueue's controller manager on the cluster (tests/cluster/kueue.py), and the chart's rights to
    Workloads (kueue.enabled): what a cluster with Kueue and the operator installed for it has."""
    handle = Kueue(crd)
    handle.start()
    crd.helm("upgrade", RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE, "--reuse-values",
             "--set", "kueue.enabled=true")  # fmt: skip
    try:
        yield crd
    finally:
        handle.stop()


@pytest.fixture
def operator(operator_kubeconfig, namespace, tmp_path):
    process = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log")
    yield process
    process.stop()
