"""A sharded job through the operator, on the real control plane: `parallelism.dataParallel: hybrid` with
pods of two ranks each (sharded within a pod, replicated across pods). It starts on one pod, the operator
adds the second at the Seesaw cut, the ranks of the new world load the shards the old one wrote, and the
job succeeds having used every sample."""

from __future__ import annotations

import pytest

from largebatch_trainer import checkpoint
from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import GROWING_TOTAL, apply, contiguous, growing_job, shared_claim, status_of, wait_until_succeeded
from tests.helpers import simulated_task

pytestmark = pytest.mark.e2e


def test_a_hybrid_job_of_two_rank_pods_grows_to_two_pods_at_the_cut_and_succeeds(crd, namespace, operator, tmp_path):
    shared_claim(crd, namespace, "checkpoints")
    document = growing_job("hybrid", "checkpoints")
    spec = document["spec"]
    spec["workers"]["devicesPerWorker"] = 2
    spec["parallelism"] = {"dataParallel": "hybrid"}
    # Micro-batches of 8: batch 16 is one pod's two ranks, the cut's 32 needs two pods (or accumulation 2 on
    # one). Two ranks a pod take half a step's samples each: at twice growing_job's pace a sample, the run
    # after the cut lasts as long on one pod as growing_job's does on one worker.
    spec["batch"]["microBatchPerDevice"] = 8
    spec["task"] = simulated_task(0.024)
    with PodRunner(crd, namespace, tmp_path / "pods") as pods:
        assert apply(crd, document, namespace).returncode == 0
        wait_until_succeeded(crd, namespace, "hybrid", pods, operator.log)
        assert pods.errors == []
        assert {"hybrid-rdzv", "hybrid-worker-0", "hybrid-worker-1"} <= set(pods.started)
    status = status_of(crd, namespace, "hybrid")
    assert status["progress"]["samples"] == GROWING_TOTAL and status["progress"]["done"] is True
    directory = tmp_path / "pods" / "pvc-checkpoints"
    newest = checkpoint.all_checkpoints(directory)[-1]
    assert checkpoint.is_sharded(newest)
    state = checkpoint.newest_intact(directory)[1]
    worlds = [run[3] for run in state["history"]]
    assert worlds[0] == 2 and worlds[-1] == 4, state["history"]  # one pod of two ranks, then two
    assert contiguous(state["history"], GROWING_TOTAL)
