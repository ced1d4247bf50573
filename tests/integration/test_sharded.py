"""Sharded data parallel (`parallelism.dataParallel: shard | hybrid`) with real gloo processes: every mode
trains the parameters of the single-process full-batch run (an uneven split, accumulation and a Seesaw
cut inside the run), with LAMB, LARS and μP too; the noise scale is the replicated run's; checkpoints
written at one world size (or by a replicated job) resume at another and end where an uninterrupted run
ends; a SIGTERM waits for the save in flight; `lbctl run --local` trains a hybrid causal LM of two ranks a
node, and its model loads back in transformers with the trainer's logits."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess

import pytest
import torch

from largebatch_trainer import checkpoint, export
from largebatch_trainer.tasks import load_task
from tests import zygote
from tests.helpers import ROOT, bound, contiguous, wait_for
from tests.integration.hf_helpers import assert_loads_with_the_trainers_logits, causal_lm_job, prepare_corpus
from tests.integration.trainer_helpers import (
    LBCTL,
    covered_samples,
    final_state,
    lbctl_run,
    params,
    relative_distance,
    run_nodes,
    run_standalone,
    trainer_env,
    write_job,
)

pytestmark = pytest.mark.integration

# Seesaw from 10 to 40 over 240 samples, as tests/integration/test_exactness.py: the batch and LR change,
# and 10 over 3 ranks is uneven. A small GPT of two blocks, each block one FSDP unit.
POLICY = {"initial": 10, "max": 40, "policy": {"type": "seesaw", "seesaw": {"capAtCriticalBatch": False}}}
SCHEDULE = {"totalSamples": 240, "warmupSamples": 20, "minLrRatio": 0.05}
GPT = {"entrypoint": "largebatch_trainer.tasks:pylm", "args": {"width": 16, "depth": 2, "heads": 2, "context": 16}}


def job(tmp_path, name, mode="replicate", micro=2, **spec):
    """A hybrid job's pods have two ranks each (run as two-rank torchrun agents: `run`). `spec`'s blocks
    replace the defaults (a `batch` given keeps `micro`)."""
    return write_job(
        tmp_path,
        name,
        **{
            "task": GPT,
            "batch": {**spec.pop("batch", POLICY), "microBatchPerDevice": micro},
            "schedule": SCHEDULE,
            "parallelism": {"dataParallel": mode},
            "workers": {"devicesPerWorker": 2 if mode == "hybrid" else 1},
            **spec,
        },
    )


def run(path, mode: str, world: int) -> None:
    """`hybrid` as pods of two ranks (world / 2 torchrun agents), the others as one agent of `world` ranks."""
    if mode == "hybrid":
        run_nodes(path, world // 2, 2)
    else:
        run_standalone(path, world)


# Batch 6 on 4 ranks in micro-batches of 1 is 2 + 2 + 1 + 1 samples in 2 micro-steps a rank, the last two
# ranks' second one empty: they still join its reduce-scatter. 10 steps.
EMPTY_MICRO_STEPS = {
    "batch": {"initial": 6, "max": 6, "policy": {"type": "constant"}},
    "schedule": SCHEDULE | {"totalSamples": 60},
}


@pytest.mark.parametrize(
    ("mode", "world", "micro", "spec"),
    [("replicate", 3, 2, {}), ("shard", 3, 2, {}), ("hybrid", 4, 2, {}), ("shard", 4, 1, EMPTY_MICRO_STEPS)],
    ids=["replicate-3", "shard-3", "hybrid-2x2", "shard-4-empty-micro-steps"],
)
def test_every_mode_trains_the_parameters_of_the_single_process_run(tmp_path, mode, world, micro, spec):
    reference = job(tmp_path, "reference", micro=1000, **spec)
    run_standalone(reference, 0)
    candidate = job(tmp_path, "candidate", mode, micro, **spec)
    run(candidate, mode, world)
    expected, got = final_state(tmp_path / "reference-ckpt"), final_state(tmp_path / "candidate-ckpt")
    assert got["progress"] | {"noise_scale": None} == expected["progress"]
    assert {run[3] for run in got["history"]} == {world}
    torch.testing.assert_close(params(got), params(expected), rtol=1e-5, atol=1e-6)
    (written,) = checkpoint.all_checkpoints(tmp_path / "candidate-ckpt")
    assert checkpoint.is_sharded(written) == (mode != "replicate")
    if mode != "replicate":  # every rank wrote its own shard, none gathered the model
        assert sorted(p.name for p in written.glob("*.distcp")) == [f"__{r}_0.distcp" for r in range(world)]


@pytest.mark.parametrize(
    ("optimizer", "task_args"),
    [
        ({"name": "lamb", "lr": 0.01, "weightDecay": 0.01}, {}),
        ({"name": "lars", "lr": 0.5, "momentum": 0.9, "weightDecay": 5e-4}, {}),
        ({"name": "adamw", "lr": 0.01}, {"parametrization": "mup", "baseWidth": 8}),
        ({"name": "sgd", "lr": 0.05, "momentum": 0.9, "maxGradNorm": 0.05}, {}),
    ],
    ids=["lamb", "lars", "mup-adamw", "sgd-clipped"],
)
def test_trust_ratios_mup_and_clipping_are_the_replicated_ones_when_sharded(tmp_path, optimizer, task_args):
    """LAMB's and LARS's layer-wise norms of sharded weights are taken over the whole weight (the shards'
    squares summed across the ranks), μP's per-layer LRs and readout multiplier survive sharding, and
    gradient clipping takes the whole gradient's norm."""
    task = {**GPT, "args": GPT["args"] | task_args}
    reference = job(tmp_path, "reference", micro=1000, optimizer=optimizer, task=task)
    run_standalone(reference, 0)
    candidate = job(tmp_path, "candidate", "shard", micro=1000, optimizer=optimizer, task=task)  # 4 + 3 + 3
    run_standalone(candidate, 3)
    expected, got = final_state(tmp_path / "reference-ckpt"), final_state(tmp_path / "candidate-ckpt")
    assert got["progress"]["samples"] == expected["progress"]["samples"] == 240
    # Over the whole model, not element by element: an Adam-like step has the size of the LR even where the
    # gradient is float noise (the attention's key bias, to which softmax is blind: 7e-6 apart there, the
    # sums taken in another order).
    assert relative_distance(params(got), params(expected)) < 1e-5
    if "maxGradNorm" in optimizer:  # it clipped: the same job unclipped trains other parameters
        plain = {key: value for key, value in optimizer.items() if key != "maxGradNorm"}
        unclipped = job(tmp_path, "unclipped", micro=1000, optimizer=plain, task=task)
        run_standalone(unclipped, 0)
        assert relative_distance(params(final_state(tmp_path / "unclipped-ckpt")), params(expected)) > 1e-3
    assert relative_distance(params(got), load_task(task["entrypoint"], task["args"], 0).model.state_dict()) > 1e-3


