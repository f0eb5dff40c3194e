"""Shared fixtures. Tests never need ../shared: tests on real data skip when it is absent."""
from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

import dpsql


def shared_data_dir() -> Path | None:
    """The real datasets (../shared/data next to the checkout), or DPSQL_SHARED_DATA; None if absent."""
    env = os.environ.get("DPSQL_SHARED_DATA")
    candidates = [Path(env)] if env else []
    candidates.append(Path(__file__).resolve().parents[2] / "shared" / "data")
    for path in candidates:
        if path.is_dir():
            return path
    return None


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("the real datasets (../shared/data) are not available")
    return path


def seeded(seed: int):
    """A reproducible (NOT private) connection, without the expected warning in the test output."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return dpsql.connect(seed=seed)


@pytest.fixture
def con():
    """A private (OS-entropy) connection."""
    c = dpsql.connect()
    yield c
    c.close()


@pytest.fixture
def seeded_con():
    c = seeded(20261122)
    yield c
    c.close()
