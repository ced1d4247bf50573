"""A TCP proxy a test puts between a client (the operator) and the API server, to cut the client off:
`cut()` closes every connection through it and refuses new ones, as a load balancer or a network
policy that drops a client does; `restore()` lets connections through again. TLS passes through
untouched (the API server's certificate names 127.0.0.1, where the proxy listens)."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import yaml

from tests.helpers import free_port


class Proxy:
    def __init__(self, server: str):
        """`server`: the API server's https://HOST:PORT."""
        host, port = server.removeprefix("https://").rsplit(":", 1)
        self.target = (host, int(port))
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self.refused = 0  # connections refused while cut
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def kubeconfig(self, source: Path) -> Path:
        """A copy of the kubeconfig `source` (beside it) whose client goes through this proxy."""
        config = yaml.safe_load(source.read_text())
        config["clusters"][0]["cluster"]["server"] = self.address
        path = source.with_name(f"{source.stem}-via-proxy.kubeconfig")
        path.write_text(yaml.safe_dump(config))
        return path

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if not self._open.is_set():
                self.refused += 1
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
            with self._lock:
                self._sockets.discard(end)

    def cut(self) -> None:
        self._open.clear()
        with self._lock:
            cut, self._sockets = set(self._sockets), set()
        for end in cut:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self._open.set()

    @contextlib.contextmanager
    def cut_off(self) -> Iterator[None]:
        self.cut()
        try:
            yield
        finally:
            self.restore()

    def close(self) -> None:
        self.cut()
        self._listener.close()
