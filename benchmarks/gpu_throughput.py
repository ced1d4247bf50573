"""GPU throughput: `pylm` at a GPU-sized width on one GPU, in a plain torch loop and in largebatch's
trainer side by side in one process; model FLOPs utilisation against the GPU's bf16 peak; the cost of
gradient accumulation at the same global batch; and the host synchronisations of a backward pass under
the trainer's DDP communication hook.

    .venv/bin/python benchmarks/gpu_throughput.py            # one CUDA GPU: width 1024, depth 12, context 1024, bf16
    .venv/bin/python benchmarks/gpu_throughput.py --smoke    # CPU, tiny model, fp32: keeps the script working

As in trainer_overhead.py, the loops alternate blocks of steps (plain, trainer, trainer with
accumulation, plain, ...), so that drift in the machine's speed hits all alike, and each ratio is the
median of the ratios within a round. The plain loop is the same model with the same initial weights,
data path (pinned-memory copies), parameter groups, fused AdamW and bf16 autocast, one optimizer step
per global batch, and no host synchronisation per step. MFU counts PaLM's model FLOPs per token,
6N + 12·L·d·T (N the parameters of the matmuls, so not the embeddings; L layers, width d, context T;
the full attention matrix, of which a causal kernel computes about half) against the dense bf16 peak
of the GPU, from the table below or `--peak-tflops`. Goals (issue #14): trainer/plain >= 0.97,
accumulation 4 no more than 2% slower per sample than accumulation 1, MFU >= 40% on an H100/H200.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist

from largebatch.api import LargeBatchJob
from largebatch_trainer import accelerator, optim
from largebatch_trainer.data import SampleStream, to_device
from largebatch_trainer.loop import Options, Trainer
from largebatch_trainer.reduction import data_parallel
from largebatch_trainer.tasks import Task, load_task

# Dense bf16 tensor-core peaks (no sparsity) in TFLOP/s, from NVIDIA's data sheets, by a substring of
# `torch.cuda.get_device_name()`; the first match wins, so the more specific names come first.
BF16_PEAK_TFLOPS = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
]
ENTRYPOINT = "largebatch_trainer.tasks:pylm"

ROWS = {
    "plain": "plain torch loop, tokens/s",
    "trainer": "largebatch trainer, tokens/s",
    "ratio": "trainer / plain (median of rounds; goal >= 0.97)",
    "mfu": "MFU of the trainer",
    "accumulation": "accumulation {acc} / 1 at the same global batch, time per sample (goal <= 1.02)",
    "hook_syncs": "host syncs in a backward pass under the comm hook (fp32 / bf16 all-reduce)",
    "step_syncs": "host syncs per trainer step (accumulation 1 / {acc})",
    "flash": "SDPA flash-attention kernel runs this model",
}


def peak_tflops(device: torch.device, override: float | None) -> tuple[float | None, str]:
    if override:
        return override, f"{override:g} TFLOP/s bf16 (--peak-tflops)"
    if device.type != "cuda":
        return None, "no bf16 peak for a CPU (--peak-tflops sets one)"
    name = torch.cuda.get_device_name(device)
    for key, tflops in BF16_PEAK_TFLOPS:
        if key in name:
            return tflops, f"{tflops:g} TFLOP/s dense bf16 ({name})"
    return None, f"no bf16 peak known for {name} (--peak-tflops sets one)"


def flops_per_token(model: torch.nn.Module, depth: int, width: int, context: int) -> float:
    """PaLM's 6N + 12·L·d·T, N counting the parameters that enter matmuls (no embeddings)."""
    matmul = sum(p.numel() for name, p in model.named_parameters() if name not in ("tokens.weight", "positions"))
    return 6 * matmul + 12 * depth * width * context


