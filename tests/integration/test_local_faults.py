"""Faults during `lbctl run --local`, produced for real: a second run on the same folder, a damaged
checkpoint, a SIGKILLed torchrun agent, a full disk and a read-only one (tmpfs mounts: the tests run as
root, as CI does), Ctrl-C, SIGTERM, SIGHUP and SIGKILL of lbctl itself. None may corrupt the run directory, leave
a process training, or end in a traceback; docs/local-runs.md lists what each costs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from largebatch import launch
from largebatch.local import rundir
from largebatch.local.nodes import descendants, parent_of
from largebatch_trainer import checkpoint
from tests.helpers import bound, contiguous, simulated_task, wait_for
from tests.integration.trainer_helpers import (
    final_state,
    kill_tree,
    lbctl_run,
    progress_of,
    run_standalone,
    start_lbctl,
    trainer_workers,
    write_job,
)

pytestmark = pytest.mark.integration

BATCH = 32


def long_job(tmp_path: Path, name: str, total: int = BATCH * 20_000, **overrides) -> Path:
    """A job of simulated samples of 1 ms (16 ms a step at two nodes), longer than the tests that stop it
    wait: while they wait, its workers sleep rather than train flat out (linreg took 15 to 54 CPU s a
    test)."""
    spec = {
        "task": simulated_task(0.001),
        "workers": {"min": 1, "max": 2},
        "batch": {"initial": BATCH, "max": BATCH, "microBatchPerDevice": 16, "policy": {"type": "constant"}},
        "schedule": {"totalSamples": total, "warmupSamples": 320},
        "checkpoint": {"everySteps": 50, "keep": 2},
    }
    return write_job(tmp_path, name, **(spec | overrides))


def stepping(run_dir: Path, beyond: int = 0) -> int:
    """Wait until the run has taken more than `beyond` steps; its step then."""
    return wait_for(lambda: (s := progress_of(run_dir)["progress"]["step"]) > beyond and s, timeout=180,
                    what=f"the run past step {beyond}")  # fmt: skip


def record_of(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def history_end(record: dict) -> int:
    last = record["history"][-1]
    return last["firstSample"] + last["globalBatch"] * last["steps"]


def metrics_port_of(pid: int) -> int:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return int(next(v for v in environ if v.startswith(launch.METRICS_PORT.encode() + b"=")).split(b"=")[1])


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def comm(pid: int) -> str:
    return Path(f"/proc/{pid}/comm").read_text().strip()


def running(pid: int) -> bool:
    """Alive and not a zombie (an exited process its parent has not reaped yet holds nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def left_over(run_dir: Path) -> list[str]:
    return [str(p) for p in run_dir.rglob("*.tmp")]


@pytest.fixture
def tmpfs(tmp_path):
    """A small filesystem of its own, to fill or make read-only."""
    mount = tmp_path / "fs"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_run_directory_belongs_to_one_run_at_a_time(tmp_path):
    job, run_dir = long_job(tmp_path, "owned"), tmp_path / "run"
    first = start_lbctl(job, run_dir)
    try:
        stepping(run_dir)
        second = lbctl_run(job, run_dir)
        assert second.returncode == 2 and "Traceback" not in second.stderr
        assert f"--run-dir {run_dir.resolve()} is in use by another lbctl run (pid {first.pid})" in second.stderr
        assert record_of(run_dir)["sessions"] == 1  # the second never touched the record
        first.send_signal(signal.SIGTERM)  # as `kill` or a process supervisor stops it: like Ctrl-C
        assert first.wait(timeout=bound(300)) == 128 + signal.SIGTERM
        assert record_of(run_dir)["sessionLog"][-1]["outcome"] == "stopped"
    finally:
        kill_tree(first.pid)
    # The lock went with the first run: the same command now resumes, and clears what a writer killed
    # mid-write would have left.
    stale = run_dir / "checkpoints" / ".ckpt-0000000999.pt.12345.tmp"
    stale.write_bytes(b"half a checkpoint")
    resumed = start_lbctl(job, run_dir)
    try:
        wait_for(lambda: record_of(run_dir)["sessions"] == 2, what="the second session to start")
        assert not stale.exists()
        # Ctrl-C as soon as the session has recorded itself, while it still imports torch: a clean stop,
        # recorded as one, not a KeyboardInterrupt.
        resumed.send_signal(signal.SIGINT)
        assert resumed.wait(timeout=bound(300)) == 128 + signal.SIGINT
        assert record_of(run_dir)["sessionLog"][-1]["outcome"] == "stopped"
    finally:
        kill_tree(resumed.pid)


def test_every_rank_resumes_from_the_newest_intact_checkpoint(tmp_path):
    total = BATCH * 400
    job = long_job(tmp_path, "damaged", total=total, checkpoint={"everySteps": 100, "keep": 3, "path": str(tmp_path)})
    run_standalone(job, nproc=2)
    saved = checkpoint.all_checkpoints(tmp_path)
    assert [p.name for p in saved] == ["ckpt-0000000200.pt", "ckpt-0000000300.pt", "ckpt-0000000400.pt"]
    newest = saved[-1]
    newest.write_bytes(newest.read_bytes()[:1000])  # cut short, as by a copy or a disk that lied
    result = run_standalone(job, nproc=2)
    # Rank 0 passed over the damaged file, named it, and both ranks went on from step 300.
    assert f"skipping a damaged checkpoint: {newest}: 1,000 bytes where" in result.stderr
    state = final_state(tmp_path)
    assert state["progress"]["samples"] == total and state["progress"]["step"] == 400
    spans = [(first, first + batch * steps) for _, first, batch, _, steps in state["history"]]
    assert contiguous(spans, total)


def both_training(job: Path, run_dir: Path, replacing: int | None = None) -> dict[int, int]:
    """{rank: PID} of the two workers, once the group trains at world size 2 (without `replacing`)."""
    return wait_for(lambda: progress_of(run_dir)["plan"]["worldSize"] == 2 and len(w := trainer_workers(job)) == 2
                    and replacing not in w.values() and w, timeout=180, what="two nodes training")  # fmt: skip


def test_a_killed_agent_takes_its_workers_with_it_and_a_new_node_joins(tmp_path):
    job, run_dir = long_job(tmp_path, "orphan"), tmp_path / "run"
    runner = start_lbctl(job, run_dir)
    try:
        workers = both_training(job, run_dir)
        # Forked from their agents (largebatch_trainer.forked), the agents from the run's zygote
        # (largebatch.local.zygote), a child of lbctl: none started as a new interpreter.
        zygotes = {parent_of(parent_of(pid)) for pid in workers.values()}
        assert all(cmdline(pid) == cmdline(parent_of(pid)) == cmdline(runner.pid) for pid in workers.values())
        assert len(zygotes) == 1 and parent_of(zygote := zygotes.pop()) == runner.pid
        assert comm(zygote) == "lbctl-zygote"  # how top and ps -o comm tell them from lbctl
        ports = sorted(metrics_port_of(pid) for pid in workers.values())
        os.kill(parent_of(workers[1]), signal.SIGKILL)  # rank 1's torchrun agent
        # Its worker dies with it (no orphan holding rank 1), and the runner replaces the node.
        wait_for(lambda: not Path(f"/proc/{workers[1]}").exists(), what="the agent's worker to die")
        workers = both_training(job, run_dir, replacing=workers[1])
        step = stepping(run_dir)
        stepping(run_dir, step + 20)  # and the group trains again
        # The new node serves metrics where the lost one did (a scrape config keeps finding it).
        assert sorted(metrics_port_of(pid) for pid in workers.values()) == ports
        # The zygote lost: both agents die with it (SIGTERM: their workers checkpoint), and the runner
        # starts both nodes again as new interpreters of its own.
        os.kill(zygote, signal.SIGKILL)
        wait_for(lambda: not any(running(pid) for pid in workers.values()), what="the zygote's agents to stop")
        workers = both_training(job, run_dir)
        assert {parent_of(parent_of(pid)) for pid in workers.values()} == {runner.pid}
        stepping(run_dir, stepping(run_dir) + 20)
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=bound(120)) == 130
    finally:
        kill_tree(runner.pid)
    assert record_of(run_dir)["restarts"] >= 3
    assert trainer_workers(job) == {}


