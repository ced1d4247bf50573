"""`lbctl sweep`'s planning and reading: the LR grid, the proxy jobs, the outcome of a run from its files,
the best LR per width."""

from __future__ import annotations

import json

import pytest

from largebatch import launch, sweep
from tests.helpers import spec_dict


def test_a_grid_is_log_spaced_from_low_to_high_or_the_rates_given():
    grid = sweep.parse_grid("1e-4:1e-1:4")
    assert grid == pytest.approx([1e-4, 1e-3, 1e-2, 1e-1])
    assert sweep.parse_grid("0.3,0.01,0.3") == [0.01, 0.3]
    assert sweep.parse_widths("256,64,64") == [64, 256]


@pytest.mark.parametrize("text", ["1e-1:1e-4:4", "0:1:4", "1e-4:1e-1:1", "1e-4:1e-1:65", "a,b", "-1,2", "inf", ""])
def test_a_grid_that_is_not_one_is_refused_with_the_forms_it_takes(text):
    with pytest.raises(ValueError, match=r"--lr .*: give LOW:HIGH:N .* e\.g\. 1e-4:3e-2:8"):
        sweep.parse_grid(text)


@pytest.mark.parametrize("text", ["0,64", "64,x", ""])
def test_widths_must_be_positive_integers(text):
    with pytest.raises(ValueError, match="--widths .*: give positive integers"):
        sweep.parse_widths(text)


def test_a_proxy_is_the_job_at_its_width_and_lr_on_one_node_shortened_in_proportion():
    document = {"metadata": {"name": "big"}, "spec": spec_dict(
        task={"entrypoint": "largebatch_trainer.tasks:pylm", "args": {"width": 1024, "depth": 2}},
        workers={"min": 2, "max": 8, "devicesPerWorker": 4},
        schedule={"totalSamples": 100_000, "warmupSamples": 5_000},
    )}  # fmt: skip
    trial = sweep.trials("big", [64, 256], [0.01, 0.1])[3]
    assert (trial.width, trial.lr, trial.name) == (256, 0.1, "big-w256-lr1")
    proxy = sweep.proxy_document(document, trial, samples=20_000)
    assert proxy["metadata"]["name"] == "big-w256-lr1"
    assert proxy["spec"]["task"]["args"] == {"width": 256, "depth": 2}
    assert proxy["spec"]["optimizer"]["lr"] == 0.1
    assert proxy["spec"]["workers"] == document["spec"]["workers"] | {"min": 1, "max": 1}
    assert proxy["spec"]["schedule"]["totalSamples"] == 20_000 and proxy["spec"]["schedule"]["warmupSamples"] == 1_000
    assert document["spec"]["task"]["args"]["width"] == 1024  # the job itself is untouched
    assert sweep.transferred(document, 0.0123456789)["spec"]["optimizer"]["lr"] == 0.0123457


def _record(root, trial, record: dict | None, node_log: str = "") -> None:
    run = trial.folder(root) / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "node-0.log").write_text(node_log)
    if record is not None:
        (run / "run.json").write_text(json.dumps(record))


def test_an_outcome_is_read_from_the_run_record_and_the_nodes_logs(tmp_path):
    done, held, nan, diverged, stopped, failed, fresh = sweep.trials("j", [32], [1, 2, 3, 4, 5, 6, 7])
    _record(tmp_path, done, {"complete": True, "finalLoss": 2.5, "evalLoss": 2.75})
    _record(tmp_path, held, {"complete": True, "finalLoss": 2.5, "evalLoss": None})
    _record(tmp_path, nan, {"complete": True, "finalLoss": float("nan")})
    _record(tmp_path, diverged, {"complete": False}, f"Error: {launch.DIVERGED}: the loss of step 6 is nan")
    _record(tmp_path, stopped, {"complete": False})
    _record(tmp_path, failed, None, "RuntimeError: something else")
    assert sweep.read_outcome(done, tmp_path) == sweep.Outcome(done, 2.75, "complete")  # held-out loss first
    assert sweep.read_outcome(held, tmp_path) == sweep.Outcome(held, 2.5, "complete")
    assert sweep.read_outcome(nan, tmp_path).status == "diverged"
    assert sweep.read_outcome(diverged, tmp_path) == sweep.Outcome(diverged, None, "diverged")
    # Not ended for good: run again.
    assert sweep.read_outcome(stopped, tmp_path) is None
    assert sweep.read_outcome(failed, tmp_path) is None
    assert sweep.read_outcome(fresh, tmp_path) is None


def test_the_best_lr_of_a_width_is_its_lowest_loss_among_runs_that_finished():
    runs = sweep.trials("j", [32, 64], [0.01, 0.1, 1.0])
    losses = [3.0, 2.0, None, 2.5, 2.6, 2.4]
    outcomes = [
        sweep.Outcome(t, loss, "complete" if loss else "diverged") for t, loss in zip(runs, losses, strict=True)
    ]
    found = sweep.best(outcomes)
    assert {w: o.trial.lr for w, o in found.items()} == {32: 0.1, 64: 1.0}
    assert sweep.best([sweep.Outcome(runs[2], None, "diverged")]) == {}
