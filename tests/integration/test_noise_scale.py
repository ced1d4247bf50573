"""The measured gradient noise scale on `linreg` against its closed form. The LR is tiny so the weights
stay at their zero initialisation, where B_simple = (d (1 + σ²) + 1) / 1 = 33 for d = 16, σ = 1."""

from __future__ import annotations

import pytest
import torch

from largebatch_trainer.tasks.linear_regression import noise_scale
from tests.integration.trainer_helpers import final_state, run_standalone, write_job

pytestmark = pytest.mark.integration


def measure(tmp_path, name: str, nproc: int, micro: int, policy="constant", optimizer="sgd", **critical):
    path = write_job(
        tmp_path,
        name,
        task={"args": {"dim": 16, "samples": 65_536, "noise": 1.0}},
        batch={
            "initial": 64,
            "max": 64,
            "microBatchPerDevice": micro,
            "policy": {"type": policy, "criticalBatch": {"smoothing": 0.99} | critical},
        },
        optimizer={"name": optimizer, "lr": 1e-9, "momentum": 0.0},
        schedule={"totalSamples": 64 * 400, "warmupSamples": 0, "decay": "constant"},
    )
    run_standalone(path, nproc)
    state = final_state(tmp_path / f"{name}-ckpt")
    return state["progress"]["noise_scale"], state


@pytest.mark.parametrize(("nproc", "micro"), [(0, 8), (2, 32)], ids=["micro-batches", "2-ranks"])
def test_noise_scale_matches_the_closed_form(tmp_path, nproc, micro):
    measured, state = measure(tmp_path, "noise", nproc, micro)
    expected = noise_scale(state["model"]["weight"].squeeze(0), dim=16, noise=1.0)
    assert expected == pytest.approx(33.0, rel=1e-3)  # the weights did not move
    assert measured == pytest.approx(expected, rel=0.15)
    # Its state is checkpointed, so a restart keeps the smoothed estimate.
    assert state["noise"]["weight"] == pytest.approx(1 - 0.99**400)
    assert torch.isfinite(torch.tensor(measured))


def test_one_micro_batch_on_one_worker_is_measured_in_two_halves(tmp_path):
    """The whole batch in one micro-batch on one worker gives one small batch a step; a policy that reads
    the noise scale then runs every measureEverySteps-th step as two half micro-batches."""
    measured, state = measure(tmp_path, "halves", 0, 64, policy="criticalBatch", measureEverySteps=2)
    expected = noise_scale(state["model"]["weight"].squeeze(0), dim=16, noise=1.0)
    assert measured == pytest.approx(expected, rel=0.15)
    assert state["noise"]["weight"] == pytest.approx(1 - 0.99**200)  # every second step of 400


def test_the_preconditioned_estimator_is_the_same_on_two_ranks_as_on_two_micro_batches(tmp_path):
    """The trainer is exact across world sizes: the same samples make the same global gradients, so the
    same Adam second moments, and rank r's local gradient is micro-batch r's. The DDP hook's weighted
    bucket norms must then give what the single-worker path gives, and both differ from B_simple."""
    kwargs = {"optimizer": "adamw", "estimator": "preconditioned"}
    on_ranks, _ = measure(tmp_path, "ranks", 2, 32, **kwargs)
    on_micro_batches, _ = measure(tmp_path, "micro", 0, 32, **kwargs)
    simple, _ = measure(tmp_path, "simple", 0, 32, optimizer="adamw", estimator="simple")
    assert on_ranks == pytest.approx(on_micro_batches, rel=1e-3)
    assert abs(on_ranks / simple - 1) > 0.05
