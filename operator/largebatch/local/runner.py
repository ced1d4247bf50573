"""`lbctl run --local`: observe rank 0's progress, ask the controller how many nodes to run, start and
stop torchrun nodes accordingly, and keep a record of the run.

The runner owns no training state: the trainer checkpoints and resumes by itself, so the runner can
start, stop or lose nodes at any moment, and a second `lbctl run` of the same run directory resumes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from largebatch import controller, launch, report, schedule
from largebatch.api import LargeBatchJob
from largebatch.local.nodes import Node, NodeSettings, last_error, start_node, stop_node, stop_nodes
from largebatch.local.rundir import claim
from largebatch.local.zygote import Zygote

TICK_SECONDS = 0.5
DEFAULT_RESTART_SECONDS = 10.0
# Once rank 0 has reported the job done (every rank has left the process group by then), agents leave
# by themselves within a monitor interval or two; the ones still there after this are stopped.
FINISH_GRACE_SECONDS = 3.0
# Nodes that die this many times in a row without the job taking a step mean the job cannot run.
MAX_FAILURES_WITHOUT_PROGRESS = 2


class RunFailed(Exception):
    """The job cannot make progress; the message says why."""


@dataclass
class RunOptions:
    run_dir: Path
    slots: int
    capacity: list[tuple[float, int]] | None = None
    device: str = "cpu"
    metrics_port: int = 0
    restart_seconds: float | None = None
    """Assumed cost of a rescale; None: DEFAULT_RESTART_SECONDS until the first rescale is measured."""
    zygote: Zygote | None = None
    """Where nodes' agents are forked from (largebatch.local.zygote); None: each starts as a new interpreter."""


@dataclass
class RunState:
    """What the runner remembers; written to run.json and read back by a resumed run."""

    timeline: list[dict] = field(default_factory=list)
    rescales: list[dict] = field(default_factory=list)
    restarts: int = 0
    elastic_restarts: int = 0
    sessions: int = 0
    wall_seconds: float = 0.0
    session_log: list[dict] = field(default_factory=list)
    """One entry per `lbctl run` of this folder and how it ended: complete, stopped, failed, or lost (it
    wrote no record at its end: killed, or the machine went down)."""


