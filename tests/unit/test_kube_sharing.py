"""The operator's cluster-wide step without a cluster: what the jobs' pool of accelerators is (the nodes'
offer less what other pods hold), each job's demand as the allocator sees it, the shares of jobs that
contend, growth held back until the GPUs a shrinking job gives up are free, and what a reconcile makes
of a share (its capacity, status.allocation, the Event, the throughput it records)."""

from __future__ import annotations

import dataclasses
import datetime

from largebatch.api import LargeBatchJob
from largebatch.kube import world
from largebatch.kube.manifests import INDEX_LABEL, JOB_LABEL, ROLE_LABEL
from largebatch.kube.sharing import Share, asks_for_accelerators, demand, held, pool, shares
from tests.unit.test_kube_plan import RENDEZVOUS, STAMP, job, reconcile, seen, worker

GPU = "nvidia.com/gpu"
OFFER = world.Offered({GPU: 8}, frozenset({"n1"}), frozenset({"n1"}))


def gpu_job(name: str, batch: int, samples: int = 0, priority: int = 0, created: str = "2026-12-03T10:00:00Z",
            throughput=(), phase: str | None = None, **spec) -> dict:  # fmt: skip
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": name, "namespace": "team", "creationTimestamp": created},
        "spec": {
            "image": "largebatch-trainer:test",
            "task": {"entrypoint": "largebatch_trainer.tasks:linreg"},
            "workers": {"min": 1, "max": 8, "accelerator": GPU},
            "batch": {"initial": batch, "max": batch, "microBatchPerDevice": 64},
            "optimizer": {"name": "sgd", "lr": 0.05},
            "schedule": {"totalSamples": 10_000_000, "warmupSamples": 0, "decay": "constant"},
            "priority": priority,
        }
        | spec,
        "status": {
            "progress": {"samples": samples, "step": samples // batch, "policyBatch": batch},
            "throughput": list(throughput),
        }
        | ({"phase": phase} if phase else {}),  # fmt: skip
    }


def pod(name: str, gpus: int, node: str | None = "n1", job: str | None = None, phase: str = "Running",
        index: int = 0) -> dict:  # fmt: skip
    labels = {JOB_LABEL: job, ROLE_LABEL: "worker", INDEX_LABEL: str(index)} if job else {}
    return {
        "metadata": {"name": name, "namespace": "team", "labels": labels},
        "spec": {"containers": [{"resources": {"limits": {GPU: str(gpus)}}}]} | ({"nodeName": node} if node else {}),
        "status": {"phase": phase},
    }


def test_the_pool_is_what_the_nodes_offer_less_what_other_pods_hold():
    pods = [
        pod("other", 2),
        pod("pending-other", 4, node=None, phase="Pending"),  # holds nothing until bound
        pod("done-other", 4, phase="Succeeded"),
        pod("a-worker-0", 1, job="a"),
        pod("a-worker-1", 1, job="a", index=1),
    ]
    assert held(pods[0], GPU) == 2 and held(pods[1], GPU) == 0 and held(pods[2], GPU) == 0
    assert pool(8, pods, GPU) == pool(8, pods, GPU).__class__(shared=6, free=4)


def test_an_init_container_holds_what_it_asks_while_it_is_the_larger():
    p = pod("x", 1)
    p["spec"]["initContainers"] = [{"resources": {"requests": {GPU: "3"}}}]
    assert held(p, GPU) == 3


def test_a_pod_asks_for_accelerators_when_any_container_names_an_extended_resource():
    assert asks_for_accelerators(pod("x", 1)["spec"])
    assert asks_for_accelerators({"initContainers": [{"resources": {"requests": {"google.com/tpu": "4"}}}]})
    assert not asks_for_accelerators({"containers": [{"resources": {"limits": {"cpu": "2", "memory": "1Gi"}}}]})
    assert not asks_for_accelerators({"containers": [{}]})


def test_a_job_takes_part_while_it_trains_on_an_accelerator():
    running = gpu_job("a", batch=512, samples=1_000)
    d = demand(running, live=2, restart_seconds=15)
    assert (d.name, d.batch, d.per_worker, d.current, d.wanted, d.remaining_samples) == (
        "team/a",
        512,
        64,
        2,
        8,
        9_999_000,
    )
    created = datetime.datetime(2026, 12, 3, 10, tzinfo=datetime.timezone.utc)
    assert d.arrival == created.timestamp() and d.speed is None
    assert demand(gpu_job("a", 512, phase="Succeeded"), 0, 15) is None
    assert demand(gpu_job("a", 512, suspend=True), 0, 15) is None
    assert demand(gpu_job("a", 512, samples=10_000_000), 2, 15) is None
    cpu = gpu_job("a", 512)
    cpu["spec"]["workers"]["accelerator"] = "none"
    assert demand(cpu, 0, 15) is None
    measured = gpu_job("a", 512, throughput=[{"workers": 2, "batch": 512, "samplesPerSecond": 1000.0}])
    assert demand(measured, 2, 15).speed.samples_per_second(4, 512) == 2000.0


