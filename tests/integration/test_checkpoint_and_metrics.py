"""A running trainer serves its metrics and progress; SIGTERM makes it checkpoint and stop; the next
start resumes at the exact sample and ends where an uninterrupted run ends."""

from __future__ import annotations

import json
import re
import signal
import urllib.request

import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from tests import zygote
from tests.helpers import ROOT, bound, free_port, wait_for
from tests.integration.trainer_helpers import (
    covered_samples,
    final_state,
    run_standalone,
    trainer_env,
    write_job,
)

pytestmark = pytest.mark.integration

TOTAL = 16 * 6000


def long_job(tmp_path, name):
    return write_job(
        tmp_path,
        name,
        batch={"initial": 16, "max": 64, "microBatchPerDevice": 8, "policy": {"type": "seesaw"}},
        schedule={"totalSamples": TOTAL, "warmupSamples": 160, "minLrRatio": 0.1},
        checkpoint={"everySteps": 50, "keep": 2},
        evaluation={"everySamples": 320, "samples": 32},
    )


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples = [s for family in text_string_to_metric_families(text) for s in family.samples]
    # Every series names its job and process; the job file has no namespace, so it is "default".
    for sample in samples:
        assert {"namespace": "default", "job_name": "interrupted", "rank": "0"}.items() <= sample.labels.items()
    return {s.name: s.value for s in samples}


def test_metrics_progress_sigterm_checkpoint_and_exact_resume(tmp_path):
    job = long_job(tmp_path, "interrupted")
    port, progress_file = free_port(), tmp_path / "progress.json"
    args = ["--job", str(job), "--metrics-port", str(port)]
    args += ["--progress-file", str(progress_file), "--report-seconds", "0.2"]
    log_file = tmp_path / "interrupted.log"
    # `python -m largebatch_trainer ARGS`, forked from the zygote (tests/zygote.py) as run_standalone's are.
    process = zygote.shared().start("largebatch_trainer", args, trainer_env(), ROOT, log_file)
    try:
        metrics = wait_for(
            lambda: (m := scrape(port)).get("largebatch_optimizer_steps_total", 0) > 20 and m, what="steps"
        )
        for name in [
            "largebatch_samples_total", "largebatch_tokens_total", "largebatch_samples_per_second",
            "largebatch_tokens_per_second", "largebatch_step_duration_seconds_count", "largebatch_loss",
            "largebatch_learning_rate", "largebatch_global_batch_size", "largebatch_micro_batch_size",
            "largebatch_accumulation_steps", "largebatch_world_size", "largebatch_gradient_noise_scale",
            "largebatch_checkpoint_duration_seconds", "largebatch_elastic_restarts", "largebatch_progress_samples",
            "largebatch_global_batch_size_target", "largebatch_total_samples",
        ]:  # fmt: skip
            assert name in metrics, name
        assert metrics["largebatch_global_batch_size"] == metrics["largebatch_global_batch_size_target"] == 16
        assert metrics["largebatch_total_samples"] == TOTAL
        assert metrics["largebatch_accumulation_steps"] == 2  # 16 samples in micro-batches of 8
        assert metrics["largebatch_world_size"] == 1
        assert metrics["largebatch_samples_per_second"] > 0
        # Evaluated every 320 samples (20 steps or fewer): a held-out loss, no accuracy (linreg does not classify).
        assert metrics["largebatch_eval_loss"] > 0 and "largebatch_eval_accuracy_ratio" not in metrics
        report = wait_for(lambda: json.loads(progress_file.read_text()), what="a progress report")
        assert report["progress"]["step"] > 0 and report["plan"]["globalBatch"] == 16
        assert report["progress"]["done"] is False
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=bound(60)) == 143
    finally:
        process.kill()
    stopped = final_state(tmp_path / "interrupted-ckpt")
    assert 0 < stopped["progress"]["samples"] < TOTAL
    # What a person reading the log sees (`kubectl logs` of a worker): a progress line from the first step
    # on, and the step it stopped at.
    log = log_file.read_text()
    first = rf"^step 1 samples 16/{TOTAL} batch 16 \(world 1 x accumulation 2\) lr \S+ loss \S+ \d+ samples/s$"
    assert re.search(first, log, re.M), log
    assert f"rank 0: stopped after step {stopped['progress']['step']}" in log, log
    # Resume: the same command without the signal runs to the end, and says where it resumed.
    rerun = run_standalone(job, 0, "--progress-file", str(progress_file))
    assert f"at step {stopped['progress']['step']} (samples {stopped['progress']['samples']}) with world size 1" in (
        rerun.stdout
    ), rerun.stdout
    resumed = final_state(tmp_path / "interrupted-ckpt")
    assert json.loads(progress_file.read_text())["progress"]["done"] is True
    reference_job = long_job(tmp_path, "reference")
    run_standalone(reference_job, 0)
    reference = final_state(tmp_path / "reference-ckpt")
    assert resumed["progress"]["samples"] == reference["progress"]["samples"] == TOTAL
    assert resumed["progress"]["step"] == reference["progress"]["step"]
    assert covered_samples(resumed["history"]) == covered_samples(reference["history"])
    torch.testing.assert_close(resumed["model"], reference["model"], rtol=1e-5, atol=1e-6)


