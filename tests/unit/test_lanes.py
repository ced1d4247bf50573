"""How tests/conftest.py lays the tests out for xdist: the e2e tests keep the lane their control plane is
in or go, module by module, to an e2e lane; the rest are handed out longest first, a unit at a time, to
whichever worker is free. The hand-out is checked through xdist's own scheduler, driven by stand-ins for
its workers (a worker's clock is the recorded seconds, which no real run can be made to keep)."""

from __future__ import annotations

import json
from collections import defaultdict
from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st
from xdist.scheduler import LoadGroupScheduling

from tests.conftest import E2E_LANES, IMAGES_SECONDS, LANE_SECONDS, deal_e2e, hand_out_order, split_e2e

durations = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=8), st.floats(0.1, 300), min_size=1, max_size=60)


class Worker:
    """What xdist's scheduler sees of a worker: its name, the test indexes it is sent, and its shutdown."""

    def __init__(self, name: str) -> None:
        self.name, self.queue, self.shutting_down, self.clock, self.ran = name, [], False, 0.0, []
        self.gateway = SimpleNamespace(id=name)

    def send_runtest_some(self, indexes: list[int]) -> None:
        self.queue += indexes

    def shutdown(self) -> None:
        self.shutting_down = True


def run_through_xdist(order: list[str], group_of: dict[str, str], seconds: dict[str, float], workers: int):
    """Runs `order` (with its xdist groups) through xdist's `--dist loadgroup --no-loadscope-reorder`
    scheduler: each worker runs its queue in order, a test taking its seconds, and reports the test done
    when it ends, the worker whose clock is earliest first. Returns the workers."""
    config = SimpleNamespace(getvalue=lambda name: [f"{workers}*popen"], option=SimpleNamespace(loadscopereorder=False))
    scheduler = LoadGroupScheduling(config)
    nodes = [Worker(f"gw{i}") for i in range(workers)]
    collection = [test + (f"@{group_of[test]}" if test in group_of else "") for test in order]
    for node in nodes:
        scheduler.add_node(node)
        scheduler.add_node_collection(node, collection)
    scheduler.schedule()
    while scheduler.has_pending:
        # A worker runs a test once it holds the one after it or is told to shut down (xdist's worker loop).
        ready = [n for n in nodes if len(n.queue) >= 2 or (n.queue and n.shutting_down)]
        node = min(ready, key=lambda n: (n.clock, n.name))
        index = node.queue.pop(0)
        node.clock += seconds[order[index]]
        node.ran.append(order[index])
        scheduler.mark_test_complete(node, index)
    return nodes


@given(durations, st.data(), st.integers(4, 7))
def test_each_e2e_lane_gets_a_worker_of_its_own_and_the_rest_end_within_one_unit_of_each_other(seconds, data, workers):
    tests = list(seconds)
    lane_of = {test: data.draw(st.sampled_from(sorted(E2E_LANES))) for test in tests if data.draw(st.booleans())}
    rest = [test for test in tests if test not in lane_of]
    unit_of = {test: data.draw(st.sampled_from(["module_a", "module_b"])) for test in rest if data.draw(st.booleans())}
    order = hand_out_order(tests, lane_of | unit_of, seconds)
    assert sorted(order) == sorted(tests)
    nodes = run_through_xdist(order, lane_of | unit_of, seconds, workers)
    assert sorted(test for node in nodes for test in node.ran) == sorted(tests)
    for lane in {*lane_of.values()}:
        # A lane runs whole, in its order, on one worker, before that worker takes anything else.
        its = [test for test in tests if lane_of.get(test) == lane]
        (node,) = [node for node in nodes if its[0] in node.ran]
        assert node.ran[: len(its)] == its
    for unit in {*unit_of.values()}:
        its = [test for test in tests if unit_of.get(test) == unit]
        (node,) = [node for node in nodes if its[0] in node.ran]
        start = node.ran.index(its[0])
        assert node.ran[start : start + len(its)] == its
    # Longest unit first to whichever worker is free: a worker ends at most one unit after the first one
    # to end, unless its lane alone takes it beyond (xdist hands a worker its next unit while it still
    # runs its last two tests, so the bound is one unit and two tests).
    units = defaultdict(float)
    for test in rest:
        units[unit_of.get(test, test)] += seconds[test]
    slack = max(units.values(), default=0) + 2 * max(seconds.values())
    lane_seconds = {node.name: sum(seconds[t] for t in node.ran if t in lane_of) for node in nodes}
    first_end = min(node.clock for node in nodes)
    for node in nodes:
        assert node.clock <= max(first_end + slack, lane_seconds[node.name]) + 1e-6


