"""Why μP seemed not to transfer (issue 23): the built-in `pylm` trained directly (no `lbctl`, one thread
per run, several runs at a time), with the suspects switched one at a time, at several seeds, widths,
learning rates and run lengths; the held-out loss at the end of each run.

    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/sus --steps 300 --widths 32,128 --lr 0.01 \
        --seeds 0,1,2 --variants ,zerobias,spattn,qzero,eps1e-12          # the suspects, short runs
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/len --steps 1000 --widths 32,128 --lr 0.01 \
        --seeds 0,1,2                                                      # the run's length
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 32,64,128 --seeds 0,1 \
        --lr 0.0016,0.0036,0.0083,0.019,0.044 --parametrizations standard     # the best LR's drift
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 32,64,128 --seeds 0,1 \
        --lr 0.0016,0.0036,0.0083,0.019,0.044 --parametrizations mup --variants zeroreadout,readout
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 256 --seeds 0,1 \
        --lr 0.0036,0.0083,0.019 --parametrizations mup --variants zeroreadout,readout  # width 256
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 256 --seeds 0,1 \
        --lr 0.0016,0.0036,0.0083 --parametrizations standard
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 32,64,128,256 \
        --seeds 2,3 --lr 0.0083,0.019 --parametrizations mup --variants readout  # held-out seeds
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 32,64,128,256 \
        --seeds 0,1 --lr 0.0016,0.0036,0.0083,0.019,0.044 --parametrizations mup,standard --variants readout, \
        --again --plot benchmarks/mup_lr                                  # all four widths, plotted

A run is `pylm` (depth 2, 4 heads, context 64, base width 32), AdamW (no weight decay), batch 32,
warmup 5% and cosine to 10%, as `benchmarks/mup_transfer.py` trains its proxies; the loss is on 1,024
held-out windows. Variants (joined with +):
- `zerobias`: every bias starts at zero (nn.Linear draws them uniformly in ±1/√fan-in);
- `spattn`: the standard 1/√d_head attention scale instead of μP's 1/d_head;
- `qzero`: the query's weights and bias start at zero (TP5's suggestion: uniform attention at the start);
- `eps1e-12`: Adam's ε at 1e-12 instead of 1e-8 (the hidden layers' gradients shrink with width);
- `readout`: the readout drawn again after the model is built, as the standard model draws it (std 0.02;
  μP's output multiplier still divides it by width / base width). μP as built drew it so only from
  2026-12-03 on: this variant is how the drawn readout was measured while μP's readout started at zero;
- `zeroreadout`: the readout zeroed after the model is built (TP5's choice, and μP as built until
  2026-12-03; the kept runs of μP as built before then are relabelled so).
Every finished run is kept in `--keep`/runs.jsonl and read back on the next call with the same folder;
`--again` runs nothing and reports what is kept (a cell never run says so).
With several LRs, a second table gives for each parametrization and variant the best LR at each width
(of the seeds' mean loss, then each seed's), how many grid steps it moved from the narrowest width to
the widest, and each width's loss at the narrowest width's best LR (the proxy's: wider should be
better there); `--plot PREFIX` draws the loss against the LR, a line per width, one file per
parametrization (PREFIX_mup.png, PREFIX_standard.png).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from largebatch.api import OptimizerSpec
from largebatch_trainer import optim
from largebatch_trainer.tasks import pylm

BASE_WIDTH, DEPTH, HEADS, CONTEXT, BATCH, EVAL_WINDOWS = 32, 2, 4, 64, 32, 1024
VARIANTS = {"zerobias", "spattn", "qzero", "eps1e-12", "readout", "zeroreadout"}
KEY = ("parametrization", "variant", "lr")  # a row of the table


def held_out_loss(parametrization: str, width: int, lr: float, steps: int, seed: int, variant: str) -> float:
    torch.manual_seed(seed)
    task = pylm(width=width, depth=DEPTH, heads=HEADS, context=CONTEXT, parametrization=parametrization,
                baseWidth=BASE_WIDTH)  # fmt: skip
    model, switched = task.model, set(variant.split("+")) - {""}
    if unknown := switched - VARIANTS:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; use {sorted(VARIANTS)} joined with +")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "zerobias" in switched and name.endswith("bias"):
                p.zero_()
            if "readout" in switched and name == "head.weight":
                p.normal_(std=0.02)
            if "zeroreadout" in switched and name == "head.weight":
                p.zero_()
        for block in model.blocks:
            if "spattn" in switched:
                block.attention_scale = None
            if "qzero" in switched:
                block.qkv.weight[:width].zero_()
                block.qkv.bias[:width].zero_()
    spec = OptimizerSpec(name="adamw", lr=lr, eps=1e-12 if "eps1e-12" in switched else 1e-8)
    optimizer = optim.build(spec, model)
    samples = torch.Generator().manual_seed(seed)
    warmup = max(1, steps // 20)
    for step in range(steps):
        decay = 0.5 * (1 + math.cos(math.pi * (step - warmup) / (steps - warmup)))
        optim.set_lr(optimizer, lr * ((step + 1) / warmup if step < warmup else 0.1 + 0.9 * decay))
        picks = torch.randint(len(task.dataset), (BATCH,), generator=samples)
        batch = torch.stack([task.dataset[int(i)] for i in picks])
        loss, count = task.loss(model, batch)
        if not math.isfinite(loss.item()):
            return math.inf
        (loss / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        windows = torch.stack([task.eval_dataset[i] for i in range(0, EVAL_WINDOWS * 7, 7)])  # spread over the files
        return sum(task.loss(model, windows[i : i + 128])[0].item() for i in range(0, EVAL_WINDOWS, 128)) / EVAL_WINDOWS


def run_one(config: dict) -> dict:
    """One run in a process of its own (one thread): runs in parallel do not share a torch thread pool."""
    out = subprocess.run([sys.executable, __file__, "--one", json.dumps(config)], capture_output=True, text=True,
                         env=os.environ | {"OMP_NUM_THREADS": "1"})  # fmt: skip
    if out.returncode:
        raise SystemExit(f"run {config} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.splitlines()[-1])


def table(runs: list[dict], widths: list[int]) -> list[str]:
    """A row per parametrization, variant and LR: each width's held-out loss, mean and per seed."""
    lines = [
        f"| parametrization | variant | LR | {' | '.join(f'width {w}' for w in widths)} |",
        "|---" * (3 + len(widths)) + "|",
    ]
    keys = sorted({tuple(r[k] for k in KEY) for r in runs})
    for parametrization, variant, lr in keys:
        cells = []
        for width in widths:
            key = (parametrization, variant, lr, width)
            found = sorted((r["seed"], r["loss"]) for r in runs if (*(r[k] for k in KEY), r["width"]) == key)
            if not found:
                cells.append("not run")
                continue
            finite = [loss for _, loss in found if math.isfinite(loss)]
            mean = f"{statistics.mean(finite):.3f}" if len(finite) == len(found) else "diverged"
            cells.append(f"{mean} ({', '.join(f'{loss:.3f}' for _, loss in found)})")
        lines.append(f"| {parametrization} | {variant or '–'} | {lr:g} | {' | '.join(cells)} |")
    return lines


