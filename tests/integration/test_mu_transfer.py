"""μTransfer end to end, as a user runs it: `lbctl coord-check` separates μP from the standard
parametrization on the numbers, `lbctl sweep` runs real proxy runs and writes the transferred LR, and
a μP job resumes from a checkpoint exactly (its per-layer learning rates travel with the optimizer)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from largebatch.local.nodes import parent_of
from largebatch_trainer import checkpoint
from tests.helpers import bound, divergences_raised, wait_for
from tests.integration.trainer_helpers import (
    LBCTL,
    descendants,
    final_state,
    kill_tree,
    params,
    run_standalone,
    trainer_env,
    write_job,
)

pytestmark = pytest.mark.integration

PYLM = "largebatch_trainer.tasks:pylm"
MUP = {"depth": 2, "heads": 2, "context": 16, "parametrization": "mup", "baseWidth": 32}


def lbctl(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    result = subprocess.run([*LBCTL, *args], capture_output=True, text=True, timeout=bound(timeout), env=trainer_env())
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result


def coord_table(tmp_path, parametrization: str) -> dict:
    task = {"entrypoint": PYLM, "args": MUP | {"parametrization": parametrization}}
    job = write_job(tmp_path, parametrization, task=task, optimizer={"name": "adamw", "lr": 0.01},
                    batch={"initial": 16, "max": 16, "microBatchPerDevice": 16},
                    schedule={"totalSamples": 100_000, "warmupSamples": 1000})  # fmt: skip
    out = tmp_path / f"{parametrization}.png"
    lbctl("coord-check", str(job), "--widths", "32,64,128,256", "--steps", "4", "--out", str(out))
    assert out.stat().st_size > 0
    return json.loads(out.with_suffix(".json").read_text())


def growth(table: dict, layer: str) -> float:
    """How much the layer's mean |output| at the last step grew from the narrowest width to the widest."""
    by_width = table["layers"][layer]  # JSON: the widths are strings
    return by_width[str(table["widths"][-1])][-1] / by_width[str(table["widths"][0])][-1]


def test_the_coordinate_check_is_flat_under_mup_and_the_logits_grow_without_it(tmp_path):
    standard, mup = coord_table(tmp_path, "standard"), coord_table(tmp_path, "mup")
    assert growth(standard, "head") > 2.5  # 8x the width: the logits grow with it
    for layer in mup["layers"]:  # every layer keeps its size within a factor of 1.6 over 8x the width
        if mup["layers"][layer]["32"][-1] > 0:
            assert 1 / 1.6 < growth(mup, layer) < 1.6, (layer, growth(mup, layer))
    assert growth(mup, "head") < growth(standard, "head") / 2


