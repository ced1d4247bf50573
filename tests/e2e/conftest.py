"""A session-wide real control plane for the e2e tests (tests/cluster)."""

from __future__ import annotations

import re

import pytest
from kubernetes import client, config

from tests.cluster.cluster import Cluster, tools
from tests.e2e.jobs import CRD
from tests.helpers import wait_for


@pytest.fixture(scope="session")
def cluster(tmp_path_factory):
    handle = Cluster(tmp_path_factory.mktemp("cluster"), tools())
    try:
        handle.start(gpu_nodes=2, gpus_per_node=8, cpu_nodes=1)
        handle.api = config.new_client_from_config(str(handle.kubeconfig))
        yield handle
    finally:
        handle.stop()


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
    """The cluster with the LargeBatchJob CRD installed and established."""
    cluster.kubectl("apply", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/largebatchjobs.largebatch.io", "--timeout=30s")
    return cluster
