"""Jobs contending for too few GPUs, on the test control plane with real training through the pod runner:
the operator's allocator (largebatch.allocate, kube/sharing.py) moves GPUs between jobs. A job of higher
priority takes a GPU from a running lower one: the shrunk job's worker checkpoints on SIGTERM before the
other grows into its GPU, and both jobs end with every sample, once, in order.

The operator counts only this test's GPU nodes (LARGEBATCH_SHARED_NODES, a label on them): the other
tests' nodes are the cluster's, not this test's pool."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import (
    KWOK_TOLERATION,
    apply,
    contiguous,
    gpu_pool,
    history,
    job_document,
    on_nodes,
    shared_claim,
    status_of,
    wait_or_explain,
    wait_until_succeeded,
)
from tests.e2e.operator_process import OperatorProcess

pytestmark = pytest.mark.e2e

POOL_LABEL = "largebatch.io/test-pool"


def contender(name: str, nodes: list[str], batch: int, total: int, priority: int = 0) -> dict:
    """A linreg job of constant `batch` in micro-batches of 16 (one GPU each) on `nodes`, checkpointing on
    a claim of its own."""
    pod = {"tolerations": [KWOK_TOLERATION], "affinity": on_nodes(nodes)}
    document = job_document(name, f"ckpt-{name}", total=total, min=1, max=len(nodes), pod=pod)
    policy = {"type": "constant"}
    document["spec"]["batch"] = {"initial": batch, "max": batch, "microBatchPerDevice": 16, "policy": policy}
    document["spec"]["priority"] = priority
    return document


@contextlib.contextmanager
def sharing(
    crd, namespace: str, gpus: int, operator_kubeconfig, tmp_path
) -> Iterator[tuple[list[str], OperatorProcess]]:
    """`gpus` one-GPU nodes labelled as this test's pool, and an operator that shares only them."""
    pool = namespace[:40].strip("-")  # a label value ends in a letter or digit
    with gpu_pool(crd, namespace, gpus) as nodes:
        for node in nodes:
            crd.kubectl("label", "node", node, f"{POOL_LABEL}={pool}")
        operator = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log",
                                         LARGEBATCH_SHARED_NODES=f"{POOL_LABEL}={pool}")  # fmt: skip
        try:
            yield nodes, operator
        finally:
            operator.stop()


def world(crd, namespace: str, name: str) -> int:
    return status_of(crd, namespace, name).get("plan", {}).get("worldSize", 0)


def rescales(crd, namespace: str, name: str) -> list[dict]:
    return status_of(crd, namespace, name).get("rescales", {}).get("recent", [])


def finished_whole(crd, namespace: str, name: str, total: int, tmp_path) -> None:
    assert status_of(crd, namespace, name)["progress"]["samples"] == total
    assert contiguous(history(tmp_path, f"ckpt-{name}"), total)


def test_a_higher_priority_job_takes_a_gpu_from_a_running_lower_one(crd, namespace, operator_kubeconfig, tmp_path):
    low_total, high_total = 32 * 4_000, 32 * 1_500
    for name in ("low", "high"):
        shared_claim(crd, namespace, f"ckpt-{name}")
    with sharing(crd, namespace, 2, operator_kubeconfig, tmp_path) as (nodes, operator), \
            PodRunner(crd, namespace, tmp_path / "pods") as pods:  # fmt: skip
        explain = dict(cluster=crd, namespace=namespace, pods=pods, log_path=operator.log)
        assert apply(crd, contender("low", nodes, 32, low_total), namespace).returncode == 0
        wait_or_explain(lambda: world(crd, namespace, "low") == 2 and status_of(crd, namespace, "low")["progress"]
                        ["step"] > 100, "the low job training on both GPUs", name="low", **explain)  # fmt: skip
        alone = status_of(crd, namespace, "low")["allocation"]
        assert (alone["workers"], alone["demand"]) == (2, 2)

        # The low job's trainers held still until the operator has moved the GPU: however fast this machine
        # trains, the low job is still running when the high one arrives.
        with contextlib.ExitStack() as held:
            for worker in ("low-worker-0", "low-worker-1"):
                held.enter_context(pods.paused(worker))
            assert apply(crd, contender("high", nodes, 32, high_total, priority=1), namespace).returncode == 0
            gave = lambda: [r for r in rescales(crd, namespace, "low") if (r["from"], r["to"]) == (2, 1)]  # noqa: E731
            given = wait_or_explain(gave, "the low job to give a GPU up", name="low", **explain)
        assert "higher priority" in given[0]["reason"] and f"{namespace}/high" in given[0]["reason"]
        wait_or_explain(lambda: world(crd, namespace, "high") == 1, "the high job training on the GPU it took",
                        name="high", **explain)  # fmt: skip
        high = status_of(crd, namespace, "high")["allocation"]
        assert (high["workers"], high["demand"]) == (1, 2)  # workers.min of the low job is kept
        wait_until_succeeded(crd, namespace, "high", pods, operator.log)
        wait_until_succeeded(crd, namespace, "low", pods, operator.log)
        assert pods.errors == []
    for name, total in (("low", low_total), ("high", high_total)):
        finished_whole(crd, namespace, name, total, tmp_path)
    # The low job went on at accumulation 2 on one worker: its batch stayed 32 throughout.
    assert {batch for _, _, batch, _, _ in history(tmp_path, "ckpt-low")} == {32}
    assert 1 in {workers for *_, workers, _ in history(tmp_path, "ckpt-low")}