def test_a_full_disk_ends_the_run_in_one_line_and_keeps_the_record(tmp_path, tmpfs):
    job, run_dir = long_job(tmp_path, "full"), tmpfs / "run"
    runner = start_lbctl(job, run_dir)
    try:
        stepping(run_dir, 100)
        before = (run_dir / "run.json").read_text()
        with open(tmpfs / "filler", "wb") as filler:  # the disk fills up under the run
            try:
                while True:
                    filler.write(b"\0" * (1 << 20))
                    filler.flush()
            except OSError:
                pass
        output, _ = runner.communicate(timeout=bound(300))
    finally:
        kill_tree(runner.pid)
    text = output.decode(errors="replace")
    assert runner.returncode in (1, 2), text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "No space left on device" in text or "a full disk does this" in text, text[-3000:]
    error = next(line for line in text.splitlines() if line.startswith("error:"))
    assert str(run_dir) in error, text[-3000:]  # the message names the file that could not be written
    assert (run_dir / "run.json").read_text() == before or record_of(run_dir)["sessions"] == 1
    assert left_over(run_dir) == []
    assert trainer_workers(job) == {}


def test_a_read_only_or_file_run_dir_is_one_line_and_exit_2(tmp_path, tmpfs):
    job = long_job(tmp_path, "nowhere")
    (tmpfs / "run").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(tmpfs)], check=True)
    result = lbctl_run(job, tmpfs / "run")  # the suite's bound: 60 s ran out under load (stop 58)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"error: --run-dir {tmpfs / 'run'}: Read-only file system" in result.stderr
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    result = lbctl_run(job, a_file)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--run-dir {a_file}: a file is in the way where the run's folder should be" in result.stderr


