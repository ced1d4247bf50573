"""The measured gradient noise scale on `linreg` against its closed form. The LR is tiny so the weights
stay at their zero initialisation, where B_simple = (d (1 + σ²) + 1) / 1 = 33 for d = 16, σ = 1."""

from __future__ import annotations

import pytest
import torch

from largebatch_trainer.tasks.linear_regression import noise_scale
from tests.integration.trainer_helpers import final_state, run_standalone, write_job

pytestmark = pytest.mark.integration


def measure(tmp_path, name: str, nproc: int, micro: int) -> tuple[float, dict]:
    path = write_job(
        tmp_path,
        name,
        task={"args": {"dim": 16, "samples": 65_536, "noise": 1.0}},
        batch={
            "initial": 64,
            "max": 64,
            "microBatchPerDevice": micro,
            "policy": {"type": "constant", "criticalBatch": {"smoothing": 0.99}},
        },
        optimizer={"name": "sgd", "lr": 1e-9, "momentum": 0.0},
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