def test_the_longest_tests_go_first_and_a_test_without_a_recorded_time_counts_as_the_median_one():
    seconds = {"a": 1.0, "b": 2.0, "c": 100.0}
    order = hand_out_order(["a", "b", "new", "c", "d"], {"d": "e2e-sharing"}, seconds)
    assert order == ["d", "c", "b", "new", "a"]


def test_the_tests_that_share_a_fixture_go_out_together_by_their_summed_seconds():
    seconds = {"m::1": 30.0, "m::2": 30.0, "solo": 50.0, "n": 1.0}
    order = hand_out_order(["m::1", "solo", "n", "m::2"], {"m::1": "m", "m::2": "m"}, seconds)
    assert order == ["m::1", "m::2", "solo", "n"]


def test_a_lane_that_builds_the_images_first_gets_no_dealt_module_while_others_have_less():
    seconds = {"real": 10.0, "a::1": 50.0, "b::1": 40.0}
    lanes = deal_e2e({"real": "e2e-node"}, seconds, {"e2e-node": 300.0}, {"a::1": "a", "b::1": "b"})
    assert lanes["real"] == "e2e-node" and {lanes["a::1"], lanes["b::1"]} == {"e2e-sharing", "e2e-faults"}


@given(durations, st.data())
def test_an_e2e_module_that_keeps_no_lane_goes_whole_to_an_e2e_lane(seconds, data):
    tests = list(seconds)
    dealt = {test: data.draw(st.sampled_from(["test_a", "test_b", "test_c"])) for test in tests}
    lane_of = deal_e2e({}, seconds, {"e2e-node": data.draw(st.floats(0, 2_000))}, dealt)
    assert set(lane_of) == set(tests)
    lanes_of_module = defaultdict(set)
    for test, module in dealt.items():
        lanes_of_module[module].add(lane_of[test])
    assert all(len(its) == 1 and its <= set(E2E_LANES) for its in lanes_of_module.values()), lanes_of_module


def recorded_e2e_modules() -> tuple[dict[str, float], dict[str, str], dict[str, str]]:
    """tests/lane_seconds.json's seconds, its e2e tests that keep a lane (with it), and the others (with
    their module)."""
    seconds = json.loads(LANE_SECONDS.read_text())
    paths = {test: test.split("::")[0] for test in seconds}
    e2e = {
        test: path.rsplit("/", 1)[-1].removesuffix(".py")
        for test, path in paths.items()
        if path.startswith("tests/e2e/")
    }
    return seconds, *split_e2e(e2e)


def test_the_real_nodes_other_modules_run_beside_it_warm_and_on_the_other_lanes_cold():
    """With the images loaded, the modules that keep no lane fill the real node's lane, the lightest, as
    they were balanced by hand before they were dealt; when the lane must first build the images cold,
    they go to the two others."""
    seconds, e2e_lane, dealt = recorded_e2e_modules()
    assert {"test_workload_faults", "test_prometheus"} <= set(dealt.values()), sorted(set(dealt.values()))
    warm = deal_e2e(e2e_lane, seconds, {"e2e-node": IMAGES_SECONDS["loaded"]}, dealt)
    assert {warm[test] for test in dealt} == {"e2e-node"}
    cold = deal_e2e(e2e_lane, seconds, {"e2e-node": IMAGES_SECONDS["cold"]}, dealt)
    assert "e2e-node" not in {cold[test] for test in dealt}
    assert {test for test, lane in cold.items() if lane == "e2e-node"} == {
        test for test, lane in e2e_lane.items() if lane == "e2e-node"
    }
