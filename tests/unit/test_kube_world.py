"""Reading a job's worker pods: what each is doing, the capacity the scheduler has shown, and the pods
to create and delete for a decision (by hand and by property)."""

from __future__ import annotations

import datetime

from hypothesis import given
from hypothesis import strategies as st

from largebatch.kube import manifests, world
from largebatch.kube.manifests import INDEX_LABEL

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.timezone.utc)


def pod(index: int, phase: str = "Pending", node: str | None = None, refused_ago: float | None = None, **meta):
    conditions = []
    if refused_ago is not None:
        when = (NOW - datetime.timedelta(seconds=refused_ago)).isoformat().replace("+00:00", "Z")
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                           "lastTransitionTime": when})  # fmt: skip
    return {
        "metadata": {"name": f"job-worker-{index}", "labels": {INDEX_LABEL: str(index)}, **meta},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "conditions": conditions},
    }


def test_pods_are_sorted_by_what_they_are_doing():
    pods = world.classify(
        [
            pod(0, "Running", node="gpu-1"),
            pod(1, "Pending", node="gpu-2"),
            pod(2, refused_ago=45),
            pod(3),
            pod(4, "Failed", node="gpu-1"),
            pod(5, "Succeeded", node="gpu-1"),
            pod(6, "Running", node="gpu-1", deletionTimestamp="2026-11-30T11:59:00Z"),
            {"metadata": {"name": "not-a-worker", "labels": {}}, "status": {"phase": "Running"}},
        ],
        NOW,
    )
    assert pods.running == (0,) and pods.starting == (1,) and pods.waiting == (3,)
    assert pods.unschedulable == {2: 45.0}
    assert pods.failed == (4,) and pods.succeeded == (5,) and pods.deleting == (6,)
    assert pods.live == (0, 1, 2, 3) and pods.pending == 3


def test_capacity_is_what_got_placed_once_a_worker_stays_unschedulable_past_the_grace():
    placed = [pod(0, "Running", node="n"), pod(1, "Pending", node="n")]
    assert world.capacity(world.classify([*placed, pod(2, refused_ago=5)], NOW), grace_seconds=30) is None
    assert world.capacity(world.classify([*placed, pod(2, refused_ago=31)], NOW), grace_seconds=30) == 2
    assert world.capacity(world.classify(placed, NOW), grace_seconds=30) is None


def test_growing_creates_the_missing_indices_and_shrinking_removes_the_highest():
    pods = world.classify([pod(0, "Running", node="n"), pod(1, "Running", node="n")], NOW)
    assert world.pod_changes(4, pods) == ([2, 3], [])
    assert world.pod_changes(1, pods) == ([], [1])
    assert world.pod_changes(0, pods) == ([], [1, 0])


def test_a_shrink_keeps_the_running_workers_and_removes_the_unplaced():
    """A preempted worker-0's replacement cannot be placed: the job shrinks to the running worker-1."""
    pods = world.classify([pod(0, refused_ago=10), pod(1, "Running", node="n")], NOW)
    assert world.pod_changes(1, pods) == ([], [0])
    alone = world.classify([pod(1, "Running", node="n")], NOW)
    assert world.pod_changes(1, alone) == ([], [])  # no new worker-0 while one worker is wanted
    assert world.pod_changes(2, alone) == ([0], [])


def test_an_ended_pod_is_deleted_first_and_replaced_under_its_own_name_afterwards():
    failed = world.classify([pod(0, "Running", node="n"), pod(1, "Failed", node="n")], NOW)
    assert world.pod_changes(2, failed) == ([], [1])
    going = world.classify([pod(0, "Running", node="n"), pod(1, "Failed", node="n", deletionTimestamp="x")], NOW)
    assert world.pod_changes(2, going) == ([], [])
    gone = world.classify([pod(0, "Running", node="n")], NOW)
    assert world.pod_changes(2, gone) == ([1], [])


