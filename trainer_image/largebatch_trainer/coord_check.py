"""The coordinate check of Tensor Programs V (Yang et al. 2021, `lbctl coord-check`): train the job's model
at several widths for a few steps and record, for every layer, the mean absolute value of its output
coordinates at each step. Under a parametrization that transfers across width (μP) these stay about the
same as the width grows; under the standard one some grow with it (the output logits first), which is
why the best learning rate of a narrow model does not carry over.

Every width trains from the same seed on the same samples, with the job's optimizer (μP's per-layer
learning rates included, largebatch_trainer.optim) at the LR and batch the job reaches when warmup
ends, without the warmup: the check is about the size of updates, and warmup would hide them.
"""

from __future__ import annotations

import torch

from largebatch import schedule
from largebatch.api import LargeBatchJobSpec
from largebatch_trainer import optim
from largebatch_trainer.tasks import load_task


def measure(spec: LargeBatchJobSpec, widths: list[int], steps: int) -> dict:
    """{"widths", "steps", "lr", "batch", "layers": {layer: {width: [mean |output| at step 1..steps]}}}."""
    peak = schedule.plan(spec, schedule.Progress(samples=spec.schedule.warmup_samples))
    layers: dict[str, dict[int, list[float]]] = {}
    for width in widths:
        for layer, values in _one_width(spec, width, steps, peak.lr, peak.global_batch).items():
            layers.setdefault(layer, {})[width] = values
    return {"widths": widths, "steps": steps, "lr": peak.lr, "batch": peak.global_batch, "layers": layers}


def _one_width(spec: LargeBatchJobSpec, width: int, steps: int, lr: float, batch: int) -> dict[str, list[float]]:
    task = load_task(spec.task.entrypoint, dict(spec.task.args) | {"width": width}, spec.task.seed)
    model, seen = task.model, {}
    optimizer = optim.build(spec.optimizer, model)

    def record(name):
        def hook(_module, _inputs, output):
            if isinstance(output, torch.Tensor):
                seen.setdefault(name, []).append(output.detach().abs().mean().item())

        return hook

    handles = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if n and _records(m)]
    try:
        model.train()
        for step in range(steps):
            samples = [task.dataset[(step * batch + i) % len(task.dataset)] for i in range(batch)]
            loss_sum, count = task.loss(model, task.collate(samples))
            optim.set_lr(optimizer, lr)
            optimizer.zero_grad(set_to_none=True)
            (loss_sum / count).backward()
            optimizer.step()
    finally:
        for handle in handles:
            handle.remove()
    return seen


def _records(module: torch.nn.Module) -> bool:
    """Layers whose output is a coordinate vector of the network (not containers)."""
    return not isinstance(module, (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.Sequential))


def plot(table: dict, path, title: str) -> None:
    """One panel per step: mean |coordinate| against width (both log scales), a line per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps, widths = table["steps"], table["widths"]
    fig, axes = plt.subplots(1, steps, figsize=(3.2 * steps, 3.6), sharey=True, squeeze=False)
    for t, ax in enumerate(axes[0]):
        for layer, by_width in table["layers"].items():
            ax.plot(widths, [by_width[w][t] for w in widths], marker=".", linewidth=1, label=layer)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"step {t + 1}")
        ax.set_xlabel("width")
    axes[0][0].set_ylabel("mean |coordinate|")
    axes[0][-1].legend(fontsize=6, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
