"""The global sample stream and the built-in tasks."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest
import torch

from largebatch.errors import TaskError
from largebatch_trainer.data import SampleStream
from largebatch_trainer.tasks import Task, linreg, load_task, pylm
from largebatch_trainer.tasks import linear_regression as linreg_module
from largebatch_trainer.tasks import stdlib_gpt as pylm_module


def test_each_epoch_is_a_permutation_and_epochs_differ():
    stream = SampleStream(10, seed=3)
    first, second = stream.indices(0, 10), stream.indices(10, 10)
    assert sorted(first) == sorted(second) == list(range(10))
    assert first != second


def test_slices_across_an_epoch_boundary_agree_with_the_whole_stream():
    whole = SampleStream(7, seed=1).indices(0, 30)
    stream = SampleStream(7, seed=1)
    assert stream.indices(5, 4) + stream.indices(9, 21) == whole[5:30]
    assert SampleStream(7, seed=2).indices(0, 30) != whole


def test_pylm_reads_the_standard_library_in_order_and_holds_files_out():
    files = pylm_module.stdlib_files()
    root = Path(sysconfig.get_paths()["stdlib"])
    assert files == sorted(files) and len(files) > 100
    assert all(root in f.parents and "site-packages" not in f.parts for f in files)
    train, held_out = pylm_module.corpus(held_out=False), pylm_module.corpus(held_out=True)
    assert len(held_out) < len(train) / 10
    task = pylm(width=32, depth=1, heads=2, context=16)
    sample = task.dataset[3]
    assert sample.shape == (17,) and sample.dtype == torch.long
    batch = task.collate([task.dataset[i] for i in range(5)])
    loss_sum, count = task.loss(task.model, batch)
    assert count == 5
    # The sum of per-sample losses: about 5 × ln(256) for an untrained byte model.
    assert float(loss_sum.detach()) == pytest.approx(5 * torch.log(torch.tensor(256.0)).item(), rel=0.1)
    assert task.tokens_per_sample == 16


def test_linreg_noise_scale_closed_form_matches_monte_carlo():
    task = linreg(dim=8, samples=200_000, noise=0.7)
    x, y = task.dataset.x, task.dataset.y
    w = torch.zeros(8)
    per_sample = (x @ w - y)[:, None] * x  # gradient of (x·w − y)²/2
    g = per_sample.mean(0)
    trace = float(per_sample.var(0).sum())
    empirical = trace / float(g.pow(2).sum())
    assert linreg_module.noise_scale(w, 8, 0.7) == pytest.approx(empirical, rel=0.03)


def test_linreg_held_out_samples_come_from_the_same_regression():
    """At w* the held-out loss is the noise floor σ²/2; the samples differ from the training ones."""
    task = linreg(dim=8, samples=4_096, noise=0.5, data_seed=3)
    w_star = linreg_module.true_weights(8, 3)
    held_out = task.eval_dataset
    assert not torch.equal(held_out.x, task.dataset.x)
    floor = float((held_out.x @ w_star - held_out.y).pow(2).mean() / 2)
    assert floor == pytest.approx(0.5**2 / 2, rel=0.1)
    fitted = torch.linalg.lstsq(held_out.x, held_out.y[:, None]).solution.squeeze(-1)
    assert float((fitted - w_star).norm()) < 0.05


def test_load_task_seeds_the_model_and_checks_the_type():
    a = load_task("largebatch_trainer.tasks:pylm", {"width": 16, "depth": 1, "heads": 2, "context": 8}, seed=5)
    b = load_task("largebatch_trainer.tasks:pylm", {"width": 16, "depth": 1, "heads": 2, "context": 8}, seed=5)
    assert isinstance(a, Task)
    torch.testing.assert_close(a.model.state_dict(), b.model.state_dict())
    with pytest.raises(TaskError, match="cannot be loaded"):
        load_task("largebatch_trainer.tasks:nope", {}, seed=0)
