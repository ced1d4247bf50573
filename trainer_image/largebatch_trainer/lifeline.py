"""Processes that die with their parent (Linux's PR_SET_PDEATHSIG). A trainer process whose torchrun
agent was SIGKILLed would otherwise train on as an orphan, holding its rank while a replacement node
waits for a group it can never join; an agent of `lbctl run --local` would outlive the runner that hosts
its rendezvous store."""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent(signum: int) -> None:
    """Have the kernel send `signum` to this process when its parent exits; exit at once if the parent
    is already gone (it died before the request was made)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os.kill(os.getpid(), signum)
