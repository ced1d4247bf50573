"""Elastic training with real torchrun agents and a rendezvous store that no worker hosts: two nodes
train, one node fails for good (its worker killed, its agent out of restarts), the survivor restarts at
world size 1 from the newest checkpoint and finishes. No sample is skipped or repeated, and the result
matches an uninterrupted run. The store itself lost and started again: the nodes train on and rejoin it.
A node that waits for the next round is in it, however late it polls for it.

The agents and the stores are forked from the tests' zygote (tests/zygote.py): what these tests check is
the rendezvous and the training, not an interpreter's start."""

from __future__ import annotations

import itertools
import json
import os
import pickle
import signal
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import torch
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend

from largebatch import launch
from largebatch.local.nodes import descendants
from largebatch_trainer.main import NAME_PREFIX
from tests import zygote
from tests.helpers import bound, contiguous, free_port, newest_history, resumed_where_stopped, wait_for
from tests.integration.trainer_helpers import (
    PYTHON,
    covered_samples,
    final_state,
    kill_tree,
    run_standalone,
    spec_of,
    trainer_env,
    write_job,
)

pytestmark = pytest.mark.integration

TOTAL = 24 * 5000


def job(tmp_path, name):
    return write_job(
        tmp_path,
        name,
        workers={"min": 1, "max": 2},
        batch={"initial": 24, "max": 24, "microBatchPerDevice": 24, "policy": {"type": "constant"}},
        schedule={"totalSamples": TOTAL, "warmupSamples": 240},
        checkpoint={"everySteps": 100, "keep": 3},
    )


RUN_ID = "elastic-test"
BACK = "back: the workers stop after a checkpoint and rejoin"
"""What an agent says when the store it lost listens again (largebatch_trainer.rejoin)."""


def agent(job_path, port: int, progress, max_restarts: int = launch.MAX_RESTARTS, rdzv_conf: str = "") -> zygote.Forked:
    """One worker node, launched as the shells launch it (with `rdzv_conf` added to its --rdzv-conf)."""
    command = launch.torchrun_args(
        spec_of(job_path),
        str(job_path),
        launch.Rendezvous(f"127.0.0.1:{port}", RUN_ID),
        python=PYTHON,
        log_dir=str(job_path.with_name("torchelastic")),
    )
    command[command.index(f"--max-restarts={launch.MAX_RESTARTS}")] = f"--max-restarts={max_restarts}"
    if rdzv_conf:
        (index,) = [i for i, word in enumerate(command) if word.startswith("--rdzv-conf=")]
        command[index] += f",{rdzv_conf}"
    env = trainer_env() | launch.trainer_env(
        checkpoint_dir=str(job_path.with_name("elastic-ckpt")),
        metrics_port=0,
        progress_file=str(progress),
        report_seconds=0.1,
        device="cpu",
    )
    log = progress.with_name(f"agent-{len(list(progress.parent.glob('agent-*')))}.log")
    log.touch()  # the next node's log takes the next number
    assert command[:2] == [PYTHON, "-m"], command
    return zygote.shared().start(command[2], command[3:], env, Path.cwd(), log)


def workers_of(node: zygote.Forked) -> list[int]:
    """The trainer processes of a node's agent (the agent's other children, if any, are not trainers)."""
    return [pid for pid in descendants(node.pid) if Path(f"/proc/{pid}/comm").read_text().startswith(NAME_PREFIX)]


def training_at(progress, world: int, past_step: int) -> None:
    wait_for(
        lambda: (
            (r := json.loads(progress.read_text()))["plan"]["worldSize"] == world and r["progress"]["step"] > past_step
        ),
        timeout=120,
        what=f"world size {world} training past step {past_step}",
    )


def rendezvous_store(port: int, log: Path) -> zygote.Forked:
    """The store as the job's rendezvous pod runs it, ready once it says where it listens."""
    args = ["--host", "127.0.0.1", "--port", str(port)]
    store = zygote.shared().start("largebatch_trainer.rendezvous", args, trainer_env(), Path.cwd(), log)
    wait_for(lambda: "listening on" in log.read_text() or store.poll() is not None, what="the store to listen")
    assert store.poll() is None, log.read_text()
    return store


