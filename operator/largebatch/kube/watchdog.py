"""How long the operator keeps asking an API server that does not answer, and what it does when it gives
up: it exits, so that its Deployment starts it again, instead of running on blind.

kopf retries a failed request a few times (9 tries over 54 s by default), then a watch that failed with
anything but a refused connection (a 403, a 5xx) ends for good, and the process lives on without it: its
index of the jobs' pods no longer changes, and nothing it does is right. Both are what an API server
restart gives: a managed upgrade can keep it away for longer than 54 s, and a restarted server answers
403 for a moment while its RBAC caches are still empty (`clusterrole "system:discovery" not found`).
So the tries last RETRY_SECONDS (ten minutes unless LARGEBATCH_API_RETRY_SECONDS says otherwise), and a
watcher (or a peering task) that still fails stops the operator with exit status 1.

LARGEBATCH_API_BACKOFF_SCALE multiplies every wait between tries (1 unless set): the e2e fault tests set it
to 0.1, so that kopf's nine default tries are over in 5.4 s rather than 54 s and an outage longer than they
last need not take a minute."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading

log = logging.getLogger(__name__)

RETRY_SECONDS = float(os.environ.get("LARGEBATCH_API_RETRY_SECONDS", "600"))
BACKOFF_SCALE = float(os.environ.get("LARGEBATCH_API_BACKOFF_SCALE", "1"))
KOPF_BACKOFFS = (1, 1, 2, 3, 5, 8, 13, 21)
"""kopf's own, seconds between tries."""
LONGEST_BACKOFF = 30.0
STOP_SECONDS = 30.0
"""How long kopf may take to stop once the watchdog asked it to; then the process exits at once. kopf's
stop hangs at times (in about half the e2e runs): watches still retrying when it closes its session wait
for good to log in again (`Request attempt ... TCP closed; will re-authenticate`)."""
CLOSE_SECONDS = 20.0
"""The same for a stop someone else asked for (SIGTERM: a rollout, a drained node), counted from kopf's
cleanup: within a pod's default grace period of 30 s, so that the log says why rather than a SIGKILL
ending it. A SIGTERMed operator had not exited 30 s later, its log ending at the cleanup (stop 60)."""
GUARDED = ("watcher for ", "peering keep-alive for ", "peering observer for ")
"""kopf's names for the tasks it keeps one of per watched resource and namespace: when one ends with an
error, nothing starts it again."""


def backoffs(total: float, scale: float = 1.0) -> list[float]:
    """Seconds between tries of one request: kopf's own, then LONGEST_BACKOFF at a time, each times
    `scale`, until the waits add up to `total` (the last one cut short to land on it)."""
    waits: list[float] = []
    spent = 0.0  # kept rather than summed each time: a small scale makes tens of thousands of waits
    while spent < total:
        step = KOPF_BACKOFFS[len(waits)] if len(waits) < len(KOPF_BACKOFFS) else LONGEST_BACKOFF
        waits.append(min(step * scale, total - spent))
        spent += waits[-1]
    return waits


class Watchdog:
    """Sets `stop` (kopf.run's stop flag) when one of kopf's GUARDED tasks ends with an error, and keeps
    what happened in `failure` for the process's exit."""

    def __init__(self) -> None:
        # Not a threading.Event: kopf would wait for one in a thread of its executor, which then holds
        # the process at its exit.
        self.stop = asyncio.Event()
        self.failure: str | None = None
        self._seen: set[str] = set()
        self._task: asyncio.Task | None = None
        self.deadline: threading.Timer | None = None

    def start(self) -> None:
        """In the operator's event loop (a startup handler): it keeps the task, which asyncio does not."""
        self._task = asyncio.create_task(self.run(), name="largebatch watchdog")

    def close(self) -> None:
        """At the operator's exit (a cleanup handler). Sets `stop` too: kopf waits for it in a task of
        its own that it leaves running when a signal stops it, and then waits 5 s for that task at exit.
        Arms the exit deadline, unless a failure did: kopf's stop can hang whoever asked for it."""
        self.stop.set()
        if self._task is not None:
            self._task.cancel()
        self._arm(CLOSE_SECONDS)

    async def run(self, interval: float = 1.0) -> None:
        """Finds kopf's guarded tasks as it starts them: at startup, and as watched namespaces appear."""
        while not self.stop.is_set():
            self.scan()
            await asyncio.sleep(interval)

    def scan(self) -> None:
        """Hands each guarded task not seen before a callback for its end."""
        for task in asyncio.all_tasks():
            name = task.get_name()
            if name.startswith(GUARDED) and name not in self._seen:
                self._seen.add(name)
                task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self._seen.discard(task.get_name())  # kopf may start it again (a namespace deleted and recreated)
        if task.cancelled() or task.exception() is None:
            return  # kopf stopped it: the operator is stopping, or the namespace is gone
        failure = f"{task.get_name()} failed: {task.exception()!r}"
        log.error(f"Stopping the operator: kopf's {failure}; it does not start it again.")
        if self.failure is None:  # the first one, for the exit
            self.failure = failure
            self._arm(STOP_SECONDS)
        self.stop.set()

    def _arm(self, seconds: float) -> None:
        """Exits the process `seconds` from now unless it ended before; the first deadline armed holds."""
        if self.deadline is None:
            self.deadline = threading.Timer(seconds, self._exit_now, args=(seconds,))
            self.deadline.daemon = True  # a kopf that stops in time ends the process at once
            self.deadline.start()

    def _exit_now(self, seconds: float) -> None:
        """Exit status 1 after a failure (the Deployment starts the operator again), 0 after a stop."""
        why = f"kopf's {self.failure}" if self.failure else "it was asked to stop"
        log.error(f"kopf did not stop within {seconds:.0f} s; exiting now: {why}.")
        logging.shutdown()  # flush the log: os._exit does not
        sys.stderr.flush()
        os._exit(1 if self.failure else 0)
