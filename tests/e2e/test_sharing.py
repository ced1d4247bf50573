"""Jobs contending for too few GPUs, on the test control plane with real training through the pod runner:
the operator's allocator (largebatch.allocate, kube/sharing.py) moves GPUs between jobs. A job of higher
priority takes a GPU from a running lower one: the shrunk job's worker checkpoints on SIGTERM before the
other grows into its GPU, and both jobs end with every sample, once, in order.

The operator counts only this test's GPU nodes (LARGEBATCH_SHARED_NODES, a label on them): the other
tests' nodes are the cluster's, not this test's pool."""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Iterator

import pytest

from largebatch import simulation, timestamps
from largebatch.api import LargeBatchJobSpec
from tests.cluster.pod_runner import PodRunner
from tests.e2e.jobs import (
    KWOK_TOLERATION,
    POOL_LABEL,
    apply,
    explanation,
    finished_whole,
    gpu_pool,
    history,
    job_document,
    on_nodes,
    shared_claim,
    status_of,
    wait_or_explain,
    wait_until_succeeded,
    world,
)
from tests.e2e.operator_process import OperatorProcess
from tests.helpers import simulated_task

pytestmark = pytest.mark.e2e


def contender(name: str, nodes: list[str], batch: int, total: int, priority: int = 0) -> dict:
    """A job of constant `batch` in micro-batches of 16 (one GPU each) on `nodes`, checkpointing on a claim
    of its own, training the simulated task at 1 ms a sample (16 ms a micro-batch): steps that wait rather
    than compute (linreg's 5,500 steps flat out took 36 CPU s)."""
    pod = {"tolerations": [KWOK_TOLERATION], "affinity": on_nodes(nodes)}
    document = job_document(name, f"ckpt-{name}", total=total, min=1, max=len(nodes), pod=pod)
    policy = {"type": "constant"}
    document["spec"]["batch"] = {"initial": batch, "max": batch, "microBatchPerDevice": 16, "policy": policy}
    document["spec"]["priority"] = priority
    document["spec"]["task"] = simulated_task(0.001)
    return document


@contextlib.contextmanager
def sharing(
    crd, namespace: str, gpus: int, operator_kubeconfig, tmp_path, **env: str
) -> Iterator[tuple[list[str], OperatorProcess]]:
    """`gpus` one-GPU nodes labelled as this test's pool, and an operator that shares only them (with
    `env` too)."""
    pool = namespace[:40].strip("-")  # a label value ends in a letter or digit
    with gpu_pool(crd, namespace, gpus) as nodes:
        for node in nodes:
            crd.kubectl("label", "node", node, f"{POOL_LABEL}={pool}")
        operator = OperatorProcess.start(operator_kubeconfig, namespace, tmp_path / "operator.log",
                                         LARGEBATCH_SHARED_NODES=f"{POOL_LABEL}={pool}", **env)  # fmt: skip
        try:
            yield nodes, operator
        finally:
            operator.stop()


def rescales(crd, namespace: str, name: str) -> list[dict]:
    return status_of(crd, namespace, name).get("rescales", {}).get("recent", [])


def test_a_higher_priority_job_takes_a_gpu_from_a_running_lower_one(crd, namespace, operator_kubeconfig, tmp_path):
    low_total, high_total = 32 * 1_000, 32 * 500
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
        # The high job held still until the low one trains on its one GPU: however fast this machine
        # trains, the high job is not over before the low one's smaller group has started.
        with pods.paused("high-worker-0"):
            wait_or_explain(lambda: world(crd, namespace, "low") == 1, "the low job training on one GPU",
                            name="low", **explain)  # fmt: skip
        wait_until_succeeded(crd, namespace, "high", pods, operator.log)
        wait_until_succeeded(crd, namespace, "low", pods, operator.log)
        assert pods.errors == []
    for name, total in (("low", low_total), ("high", high_total)):
        finished_whole(crd, namespace, name, total, tmp_path)
    # The low job went on at accumulation 2 on one worker: its batch stayed 32 throughout.
    assert {batch for _, _, batch, _, _ in history(tmp_path, "ckpt-low")} == {32}
    assert 1 in {workers for *_, workers, _ in history(tmp_path, "ckpt-low")}


