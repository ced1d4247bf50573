"""Worker "nodes" on this machine: one torchrun agent each, joined through a rendezvous store that the
runner hosts, so that any node can come and go. An agent is forked from the run's zygote
(largebatch.local.zygote), or started as a fresh interpreter where there is none."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from largebatch import launch
from largebatch.api import LargeBatchJobSpec
from largebatch.local.zygote import Forked, Zygote, ZygoteGone

# largebatch_trainer.torchrun's: the pid of the parent an agent dies with (PR_SET_PDEATHSIG).
DIES_WITH_PARENT = "LARGEBATCH_AGENT_DIES_WITH_PARENT"
# The zygote's name in top and `ps -o comm` (it keeps lbctl's command line; an agent shows as torch names
# it, pt_elastic).
ZYGOTE_NAME = "lbctl-zygote"
# What a node's agent (largebatch_trainer.torchrun) imports, imported once by the zygote it is forked
# from: its libraries, never the module itself (largebatch.local.zygote).
AGENT_MODULES = (
    "torch._dynamo",
    "torch.distributed.run",
    "largebatch_trainer.forked",
    "largebatch_trainer.full_rounds",
    "largebatch_trainer.loop",
    "largebatch_trainer.rejoin",
)


@dataclass
class NodeSettings:
    job_path: Path
    run_dir: Path
    spec: LargeBatchJobSpec
    rendezvous_port: int
    run_id: str
    device: str
    threads: int
    metrics_port: int  # of node 0's local rank 0; 0 disables
    lock_fd: int  # the run directory's lock (local.rundir), shared with every agent
    zygote: Zygote | None = None  # where agents are forked from; None: each is a fresh interpreter


@dataclass
class Node:
    index: int
    slot: int  # the lowest not taken by a live node: its metrics ports (a replacement node reuses them)
    process: subprocess.Popen | Forked
    log: Path
    started: float = field(default_factory=time.monotonic)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None


def start_node(settings: NodeSettings, index: int, slot: int) -> Node:
    spec = settings.spec
    logs = settings.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    log = logs / f"node-{index}.log"
    rendezvous = launch.Rendezvous(f"127.0.0.1:{settings.rendezvous_port}", settings.run_id)
    command = launch.torchrun_args(
        spec, str(settings.job_path), rendezvous, python=sys.executable, log_dir=str(logs / "torchelastic")
    )
    port = metrics_port(settings.metrics_port, slot, spec.workers.devices_per_worker)
    env = os.environ | launch.trainer_env(
        checkpoint_dir=str(settings.run_dir / "checkpoints"),
        metrics_port=port,
        progress_file=str(settings.run_dir / "progress.json"),
        report_seconds=0.5,
        device=settings.device,
    )
    env["OMP_NUM_THREADS"] = str(settings.threads)
    # A session of its own: Ctrl-C in the terminal reaches the runner only, which stops nodes in order.
    # The agent holds the run directory's lock with us: if we are killed, the folder stays taken until
    # the agent has stopped its workers (they checkpoint as they stop). It dies with its parent, the
    # zygote or us: nothing trains on once the runner is gone (the zygote ends with the runner).
    zygote = settings.zygote
    if zygote is not None and zygote.alive:
        env[DIES_WITH_PARENT] = str(zygote.pid)
        try:
            process = zygote.start(command[2], command[3:], env, Path.cwd(), log, pass_fds=(settings.lock_fd,))
            return Node(index, slot, process, log)
        except ZygoteGone:  # killed, say: the node starts as it would without one
            pass
    env[DIES_WITH_PARENT] = str(os.getpid())
    with open(log, "ab") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                   pass_fds=(settings.lock_fd,))  # fmt: skip
    return Node(index, slot, process, log)


def metrics_port(base: int, slot: int, devices_per_worker: int) -> int:
    """Local rank 0's metrics port on the node in `slot` (local rank r serves on this + r); 0 disables."""
    return base + slot * devices_per_worker if base else 0


def last_error(node: Node, lines: int = 3) -> str:
    """The last error lines a node's workers logged (the traceback's final line, usually)."""
    try:
        text = node.log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    # torchrun's own log lines start with a level letter and a date (E1130 ...); the workers' do not.
    errors = [line for line in text if "Error" in line and not re.match(r"^[EWI]\d{4} ", line)]
    return "\n".join(errors[-lines:])


def stop_node(node: Node, grace: float = 60.0) -> None:
    stop_nodes([node], grace)


def stop_nodes(nodes: list[Node], grace: float = 60.0) -> None:
    """SIGTERM every agent at once (they stop their workers, which agree to stop after the same step
    and checkpoint), wait, then make sure nothing of them is left."""
    workers = {node.index: descendants(node.process.pid) for node in nodes}  # before they lose their parent
    for node in nodes:
        if node.alive:
            node.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for node in nodes:
        try:
            node.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        kill(workers[node.index] + [node.process.pid, *descendants(node.process.pid)])
        node.process.wait()


def kill_tree(pid: int) -> None:
    """SIGKILL `pid` and all its descendants (torchrun puts workers in sessions of their own)."""
    kill([pid, *descendants(pid)])


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def parent_of(pid: int) -> int:
    """The parent's pid, from /proc (the command name before it may hold anything, even ')')."""
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = parent_of(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, stack = [], [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found
