"""The per-module table of wall time and CPU seconds in tests/README.md, from one `make test` run.

    PYTEST_ADDOPTS="-p tests.cpu_report --cpu-report /tmp/times" make test
    .venv/bin/python -m tests.timing_table /tmp/times

reads the JSON lines tests/cpu_report.py wrote (one file per xdist worker) and prints a markdown table:
per module, its tests, the xdist worker(s) it ran on, its summed wall seconds (set-up and teardown
included, so a session fixture's start counts in the first test that asks for it) and the CPU seconds of
the pytest process and of the processes its tests ran; then each worker's total, which is what bounds the
run's wall time. `python -m tests.timing_table /tmp/times [/tmp/times2 ...] --lane-seconds` writes
tests/lane_seconds.json from the runs instead: each test's mean wall seconds over them, by which
tests/conftest.py deals the e2e modules and orders the rest.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path


def rows(folder: Path) -> list[dict]:
    found = []
    for path in sorted(folder.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            found.append(json.loads(line) | {"worker": path.stem})
    return found


def cpu(row: dict) -> float:
    return max(0.0, row["pytest_cpu_s"] + row["children_cpu_s"] + row["live_cpu_s"])


def table(found: list[dict]) -> str:
    modules: dict[str, list[dict]] = defaultdict(list)
    for row in found:
        modules[row["test"].split("::")[0]].append(row)
    lines = [
        "| module | tests | worker | wall s | CPU s | CPU/wall |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for module, tests in sorted(modules.items(), key=lambda item: -sum(r["wall_s"] for r in item[1])):
        wall, seconds = sum(r["wall_s"] for r in tests), sum(cpu(r) for r in tests)
        workers = ",".join(sorted({r["worker"] for r in tests}))
        lines.append(
            f"| {module} | {len(tests)} | {workers} | {wall:.0f} | {seconds:.0f} | {seconds / max(wall, 1e-9):.2f} |"
        )
    lines += ["", "| worker | tests | wall s | CPU s |", "|---|---:|---:|---:|"]
    workers: dict[str, list[dict]] = defaultdict(list)
    for row in found:
        workers[row["worker"]].append(row)
    for worker, tests in sorted(workers.items()):
        lines.append(
            f"| {worker} | {len(tests)} | {sum(r['wall_s'] for r in tests):.0f} | {sum(cpu(r) for r in tests):.0f} |"
        )
    return "\n".join(lines)


def slowest(found: list[dict], count: int) -> str:
    lines = ["| test | worker | wall s | CPU s |", "|---|---|---:|---:|"]
    for row in sorted(found, key=lambda r: -r["wall_s"])[:count]:
        lines.append(f"| {row['test']} | {row['worker']} | {row['wall_s']:.0f} | {cpu(row):.0f} |")
    return "\n".join(lines)


def test_id(row: dict) -> str:
    """A test's id without the xdist group that `--dist loadgroup` appends to it."""
    return row["test"].split("@")[0]


def lane_seconds(runs: list[list[dict]]) -> str:
    """tests/lane_seconds.json: each test of the last run (its id without the xdist group) with its wall
    seconds, the mean over the runs that ran it, which tests/conftest.py lays the tests out by."""
    walls: dict[str, list[float]] = defaultdict(list)
    for found in runs:
        for row in found:
            walls[test_id(row)].append(row["wall_s"])
    seconds = {test: round(sum(walls[test]) / len(walls[test]), 1) for test in map(test_id, runs[-1])}
    return json.dumps(dict(sorted(seconds.items())), indent=0) + "\n"


if __name__ == "__main__":
    if sys.argv[-1] == "--lane-seconds":
        runs = [rows(Path(folder)) for folder in sys.argv[1:-1]]
        Path(__file__).with_name("lane_seconds.json").write_text(lane_seconds(runs))
        raise SystemExit
    found = rows(Path(sys.argv[1]))
    print(table(found))
    print()
    print(slowest(found, int(sys.argv[2]) if len(sys.argv) > 2 else 30))
