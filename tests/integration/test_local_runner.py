"""`lbctl run --local` with real torchrun processes: capacity changes, a lost worker, and Ctrl-C."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import pytest

from largebatch import schedule
from tests.helpers import bound, contiguous, simulated_task, wait_for
from tests.integration.trainer_helpers import (
    kill_tree,
    lbctl_run,
    progress_of,
    spec_of,
    start_lbctl,
    trainer_env,
    trainer_workers,
    write_job,
)

pytestmark = pytest.mark.integration


def test_capacity_changes_keep_the_global_batch_exact(tmp_path):
    # Simulated samples of 2 ms: each capacity change is seen and acted on within its span of the run
    # (the shortest, 65% to the end, lasts 17 s or more) on any machine, in 1,100 steps that wait rather
    # than compute (a small GPT's 2,800 steps took 55 CPU s).
    total = 48_000
    job = write_job(
        tmp_path,
        "capacity",
        task=simulated_task(0.002),
        workers={"min": 1, "max": 2},
        batch={"initial": 32, "max": 64, "microBatchPerDevice": 16, "policy": {"type": "seesaw"}},
        optimizer={"name": "adamw", "lr": 0.003},
        schedule={"totalSamples": total, "warmupSamples": 1_200, "minLrRatio": 0.05},
        checkpoint={"everySteps": 50},
    )
    run_dir, temporary = tmp_path / "run", tmp_path / "tmp"
    temporary.mkdir()
    result = lbctl_run(job, run_dir, "--capacity", "0:1,25%:2,65%:1", "--restart-cost", "0",
                       env=trainer_env() | {"TMPDIR": str(temporary)})  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    # torchelastic's files are in the run directory, not left behind in TMPDIR (where torch keeps only its
    # shared compile cache folder, torchinductor_<user>).
    assert [p.name for p in temporary.iterdir() if not p.name.startswith("torchinductor_")] == []
    assert list((run_dir / "logs" / "torchelastic").iterdir())
    record = json.loads((run_dir / "run.json").read_text())
    assert (run_dir / "run.png").read_bytes()[:4] == b"\x89PNG"
    assert record["complete"] and record["samplesConsumed"] == total
    history = record["history"]
    assert history[0]["firstSample"] == 0
    assert all(a["firstSample"] + a["globalBatch"] * a["steps"] == b["firstSample"] for a, b in pairwise(history))
    # The batch follows the plan exactly, whatever the world size: it changes where phases() says.
    spec = spec_of(job)
    planned = [(p.start, p.global_batch) for p in schedule.phases(spec)]
    batch_changes = [(h["firstSample"], h["globalBatch"]) for i, h in enumerate(history)
                     if i == 0 or history[i - 1]["globalBatch"] != h["globalBatch"]]  # fmt: skip
    assert batch_changes == [(start, b) for i, (start, b) in enumerate(planned) if i == 0 or planned[i - 1][1] != b]
    # The world size follows the capacity: 1, then 2 from 25% on, then 1 again from 65% on.
    worlds = [(h["firstSample"], h["worldSize"]) for h in history]
    changes = [(s, w) for i, (s, w) in enumerate(worlds) if i == 0 or worlds[i - 1][1] != w]
    assert [w for _, w in changes] == [1, 2, 1], history
    assert changes[1][0] >= 0.25 * total and changes[2][0] >= 0.65 * total
    # While the capacity was short, accumulation made up the difference: batch 32 on one 16-sample rank.
    short = [t for t in record["timeline"] if t["worldSize"] == 1 and t["globalBatch"] == 32]
    assert short and all(t["accumulationSteps"] == 2 and t["microBatch"] == 16 for t in short)
    late = [t for t in record["timeline"] if t["worldSize"] == 1 and t["globalBatch"] == 64]
    assert late and all(t["accumulationSteps"] == 4 for t in late)
    assert [r["to"] for r in record["rescales"]] == [2, 1]


def test_under_critical_batch_the_controller_plans_the_batch_the_trainer_takes(tmp_path):
    """The controller rebuilds the policy's state from rank 0's report; at every observation the batch
    it plans for the next step must be the batch the trainer then took (its exact step history). The job
    is set up so that the policy wants a larger batch soon after each change: only
    `minStepsBetweenChanges`, counted from the reported `lastChangeStep`, holds it back."""
    min_steps = 200
    job = write_job(
        tmp_path,
        "critical",
        task={"args": {"dim": 32, "samples": 65_536}},
        workers={"min": 1, "max": 2},
        batch={
            "initial": 16, "max": 2048, "microBatchPerDevice": 8,
            "policy": {"type": "criticalBatch",
                       "criticalBatch": {"multiplier": 1.0, "smoothing": 0.9, "minStepsBetweenChanges": min_steps}},
        },
        # A fixed LR (no batch scaling) decaying to 1%: SGD's noise floor |w − w*|² shrinks with the LR and
        # with the batch, so the noise scale keeps growing and every change makes the policy want the next.
        optimizer={"name": "sgd", "lr": 0.05, "scaling": "none"},
        schedule={"totalSamples": 300_000, "warmupSamples": 160, "decay": "linear", "minLrRatio": 0.01},
        checkpoint={"everySteps": 500},
    )  # fmt: skip
    run_dir = tmp_path / "run"
    result = lbctl_run(job, run_dir, "--restart-cost", "0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["complete"]
    taken = {}  # step -> the policy batch the trainer took at that step
    for h in record["history"]:
        for step in range(h["firstStep"], h["firstStep"] + h["steps"]):
            taken[step] = h["globalBatch"]
    changes = [s for s in sorted(taken)[1:] if taken[s] != taken[s - 1]]
    assert len(changes) >= 2, record["history"]
    assert all(b - a >= min_steps for a, b in pairwise(changes))
    observed = [t for t in record["timeline"] if t["nextBatch"] is not None and t["step"] > 0]
    disagreements = [
        (t["step"], t["nextBatch"], taken[t["step"]]) for t in observed if taken[t["step"]] != t["nextBatch"]
    ]
    assert disagreements == [], "(step, controller's batch, trainer's batch)"
    # The check has teeth: at some observations a controller blind to lastChangeStep would have planned
    # a larger batch than the trainer took.
    spec = spec_of(job)
    blind = [
        schedule.plan(spec, schedule.Progress(samples=t["samples"], step=t["step"], batch=taken[t["step"] - 1],
                                              noise_scale=t["noiseScale"])).policy_batch
        for t in observed
    ]  # fmt: skip
    assert any(b != t["nextBatch"] for b, t in zip(blind, observed, strict=True))


def paced_job(tmp_path, name: str, total: int) -> Path:
    """Batch 32 on one or two nodes, training simulated samples of 1 ms (16 ms a step at two nodes): the
    job lasts as long as the test needs on any machine, in steps that wait rather than compute."""
    return write_job(
        tmp_path,
        name,
        task=simulated_task(0.001),
        workers={"min": 1, "max": 2},
        batch={"initial": 32, "max": 32, "microBatchPerDevice": 16, "policy": {"type": "constant"}},
        schedule={"totalSamples": total, "warmupSamples": 320},
        checkpoint={"everySteps": 100},
    )


def test_a_killed_worker_is_restarted_and_the_job_completes(tmp_path):
    total = 32 * 2_500  # 40 s at two nodes; the restart stalls the group, so the job cannot end before it
    job, run_dir = paced_job(tmp_path, "killed", total), tmp_path / "run"
    runner = start_lbctl(job, run_dir)
    try:
        # The state the fault needs: both nodes train together, and the victim (rank 1, whose agent is not
        # the one that reports) is the worker that took the latest steps.
        wait_for(lambda: progress_of(run_dir)["plan"]["worldSize"] == 2, timeout=120, what="two nodes training")
        victim = wait_for(lambda: trainer_workers(job).get(1), what="the rank-1 worker")
        step = progress_of(run_dir)["progress"]["step"]
        wait_for(lambda: progress_of(run_dir)["progress"]["step"] > step + 20, what="steps after finding the victim")
        assert trainer_workers(job).get(1) == victim
        kill_tree(victim)
        # What the fault must cause: the job restarts its worker group and resumes training.
        wait_for(
            lambda: progress_of(run_dir)["progress"].get("elasticRestarts", 0) >= 1,
            timeout=120,
            what="an elastic restart",
        )
        output, _ = runner.communicate(timeout=bound(300))
        assert runner.returncode == 0, output.decode()[-3000:]
    finally:
        kill_tree(runner.pid)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["complete"] and record["samplesConsumed"] == total
    assert record["elasticRestarts"] >= 1 and record["finalLoss"] is not None
    spans = [(h["firstSample"], h["firstSample"] + h["globalBatch"] * h["steps"]) for h in record["history"]]
    assert contiguous(spans, total), f"samples skipped or repeated across the restart: {spans}"


def test_a_job_whose_workers_cannot_start_fails_with_their_error(tmp_path):
    # A task that loads (the runner checks that first) but whose workers fail at their first step; its
    # words contain rich markup, which must reach the terminal as written.
    (tmp_path / "failing_task.py").write_text(
        "from largebatch_trainer.tasks import linreg\n\n"
        "def build(**args):\n"
        "    task = linreg(**args)\n"
        "    def loss(model, batch):\n"
        "        raise ValueError('[bold]no[/bold] gradient for [red]you[/red]')\n"
        "    task.loss = loss\n"
        "    return task\n"
    )
    job = write_job(tmp_path, "broken", task={"entrypoint": "failing_task:build", "args": {"dim": 8}})
    env = trainer_env() | {"PYTHONPATH": f"{tmp_path}:{trainer_env().get('PYTHONPATH', '')}"}
    result = lbctl_run(job, tmp_path / "run", timeout=300, env=env)
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    assert "ValueError: [bold]no[/bold] gradient for [red]you[/red]" in result.stderr
    assert "ValueError: [bold]no[/bold]" in result.stdout  # the first failure, shown as it happens
    assert trainer_workers(job) == {}