@pytest.mark.parametrize(
    ("estimator", "optimizer"),
    [("simple", {"name": "sgd", "lr": 0.05, "momentum": 0.9}), ("preconditioned", {"name": "adamw", "lr": 0.01})],
)
def test_the_noise_scale_is_measured_as_the_replicated_run_measures_it(tmp_path, estimator, optimizer):
    """One micro-batch a rank (4, 3 and 3 samples): the small batches are the ranks' shares in both modes,
    and the sharded run's local norms (taken inside the reduce-scatter; preconditioned, the squares
    reduce-scattered and weighted by each shard's P) and |G|² (summed over the shards) give the same value."""
    measured = {}
    batch = {**POLICY, "policy": POLICY["policy"] | {"criticalBatch": {"estimator": estimator}}}
    for mode in ("replicate", "shard"):
        run_standalone(job(tmp_path, mode, mode, micro=1000, optimizer=optimizer, batch=batch), 3)
        measured[mode] = final_state(tmp_path / f"{mode}-ckpt")["noise"]
    assert measured["replicate"]["weight"] > 0
    for key in ("g_sq", "trace", "weight"):
        assert math.isclose(measured["shard"][key], measured["replicate"][key], rel_tol=1e-5), (key, measured)


RESUMABLE = {"everySteps": 6, "keep": 100}


def resume_from(tmp_path, source_dir, step: int, name: str, mode: str, world: int):
    """The checkpoint of `step` alone copied into a new job's directory, the job run to the end from it."""
    (saved,) = [p for p in checkpoint.all_checkpoints(source_dir) if checkpoint.step_of(p) == step]
    target = tmp_path / f"{name}-ckpt"
    target.mkdir()
    if saved.is_dir():
        shutil.copytree(saved, target / saved.name)
    else:
        shutil.copy(saved, target)
        shutil.copy(checkpoint.manifest_for(saved), target)
    resumed = job(tmp_path, name, mode, micro=1000, checkpoint=RESUMABLE)
    run(resumed, mode, world)
    return final_state(target)


def test_a_checkpoint_of_four_ranks_resumes_on_three_and_in_another_mode(tmp_path):
    whole = job(tmp_path, "whole", "shard", micro=1000, checkpoint=RESUMABLE)
    run_standalone(whole, 4)
    uninterrupted = final_state(tmp_path / "whole-ckpt")
    assert [checkpoint.step_of(p) for p in checkpoint.all_checkpoints(tmp_path / "whole-ckpt")] == [6, 12, 18]
    got = resume_from(tmp_path, tmp_path / "whole-ckpt", 6, "resumed", "shard", 3)
    worlds = [(run[0], run[3]) for run in got["history"]]
    assert {world for first, world in worlds if first < 6} == {4} and {w for f, w in worlds if f >= 6} == {3}
    assert contiguous(covered_samples(got["history"]), 240, last_batch=40)
    assert got["progress"] | {"noise_scale": None} == uninterrupted["progress"] | {"noise_scale": None}
    torch.testing.assert_close(params(got), params(uninterrupted), rtol=1e-5, atol=1e-6)
    # And a replicated job, of two ranks, takes the sharded checkpoint whole.
    replicated = resume_from(tmp_path, tmp_path / "whole-ckpt", 12, "replicated", "replicate", 2)
    assert replicated["progress"]["samples"] == 240 and checkpoint.all_checkpoints(tmp_path / "replicated-ckpt")
    torch.testing.assert_close(params(replicated), params(uninterrupted), rtol=1e-5, atol=1e-6)