def mean_loss(runs: list[dict], key: tuple) -> float:
    """The seeds' mean held-out loss of one (parametrization, variant, lr, width); inf if any diverged."""
    losses = [r["loss"] for r in runs if (*(r[k] for k in KEY), r["width"]) == key]
    return statistics.mean(losses) if losses and all(map(math.isfinite, losses)) else math.inf


def transfer(runs: list[dict], widths: list[int]) -> list[str]:
    """The best LR's drift with width and the loss at the proxy's best LR, per parametrization and variant."""
    narrow, wide = widths[0], widths[-1]
    lines = [
        f"| parametrization | variant | best LR by width (mean loss) | each seed's best LR by width "
        f"| moved, width {narrow} → {wide} | loss by width at width {narrow}'s best LR |",
        "|---" * 6 + "|",
    ]
    for parametrization, variant in sorted({(r["parametrization"], r["variant"]) for r in runs}):
        mine = [r for r in runs if (r["parametrization"], r["variant"]) == (parametrization, variant)]
        grid = sorted({r["lr"] for r in mine})
        ran = {w: sorted({r["lr"] for r in mine if r["width"] == w}) for w in widths}  # a width may span less
        if len(grid) < 2 or not all(ran.values()):
            continue
        best = {w: min(ran[w], key=lambda lr: mean_loss(mine, (parametrization, variant, lr, w))) for w in widths}
        each = {
            seed: [min(ran[w], key=lambda lr: next((r["loss"] for r in mine if (r["seed"], r["lr"], r["width"])
                                                    == (seed, lr, w)), math.inf)) for w in widths]
            for seed in sorted({r["seed"] for r in mine})
        }  # fmt: skip
        cells = ", ".join(
            f"{best[w]:g} ({mean_loss(mine, (parametrization, variant, best[w], w)):.3f})" for w in widths
        )
        seeds = "; ".join(f"seed {seed}: {', '.join(f'{lr:g}' for lr in lrs)}" for seed, lrs in each.items())
        moved = grid.index(best[wide]) - grid.index(best[narrow])
        proxy = best[narrow]
        at_proxy = ", ".join(
            f"{mean_loss(mine, (parametrization, variant, proxy, w)):.3f}" if proxy in ran[w] else "not run"
            for w in widths
        )
        lines.append(
            f"| {parametrization} | {variant or '–'} | {cells} | {seeds} | {moved:+d} grid steps | {at_proxy} |"
        )
    return lines


