"""`python -m largebatch_trainer.rendezvous --port 29400`: the job's rendezvous store, hosted by no
worker, so that any worker can come and go (the job's rendezvous pod runs this; `lbctl run --local`
hosts the same store in its own process). Runs until SIGTERM."""

from __future__ import annotations

import argparse
import signal
import sys

import torch.distributed as dist


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="largebatch-rendezvous", description=__doc__)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=29400)
    args = parser.parse_args(argv)
    store = dist.TCPStore(args.host, args.port, is_master=True, wait_for_workers=False, multi_tenant=True)
    print(f"rendezvous store listening on {args.host}:{store.port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())
