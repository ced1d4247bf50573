"""An agent's rendezvous handler that outlives its store. The job's store lives in a pod of its own (the
rendezvous pod); when that pod is deleted or its node lost, the operator starts another behind the same
Service, but torch's c10d handler keeps its connection to the old store forever (a TCPStore client does
not reconnect) and the agent fails on its next look for newcomers: every worker pod would fail at once
and use up the job's restarts, for a fault that is none of theirs.

`Rejoining` wraps torch's handler. While the store is away the workers train on (training needs no
store); once an address answers again, the handler is built anew, the agent is told that a node waits,
and it restarts its group as it does for a newcomer: the workers stop after the same step with a
checkpoint (SIGTERM) and join a fresh rendezvous in the new store. No sample is redone.

An agent that leaves also leaves the round open (`shutdown`): torch's would close it to every agent.
"""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Callable

from torch.distributed.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError

RETRY_SECONDS = 1.0


class Rejoining(RendezvousHandler):
    def __init__(self, params: RendezvousParameters, build: Callable[[RendezvousParameters], RendezvousHandler]):
        self._params, self._build = params, build
        self._handler = build(params)
        self._lost = False
        self._why_not_back = ""  # the last reason a reconnect failed, said once per change

    def num_nodes_waiting(self) -> int:
        """What the agent asks every monitor interval while its workers are healthy."""
        if self._lost:
            return 1 if self._reconnect() else 0  # 1: the agent restarts its group, into the new store
        try:
            return self._handler.num_nodes_waiting()
        except RendezvousConnectionError as exc:
            self._lose(exc)
            return 0

    def next_rendezvous(self):
        deadline = time.monotonic() + self._params.get_as_int("join_timeout", 600)
        while True:
            if not self._lost:
                try:
                    return self._handler.next_rendezvous()
                except RendezvousConnectionError as exc:
                    self._lose(exc)
            if time.monotonic() > deadline:
                raise RendezvousConnectionError(f"the rendezvous store at {self._params.endpoint} did not come back")
            if not self._reconnect():
                time.sleep(RETRY_SECONDS)

    def _lose(self, exc: Exception) -> None:
        cause = exc.__cause__ or exc
        print(f"rendezvous store at {self._params.endpoint} lost ({type(cause).__name__}): the workers train on "
              "and rejoin once it is back", file=sys.stderr, flush=True)  # fmt: skip
        self._lost = True
        # Stop its heartbeats, but do not shut it down: a store that only timed out under load is still
        # there, and shutting down would close the round for every other agent too.
        self._stop_heartbeats()

    def _stop_heartbeats(self) -> None:
        stop = getattr(self._handler, "_stop_heartbeats", None)  # torch's c10d handler's own
        if stop:
            stop()

    def _reconnect(self) -> bool:
        """Build the handler again once the store's address answers; whether it did."""
        host, _, port = self._params.endpoint.rpartition(":")
        try:
            socket.create_connection((host, int(port)), timeout=RETRY_SECONDS).close()
            self._handler = self._build(self._params)
        except (OSError, RendezvousConnectionError) as exc:
            why = f"{type(exc).__name__}: {exc.__cause__ or exc}"
            if why != self._why_not_back:  # a store that answers but cannot be joined must not be silent
                print(f"rendezvous store at {self._params.endpoint} not back yet ({why})", file=sys.stderr, flush=True)
                self._why_not_back = why
            return False
        self._lost = False
        print(f"rendezvous store at {self._params.endpoint} back: the workers stop after a checkpoint and rejoin",
              file=sys.stderr, flush=True)  # fmt: skip
        return True

    # The rest is the wrapped handler's.
    def get_backend(self) -> str:
        return self._handler.get_backend()

    @property
    def use_agent_store(self) -> bool:
        return self._handler.use_agent_store

    def is_closed(self) -> bool:
        return self._handler.is_closed()

    def set_closed(self) -> None:
        self._handler.set_closed()

    def get_run_id(self) -> str:
        return self._handler.get_run_id()

    def shutdown(self) -> bool:
        """Leave the round without closing it. torch's launcher shuts the handler down when its agent leaves
        for any reason but a signal, and its handler then closes the rendezvous for good: after one agent
        failed (a store timeout on a loaded machine), its peers' restarts and every replacement the
        operator started into the round failed with RendezvousClosedError, and the job used up its
        restarts. Who is in a round is the shell's to say (the operator, the local runner), not an
        agent's; a finished job's agents leave by themselves."""
        self._stop_heartbeats()
        return True