def plot(runs: list[dict], widths: list[int], prefix: Path, steps: int, variants: list[str]) -> list[Path]:
    """Held-out loss against the LR, a line per width (the seeds' mean; each seed a dot), one file per
    parametrization, of the first of `variants` that it has runs of."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for parametrization in sorted({r["parametrization"] for r in runs}):
        ran = {r["variant"] for r in runs if r["parametrization"] == parametrization}
        variant = next((v for v in variants if v in ran), None)
        if variant is None:
            continue
        mine = [r for r in runs if r["parametrization"] == parametrization and r["variant"] == variant]
        fig, ax = plt.subplots(figsize=(6, 4))
        for width in widths:
            at = sorted({r["lr"] for r in mine if r["width"] == width})
            if not at:
                continue
            means = [mean_loss(mine, (parametrization, variant, lr, width)) for lr in at]
            (line,) = ax.plot(
                at, [m if math.isfinite(m) else math.nan for m in means], marker="o", label=f"width {width}"
            )
            dots = [(r["lr"], r["loss"]) for r in mine if r["width"] == width and math.isfinite(r["loss"])]
            ax.scatter(*zip(*dots, strict=True), s=10, alpha=0.4, color=line.get_color())
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel("learning rate (AdamW, batch 32)")
        ax.set_ylabel(f"held-out loss after {steps:,} steps")
        seeds = sorted({r["seed"] for r in mine})
        name = f"μP, base width {BASE_WIDTH}" if parametrization == "mup" else "standard parametrization"
        name += f" ({variant})" if variant else ""
        ax.set_title(f"{name}: {len(seeds)} seeds' mean (dots: each seed)")
        ax.grid(True, alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = prefix.with_name(f"{prefix.name}_{parametrization}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--keep", type=Path)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--widths", default="32,128")
    parser.add_argument("--lr", default="0.01", help="comma-separated learning rates")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--variants", default="", help="comma-separated; empty: μP as built")
    parser.add_argument("--parametrizations", default="mup")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--plot", type=Path, help="draw the loss against the LR to PREFIX_<parametrization>.png")
    parser.add_argument("--again", action="store_true", help="run nothing: the tables and plots of what is kept")
    args = parser.parse_args()
    if args.one:
        config = json.loads(args.one)
        torch.set_num_threads(1)
        print(json.dumps(config | {"loss": held_out_loss(**config)}))
        return
    if args.keep is None:
        parser.error("--keep is required")
    args.keep.mkdir(parents=True, exist_ok=True)
    kept = args.keep / "runs.jsonl"
    done = [json.loads(line) for line in kept.read_text().splitlines()] if kept.exists() else []
    widths = [int(w) for w in args.widths.split(",")]
    wanted = [
        {"parametrization": p, "width": w, "lr": float(lr), "steps": args.steps, "seed": int(s), "variant": v}
        for p in args.parametrizations.split(",") for v in args.variants.split(",") for lr in args.lr.split(",")
        for s in args.seeds.split(",") for w in widths
    ]  # fmt: skip
    todo = [c for c in wanted if not any(all(r[k] == c[k] for k in c) for r in done)]
    print(f"{len(wanted) - len(todo)} of {len(wanted)} runs kept in {kept}; running {0 if args.again else len(todo)}")
    if args.again:
        todo = []
    with ThreadPoolExecutor(args.parallel) as pool, open(kept, "a") as out:
        for result in pool.map(run_one, todo):
            out.write(json.dumps(result) + "\n")
            out.flush()
            done.append(result)
    runs = [r for r in done if any(all(r[k] == c[k] for k in c) for c in wanted)]
    print(f"\n{args.steps} steps; held-out loss, mean (per seed {args.seeds})")
    print("\n".join(table(runs, widths)))
    if len(args.lr.split(",")) > 1:
        print("\n" + "\n".join(transfer(runs, widths)))
    if args.plot:
        print(
            "\n".join(f"wrote {path}" for path in plot(runs, widths, args.plot, args.steps, args.variants.split(",")))
        )


if __name__ == "__main__":
    main()
