"""Kubernetes timestamps (RFC 3339, UTC, `2026-11-30T12:00:00Z`), written and read in one place: the
trainer's reports, the operator's status and conditions, and what `lbctl` shows."""

from __future__ import annotations

import datetime


def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def stamp(when: datetime.datetime) -> str:
    return when.isoformat(timespec="seconds").replace("+00:00", "Z")


def parse(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def seconds_since(text: str | None, when: datetime.datetime) -> float | None:
    """Seconds from the timestamp `text` to `when`; None when there is no timestamp."""
    return None if not text else (when - parse(text)).total_seconds()
