"""Tests of sparkonce.ledger.sql over a SQLite file (no Spark)."""

from __future__ import annotations

import sqlite3
import threading
from datetime import UTC, datetime
from typing import Any

import pytest

from sparkonce.config import StoreURL
from sparkonce.db import SQLiteDialect, connect, dialect_for
from sparkonce.errors import ConfigError, FencedError, SinkError
from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE, SqlLedger, SqlLedgerStore
from sparkonce.offsets import BatchRanges, OffsetRange


def _b(*ranges: tuple[str, int, int, int]) -> BatchRanges:
    return BatchRanges(tuple(OffsetRange(*r) for r in ranges))


def _record(
    ledger: SqlLedger,
    conn: Any,
    seq: int,
    ranges: BatchRanges,
    *,
    pipeline: str = "p",
    epoch: int = 1,
    rows: int = 0,
    batch_id: int | None = None,
    checkpoint: str | None = None,
    seconds: float | None = None,
) -> None:
    ledger.record(
        conn,
        pipeline=pipeline,
        seq=seq,
        ranges=ranges,
        epoch=epoch,
        row_count=rows,
        spark_batch_id=batch_id,
        checkpoint_id=checkpoint,
        commit_seconds=seconds,
    )


def test_ensure_schema_is_idempotent(conn: Any, ledger: SqlLedger) -> None:
    ledger.ensure_schema(conn)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {OWNER_TABLE, LEDGER_TABLE} <= tables
    # SQLite's own type names (ensure_schema mutants 2, 7, 22 and 27 gave SQLite
    # PostgreSQL's, which it takes without a word): what other tools reading the file see.
    declared = {r[1]: r[2] for r in conn.execute(f"PRAGMA table_info({LEDGER_TABLE})")}
    # commit_seconds too: ensure_schema mutant 31 declared it "None", which SQLite also takes.
    assert (
        declared["committed_at"],
        declared["stateful"],
        declared["seq"],
        declared["commit_seconds"],
    ) == ("TEXT", "INTEGER", "INTEGER", "REAL")
    owner = {r[1]: r[2] for r in conn.execute(f"PRAGMA table_info({OWNER_TABLE})")}
    assert owner["acquired_at"] == "TEXT"


@pytest.mark.parametrize("keep", [0, -1, 1.5, "3"])
def test_ledger_keep_must_be_a_positive_integer(tmp_path: Any, keep: Any) -> None:
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'l.db'}")
    with pytest.raises(ConfigError, match="ledger_keep must be an integer >= 1"):
        SqlLedgerStore(url, dialect_for(url), keep=keep)
    # 1, the smallest, is taken (SqlLedgerStore.__init__ mutant 13 refused it).
    assert SqlLedgerStore(url, dialect_for(url), keep=1).keep == 1


def test_a_store_made_without_a_hint_fences_naming_the_generic_status_command(
    tmp_path: Any,
) -> None:
    """The default hint is none, so FencedError names its generic command (SqlLedgerStore
    __init__ mutant 1 gave the default a text of its own, which the message then showed)."""
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'l.db'}")
    store = SqlLedgerStore(url, dialect_for(url))
    store.acquire("p")
    store.acquire("p")
    with store.transaction() as txn, pytest.raises(FencedError) as info:
        store.check_owner(txn, "p", 1)
    store.close()
    assert "(its host and pid are shown by: sparkonce status --pipeline p --sink <SINK_URL>)" in (
        str(info.value)
    )


def test_a_closed_store_opens_a_new_connection_on_its_next_use(tmp_path: Any) -> None:
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'l.db'}")
    store = SqlLedgerStore(url, dialect_for(url))
    first = store.conn
    store.close()
    assert not store.connected
    assert store.conn is not first and store.connected  # close mutant 2 left it unusable
    store.close()


def test_acquire_increments_per_pipeline(conn: Any, ledger: SqlLedger) -> None:
    assert ledger.owner(conn, "a") is None
    assert [ledger.acquire(conn, "a").epoch for _ in range(3)] == [1, 2, 3]
    assert [ledger.acquire(conn, "b").epoch for _ in range(2)] == [1, 2]
    taken = ledger.acquire(conn, "a", "sparkonce-log:///data?topic=t")
    assert (taken.pipeline, taken.epoch) == ("a", 4)
    assert taken == ledger.owner(conn, "a")  # what it returns is what it stored
    # SQLite keeps times as ISO 8601 text ("T" between date and time), as other readers expect.
    [(text,)] = conn.execute(f"SELECT acquired_at FROM {OWNER_TABLE} WHERE pipeline = 'a'")
    assert text == taken.acquired_at.isoformat()
    owner = ledger.owner(conn, "a")
    assert owner is not None
    assert (owner.pipeline, owner.epoch) == ("a", 4)
    assert owner.acquired_at.tzinfo is not None
    assert abs((datetime.now(UTC) - owner.acquired_at).total_seconds()) < 60
    assert "pid" in owner.holder
    assert sorted(ledger.pipelines(conn)) == ["a", "b"]


