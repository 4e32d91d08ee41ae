"""PostgreSQL-specific behaviour against the real throwaway server."""

from __future__ import annotations

import logging
import socket
import time

import psycopg
import pytest
from pyspark.sql import SparkSession

from sparkonce import PostgresSink, SinkUnavailableError
from sparkonce.ledger import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.inspect import inspector_for

pytestmark = pytest.mark.postgres


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_database_names_host_and_port_after_bounded_retries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    port = closed_port()
    sink = PostgresSink(f"postgresql://app:s3cret-pw@127.0.0.1:{port}/orders", "t")
    caplog.set_level(logging.WARNING, logger="sparkonce")
    started = time.monotonic()
    with pytest.raises(SinkUnavailableError) as info:
        sink.open()
    elapsed = time.monotonic() - started
    msg = str(info.value)
    assert f"127.0.0.1:{port}" in msg
    assert "after 4 attempt(s)" in msg
    assert "s3cret-pw" not in msg and "s3cret-pw" not in repr(sink)
    retries = [r for r in caplog.records if "not reachable" in r.getMessage()]
    assert len(retries) == 3
    assert elapsed < 30  # bounded: 0.5 + 1 + 2 s of backoff plus refused connects


def test_missing_database_is_reported_without_retrying(pg_server: object) -> None:
    from tests.services.postgres import PostgresServer

    assert isinstance(pg_server, PostgresServer)
    sink = PostgresSink(
        f"postgresql://{pg_server.user}@{pg_server.host}:{pg_server.port}/no_such_db", "t"
    )
    with pytest.raises(SinkUnavailableError, match="no_such_db") as info:
        sink.open()
    assert "after 1 attempt(s)" in str(info.value)


def test_a_connection_dropped_during_commit_is_retried_and_commits_once(
    spark: SparkSession, pg_url: str
) -> None:
    sink = PostgresSink(pg_url, "out", mode="upsert", keys=["k"])
    df = spark.createDataFrame([("a", 1), ("b", 2)], "k string, v long")
    batch = BatchRanges((OffsetRange("t", 0, 0, 2),))
    with sink:
        epoch = sink.acquire("p").epoch
        # Kill the sink's server session from outside, as a network drop or restart would.
        pid = sink.conn.info.backend_pid
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        result = sink.commit(BatchContext("p", epoch, batch, 0), df)
        assert not result.skipped and result.row_count == 2
        again = sink.commit(BatchContext("p", epoch, batch, 0), df)
        assert again.skipped
        assert sorted((r["k"], r["v"]) for r in inspector_for(sink).rows()) == [("a", 1), ("b", 2)]
        assert [e.seq for e in sink.ledger("p")] == [0]


def test_commit_waits_for_a_concurrent_epoch_bump_and_is_then_fenced(pg_url: str) -> None:
    """The owner row lock orders an in-flight commit and a takeover: no interleaving."""
    from sparkonce.errors import FencedError

    old = PostgresSink(pg_url, "out")
    new = PostgresSink(pg_url, "out")
    with old, new:
        epoch = old.acquire("p").epoch
        # The newer run holds the owner row while it bumps the epoch...
        new.conn.execute("BEGIN")
        new.conn.execute("SELECT epoch FROM sparkonce_owner WHERE pipeline = 'p' FOR UPDATE")
        new.conn.execute("UPDATE sparkonce_owner SET epoch = epoch + 1 WHERE pipeline = 'p'")
        # ...so the old run's step 1 blocks until the bump commits, then sees it.
        old.conn.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            old.conn.execute("BEGIN")
            old.conn.execute("SELECT epoch FROM sparkonce_owner WHERE pipeline = 'p' FOR UPDATE")
        old.conn.execute("ROLLBACK")
        new.conn.execute("COMMIT")
        old.conn.execute("SET lock_timeout = 0")
        from sparkonce.ledger.sql import SqlLedger

        ledger = SqlLedger(old.dialect)
        old.conn.execute("BEGIN")
        with pytest.raises(FencedError):
            ledger.check_owner(old.conn, "p", epoch)
        old.conn.execute("ROLLBACK")


def test_opening_a_sink_takes_no_lock_while_other_runs_commit(pg_url: str) -> None:
    """Every run opens its sink (ensure_schema) while other runs of the same database may be
    committing. With the schema complete, that open must not wait on their transactions:
    CREATE INDEX and ALTER TABLE lock the table even with IF NOT EXISTS, which deadlocked
    concurrent runs (the PostgreSQL simulation found it)."""
    from sparkonce.config import StoreURL
    from sparkonce.db import PostgresDialect, connect
    from sparkonce.ledger.sql import LEDGER_TABLE, SPARK_BATCH_INDEX, SqlLedger

    ledger = SqlLedger(PostgresDialect())
    first = connect(StoreURL.parse(pg_url))
    ledger.ensure_schema(first)
    # Another run's commit in flight: it holds a row lock on the ledger table.
    first.execute("BEGIN")
    first.execute(
        f"INSERT INTO {LEDGER_TABLE} (pipeline, seq, ranges, epoch, row_count, committed_at) "
        "VALUES ('other', 0, '[]', 1, 0, now())"
    )
    second = connect(StoreURL.parse(pg_url))
    second.execute("SET lock_timeout = '2s'")
    started = time.monotonic()
    ledger.ensure_schema(second)  # would wait for the insert above, then time out
    assert time.monotonic() - started < 2
    first.execute("ROLLBACK")

    # An older ledger (no index, no newer columns) gets them, once, on open.
    second.execute("BEGIN")
    second.execute(f"DROP INDEX {SPARK_BATCH_INDEX}")
    second.execute(f"ALTER TABLE {LEDGER_TABLE} DROP COLUMN commit_seconds")
    second.execute("COMMIT")
    ledger.ensure_schema(second)
    row = second.execute(
        "SELECT to_regclass(%s), count(*) FROM information_schema.columns "
        "WHERE table_name = %s AND column_name = 'commit_seconds'",
        (SPARK_BATCH_INDEX, LEDGER_TABLE),
    ).fetchone()
    assert row is not None and row[0] is not None and row[1] == 1
    # PostgreSQL's own types, not SQLite's (ledger.sql ensure_schema mutants 3 and 23 gave
    # PostgreSQL the SQLite names; the mutation selection runs SQLite only).
    types = dict(
        second.execute(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s",
            (LEDGER_TABLE,),
        ).fetchall()
    )
    assert types["committed_at"] == "timestamp with time zone", types
    assert (types["seq"], types["stateful"]) == ("bigint", "boolean"), types
    assert types["commit_seconds"] == "double precision", types
    first.close()
    second.close()
