"""Every mistake a user can make in a job file or on the command line is answered at once, with exit 2,
the field or flag, and the reason, before anything starts: types checked as the API server checks
them, a task that cannot load, numbers that would make planning hang, a capacity that could never
place the job, and text that would be taken for rich markup."""

from __future__ import annotations

import copy
import json
import os

import pytest

from tests.helpers import EXAMPLES, job_file, lbctl, set_in


def refused(result, *said: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    for words in said:
        assert words in result.stderr, result.stderr


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (set_in("workers.min", True), "spec.workers.min: Input should be a valid integer"),
        (set_in("batch.initial", "16"), "spec.batch.initial: Input should be a valid integer"),
        (set_in("batch.max", 64.0), "spec.batch.max: Input should be a valid integer"),
        (set_in("optimizer.lr", float("nan")), "spec.optimizer.lr: Input should be a finite number"),
        (set_in("schedule.minLrRatio", float("inf")), "spec.schedule.minLrRatio: Input should be a finite number"),
        (set_in("schedule.totalSamples", 10**16), "spec.schedule.totalSamples: Input should be less than or equal"),
        (
            lambda s: s["batch"].update(
                initial=1, max=20_001, policy={"type": "linearRamp", "linearRamp": {"increment": 1, "rampSamples": 9}}
            ),
            "linearRamp makes at most 10,000 batch increases",
        ),
        (set_in("batch.max", 16 * 65_536 + 16), "batch.max must be <= batch.microBatchPerDevice x 65,536"),
    ],
    ids=["bool-int", "string-int", "float-int", "nan", "infinity", "total", "ramp-levels", "accumulation"],
)
def test_types_and_bounds_are_checked_as_the_api_server_does(tmp_path, change, said):
    refused(lbctl("plan", str(job_file(tmp_path, change))), said)


def test_a_key_given_twice_and_a_file_that_is_not_utf8(tmp_path):
    text = (EXAMPLES / "quickstart.yaml").read_text().replace("  image:", "  image: other\n  image:", 1)
    refused(lbctl("plan", str(job_file(tmp_path, text=text))), "the key 'image' is given twice")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes((EXAMPLES / "quickstart.yaml").read_bytes().replace(b"# The", b"# Th\xe9", 1))
    refused(lbctl("plan", str(latin1)), "not UTF-8 text (byte 0xe9 at offset 4)", "save the job file as UTF-8")


def test_the_largest_ramp_plans_at_once(tmp_path):
    # 10,000 batch increases over a quadrillion samples: the planner's cost follows the phases, not the
    # samples, and finds each phase's end by bisection rather than by scanning every increase.
    def ramp(spec):
        spec["batch"].update(
            initial=16,
            max=16 + 10_000 * 16,
            microBatchPerDevice=16,
            policy={"type": "linearRamp", "linearRamp": {"increment": 16, "rampSamples": 10**12}},
        )
        spec["schedule"].update(totalSamples=10**15, warmupSamples=0)  # fmt: skip

    result = lbctl("plan", str(job_file(tmp_path, ramp)), "--json", timeout=60)
    assert result.returncode == 0, result.stderr
    assert len(json.loads(result.stdout)["phases"]) == 10_001


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--capacity="], "--capacity: step '' is not FRACTION:WORKERS"),
        (["--capacity", "0:2,50%:0"], "--capacity: from 50% on it places 0 worker(s), fewer than workers.min 1"),
        (["--slots", "1"], "--slots: this machine holds 1 node(s) but workers.min is 2"),
        (["--metrics-port", "70000"], "Invalid value for '--metrics-port'"),
        (["--restart-cost", "inf"], "must be a finite number"),
        (["--metrics-port", "65535"], "metrics port 65535: the local run serves metrics on"),
    ],
    ids=["empty-capacity", "capacity-below-min", "slots-below-min", "port", "infinite-flag", "ports-past-65535"],
)
def test_flags_that_could_never_work_are_refused_before_any_node_starts(tmp_path, args, said):
    job = job_file(tmp_path, set_in("workers.min", 2) if "--slots" in args else None)
    run_dir = tmp_path / "run"
    refused(lbctl("run", str(job), "--local", "--run-dir", str(run_dir), *args), said)
    assert not run_dir.exists()  # nothing started, nothing written


def test_plot_into_a_missing_or_unwritable_folder_is_an_error(tmp_path):
    refused(lbctl("plan", str(job_file(tmp_path)), "--plot", str(tmp_path / "no" / "plan.png")),
            f"--plot: the folder {tmp_path / 'no'} does not exist")  # fmt: skip
    (tmp_path / "a-dir.png").mkdir()  # a path that cannot be written, even as root
    refused(lbctl("plan", str(job_file(tmp_path)), "--plot", str(tmp_path / "a-dir.png")),
            f"--plot {tmp_path / 'a-dir.png'}: Is a directory")  # fmt: skip


def test_a_path_with_brackets_is_printed_as_it_is(tmp_path):
    plot = tmp_path / "[red]plan.png"
    result = lbctl("plan", str(job_file(tmp_path)), "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    assert f"Plot written to {plot}" in " ".join(result.stdout.split()), result.stdout


@pytest.mark.parametrize(
    ("task", "said"),
    [
        ({"entrypoint": "no_such_module:build"}, "ModuleNotFoundError: No module named 'no_such_module'"),
        ({"entrypoint": "largebatch_trainer.tasks:no_such_task"}, "has no attribute 'no_such_task'"),
        (
            {"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"dimension": 8}},
            "refused task.args {'dimension': 8}: TypeError",
        ),
        ({"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"samples": 0}}, "built an empty dataset"),
        # Text from the user is printed as it is, not taken for rich markup.
        (
            {"entrypoint": "largebatch_trainer.tasks:linreg", "args": {"[bold]note[/bold]": 1}},
            "refused task.args {'[bold]note[/bold]': 1}",
        ),
    ],  # fmt: skip
    ids=["module", "attribute", "argument", "empty-dataset", "markup"],
)
def test_a_task_that_cannot_load_is_answered_before_any_node_starts(tmp_path, task, said):
    def change(spec):
        spec["task"] = copy.deepcopy(task)

    run_dir = tmp_path / "run"
    result = lbctl("run", str(job_file(tmp_path, change)), "--local", "--run-dir", str(run_dir))
    refused(result, said)
    assert not run_dir.exists()


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("raise RuntimeError('no GPU driver [here]')", "cannot be loaded: RuntimeError: no GPU driver [here]"),
        ("def build(:\n    pass", "cannot be loaded: SyntaxError"),
        (
            "from largebatch_trainer.tasks import Task, linreg\n"
            "def build():\n    task = linreg(samples=64)\n    task.dataset = iter(task.dataset)\n    return task",
            "returned a dataset without a length",
        ),
    ],
    ids=["raises-on-import", "syntax-error", "iterable-dataset"],
)
def test_a_task_module_that_fails_its_own_way_is_answered_in_one_message(tmp_path, source, said):
    (tmp_path / "user_task.py").write_text(source)
    job = job_file(tmp_path, set_in("task", {"entrypoint": "user_task:build"}))
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    run_dir = tmp_path / "run"
    refused(lbctl("run", str(job), "--local", "--run-dir", str(run_dir), env=env), said)
    assert not run_dir.exists()
