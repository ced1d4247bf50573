"""Optimizers: LAMB against the paper's formula, the momentum form of each optimizer, and the bias/norm
exemptions."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

from largebatch.api import OptimizerSpec
from largebatch_trainer import optim


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.norm = torch.nn.LayerNorm(2)


def tiny() -> Tiny:
    torch.manual_seed(0)
    model = Tiny()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p))
    return model


def corrected_moments(grads, coefficients):
    """Each step's bias-corrected Adam moments m̂, v̂, its ε and both corrections, with that step's (β₁, β₂,
    ε): the corrections are 1 − Πβ over the steps so far, which is 1 − βᵗ while the betas stay."""
    m = v = 0.0
    p1 = p2 = 1.0
    for g, (beta1, beta2, eps) in zip(grads, coefficients, strict=True):
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * g * g
        p1, p2 = p1 * beta1, p2 * beta2
        yield m / (1 - p1), v / (1 - p2), eps, 1 - p1, 1 - p2


def paper_lamb(w, grads, lr, coefficients, wd, trust: bool):
    """You et al. (2020), algorithm 2, with φ(z) = min(z, 10); `trust=False` is plain Adam with decay.
    `coefficients` holds each step's (β₁, β₂, ε). The trust ratio's denominator carries
    pytorch-optimizer's ε(1−β₂ᵗ)/(1−β₁ᵗ) (docs/trainer.md)."""
    w = w.clone()
    for m_hat, v_hat, eps, correction1, correction2 in corrected_moments(grads, coefficients):
        r = m_hat / (v_hat.sqrt() + eps) + wd * w
        library_eps = eps * correction2 / correction1
        ratio = min(float(w.norm()), 10.0) / (float(r.norm()) + library_eps) if trust else 1.0
        w = w - lr * ratio * r
    return w


def paper_adamw(w, grads, lr, coefficients, wd):
    """Loshchilov and Hutter (2019), with each step's (β₁, β₂, ε)."""
    w = w.clone()
    for m_hat, v_hat, eps, _, _ in corrected_moments(grads, coefficients):
        w = w * (1 - lr * wd) - lr * m_hat / (v_hat.sqrt() + eps)
    return w


def step_tiny(optimizer, model, grads, lr, coefficients=None) -> None:
    """Step `model` (a `tiny()`) through `grads`, (weight, bias) gradients of its linear layer, setting each
    step's LR and, when given, its (β₁, β₂, ε) through optim.set_lr."""
    for i, (gw, gb) in enumerate(grads):
        model.zero_grad()
        model.linear.weight.grad, model.linear.bias.grad = gw.clone(), gb.clone()
        model.norm.weight.grad, model.norm.bias.grad = torch.zeros(2), torch.zeros(2)
        if coefficients is None:
            optim.set_lr(optimizer, lr)
        else:
            beta1, beta2, eps = coefficients[i]
            optim.set_lr(optimizer, lr, (beta1, beta2), eps)
        optimizer.step()


