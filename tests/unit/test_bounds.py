"""The suite's bounds on waits scale with how slow the machine is (tests/helpers.py `bound`): the
environment's factor, which tests/conftest.py measures once for the whole run."""

from __future__ import annotations

import os
import time

import pytest

from tests.helpers import SLOWNESS, bound, probe_slowness, wait_for


def test_every_worker_of_the_run_scales_by_the_factor_measured_at_its_start():
    assert float(os.environ[SLOWNESS]) >= 1.0  # set by the run's first process, inherited by xdist's workers
    assert bound(10) == pytest.approx(10 * float(os.environ[SLOWNESS]))


def test_a_slower_machine_waits_longer_before_giving_up(monkeypatch):
    monkeypatch.setenv(SLOWNESS, "3")
    assert bound(40) == 120
    started = time.monotonic()
    with pytest.raises(AssertionError, match=r"timed out after 1 s waiting for nothing"):
        wait_for(lambda: False, timeout=0.3, what="nothing")
    assert time.monotonic() - started >= 0.9


def test_the_probe_never_shortens_a_bound():
    assert 1.0 <= probe_slowness() <= 5.0
