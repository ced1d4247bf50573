"""Trainer overhead: the same model, batch and world size (2 gloo processes) in a plain torch DDP loop
and in largebatch's trainer (metrics served, noise scale measured), side by side in one run.

    .venv/bin/python benchmarks/trainer_overhead.py [--steps 200] [--block 10]

Both loops run in the same two processes, alternating blocks of steps (plain, trainer, plain, ...), so
that drift in the machine's speed hits both; the result is the median of the paired block ratios.
Target: the trainer within 3% of the plain loop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
TASK_ARGS = {"width": 128, "depth": 2, "heads": 4, "context": 64}
BATCH = 64


def job_document(steps: int, checkpoint_dir: str) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "overhead"},
        "spec": {
            "image": "bench",
            "task": {"entrypoint": "largebatch_trainer.tasks:pylm", "args": TASK_ARGS},
            "workers": {"min": 2, "max": 2, "accelerator": "none"},
            "batch": {"initial": BATCH, "max": BATCH, "microBatchPerDevice": BATCH // 2},
            "optimizer": {"name": "adamw", "lr": 1e-3, "weightDecay": 0.1},
            "schedule": {"totalSamples": BATCH * steps * 10, "warmupSamples": 0, "decay": "constant"},
            "checkpoint": {"path": checkpoint_dir, "everySteps": 10**9},
        },
    }


def worker(steps: int, block: int, out: str) -> None:
    """Both loops in the same two processes, alternating blocks of `block` steps, so that drift in
    the machine's speed hits both alike; each block is timed between barriers."""
    import torch
    import torch.distributed as dist

    from largebatch.api import LargeBatchJob
    from largebatch_trainer.data import SampleStream
    from largebatch_trainer.loop import Options, Trainer
    from largebatch_trainer.optim import parameter_groups
    from largebatch_trainer.tasks import load_task

    checkpoints = tempfile.mkdtemp()
    job = LargeBatchJob.model_validate(job_document(steps * 2, checkpoints))
    rank = int(os.environ["RANK"])
    trainer = Trainer(job, Options(checkpoint_dir=Path(checkpoints), metrics_port=9500 + rank))
    world = dist.get_world_size()

    task = load_task("largebatch_trainer.tasks:pylm", TASK_ARGS, seed=0)
    model = torch.nn.parallel.DistributedDataParallel(task.model)
    optimizer = torch.optim.AdamW(parameter_groups(task.model, 0.1), lr=1e-3)
    stream, per_rank, position = SampleStream(len(task.dataset), 0), BATCH // world, [0]

    def plain_step() -> None:
        batch = stream.batch(task.dataset, task.collate, position[0] + rank * per_rank, per_rank)
        position[0] += BATCH
        loss_sum, count = task.loss(model, batch)
        (loss_sum / count).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(step) -> float:
        dist.barrier()
        started = time.perf_counter()
        for _ in range(block):
            step()
        dist.barrier()
        return time.perf_counter() - started

    for _ in range(3):  # warm-up both
        plain_step()
        trainer._step()
    times: dict[str, list[float]] = {"plain": [], "largebatch": []}
    for _ in range(steps // block):
        times["plain"].append(timed(plain_step))
        times["largebatch"].append(timed(trainer._step))
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    trainer.close(clean=True)


def launch(steps: int, block: int) -> dict[str, list[float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        command = [TORCHRUN, "--standalone", "--nproc-per-node=2", str(HERE), "--worker"]
        command += ["--steps", str(steps), "--block", str(block), "--out", str(out)]
        subprocess.run(command, check=True, env=env, capture_output=True)
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=200, help="steps per loop")
    parser.add_argument("--block", type=int, default=10, help="steps per timed block")
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.block, args.out)
        return
    times = launch(args.steps, args.block)
    rate = {kind: [args.block * BATCH / t for t in blocks] for kind, blocks in times.items()}
    ratios = [p / ours for p, ours in zip(times["plain"], times["largebatch"], strict=True)]
    plain, ours = (statistics.median(rate[k]) for k in ("plain", "largebatch"))
    print(f"model: pylm {TASK_ARGS}, global batch {BATCH}, 2 gloo processes, {args.steps} steps each")
    print(f"plain DDP loop      median {plain:7.1f} samples/s")
    print(f"largebatch trainer  median {ours:7.1f} samples/s  (metrics served, noise scale measured)")
    print(
        f"throughput ratio trainer/plain: median of paired blocks {statistics.median(ratios):.3f} "
        f"(quartiles {statistics.quantiles(ratios, n=4)[0]:.3f} – {statistics.quantiles(ratios, n=4)[2]:.3f})"
    )


if __name__ == "__main__":
    main()
