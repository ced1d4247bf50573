"""The run directory of `lbctl run --local` belongs to one run at a time: an exclusive `flock` on
`RUN_DIR/lock`, which the kernel drops however the process ends (no stale lock after a SIGKILL), and
the holder's pid inside it for the message a second run gets."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


class RunDirError(Exception):
    """The run directory cannot be used (another run holds it, it is a file, read-only, full)."""


def claim(run_dir: Path) -> int:
    """Make `run_dir` this process's for its life: an exclusive lock on `run_dir/lock` (the kernel drops it
    however the process ends) holding our pid, for the message a second run gets. The file descriptor."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(run_dir / "lock", os.O_RDWR | os.O_CREAT, 0o644)
    except (FileExistsError, NotADirectoryError):
        raise RunDirError(f"--run-dir {run_dir}: a file is in the way where the run's folder should be") from None
    except OSError as exc:
        raise RunDirError(f"--run-dir {run_dir}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        raise RunDirError(f"--run-dir {run_dir} is in use by another lbctl run (pid {holder}): wait for it to end, "
                          "stop it, or pick another --run-dir") from None  # fmt: skip
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError as exc:
        os.close(fd)
        raise RunDirError(f"--run-dir {run_dir}: {exc.strerror}") from None
    return fd
