"""How tests/conftest.py deals the tests into xdist lanes: every test gets one, the e2e tests keep the
lane their control plane is in or go, module by module, to an e2e lane, and the lanes end within one test
of each other."""

from __future__ import annotations

import json
from collections import defaultdict

from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import E2E_LANES, IMAGES_SECONDS, LANE_SECONDS, deal, split_e2e

durations = st.dictionaries(st.text(min_size=1, max_size=8), st.floats(0.1, 300), min_size=1, max_size=60)


@given(durations, st.data(), st.integers(1, 8))
def test_every_test_gets_a_lane_and_the_lanes_end_within_one_test_of_each_other(seconds, data, lanes):
    tests = list(seconds)
    e2e = {test: data.draw(st.sampled_from(sorted(E2E_LANES))) for test in tests if data.draw(st.booleans())}
    lane_of = deal(tests, e2e, lanes, seconds, {})
    assert set(lane_of) == set(tests)
    assert all(lane_of[test] == lane for test, lane in e2e.items())
    load = {lane: 0.0 for lane in [*(f"compute-{i}" for i in range(lanes)), *E2E_LANES]}
    for test, lane in lane_of.items():
        load[lane] += seconds[test]
    dealt = [seconds[test] for test in tests if test not in e2e]
    # Longest first to the least loaded: a lane ends at most one dealt test after the least loaded one,
    # unless its e2e tests alone take it beyond.
    e2e_only = {lane: sum(seconds[t] for t, its in e2e.items() if its == lane) for lane in load}
    for lane, total in load.items():
        assert total <= max(min(load.values()) + max(dealt, default=0), e2e_only[lane]) + 1e-9


def test_a_test_without_a_recorded_time_counts_as_the_median_one():
    seconds = {"a": 1.0, "b": 2.0, "c": 100.0}
    lane_of = deal(["a", "b", "c", "new"], {}, 1, seconds, {})
    # compute-0 takes c (100 s); b, a and the new one (2 s) fill the three e2e lanes, which are empty.
    assert lane_of["c"] == "compute-0" and sorted(lane_of[t] for t in ("a", "b", "new")) == sorted(E2E_LANES)


def test_a_lane_that_builds_the_images_first_gets_that_much_less_of_the_rest():
    seconds = {f"t{i}": 10.0 for i in range(40)}
    lane_of = deal(list(seconds), {}, 2, seconds, {"e2e-node": 300.0})
    # 400 s of tests over five lanes: 80 s each, but the lane 300 s into its images gets none of them.
    assert "e2e-node" not in lane_of.values()
    assert sorted(list(lane_of.values()).count(lane) for lane in set(lane_of.values())) == [10, 10, 10, 10]


@given(durations, st.data(), st.integers(1, 4))
def test_an_e2e_module_that_keeps_no_lane_goes_whole_to_an_e2e_lane(seconds, data, lanes):
    tests = list(seconds)
    dealt = {test: data.draw(st.sampled_from(["test_a", "test_b", "test_c"])) for test in tests[: len(tests) // 2]}
    lane_of = deal(tests, {}, lanes, seconds, {"e2e-node": data.draw(st.floats(0, 2_000))}, dealt)
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
    they go to the two others, and so does every unit and process test."""
    seconds, e2e_lane, dealt = recorded_e2e_modules()
    assert {"test_workload_faults", "test_prometheus"} <= set(dealt.values()), sorted(set(dealt.values()))
    tests = list(seconds)
    warm = deal(tests, e2e_lane, 2, seconds, {"e2e-node": IMAGES_SECONDS["loaded"]}, dealt)
    assert {warm[test] for test in dealt} == {"e2e-node"}
    cold = deal(tests, e2e_lane, 2, seconds, {"e2e-node": IMAGES_SECONDS["cold"]}, dealt)
    assert "e2e-node" not in {cold[test] for test in dealt}
    assert {test for test, lane in cold.items() if lane == "e2e-node"} == {
        test for test, lane in e2e_lane.items() if lane == "e2e-node"
    }
