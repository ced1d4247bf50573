"""Python processes forked from a zygote: a process that imported the heavy libraries once and forks a
child for each request, where a fresh interpreter would import them again.

`lbctl run --local` starts every node as a torchrun agent, which imports torch, torch._dynamo and the
trainer before it does anything: 5 to 9 s of CPU per node with the CUDA build, paid again by every node
the run starts (a replacement, a scale-up) and felt as the seconds before a new node joins. So the
runner forks its zygote from itself (`Zygote.fork`) once it has imported torch, before it starts a
thread or runs a tensor operation: the zygote imports the agent's other modules and forks each node's
agent from there (docs/architecture.md, "Local nodes"). The tests start theirs as an interpreter of its
own (`Zygote.spawn`) and fork their trainers, agents and stores from it.

Fork is safe on the grounds largebatch_trainer.forked gives for the trainers an agent forks: the zygote
runs no tensor operation, no thread of its own, and never touches CUDA.

What a child gets that a fresh interpreter (`subprocess.Popen`) would have had:
- its environment, working folder, stdout and stderr (files), a session of its own, and the file
  descriptors the request passes (`pass_fds`: the run directory's lock);
- the module it runs, executed afresh as `__main__`: the zygote imports libraries only, never the
  module a child runs, so settings a module reads from the environment at import come from the child's;
- torch's intra-op threads set from its OMP_NUM_THREADS: OpenMP reads the variable once, when torch is
  loaded, which was before the zygote existed, with another environment;
- tempfile's folder looked up again (TMPDIR is the child's; tempfile caches the first one it finds).

The two ends speak over a socket pair: a request {"module", "args", "env", "cwd", "stdout", "stderr"}
(and its file descriptors) is answered with {"pid"} at once, and {"exited": pid, "code"} (negative for
a signal, as Popen's returncode) follows when that child ends. The end of the socket (the runner
ended, or died) ends the zygote; its children then take their own way out (a node's agent dies with
its parent: largebatch_trainer.lifeline), or are SIGKILLed with their sessions where `kill_at_end` says so.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path

# A request carries the child's whole environment; a datagram of the socket pair holds up to this much.
MESSAGE_BYTES = 1 << 20
# At most as many descriptors as a request passes (the run directory's lock is one).
MAX_FDS = 16
# A bound only against a zygote that hangs: its imports took 20 s on a loaded two-core machine.
READY_SECONDS = 300.0


class ZygoteGone(RuntimeError):
    """The zygote ended (killed, or its imports failed); what it logged says why."""


class Zygote:
    """The client's end: start children of the zygote, poll and wait for them."""

    def __init__(self, pid: int, channel: socket.socket, describe: Callable[[], str], process=None):
        self.pid, self._channel, self._describe, self._process = pid, channel, describe, process
        self._changed = threading.Condition()
        self._ready = False
        self._ended = False
        self._error = ""  # the traceback of imports that failed
        self._pids: list[int] = []  # answers to requests, in order (requests are sent one at a time)
        self._codes: dict[int, int] = {}
        self._send = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @classmethod
    def fork(cls, preload: Sequence[str], name: str = "") -> Zygote:
        """Fork the zygote from this process, which must run no thread of its own and no tensor operation
        yet (the kernel copies only the calling thread; an OpenMP pool would not survive). It imports
        `preload`; errors it meets go to the caller's first `start`. `name`: the zygote's in top and ps
        (it keeps our command line)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sys.stdout.flush()  # or the zygote would write our buffered output a second time
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                ours.close()
                os.setsid()  # Ctrl-C in the terminal is the runner's to handle, not ours
                if name:
                    from largebatch.trainer_facade import name_process

                    name_process(name)
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # the runner's output is a terminal or a pipe a caller reads to its end
                    os.dup2(null, fd)
                os.close(null)
                serve(theirs, preload, kill_at_end=False)
                code = 0
            finally:
                os._exit(code)
        theirs.close()
        return cls(pid, ours, lambda: "")

    @classmethod
    def spawn(cls, preload: Sequence[str], log: Path, kill_at_end: bool = True) -> Zygote:
        """Start the zygote as an interpreter of its own (`python -m largebatch.local.zygote`), its own
        output to `log`; it starts importing at once. `kill_at_end`: its children's sessions are SIGKILLed
        when this end goes."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        command = [sys.executable, "-m", "largebatch.local.zygote", "--fd", str(theirs.fileno()),
                   *(["--kill-at-end"] if kill_at_end else []), *preload]  # fmt: skip
        with open(log, "ab") as output:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                                       pass_fds=(theirs.fileno(),), start_new_session=True)  # fmt: skip
        theirs.close()
        return cls(process.pid, ours, lambda: log.read_text(errors="replace")[-3000:], process)

    def _read(self) -> None:
        while True:
            try:
                data = self._channel.recv(MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                break
            message = json.loads(data)
            with self._changed:
                if "ready" in message:
                    self._ready = True
                elif "pid" in message:
                    self._pids.append(message["pid"])
                elif "error" in message:
                    self._error = message["error"]
                else:
                    self._codes[message["exited"]] = message["code"]
                self._changed.notify_all()
        with self._changed:  # the zygote ended: nothing will come
            self._ended = True
            self._changed.notify_all()

    @property
    def alive(self) -> bool:
        with self._changed:
            return not self._ended

    def _wait(self, condition, timeout: float | None) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: condition() or self._ended, timeout)

    def _gone(self, what: str) -> ZygoteGone:
        said = self._error or self._describe()
        return ZygoteGone(f"the zygote (pid {self.pid}) ended before {what}" + (f": {said}" if said else ""))

    def start(
        self,
        module: str,
        args: list[str],
        env: dict[str, str],
        cwd: Path,
        stdout: Path,
        stderr: Path | None = None,
        pass_fds: Sequence[int] = (),
    ) -> Forked:
        """Run `python -m module args` forked; its stdout goes to `stdout`, its stderr there too unless
        given; it holds `pass_fds` as Popen's child would. ZygoteGone if the zygote has ended."""
        self._wait(lambda: self._ready, timeout=READY_SECONDS)
        streams = {"stdout": str(stdout), "stderr": str(stderr or stdout)}
        request = {"module": module, "args": args, "env": env, "cwd": str(cwd), **streams}
        with self._send:
            try:
                socket.send_fds(self._channel, [json.dumps(request).encode()], list(pass_fds))
            except OSError:
                raise self._gone(f"starting {module}") from None
            self._wait(lambda: self._pids, timeout=READY_SECONDS)
            with self._changed:
                if not self._pids:
                    raise self._gone(f"starting {module}")
                return Forked(self, self._pids.pop(0), [module, *args])

    def close(self) -> None:
        """End the zygote and wait for it (`kill_at_end`: it kills what it still runs first)."""
        with contextlib.suppress(OSError):
            self._channel.shutdown(socket.SHUT_RDWR)
        self._reader.join(timeout=30)
        self._channel.close()
        if self._process is not None:
            self._process.wait()
        else:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)


