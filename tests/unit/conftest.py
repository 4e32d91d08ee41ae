"""Fixtures shared by the unit tests: temporary SQLite stores and log roots (no Spark)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkonce.config import StoreURL
from sparkonce.db import SQLiteDialect, connect
from sparkonce.ledger.sql import SqlLedger


@pytest.fixture
def store_url(tmp_path: Path) -> StoreURL:
    return StoreURL.parse(f"sqlite:///{tmp_path / 'sink.db'}")


@pytest.fixture
def conn(store_url: StoreURL) -> Iterator[Any]:
    c = connect(store_url)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def ledger(conn: Any) -> SqlLedger:
    led = SqlLedger(SQLiteDialect())
    led.ensure_schema(conn)
    return led


@pytest.fixture
def log_root(tmp_path: Path) -> Path:
    return tmp_path / "log"
