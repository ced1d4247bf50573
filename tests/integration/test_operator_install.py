"""The operator as `pip install largebatch` (and operator/Dockerfile) installs it, without the [trainer]
extra: no torch, every module the operator loads imports, and `lbctl operator` starts. The venv is
built once and cached (tests/cluster/operator_venv.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.cluster.operator_venv import clean_env, operator_python
from tests.helpers import ROOT, bound

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def python() -> Path:
    return operator_python()


def run(command: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    # Outside the checkout, with no PYTHONPATH: only what the venv has installed can be imported.
    return subprocess.run(
        [str(part) for part in command], capture_output=True, text=True, env=clean_env(), cwd=cwd, timeout=bound(120)
    )


def test_torch_is_not_installed(python, tmp_path):
    result = run([python, "-c", "import torch"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "ModuleNotFoundError: No module named 'torch'" in result.stderr


def test_the_operator_modules_import_without_the_trainer_extra(python, tmp_path):
    code = (
        "import largebatch.kube.handlers, largebatch.kube.reconcile, largebatch.kube.__main__\n"
        "print(largebatch.__file__)"
    )
    result = run([python, "-c", code], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    installed = Path(result.stdout.strip())
    assert ROOT not in installed.parents, f"imported the checkout, not the installed package: {installed}"
    assert "site-packages" in installed.parts


def test_prometheus_client_is_a_core_dependency(python, tmp_path):
    # The operator exports metrics, so prometheus-client comes without any extra.
    result = run([python, "-c", "import prometheus_client"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_lbctl_operator_help(python, tmp_path):
    result = run([python.parent / "lbctl", "operator", "--help"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Usage:" in result.stdout and "operator" in result.stdout, result.stdout