def test_a_sweep_runs_its_proxies_finds_the_best_lr_and_writes_it_into_the_job(tmp_path):
    job = write_job(tmp_path, "proxy", task={"entrypoint": PYLM, "args": MUP | {"width": 128}},
                    optimizer={"name": "sgd", "lr": 0.1, "momentum": 0.9},
                    batch={"initial": 16, "max": 16, "microBatchPerDevice": 16},
                    schedule={"totalSamples": 100_000, "warmupSamples": 1000}, evaluation={"samples": 256})  # fmt: skip
    out, tuned = tmp_path / "sweep", tmp_path / "tuned.yaml"
    sweep = ["sweep", str(job), "--widths", "32,64", "--lr", "0.03,30", "--samples", "480", "--local",
             "--parallel", "2", "--out-dir", str(out), "--apply", str(tuned)]  # fmt: skip
    printed = lbctl(*sweep).stdout
    results = json.loads((out / "results.json").read_text())
    runs = {(r["width"], r["lr"]): r for r in results["runs"]}
    assert len(runs) == 4 and (out / "sweep.png").stat().st_size > 0
    assert runs[(32, 30.0)]["status"] == runs[(64, 30.0)]["status"] == "diverged"  # stopped by the trainer
    # and not restarted by torchrun's agent: the diverged proxies' one worker raised once
    raised = {log.parents[2].name: divergences_raised(log.read_text()) for log in out.glob("*/run/logs/node-*.log")}
    assert raised == {"proxy-w32-lr0": 0, "proxy-w32-lr1": 1, "proxy-w64-lr0": 0, "proxy-w64-lr1": 1}
    for width in (32, 64):
        assert runs[(width, 0.03)]["status"] == "complete" and results["best"][str(width)] == 0.03
    transferred = yaml.safe_load(tuned.read_text())
    assert transferred["spec"]["optimizer"]["lr"] == results["best"]["64"]
    assert transferred["spec"]["task"]["args"]["width"] == 128  # the job's own width, not a proxy's
    assert "diverged" in printed and f"written for width 128 to {tuned}" in " ".join(printed.split())
    # Again: every proxy is read from its record, none is run a second time (a diverged one would
    # diverge again).
    records = {p: p.stat().st_mtime_ns for p in out.glob("*/run/run.json")}
    again = lbctl(*sweep).stdout
    assert again.split("Final loss")[1] == printed.split("Final loss")[1]  # the same table and LR
    assert len(records) == 4 and {p: p.stat().st_mtime_ns for p in out.glob("*/run/run.json")} == records


def test_a_mup_model_trains_to_the_same_parameters_at_any_world_size_and_accumulation(tmp_path):
    """μP changes the initialisation, the readout and each group's LR, nothing about the batch: three
    uneven ranks with accumulation give the single full-batch process's parameters, under LAMB (whose
    per-group LR scale is μP's) and the linear LR rule as Seesaw grows the batch."""
    settings = {"task": {"entrypoint": PYLM, "args": MUP | {"width": 64}},
                "optimizer": {"name": "lamb", "lr": 0.01, "weightDecay": 0.01, "scaling": "linear"},
                "schedule": {"totalSamples": 240, "warmupSamples": 20, "minLrRatio": 0.05}}  # fmt: skip
    # Not capped at the critical batch: that reads the noise scale, which each world size measures its way.
    policy = {"initial": 10, "max": 40, "policy": {"type": "seesaw", "seesaw": {"capAtCriticalBatch": False}}}
    reference = write_job(tmp_path, "reference", batch=policy | {"microBatchPerDevice": 40}, **settings)
    run_standalone(reference, 0)
    candidate = write_job(tmp_path, "candidate", batch=policy | {"microBatchPerDevice": 2}, **settings)
    run_standalone(candidate, 3)
    expected, got = final_state(tmp_path / "reference-ckpt"), final_state(tmp_path / "candidate-ckpt")
    assert got["progress"]["batch"] == expected["progress"]["batch"] == 40  # Seesaw grew it
    assert {g["lr_scale"] for g in got["optimizer"]["param_groups"]} == {0.5, 1.0}
    # A transformer's gradients are summed in another order on three ranks, and LAMB's Adam direction
    # divides by √v, which magnifies float32 rounding where a gradient is near zero: 1e-4, not 1e-5.
    torch.testing.assert_close(params(got), params(expected), rtol=1e-4, atol=2e-5)


