"""Processes that die with their parent (Linux's PR_SET_PDEATHSIG), and a trainer process's name. A
trainer process whose torchrun agent was SIGKILLed would otherwise train on as an orphan, holding its
rank while a replacement node waits for a group it can never join; an agent of `lbctl run --local`
would outlive the runner that hosts its rendezvous store."""

from __future__ import annotations

import ctypes
import os
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
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


def name_process(name: str) -> None:
    """Show this process as `name` (at most 15 bytes) in top, `ps -o comm` and /proc/PID/comm. A trainer
    forked from its agent (largebatch_trainer.forked) keeps the agent's command line, so its name is
    what tells the two apart."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def parent_from(variable: str) -> int:
    """The parent pid a starting process was handed in `variable`, else the current parent's."""
    value = os.environ.get(variable, "")
    return int(value) if value.isdigit() else os.getppid()
