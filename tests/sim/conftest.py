"""Fixtures of the protocol simulation tests: a SQLite target on /dev/shm (no Spark)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from sparkonce.verify.simulation import Target, remove_sqlite, sqlite_url

_files = itertools.count(100)


@pytest.fixture
def sqlite_target() -> Iterator[Target]:
    """One SQLite file (in /dev/shm when it exists), reused by every schedule of a test."""
    url = sqlite_url(worker=next(_files))
    target = Target(url)
    try:
        yield target
    finally:
        target.close()
        remove_sqlite(url)