def test_contending_jobs_share_and_a_newcomer_waits_for_the_gpus_a_shrinking_job_frees():
    big = gpu_job("big", batch=512, throughput=[{"workers": 8, "batch": 512, "samplesPerSecond": 8000.0}])
    new = gpu_job("new", batch=512, created="2026-12-03T11:00:00Z")
    big_pods = [pod(f"big-worker-{i}", 1, job="big", index=i) for i in range(8)]
    result = shares([big, new], {("team", "big"): big_pods}, OFFER, big_pods, restart_seconds=15)
    assert result["team/big"] == Share(workers=4, demand=8, grow_to=4, reason=result["team/big"].reason)
    assert "team/new" in result["team/big"].reason and "fair share" in result["team/big"].reason
    assert (result["team/new"].workers, result["team/new"].grow_to) == (4, 0)  # nothing is free yet
    # The big job's four workers are being deleted (they checkpoint): still bound, still holding GPUs.
    for p in big_pods[4:]:
        p["metadata"]["deletionTimestamp"] = STAMP
    result = shares([big, new], {("team", "big"): big_pods}, OFFER, big_pods, restart_seconds=15)
    assert result["team/new"].grow_to == 0
    gone = big_pods[:4]
    result = shares([big, new], {("team", "big"): gone}, OFFER, gone, restart_seconds=15)
    assert result["team/new"].grow_to == 4 and result["team/big"].reason is None


def test_a_job_the_models_refuse_takes_no_part_and_stops_no_other():
    broken = gpu_job("broken", batch=512)
    broken["spec"]["batch"]["microBatchPerDevice"] = 0
    fine = gpu_job("fine", batch=512)
    assert set(shares([broken, fine], {}, OFFER, [], 15)) == {"team/fine"}


def test_a_higher_priority_job_takes_what_a_lower_one_holds_beyond_its_minimum():
    low = gpu_job("low", batch=512)
    high = gpu_job("high", batch=512, priority=10, created="2026-12-03T11:00:00Z")
    low_pods = [pod(f"low-worker-{i}", 1, job="low", index=i) for i in range(8)]
    result = shares([low, high], {("team", "low"): low_pods}, OFFER, low_pods, restart_seconds=15)
    assert (result["team/low"].workers, result["team/high"].workers) == (1, 7)
    assert "higher priority" in result["team/low"].reason


def test_world_offers_the_accelerators_of_nodes_that_take_pods_ready_or_not():
    def node(name, gpus, ready=True, cordoned=False):
        return {"metadata": {"name": name}, "spec": {"unschedulable": cordoned},
                "status": {"allocatable": {"cpu": "8", GPU: str(gpus)},
                           "conditions": [{"type": "Ready", "status": str(ready)}]}}  # fmt: skip

    offers = world.NodeOffers()
    for n in (node("a", 4), node("b", 2), node("c", 8, ready=False), node("d", 8, cordoned=True)):
        offers.seen(None, n, None)
    assert offers.offered() == world.Offered({GPU: 14}, frozenset("abcd"), frozenset("abcd"))  # not d: cordoned
    labelled = node("e", 16)
    labelled["metadata"]["labels"] = {"pool": "shared"}
    offers.seen("ADDED", labelled, None)
    assert offers.offered({"pool": "shared"}) == world.Offered({GPU: 16}, frozenset("e"), frozenset("abcde"))
    assert world.parse_selector(" pool=shared, zone=a ") == {"pool": "shared", "zone": "a"}


def test_no_shares_before_the_nodes_the_pods_are_bound_to_are_known_nor_of_what_no_node_offers():
    a = gpu_job("a", batch=512)
    pods = [pod("a-worker-0", 1, job="a", node="n2")]
    assert shares([a], {("team", "a"): pods}, OFFER, pods, 15) == {}  # n2 not listed yet
    tpu = world.Offered({"google.com/tpu": 8}, frozenset({"n1"}), frozenset({"n1"}))
    assert shares([a], {}, tpu, [], 15) == {}


