"""Shared test helpers: job specs built from a small valid base, and polling for observable conditions."""

from __future__ import annotations

import copy
import hashlib
import itertools
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml

from largebatch.api import LargeBatchJob, LargeBatchJobSpec
from largebatch_trainer import checkpoint

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

BASE_SPEC = {
    "image": "trainer:test",
    "task": {"entrypoint": "largebatch_trainer.tasks:linreg"},
    "workers": {"min": 1, "max": 4, "accelerator": "none"},
    "batch": {"initial": 16, "max": 256, "microBatchPerDevice": 16},
    "optimizer": {"name": "sgd", "lr": 0.1},
    "schedule": {"totalSamples": 100_000, "warmupSamples": 1_000},
}


def simulated_task(seconds_per_sample: float) -> dict:
    """spec.task for simulated training (largebatch_trainer.tasks:simulated): each sample takes
    `seconds_per_sample` of sleep, so a job lasts what a test needs on any machine, and its CPU is the
    trainer's own (a step's bookkeeping, the all-reduce of one weight), not a model's arithmetic. For the
    tests whose subject is not the training itself. A step costs CPU whatever its sleep: few slow steps
    cost less than many quick ones of the same run's length."""
    return {"entrypoint": "largebatch_trainer.tasks:simulated", "args": {"secondsPerSample": seconds_per_sample}}


def merge(base: dict, overrides: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def spec_dict(**overrides) -> dict:
    return merge(BASE_SPEC, overrides)


def make_spec(**overrides) -> LargeBatchJobSpec:
    return LargeBatchJobSpec.model_validate(spec_dict(**overrides))


def example(name: str) -> LargeBatchJob:
    return LargeBatchJob.model_validate(yaml.safe_load((EXAMPLES / name).read_text()))


def job_file(tmp_path, change=None, text: str | None = None):
    """The quickstart job with `change(spec)` applied (or `text` as it is), written to tmp_path/job.yaml."""
    document = yaml.safe_load((EXAMPLES / "quickstart.yaml").read_text())
    if change:
        change(document["spec"])
    path = tmp_path / "job.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(document))
    return path


def set_in(path: str, value):
    def change(spec):
        *parents, last = path.split(".")
        node = spec
        for key in parents:
            node = node[key]
        node[last] = value

    return change


def newest_history(directory: Path) -> list[list[int]]:
    """The step history ([first step, first sample, batch, world size, steps] per run) in the newest intact
    checkpoint in `directory`; none before the first checkpoint."""
    newest = checkpoint.newest_intact(directory)
    return newest[1]["history"] if newest else []


SLOWNESS = "LARGEBATCH_TEST_SLOWNESS"
"""The environment variable that scales every bound of the suite (`bound`): set it to run slower than the
probe says (a debugger, a sanitizer); tests/conftest.py sets it from `probe_slowness` otherwise."""
PROBE_ROUNDS = 300_000
PROBE_SECONDS = 0.12
"""One core's wall time for PROBE_ROUNDS chained SHA-256 rounds on the machines the bounds were set on
(stops 57 to 59 and 2026-12-07's: 1.12 to 1.23 s for 3,000,000)."""


def probe_slowness() -> float:
    """How many times slower a core of this machine is than those the bounds were set on, never below 1
    (and at most 5, so that a broken test still ends): the best of three short probes, which measures the
    core more than what else runs (1.02 beside a Go build at load 4 on two cores; 1.00 and 1.23 at the
    start of two runs under two CPU hogs, stop 61). The bounds hold under two CPU hogs on those machines
    (stops 59 and 61); on one three times slower a core (2026-12-06: 3.1 s on tests/README.md's probe
    against 1.2) two process tests ran theirs out, under no hog."""
    times = []
    for _ in range(3):
        start, digest = time.monotonic(), b""
        for _ in range(PROBE_ROUNDS):
            digest = hashlib.sha256(digest).digest()
        times.append(time.monotonic() - start)
    return min(5.0, max(1.0, min(times) / PROBE_SECONDS))


def bound(seconds: float) -> float:
    """A bound on a wait, in seconds as measured on the machines the suite's bounds were set on, scaled to
    this one (SLOWNESS). A bound says when to give up, never when something should have happened: only
    bounds scale, never a time the code under test is asked to keep."""
    return seconds * float(os.environ.get(SLOWNESS, "1"))


def wait_for(condition, timeout: float = 300.0, what: str = ""):
    """Poll an observable condition (not a fixed sleep) until it holds; OSError counts as not yet. The
    bound (scaled by `bound`) is the suite's usual one (lbctl's runs, a stalled job): at the start of a warm
    run, with five lanes and three control planes starting at once on two cores, a trainer took 60 s to
    print its first step (python and torch's import), and a 60 s bound failed the test (2026-12-06)."""
    timeout = bound(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = condition()
        except OSError:
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on right now, chosen below the kernel's ephemeral
    range. A port from that range (what binding port 0 gives) can be handed to any outgoing connection
    before whoever it was chosen for binds it: a worker that bound its metrics port a minute after the
    test chose it met `Address already in use` (CI, 2026-12-02). Below the range only an explicit bind
    takes a port."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = _PORTS.randrange(10_000, low - 1)  # and the next one, for a second worker (port + 1)
        if port_is_free(port):
            return port


_PORTS = random.SystemRandom()


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def contiguous(spans: list[tuple[int, int]], total: int, last_batch: int = 0) -> bool:
    """Consecutive runs' sample spans [start, end) cover the stream from 0 to `total` with no gap and no
    overlap: nothing skipped, nothing trained twice. With `last_batch`, the spans count whole batches
    and the very last step took only what was left of the budget."""
    end = spans[-1][1]
    ends_right = end - last_batch < total <= end if last_batch else end == total
    return spans[0][0] == 0 and ends_right and all(a[1] == b[0] for a, b in itertools.pairwise(spans))


def lbctl(*args: str, timeout: float = 120, **kw) -> subprocess.CompletedProcess:
    """`lbctl ARGS` as a user runs it: the installed console script (else `python -m largebatch`)."""
    exe = shutil.which("lbctl", path=str(ROOT / ".venv" / "bin")) or shutil.which("lbctl")
    command = [exe] if exe else [sys.executable, "-m", "largebatch"]
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=bound(timeout), **kw)


def divergences_raised(log: str) -> int:
    """How many times a worker raised the trainer's divergence error in this log (its traceback's last
    line, unindented; torchrun's failure summary repeats it indented): one unless it was restarted."""
    return sum(line.startswith("largebatch.errors.DivergenceError: ") for line in log.splitlines())


def resumed_steps(log: str) -> list[int]:
    """The steps the trainer resumed at in this log, in order."""
    return [int(n) for n in re.findall(r"resumed from checkpoint \S+ at step (\d+)", log)]


def resumed_where_stopped(log: str) -> None:
    """Every stop on SIGTERM in this log wrote a checkpoint that a later run began at: no step was redone."""
    stopped = {int(n) for n in re.findall(r"stopped after step (\d+)", log)}
    assert stopped and stopped <= set(resumed_steps(log)), (stopped, resumed_steps(log))