def job_document(args: argparse.Namespace, micro: int, checkpoints: str, gpu: bool) -> dict:
    return {
        "apiVersion": "largebatch.io/v1alpha1",
        "kind": "LargeBatchJob",
        "metadata": {"name": "gpu-throughput"},
        "spec": {
            "image": "bench",
            "task": {"entrypoint": ENTRYPOINT, "args": task_args(args), "compile": args.compile},
            "workers": {"accelerator": "nvidia.com/gpu" if gpu else "none"},
            "precision": args.precision,
            "batch": {"initial": args.batch, "max": args.batch, "microBatchPerDevice": micro},
            "optimizer": {"name": "adamw", "lr": 3e-4, "weightDecay": 0.1},
            "schedule": {"totalSamples": 10**12, "decay": "constant"},
            "checkpoint": {"path": checkpoints, "everySteps": 10**9},
        },
    }


def task_args(args: argparse.Namespace) -> dict:
    return {"width": args.width, "depth": args.depth, "heads": args.heads, "context": args.context}


class PlainLoop:
    """The baseline: what a user would write by hand for the same model and batch."""

    def __init__(self, args: argparse.Namespace, device: torch.device):
        self.task: Task = load_task(ENTRYPOINT, task_args(args), seed=0)
        self.model = self.task.model.to(device)
        if args.compile:
            self.model.compile()
        groups = optim.parameter_groups(self.model, 0.1)
        groups = [{k: v for k, v in g.items() if k != "adam"} for g in groups]
        self.optimizer = torch.optim.AdamW(groups, lr=3e-4, fused=device.type == "cuda" or None)
        self.stream, self.position = SampleStream(len(self.task.dataset), 0), 0
        self.batch, self.device, self.precision = args.batch, device, args.precision

    def step(self) -> None:
        data = self.stream.batch(self.task.dataset, self.task.collate, self.position, self.batch)
        self.position += self.batch
        with accelerator.autocast(self.device, self.precision):
            loss_sum, _ = self.task.loss(self.model, to_device(data, self.device))
        (loss_sum.float() / self.batch).backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(step, block: int, device: torch.device) -> float:
    synchronize(device)
    started = time.perf_counter()
    for _ in range(block):
        step()
    synchronize(device)
    return time.perf_counter() - started


def hook_syncs(model: torch.nn.Module, task: Task, device: torch.device, precision: str) -> list[int]:
    """Host syncs of one backward pass of `model` under DDP with the trainer's hook, in a process group
    of one rank, for each all-reduce dtype (after two warm-up passes: DDP rebuilds its buckets once)."""
    dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1, device_id=device)
    counts = []
    try:
        data = to_device(task.collate([task.dataset[i] for i in range(4)]), device)
        for all_reduce in ("fp32", "bf16"):
            ddp, _ = data_parallel(model, device, all_reduce)
            for attempt in range(3):
                with accelerator.autocast(device, precision):
                    loss_sum, _ = task.loss(ddp, data)
                if attempt < 2:
                    loss_sum.backward()
                else:
                    counts.append(accelerator.count_host_syncs(loss_sum.backward))
                model.zero_grad(set_to_none=True)
            del ddp
    finally:
        dist.destroy_process_group()
    return counts


def flash_runs(model: torch.nn.Module, task: Task, device: torch.device, precision: str) -> bool:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    data = to_device(task.collate([task.dataset[0]]), device)
    try:
        with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION), accelerator.autocast(device, precision):
            task.loss(model, data)
    except RuntimeError:
        return False
    return True


