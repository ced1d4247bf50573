"""The tests' zygote (issue 44): trainers, torchrun agents and rendezvous stores forked from an
interpreter that imported torch once (largebatch.local.zygote, which `lbctl run --local` forks its nodes
from too).

The e2e pods that run python are torchrun agents (torch, torch._dynamo and the trainer's modules: about
5 CPU s of imports) or rendezvous stores (torch: about 2.5), and the process tests start trainers and
standalone torchrun agents by the dozen. Started as fresh interpreters, they spend more CPU importing
than training (tests/README.md, stop 56). So the pod runner (one zygote per PodRunner),
tests.integration.trainer_helpers.run_standalone and test_elastic's nodes and stores (one zygote per
pytest process) fork them from a zygote started as an interpreter of its own: a pytest process runs
threads, and a fork copies only the calling one. test_real_node still starts its pods from their images.
The end of a test's zygote SIGKILLs what it still runs.
"""

from __future__ import annotations

import atexit
import os
import tempfile
from pathlib import Path

from largebatch.local.nodes import AGENT_MODULES
from largebatch.local.zygote import Forked, Zygote

__all__ = ["MODULES", "Forked", "Zygote", "shared", "start"]

MODULES = ("largebatch_trainer", "largebatch_trainer.torchrun", "largebatch_trainer.rendezvous")
"""The modules whose libraries the zygote imported; the pod runner starts any other command as a process
of its own."""

PRELOAD = ("kubernetes.client", *AGENT_MODULES)  # kubernetes: the trainers' status reports
"""The libraries every python pod imports, once. Never a pod's own module (largebatch.local.zygote)."""


def start(log: Path) -> Zygote:
    """A zygote of its own, its output to `log`; it starts importing at once, so that its imports overlap
    with what the caller does next (a job's first reconcile)."""
    return Zygote.spawn(PRELOAD, log, kill_at_end=True)


_shared: Zygote | None = None


def shared() -> Zygote:
    """This process's zygote, started at the first call and ended with the process."""
    global _shared
    if _shared is None:
        log = Path(tempfile.gettempdir()) / f"largebatch-zygote-{os.getpid()}.log"
        _shared = start(log)
        atexit.register(lambda: (_shared.close(), log.unlink(missing_ok=True)))
    return _shared
