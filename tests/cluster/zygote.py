"""The pod runner's python pods forked from one interpreter that imported torch once (issue 44).

Every python pod of an e2e job is a torchrun agent (torch, torch._dynamo and the trainer's modules:
about 5 CPU s of imports) or a rendezvous store (torch: about 2.5). Started as fresh interpreters, the
e2e pods of one `make test` spent an estimated 300 CPU s importing them (tests/README.md, stop 56). A node starts
each pod from its image, and test_real_node does exactly that; here the pods of one PodRunner are forked
from this zygote, which has the libraries imported, as largebatch_trainer.forked forks the trainers
from their agent, and on the same grounds: the zygote runs no tensor operation and no thread.

What a child gets that a fresh interpreter would have had:
- the pod's environment, working folder, log (stdout and stderr) and a session of its own;
- the module it runs, executed afresh as `__main__`: the zygote imports libraries only, never a pod's
  module, so settings a module reads from the environment at import (largebatch_trainer.torchrun's
  LARGEBATCH_EXIT_BARRIER_SECONDS) come from the pod's;
- tempfile's folder looked up again (TMPDIR is the pod's; tempfile caches the first one it finds).

`python -m tests.cluster.zygote` speaks JSON lines: a request {"module", "args", "env", "cwd", "log"} on
stdin is answered with {"pid"} at once, and {"exited": pid, "code"} (negative for a signal, as Popen's
returncode) follows when that child ends. The end of stdin (the runner ended, or died) kills every
child's process group still running.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from tests.helpers import ROOT

MODULES = ("largebatch_trainer.torchrun", "largebatch_trainer.rendezvous")
"""The modules a pod may run forked; any other command is started as a process of its own."""


class Zygote:
    """The runner's end: start pods as children of the zygote, poll and wait for them."""

    def __init__(self, log: Path):
        self.log = log
        self._stderr = open(log, "ab")
        # Started now, so that its imports overlap with the job's first reconcile; waited for at the first pod.
        self.process = subprocess.Popen([sys.executable, "-m", "tests.cluster.zygote"], cwd=ROOT,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr)  # fmt: skip
        self._changed = threading.Condition()
        self._ready = False
        self._pids: list[int] = []  # answers to requests, in order (requests are sent one at a time)
        self._codes: dict[int, int] = {}
        self._send = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            with self._changed:
                if "ready" in message:
                    self._ready = True
                elif "pid" in message:
                    self._pids.append(message["pid"])
                else:
                    self._codes[message["exited"]] = message["code"]
                self._changed.notify_all()
        with self._changed:  # the zygote ended: nothing will come
            self._changed.notify_all()

    def _wait(self, condition, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: condition() or self.process.poll() is not None, timeout)

    def start(self, module: str, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> Forked:
        # A bound only against a zygote that hangs: its imports took 20 s on a loaded two-core machine.
        self._wait(lambda: self._ready, timeout=300)
        request = {"module": module, "args": args, "env": env, "cwd": str(cwd), "log": str(log)}
        with self._send:
            self.process.stdin.write(json.dumps(request).encode() + b"\n")
            self.process.stdin.flush()
            self._wait(lambda: self._pids, timeout=300)
            if not self._pids:
                raise RuntimeError(f"the zygote did not start {module}: {self.log.read_text()[-3000:]}")
            with self._changed:
                return Forked(self, self._pids.pop(0), [module, *args])

    def close(self) -> None:
        """End the zygote, which kills what it still runs, and wait for it."""
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()
        self.process.wait()
        self._reader.join(timeout=30)
        self._stderr.close()


class Forked:
    """The part of `subprocess.Popen` the pod runner uses, for a child of the zygote."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self._zygote._changed:
            self.returncode = self._zygote._codes.get(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._zygote._wait(lambda: self.pid in self._zygote._codes, timeout):
            raise subprocess.TimeoutExpired(self.args, timeout)
        if self.poll() is None:  # the zygote ended before it saw this child end
            tail = self._zygote.log.read_text()[-3000:]
            raise RuntimeError(f"the zygote ended before pod process {self.pid}: {tail}")
        return self.returncode


def main() -> None:
    # The libraries every python pod imports, once. Never a pod's own module (see the docstring).
    import kubernetes.client  # noqa: F401  (the trainers' status reports)
    import torch._dynamo  # noqa: F401
    from torch.distributed import run  # noqa: F401

    import largebatch_trainer.forked  # noqa: F401
    import largebatch_trainer.loop  # noqa: F401
    import largebatch_trainer.rejoin  # noqa: F401

    requests, answers = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)  # anything the zygote itself prints must not reach the protocol
    os.close(null)

    def answer(message: dict) -> None:
        os.write(answers, json.dumps(message).encode() + b"\n")

    answer({"ready": True})
    children: set[int] = set()
    pending = b""
    while True:
        ready, _, _ = select.select([requests], [], [], 0.1)
        if ready:
            data = os.read(requests, 1 << 16)
            if not data:
                break
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                pid = _fork(json.loads(line), (requests, answers))
                children.add(pid)
                answer({"pid": pid})
        for pid, code in _reap():
            children.discard(pid)
            answer({"exited": pid, "code": code})
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    for pid, code in _reap(block=True):
        with contextlib.suppress(BrokenPipeError):
            answer({"exited": pid, "code": code})


def _reap(block: bool = False):
    while True:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        yield pid, os.waitstatus_to_exitcode(status)


def _fork(request: dict, protocol: tuple[int, int]) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        for fd in protocol:
            os.close(fd)
        os.setsid()  # what start_new_session gives: the runner's killpg reaches the pod and its trainers
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED, as the pods' environment asks
            stream.reconfigure(line_buffering=True, write_through=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        import tempfile

        tempfile.tempdir = None
        import runpy

        sys.argv = ["", *request["args"]]
        try:
            runpy.run_module(request["module"], run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:  # as the interpreter ends on one: a number, nothing, or a message and 1
            if exc.code is None or isinstance(exc.code, int):
                code = exc.code or 0
            else:
                print(exc.code, file=sys.stderr)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    main()
