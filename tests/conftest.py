"""Fixtures shared by every test layer (helpers live in tests/helpers.py)."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

from largebatch.api import LargeBatchJob
from tests.helpers import example


@pytest.fixture
def seesaw_example() -> LargeBatchJob:
    return example("seesaw.yaml")


# CI runs the same examples every time (a failure there is reproducible); a person running the tests
# gets fresh random examples, and `--hypothesis-profile=thorough` searches harder. No profile has a
# deadline: on a busy machine an example's time says nothing about the code.
settings.register_profile("dev", deadline=None)
settings.register_profile("ci", derandomize=True, deadline=None)
settings.register_profile("thorough", max_examples=2_000, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`make test` runs two workers, `--dist loadgroup`), every e2e test goes to the
    same worker, so that one control plane (a session fixture) serves them all while the other worker
    runs the unit and process tests: the e2e tests mostly wait on the cluster, the others on the CPU.
    One control plane is also all a machine can have: its real node takes the host's network and
    containerd's cached root. First, because xdist's own hook reads the marks into the test's id (without
    tryfirst it ran before this one, and each worker started a control plane of its own)."""
    for item in items:
        if item.get_closest_marker("e2e"):
            item.add_marker(pytest.mark.xdist_group("control-plane"))
