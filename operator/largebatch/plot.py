"""Draws a job's planned global batch and learning rate against samples (`lbctl plan --plot`)."""

from __future__ import annotations

from pathlib import Path

from largebatch import schedule
from largebatch.api import LargeBatchJobSpec


def plot_plan(spec: LargeBatchJobSpec, path: Path, title: str, noise_scale: float | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def curves(job: LargeBatchJobSpec):
        pieces = schedule.trace(job, noise_scale)
        xs = [x for p in pieces for x in (p.start, p.end)]
        return (
            xs,
            [p.global_batch for p in pieces for _ in (0, 1)],
            [v for p in pieces for v in (p.lr_start, p.lr_end)],
        )

    xs, batch, lr = curves(spec)
    base_xs, _, base_lr = curves(schedule.constant_baseline(spec))
    fig, (ax_batch, ax_lr) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    ax_batch.plot(xs, batch, color="tab:blue")
    ax_batch.set_yscale("log", base=2)
    ax_batch.set_ylabel("global batch (samples)")
    ax_lr.plot(base_xs, base_lr, color="gray", linestyle="--", label=f"constant batch {spec.batch.initial}")
    ax_lr.plot(xs, lr, color="tab:red", label=spec.batch.policy.type)
    ax_lr.legend()
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("samples")
    for ax in (ax_batch, ax_lr):
        ax.grid(True, alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
