"""The two packages point one way: the trainer imports the shared contract from `largebatch`, and
`largebatch` reaches the trainer only through `largebatch.trainer_facade` (or runs it as a process).
Read from the source (every import statement, lazy ones inside functions included), so that a new
import in either direction fails here rather than in a torch-free operator image."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR, TRAINER = ROOT / "operator" / "largebatch", ROOT / "trainer_image" / "largebatch_trainer"
FACADE = OPERATOR / "trainer_facade.py"
CONTRACT = {"api", "errors", "files", "jobfile", "launch", "report", "schedule", "split", "timestamps"}
"""What the trainer may import from `largebatch` (docs/architecture.md, "The package boundary")."""


def imported(path: Path) -> set[str]:
    """Every module an import statement in `path` names (`from a import b` gives `a.b` and `a`)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def modules(package: Path) -> list[Path]:
    return sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", modules(OPERATOR), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_largebatch_reaches_the_trainer_only_through_its_facade(path):
    reached = sorted(n for n in imported(path) if n.split(".")[0] == "largebatch_trainer")
    if path == FACADE:
        assert reached, "the facade is the one door to the trainer: it should import it"
    else:
        assert not reached, f"{path.relative_to(ROOT)} imports {reached}: go through largebatch.trainer_facade"


@pytest.mark.parametrize("path", modules(TRAINER), ids=lambda p: str(p.relative_to(TRAINER)))
def test_the_trainer_imports_only_the_shared_contract_from_largebatch(path):
    used = {n.split(".")[1] for n in imported(path) if n.startswith("largebatch.")}
    outside = sorted(used - CONTRACT)
    assert not outside, f"{path.relative_to(ROOT)} imports largebatch.{outside}: not part of the shared contract"
