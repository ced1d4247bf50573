"""The gradient noise scale estimators (McCandlish et al. 2018) on synthetic gradients with known
|G|² and tr(Σ)."""

from __future__ import annotations

import pytest
import torch

from largebatch_trainer.noise import NoiseScale, estimate


def test_the_two_batch_estimators_are_unbiased():
    torch.manual_seed(0)
    dim, b_small, b_big, trials = 20, 4, 32, 4000
    mean = torch.full((dim,), 0.1)  # |G|² = 0.2
    scale = torch.linspace(0.5, 2.0, dim)  # per-sample gradient std per coordinate: tr Σ = Σ scale²
    true_g_sq, true_trace = float(mean.pow(2).sum()), float(scale.pow(2).sum())
    samples = mean + scale * torch.randn(trials, b_big, dim)
    g_small_sq = samples[:, :b_small].mean(1).pow(2).sum(1)
    g_big_sq = samples.mean(1).pow(2).sum(1)
    estimates = [estimate(b_small, float(s), b_big, float(b)) for s, b in zip(g_small_sq, g_big_sq, strict=True)]
    g_sq = sum(e[0] for e in estimates) / trials
    trace = sum(e[1] for e in estimates) / trials
    assert g_sq == pytest.approx(true_g_sq, rel=0.05)
    assert trace == pytest.approx(true_trace, rel=0.05)
    # A single step's |G|² estimate can be negative; that is why the averages are kept apart.
    assert min(e[0] for e in estimates) < 0


def test_the_first_update_is_bias_corrected_and_the_ratio_is_taken_after_smoothing():
    noise = NoiseScale(smoothing=0.9)
    assert noise.value is None
    noise.update(4, 10.0, 32, 3.0)
    g_sq, trace = estimate(4, 10.0, 32, 3.0)
    assert noise.value == pytest.approx(trace / g_sq)
    noise.update(4, 12.0, 32, 2.0)
    g2, t2 = estimate(4, 12.0, 32, 2.0)
    # Both averages carry the same bias correction (1 - 0.9**2), which cancels in the ratio.
    expected = (0.9 * 0.1 * trace + 0.1 * t2) / (0.9 * 0.1 * g_sq + 0.1 * g2)
    assert noise.value == pytest.approx(expected)


def test_state_round_trips():
    noise = NoiseScale(smoothing=0.95)
    noise.update(8, 5.0, 64, 1.0)
    restored = NoiseScale(smoothing=0.95)
    restored.load_state_dict(noise.state_dict())
    assert restored.value == noise.value


def test_equal_batch_sizes_are_refused_with_the_numbers():
    with pytest.raises(ValueError, match="b_small=8, b_big=8"):
        estimate(8, 1.0, 8, 1.0)