def test_pods_on_nodes_outside_the_shared_ones_count_for_nothing():
    assert pool(8, [pod("other", 4, node="elsewhere")], GPU, frozenset({"n1"})).shared == 8


def test_a_reconcile_caps_the_job_at_its_share_and_says_why_once():
    spec = LargeBatchJob.model_validate(gpu_job("job", batch=512) | {"status": None})
    spec = spec.model_copy(update={"metadata": spec.metadata.model_copy(update={"name": "job", "namespace": "ns"})})
    share = Share(workers=2, demand=8, grow_to=2, reason="0 → 2 workers (+2 GPUs): starts for batch 512")
    observed = dataclasses.replace(seen(spec, [RENDEZVOUS]), share=share)
    actions, done = reconcile(observed)
    assert len(actions.workers) == 2
    assert (done.status.allocation.workers, done.status.allocation.demand) == (2, 8)
    assert done.status.allocation.reason == share.reason and done.status.allocation.time == STAMP
    assert [e.reason for e in done.events].count("Allocation") == 1
    # The next reconcile, same share: no second Event, the time it moved kept.
    again = dataclasses.replace(seen(spec, [RENDEZVOUS, worker(0), worker(1)], allocation=done.status.allocation),
                                share=dataclasses.replace(share, reason=None))  # fmt: skip
    actions, done = reconcile(again)
    assert not actions.workers and not actions.delete
    assert "Allocation" not in [e.reason for e in done.events] and done.status.allocation.reason == share.reason


def test_a_share_below_the_running_workers_shrinks_the_job_and_names_the_move():
    spec = job(accelerator=GPU, max=4)
    share = Share(workers=1, demand=2, grow_to=1, reason="2 → 1 workers (−1 GPUs) to ns/other (batch 4,096): "
                                                         "higher priority")  # fmt: skip
    pods = [RENDEZVOUS, worker(0), worker(1)]
    progress = {"step": 10, "samples": 10_000, "policyBatch": 32}
    actions, done = reconcile(dataclasses.replace(seen(spec, pods, progress=progress), share=share))
    assert actions.delete == ("job-worker-1",)
    assert done.news.kind.value == "CapacityLimited" and "higher priority" in done.news.reason


def test_a_job_its_share_keeps_on_fewer_workers_says_why_in_its_condition():
    spec = job(accelerator=GPU, max=2)
    share = Share(workers=1, demand=2, grow_to=1, reason="stays at 1 workers: 2 were measured slower than 1")
    progress = {"step": 10, "samples": 10_000, "policyBatch": 32}
    actions, done = reconcile(dataclasses.replace(seen(spec, [RENDEZVOUS, worker(0)], progress=progress), share=share))
    assert not actions.workers and not actions.delete
    limited = next(c for c in done.status.conditions if c.type == "CapacityLimited")
    assert limited.status == "True" and limited.message.endswith("; allocation stays at 1 workers: 2 were measured "
                                                                 "slower than 1"), limited.message  # fmt: skip


def test_the_throughput_of_a_settled_world_is_recorded_per_worker_count():
    spec = job(accelerator=GPU, max=4)
    pods = [RENDEZVOUS, worker(0), worker(1)]
    progress = {"step": 10, "samples": 10_000, "policyBatch": 32, "samplesPerSecond": 500.0}
    plan_ = {"worldSize": 2, "globalBatch": 32}
    _, done = reconcile(seen(spec, pods, progress=progress, plan=plan_))
    assert [(t.workers, t.batch, t.samples_per_second) for t in done.status.throughput] == [(2, 32, 500.0)]
    # A wobble under 5% is not news; a world still starting is not measured.
    wobble = progress | {"samplesPerSecond": 510.0}
    recorded = [{"workers": 2, "batch": 32, "samplesPerSecond": 500.0}]
    _, again = reconcile(seen(spec, pods, progress=wobble, plan=plan_, throughput=recorded))
    assert again.status.throughput[0].samples_per_second == 500.0
    _, starting = reconcile(seen(spec, [*pods, worker(2, "Pending")], progress=progress, plan=plan_))
    assert starting.status.throughput == []


def test_a_worker_the_scheduler_has_not_placed_is_not_one_the_job_runs():
    a = gpu_job("a", batch=512)
    placed, unplaced = pod("a-worker-0", 1, job="a"), pod("a-worker-1", 1, job="a", node=None, phase="Pending", index=1)
    result = shares([a], {("team", "a"): [placed, unplaced]}, OFFER, [placed, unplaced], 15)
    assert result["team/a"].reason.startswith("1 → 8 workers")  # it runs one: the other holds no GPU