def measure(args: argparse.Namespace) -> dict:
    gpu = not args.smoke
    if gpu and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here: run on a GPU, or pass --smoke to check the script on the CPU")
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    checkpoints = tempfile.mkdtemp()
    trainers = {}
    for name, micro in (("trainer", args.batch), ("accumulation", args.batch // args.accumulation)):
        job = LargeBatchJob.model_validate(job_document(args, micro, checkpoints + "/" + name, gpu))
        trainers[name] = Trainer(job, Options(checkpoint_dir=Path(checkpoints) / name, device=device.type))
    assert trainers["trainer"].precision == args.precision
    plain = PlainLoop(args, device)
    steps = {"plain": plain.step, "trainer": trainers["trainer"]._step, "accumulation": trainers["accumulation"]._step}
    for step in steps.values():
        for _ in range(args.warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(args.steps // args.block):
        for name, step in steps.items():
            times[name].append(timed(step, args.block, device))
    tokens = args.block * args.batch * args.context
    result = {
        "plain": statistics.median(tokens / t for t in times["plain"]),
        "trainer": statistics.median(tokens / t for t in times["trainer"]),
        "ratio": statistics.median(p / t for p, t in zip(times["plain"], times["trainer"], strict=True)),
        "accumulation": statistics.median(a / t for a, t in zip(times["accumulation"], times["trainer"], strict=True)),
        "flops_per_token": flops_per_token(plain.model, args.depth, args.width, args.context),
        "device": torch.cuda.get_device_name(device) if gpu else "CPU",
    }
    peak, result["peak"] = peak_tflops(device, args.peak_tflops)
    result["mfu"] = result["trainer"] * result["flops_per_token"] / (peak * 1e12) if peak else None
    if gpu:
        counts = [accelerator.count_host_syncs(t._step) for t in (trainers["trainer"], trainers["accumulation"])]
        result["step_syncs"] = counts
        result["flash"] = flash_runs(plain.model, plain.task, device, args.precision)
        result["hook_syncs"] = hook_syncs(plain.model, plain.task, device, args.precision)
    return result


def table(args: argparse.Namespace, result: dict) -> str:
    acc = args.accumulation
    smoke = " (CPU smoke run: says nothing about GPU performance)" if args.smoke else ""
    peak = result["peak"]
    mfu = f"{100 * result['mfu']:.1f}% (peak {peak})" if result["mfu"] else f"not reported: {peak}"
    lines = [
        f"pylm {task_args(args)}, {result['flops_per_token'] / 1e6:.1f} MFLOP/token (6N + 12·L·d·T); global batch "
        f"{args.batch} sequences; {result['device']}{smoke}; {args.precision}"
        f"{', torch.compile' if args.compile else ''}; {args.steps} steps per loop in blocks of {args.block}",
        "",
        "| measure | value |",
        "|---|---|",
        f"| {ROWS['plain']} | {result['plain']:.1f} |",
        f"| {ROWS['trainer']} | {result['trainer']:.1f} |",
        f"| {ROWS['ratio']} | {result['ratio']:.3f} |",
        f"| {ROWS['mfu']} | {mfu} |",
        f"| {ROWS['accumulation'].format(acc=acc)} | {result['accumulation']:.3f} |",
    ]
    if "hook_syncs" in result:
        lines += [
            f"| {ROWS['hook_syncs']} | {' / '.join(map(str, result['hook_syncs']))} |",
            f"| {ROWS['step_syncs'].format(acc=acc)} | {' / '.join(map(str, result['step_syncs']))} |",
            f"| {ROWS['flash']} | {'yes' if result['flash'] else 'no'} |",
        ]
    else:
        lines.append(f"| {ROWS['hook_syncs']} | not measured: needs a CUDA device |")
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU, width 64, depth 2, context 64, fp32, 20 steps")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=12)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32, help="global batch in sequences")
    parser.add_argument("--accumulation", type=int, default=4, help="compared with accumulation 1")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per loop")
    parser.add_argument("--block", type=int, default=10, help="steps per timed block")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per loop first")
    parser.add_argument("--precision", choices=["bf16", "fp32"], default=None, help="default bf16 (fp32 with --smoke)")
    parser.add_argument("--compile", action="store_true", help="task.compile: true, and the plain loop compiled")
    parser.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, where the table has none")
    args = parser.parse_args(argv)
    if args.smoke:
        args.width, args.depth, args.heads, args.context, args.batch = 64, 2, 4, 64, 8
        args.steps, args.block, args.warmup = 20, 5, 2
    args.precision = args.precision or ("fp32" if args.smoke else "bf16")
    if args.batch % args.accumulation:
        parser.error(f"--batch {args.batch} must be a multiple of --accumulation {args.accumulation}")
    if args.steps < args.block:
        parser.error(f"--steps {args.steps} must be at least --block {args.block}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    result = measure(args)
    for key in ("plain", "trainer", "ratio", "accumulation"):
        if not (math.isfinite(result[key]) and result[key] > 0):
            sys.exit(f"{ROWS[key]}: measured {result[key]}")
    print(table(args, result))


if __name__ == "__main__":
    main()
