"""A pytest plugin that records each test's wall time and the CPU seconds of the processes it ran.

`pytest -p tests.cpu_report` writes one JSON line per test into DIR/<xdist worker>.jsonl (DIR is
`--cpu-report`, by default .test-times in the root folder):
its node id, wall seconds, and CPU seconds split into the pytest process itself, the child processes
that ended during the test (RUSAGE_CHILDREN, which counts a whole tree whose parents wait for their
children: lbctl and its torchrun agents and trainers) and what live descendants (a session's control
plane, an operator kept for a module, a zygote: tests/zygote.py) and the children they waited for spent
while the test ran. Processes that left the tree (daemons such as dockerd, double-forked) are not
counted. `python -m tests.test_times` turns the files and
pytest's junit XML into the per-module table in tests/README.md.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report", metavar="DIR", default=".test-times", help="where each test's wall and CPU seconds go"
    )


def _descendant_cpu() -> dict[int, float]:
    """CPU seconds so far of every live descendant of this process and of the children it reaped, by pid."""
    parent_of: dict[int, int] = {}
    cpu: dict[int, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone since the listing
        # The command name is in parentheses and may hold spaces: split after its closing one.
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parent_of[pid] = int(fields[1])
        # Its own time and its ended children's that it waited for: a zygote's children (tests/zygote.py)
        # are waited for by the zygote, which lives on, so they never reach our RUSAGE_CHILDREN.
        cpu[pid] = sum(int(f) for f in fields[11:15]) / _TICK
    me = os.getpid()
    found: dict[int, float] = {}
    for pid in cpu:
        ancestor = parent_of.get(pid)
        while ancestor and ancestor != me:
            ancestor = parent_of.get(ancestor)
        if ancestor == me:
            found[pid] = cpu[pid]
    return found


def _rusage(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    folder = Path(item.config.rootpath, item.config.getoption("--cpu-report"))
    wall = time.monotonic()
    own, ended = _rusage(resource.RUSAGE_SELF), _rusage(resource.RUSAGE_CHILDREN)
    live = _descendant_cpu()
    yield
    live_after = _descendant_cpu()
    # A live process's CPU counts from the test's start (or its own); one that ended and was waited
    # for is in RUSAGE_CHILDREN whole, so only the part before the test began is taken back out.
    live_cpu = sum(seconds - live.get(pid, 0.0) for pid, seconds in live_after.items())
    ended_before = sum(seconds for pid, seconds in live.items() if pid not in live_after)
    row = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - wall, 3),
        "pytest_cpu_s": round(_rusage(resource.RUSAGE_SELF) - own, 3),
        "children_cpu_s": round(_rusage(resource.RUSAGE_CHILDREN) - ended - ended_before, 3),
        "live_cpu_s": round(live_cpu, 3),
    }
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"{worker}.jsonl", "a") as out:
        out.write(json.dumps(row) + "\n")