def test_acquire_from_two_connections_never_repeats_an_epoch(
    store_url: StoreURL, ledger: SqlLedger
) -> None:
    epochs: list[int] = []
    lock = threading.Lock()

    def take() -> None:
        c = connect(store_url)
        try:
            for _ in range(10):
                e = SqlLedger(SQLiteDialect()).acquire(c, "p").epoch
                with lock:
                    epochs.append(e)
        finally:
            c.close()

    threads = [threading.Thread(target=take) for _ in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert sorted(epochs) == list(range(1, 31))


def test_check_owner(conn: Any, ledger: SqlLedger) -> None:
    ledger.acquire(conn, "orders")
    ledger.check_owner(conn, "orders", 1)  # the owner: no error
    ledger.acquire(conn, "orders")
    with pytest.raises(FencedError) as info:
        ledger.check_owner(conn, "orders", 1)
    err = info.value
    assert isinstance(err, SinkError) and not err.retryable
    assert (err.pipeline, err.epoch, err.owner_epoch) == ("orders", 1, 2)
    msg = str(err)
    assert "'orders'" in msg and "epoch 1" in msg and "is now 2" in msg
    assert "sparkonce status --pipeline orders" in msg
    # Who holds the newer epoch, so the operator can check that it is alive.
    holder = ledger.owner(conn, "orders").holder  # type: ignore[union-attr]
    assert err.holder == holder and f"taken by {holder}" in msg
    assert "is alive" in msg and "start the pipeline again" in msg
    ledger.check_owner(conn, "orders", 2)


def test_check_owner_of_an_unknown_pipeline_is_fenced(conn: Any, ledger: SqlLedger) -> None:
    with pytest.raises(FencedError) as info:
        ledger.check_owner(conn, "never", 1)
    assert info.value.owner_epoch == 0
    assert info.value.holder == "" and "taken by" not in str(info.value)  # no run holds it


def test_check_owner_uses_the_custom_hint(conn: Any) -> None:
    ledger = SqlLedger(SQLiteDialect(), inspect_hint="look at the dashboard")
    ledger.ensure_schema(conn)
    with pytest.raises(FencedError, match="look at the dashboard"):
        ledger.check_owner(conn, "p", 3)


def test_record_last_end_offsets_entries_round_trip(conn: Any, ledger: SqlLedger) -> None:
    assert ledger.last(conn, "p") is None
    assert ledger.end_offsets(conn, "p") == {}
    assert ledger.entries(conn, "p") == []
    b0 = _b(("t", 0, 0, 5), ("t", 1, 0, 3))
    b1 = _b(("t", 0, 5, 9), ("t", 1, 3, 3))
    _record(ledger, conn, 0, b0, epoch=1, rows=8, batch_id=0, checkpoint="cp")
    _record(ledger, conn, 1, b1, epoch=2, rows=4, batch_id=None, checkpoint=None)
    _record(ledger, conn, 0, _b(("u", 0, 0, 1)), pipeline="other")
    last = ledger.last(conn, "p")
    assert last is not None
    assert (last.pipeline, last.seq, last.ranges, last.epoch, last.row_count) == (
        "p",
        1,
        b1,
        2,
        4,
    )
    assert (last.spark_batch_id, last.checkpoint_id) == (None, None)
    assert ledger.end_offsets(conn, "p") == {("t", 0): 9, ("t", 1): 3}
    entries = ledger.entries(conn, "p")
    assert [e.seq for e in entries] == [0, 1]
    assert entries[0].ranges == b0
    assert (entries[0].spark_batch_id, entries[0].checkpoint_id) == (0, "cp")
    assert entries[0].committed_at <= entries[1].committed_at
    assert entries[0].committed_at.tzinfo is not None
    assert ledger.end_offsets(conn, "other") == {("u", 0): 1}


def test_record_refuses_a_duplicate_seq(conn: Any, ledger: SqlLedger) -> None:
    _record(ledger, conn, 0, _b(("t", 0, 0, 1)))
    with pytest.raises(sqlite3.IntegrityError):
        _record(ledger, conn, 0, _b(("t", 0, 1, 2)))
    assert len(ledger.entries(conn, "p")) == 1


def test_find_no_data_batch(conn: Any, ledger: SqlLedger) -> None:
    _record(ledger, conn, 0, _b(("t", 0, 0, 5)), batch_id=0, checkpoint="cp1")
    _record(ledger, conn, 1, _b(("t", 0, 5, 5)), batch_id=1, checkpoint="cp1")
    _record(ledger, conn, 0, _b(("t", 0, 5, 5)), pipeline="q", batch_id=1, checkpoint="cp1")
    assert ledger.find_no_data_batch(conn, "p", "cp1", 1) == 1
    # Entry 0 has the identity (cp1, 0) but covers offsets: it is not a no-data batch (an
    # older run of a restored checkpoint can share the identity with a no-data batch).
    assert ledger.find_no_data_batch(conn, "p", "cp1", 0) is None
    assert ledger.find_no_data_batch(conn, "p", "cp1", 2) is None
    assert ledger.find_no_data_batch(conn, "p", "cp2", 1) is None
    assert ledger.find_no_data_batch(conn, "p", None, 1) is None
    assert ledger.find_no_data_batch(conn, "q", "cp1", 1) == 0


def test_the_newest_no_data_batch_of_a_spark_identity_is_found(
    conn: Any, ledger: SqlLedger
) -> None:
    # A restored checkpoint can commit a no-data batch of the same identity again: the
    # newest entry answers (rows are sorted by seq in Python, not by the query).
    for seq in (1, 3, 2):
        _record(ledger, conn, seq, _b(("t", 0, 5, 5)), batch_id=7, checkpoint="cp1")
    assert ledger.find_no_data_batch(conn, "p", "cp1", 7) == 3


def test_entry_reads_one_entry_of_its_pipeline_or_none(conn: Any, ledger: SqlLedger) -> None:
    _record(ledger, conn, 0, _b(("t", 0, 0, 5)), rows=5)
    entry = ledger.entry(conn, "p", 0)
    assert entry is not None and (entry.pipeline, entry.seq, entry.row_count) == ("p", 0, 5)
    assert ledger.entry(conn, "p", 1) is None


def test_pruning_an_empty_ledger_deletes_nothing(conn: Any, ledger: SqlLedger) -> None:
    assert ledger.prune(conn, "p", 1) == 0


@pytest.mark.parametrize("no_data", [1, 101])
def test_pruning_keeps_a_data_batch_that_ends_at_the_ledger_end(
    conn: Any, ledger: SqlLedger, no_data: int
) -> None:
    # The data batch and the no-data batches after it all end at the ledger's end: none is
    # pruned, however many no-data batches follow (the walk reads 100 entries at a time).
    _record(ledger, conn, 0, _b(("t", 0, 0, 5)))
    for seq in range(1, no_data + 1):
        _record(ledger, conn, seq, _b(("t", 0, 5, 5)))
    assert ledger.prune(conn, "p", 1) == 0
    assert len(ledger.entries(conn, "p")) == no_data + 1


def test_only_a_closed_sqlite_connection_is_a_lost_connection(tmp_path: Any) -> None:
    # The committer retries what the store calls a lost connection: on SQLite, only the
    # error of using a closed connection; another error that says "closed" is the batch's.
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")
    store = SqlLedgerStore(url, dialect_for(url))
    conn = store.conn
    conn.close()
    with pytest.raises(sqlite3.ProgrammingError) as closed:
        conn.execute("SELECT 1")
    assert store.is_connection_error(closed.value)
    assert not store.is_connection_error(ValueError("I/O operation on closed file"))
    assert not store.is_connection_error(sqlite3.ProgrammingError("Incorrect number of bindings"))
    store.reconnect()


def test_a_ledger_table_from_an_older_sparkonce_gets_the_new_columns(tmp_path: Any) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(
        f"""
        CREATE TABLE {OWNER_TABLE} (pipeline TEXT PRIMARY KEY, epoch INTEGER NOT NULL,
            acquired_at TEXT NOT NULL, holder TEXT NOT NULL, source TEXT);
        CREATE TABLE {LEDGER_TABLE} (pipeline TEXT NOT NULL, seq INTEGER NOT NULL,
            ranges TEXT NOT NULL, epoch INTEGER NOT NULL, row_count INTEGER NOT NULL,
            committed_at TEXT NOT NULL, spark_batch_id INTEGER, checkpoint_id TEXT,
            PRIMARY KEY (pipeline, seq));
        INSERT INTO {LEDGER_TABLE} VALUES ('p', 0, '{_b(("t", 0, 0, 5)).to_json()}', 1, 5,
            '2026-01-01T00:00:00+00:00', 0, 'q');
        """
    )
    old.commit()
    old.close()
    conn = connect(StoreURL.parse(f"sqlite:///{path}"))
    ledger = SqlLedger(SQLiteDialect())
    ledger.ensure_schema(conn)
    ledger.ensure_schema(conn)  # twice: the columns are added once
    declared = [(str(r[1]), str(r[2])) for r in conn.execute(f"PRAGMA table_info({LEDGER_TABLE})")]
    # Added with SQLite's type names (ensure_schema mutant 44 declared "XXINTEGERXX").
    assert declared[-3:] == [
        ("version", "INTEGER"),
        ("stateful", "INTEGER"),
        ("commit_seconds", "REAL"),
    ]
    _record(ledger, conn, 1, _b(("t", 0, 5, 9)), rows=4, seconds=1.25)
    first, second = ledger.entries(conn, "p")
    conn.close()
    assert (first.row_count, first.stateful, first.commit_seconds) == (5, None, None)
    assert (second.row_count, second.commit_seconds) == (4, 1.25)