def standby_store(port: int) -> subprocess.Popen:
    """The same store with its interpreter started and torch imported, which listens only once `listen`
    tells it to. A store started from nothing after the old one died took longer on a busy CI machine
    than the rest of the run: training ended before any agent could see the store back."""
    command = [PYTHON, "-c", _WAIT_THEN_LISTEN, "--host", "127.0.0.1", "--port", str(port)]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=trainer_env())


_WAIT_THEN_LISTEN = """
import sys
from largebatch_trainer import rendezvous
sys.stdin.readline()
sys.exit(rendezvous.main(sys.argv[1:]))
"""


def listen(standby: subprocess.Popen) -> subprocess.Popen:
    standby.stdin.write("listen\n")
    standby.stdin.flush()
    return listening(standby)


def listening(store: subprocess.Popen) -> subprocess.Popen:
    assert "listening on" in store.stdout.readline()
    return store


def test_losing_a_node_mid_run_resumes_exactly(tmp_path):
    port = free_port()
    store = rendezvous_store(port, tmp_path / "store.log")
    job_path, progress = job(tmp_path, "elastic"), tmp_path / "progress.json"
    # No restarts for the second node, so its agent gives up.
    first, second = agent(job_path, port, progress), agent(job_path, port, progress, max_restarts=0)
    try:
        training_at(progress, 2, past_step=150)
        # The survivor resumes from the newest checkpoint, so wait for one the two nodes wrote: a node lost
        # before that (the second can join late when steps are fast) leaves nothing of world size 2 to see.
        wait_for(lambda: 2 in [run[3] for run in newest_history(job_path.with_name("elastic-ckpt"))], timeout=120,
                 what="a checkpoint written by the two nodes")  # fmt: skip
        # Its worker killed, the second agent leaves failed, not by a signal: torch's launcher then closes
        # the round's rendezvous, and the survivor, restarting into it, failed with RendezvousClosedError
        # (largebatch_trainer.rejoin keeps the round open).
        (worker,) = workers_of(second)
        os.kill(worker, signal.SIGKILL)
        assert second.wait(timeout=bound(120)) != 0
        assert first.wait(timeout=bound(240)) == 0, first.args
    finally:
        for process in (first, second):
            kill_tree(process.pid)
        store.terminate()
        assert store.wait(timeout=bound(30)) == 0
    state = final_state(tmp_path / "elastic-ckpt")
    assert state["progress"]["samples"] == TOTAL
    worlds = [run[3] for run in state["history"]]
    assert 2 in worlds and worlds[-1] == 1, state["history"]
    # Contiguous coverage of the sample stream: nothing skipped, nothing counted twice.
    spans = covered_samples(state["history"])
    assert contiguous(spans, TOTAL), spans
    reference = job(tmp_path, "reference")
    run_standalone(reference, 0)
    expected = final_state(tmp_path / "reference-ckpt")
    assert state["progress"]["step"] == expected["progress"]["step"]
    torch.testing.assert_close(state["model"], expected["model"], rtol=1e-4, atol=1e-5)


def test_a_lost_rendezvous_store_that_comes_back_loses_nothing(tmp_path):
    """The store killed (its pod deleted) while two nodes train: they train on without it, and when a
    store listens at the same address again (the operator's new pod behind the Service), they stop
    after a checkpoint and rejoin it. Neither agent fails, and the run resumes at the step it stopped.
    Each node's trainers are held still (SIGSTOP) from the store's return until their agent has seen it:
    under two CPU hogs and four other lanes the run's last 4,000 steps took 31 s and ended before the
    agents saw the store back (stop 58). However fast this machine trains, part of the run must be left
    for after the outage."""
    port = free_port()
    store = rendezvous_store(port, tmp_path / "store.log")
    job_path, progress = job(tmp_path, "rejoin"), tmp_path / "progress.json"
    first, second = agent(job_path, port, progress), agent(job_path, port, progress)
    logs = [tmp_path / "agent-0.log", tmp_path / "agent-1.log"]
    replacement = standby_store(port)
    try:
        training_at(progress, 2, past_step=150)
        store.kill()
        store.wait()
        wait_for(lambda: all("rendezvous store at" in log.read_text() for log in logs),
                 what="both agents to notice the store gone")  # fmt: skip
        step = json.loads(progress.read_text())["progress"]["step"]
        training_at(progress, 2, past_step=step + 100)  # training needs no store
        held = {log: workers_of(node) for log, node in zip(logs, (first, second), strict=True)}
        for pid in itertools.chain(*held.values()):
            os.kill(pid, signal.SIGSTOP)
        store = listen(replacement)
        back_at = json.loads(progress.read_text())["progress"]["step"]
        while held:  # a node's trainers go on once its agent has seen the store (it SIGTERMs them to rejoin)
            log = wait_for(lambda: next((log for log in held if BACK in log.read_text()), None), timeout=120,
                           what="the agents to see the store back")  # fmt: skip
            for pid in held.pop(log):
                os.kill(pid, signal.SIGCONT)
        finished = first.wait(timeout=bound(240)) == 0 and second.wait(timeout=bound(60)) == 0
        assert finished, [log.read_text()[-3000:] for log in logs]
    finally:
        for process in (first, second):
            kill_tree(process.pid)
        for process in (store, replacement):
            process.terminate()
            process.wait(timeout=bound(30))
    text = "".join(log.read_text() for log in logs)
    assert all(BACK in log.read_text() for log in logs), f"the store listened again at step {back_at}"
    state = final_state(tmp_path / "elastic-ckpt")
    assert state["progress"]["samples"] == TOTAL
    assert contiguous(covered_samples(state["history"]), TOTAL)
    resumed_where_stopped(text)  # the checkpoint on stop lost nothing


