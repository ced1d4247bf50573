"""Sharded against replicated data parallel (`parallelism.dataParallel`), measured with the trainer itself
(gloo processes on this machine's CPUs; `--help` for the sizes):

1. Memory: each rank's parameters + gradients + AdamW state (the bytes of its tensors, its shard only when
   sharded) and its peak RSS, for a GPT of about 100M parameters at world 1, 2 and 4, `replicate` beside
   `shard`. Goal: shard ≤ replicate / world + 10%.
2. Checkpoint stall: the time training stops for one checkpoint, rank 0's synchronous save of the whole
   state (replicate) against every rank's asynchronous save of its shard (shard), at world 2: from before
   the save to the end of the step after it, on every rank, less a step's median time. Also how long the
   sharded save went on in the background.
3. Rescale pause, 2 → 3 ranks: the last checkpoint at world 2 (written whole: the stop waits for it) plus
   the new world's start to the end of its first step (model built and sharded, checkpoint loaded). The
   interpreter's start and the rendezvous, the same in both modes, are not in it.
4. Throughput at world 2 of a smaller GPT (steps after 3 warm-up ones), the two modes alternating runs.

    .venv/bin/python benchmarks/sharded.py [--width 1024 --depth 8] [--rounds 2]

Every measurement runs `torchrun --standalone` of this file's `--worker`, which builds the real Trainer and
calls its step and save; the results come back as one JSON file per rank.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
TORCHRUN = str(Path(sys.executable).with_name("torchrun"))


def job_document(args: dict, mode: str, batch: int, checkpoint_dir: str) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "sharded"},
        "spec": {
            "image": "bench",
            "task": {"entrypoint": "largebatch_trainer.tasks:pylm", "args": args},
            "workers": {"accelerator": "none"},
            "batch": {"initial": batch, "max": batch, "microBatchPerDevice": batch},
            "optimizer": {"name": "adamw", "lr": 1e-4, "weightDecay": 0.1},
            "schedule": {"totalSamples": batch * 10**6, "decay": "constant"},
            "checkpoint": {"path": checkpoint_dir, "everySteps": 10**9, "keep": 10},
            "parallelism": {"dataParallel": mode},
        },
    }


def tensor_bytes(tensors) -> int:
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]
    return sum(t.numel() * t.element_size() for t in local)


def worker(what: str, settings: dict, out: Path) -> None:
    """One rank of one measurement (`what`), its results into out/<rank>.json."""
    import torch
    import torch.distributed as dist

    from largebatch.api import LargeBatchJob
    from largebatch_trainer.loop import Options, Trainer

    rank = int(os.environ["RANK"])
    directory = Path(settings["checkpoints"])
    document = job_document(settings["args"], settings["mode"], settings["batch"], str(directory))
    job = LargeBatchJob.model_validate(document)
    started = time.perf_counter()
    trainer = Trainer(job, Options(checkpoint_dir=directory, metrics_port=None))
    grads: list[int] = []
    trainer.optimizer.register_step_pre_hook(
        lambda optimizer, *_: grads.append(tensor_bytes(p.grad for g in optimizer.param_groups for p in g["params"]))
    )

    def sync() -> None:
        if dist.is_initialized():
            dist.barrier()

    def step() -> float:
        sync()
        begun = time.perf_counter()
        trainer._step()
        sync()
        return time.perf_counter() - begun

    result: dict = {}
    if what == "resume":  # the first step of a new world, from the start of the trainer's construction
        step()
        result["resume_seconds"] = time.perf_counter() - started
    elif what == "save":  # the last checkpoint of the old world, waited for as a stopping worker waits
        step()
        sync()
        begun = time.perf_counter()
        trainer._save()
        trainer.wait_for_save()
        sync()
        result["save_seconds"] = time.perf_counter() - begun
    else:
        times = [step() for _ in range(settings["steps"])]
        params = [p for p in trainer.module.parameters()]
        state = [v for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
        result |= {
            "step_seconds": times[3:] or times,
            "parameters": sum(p.numel() for p in params) if trainer.scatter is None else None,
            "param_bytes": tensor_bytes(params),
            "grad_bytes": grads[-1],
            "optimizer_bytes": tensor_bytes(state),
        }
        if what == "stall":
            typical = statistics.median(times[1:])
            sync()
            begun = time.perf_counter()
            trainer._save()
            trainer._step()
            sync()
            result["stall_seconds"] = time.perf_counter() - begun - typical
            background = time.perf_counter()
            trainer.wait_for_save()
            result["background_seconds"] = time.perf_counter() - background
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    (out / f"{rank}.json").write_text(json.dumps(result))
    trainer.close(clean=True)


def launch(what: str, world: int, settings: dict) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        command = [TORCHRUN, "--standalone", f"--nproc-per-node={world}", str(HERE), "--worker", what]
        command += ["--settings", json.dumps(settings), "--out", str(out)]
        done = subprocess.run(command, env=env, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{' '.join(command[:6])} failed:\n{done.stderr[-4000:]}")
        return [json.loads((out / f"{rank}.json").read_text()) for rank in range(world)]


def gib(n: float) -> str:
    return f"{n / 2**30:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--settings", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=2, help="throughput runs of each mode, alternating")
    options = parser.parse_args()
    if options.worker:
        worker(options.worker, json.loads(options.settings), options.out)
        return
    big = {"width": options.width, "depth": options.depth, "heads": 8, "context": 32}
    scratch = tempfile.mkdtemp()
    print(f"1. memory per rank, pylm {big}, AdamW, batch 8 (replicate | shard)")
    print(f"{'world':>5} {'mode':>9} {'params GiB':>10} {'grads GiB':>9} {'AdamW GiB':>9} {'sum GiB':>8} "
          f"{'peak RSS GiB':>12}")  # fmt: skip
    totals = {}
    for world in map(int, options.worlds.split(",")):
        for mode in ("replicate", "shard"):
            settings = {"args": big, "mode": mode, "batch": 8, "steps": 2, "checkpoints": f"{scratch}/m-{mode}{world}"}
            ranks = launch("memory", world, settings)
            worst = max(ranks, key=lambda r: r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"])
            total = worst["param_bytes"] + worst["grad_bytes"] + worst["optimizer_bytes"]
            totals[mode, world] = total
            rss = max(r["peak_rss_bytes"] for r in ranks)
            print(f"{world:>5} {mode:>9} {gib(worst['param_bytes']):>10} {gib(worst['grad_bytes']):>9} "
                  f"{gib(worst['optimizer_bytes']):>9} {gib(total):>8} {gib(rss):>12}")  # fmt: skip
        ratio = totals["shard", world] / (totals["replicate", world] / world)
        print(f"      shard / (replicate / {world}) = {ratio:.3f} (goal <= 1.10)")
    count = launch("memory", 1, settings | {"mode": "replicate", "steps": 1})[0]["parameters"]
    print(f"   parameters: {count:,}")

    print("\n2. checkpoint stall at world 2, same model (seconds training stands still for one checkpoint)")
    for mode in ("replicate", "shard"):
        settings = {"args": big, "mode": mode, "batch": 8, "steps": 4, "checkpoints": f"{scratch}/s-{mode}"}
        ranks = launch("stall", 2, settings)
        stall = max(r["stall_seconds"] for r in ranks)
        step = statistics.median(ranks[0]["step_seconds"])
        background = max(r["background_seconds"] for r in ranks)
        print(f"   {mode:>9}: stall {stall:6.2f} s (a step {step:.2f} s); still writing after it {background:.2f} s")

    print(
        "\n3. rescale pause 2 -> 3 ranks, same model: the last save at 2 (waited for) + the new world's start to its "
        "first step"
    )
    for mode in ("replicate", "shard"):
        settings = {"args": big, "mode": mode, "batch": 12, "steps": 1, "checkpoints": f"{scratch}/r-{mode}"}
        save = max(r["save_seconds"] for r in launch("save", 2, settings))
        resume = max(r["resume_seconds"] for r in launch("resume", 3, settings))
        print(f"   {mode:>9}: {save + resume:6.2f} s = save {save:.2f} + start and first step {resume:.2f}")

    small = {"width": 512, "depth": 4, "heads": 8, "context": 64}
    print(f"\n4. throughput at world 2, pylm {small}, batch 32, 20 steps after 3 warm-up ones")
    rates: dict[str, list[float]] = {"replicate": [], "shard": []}
    for round_ in range(options.rounds):
        for mode in ("replicate", "shard"):
            folder = f"{scratch}/t-{mode}{round_}"
            settings = {"args": small, "mode": mode, "batch": 32, "steps": 23, "checkpoints": folder}
            rates[mode].append(32 / statistics.median(launch("throughput", 2, settings)[0]["step_seconds"]))
    for mode, values in rates.items():
        print(f"   {mode:>9}: {', '.join(f'{v:.1f}' for v in values)} samples/s")
    ratios = [s / r for s, r in zip(rates["shard"], rates["replicate"], strict=True)]
    print(f"   shard / replicate per round: {', '.join(f'{r:.3f}' for r in ratios)}")


if __name__ == "__main__":
    main()
