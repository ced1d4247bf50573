"""Processes that die with their parent (Linux's PR_SET_PDEATHSIG). A trainer process whose torchrun
agent was SIGKILLed would otherwise train on as an orphan, holding its rank while a replacement node
waits for a group it can never join; an agent of `lbctl run --local` would outlive the runner that hosts
its rendezvous store."""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1
# The torchrun agent's pid, in its workers' environment.
AGENT_PID = "LARGEBATCH_AGENT_PID"


def die_with_parent(signum: int, parent: int) -> None:
    """Have the kernel send `signum` to this process when its parent exits; take it at once if the
    parent is no longer `parent` (the pid that started us, handed down by it: a parent that died during
    our start-up, before the request, is not seen otherwise)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)


def parent_from(variable: str) -> int:
    """The parent pid a starting process was handed in `variable`, else the current parent's."""
    value = os.environ.get(variable, "")
    return int(value) if value.isdigit() else os.getppid()
