"""Noisy linear regression, the setting of the Seesaw theory, with a closed-form gradient noise scale.

y = x·w* + σ ε with x ~ N(0, I_d), ε ~ N(0, 1) and |w*| = 1; the model is x·w, the per-sample loss
(x·w − y)² / 2. With δ = w − w*, the per-sample gradient is r x (r = x·δ − σε), so
|G|² = |δ|² and tr Σ = d (|δ|² + σ²) + |δ|², which gives B_simple = tr Σ / |G|² in closed form.
"""

from __future__ import annotations

import torch

from largebatch_trainer.tasks import Pairs, Task


def true_weights(dim: int, data_seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(data_seed)
    w = torch.randn(dim, generator=g)
    return w / w.norm()


def make_data(dim: int, samples: int, noise: float, data_seed: int, sample_seed: int) -> Pairs:
    """`samples` draws of (x, y) from the regression whose w* `data_seed` fixes; `sample_seed` picks the
    draws, so that training and held-out sets share w* and differ only in their samples."""
    g = torch.Generator().manual_seed(sample_seed)
    x = torch.randn(samples, dim, generator=g)
    y = x @ true_weights(dim, data_seed) + noise * torch.randn(samples, generator=g)
    return Pairs(x, y)


def noise_scale(w: torch.Tensor, dim: int, noise: float, data_seed: int = 0) -> float:
    """B_simple = tr Σ / |G|² at weights `w`, in closed form."""
    d2 = float((w - true_weights(dim, data_seed)).pow(2).sum())
    return (dim * (d2 + noise**2) + d2) / d2


def build(dim: int = 16, samples: int = 65_536, noise: float = 1.0, data_seed: int = 0) -> Task:
    model = torch.nn.Linear(dim, 1, bias=False)
    torch.nn.init.zeros_(model.weight)  # δ = −w*, so the starting noise scale is known

    def loss(model: torch.nn.Module, batch) -> tuple[torch.Tensor, int]:
        x, y = batch
        return 0.5 * (model(x).squeeze(-1) - y).pow(2).sum(), len(y)

    return Task(
        model=model,
        dataset=make_data(dim, samples, noise, data_seed, sample_seed=data_seed + 1),
        loss=loss,
        eval_dataset=make_data(dim, 4_096, noise, data_seed, sample_seed=data_seed + 7),
    )
