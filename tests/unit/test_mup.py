"""μP for the built-in language model: the model mup sees (width dimensions marked, drawn readout, 1/d
attention, fan-in initialisation), the per-layer learning rates each optimizer gets from mup's rules,
and what is refused."""

from __future__ import annotations

import math

import pytest
import torch

from largebatch.api import OptimizerSpec
from largebatch.errors import TaskError
from largebatch_trainer import optim
from largebatch_trainer.tasks import load_task, pylm

ARGS = {"depth": 1, "heads": 2, "context": 8, "parametrization": "mup", "baseWidth": 16}


def mup_model(width: int) -> torch.nn.Module:
    return pylm(width=width, **ARGS).model


def test_the_mup_model_marks_its_widths_and_starts_the_mup_way():
    model = mup_model(64)
    shapes = {name: p.infshape for name, p in model.named_parameters()}
    assert shapes["blocks.0.qkv.weight"].ninf() == 2 and shapes["blocks.0.qkv.weight"].width_mult() == 4
    assert shapes["tokens.weight"].ninf() == 1 and shapes["head.weight"].ninf() == 1
    assert model.head.weight.std().item() == pytest.approx(0.02, rel=0.1)  # readout drawn, as mup's default
    assert model.blocks[0].attention_scale == pytest.approx(math.sqrt(16 / 2) / (64 / 2))  # 1/d, = 1/√d at base
    # Hidden matrices narrow with fan-in (std 0.02 / √4 here), embeddings keep theirs.
    assert model.blocks[0].qkv.weight.std().item() == pytest.approx(0.01, rel=0.1)
    assert model.tokens.weight.std().item() == pytest.approx(0.02, rel=0.1)


def test_the_standard_model_is_untouched_by_mup():
    model = pylm(width=64, depth=1, heads=2, context=8).model
    assert not optim.is_mup(model)
    assert model.blocks[0].attention_scale is None and type(model.head) is torch.nn.Linear
    spec = OptimizerSpec.model_validate({"name": "adamw", "lr": 0.01, "weightDecay": 0.1})
    assert len(optim.build(spec, model).param_groups) == 2


def groups_by_parameter(name: str, width: int) -> dict[str, dict]:
    model = mup_model(width)
    spec = OptimizerSpec.model_validate({"name": name, "lr": 0.01, "weightDecay": 0.1})
    optimizer = optim.build(spec, model)
    optim.set_lr(optimizer, 0.01)
    return {
        n: g for n, p in model.named_parameters() for g in optimizer.param_groups if any(p is q for q in g["params"])
    }


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_adam_family_hidden_matrices_learn_slower_as_width_grows(name):
    """mup's MuAdam rule: LR of matrix-like parameters ÷ width multiplier, decay × it; the rest as given."""
    groups = groups_by_parameter(name, 64)  # 4 x the base width
    hidden, embedding, norm = groups["blocks.0.mlp.0.weight"], groups["tokens.weight"], groups["ln.weight"]
    assert hidden["lr_scale"] == 0.25 and embedding["lr_scale"] == norm["lr_scale"] == 1.0
    assert hidden["base_weight_decay"] == pytest.approx(0.4) and norm["base_weight_decay"] == 0.0
    if name == "adamw":
        assert hidden["lr"] == pytest.approx(0.0025) and embedding["lr"] == pytest.approx(0.01)
    else:  # LAMB's first step also carries the paper's bias corrections (optim.set_lr), on top of the scale
        assert hidden["lr"] == pytest.approx(0.0025) and norm["lr"] == pytest.approx(0.01 * math.sqrt(1 - 0.999) / 0.1)