def test_a_mup_job_resumes_exactly_from_a_checkpoint_at_another_world_size(tmp_path):
    job = write_job(tmp_path, "mup", task={"entrypoint": PYLM, "args": MUP | {"width": 64}},
                    optimizer={"name": "sgd", "lr": 0.05, "momentum": 0.9, "weightDecay": 1e-4},
                    batch={"initial": 8, "max": 16, "microBatchPerDevice": 4,
                           "policy": {"type": "seesaw", "seesaw": {"capAtCriticalBatch": False}}},
                    schedule={"totalSamples": 640, "warmupSamples": 64},
                    checkpoint={"everySteps": 10, "keep": 20})  # fmt: skip
    run_standalone(job, 2)
    straight = final_state(tmp_path / "mup-ckpt")
    # μP's per-layer LRs (MuSGD's: vectors x2 at twice the base width) are in the checkpoint.
    assert {g["lr_scale"] for g in straight["optimizer"]["param_groups"]} >= {1.0, 2.0}
    saved = checkpoint.all_checkpoints(tmp_path / "mup-ckpt")
    for later in saved[2:]:  # back to step 20, as after a failure there; the job comes back on 3 ranks
        later.unlink()
    run_standalone(job, 3)
    resumed = final_state(tmp_path / "mup-ckpt")
    assert [run[3] for run in resumed["history"]][-1] == 3
    # The noise scale is measured from the ranks' own gradients: three ranks measure it their own way.
    assert resumed["progress"] == straight["progress"] | {"noise_scale": resumed["progress"]["noise_scale"]}
    assert resumed["progress"]["batch"] == 16
    # SGD, not Adam: the attention's key bias has no gradient but rounding, which Adam would blow up to
    # full steps of either sign at each world size.
    torch.testing.assert_close(params(resumed), params(straight), rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_the_standard_model_is_refused_by_its_mup_version(tmp_path):
    """The two parametrizations share parameter names, so torch would load one's state into the other
    and keep the checkpoint's per-layer LRs: the trainer refuses, naming both layouts."""

    def job(parametrization: str, samples: int) -> Path:
        task = {"entrypoint": PYLM, "args": MUP | {"width": 64, "parametrization": parametrization}}
        return write_job(tmp_path, "job", task=task, optimizer={"name": "adamw", "lr": 0.01},
                         batch={"initial": 8, "max": 8, "microBatchPerDevice": 8},
                         schedule={"totalSamples": samples, "warmupSamples": 8})  # fmt: skip

    run_standalone(job("standard", 32), 0)
    written = checkpoint.all_checkpoints(tmp_path / "job-ckpt")
    result = run_standalone(job("mup", 64), 0, check=False)
    assert result.returncode != 0
    message = " ".join(result.stderr.split())
    assert f"checkpoint {written[-1]} holds optimizer groups" in message
    assert "task.args (parametrization, baseWidth or the model's shape) changed" in message
    assert checkpoint.all_checkpoints(tmp_path / "job-ckpt") == written  # nothing it had was touched


def test_a_killed_sweep_takes_its_proxy_runs_with_it(tmp_path):
    """A sweep SIGKILLed (by the OOM killer, say) cannot stop its proxies: each dies with it by itself,
    every process of its tree, after a last checkpoint as on Ctrl-C."""
    job = write_job(tmp_path, "long", task={"entrypoint": PYLM, "args": MUP | {"width": 32}},
                    optimizer={"name": "adamw", "lr": 0.01}, batch={"initial": 8, "max": 8, "microBatchPerDevice": 8},
                    schedule={"totalSamples": 10_000_000, "warmupSamples": 8})  # fmt: skip
    out = tmp_path / "sweep"
    command = [*LBCTL, "sweep", str(job), "--widths", "32", "--lr", "0.01,0.02", "--local", "--parallel", "2",
               "--out-dir", str(out)]  # fmt: skip
    sweeper = subprocess.Popen(command, env=trainer_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runs = [out / f"long-w32-lr{i}" / "run" for i in range(2)]
    try:
        wait_for(lambda: all((run / "progress.json").exists() for run in runs), timeout=240, what="both proxies")
        tree = descendants(sweeper.pid)
        assert len([pid for pid in tree if parent_of(pid) == sweeper.pid]) == 2
        sweeper.kill()
        sweeper.wait()
        wait_for(lambda: not any(_running(pid) for pid in tree), timeout=120, what="every proxy process gone")
    finally:
        kill_tree(sweeper.pid)
    for run in runs:
        assert checkpoint.all_checkpoints(run / "checkpoints")  # stopped as Ctrl-C stops a run


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting for whoever adopted it to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
