"""Python processes of the tests forked from one interpreter that imported torch once (issue 44).

The e2e pods that run python are torchrun agents (torch, torch._dynamo and the trainer's modules: about
5 CPU s of imports) or rendezvous stores (torch: about 2.5), and the process tests start trainers and
standalone torchrun agents by the dozen. Started as fresh interpreters, they spend more CPU importing
than training (tests/README.md, stop 56). So the pod runner (one zygote per PodRunner),
tests.integration.trainer_helpers.run_standalone and test_elastic's nodes and stores (one zygote per
pytest process) fork them from a zygote that has the libraries imported, as largebatch_trainer.forked
forks the trainers from their agent, and on the same grounds: the zygote runs no tensor operation and
no thread. test_real_node still starts its pods from their images, and every `lbctl run` its nodes as
the product does.

What a child gets that a fresh interpreter would have had:
- its environment, working folder, stdout and stderr (files) and a session of its own;
- the module it runs, executed afresh as `__main__`: the zygote imports libraries only, never the
  module a child runs, so settings a module reads from the environment at import
  (largebatch_trainer.torchrun's LARGEBATCH_EXIT_BARRIER_SECONDS) come from the child's;
- torch's intra-op threads set from its OMP_NUM_THREADS: OpenMP reads the variable once, when torch is
  loaded, which was in the zygote, with the zygote's environment;
- tempfile's folder looked up again (TMPDIR is the child's; tempfile caches the first one it finds).

`python -m tests.zygote` speaks JSON lines: a request {"module", "args", "env", "cwd", "stdout", "stderr"}
on stdin is answered with {"pid"} at once, and {"exited": pid, "code"} (negative for a signal, as Popen's
returncode) follows when that child ends. The end of stdin (the runner ended, or died) kills every
child's process group still running.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from tests.helpers import ROOT

MODULES = ("largebatch_trainer", "largebatch_trainer.torchrun", "largebatch_trainer.rendezvous")
"""The modules whose libraries the zygote imported; the pod runner starts any other command as a process
of its own."""


class Zygote:
    """The runner's end: start pods as children of the zygote, poll and wait for them."""

    def __init__(self, log: Path):
        self.log = log
        self._stderr = open(log, "ab")
        # Started now, so that its imports overlap with the job's first reconcile; waited for at the first pod.
        self.process = subprocess.Popen([sys.executable, "-m", "tests.zygote"], cwd=ROOT,
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

    def start(
        self, module: str, args: list[str], env: dict[str, str], cwd: Path, stdout: Path, stderr: Path | None = None
    ) -> Forked:
        """Run `python -m module args` forked; its stdout goes to `stdout`, its stderr there too unless given."""
        # A bound only against a zygote that hangs: its imports took 20 s on a loaded two-core machine.
        self._wait(lambda: self._ready, timeout=300)
        streams = {"stdout": str(stdout), "stderr": str(stderr or stdout)}
        request = {"module": module, "args": args, "env": env, "cwd": str(cwd), **streams}
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


_shared: Zygote | None = None


def shared() -> Zygote:
    """This process's zygote, started at the first call and ended with the process."""
    global _shared
    if _shared is None:
        _shared = Zygote(Path(tempfile.gettempdir()) / f"largebatch-zygote-{os.getpid()}.log")
        atexit.register(_shared.close)
    return _shared


class Forked:
    """The part of `subprocess.Popen` the pod runner and the process tests use, for a child of the zygote."""

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
            raise RuntimeError(f"the zygote ended before its child {self.pid}: {tail}")
        return self.returncode

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def send_signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):  # ended by itself meanwhile, as Popen's does
            os.kill(self.pid, signum)

    def kill(self) -> None:
        """SIGKILL the child's session (it and what it started), and wait for it."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.wait()


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
        for fd, name in ((1, "stdout"), (2, "stderr")):
            stream = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(stream, fd)
            os.close(stream)
        for stream in (sys.stdout, sys.stderr):  # PYTHONUNBUFFERED, as the pods' environment asks
            stream.reconfigure(line_buffering=True, write_through=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "OMP_NUM_THREADS" in os.environ:  # read by OpenMP when torch was loaded here, from our environment
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
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
