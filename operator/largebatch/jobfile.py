"""Reading LargeBatchJob files, with errors that name the field and the fix instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from largebatch.api import LargeBatchJob


class JobFileError(Exception):
    """A job file that cannot be used; the message says where and why."""


def load(path: str | Path) -> LargeBatchJob:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise JobFileError(f"{path}: cannot read the job file: {exc.strerror}") from None
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise JobFileError(f"{path}: expected a LargeBatchJob manifest (a YAML mapping), got {document!r:.60}")
    try:
        return LargeBatchJob.model_validate(document)
    except ValidationError as exc:
        raise JobFileError(f"{path}: invalid LargeBatchJob\n{describe(exc)}") from None


def describe(exc: ValidationError) -> str:
    """One line per problem: the field path as written in YAML, the reason, and the value given."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"]) or "(top level)"
        reason = error["msg"].removeprefix("Value error, ")
        if error["type"] == "missing":
            reason = "required field is missing"
        elif error["type"] == "extra_forbidden":
            reason = "unknown field (check the spelling; `lbctl crd` lists every field)"
        elif error["type"] not in ("value_error", "assertion_error") and "input" in error:
            reason += f" (got {error['input']!r:.60})"
        lines.append(f"  {where}: {reason}")
    return "\n".join(lines)
