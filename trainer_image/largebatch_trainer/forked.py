"""Trainer processes forked from their torchrun agent instead of started as fresh interpreters.

torchrun starts every worker of a `-m module` command as a new `python -u -m largebatch_trainer ...`
process, which imports torch again: 3 to 4 s of CPU with the CUDA build (`python -X importtime -c
"import torch"`), plus the trainer's own modules, paid by every rank at every start of the worker group,
and the group restarts at every membership change. The agent has already imported torch, so a child
forked from it, with the trainer's modules imported once beforehand, starts training at once
(benchmarks/README.md, "Worker start").

Fork is safe here because the agent has not started what a forked child cannot inherit: it runs no
tensor operation that would start an OpenMP pool, the child uses none of the agent's threads (its
rendezvous keep-alive, its store client), and it does not touch CUDA (the trainer does, in the child):
should anything in the agent ever load the CUDA driver, which a forked child cannot use, the workers
are started as torchrun starts them instead.

torchrun's SubprocessHandler only polls, waits for and signals the process `_popen` returns;
`ForkedTrainer` is that much of a `subprocess.Popen`, with the same exit codes (negative for a signal),
its own session (what `start_new_session` gives, so the agent's `killpg` reaches it), the environment
and output files the agent chose. Any other command (a user's own `-m` module, numactl in front) is
started as torchrun would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import traceback

from torch.distributed.elastic.multiprocessing import api as processes
from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler

MODULE = "largebatch_trainer"
WORKER_START = "LARGEBATCH_WORKER_START"
"""`fork` (the default) or `exec`: the way back to torchrun's own start, should a platform need it."""

# The agent's handlers (torchrun turns these into an exception that stops the agent) are not the trainer's.
_DEFAULT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def install() -> None:
    """Have this torchrun agent fork its `largebatch_trainer` workers on Linux, unless WORKER_START says
    exec (elsewhere fork is less safe, macOS's system libraries above all, and nothing here measured it)."""
    if os.environ.get(WORKER_START, "fork") != "fork" or not sys.platform.startswith("linux"):
        return
    # Imported once here and inherited by every worker. torch._dynamo too: every torch optimizer imports it
    # when it is built (about 2 s of CPU), and nothing in it starts a thread or touches the GPU.
    import torch._dynamo  # noqa: F401

    import largebatch_trainer.loop  # noqa: F401

    processes.get_subprocess_handler = Handler


class Handler(SubprocessHandler):
    def _popen(self, args: tuple, env: dict[str, str]):
        if tuple(args[1:4]) != ("-u", "-m", MODULE) or _cuda_driver_loaded():
            return super()._popen(args, env)
        return ForkedTrainer(list(args), env, self._stdout, self._stderr)


class ForkedTrainer:
    """The part of `subprocess.Popen` that torchrun uses, for a trainer forked from this process."""

    def __init__(self, args: list[str], env: dict[str, str], stdout, stderr):
        self.args = args
        self.returncode: int | None = None
        sys.stdout.flush()  # or the child would write the agent's buffered output a second time
        sys.stderr.flush()
        ready, in_session = os.pipe()
        # Blocked across the fork: a signal must find the trainer's dispositions, never the agent's.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFAULT_SIGNALS)
        self.pid = os.fork()
        if self.pid == 0:
            os.close(ready)
            _run_trainer(args[4:], env, stdout, stderr, in_session, blocked)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        # As Popen does, return once the child leads its session: torchrun may killpg it at once.
        os.close(in_session)
        os.read(ready, 1)  # end of file: the child has closed its end, or died
        os.close(ready)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _cuda_driver_loaded() -> bool:
    """Whether this process has loaded libcuda, which the CUDA runtime does at its first call."""
    with open("/proc/self/maps") as maps:
        return any("libcuda.so" in line for line in maps)


def _run_trainer(argv: list[str], env: dict[str, str], stdout, stderr, in_session: int, mask: set) -> None:
    """In the child: become `python -u -m largebatch_trainer ARGV` and never return into the agent;
    close `in_session` once in a session of its own, and take signals again (`mask`) once they find
    their default dispositions."""
    code = 1
    try:
        os.setsid()
        os.close(in_session)
        for signum in _DEFAULT_SIGNALS:
            signal.signal(signum, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for stream, target in ((stdout, 1), (stderr, 2)):
            if stream is not None:
                os.dup2(stream.fileno(), target)
        sys.stdout.reconfigure(line_buffering=True)  # what -u gives a fresh interpreter
        sys.stderr.reconfigure(line_buffering=True)
        os.environ.clear()
        os.environ.update(env)
        _threads_after_fork()
        sys.argv = [MODULE, *argv]
        from largebatch_trainer.main import run

        run()  # leaves through os._exit once the run is over
        code = 0
    except SystemExit as exc:  # argparse's, or a JobError's message (main.run)
        code = _exit_code(exc.code)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _threads_after_fork() -> None:
    """The worker's own thread count, set here, on its only thread. A fork leaves torch's thread pool to
    be rebuilt by the first thread that sets a thread count, and every thread the autograd engine starts
    sets one: two starting at once (a sharded model's first backward pass) could rebuild it together, one
    finding no pool ("Invalid thread pool!", an abort). Rebuilt here first, they find it whole."""
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", torch.get_num_threads())))


def _exit_code(code) -> int:
    """What the interpreter makes of `SystemExit(code)`: a message goes to stderr and exits 1."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1
