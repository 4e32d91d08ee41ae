"""The SQL ledger on a real PostgreSQL server: the column types it declares there, and an
entry's round trip. In the mutation run's fast set (marker ``mutation_pg``: the run starts
one server), so that the PostgreSQL side of sparkonce.ledger.sql is mutation tested too."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from sparkonce.config import StoreURL
from sparkonce.db import dialect_for
from sparkonce.ledger.base import LedgerEntry
from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE, SqlLedgerStore
from sparkonce.offsets import BatchRanges

pytestmark = pytest.mark.mutation_pg


def _types(url: str, table: str) -> dict[str, str]:
    with psycopg.connect(url) as conn:  # an independent reader: PostgreSQL's catalog
        rows = conn.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (table,),
        ).fetchall()
    return {name: kind for name, kind in rows}


def test_the_ledger_declares_postgresqls_own_types(pg_url: str) -> None:
    url = StoreURL.parse(pg_url)
    store = SqlLedgerStore(url, dialect_for(url))
    store.conn  # noqa: B018 - connects and creates the tables
    store.close()
    ledger = _types(pg_url, LEDGER_TABLE)
    assert {c: ledger[c] for c in ("seq", "epoch", "row_count", "spark_batch_id")} == dict.fromkeys(
        ("seq", "epoch", "row_count", "spark_batch_id"), "bigint"
    )
    assert (ledger["committed_at"], ledger["stateful"], ledger["commit_seconds"]) == (
        "timestamp with time zone",
        "boolean",
        "double precision",
    )
    owner = _types(pg_url, OWNER_TABLE)
    assert (owner["epoch"], owner["acquired_at"]) == ("bigint", "timestamp with time zone")


def test_an_entry_round_trips_with_its_flag_time_and_seconds(pg_url: str) -> None:
    url = StoreURL.parse(pg_url)
    store = SqlLedgerStore(url, dialect_for(url))
    owner = store.acquire("p")
    ranges = BatchRanges.from_json('{"t": {"0": [0, 5], "1": [3, 9]}}')
    before = datetime.now(UTC)
    entry = LedgerEntry("p", 0, ranges, owner.epoch, 11, before, 7, "chk", True, 0.25)
    with store.transaction() as txn:
        store.record(txn, entry)
    (read,) = store.entries("p")
    store.close()
    assert (read.seq, read.ranges, read.epoch, read.row_count) == (0, ranges, owner.epoch, 11)
    assert (read.spark_batch_id, read.checkpoint_id, read.stateful) == (7, "chk", True)
    assert read.commit_seconds == 0.25
    # The database's own commit time, as a time zone aware timestamp.
    assert read.committed_at.tzinfo is not None
    assert abs(read.committed_at - before) < timedelta(minutes=5)
    with psycopg.connect(pg_url) as conn:
        kinds = conn.execute(
            f"SELECT pg_typeof(stateful)::text, stateful FROM {LEDGER_TABLE}"
        ).fetchone()
    assert kinds == ("boolean", True)
