"""The test control plane is the real thing: the scheduler places GPU pods, unschedulable pods stay
Pending, the garbage collector deletes dependents, and RBAC refuses an account without rights."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.cluster.cluster import Cluster, tools
from tests.helpers import wait_for

pytestmark = pytest.mark.e2e

TOLERATE_FAKE = [client.V1Toleration(key="kwok.x-k8s.io/node", operator="Exists", effect="NoSchedule")]


def gpu_pod(name: str, gpus: int) -> client.V1Pod:
    container = client.V1Container(
        name="train",
        image="trainer:test",
        resources=client.V1ResourceRequirements(limits={"nvidia.com/gpu": str(gpus)}),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(containers=[container], tolerations=TOLERATE_FAKE),
    )


def test_a_gpu_pod_is_scheduled_on_a_fake_gpu_node_and_runs(core, namespace):
    core.create_namespaced_pod(namespace, gpu_pod("fits", 4))
    pod = wait_for(
        lambda: (p := core.read_namespaced_pod("fits", namespace)).status.phase == "Running" and p,
        what="the pod to run",
    )
    node = core.read_node(pod.spec.node_name)
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.metadata.annotations["kwok.x-k8s.io/node"] == "fake"


def test_a_pod_wanting_more_gpus_than_any_node_stays_pending_until_a_bigger_node_comes(cluster, core, namespace):
    core.create_namespaced_pod(namespace, gpu_pod("too-big", 9))

    def unschedulable():
        pod = core.read_namespaced_pod("too-big", namespace)
        conditions = {c.type: c for c in pod.status.conditions or []}
        scheduled = conditions.get("PodScheduled")
        return pod.status.phase == "Pending" and scheduled and scheduled.reason == "Unschedulable" and scheduled

    condition = wait_for(unschedulable, what="the scheduler's verdict")
    assert "Insufficient nvidia.com/gpu" in condition.message
    # A node added during the test takes it; removing the node again leaves the cluster as it was.
    cluster.add_node("gpu-big", gpus=16)
    try:
        pod = wait_for(
            lambda: (p := core.read_namespaced_pod("too-big", namespace)).status.phase == "Running" and p,
            what="the pod on the new node",
        )
        assert pod.spec.node_name == "gpu-big"
    finally:
        core.delete_namespaced_pod("too-big", namespace, grace_period_seconds=0)
        cluster.remove_node("gpu-big")
    assert "gpu-big" not in [n.metadata.name for n in core.list_node().items]


def test_deleting_an_owner_deletes_its_dependents(core, namespace):
    owner = core.create_namespaced_config_map(namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner")))
    reference = client.V1OwnerReference(api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid)
    core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[reference]))
    )
    core.delete_namespaced_config_map("owner", namespace)

    def gone():
        try:
            core.read_namespaced_config_map("dependent", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for(gone, what="the garbage collector")


def test_a_service_account_without_rights_is_refused(cluster, core, namespace):
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = cluster.token_for("nobody", namespace)
    configuration = client.Configuration()
    configuration.host = cluster.api.configuration.host
    configuration.ssl_ca_cert = cluster.api.configuration.ssl_ca_cert
    configuration.api_key = {"authorization": f"Bearer {token}"}
    as_nobody = client.CoreV1Api(client.ApiClient(configuration))
    with pytest.raises(ApiException) as refused:
        as_nobody.list_namespaced_pod(namespace)
    assert refused.value.status == 403
    assert f"system:serviceaccount:{namespace}:nobody" in refused.value.body


def test_start_is_quick_and_teardown_leaves_no_process_or_port(tmp_path):
    """A second, small cluster: up in seconds, and nothing of it left after stop()."""
    import socket

    second = Cluster(tmp_path / "second", tools())
    started = time.monotonic()
    try:
        second.start(gpu_nodes=1, gpus_per_node=2, cpu_nodes=0)
        took = time.monotonic() - started
        pids = [p.pid for p in second.processes.values()]
        port = int(second.server.rsplit(":", 1)[1])
    finally:
        second.stop()
    assert took < 30, f"start-up took {took:.1f} s"
    assert all(not Path(f"/proc/{pid}").exists() for pid in pids)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # closed connections may linger in TIME_WAIT
        s.bind(("127.0.0.1", port))  # nothing listens on the API server's port any more
        s.listen()