def test_a_replicated_jobs_checkpoint_resumes_sharded(tmp_path):
    """A checkpoint as today's replicated jobs write it (rank 0's whole state, `.pt`) loads into shards."""
    whole = job(tmp_path, "whole", "replicate", micro=1000, checkpoint=RESUMABLE)
    run_standalone(whole, 2)
    uninterrupted = final_state(tmp_path / "whole-ckpt")
    assert all(p.suffix == ".pt" for p in checkpoint.all_checkpoints(tmp_path / "whole-ckpt"))
    got = resume_from(tmp_path, tmp_path / "whole-ckpt", 12, "resumed", "hybrid", 4)
    assert got["progress"] == uninterrupted["progress"] | {"noise_scale": got["progress"]["noise_scale"]}
    # Equal only if SGD's momentum came along too (by parameter name, each rank taking its shard).
    torch.testing.assert_close(params(got), params(uninterrupted), rtol=1e-5, atol=1e-6)


def test_sigterm_waits_for_the_save_in_flight(tmp_path):
    """Two ranks sharded, stopped by SIGTERM while training: each writes its shard of the step it stopped
    after in the background and exits only once it is written; the checkpoint is complete and verifies."""
    long = job(tmp_path, "long", "shard", checkpoint={"everySteps": 5, "keep": 2},
               schedule={"totalSamples": 40 * 4000, "warmupSamples": 20})  # fmt: skip
    progress = tmp_path / "progress.json"
    args = ["--standalone", "--nproc-per-node=2", "--max-restarts=0", f"--log-dir={tmp_path / 'torchelastic'}",
            "-m", "largebatch_trainer", "--job", str(long), "--progress-file", str(progress),
            "--report-seconds", "0.2"]  # fmt: skip
    log = tmp_path / "long.log"
    agent = zygote.shared().start("largebatch_trainer.torchrun", args, trainer_env(), ROOT, log)
    try:
        wait_for(lambda: json.loads(progress.read_text())["progress"]["step"] > 12, what="step 12 passed")
        agent.send_signal(signal.SIGTERM)
        agent.wait(bound(120))
    finally:
        if agent.poll() is None:
            agent.kill()
    text = log.read_text(errors="replace")
    stopped = [line for line in text.splitlines() if "rank 0: stopped after step" in line]
    assert stopped, text[-4000:]
    step = int(stopped[0].rsplit(" ", 1)[1])
    newest = checkpoint.all_checkpoints(tmp_path / "long-ckpt")[-1]
    assert checkpoint.step_of(newest) == step and checkpoint.is_sharded(newest)
    assert checkpoint.load(newest)["progress"]["step"] == step
    assert not list((tmp_path / "long-ckpt").glob(".*partial"))


def test_lbctl_run_local_trains_a_hybrid_causal_lm_and_exports_it(tmp_path):
    """Two ranks a node on the CPU, the model gathered on rank 0 at the end and written with save_pretrained:
    transformers loads it with the logits of the final checkpoint's model; `lbctl export` of an earlier
    sharded checkpoint writes that step's model."""
    from transformers import AutoModelForCausalLM

    corpus = prepare_corpus(tmp_path / "corpus")
    local = causal_lm_job(tmp_path, "local", "gpt2", corpus, parallelism={"dataParallel": "hybrid"},
                          workers={"devicesPerWorker": 2}, checkpoint={"everySteps": 10, "keep": 100})  # fmt: skip
    result = lbctl_run(local, tmp_path / "run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checkpoints = tmp_path / "run" / "checkpoints"
    state = final_state(checkpoints)
    assert state["progress"]["samples"] == 480 and {run[3] for run in state["history"]} == {2}
    assert_loads_with_the_trainers_logits(checkpoints / export.MODEL_DIR, local, params(state))
    # An earlier sharded checkpoint, exported offline (DCP's files read whole in one process).
    out = tmp_path / "step-10"
    exported = subprocess.run([*LBCTL, "export", str(local), "--checkpoint-dir", str(checkpoints), "--step", "10",
                               "--out", str(out)], capture_output=True, text=True, timeout=bound(300))  # fmt: skip
    assert exported.returncode == 0, exported.stdout + exported.stderr
    at_ten = checkpoint.load(checkpoints / "ckpt-0000000010.dcp")["model"]
    name = "transformer.h.0.attn.c_attn.weight"
    earlier = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).state_dict()[name]
    assert torch.equal(earlier, at_ten[name]) and not torch.equal(earlier, state["model"][name])
