"""What lbctl's commands share to speak to the terminal: the two consoles, the error line and its exit,
and the reading of a job file with its caveats."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.measure import Measurement

from largebatch import caveats, jobfile
from largebatch.api import LargeBatchJob

# A line that names a path is printed with soft_wrap=True: rich would fold a path longer than the
# terminal into pieces, with newlines inside it, that no longer paste into a shell.
console = Console()
errors = Console(stderr=True)


def print_whole(renderable) -> None:
    """Print on stdout; into a pipe or a file as wide as it takes to keep every cell whole (as kubectl
    prints), where rich would cut cells to 80 columns: a script must not read "test-status-sh…"."""
    if console.is_terminal:
        console.print(renderable)
        return
    needed = Measurement.get(console, console.options.update_width(1 << 16), renderable).maximum
    Console(file=console.file, width=max(console.width, needed)).print(renderable)


def fail(message: object, code: int = 2) -> typer.Exit:
    """Say `message` on stderr as it is (never taken for markup), and the exit to raise with `code`."""
    say_error(message)
    return typer.Exit(code)


def say_error(message: object) -> None:
    """The error line on stderr, `message` as it is (never taken for markup)."""
    errors.print(f"[bold red]error:[/] {escape(str(message))}", highlight=False, soft_wrap=True)


def check_folder(flag: str, path: Path) -> None:
    if not path.parent.is_dir():
        raise fail(f"{flag}: the folder {path.parent} does not exist; create it or pick another path")


def load_job(path: Path) -> LargeBatchJob:
    """The job in `path`, its caveats said on stderr; exit 2 with the file's mistakes when it is not one."""
    try:
        manifest = jobfile.load(path)
    except jobfile.JobFileError as exc:
        raise fail(exc) from None
    for caveat in caveats.caveats(manifest.spec):
        errors.print(f"[bold yellow]warning:[/] {escape(caveat.message)}", highlight=False, soft_wrap=True)
    return manifest
