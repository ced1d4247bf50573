"""Reading LargeBatchJob files, with errors that name the field and the fix instead of a traceback."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from largebatch.api import LargeBatchJob


class JobFileError(Exception):
    """A job file that cannot be used; the message says where and why."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """YAML as kubectl reads it: a key given twice in one mapping is an error, not the last one winning."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    f"while reading the mapping that starts {node.start_mark}".strip(),
                    None,
                    f"the key {key!r} is given twice (first {seen[key]}); keep one",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_document(path: str | Path) -> dict:
    """The job file's YAML mapping, as the API server would get it from kubectl."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise JobFileError(f"{path}: cannot read the job file: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise JobFileError(f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}); "
                           "save the job file as UTF-8") from None  # fmt: skip
    try:
        document = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader
    except yaml.YAMLError as exc:
        raise JobFileError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(document, dict):
        raise JobFileError(f"{path}: expected a LargeBatchJob manifest (a YAML mapping), got {document!r:.60}")
    return document


def load(path: str | Path) -> LargeBatchJob:
    document = read_document(path)
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
