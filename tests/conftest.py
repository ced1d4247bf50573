"""Fixtures shared by every test layer (helpers live in tests/helpers.py)."""

from __future__ import annotations

import pytest

from largebatch.api import LargeBatchJob
from tests.helpers import example


@pytest.fixture
def seesaw_example() -> LargeBatchJob:
    return example("seesaw.yaml")