# --- a small trace, against the cluster simulation -------------------------------------------------------

SECONDS_PER_SAMPLE = 0.0125
"""The simulated trainers' speed: a micro-batch of 16 takes 0.2 s on any worker (sleeping, not computing)."""


def simulated(name: str, nodes: list[str], batch: dict, total: int, priority: int = 0) -> dict:
    """A job of simulated training (largebatch_trainer.tasks:simulated) with the `batch` given."""
    document = contender(name, nodes, 16, total, priority)
    document["spec"]["task"] = simulated_task(SECONDS_PER_SAMPLE)
    document["spec"]["batch"] |= batch
    return document


def step_time(workers: int, batch: int) -> float:
    """The simulated trainers' step: the largest local batch (the split differs by one at most) at the
    sleep's rate."""
    return -(-batch // workers) * SECONDS_PER_SAMPLE


def chain(workers: list[int]) -> list[int]:
    """The worker counts a job ran at, in order, without repeats or stops."""
    return [n for i, n in enumerate(workers) if n and (i == 0 or workers[i - 1] != n)]


def edits(a: list[int], b: list[int]) -> int:
    """Levenshtein distance: how many rescales one sequence has that the other does not."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        row, last = [i], row
        for j, y in enumerate(b, 1):
            row.append(min(last[j] + 1, row[j - 1] + 1, last[j - 1] + (x != y)))
    return row[-1]


def test_a_small_trace_runs_as_the_simulation_says(crd, namespace, operator_kubeconfig, tmp_path):
    """Three jobs of simulated training arrive on four GPUs as a trace (a big one, one whose batch grows,
    a short one of higher priority); the real operator's allocations, job by job, are the cluster
    simulation's (largebatch.simulation, what benchmarks/cluster_trace.py runs at scale) within one
    rescale, when the simulation is given the arrivals and the restart this run measured. The moves in
    between: the newcomer's fair share, a GPU to the job whose batch grew, one to the higher priority
    and back when it ends. Every job finishes with every sample, once, in order. The higher-priority job
    arrives at 100 s, or once the grower runs on two workers if that is later: on the clock alone, a
    loaded machine (a cold run's image build beside five lanes) slowed the grower's ramp until the
    newcomer came first and took big's GPU in its place, a different trace from the one asserted. The
    simulation is given the arrivals as they happened.

    The trainers are real (torchrun, the sample stream, checkpoints, reports); their model is simulated:
    each sample takes SECONDS_PER_SAMPLE of sleep, so a step takes what `step_time` says on any machine,
    within the trainer's own overhead."""
    ramp = {"type": "linearRamp", "linearRamp": {"increment": 16, "rampSamples": 16 * 100}}
    trace = {  # name: (arrival, s after the first job's; the job)
        "big": (0, lambda nodes: simulated("big", nodes, {"initial": 64, "max": 64}, 64 * 400)),
        "grower": (30, lambda nodes: simulated("grower", nodes, {"initial": 16, "max": 32, "policy": ramp},
                                               16 * 100 + 32 * 700)),
        "urgent": (100, lambda nodes: simulated("urgent", nodes, {"initial": 16, "max": 16}, 16 * 100, priority=1)),
    }  # fmt: skip
    for name in trace:
        shared_claim(crd, namespace, f"ckpt-{name}")
    seen: dict[str, list[tuple[float, int, int]]] = {name: [] for name in trace}  # (time, world size, samples)
    arrivals: dict[str, float] = {}
    documents = {}
    with sharing(crd, namespace, 4, operator_kubeconfig, tmp_path, LARGEBATCH_RESTART_SECONDS="10") as (
        nodes, operator), PodRunner(crd, namespace, tmp_path / "pods") as pods:  # fmt: skip
        start = time.time()  # the wall clock: the operator's rescales carry its times
        statuses: dict[str, dict] = {}
        while not arrivals or any(statuses.get(n, {}).get("phase") != "Succeeded" for n in trace):
            now = time.time() - start
            grown = any(world == 2 for _, world, _ in seen["grower"])
            for name, (arrival, document) in trace.items():
                # The trace's arrivals, on the clock; the urgent job's not before the grower has grown.
                if name not in arrivals and now >= arrival and (name != "urgent" or grown):
                    documents[name] = document(nodes)
                    assert apply(crd, documents[name], namespace).returncode == 0
                    arrivals[name] = now
            for name in arrivals:
                statuses[name] = status_of(crd, namespace, name)
                if statuses[name].get("phase") == "Failed" or now > 900:
                    raise AssertionError(explanation(f"{name} did not succeed", crd, namespace, name, pods,
                                                     operator.log))  # fmt: skip
                progress = statuses[name].get("progress", {})
                seen[name].append((now, statuses[name].get("plan", {}).get("worldSize", 0), progress.get("samples", 0)))
            time.sleep(0.5)  # a poll of the statuses, not a wait for a state
        assert pods.errors == []

    moves = {name: statuses[name].get("rescales", {}).get("recent", []) for name in trace}
    assert all(len(moves[n]) == statuses[n].get("rescales", {}).get("count", 0) for n in trace), statuses  # all kept
    restarts = []  # from each decision (a start: the job's creation) to the first samples at its worker count
    for name, rescales_ in moves.items():
        decisions = [(arrivals[name], 0, None)]
        decisions += [(timestamps.parse(r["time"]).timestamp() - start, r["samples"], r["to"]) for r in rescales_]
        for at, then, to in decisions:
            resumed = [t for t, n, samples in seen[name] if t > at and samples > then and n and n == (to or n)]
            if resumed:
                restarts.append(resumed[0] - at)
    restart = statistics.median(restarts)
    jobs = [simulation.Job(name, arrivals[name], LargeBatchJobSpec.model_validate(documents[name]["spec"]), step_time)
            for name in trace]  # fmt: skip
    result = simulation.simulate(jobs, "allocator", gpus=4, period=1.0, restart=restart, seed=0)
    expected = {j.name: chain([n for _, n in j.allocations]) for j in result.jobs}
    ran = {  # the operator's decisions; a job it never rescaled ran at one size
        name: chain([r["from"] for r in moves[name][:1]] + [r["to"] for r in moves[name]] if moves[name]
                    else [max(world for _, world, _ in seen[name])])
        for name in trace
    }  # fmt: skip
    ends = {name: next(round(t) for t, _, samples in seen[name] if samples >= document["spec"]["schedule"]
                       ["totalSamples"]) for name, document in documents.items()}  # fmt: skip
    simulated_ends = {j.name: round(j.finish) for j in result.jobs}
    said = (f"operator {ran}, ended at {ends} s; simulation {expected}, ended at {simulated_ends} s; "
            f"restart {restart:.1f} s (median of {len(restarts)})")  # fmt: skip
    print(said)
    assert all(edits(ran[name], expected[name]) <= 1 for name in trace), said

    def reason(name: str, before: int, after: int) -> str:
        found = [r["reason"] for r in moves[name] if (r["from"], r["to"]) == (before, after)]
        assert found, f"{name} never went from {before} to {after} workers: {moves[name]}"
        return found[0]

    assert "fair share" in reason("big", 4, 3) and f"{namespace}/grower (batch 16)" in reason("big", 4, 3)
    assert f"{namespace}/grower (batch 32)" in reason("big", 3, 2)
    # The grower grows once big's worker is gone (an ordered move): by then the GPU is free, and its reason
    # is its batch alone.
    assert "batch 32 runs 2 micro-batches per worker on 1" in reason("grower", 1, 2)
    assert "higher priority" in reason("grower", 2, 1) and f"{namespace}/urgent" in reason("grower", 2, 1)
    for name, document in documents.items():
        finished_whole(crd, namespace, name, document["spec"]["schedule"]["totalSamples"], tmp_path)
