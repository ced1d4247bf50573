"""Why μP seemed not to transfer (issue 23): the built-in `pylm` trained directly (no `lbctl`, one thread
per run, several runs at a time), with the suspects switched one at a time, at several seeds, widths,
learning rates and run lengths; the held-out loss at the end of each run.

    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/sus --steps 300 --widths 32,128 --lr 0.01 \
        --seeds 0,1,2 --variants ,zerobias,spattn,qzero,eps1e-12          # the suspects, short runs
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/len --steps 1000 --widths 32,128 --lr 0.01 \
        --seeds 0,1,2                                                      # the run's length
    .venv/bin/python benchmarks/mup_suspects.py --keep /tmp/grid --steps 1000 --widths 32,128 --seeds 0,1 \
        --lr 0.0016,0.0036,0.0083,0.019,0.044 --parametrizations mup,standard   # the best LR's drift

A run is `pylm` (depth 2, 4 heads, context 64, base width 32), AdamW (no weight decay), batch 32,
warmup 5% and cosine to 10%, as `benchmarks/mup_transfer.py` trains its proxies; the loss is on 1,024
held-out windows. Variants (joined with +):
- `zerobias`: every bias starts at zero (nn.Linear draws them uniformly in ±1/√fan-in);
- `spattn`: the standard 1/√d_head attention scale instead of μP's 1/d_head;
- `qzero`: the query's weights and bias start at zero (TP5's suggestion: uniform attention at the start);
- `eps1e-12`: Adam's ε at 1e-12 instead of 1e-8 (the hidden layers' gradients shrink with width);
- `readout`: the readout drawn as the standard model draws it (std 0.02; μP's output multiplier still
  divides it by width / base width) instead of starting at zero.
Every finished run is kept in `--keep`/runs.jsonl and read back on the next call with the same folder.
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
VARIANTS = {"zerobias", "spattn", "qzero", "eps1e-12", "readout"}
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
            finite = [loss for _, loss in found if math.isfinite(loss)]
            mean = f"{statistics.mean(finite):.3f}" if len(finite) == len(found) and found else "diverged"
            cells.append(f"{mean} ({', '.join(f'{loss:.3f}' for _, loss in found)})")
        lines.append(f"| {parametrization} | {variant or '–'} | {lr:g} | {' | '.join(cells)} |")
    return lines


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
    print(f"{len(wanted) - len(todo)} of {len(wanted)} runs kept in {kept}; running {len(todo)}", flush=True)
    with ThreadPoolExecutor(args.parallel) as pool, open(kept, "a") as out:
        for result in pool.map(run_one, todo):
            out.write(json.dumps(result) + "\n")
            out.flush()
            done.append(result)
    runs = [r for r in done if any(all(r[k] == c[k] for k in c) for c in wanted)]
    print(f"\n{args.steps} steps; held-out loss, mean (per seed {args.seeds})")
    print("\n".join(table(runs, widths)))


if __name__ == "__main__":
    main()
