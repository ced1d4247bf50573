"""`python -m tests.cluster up|down`: the test control plane by hand (make cluster-up / cluster-down)."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from tests.cluster.cluster import Cluster, stop_groups, tools


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--gpu-nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cpu-nodes", type=int, default=1)
    args = parser.parse_args()
    directory = args.dir.resolve()
    if args.action == "down":
        pids = directory / "pids"
        groups = [int(line.split()[1]) for line in pids.read_text().splitlines()] if pids.exists() else []
        stop_groups(groups)
        shutil.rmtree(directory, ignore_errors=True)
        print(f"cluster in {directory} stopped")
        return
    if (directory / "pids").exists():
        raise SystemExit(f"a cluster already runs from {directory}: make cluster-down first")
    shutil.rmtree(directory, ignore_errors=True)
    started = time.monotonic()
    cluster = Cluster(directory, tools())
    cluster.start(args.gpu_nodes, args.gpus_per_node, args.cpu_nodes)
    print(
        f"cluster ready in {time.monotonic() - started:.1f} s ({args.gpu_nodes} GPU nodes × {args.gpus_per_node} GPUs, "
        f"{args.cpu_nodes} CPU nodes); kubectl is {cluster.bin / 'kubectl'}"
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")


if __name__ == "__main__":
    main()