def rendezvous_state(client: TCPStore):
    """The round as torch's agents share it in the store (its _RendezvousState)."""
    found = C10dRendezvousBackend(client, RUN_ID).get_state()
    assert found is not None, "no rendezvous state in the store"
    return pickle.loads(found[0])


def test_a_node_waiting_for_a_round_is_in_it_however_late_it_polls(tmp_path):
    """One node trains; a second arrives and waits on the list for the next round; the first restarts its
    group for it, and the second polls late (frozen: what a loaded machine does to a process for
    seconds). The round that opens waits for it and trains at world size 2 at once: torch's own would
    close a second after the first node rejoined, with it alone, and restart again for the waiting node
    (full_rounds; in CI, a job of four did so every 16 s for ten minutes). The agents' heartbeats may
    lapse for 60 s here, so that the frozen node is not counted dead meanwhile on a loaded machine."""
    port = free_port()
    store = rendezvous_store(port, tmp_path / "store.log")
    client = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=60))
    job_path, progress = job(tmp_path, "late"), tmp_path / "progress.json"
    patient = "keep_alive_interval=5,keep_alive_max_attempt=12"
    first = agent(job_path, port, progress, rdzv_conf=patient)
    second = None
    try:
        training_at(progress, 1, past_step=0)
        trainers = workers_of(first)  # its group cannot stop, so the round cannot open, until let go
        for process in trainers:
            os.kill(process, signal.SIGSTOP)
        second = agent(job_path, port, progress, rdzv_conf=patient)

        def second_waiting():
            state = rendezvous_state(client)
            return state if second.pid in {node.pid for node in state.wait_list} else None

        waiting = wait_for(second_waiting, timeout=120, what="the second node on the wait list")
        os.kill(second.pid, signal.SIGSTOP)
        for process in trainers:
            os.kill(process, signal.SIGCONT)

        def next_round_closed_or_long_past_its_last_call():
            state = rendezvous_state(client)
            past = state.deadline is not None and state.deadline < datetime.now(timezone.utc) - timedelta(seconds=3)
            return state if state.round > waiting.round and (state.complete or past) else None

        # The first node rejoined the round it opened, its last call is over, and it has polled since (once a
        # second): torch's would have closed the round by now.
        state = wait_for(next_round_closed_or_long_past_its_last_call, timeout=120,
                         what="the next round to open and its last call to pass")  # fmt: skip
        os.kill(second.pid, signal.SIGCONT)
        assert not state.complete, f"round {state.round} closed without the waiting node: {state.participants}"
        assert first.pid in {node.pid for node in state.participants}, state.participants
        training_at(progress, 2, past_step=json.loads(progress.read_text())["progress"]["step"])
    finally:
        for process in (first, second):
            if process is not None:
                kill_tree(process.pid)
        store.terminate()
        store.wait(timeout=bound(30))
    resumed = [line for line in (tmp_path / "agent-0.log").read_text().splitlines() if "resumed from" in line]
    assert resumed and all(line.endswith("with world size 2") for line in resumed), resumed
