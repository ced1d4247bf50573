"""A memory limit on a group of processes, as a container's: a memory cgroup (v2, or v1 with swap counted)
that commands are started in. Needs root, as the test control plane does."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from tests.helpers import bound

V2 = Path("/sys/fs/cgroup")
V1 = Path("/sys/fs/cgroup/memory")


class MemoryLimit:
    def __init__(self, name: str, limit: int):
        self.limit = limit
        v2 = (V2 / "cgroup.controllers").is_file()
        self.path = (V2 if v2 else V1) / f"largebatch-test-{name}"
        self.settings = {"memory.max": limit, "memory.swap.max": 0} if v2 else {
            "memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit}  # fmt: skip

    def __enter__(self) -> MemoryLimit:
        self.path.mkdir()
        for name, value in self.settings.items():
            if (self.path / name).exists():  # swap accounting may be off; then there is no swap to count
                (self.path / name).write_text(str(value))
        return self

    def command(self, argv: list[str]) -> list[str]:
        """`argv` started inside the group (and so is every process it starts)."""
        return ["sh", "-c", f'echo $$ > {self.path / "cgroup.procs"} && exec "$@"', "sh", *argv]

    def __exit__(self, *_exc) -> None:
        deadline = time.monotonic() + bound(30)
        while (self.path / "cgroup.procs").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.1)  # processes that were killed leave the group as they are reaped
        with contextlib.suppress(OSError):
            self.path.rmdir()
