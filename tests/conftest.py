"""Fixtures shared by every test layer (helpers live in tests/helpers.py)."""

from __future__ import annotations

import json
import os
import signal
import statistics
from pathlib import Path

import pytest
from hypothesis import settings

from largebatch.api import LargeBatchJob
from tests.helpers import SLOWNESS, bound, example, probe_slowness


def pytest_configure(config: pytest.Config) -> None:
    """Measures how slow this machine is once, in the process that starts the others (xdist's workers and
    every process a test starts inherit the environment), unless the environment says already."""
    if not hasattr(config, "workerinput") and SLOWNESS not in os.environ:
        os.environ[SLOWNESS] = f"{probe_slowness():.2f}"


def pytest_report_header(config: pytest.Config) -> str:
    return f"bounds on waits scaled by {bound(1):.2f} ({SLOWNESS}, tests/helpers.py)"


@pytest.fixture
def seesaw_example() -> LargeBatchJob:
    return example("seesaw.yaml")


# CI runs the same examples every time (a failure there is reproducible); a person running the tests
# gets fresh random examples, and `--hypothesis-profile=thorough` searches harder. No profile has a
# deadline: on a busy machine an example's time says nothing about the code.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("thorough", max_examples=2_000, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# A shell without job control starts a background command (`nohup make test &`, a script's `cmd &`) with
# SIGINT ignored, and every process it starts inherits that: the tests that Ctrl-C an lbctl, an agent or
# this process would test nothing. Ctrl-C means here what it means at a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


E2E_LANES = {
    "e2e-node": ("test_real_node",),
    "e2e-sharing": ("test_sharing", "test_kueue", "test_crd_on_a_real_apiserver", "test_helm_release"),
    "e2e-faults": ("test_control_plane_faults", "test_operator", "test_lbctl_status", "test_lbctl_run",
                   "test_operator_replicas"),
}  # fmt: skip
"""The e2e modules that keep a lane: each lane is an xdist group, so one worker runs its tests one after
the other on the control plane that worker starts (tests/e2e/conftest.py), beside the other lanes' workers
and theirs. The real node, of which a machine has one, is only asked for by e2e-node's tests; e2e-faults
stops its control plane's API server and etcd, which no other lane's tests see. Balanced by the modules'
times in tests/README.md: with the rest handed out as the run goes, the longest e2e lane is the shortest
the run can be (e2e-faults, 768 s of 808, in stop 62's warm run before the CRD's and the chart's tests
moved to e2e-sharing). Every other e2e module is dealt (`deal_e2e`)."""


LANE_SECONDS = Path(__file__).with_name("lane_seconds.json")
"""Each test's wall seconds in `make test` runs (`python -m tests.timing_table DIR... --lane-seconds`)."""
IMAGES_SECONDS = {"loaded": 0.0, "layers built": 400.0, "cold": 930.0}
"""How much longer than with this checkout's images in the node's containerd the e2e-node lane's first
image test takes, by `tests.cluster.images.readiness()`: with the layers built and the import into
containerd left, 400 s against 30 s (2026-12-06); on a machine that never built them (the debootstrap
base, torch's wheels), 960 s (ac2f805, pip in the Dockerfiles) and 1,193 s on a slower hour (49e8092, uv).
Past about 700 s the dealing is the same: the lane gets no module but the real node's (tests/lane_seconds.json)."""


def deal_e2e(
    e2e_lane: dict[str, str], seconds: dict[str, float], head_start: dict[str, float], e2e_dealt: dict[str, str]
) -> dict[str, str]:
    """Each e2e test's lane. One in `e2e_lane` keeps the lane it names; one in `e2e_dealt` (test to its
    module) goes with its whole module, longest module first, to whichever e2e lane has the least work so
    far (its tests' seconds, and the `head_start` a lane's set-up takes). A test not in `seconds` counts
    as the median one."""
    typical = median(seconds)
    load = {lane: head_start.get(lane, 0.0) for lane in E2E_LANES}
    for test, lane in e2e_lane.items():
        load[lane] += seconds.get(test, typical)
    lane_of = dict(e2e_lane)
    modules: dict[str, list[str]] = {}
    for test, module in e2e_dealt.items():
        modules.setdefault(module, []).append(test)
    module_seconds = {module: sum(seconds.get(t, typical) for t in its) for module, its in modules.items()}
    for module in sorted(modules, key=lambda m: (-module_seconds[m], m)):
        lane = min(E2E_LANES, key=lambda name: (load[name], name))
        lane_of |= dict.fromkeys(modules[module], lane)
        load[lane] += module_seconds[module]
    return lane_of


