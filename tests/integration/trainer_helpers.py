"""Helpers for tests that run the trainer as real processes (torchrun, gloo)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import yaml

from largebatch.api import LargeBatchJob, LargeBatchJobSpec
from largebatch.local.nodes import descendants, kill_tree  # noqa: F401 (re-exported for tests)
from largebatch_trainer import checkpoint
from largebatch_trainer.main import NAME_PREFIX
from tests import zygote
from tests.helpers import bound, free_port, merge, spec_dict

PYTHON = sys.executable


def write_job(directory: Path, name: str = "job", **overrides) -> Path:
    base = {
        "task": {
            "entrypoint": "largebatch_trainer.tasks:linreg",
            "args": {} if "task" in overrides else {"dim": 8, "samples": 512},
        },
        "optimizer": {"name": "sgd", "lr": 0.05, "momentum": 0.9},
        "checkpoint": {"path": str(directory / f"{name}-ckpt"), "everySteps": 1000},
    }
    spec = spec_dict(**merge(base, overrides))
    job = {"apiVersion": "largebatch.io/v1alpha1", "kind": "LargeBatchJob", "metadata": {"name": name}, "spec": spec}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def spec_of(job: Path) -> LargeBatchJobSpec:
    return LargeBatchJob.model_validate(yaml.safe_load(job.read_text())).spec


def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS="1", LARGEBATCH_DEVICE="cpu", LARGEBATCH_METRICS_PORT="0", PYTHONUNBUFFERED="1")
    return env


def run_standalone(
    job: Path, nproc: int, *extra: str, timeout: float = 300, env: dict[str, str] | None = None, check: bool = True
) -> subprocess.CompletedProcess:
    """One torchrun agent with `nproc` gloo workers (or a plain trainer when nproc is 0), forked from this
    process's zygote (tests/zygote.py): what these tests check is the training, not an interpreter's start.
    With `check`, a run that fails fails the test."""
    if nproc == 0:
        module, args = "largebatch_trainer", ["--job", str(job), *extra]
    else:
        module, args = "largebatch_trainer.torchrun", [
            "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=0",
            f"--log-dir={job.with_name('torchelastic')}",
            "-m", "largebatch_trainer", "--job", str(job), *extra,
        ]  # fmt: skip
    command = [PYTHON, "-m", module, *args]
    handle, name = tempfile.mkstemp(dir=job.parent, prefix=f"{job.stem}-", suffix=".stdout")
    os.close(handle)
    stdout, stderr = Path(name), Path(name).with_suffix(".stderr")
    child = zygote.shared().start(module, args, trainer_env() | (env or {}), Path.cwd(), stdout, stderr)
    try:
        child.wait(bound(timeout))
    except subprocess.TimeoutExpired:
        child.kill()
        raise
    result = subprocess.CompletedProcess(
        command, child.returncode, stdout.read_text(errors="replace"), stderr.read_text(errors="replace")
    )
    if check:
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def run_nodes(job: Path, nodes: int, nproc: int, timeout: float = 300, env: dict[str, str] | None = None) -> None:
    """`nodes` torchrun agents of `nproc` gloo workers each, as worker pods of `nproc` devices run them
    (a c10d rendezvous hosted by the first), all until they end; a run that fails fails the test."""
    port = free_port()
    args = [
        f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--max-restarts=0", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=nodes", f"--log-dir={job.with_name('torchelastic')}",
        "-m", "largebatch_trainer", "--job", str(job),
    ]  # fmt: skip
    logs = [job.with_name(f"{job.stem}-node{n}.log") for n in range(nodes)]
    agents = [
        zygote.shared().start("largebatch_trainer.torchrun", args, trainer_env() | (env or {}), Path.cwd(), log)
        for log in logs
    ]
    try:
        for agent in agents:
            agent.wait(bound(timeout))
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
    for agent, log in zip(agents, logs, strict=True):
        assert agent.returncode == 0, f"a node failed:\n{log.read_text(errors='replace')[-6000:]}"


def final_state(checkpoint_dir: Path) -> dict:
    found = checkpoint.newest_intact(checkpoint_dir)
    assert found is not None, f"no checkpoint in {checkpoint_dir}"
    return found[1]


def params(state: dict) -> dict[str, torch.Tensor]:
    return state["model"]


def relative_distance(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    """|got - expected| / |expected| over all of `expected`'s tensors, as one vector."""
    difference = torch.cat([(got[k] - expected[k]).flatten() for k in expected])
    return float(difference.norm() / torch.cat([v.flatten() for v in expected.values()]).norm())


def covered_samples(history: list[list[int]]) -> list[tuple[int, int]]:
    """(first sample, end sample) of each history run, from [first step, first sample, batch, world, steps]."""
    return [(first, first + batch * steps) for _, first, batch, _, steps in history]


# --- `lbctl run --local` as a user runs it ------------------------------------------------------------

LBCTL = [PYTHON, "-m", "largebatch"]


def lbctl_run(
    job: Path, run_dir: Path, *extra: str, timeout: float = 400, env=None, wrap=lambda command: command
) -> subprocess.CompletedProcess:
    """`lbctl run --local`, its command line passed through `wrap` (to start it somewhere, e.g. a cgroup)."""
    command = [*LBCTL, "run", str(job), "--local", "--run-dir", str(run_dir), "--metrics-port", "0", *extra]
    env = env or trainer_env()
    return subprocess.run(wrap(command), capture_output=True, text=True, timeout=bound(timeout), env=env)


def start_lbctl(job: Path, run_dir: Path) -> subprocess.Popen:
    command = [*LBCTL, "run", str(job), "--local", "--run-dir", str(run_dir), "--metrics-port", "0"]
    # Its own process group, like a shell's foreground job: Ctrl-C goes to the group.
    return subprocess.Popen(
        command, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def progress_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "progress.json").read_text())


def trainer_workers(job: Path) -> dict[int, int]:
    """{rank: PID} of the trainer processes (not torchrun agents) running this job file. A trainer forked
    from its agent has the agent's command line; its name says its rank."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            name = (entry / "comm").read_text().strip()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if name.startswith(NAME_PREFIX) and str(job).encode() in argv:
            found[int(name.removeprefix(NAME_PREFIX))] = int(entry.name)
    return found