def test_a_lamb_step_is_the_papers_update():
    from pytorch_optimizer import Lamb  # here, not at the top: every xdist worker collects this module

    model = tiny()
    spec = OptimizerSpec(name="lamb", lr=0.01, weight_decay=0.1, betas=[0.9, 0.999], eps=1e-6)
    optimizer = optim.build(spec, model)
    assert isinstance(optimizer, Lamb)
    weight0, bias0 = model.linear.weight.detach().clone(), model.linear.bias.detach().clone()
    torch.manual_seed(1)
    grads = [(torch.randn(2, 3), torch.randn(2)) for _ in range(3)]
    step_tiny(optimizer, model, grads, 0.01)
    coefficients = [(0.9, 0.999, 1e-6)] * len(grads)
    expected_weight = paper_lamb(weight0, [g for g, _ in grads], 0.01, coefficients, 0.1, trust=True)
    # Bias: no weight decay and no trust ratio (the paper exempts bias and norm parameters).
    expected_bias = paper_lamb(bias0, [g for _, g in grads], 0.01, coefficients, 0.0, trust=False)
    torch.testing.assert_close(model.linear.weight.detach(), expected_weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(model.linear.bias.detach(), expected_bias, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_moment_coefficients_that_change_with_the_batch_get_the_bias_corrections_they_imply(name):
    """Under `moments: perSample` the betas and ε change with the batch; each step must be the one the
    changing moments call for, with both moments corrected by 1 − Πβ rather than the optimizer's 1 − βᵗ.
    The batch here doubles, stays and grows 16x: the corrections then differ by up to ~2x from 1 − βᵗ."""
    model = tiny()
    spec = OptimizerSpec(name=name, lr=0.01, weight_decay=0.1, betas=[0.9, 0.999], eps=1e-3)
    optimizer = optim.build(spec, model)
    weight0, bias0 = model.linear.weight.detach().clone(), model.linear.bias.detach().clone()
    torch.manual_seed(2)
    grads = [(torch.randn(2, 3), torch.randn(2)) for _ in range(5)]
    coefficients = [(0.9**k, 0.999**k, 1e-3 / math.sqrt(k)) for k in (1, 2, 2, 16, 16)]
    step_tiny(optimizer, model, grads, 0.01, coefficients)
    gw, gb = [g for g, _ in grads], [g for _, g in grads]
    if name == "lamb":
        expected_weight = paper_lamb(weight0, gw, 0.01, coefficients, 0.1, trust=True)
        expected_bias = paper_lamb(bias0, gb, 0.01, coefficients, 0.0, trust=False)
    else:
        expected_weight = paper_adamw(weight0, gw, 0.01, coefficients, 0.1)
        expected_bias = paper_adamw(bias0, gb, 0.01, coefficients, 0.0)
    torch.testing.assert_close(model.linear.weight.detach(), expected_weight, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(model.linear.bias.detach(), expected_bias, rtol=1e-6, atol=1e-7)


def test_moment_state_resumes_from_a_checkpoint_written_before_it_existed():
    """A checkpoint without `moment_products` took its steps at the betas it holds: resuming from it, and
    from one with the state, take the same step as an optimizer that never stopped."""
    torch.manual_seed(3)
    grads = [(torch.randn(2, 3), torch.randn(2)) for _ in range(4)]
    coefficients = [(0.9, 0.999, 1e-3)] * 2 + [(0.81, 0.998, 7e-4)] * 2
    spec = OptimizerSpec(name="adamw", lr=0.01, betas=[0.9, 0.999], eps=1e-3)
    through = tiny()
    step_tiny(optim.build(spec, through), through, grads, 0.01, coefficients)
    for keep_state in (True, False):
        model = tiny()
        optimizer = optim.build(spec, model)
        step_tiny(optimizer, model, grads[:2], 0.01, coefficients[:2])
        saved = optimizer.state_dict()
        if not keep_state:
            for group in saved["param_groups"]:
                del group["moment_products"], group["moment_steps"]
        resumed = optim.build(spec, model)
        resumed.load_state_dict(saved)
        step_tiny(resumed, model, grads[2:], 0.01, coefficients[2:])
        torch.testing.assert_close(model.linear.weight.detach(), through.linear.weight.detach(), rtol=1e-6, atol=1e-7)


def test_a_zero_weight_gets_a_trust_ratio_of_one():
    """The paper's φ(0) = 0 would leave a zero weight at zero; the library (and we) take an Adam step."""
    model = tiny()
    with torch.no_grad():
        model.linear.weight.zero_()
    optimizer = optim.build(OptimizerSpec(name="lamb", lr=0.01, weight_decay=0.0, eps=1e-6), model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    optim.set_lr(optimizer, 0.01)
    optimizer.step()
    # The paper's r is 1/(1 + ε) here; with a trust ratio of 1 the library steps lr·r in its own units,
    # which are the paper's times (1 − β₁)/√(1 − β₂) at step 1.
    scale = (1 - 0.9) / math.sqrt(1 - 0.999)
    torch.testing.assert_close(model.linear.weight.detach(), torch.full((2, 3), -0.01 * scale / (1 + 1e-6)))


def test_bias_and_norm_parameters_get_no_weight_decay():
    model = tiny()
    groups = optim.parameter_groups(model, 0.1)
    decayed = {id(p) for p in groups[0]["params"]}
    assert decayed == {id(model.linear.weight)}
    assert groups[0]["weight_decay"] == 0.1 and groups[1]["weight_decay"] == 0.0


@pytest.mark.parametrize("name", ["sgd", "adamw", "lamb", "lars"])
def test_momentum_form_is_as_declared(name):
    """Take a step, change the LR, take a step with zero gradient: a buffer in gradient form moves the
    weights in proportion to the new LR (Goyal's correction is built in); an LR-scaled buffer would not."""

    def move(lr2: float) -> torch.Tensor:
        model = tiny()
        optimizer = optim.build(OptimizerSpec(name=name, lr=0.1, momentum=0.9), model)
        torch.manual_seed(2)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optim.set_lr(optimizer, 0.1)
        optimizer.step()
        before = model.linear.weight.detach().clone()
        for p in model.parameters():
            p.grad = torch.full_like(p, 1e-12)  # zero gradient (LARS needs a non-zero norm)
        optim.set_lr(optimizer, lr2)
        optimizer.step()
        return model.linear.weight.detach() - before

    small, large = move(0.01), move(0.02)
    ratio = float(large.norm() / small.norm())
    declared = optim.MOMENTUM_FORM[name]
    assert declared == "gradient"
    assert ratio == pytest.approx(2.0, rel=0.02 if name != "lamb" else 0.05)
    assert not math.isclose(ratio, 1.0, rel_tol=0.1)


def test_lars_steps_a_weight_by_its_trust_ratio_and_a_bias_by_the_lr_alone():
    """One LARS step without momentum: the weight moves lr x trustCoefficient x |w| / |g| along g, the
    bias (no trust ratio) lr along its gradient, whatever the coefficient."""
    for coefficient in (0.001, 0.02):
        model = tiny()
        spec = OptimizerSpec(name="lars", lr=0.5, momentum=0.0, trust_coefficient=coefficient)
        optimizer = optim.build(spec, model)
        weight, bias = model.linear.weight.detach().clone(), model.linear.bias.detach().clone()
        torch.manual_seed(3)
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        g_weight, g_bias = model.linear.weight.grad.clone(), model.linear.bias.grad.clone()
        optim.set_lr(optimizer, 0.5)
        optimizer.step()
        ratio = coefficient * weight.norm() / g_weight.norm()
        torch.testing.assert_close(model.linear.weight.detach(), weight - 0.5 * ratio * g_weight)
        torch.testing.assert_close(model.linear.bias.detach(), bias - 0.5 * g_bias)


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_fused_kernels_take_the_same_step(name):
    """torch's fused SGD and AdamW (what the trainer asks for on CUDA; torch has them on the CPU too)."""
    spec = OptimizerSpec(name=name, lr=0.1, weight_decay=0.01)
    models = [tiny(), tiny()]
    plain, fused = optim.build(spec, models[0]), optim.build(spec, models[1], fused=True)
    assert fused.defaults["fused"] and not plain.defaults["fused"]
    for model, optimizer in zip(models, (plain, fused), strict=True):
        for _ in range(3):
            model.linear.weight.sum().backward()
            optimizer.step()
            optimizer.zero_grad()
    torch.testing.assert_close(models[1].state_dict(), models[0].state_dict())


@pytest.mark.parametrize("name", ["lamb", "lars"])
def test_optimizers_without_fused_kernels_run_as_they_are(name):
    optimizer = optim.build(OptimizerSpec(name=name, lr=0.1), tiny(), fused=True)
    assert "fused" not in optimizer.defaults


def test_the_agent_imports_pytorch_optimizer_only_for_a_job_that_asks_for_lamb_or_lars():
    """What a torchrun agent imports before it forks its trainers (largebatch_trainer.forked) leaves out
    pytorch-optimizer and the transformers it imports, a second of CPU in every agent of an SGD or AdamW
    job (tests/README.md, "Stop 56"); building a LAMB optimizer loads it."""
    script = (
        "import sys, torch, largebatch_trainer.loop\n"
        "from largebatch.api import OptimizerSpec\n"
        "from largebatch_trainer import optim\n"
        "early = sorted(m for m in ('pytorch_optimizer', 'transformers') if m in sys.modules)\n"
        "optim.build(OptimizerSpec(name='adamw', lr=0.1), torch.nn.Linear(2, 2))\n"
        "after_adamw = 'pytorch_optimizer' in sys.modules\n"
        "optim.build(OptimizerSpec(name='lamb', lr=0.1), torch.nn.Linear(2, 2))\n"
        "print(early, after_adamw, 'pytorch_optimizer' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    assert out.split("\n")[-2] == "[] False True", out


def test_clipping_scales_a_gradient_above_the_bound_to_it_and_leaves_one_below_alone():
    layer = torch.nn.Linear(3, 2)
    for scale, expected in ((10.0, 1.0), (1e-3, None)):
        for p in layer.parameters():
            p.grad = torch.full_like(p, scale)
        before = torch.cat([p.grad.flatten() for p in layer.parameters()]).norm()
        optim.clip_gradients(list(layer.parameters()), 1.0)
        after = torch.cat([p.grad.flatten() for p in layer.parameters()]).norm()
        assert math.isclose(after, expected if expected else before, rel_tol=1e-5), (scale, before, after)