@given(
    desired=st.integers(0, 12),
    states=st.dictionaries(st.integers(0, 15), st.sampled_from(["run", "start", "wait", "refused", "failed", "gone"])),
)
def test_applying_the_changes_reaches_exactly_the_desired_workers(desired, states):
    make = {
        "run": lambda i: pod(i, "Running", node="n"),
        "start": lambda i: pod(i, "Pending", node="n"),
        "wait": lambda i: pod(i),
        "refused": lambda i: pod(i, refused_ago=100),
        "failed": lambda i: pod(i, "Failed", node="n"),
        "gone": lambda i: pod(i, "Running", node="n", deletionTimestamp="x"),
    }
    pods = {i: make[s](i) for i, s in states.items()}
    for _ in range(3):  # deletions complete between reconciles; creations appear as waiting pods
        create, delete = world.pod_changes(desired, world.classify(list(pods.values()), NOW))
        assert not set(create) & set(pods), "never creates a name that exists"
        for i in delete:
            pods.pop(i)
        pods = {i: p for i, p in pods.items() if not p["metadata"].get("deletionTimestamp")}
        pods.update({i: pod(i) for i in create})
    final = world.classify(list(pods.values()), NOW)
    assert len(final.live) == desired and not final.failed
    running = [i for i, s in states.items() if s == "run"]
    assert len(set(final.running) & set(running)) == min(desired, len(running)), "running workers kept first"


def test_a_failed_worker_leaves_its_last_lines_and_a_stuck_one_its_reason():
    failed = pod(0, "Failed", node="n")
    failed["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"terminated": {"exitCode": 1, "message": "Traceback\nValueError: lr"}}}
    ]
    stuck = pod(1, "Pending", node="n")
    stuck["status"]["containerStatuses"] = [
        {"name": "trainer", "state": {"waiting": {"reason": "ErrImagePull", "message": "pull access denied"}}}
    ]
    starting = pod(2, "Pending", node="n")
    creating = {"waiting": {"reason": "ContainerCreating"}}
    starting["status"]["containerStatuses"] = [{"name": "trainer", "state": creating}]
    pods = world.classify([failed, stuck, starting], NOW)
    assert pods.errors == {0: "Traceback\nValueError: lr"}
    assert pods.stuck == {1: ("ErrImagePull", "pull access denied")}  # ContainerCreating is only slow


def test_last_lines_keep_what_was_said_and_drop_the_rules():
    log = "\n".join(["=" * 60, "Root Cause", "-" * 60, *(f"line {i}" for i in range(20)), "=" * 60])
    assert world.last_lines(log, lines=3) == "line 17\nline 18\nline 19"
    assert world.last_lines("x" * 5000, limit=100) == "…" + "x" * 100


def node(name: str, gpus: str = "8", ready: str = "True", **spec) -> dict:
    conditions = [{"type": "Ready", "status": ready}]
    return {"metadata": {"name": name}, "spec": spec,
            "status": {"allocatable": {"nvidia.com/gpu": gpus}, "conditions": conditions}}  # fmt: skip


def test_a_node_that_offers_more_is_news_and_a_heartbeat_is_not():
    offers = world.NodeOffers()
    offers.seen(None, node("a"), NOW)  # the first listing: there before the operator
    assert offers.changed_at is None
    beat = node("a")
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-30T12:00:10Z"
    offers.seen("MODIFIED", beat, NOW)
    assert offers.changed_at is None
    later = NOW + datetime.timedelta(seconds=5)
    offers.seen("ADDED", node("b", ready="False"), later)
    assert offers.changed_at == later
    ready = later + datetime.timedelta(seconds=5)
    offers.seen("MODIFIED", node("b"), ready)
    assert offers.changed_at == ready
    offers.seen("MODIFIED", node("a", unschedulable=True), ready + datetime.timedelta(seconds=1))
    offers.seen("DELETED", node("a"), ready + datetime.timedelta(seconds=9))
    assert offers.changed_at == ready + datetime.timedelta(seconds=1)


def test_new_workers_join_the_live_workers_round():
    def in_round(index: int, round_: str, **kw) -> dict:
        p = pod(index, "Running", node="n", **kw)
        p["metadata"]["labels"][manifests.ROUND_LABEL] = round_
        return p

    live = [in_round(0, "3"), in_round(1, "3")]
    assert world.live_round(live, world.classify(live, NOW)) == 3
    gone = [in_round(0, "2", deletionTimestamp="2026-11-30T11:59:00Z")]
    assert world.live_round(gone, world.classify(gone, NOW)) is None  # a fresh start opens a new round