class Forked:
    """The part of `subprocess.Popen` the local runner and the tests use, for a child of the zygote."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self._zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        with self._zygote._changed:
            self.returncode = self._zygote._codes.get(self.pid)
            if self.returncode is None and self._zygote._ended and not _running(self.pid):
                # The zygote went first: the child was reparented, and its code went to its new parent.
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            if self._zygote.alive:
                self._zygote._wait(lambda: self.pid in self._zygote._codes, left)
            else:  # the zygote went first: the child's own end, looked for in /proc
                time.sleep(0.1)
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


def _running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# --- the zygote's end --------------------------------------------------------------------------------


def serve(channel: socket.socket, preload: Sequence[str], kill_at_end: bool) -> None:
    """Import `preload`, then fork a child for each request until the other end goes."""

    def answer(message: dict) -> None:
        with contextlib.suppress(OSError):  # the other end went: nobody is listening
            channel.send(json.dumps(message).encode())

    try:
        for module in preload:
            importlib.import_module(module)
    except BaseException:
        answer({"error": traceback.format_exc()})
        raise
    answer({"ready": True})
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([channel], [], [], 0.1)
        if ready:
            data, fds, _, _ = socket.recv_fds(channel, MESSAGE_BYTES, MAX_FDS)
            if not data:
                break
            pid = _fork(json.loads(data), channel)
            for fd in fds:  # the child holds them now
                os.close(fd)
            children.add(pid)
            answer({"pid": pid})
        for pid, code in _reap():
            children.discard(pid)
            answer({"exited": pid, "code": code})
    if kill_at_end:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        for pid, code in _reap(block=True):
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


def _fork(request: dict, channel: socket.socket) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        channel.close()
        os.setsid()  # what start_new_session gives: a killpg of the child reaches what it starts
        for fd, name in ((1, "stdout"), (2, "stderr")):
            stream = os.open(request[name], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            os.dup2(stream, fd)
            os.close(stream)
        for stream in (sys.stdout, sys.stderr):  # what -u (PYTHONUNBUFFERED) gives a fresh interpreter
            stream.reconfigure(line_buffering=True, write_through=True)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        if "OMP_NUM_THREADS" in os.environ and "torch" in sys.modules:
            import torch

            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        import runpy
        import tempfile

        tempfile.tempdir = None
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
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m largebatch.local.zygote", description=__doc__)
    parser.add_argument("--fd", type=int, required=True, help="this end of the socket pair")
    parser.add_argument("--kill-at-end", action="store_true", help="SIGKILL the children's sessions at the end")
    parser.add_argument("preload", nargs="*", help="modules to import before the first fork")
    args = parser.parse_args()
    channel = socket.socket(fileno=args.fd)
    serve(channel, args.preload, args.kill_at_end)


if __name__ == "__main__":
    main()
