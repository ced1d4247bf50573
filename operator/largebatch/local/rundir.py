"""The run directory of `lbctl run --local` belongs to one run at a time: an exclusive `flock` on
`RUN_DIR/lock`, which the kernel drops however the process ends (no stale lock after a SIGKILL), and
the holder's pid inside it for the message a second run gets. The runner hands the lock to its torchrun
agents too, so a runner that is killed leaves the folder taken until its agents and their workers are gone."""

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
        holder = os.read(fd, 32).decode(errors="replace").strip()
        os.close(fd)
        if holder.isdigit() and not Path(f"/proc/{holder}").exists():
            why = (f"is still held by the nodes of lbctl run pid {holder}, which has ended: they are stopping (and "
                   "checkpointing); try again in a minute")  # fmt: skip
        else:
            why = (f"is in use by another lbctl run (pid {holder or 'unknown'}): wait for it to end, stop it, or pick "
                   "another --run-dir")  # fmt: skip
        raise RunDirError(f"--run-dir {run_dir} {why}") from None
    try:
        # Fixed width, written over the old pid in one write: a reader never sees it half-replaced.
        os.pwrite(fd, f"{os.getpid():>10}\n".encode(), 0)
        os.ftruncate(fd, 11)
    except OSError as exc:
        os.close(fd)
        raise RunDirError(f"--run-dir {run_dir}: {exc.strerror}") from None
    return fd