def test_records_match_their_checkpoint_and_a_killed_session_is_accounted_for(tmp_path):
    job, run_dir = long_job(tmp_path, "sessions", total=BATCH * 1_500), tmp_path / "run"
    # Ctrl-C: the record ends where the checkpoint it stopped on ends, and no process of the run is left.
    runner = start_lbctl(job, run_dir)
    try:
        stepping(run_dir, 100)
        children = descendants(runner.pid)
        assert len(children) >= 2  # a torchrun agent and its worker
        runner.send_signal(signal.SIGINT)
        assert runner.wait(timeout=bound(120)) == 130
    finally:
        kill_tree(runner.pid)
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert alive == [], f"left behind: {alive}"
    assert trainer_workers(job) == {}
    record = record_of(run_dir)
    assert record["samplesConsumed"] == history_end(record) == final_state(run_dir / "checkpoints")["progress"][
        "samples"]  # fmt: skip
    # SIGKILL of lbctl: nothing of the run trains on.
    runner = start_lbctl(job, run_dir)
    try:
        stepping(run_dir, record["serialSteps"] + 50)
        family = descendants(runner.pid)
        assert family
        runner.kill()
        runner.wait(timeout=bound(30))
        # The agents hold the folder's lock with lbctl: it stays taken until the last of them is gone.
        refusals = []

        def claimed() -> int | None:
            try:
                return rundir.claim(run_dir)
            except rundir.RunDirError as exc:
                refusals.append(str(exc))
                return None

        lock = wait_for(claimed, what="the run directory to be free")
        still_running = [pid for pid in family if running(pid)]
        os.close(lock)
        assert still_running == [] and refusals, (still_running, refusals)
        assert f"lbctl run pid {runner.pid}, which has ended: they are stopping" in " ".join(refusals[0].split())
    finally:
        kill_tree(runner.pid)
    # SIGHUP (the terminal closed) stops the run as Ctrl-C does.
    killed_at = final_state(run_dir / "checkpoints")["progress"]["step"]  # the agents stopped their workers
    runner = start_lbctl(job, run_dir)
    try:
        stepping(run_dir, killed_at + 20)  # steps of this session: its signal handlers are in place
        runner.send_signal(signal.SIGHUP)
        assert runner.wait(timeout=bound(120)) == 129
    finally:
        kill_tree(runner.pid)
    record = record_of(run_dir)
    assert [s["outcome"] for s in record["sessionLog"]] == ["stopped", "lost", "stopped"]
    assert record["samplesConsumed"] == history_end(record)
    result = lbctl_run(job, run_dir)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = record_of(run_dir)
    assert [s["outcome"] for s in record["sessionLog"]] == ["stopped", "lost", "stopped", "complete"]
    assert record["complete"] and record["samplesConsumed"] == history_end(record) == BATCH * 1_500
    spans = [(h["firstSample"], h["firstSample"] + h["globalBatch"] * h["steps"]) for h in record["history"]]
    assert contiguous(spans, BATCH * 1_500)