class LocalRun:
    def __init__(self, job: LargeBatchJob, job_path: Path, options: RunOptions, display):
        self.job, self.spec, self.options, self.display = job, job.spec, options, display
        self.job_path = job_path.resolve()
        self.run_dir = options.run_dir.resolve()
        self.lock = claim(self.run_dir)
        for stale in self.run_dir.rglob(".*.tmp"):  # left by a writer that was killed; the folder is ours now
            stale.unlink(missing_ok=True)
        self.progress_file = self.run_dir / "progress.json"
        self.state = _load_state(self.run_dir / "run.json")
        self.state.sessions += 1
        # Written as "running" at once: a session that never writes its ending is known to have been lost.
        self.state.session_log.append({"session": self.state.sessions, "outcome": "running"})
        self.nodes: list[Node] = []
        self.next_index = 0
        self.stopping = False
        self.restart_seconds = DEFAULT_RESTART_SECONDS if options.restart_seconds is None else options.restart_seconds
        self.last_rescale: float | None = None
        self.pending_rescale: tuple[float, int] | None = None  # (when, step at the time)
        self.report: dict = {}  # rank 0's reports merged: values the last one lacks are kept from earlier ones
        self.status = report.read(None)[0]  # rank 0's last report, exactly
        self.failures = 0
        self.stopped_by = signal.SIGINT
        self.generation = 0
        self.step_at_failure: int | None = None
        self.failed_at: float | None = None  # time.monotonic() of the last failure

    # --- the loop ---------------------------------------------------------------------------------

    def run(self) -> int:
        import torch.distributed as dist  # the store; torch is only needed to run jobs locally

        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, multi_tenant=True)
        self.settings = NodeSettings(
            job_path=self.job_path,
            run_dir=self.run_dir,
            spec=self.spec,
            rendezvous_port=store.port,
            run_id=f"{self.job.metadata.name}-{os.getpid()}",
            device=self.options.device,
            threads=max(1, (os.cpu_count() or 1) // max(1, self.options.slots * self.spec.workers.devices_per_worker)),
            metrics_port=self.options.metrics_port,
            lock_fd=self.lock,
            zygote=self.options.zygote,
        )
        started = self.started = time.monotonic()
        try:
            finished = self._loop()
        finally:
            stop_nodes(self.nodes)
            self.nodes = []
            self.state.wall_seconds += time.monotonic() - started
            del store
        return 0 if finished else 128 + self.stopped_by

    @contextlib.contextmanager
    def stopped_by_signals(self) -> Iterator[None]:
        """Ctrl-C, SIGTERM and SIGHUP stop the run cleanly while the block runs. The session enters it before
        it records itself: a signal in the seconds before the loop (torch's import, the store) then stops
        the run at its first tick, where a KeyboardInterrupt used to end lbctl with a traceback and the
        session recorded as lost."""
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _on_signal(self, signum, _frame) -> None:
        self.stopping = True
        self.stopped_by = signum

    def end(self, outcome: str) -> None:
        """Record how this session ended: complete, stopped or failed. (The run directory stays ours until
        the process exits, after the record is written.)"""
        self.state.session_log[-1]["outcome"] = outcome

    def _loop(self) -> bool:
        total = self.spec.schedule.total_samples
        while True:
            latest = _read_json(self.progress_file)
            self.report = _merge(self.report, latest)
            if latest is not None:
                # The controller plans from exactly what rank 0 said last (a worker restarted from an older
                # checkpoint reports an older policy state); the merged report is for people.
                self.status = report.read(latest)[0]
            self.state.elastic_restarts = max(self.state.elastic_restarts, self.status.elastic_restarts or 0)
            progress = report.progress_from_status(self.status)
            done = bool(self.status.done) and progress.samples >= total
            if done and self.nodes:
                self._finish()
            self._reap(done)
            if done and not self.nodes:
                self._observe(progress, capacity=self._capacity(progress))
                return True
            if self.stopping:
                self.display.event("stopping: nodes checkpoint and exit")
                return False
            capacity = self._capacity(progress)
            if not done:
                self._act(progress, capacity)
            self._observe(progress, capacity)
            time.sleep(TICK_SECONDS)

    def _finish(self) -> None:
        """Every rank is done: let the agents leave, and stop those that would wait in torchelastic's exit
        barrier for a peer that is not coming (see largebatch_trainer/torchrun.py)."""
        deadline = time.monotonic() + FINISH_GRACE_SECONDS
        while time.monotonic() < deadline and any(node.alive for node in self.nodes):
            time.sleep(0.1)
        stop_nodes([node for node in self.nodes if node.alive])

    def _capacity(self, progress: schedule.Progress) -> int:
        slots = self.options.slots
        if self.options.capacity:
            fraction = progress.samples / self.spec.schedule.total_samples
            slots = min(slots, controller.capacity_at(self.options.capacity, fraction))
        return slots

    def _reap(self, done: bool) -> None:
        dead = [node for node in self.nodes if not node.alive]
        for node in dead:
            self.nodes.remove(node)
        if done or not dead:
            return
        for node in dead:
            self.state.restarts += 1
            said = last_error(node)
            self.display.event(f"node {node.index} exited with {node.process.returncode}; see {node.log}"
                               + (f"\n{said}" if said else ""))  # fmt: skip
            if launch.DIVERGED in said:
                raise RunFailed(f"{said}\nfull log: {node.log}")
        # A node started before the last failure fell with it, whenever its end is seen (nodes lost
        # together: the zygote they were forked from, a machine's worth): one failure, not one each.
        if all(self.failed_at is not None and node.started <= self.failed_at for node in dead):
            return
        self.failed_at = time.monotonic()
        step = self.status.step or 0
        self.failures = self.failures + 1 if step == self.step_at_failure else 1
        self.step_at_failure = step
        if self.failures >= MAX_FAILURES_WITHOUT_PROGRESS:
            raise RunFailed(
                f"nodes keep failing at step {step} without progress; the workers' last error:\n"
                f"{last_error(dead[-1]) or '(nothing logged: was the log writable? a full disk does this)'}\n"
                f"full log: {dead[-1].log}"
            )

    def _act(self, progress: schedule.Progress, capacity: int) -> None:
        self._measure_restart(progress)
        seen = controller.Observation(
            progress=progress,
            workers=len(self.nodes),
            capacity=capacity,
            samples_per_second=self.status.samples_per_second if self.nodes else None,
            seconds_since_rescale=None if self.last_rescale is None else time.monotonic() - self.last_rescale,
            restart_seconds=self.restart_seconds,
        )
        decision = controller.decide(self.spec, seen)
        current = len(self.nodes)
        if not decision.changes(current):
            self.display.reason = decision.reason
            return
        if current:
            entry = decision.rescale(current, progress.samples)
            self.state.rescales.append(entry.model_dump(mode="json", by_alias=True, exclude_none=True))
            self.last_rescale = time.monotonic()
            self.pending_rescale = (self.last_rescale, progress.step)
        self.display.event(f"{current} → {decision.workers} nodes: {decision.reason}")
        if not self.nodes:
            # Agents that give up close their rendezvous for good; a fresh group needs a fresh one.
            self.generation += 1
        while len(self.nodes) < decision.workers:
            settings = dataclasses.replace(self.settings, run_id=f"{self.settings.run_id}-{self.generation}")
            slot = min(set(range(len(self.nodes) + 1)) - {node.slot for node in self.nodes})
            self.nodes.append(start_node(settings, self.next_index, slot))
            self.next_index += 1
        while len(self.nodes) > decision.workers:
            stop_node(self.nodes.pop())

    def _measure_restart(self, progress: schedule.Progress) -> None:
        """A rescale costs the time until the job takes a step again (unless the user fixed the cost)."""
        if self.options.restart_seconds is not None:
            return
        if self.pending_rescale and progress.step > self.pending_rescale[1] + 1:
            took = time.monotonic() - self.pending_rescale[0]
            self.restart_seconds = 0.5 * self.restart_seconds + 0.5 * took
            self.pending_rescale = None

    def _observe(self, progress: schedule.Progress, capacity: int) -> None:
        shown, plan = report.read(self.report)
        entry = {
            "session": self.state.sessions,
            "seconds": round(self.state.wall_seconds + time.monotonic() - self.started, 2),
            "samples": progress.samples,
            "step": progress.step,
            "nodes": len(self.nodes),
            "capacity": capacity,
            **plan.model_dump(mode="json", by_alias=True),
            **shown.model_dump(mode="json", by_alias=True, include={"loss", "noise_scale", "samples_per_second"}),
            # The batch the controller plans for the next step, from the reported policy state: the
            # trainer's history must show it took exactly this one.
            "nextBatch": (
                schedule.plan(self.spec, progress).policy_batch
                if progress.samples < self.spec.schedule.total_samples
                else None
            ),
        }
        last = self.state.timeline[-1] if self.state.timeline else None
        if self.report.get("progress") and (
            last is None or (last["step"], last["nodes"]) != (entry["step"], entry["nodes"])
        ):
            self.state.timeline.append(entry)
        self.display.update(self, progress, capacity)

    # --- the record -------------------------------------------------------------------------------

    def record(self) -> dict:
        """run.json: the runner's timeline plus, from the training record rank 0 writes with each checkpoint
        (`report.TrainingRecord`), the trainer's exact step history and where it stands (a last report may
        be older or newer than that checkpoint; the checkpoint is what a resumed run starts from)."""
        saved = report.read_record(self.run_dir / "checkpoints")
        shown, _ = report.read(self.report)
        return {
            "job": self.job.metadata.name,
            "totalSamples": self.spec.schedule.total_samples,
            "samplesConsumed": saved.samples,
            "complete": saved.samples >= self.spec.schedule.total_samples,
            "finalLoss": saved.loss,
            "evalLoss": shown.eval_loss,
            "evalAccuracy": shown.eval_accuracy,
            "serialSteps": saved.step,
            "wallSeconds": self.state.wall_seconds,
            "sessions": self.state.sessions,
            "restarts": self.state.restarts,
            "elasticRestarts": self.state.elastic_restarts,
            "rescales": self.state.rescales,
            "sessionLog": self.state.session_log,
            "history": [span.model_dump(by_alias=True) for span in saved.history],
            "evaluations": [evaluation.model_dump(by_alias=True) for evaluation in saved.evaluations],
            "timeline": self.state.timeline,
        }


def _merge(old: dict, new: dict | None) -> dict:
    """The newest report, keeping the values of the previous one that it lacks (a worker that has just
    restarted has no loss or plan yet): the view never blanks a value it had a moment before."""
    if new is None:
        return old
    merged = {**old, **new}
    for key in ("progress", "plan"):
        merged[key] = {**old.get(key, {}), **new.get(key, {})}
    return merged


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _load_state(path: Path) -> RunState:
    previous = _read_json(path) or {}
    return RunState(
        timeline=previous.get("timeline", []),
        rescales=previous.get("rescales", []),
        restarts=previous.get("restarts", 0),
        elastic_restarts=previous.get("elasticRestarts", 0),
        sessions=previous.get("sessions", 0),
        wall_seconds=previous.get("wallSeconds", 0.0),
        session_log=[
            entry | {"outcome": "lost"} if entry.get("outcome") == "running" else entry
            for entry in previous.get("sessionLog", [])
        ],
    )
