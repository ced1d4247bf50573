"""The gradient noise scale estimators (McCandlish et al. 2018) on synthetic gradients with known
|G|² and tr(Σ)."""

from __future__ import annotations

import pytest
import torch

from largebatch_trainer.noise import NoiseScale, estimate, preconditioners, squared_norm


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


def _linear_regression(dim: int = 6, population: int = 512):
    """A finite population of (x, y) and weights away from the optimum: per-sample gradients of
    ½(x·w − y)² are g_i = x_i (x_i·w − y_i), so G and Σ (per coordinate) are exact."""
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(population, dim, generator=generator, dtype=torch.float64) * torch.linspace(0.3, 3.0, dim)
    y = x @ torch.linspace(-1.0, 1.0, dim, dtype=torch.float64) + 0.5 * torch.randn(population, generator=generator)
    model = torch.nn.Linear(dim, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.linspace(0.5, -0.2, dim))
    per_sample = x * (x @ model.weight.detach().squeeze(0) - y).unsqueeze(1)
    return x, y, model, per_sample.mean(0), per_sample.var(0, unbiased=False)


def _measured_noise_scale(x, y, model, weights, b_small=4, b_big=32, trials=6000) -> float:
    """The two-batch estimators averaged over many independent draws (with replacement), the way the
    trainer measures: squared norms of the (weighted) gradients of a small and a big batch."""
    generator = torch.Generator().manual_seed(2)
    params = list(model.parameters())
    g_sq = trace = 0.0
    for _ in range(trials):
        norms = []
        for size in (b_small, b_big):
            index = torch.randint(0, len(x), (size,), generator=generator)
            loss = 0.5 * (model(x[index]).squeeze(1) - y[index]).pow(2).mean()
            norms.append(float(squared_norm(torch.autograd.grad(loss, params), params, weights)))
        one_g_sq, one_trace = estimate(b_small, norms[0], b_big, norms[1])
        g_sq, trace = g_sq + one_g_sq, trace + one_trace
    return trace / g_sq


def test_the_preconditioned_estimator_matches_its_closed_form_on_linear_regression():
    x, y, model, mean, variance = _linear_regression()
    # A fixed diagonal preconditioner P = 1/(sqrt(v̂) + eps), handed over as an AdamW's second moments.
    p = torch.tensor([4.0, 0.2, 1.0, 0.1, 2.0, 0.5], dtype=torch.float64)
    eps, beta2 = 1e-8, 0.999
    optimizer = torch.optim.AdamW(model.parameters(), eps=eps, betas=(0.9, beta2))
    optimizer.state[model.weight] = {
        "step": torch.tensor(1.0),
        "exp_avg": torch.zeros_like(model.weight),
        "exp_avg_sq": ((1.0 / p - eps) ** 2 * (1 - beta2)).unsqueeze(0),
    }
    weights = preconditioners(optimizer)
    assert weights[model.weight.data_ptr()].squeeze(0) == pytest.approx(p, rel=1e-9)

    closed_form = float((p**2 * variance).sum() / (p**2 * mean**2).sum())  # tr(PΣP) / |PG|²
    simple = float(variance.sum() / mean.pow(2).sum())  # tr(Σ) / |G|²
    assert abs(closed_form / simple - 1) > 0.5  # the preconditioner matters on this problem
    assert _measured_noise_scale(x, y, model, weights) == pytest.approx(closed_form, rel=0.08)
    assert _measured_noise_scale(x, y, model, None) == pytest.approx(simple, rel=0.08)


def test_no_preconditioner_before_the_optimizer_has_second_moments():
    model = torch.nn.Linear(3, 1)
    assert preconditioners(torch.optim.AdamW(model.parameters())) is None


@pytest.mark.parametrize("fused", [False, True])
def test_the_preconditioner_reads_adamws_own_state_after_real_steps(fused):
    """torch keeps AdamW's step as a tensor (on the parameters' device when fused), which the bias
    correction uses where it lives; the result is the textbook 1/(sqrt(v / (1 - beta2^t)) + eps)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, betas=(0.9, 0.99), eps=1e-6, fused=fused)
    for _ in range(3):
        model(torch.randn(8, 4)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    weights = preconditioners(optimizer)
    for p in model.parameters():
        state = optimizer.state[p]
        assert torch.is_tensor(state["step"]) and float(state["step"]) == 3
        expected = 1 / ((state["exp_avg_sq"] / (1 - 0.99**3)).sqrt() + 1e-6)
        torch.testing.assert_close(weights[p.data_ptr()], expected)
