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
    "e2e-sharing": ("test_sharing", "test_kueue"),
    "e2e-faults": ("test_control_plane_faults", "test_operator", "test_crd_on_a_real_apiserver", "test_helm_release",
                   "test_lbctl_status", "test_lbctl_run", "test_operator_replicas"),
}  # fmt: skip
"""The e2e modules that keep a lane: each lane is an xdist group, so one worker runs its tests one after
the other on the control plane that worker starts (tests/e2e/conftest.py), beside the other lanes' workers
and theirs. The real node, of which a machine has one, is only asked for by e2e-node's tests; e2e-faults
stops its control plane's API server and etcd, which no other lane's tests see. Balanced by the modules'
times in tests/README.md. Every other e2e module is dealt (`deal`)."""


def compute_lanes(workers: int) -> int:
    """The lanes of the unit and process tests, which compute rather than wait: the workers the e2e lanes
    leave (`make test` starts one per core beside them). More than one per core bought nothing: on two
    cores, five workers that each took any test ran the process tests at 0.3 to 0.4 of a core each, and
    their CPU grew 10 to 45% (trainers and agents preempted mid-collective, caches shared), 2026-12-05."""
    return max(1, workers - len(E2E_LANES))


LANE_SECONDS = Path(__file__).with_name("lane_seconds.json")
"""Each test's wall seconds in one `make test` run (`python -m tests.timing_table DIR --lane-seconds`)."""
IMAGES_SECONDS = {"loaded": 0.0, "layers built": 400.0, "cold": 930.0}
"""How much longer than with this checkout's images in the node's containerd the e2e-node lane's first
image test takes, by `tests.cluster.images.readiness()`: with the layers built and the import into
containerd left, 400 s against 30 s (2026-12-06); on a machine that never built them (the debootstrap
base, torch's wheels), 960 s (ac2f805, pip in the Dockerfiles) and 1,193 s on a slower hour (49e8092, uv).
Past about 700 s the dealing is the same: the lane gets no module but the real node's (tests/lane_seconds.json)."""


def deal(
    tests: list[str],
    e2e_lane: dict[str, str],
    lanes: int,
    seconds: dict[str, float],
    head_start: dict[str, float],
    e2e_dealt: dict[str, str] | None = None,
) -> dict[str, str]:
    """Each test's lane. An e2e test in `e2e_lane` keeps the lane it names; one in `e2e_dealt` (test to
    its module) goes with its whole module, longest module first, to whichever e2e lane has the least work
    so far; the others go, longest first, to whichever lane has the least, the e2e lanes (with their
    tests' seconds, and the `head_start` a lane's set-up takes) among them. The run lasts as long as its
    longest lane, and lanes that end early leave their share of the cores idle: dealt in turn to the
    compute lanes only, these ended at 995 and 1,027 s and the e2e lanes at 750 to 811 s (2026-12-05),
    while two workers ran at 0.45 of a core each; with the real node's lane building the images cold
    (960 s) and its four other modules beside them, it ended 300 to 500 s after the rest (ac2f805). A
    test not in `seconds` counts as the median one."""
    e2e_dealt = e2e_dealt or {}
    typical = statistics.median(seconds.values()) if seconds else 1.0
    load = {f"compute-{i}": 0.0 for i in range(lanes)} | {lane: head_start.get(lane, 0.0) for lane in E2E_LANES}
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
    dealt = set(lane_of)
    for test in sorted((t for t in tests if t not in dealt), key=lambda t: -seconds.get(t, typical)):
        lane = min(load, key=lambda name: (load[name], name))
        lane_of[test] = lane
        load[lane] += seconds.get(test, typical)
    return lane_of


def split_e2e(module_of: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The e2e tests (test to its module) split for `deal`: those whose module keeps a lane, with that
    lane, and the others, with their module."""
    module_lane = {module: lane for lane, modules in E2E_LANES.items() for module in modules}
    kept = {test: module_lane[module] for test, module in module_of.items() if module in module_lane}
    return kept, {test: module for test, module in module_of.items() if test not in kept}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`make test`: `--dist loadgroup`), every test goes to a lane, an xdist group that
    one worker runs in order: each e2e test to its E2E_LANES lane, the others as `deal` says. First,
    because xdist's own hook reads the marks into the test's id (without tryfirst it ran before this one,
    and the tests went to any worker)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
    if not workers:
        return
    e2e_lane, e2e_dealt = split_e2e(
        {item.nodeid: item.module.__name__.rsplit(".", 1)[-1] for item in items if item.get_closest_marker("e2e")}
    )
    seconds = json.loads(LANE_SECONDS.read_text()) if LANE_SECONDS.exists() else {}
    from tests.cluster import images

    head_start = {"e2e-node": IMAGES_SECONDS[images.readiness()]}
    tests = [item.nodeid for item in items]
    lane_of = deal(tests, e2e_lane, compute_lanes(workers), seconds, head_start, e2e_dealt)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(lane_of[item.nodeid]))