@pytest.mark.parametrize("name", ["sgd", "lars"])
def test_sgd_family_vectors_learn_faster_as_width_grows(name):
    """mup's MuSGD rule: LR of vector-like parameters × width multiplier, square matrices as given."""
    groups = groups_by_parameter(name, 64)
    assert groups["tokens.weight"]["lr_scale"] == groups["head.weight"]["lr_scale"] == 4.0
    assert groups["blocks.0.qkv.weight"]["lr_scale"] == 1.0  # fan-in and fan-out grow alike
    assert groups["tokens.weight"]["lr"] == pytest.approx(0.04)


def test_mup_scales_survive_an_optimizer_checkpoint():
    model = mup_model(64)
    spec = OptimizerSpec.model_validate({"name": "adamw", "lr": 0.01})
    saved = optim.build(spec, model).state_dict()
    restored = optim.build(spec, model)
    restored.load_state_dict(saved)
    assert sorted(g["lr_scale"] for g in restored.param_groups) == [0.25, 1.0, 1.0]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ({"parametrization": "ntk"}, "task.args.parametrization 'ntk': use one of standard, mup"),
        ({"parametrization": "mup", "baseWidth": 15}, "baseWidth (15) must be a multiple of heads (2)"),
    ],
)
def test_what_does_not_make_a_model_is_refused_with_the_argument(args, said):
    with pytest.raises(TaskError, match=said.replace("(", r"\(").replace(")", r"\)")):
        load_task("largebatch_trainer.tasks:pylm", {"width": 32, "depth": 1, "heads": 2, "context": 8} | args, seed=0)


# --- μTransfer: the best LR stays put under μP and falls under the standard parametrization -------------

GRID = [0.001 * 3**k for k in range(6)]  # 0.001 to 0.243, ×3 a step
"""A coarse grid over the short run's whole useful range: its best LR is the edge of stable training,
which is what μP holds in place across widths."""


def trained_loss(
    parametrization: str, width: int, lr: float, steps: int = 40, seed: int = 0, zero_readout: bool = False
) -> float:
    """Mean training loss over the last 10 of `steps` AdamW steps (warmup 5), a tiny pylm, base width 16;
    `zero_readout` zeroes μP's readout after the model is built (TP5's choice; `benchmarks/mup_readout.py`)."""
    torch.manual_seed(seed)
    task = pylm(width=width, depth=1, heads=2, context=16, parametrization=parametrization, baseWidth=16)
    if zero_readout:
        with torch.no_grad():
            task.model.head.weight.zero_()
    optimizer = optim.build(OptimizerSpec(name="adamw", lr=lr), task.model)
    samples = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(steps):
        optim.set_lr(optimizer, lr * min(1.0, (step + 1) / 5))
        batch = torch.stack([task.dataset[int(i)] for i in torch.randint(len(task.dataset), (16,), generator=samples)])
        loss, count = task.loss(task.model, batch)
        (loss / count).backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item() / count)
    mean = sum(losses[-10:]) / 10
    return mean if math.isfinite(mean) else math.inf


def best_grid_step(parametrization: str, width: int) -> int:
    losses = [trained_loss(parametrization, width, lr) for lr in GRID]
    return losses.index(min(losses))


def test_the_best_lr_moves_with_width_under_standard_and_stays_under_mup():
    """8× the width, seed 0. In runs this short the best LR is the edge of stable training: the standard
    parametrization's falls as the width grows; μP's stays within one grid step (×3), where its drawn
    readout's first steps put it one step up on three of four seeds (`benchmarks/mup_readout.py`; at
    1,000 steps it holds, benchmarks/README.md, "Why μP seemed not to transfer")."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the same sums on any machine, and no time lost to thread handoffs
    try:
        standard = best_grid_step("standard", 128) - best_grid_step("standard", 16)
        mup = best_grid_step("mup", 128) - best_grid_step("mup", 16)
    finally:
        torch.set_num_threads(threads)
    assert mup in (0, 1), f"μP's best LR moved {mup:+d} grid steps (×3 each) from width 16 to 128"
    assert standard <= -1, f"the standard parametrization's best LR moved {standard:+d} grid steps, expected down"
