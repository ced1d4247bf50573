"""The record of a local run: run.json and run.png (loss, batch, LR and world size against samples),
each replaced atomically, so that a failed write (a full disk) leaves the previous record whole."""

from __future__ import annotations

import json
from pathlib import Path

from largebatch import files


class RecordError(Exception):
    """The record could not be written; the message names the file and the reason."""


def write(record: dict, run_dir: Path, with_plot: bool = True) -> tuple[Path, Path]:
    json_path, png_path = run_dir / "run.json", run_dir / "run.png"
    _replace(json_path, lambda path: path.write_text(json.dumps(record, indent=2)))
    if with_plot:
        _replace(png_path, lambda path: plot(record, path))
    return json_path, png_path


def _replace(final: Path, write) -> None:
    try:
        files.replace(final, write)
    except OSError as exc:
        raise RecordError(f"cannot write {final}: {exc.strerror or exc}") from None


def plot(record: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timeline = [t for t in record["timeline"] if t.get("globalBatch")]
    fig, axes = plt.subplots(4, 1, sharex=True, figsize=(8, 9))
    series = [
        ("loss", "training loss", "tab:purple", False),
        ("globalBatch", "global batch", "tab:blue", True),
        ("lr", "learning rate", "tab:red", False),
        ("worldSize", "world size", "tab:green", True),
    ]
    xs = [t["samples"] for t in timeline]
    for ax, (key, label, color, steps) in zip(axes, series, strict=True):
        ys = [t.get(key) for t in timeline]
        if steps:
            ax.step(xs, ys, where="post", color=color)
        else:
            ax.plot(xs, ys, color=color)
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    for rescale in record["rescales"]:
        for ax in axes:
            ax.axvline(rescale["samples"], color="gray", linestyle=":", linewidth=0.8)
    axes[-1].set_xlabel("samples")
    fig.suptitle(f"{record['job']}: {record['samplesConsumed']:,} of {record['totalSamples']:,} samples")
    fig.tight_layout()
    fig.savefig(path, dpi=100, format="png")
    plt.close(fig)
