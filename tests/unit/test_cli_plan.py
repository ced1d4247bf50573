"""`lbctl plan` and `lbctl crd` as a user runs them: a real subprocess of the installed console script."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from tests.helpers import EXAMPLES, ROOT, lbctl


def test_plan_prints_the_seesaw_table_and_saving():
    result = lbctl("plan", str(EXAMPLES / "seesaw.yaml"))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "50.3%, 67.2%, 77.9%, 85.2%" in out
    assert "63,644" in out and "100,000" in out and "36.4%" in out
    for label in ("warmup", "cut 1/6", "cut 6/6"):
        assert label in out


def test_plan_json_has_phases_and_serial_steps():
    result = lbctl("plan", str(EXAMPLES / "seesaw.yaml"), "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["serialSteps"] == sum(p["steps"] for p in data["phases"])
    assert data["baselineSerialSteps"] == 100_000
    assert data["saving"] == pytest.approx(0.364, abs=0.005)
    assert [p["globalBatch"] for p in data["phases"]] == [256, 256, 512, 1024, 2048, 4096, 4096, 4096]


def test_plan_with_few_workers_shows_accumulation():
    data = json.loads(lbctl("plan", str(EXAMPLES / "seesaw.yaml"), "--workers", "4", "--json").stdout)
    last = data["phases"][-1]
    assert (last["workers"], last["microBatch"], last["accumulationSteps"]) == (4, 256, 4)
    assert all(p["workers"] <= 4 for p in data["phases"])
    table = lbctl("plan", str(EXAMPLES / "seesaw.yaml"), "--workers", "4").stdout
    assert "256×4" in table


def test_plan_plot_writes_a_png(tmp_path):
    target = tmp_path / "plan.png"
    result = lbctl("plan", str(EXAMPLES / "seesaw.yaml"), "--plot", str(target))
    assert result.returncode == 0, result.stderr
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert target.stat().st_size > 10_000


def test_a_bad_job_file_names_the_field_and_exits_2_without_a_traceback(tmp_path):
    job = yaml.safe_load((EXAMPLES / "seesaw.yaml").read_text())
    job["spec"]["batch"]["initial"] = 8192
    job["spec"]["workers"]["min"] = 0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(job))
    result = lbctl("plan", str(bad))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "spec.workers.min: Input should be greater than or equal to 1 (got 0)" in result.stderr
    assert "batch.initial must be <= batch.max" in result.stderr
    assert "initial=8192, max=4096" in result.stderr


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("spec: [unclosed", "not valid YAML"),
        ("- a list", "expected a LargeBatchJob manifest"),
        ("apiVersion: largebatch.io/v1alpha1\nkind: LargeBatchJob\nmetadata: {name: x}\n", "spec: required field"),
    ],
)
def test_malformed_files_exit_2(tmp_path, content, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text(content)
    result = lbctl("plan", str(bad))
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_a_missing_file_exits_2():
    result = lbctl("plan", "/nonexistent/job.yaml")
    assert result.returncode == 2
    assert "cannot read the job file" in result.stderr


def test_crd_command_prints_the_checked_in_crd():
    result = lbctl("crd")
    assert result.returncode == 0
    assert result.stdout == (ROOT / "crds" / "largebatchjobs.largebatch.io.yaml").read_text()


def test_the_operator_side_imports_without_torch():
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import largebatch.api, largebatch.schedule, largebatch.crd, largebatch.cli, largebatch.plan_report\n"
        "import largebatch.controller, largebatch.launch, largebatch.report, largebatch.kube.manifests\n"
        "import largebatch.kube.reconcile, largebatch.kube.handlers, largebatch.kube.world\n"
        "import largebatch.cli as c; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.stdout.strip() == "ok", result.stderr


@pytest.mark.parametrize("example", ["critical-batch.yaml", "seesaw.yaml"])
def test_a_plan_that_follows_the_noise_scale_without_one_shows_what_a_few_would_give(example):
    """criticalBatch, and Seesaw held to the critical batch (the default), depend on the noise scale."""
    result = lbctl("plan", str(EXAMPLES / example), "--json")
    assert result.returncode == 0, result.stderr
    assumed = json.loads(result.stdout)["assumedNoiseScales"]
    job = yaml.safe_load((EXAMPLES / example).read_text())["spec"]["batch"]
    # From a noise scale that allows no growth to one that allows batch.max: more growth, fewer steps.
    assert assumed[0]["largestBatch"] == job["initial"] and assumed[0]["saving"] == 0
    assert assumed[-1]["largestBatch"] == job["max"]
    assert [a["largestBatch"] for a in assumed] == sorted(a["largestBatch"] for a in assumed)
    assert [a["serialSteps"] for a in assumed] == sorted((a["serialSteps"] for a in assumed), reverse=True)
    table = lbctl("plan", str(EXAMPLES / example)).stdout
    assert "If the measured noise scale were" in table and "pass --noise-scale" in table
    assert "assumedNoiseScales" not in json.loads(lbctl("plan", str(EXAMPLES / "constant.yaml"), "--json").stdout)
    fixed = json.loads(lbctl("plan", str(EXAMPLES / example), "--json", "--noise-scale", "800").stdout)
    assert "assumedNoiseScales" not in fixed