def test_a_worker_started_after_the_end_reports_the_final_loss(tmp_path):
    """torchelastic may restart a worker after the last step (a peer failed at exit): it loads the final
    checkpoint, has nothing to do, and must still report the loss and held-out loss of the finished run."""
    job = write_job(tmp_path, "ended", schedule={"totalSamples": 16 * 200, "warmupSamples": 160})
    progress_file = tmp_path / "progress.json"
    run_standalone(job, 0, "--progress-file", str(progress_file))
    finished = json.loads(progress_file.read_text())
    assert finished["progress"]["done"] is True and finished["progress"]["loss"] > 0
    progress_file.unlink()
    run_standalone(job, 0, "--progress-file", str(progress_file))
    again = json.loads(progress_file.read_text())
    assert again["progress"]["done"] is True and again["progress"]["step"] == finished["progress"]["step"]
    assert again["progress"]["loss"] == finished["progress"]["loss"]
    assert again["progress"]["evalLoss"] == finished["progress"]["evalLoss"]
    assert again["plan"] == finished["plan"]


def test_every_exported_metric_is_documented():
    source = (ROOT / "trainer_image" / "largebatch_trainer" / "metrics.py").read_text()
    documented = (ROOT / "docs" / "metrics.md").read_text()
    names = re.findall(r'"(largebatch_[a-z_]+)"', source)
    assert len(names) >= 15
    for name in names:
        suffix = "_total" if f'counter("{name}"' in source else ""
        assert f"`{name}{suffix}`" in documented, name


def test_held_out_evaluations_come_at_every_interval_and_at_the_end(tmp_path):
    """evaluation.everySamples: one held-out loss after each step that passes a multiple of it and one
    at the end, in the checkpoint; the last is the loss of the final weights on the held-out samples."""
    from largebatch_trainer.tasks.linear_regression import make_data

    job = write_job(
        tmp_path,
        "evals",
        batch={"initial": 24, "max": 24, "microBatchPerDevice": 24},
        schedule={"totalSamples": 24 * 50, "warmupSamples": 0, "decay": "constant"},
        evaluation={"everySamples": 100, "samples": 300},
    )
    run_standalone(job, 0)
    state = final_state(tmp_path / "evals-ckpt")
    evaluations = state["evaluations"]
    # Steps of 24 samples: the first step past each multiple of 100, then the end (1,200 is one).
    expected = sorted({-(-k * 100 // 24) for k in range(1, 13)} | {50})
    assert [step for step, _, _, _ in evaluations] == expected
    assert all(samples == 24 * step for step, samples, _, _ in evaluations)
    assert all(accuracy is None for *_, accuracy in evaluations)  # linreg does not classify
    held_out = make_data(8, 4_096, 1.0, 0, sample_seed=7)  # linreg's held-out set; the first 300 count
    weights = state["model"]["weight"].squeeze(0)
    final = float((0.5 * (held_out.x[:300] @ weights - held_out.y[:300]).pow(2)).mean())
    assert evaluations[-1][2] == pytest.approx(final, rel=1e-5)
    assert evaluations[-1][2] < evaluations[0][2]  # it learned
