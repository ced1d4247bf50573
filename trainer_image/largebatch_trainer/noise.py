"""Gradient noise scale B_simple = tr(Σ)/|G|² (McCandlish et al. 2018, appendix A).

Each step gives the squared norm of gradients at two batch sizes: a small one (each rank's local
gradient before the all-reduce, or each micro-batch on a single worker) and the big one (the global
batch). From E|G_B|² = |G|² + tr(Σ)/B, two unbiased estimators follow:

    |G|²  ≈ (B_big |G_big|² − B_small |G_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

A single step's estimates are noisy (|G|² can come out negative), so each is smoothed with its own
bias-corrected exponential moving average and the ratio is taken afterwards.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


def estimate(b_small: float, g_small_sq: float, b_big: float, g_big_sq: float) -> tuple[float, float]:
    """One step's unbiased (|G|², tr Σ) from the squared gradient norms at two batch sizes."""
    if not 0 < b_small < b_big:
        raise ValueError(f"need 0 < b_small < b_big, got b_small={b_small}, b_big={b_big}")
    g_sq = (b_big * g_big_sq - b_small * g_small_sq) / (b_big - b_small)
    trace = (g_small_sq - g_big_sq) / (1.0 / b_small - 1.0 / b_big)
    return g_sq, trace


@dataclass
class NoiseScale:
    """Smoothed B_simple; its state travels in checkpoints."""

    smoothing: float
    g_sq: float = 0.0
    trace: float = 0.0
    weight: float = 0.0  # 1 − smoothing**n: the bias correction of both averages

    def update(self, b_small: float, g_small_sq: float, b_big: float, g_big_sq: float) -> None:
        g_sq, trace = estimate(b_small, g_small_sq, b_big, g_big_sq)
        a = self.smoothing
        self.g_sq = a * self.g_sq + (1 - a) * g_sq
        self.trace = a * self.trace + (1 - a) * trace
        self.weight = a * self.weight + (1 - a)

    @property
    def value(self) -> float | None:
        """B_simple, or None before the first estimate or while |G|² is not yet positive."""
        if self.weight == 0.0 or self.g_sq <= 0.0:
            return None
        return (self.trace / self.weight) / (self.g_sq / self.weight)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


# --- the preconditioned estimator ---------------------------------------------------------------------
#
# An Adam-family step moves along P ⊙ G with P = 1/(sqrt(v̂) + eps), so the gradient noise that decides
# its useful batch is that of P ⊙ g (Pollux, Qiao et al. 2021): the same two-batch estimators on squared
# norms of preconditioned gradients, |P ⊙ G_B|², give tr(P Σ P)/|P ⊙ G|².


def preconditioners(optimizer: torch.optim.Optimizer, key=torch.Tensor.data_ptr) -> dict[int, torch.Tensor] | None:
    """P = 1/(sqrt(v̂) + eps) of each parameter with second-moment state, keyed by `key(parameter)`: its data
    pointer by default (DDP's buckets hand out other tensor objects for the same parameters); None before
    the first step."""
    weights = {}
    for group in optimizer.param_groups:
        eps, beta2 = group.get("base_eps", group.get("eps")), group["betas"][1]
        products = group.get("moment_products")  # optim.set_lr's, when it has run: right as the betas change
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            if "exp_avg_sq" not in state:
                continue
            step = state.get("step", group.get("step", 0))
            if products is not None:
                correction = 1.0 - products[1]
            elif torch.is_tensor(step):
                # torch's AdamW keeps the step as a tensor, on the GPU when fused: reading it would make the
                # host wait once per parameter, so the bias correction is computed where it lives.
                correction = 1.0 - beta2 ** step.double()
            elif step < 1:
                continue
            else:
                correction = 1.0 - beta2**step
            with torch.no_grad():
                weights[key(p)] = 1.0 / (state["exp_avg_sq"].div(correction).sqrt_().add_(eps))
    return weights or None


def squared_norm(tensors, params=None, weights: dict[int, torch.Tensor] | None = None) -> torch.Tensor:
    """Σ |w ⊙ t|² over `tensors` (float64, on their device), w the weight of the matching parameter in
    `params` when `weights` are given (1 for a parameter without one)."""
    if weights is None:
        return torch.stack(torch._foreach_norm(list(tensors))).double().square().sum()
    scaled = [t * weights[p.data_ptr()] if p.data_ptr() in weights else t for t, p in zip(tensors, params, strict=True)]
    return torch.stack(torch._foreach_norm(scaled)).double().square().sum()
