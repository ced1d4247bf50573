"""`python -m tests.cluster up|down`: the test control plane by hand (make cluster-up / cluster-down).
`up --real-node` adds the real node (tests/cluster/node.py, as root); images reach it with
`docker save IMAGE | ctr --address <dir>/node/containerd.sock -n k8s.io images import -`."""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

from tests.cluster import node
from tests.cluster.cluster import Cluster, stop_groups, tools


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster")
    parser.add_argument("action", choices=["up", "down"])
    parser.add_argument("--dir", type=Path, default=Path(".cluster"))
    parser.add_argument("--gpu-nodes", type=int, default=2)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--cpu-nodes", type=int, default=1)
    parser.add_argument("--real-node", action="store_true", help="a kubelet with containerd (as root)")
    args = parser.parse_args()
    directory = args.dir.resolve()
    if args.action == "down":
        pids = directory / "pids"
        groups = dict(line.split() for line in pids.read_text().splitlines()) if pids.exists() else {}
        if "kubelet" in groups:  # the real node: the kubelet, then its pods' containers
            stop_groups([int(groups.pop("kubelet"))])
            node.remove_containers(directory / "node" / "containerd.sock")
        stop_groups([int(pid) for pid in groups.values()])
        if (directory / "node").exists():
            node.unmount_under(directory / "node")  # the kubelet's root, which it bind-mounts onto itself
            node.clean_host(tools())
        shutil.rmtree(directory, ignore_errors=True)
        print(f"cluster in {directory} stopped")
        return
    if (directory / "pids").exists():
        raise SystemExit(f"a cluster already runs from {directory}: make cluster-down first")
    shutil.rmtree(directory, ignore_errors=True)
    started = time.monotonic()
    cluster = Cluster(directory, tools())
    real_node = node.RealNode if args.real_node else None
    cluster.start(args.gpu_nodes, args.gpus_per_node, args.cpu_nodes, real_node=real_node)
    if args.real_node:
        print(
            f"real node {node.NAME}: pods with the toleration {node.TOLERATION} and the selector {node.SELECTOR}; "
            f"load an image with  docker save IMAGE | ctr --address {cluster.node.socket} -n k8s.io images import -"
        )
    print(
        f"cluster ready in {time.monotonic() - started:.1f} s ({args.gpu_nodes} GPU nodes × {args.gpus_per_node} GPUs, "
        f"{args.cpu_nodes} CPU nodes); kubectl is {cluster.bin / 'kubectl'}"
    )
    print(f"export KUBECONFIG={cluster.kubeconfig}")


if __name__ == "__main__":
    main()
