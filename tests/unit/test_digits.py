"""The built-in `digits` task: scikit-learn's 8×8 digits, a small ResNet with BatchNorm, held-out accuracy."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from largebatch.errors import TaskError
from largebatch_trainer import optim
from largebatch_trainer.tasks import digits_resnet as digits_module
from largebatch_trainer.tasks import load_task


def build(**args):
    return load_task("largebatch_trainer.tasks:digits", args, seed=0)


def test_every_fifth_image_is_held_out_scaled_to_the_unit_interval():
    import sklearn.datasets  # here, not at the top: every xdist worker collects this module (tests/README.md)

    task = build()
    bunch = sklearn.datasets.load_digits()
    assert (len(task.dataset), len(task.eval_dataset)) == (1437, 360)
    x, y = task.eval_dataset[7]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32
    torch.testing.assert_close(x.flatten(), torch.tensor(bunch.data[35], dtype=torch.float32) / 16)
    assert int(y) == bunch.target[35]
    x, y = task.dataset[3]  # training image 3 is image 4 of the bundle (0 is held out)
    torch.testing.assert_close(x.flatten(), torch.tensor(bunch.data[4], dtype=torch.float32) / 16)
    pixels = torch.stack([task.dataset[i][0] for i in range(len(task.dataset))])
    assert pixels.min() == 0.0 and pixels.max() == 1.0


def test_zero_init_residual_makes_every_block_start_as_the_identity():
    task = build(width=8, blocks=3)
    blocks = task.model.blocks
    assert all(torch.count_nonzero(block.bn2.weight) == 0 for block in blocks)
    x = torch.rand(4, 8, 8, 8)  # non-negative, as after the stem's ReLU
    torch.testing.assert_close(blocks(x), x)
    plain = build(width=8, blocks=3, zeroInitResidual=False).model.blocks
    assert all(torch.all(block.bn2.weight == 1) for block in plain)
    assert not torch.allclose(plain(x), x)


def test_batchnorm_gamma_and_beta_get_no_weight_decay():
    model = build().model
    decay, exempt = optim.parameter_groups(model, weight_decay=5e-4)
    norms = [p for m in model.modules() if isinstance(m, nn.BatchNorm2d) for p in (m.weight, m.bias)]
    assert len(norms) == 2 * (1 + 2 * 2)  # the stem's BN and two per block
    assert {id(p) for p in norms} <= {id(p) for p in exempt["params"]}
    assert exempt["weight_decay"] == 0.0 and decay["weight_decay"] == 5e-4
    # What decays is the convolutions' and the head's weights, nothing else.
    weights = [m.weight for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)]
    assert {id(p) for p in decay["params"]} == {id(p) for p in weights}


@pytest.fixture
def one_thread():
    """Small convolutions on one thread: two threads on a busy 2-core machine took 15x as long."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_accuracy_counts_right_answers_and_rises_as_the_model_learns(one_thread):
    task = build()
    held_out = torch.utils.data.default_collate([task.eval_dataset[i] for i in range(len(task.eval_dataset))])

    def accuracy() -> float:
        task.model.eval()
        with torch.no_grad():
            correct, count = task.accuracy(task.model, held_out)
            expected = int((task.model(held_out[0]).argmax(1) == held_out[1]).sum())
        task.model.train()
        assert count == 360 and int(correct) == expected
        return int(correct) / count

    before = accuracy()
    opt = torch.optim.SGD(task.model.parameters(), lr=0.1, momentum=0.9)
    decay = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=300)
    generator = torch.Generator().manual_seed(0)
    for _ in range(300):
        batch = torch.utils.data.default_collate(
            [task.dataset[int(i)] for i in torch.randint(len(task.dataset), (32,), generator=generator)]
        )
        loss_sum, count = task.loss(task.model, batch)
        (loss_sum / count).backward()
        opt.step()
        opt.zero_grad()
        decay.step()
    assert before < 0.3 and accuracy() > 0.8


def test_without_scikit_learn_the_task_says_which_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn", None)  # as if not installed: find_spec finds nothing
    with pytest.raises(TaskError, match=r"pip install 'largebatch\[digits\]'"):
        digits_module.load(held_out=False)
    with pytest.raises(TaskError, match=r"largebatch\[digits\]"):
        build()


def test_nonsense_arguments_are_refused_with_the_numbers():
    with pytest.raises(TaskError, match="width=0"):
        build(width=0)