def hand_out_order(tests: list[str], group_of: dict[str, str], seconds: dict[str, float]) -> list[str]:
    """The order in which xdist hands the tests out (`--dist loadgroup --no-loadscope-reorder`: one work
    unit to each worker, then the next unit to whichever worker has no more than two tests left). A unit
    is an xdist group (`group_of`) or a test alone. First the e2e lanes (the groups named in E2E_LANES),
    so that each goes to a worker of its own; then the other units longest first: a test alone, or the
    tests that share a module- or class-scoped fixture (on one worker they must not be split up by
    others, or the fixture is set up again). Longest first to whichever worker is free ends every worker
    within about one short test of the others, whatever the machine's hour makes of the recorded seconds.
    A test not in `seconds` counts as the median one. Within a unit the tests keep their order in `tests`."""
    typical = median(seconds)
    unit = {test: group_of.get(test, test) for test in tests}
    unit_seconds: dict[str, float] = {}
    first: dict[str, int] = {}
    for index, test in enumerate(tests):
        unit_seconds[unit[test]] = unit_seconds.get(unit[test], 0.0) + seconds.get(test, typical)
        first.setdefault(unit[test], index)
    lanes = list(E2E_LANES)

    def rank(name: str) -> tuple[int, float]:
        return (0, lanes.index(name)) if name in E2E_LANES else (1, -unit_seconds[name])

    order = sorted(range(len(tests)), key=lambda i: (rank(unit[tests[i]]), first[unit[tests[i]]], i))
    return [tests[i] for i in order]


def median(seconds: dict[str, float]) -> float:
    return statistics.median(seconds.values()) if seconds else 1.0


def split_e2e(module_of: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The e2e tests (test to its module) split for `deal_e2e`: those whose module keeps a lane, with that
    lane, and the others, with their module."""
    module_lane = {module: lane for lane, modules in E2E_LANES.items() for module in modules}
    kept = {test: module_lane[module] for test, module in module_of.items() if module in module_lane}
    return kept, {test: module for test, module in module_of.items() if test not in kept}


def shared_fixture_unit(item: pytest.Item) -> str | None:
    """The module (or, for a package-scoped fixture, the package) whose tests share a fixture wider than
    a test's and narrower than the session's with this one, if it has such a fixture."""
    scopes = {defs[-1].scope for defs in item._fixtureinfo.name2fixturedefs.values() if defs}
    module = item.nodeid.split("::")[0]
    if "package" in scopes:
        return module.rsplit("/", 1)[0]
    return module if scopes & {"module", "class"} else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (`make test`: `--dist loadgroup --no-loadscope-reorder`), each e2e lane is an
    xdist group that one worker runs in order, and the other tests are handed out longest first to
    whichever worker is free (`hand_out_order`): the e2e lanes' workers join in once their lanes end.
    First, because xdist's own hook reads the marks into the test's id (without tryfirst it ran before
    this one, and the tests went to any worker)."""
    if not os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
        return
    e2e_lane, e2e_dealt = split_e2e(
        {item.nodeid: item.module.__name__.rsplit(".", 1)[-1] for item in items if item.get_closest_marker("e2e")}
    )
    seconds = json.loads(LANE_SECONDS.read_text()) if LANE_SECONDS.exists() else {}
    from tests.cluster import images

    lane_of = deal_e2e(e2e_lane, seconds, {"e2e-node": IMAGES_SECONDS[images.readiness()]}, e2e_dealt)
    group_of = lane_of | {
        item.nodeid: unit for item in items if item.nodeid not in lane_of and (unit := shared_fixture_unit(item))
    }
    order = hand_out_order([item.nodeid for item in items], group_of, seconds)
    position = {test: index for index, test in enumerate(order)}
    items.sort(key=lambda item: position[item.nodeid])
    for item in items:
        if item.nodeid in group_of:
            item.add_marker(pytest.mark.xdist_group(group_of[item.nodeid]))
