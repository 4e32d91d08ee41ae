"""Tests of the SQL sinks' commit protocol (SqlSink.commit_rows) on SQLite, without Spark.

``commit_rows`` takes Python row tuples, so a batch is committed exactly as the driver
would commit it, minus the ``DataFrame.toArrow()`` collection.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from datetime import date
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sparkonce.config import StoreURL
from sparkonce.errors import ConfigError, FencedError, LedgerError, SinkError
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.protocol import CRASH_ENV
from sparkonce.sinks import PostgresSink, SQLiteSink, SqlSink, sink_from_url
from sparkonce.sinks.inspect import inspector_for, relocate

SCHEMA = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
COLS = ["id", "v"]
SECRET = "hunter2-S3cret"


def _b(*ranges: tuple[str, int, int, int]) -> BatchRanges:
    return BatchRanges(tuple(OffsetRange(*r) for r in ranges))


@pytest.fixture
def sink(store_url: StoreURL) -> Iterator[SQLiteSink]:
    s = SQLiteSink(store_url, "out")
    yield s
    s.close()


@pytest.fixture
def upsert_sink(store_url: StoreURL) -> Iterator[SQLiteSink]:
    s = SQLiteSink(store_url, "out", mode="upsert", keys=["id"])
    yield s
    s.close()


def _commit(
    sink: SQLiteSink,
    epoch: int,
    ranges: BatchRanges,
    rows: list[tuple[Any, ...]],
    *,
    batch_id: int = 0,
    checkpoint: str | None = "cp",
    pipeline: str = "p",
) -> CommitResult:
    ctx = BatchContext(pipeline, epoch, ranges, batch_id, checkpoint)
    return sink.commit_rows(ctx, SCHEMA, COLS, rows)


def _rows(sink: SQLiteSink) -> list[tuple[Any, ...]]:
    return sorted((r["id"], r["v"]) for r in inspector_for(sink).rows())


# -- the commit protocol ------------------------------------------------------------------


def test_new_batch_commits_rows_and_ledger_row(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    r0 = _b(("t", 0, 0, 2), ("t", 1, 0, 1))
    res = _commit(sink, epoch, r0, [(1, "a"), (2, "b"), (3, "c")], batch_id=0)
    assert res == CommitResult(False, 3, 0)
    # Where the commit's time went, step by step (a replay or no-op below has no split).
    assert list(res.timings) == ["look", "stage", "commit", "after"]
    assert all(v >= 0 for v in res.timings.values()) and res.timings["commit"] > 0
    assert _rows(sink) == [(1, "a"), (2, "b"), (3, "c")]
    (entry,) = sink.ledger("p")
    assert (entry.seq, entry.ranges, entry.epoch, entry.row_count) == (0, r0, epoch, 3)
    assert (entry.spark_batch_id, entry.checkpoint_id) == (0, "cp")
    assert sink.end_offsets("p") == {("t", 0): 2, ("t", 1): 1}

    r1 = _b(("t", 0, 2, 4), ("t", 1, 1, 1))
    res = _commit(sink, epoch, r1, [(4, "d")], batch_id=1)
    assert (res.skipped, res.row_count, res.seq) == (False, 1, 1)
    assert [e.seq for e in sink.ledger("p")] == [0, 1]
    assert sink.end_offsets("p") == {("t", 0): 4, ("t", 1): 1}
    assert len(_rows(sink)) == 4


def test_replayed_batch_is_skipped_and_changes_nothing(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    r0 = _b(("t", 0, 0, 2))
    _commit(sink, epoch, r0, [(1, "a"), (2, "b")])
    before = (_rows(sink), sink.ledger("p"))
    again = _commit(sink, epoch, r0, [(1, "a"), (2, "b")])
    assert again.skipped and again.timings == {}
    assert again.skipped is True
    assert again.row_count == 0
    assert "replay" in again.reason
    # a replay by a newer run, with different rows (a non-deterministic transform)
    epoch2 = sink.acquire("p").epoch
    other = _commit(sink, epoch2, r0, [(9, "zz")], batch_id=7, checkpoint="cp-new")
    assert other.skipped is True
    assert (_rows(sink), sink.ledger("p")) == before


def test_replay_reports_the_covering_ledger_entry(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, _b(("t", 0, 0, 2)), [(1, "a")])
    assert _commit(sink, epoch, _b(("t", 0, 0, 2)), [(1, "a")]).seq == 0


def test_fenced_epoch_raises_and_writes_nothing(sink: SQLiteSink) -> None:
    old = sink.acquire("orders").epoch
    new = sink.acquire("orders").epoch
    with pytest.raises(FencedError) as info:
        _commit(sink, old, _b(("t", 0, 0, 2)), [(1, "a")], pipeline="orders")
    assert (info.value.pipeline, info.value.epoch, info.value.owner_epoch) == ("orders", old, new)
    assert "sparkonce status" in str(info.value)
    assert inspector_for(sink).rows() == []
    assert sink.ledger("orders") == []
    # the connection is not left inside a transaction: the owner can still commit
    assert not sink.conn.in_transaction
    res = _commit(sink, new, _b(("t", 0, 0, 2)), [(1, "a")], pipeline="orders")
    assert not res.skipped
    # a zombie cannot commit a later batch either
    with pytest.raises(FencedError):
        _commit(sink, old, _b(("t", 0, 2, 3)), [(2, "b")], pipeline="orders")
    assert _rows(sink) == [(1, "a")]


def test_fencing_is_per_pipeline(sink: SQLiteSink) -> None:
    a = sink.acquire("a").epoch
    sink.acquire("b")
    sink.acquire("b")
    assert not _commit(sink, a, _b(("t", 0, 0, 1)), [(1, "a")], pipeline="a").skipped
    with pytest.raises(FencedError):
        _commit(sink, 1, _b(("t", 0, 0, 1)), [(1, "a")], pipeline="b")
    with pytest.raises(FencedError):  # a pipeline that never acquired an epoch
        _commit(sink, 1, _b(("t", 0, 0, 1)), [(1, "a")], pipeline="c")


def test_fenced_error_from_a_sink_names_the_pipeline_in_its_command(sink: SQLiteSink) -> None:
    sink.acquire("orders")
    sink.acquire("orders")
    with pytest.raises(FencedError) as info:
        _commit(sink, 1, _b(("t", 0, 0, 1)), [(1, "a")], pipeline="orders")
    msg = str(info.value)
    assert "{pipeline}" not in msg
    assert "sparkonce status --pipeline orders" in msg


def test_gap_raises_and_commits_nothing(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, _b(("t", 0, 0, 2)), [(1, "a")])
    with pytest.raises(LedgerError, match="would be skipped"):
        _commit(sink, epoch, _b(("t", 0, 3, 5)), [(2, "b")], batch_id=1)
    with pytest.raises(LedgerError, match="only in part"):
        _commit(sink, epoch, _b(("t", 0, 1, 5)), [(2, "b")], batch_id=1)
    assert _rows(sink) == [(1, "a")]
    assert [e.seq for e in sink.ledger("p")] == [0]
    assert not sink.conn.in_transaction


def test_upsert_replaces_by_key(upsert_sink: SQLiteSink) -> None:
    s = upsert_sink
    epoch = s.acquire("p").epoch
    _commit(s, epoch, _b(("t", 0, 0, 2)), [(1, "a"), (2, "b")])
    res = _commit(s, epoch, _b(("t", 0, 2, 4)), [(2, "B"), (3, "c")], batch_id=1)
    assert (res.skipped, res.row_count, res.seq) == (False, 2, 1)
    assert _rows(s) == [(1, "a"), (2, "B"), (3, "c")]
    pk = [r[1] for r in s.conn.execute("PRAGMA table_info(out)") if r[5]]
    assert pk == ["id"]


def test_upsert_with_only_key_columns(store_url: StoreURL) -> None:
    s = SQLiteSink(store_url, "out", mode="upsert", keys=["id", "v"])
    try:
        epoch = s.acquire("p").epoch
        _commit(s, epoch, _b(("t", 0, 0, 1)), [(1, "a")])
        _commit(s, epoch, _b(("t", 0, 1, 3)), [(1, "a"), (1, "b")], batch_id=1)
        assert _rows(s) == [(1, "a"), (1, "b")]
    finally:
        s.close()


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([(5, "x"), (2, "y"), (5, "z")], r"2 rows for key \{'id': 5\}.*set latest_by="),
        ([(6, "x"), (None, "y")], r"NULL key \{'id': None\}"),
    ],
)
def test_upsert_bad_keys_commit_nothing(
    upsert_sink: SQLiteSink, rows: list[tuple[Any, ...]], match: str
) -> None:
    s = upsert_sink
    epoch = s.acquire("p").epoch
    _commit(s, epoch, _b(("t", 0, 0, 1)), [(1, "a")])
    with pytest.raises(SinkError, match=match) as info:
        _commit(s, epoch, _b(("t", 0, 1, 4)), rows, batch_id=1)
    assert "Nothing of this batch was committed" in str(info.value)
    assert _rows(s) == [(1, "a")]
    assert s.end_offsets("p") == {("t", 0): 1}


# -- upsert with latest_by: a key repeated inside one batch -----------------------------------

CDC = T.StructType(
    [
        T.StructField("k", T.StringType()),
        T.StructField("v", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
    ]
)
CDC_COLS = ["k", "v", "partition", "offset"]


def _cdc_sink(store_url: StoreURL, **kwargs: Any) -> SQLiteSink:
    return SQLiteSink(store_url, "latest", mode="upsert", keys=["k"], **kwargs)


def _commit_cdc(
    sink: SQLiteSink, epoch: int, ranges: BatchRanges, rows: list[tuple[Any, ...]], batch: int = 0
) -> CommitResult:
    return sink.commit_rows(BatchContext("p", epoch, ranges, batch, "cp"), CDC, CDC_COLS, rows)


def _latest(sink: SQLiteSink) -> dict[str, str]:
    return {r["k"]: r["v"] for r in inspector_for(sink).rows()}


def test_a_key_repeated_in_a_batch_without_latest_by_is_refused_naming_it(
    store_url: StoreURL,
) -> None:
    """The reported block: a CDC stream updates k1 three times in one micro-batch."""
    sink = _cdc_sink(store_url)
    try:
        epoch = sink.acquire("p").epoch
        rows = [("k1", "a", 0, 0), ("k2", "x", 1, 0), ("k1", "b", 0, 1), ("k1", "c", 0, 2)]
        with pytest.raises(SinkError) as info:
            _commit_cdc(sink, epoch, _b(("t", 0, 0, 3), ("t", 1, 0, 1)), rows)
        msg = str(info.value)
        assert "the batch holds 3 rows for key {'k': 'k1'}" in msg
        assert "latest_by=[...]" in msg and "'partition' and 'offset'" in msg
        assert "Nothing of this batch was committed" in msg
        assert sink.ledger("p") == []
    finally:
        sink.close()


def test_latest_by_keeps_the_row_with_the_greatest_tuple(store_url: StoreURL) -> None:
    sink = _cdc_sink(store_url, latest_by=["partition", "offset"])
    try:
        sink.validate(CDC)
        epoch = sink.acquire("p").epoch
        rows = [
            ("k1", "b", 0, 1),
            ("k1", "c", 0, 12),  # offset 12 > 2: compared as numbers, not as text
            ("k2", "x", 1, 0),
            ("k1", "a", 0, 0),
            ("k1", "late-but-lower", 0, 2),
            ("k3", "p0", 0, 9),
            ("k3", "p1", 1, 3),  # a higher partition wins over a higher offset
        ]
        res = _commit_cdc(sink, epoch, _b(("t", 0, 0, 13), ("t", 1, 0, 4)), rows)
        assert (res.skipped, res.row_count, res.seq) == (False, 7, 0)
        # 7 rows received, 3 written (one per key): the result names both counts.
        assert (res.rows_written, res.written) == (3, 3)
        assert sink.ledger("p")[0].row_count == 7  # the ledger counts the batch's rows
        assert _latest(sink) == {"k1": "c", "k2": "x", "k3": "p1"}
        # The latest_by columns are output columns: written like any other.
        assert {(r["k"], r["partition"], r["offset"]) for r in inspector_for(sink).rows()} == {
            ("k1", 0, 12),
            ("k2", 1, 0),
            ("k3", 1, 3),
        }
        # The next batch updates by key as before; a repeated key again keeps its latest row.
        rows = [("k1", "d", 0, 14), ("k1", "e", 0, 13)]
        res = _commit_cdc(sink, epoch, _b(("t", 0, 13, 15)), rows, batch=1)
        assert (res.row_count, res.written) == (2, 1)
        assert _latest(sink) == {"k1": "d", "k2": "x", "k3": "p1"}
        # A batch without a repeated key writes each of its rows: nothing apart to report.
        res = _commit_cdc(sink, epoch, _b(("t", 1, 4, 5)), [("k4", "q", 1, 4)], batch=2)
        assert (res.row_count, res.rows_written, res.written) == (1, None, 1)
    finally:
        sink.close()


def test_latest_by_tie_is_refused_naming_the_key(store_url: StoreURL) -> None:
    sink = _cdc_sink(store_url, latest_by=["offset"])
    try:
        epoch = sink.acquire("p").epoch
        # offset alone cannot order rows of one key read from two partitions
        rows = [("k1", "a", 0, 5), ("k2", "x", 0, 6), ("k1", "b", 1, 5)]
        with pytest.raises(SinkError) as info:
            _commit_cdc(sink, epoch, _b(("t", 0, 0, 7), ("t", 1, 0, 6)), rows)
        msg = str(info.value)
        assert "several rows for key {'k': 'k1'} with the same latest_by values {'offset': 5}" in (
            msg
        )
        assert "Nothing of this batch was committed" in msg
        assert inspector_for(sink).rows() == [] and sink.ledger("p") == []
    finally:
        sink.close()


def test_latest_by_null_is_lowest_and_typed_values_compare_as_values(
    store_url: StoreURL,
) -> None:
    """On SQLite decimals and timestamps reach the commit as text; they compare as values."""
    from datetime import UTC, datetime

    schema = T.StructType(
        [
            T.StructField("k", T.StringType()),
            T.StructField("version", T.DecimalType(10, 2)),
            T.StructField("at", T.TimestampType()),
        ]
    )
    table = pa.table(
        {
            "k": ["a", "a", "a", "b", "b"],
            "version": pa.array(
                [Decimal("9.50"), Decimal("10.00"), None, None, None], pa.decimal128(10, 2)
            ),
            "at": [
                datetime(2024, 1, 1, tzinfo=UTC),
                datetime(2024, 1, 1, tzinfo=UTC),
                datetime(2025, 1, 1, tzinfo=UTC),
                datetime(2024, 1, 1, 0, 0, 0, 500000, tzinfo=UTC),
                datetime(2024, 1, 1, tzinfo=UTC),
            ],
        }
    )
    sink = SQLiteSink(store_url, "v", mode="upsert", keys=["k"], latest_by=["version", "at"])
    try:
        epoch = sink.acquire("p").epoch
        rows = sink.stager._rows_from_arrow(table, schema)
        ctx = BatchContext("p", epoch, _b(("t", 0, 0, 5)), 0, "cp")
        sink.commit_rows(ctx, schema, ["k", "version", "at"], rows)
        got = {r["k"]: (r["version"], r["at"]) for r in inspector_for(sink).rows()}
        assert got == {
            "a": ("10.00", "2024-01-01T00:00:00+00:00"),
            "b": (None, "2024-01-01T00:00:00.500000+00:00"),
        }
    finally:
        sink.close()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"latest_by": ["offset"]}, r"latest_by=\[...\] only applies to mode='upsert'"),
        ({"mode": "upsert", "keys": ["k"], "latest_by": "offset"}, "must be a list"),
        ({"mode": "upsert", "keys": ["k"], "latest_by": ["o", "o"]}, "names a column twice"),
        ({"mode": "upsert", "keys": ["k"], "latest_by": ["k"]}, r"\['k'\] are also keys"),
        ({"mode": "upsert", "keys": ["k"], "latest_by": ["off set"]}, "latest_by column"),
    ],
)
def test_latest_by_config_errors(store_url: StoreURL, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        SQLiteSink(store_url, "out", **kwargs)


def test_latest_by_must_name_output_columns(store_url: StoreURL) -> None:
    sink = _cdc_sink(store_url, latest_by=["partition", "offset"])
    try:
        with pytest.raises(ConfigError, match=r"latest_by columns \['offset'\] are not columns"):
            sink.validate(T.StructType(CDC.fields[:3]))
        assert "latest_by=['partition', 'offset']" in sink.describe()
        moved = relocate(sink, store_url)
        assert isinstance(moved, SqlSink) and moved.latest_by == ("partition", "offset")
    finally:
        sink.close()


# -- Spark's output modes ------------------------------------------------------------------


@pytest.mark.parametrize("sink_mode", ["append", "upsert"])
def test_complete_mode_replaces_the_table_in_the_batch_transaction(
    store_url: StoreURL, sink_mode: str
) -> None:
    keys = ["id"] if sink_mode == "upsert" else []
    sink = SQLiteSink(store_url, "out", mode=sink_mode, keys=keys)  # type: ignore[arg-type]
    try:
        sink.validate(SCHEMA, "complete")
        assert sink.output_mode == "complete"
        epoch = sink.acquire("p").epoch
        _commit(sink, epoch, _b(("t", 0, 0, 1)), [(1, "a:1")])
        _commit(sink, epoch, _b(("t", 0, 1, 3)), [(1, "a:2"), (2, "b:1")], batch_id=1)
        assert _rows(sink) == [(1, "a:2"), (2, "b:1")]
        # a replay changes nothing
        _commit(sink, epoch, _b(("t", 0, 1, 3)), [(9, "other")], batch_id=1)
        assert _rows(sink) == [(1, "a:2"), (2, "b:1")]
        # a failing batch rolls the DELETE back with everything else
        sink.conn.execute(
            "CREATE TRIGGER no_c BEFORE INSERT ON out WHEN NEW.v = 'bad' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        with pytest.raises(SinkError, match="refused"):
            _commit(sink, epoch, _b(("t", 0, 3, 4)), [(3, "bad")], batch_id=2)
        assert _rows(sink) == [(1, "a:2"), (2, "b:1")]
        # an empty result is a result: the table becomes empty, and the ledger moves on
        res = _commit(sink, epoch, _b(("t", 0, 3, 5)), [], batch_id=3)
        assert (res.skipped, res.seq) == (False, 2)
        assert inspector_for(sink).rows() == []
    finally:
        sink.close()


@pytest.mark.parametrize("output_mode", ["append", "update"])
def test_append_and_update_modes_keep_adding_rows(store_url: StoreURL, output_mode: str) -> None:
    sink = SQLiteSink(store_url, "out")
    try:
        sink.validate(SCHEMA, output_mode)  # type: ignore[arg-type]
        epoch = sink.acquire("p").epoch
        _commit(sink, epoch, _b(("t", 0, 0, 1)), [(1, "a:1")])
        _commit(sink, epoch, _b(("t", 0, 1, 3)), [(1, "a:2"), (2, "b:1")], batch_id=1)
        assert _rows(sink) == [(1, "a:1"), (1, "a:2"), (2, "b:1")]
    finally:
        sink.close()


def test_validate_refuses_an_unknown_output_mode(sink: SQLiteSink) -> None:
    with pytest.raises(ConfigError, match="output mode 'overwrite'"):
        sink.validate(SCHEMA, "overwrite")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("ddl", "rows"),
    [
        ("CREATE TABLE out (id INTEGER, v TEXT CHECK (v <> 'bad'))", [(1, "ok"), (2, "bad")]),
        ("CREATE TABLE out (id INTEGER NOT NULL, v TEXT)", [(1, "ok"), (None, "null id")]),
    ],
)
def test_constraint_violation_rolls_back_everything(
    sink: SQLiteSink, ddl: str, rows: list[tuple[Any, ...]]
) -> None:
    sink.conn.execute(ddl)
    epoch = sink.acquire("p").epoch
    ranges = _b(("t", 0, 0, 2))
    with pytest.raises(SinkError, match="constraint failed"):
        _commit(sink, epoch, ranges, rows)
    assert inspector_for(sink).rows() == []
    assert sink.ledger("p") == []
    assert sink.end_offsets("p") == {}
    assert not sink.conn.in_transaction
    # fixed rows for the same offsets commit on retry
    res = _commit(sink, epoch, ranges, [(1, "ok"), (2, "fine")])
    assert (res.skipped, res.seq) == (False, 0)
    assert _rows(sink) == [(1, "ok"), (2, "fine")]


def test_first_batch_failure_also_rolls_back_the_table(upsert_sink: SQLiteSink) -> None:
    s = upsert_sink
    epoch = s.acquire("p").epoch
    with pytest.raises(SinkError):
        _commit(s, epoch, _b(("t", 0, 0, 2)), [(1, "a"), (1, "b")])
    assert s.stager._declared_types(s.table) == {}  # the CREATE TABLE was rolled back too
    assert s.ledger("p") == []


def test_no_data_batches(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    _commit(sink, epoch, _b(("t", 0, 0, 5)), [(1, "a")], batch_id=0)
    at_rest = BatchRanges.at({("t", 0): 5})
    # no new offsets and no rows: nothing to record (skipped, and no replay)
    res = _commit(sink, epoch, at_rest, [], batch_id=1)
    assert (res.skipped, res.seq, res.empty, res.replayed) == (True, None, True, False)
    assert len(sink.ledger("p")) == 1
    # no new offsets but rows (a watermark firing, say): recorded by Spark identity
    res = _commit(sink, epoch, at_rest, [(2, "late")], batch_id=2, checkpoint="cp")
    assert (res.skipped, res.row_count, res.seq) == (False, 1, 1)
    again = _commit(sink, epoch, at_rest, [(2, "late")], batch_id=2, checkpoint="cp")
    assert (again.skipped, again.seq, again.empty, again.replayed) == (True, 1, False, True)
    assert _rows(sink) == [(1, "a"), (2, "late")]
    assert sink.end_offsets("p") == {("t", 0): 5}
    # the next data batch continues from the unchanged end offsets
    res = _commit(sink, epoch, _b(("t", 0, 5, 6)), [(3, "b")], batch_id=3)
    assert (res.skipped, res.seq) == (False, 2)


def test_empty_data_batch_records_the_offsets(sink: SQLiteSink) -> None:
    """A batch with new offsets but no output rows (all filtered) still advances the ledger."""
    epoch = sink.acquire("p").epoch
    res = _commit(sink, epoch, _b(("t", 0, 0, 4)), [])
    assert (res.skipped, res.row_count, res.seq) == (False, 0, 0)
    assert sink.end_offsets("p") == {("t", 0): 4}
    assert inspector_for(sink).rows() == []


# -- crash atomicity (a real SIGKILL inside the open transaction) ---------------------------

_CRASH_CHILD = textwrap.dedent(
    """
    import sys
    from pyspark.sql import types as T
    from sparkonce.ledger.base import BatchContext
    from sparkonce.offsets import BatchRanges, OffsetRange
    from sparkonce.faults import FaultPlan
    from sparkonce.sinks import SQLiteSink
    sink = SQLiteSink(sys.argv[1], "out")
    epoch = sink.acquire("p").epoch
    sink.use_faults(FaultPlan.from_env())  # after open(): the committer gets it too
    schema = T.StructType([T.StructField("id", T.LongType()), T.StructField("v", T.StringType())])
    ctx = BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 0, 3),)), 0, "cp")
    sink.commit_rows(ctx, schema, ["id", "v"], [(1, "a"), (2, "b"), (3, "c")])
    print("committed", flush=True)
    """
)


@pytest.mark.parametrize("point", ["after-rows", "before-ledger-commit"])
def test_crash_inside_the_transaction_leaves_nothing_visible(
    store_url: StoreURL, point: str
) -> None:
    env = dict(os.environ)
    env[CRASH_ENV] = point
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_CHILD, str(store_url)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout == ""
    s = SQLiteSink(store_url, "out")
    try:
        assert s.owner("p") is not None and s.owner("p").epoch == 1  # type: ignore[union-attr]
        assert inspector_for(s).rows() == []
        assert s.ledger("p") == []
        # the next run commits the batch once
        epoch = s.acquire("p").epoch
        res = _commit(s, epoch, _b(("t", 0, 0, 3)), [(1, "a"), (2, "b"), (3, "c")])
        assert (res.skipped, res.seq) == (False, 0)
        assert len(inspector_for(s).rows()) == 3
    finally:
        s.close()


# -- construction, validation, conversion -------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"table": "bad-name"}, "table 'bad-name' is not a valid SQL identifier"),
        ({"table": "1t"}, "not a valid SQL identifier"),
        ({"mode": "upsert"}, "needs keys"),
        ({"keys": ["id"]}, "only applies to mode='upsert'"),
        ({"mode": "merge"}, "sink mode 'merge' is not supported"),
        ({"mode": "upsert", "keys": ["id", "id"]}, "name a column twice"),
        ({"mode": "upsert", "keys": ["id;"]}, "key column 'id;'"),
    ],
)
def test_sqlite_sink_config_errors(store_url: StoreURL, kwargs: dict[str, Any], match: str) -> None:
    args = {"table": "out", **kwargs}
    table = args.pop("table")
    with pytest.raises(ConfigError, match=match):
        SQLiteSink(store_url, table, **args)


def test_sink_scheme_must_match(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="SQLiteSink needs a sqlite URL"):
        SQLiteSink("postgresql://u@h/db", "out")
    with pytest.raises(ConfigError, match="PostgresSink needs a postgresql URL"):
        PostgresSink(f"sqlite:///{tmp_path / 'x.db'}", "out")
    assert isinstance(sink_from_url(f"sqlite:///{tmp_path / 'x.db'}", "out"), SQLiteSink)
    assert isinstance(sink_from_url("postgres://u@h/db", "out"), PostgresSink)


def test_postgres_sink_never_shows_the_password() -> None:
    s = PostgresSink(f"postgresql://u:{SECRET}@h:5432/db", "out", mode="upsert", keys=["id"])
    assert SECRET not in repr(s) and SECRET not in s.describe()
    assert SECRET not in s.store.ledger.inspect_hint
    assert "u:***@h:5432/db" in s.describe()


def test_validate(sink: SQLiteSink, upsert_sink: SQLiteSink) -> None:
    sink.validate(SCHEMA)
    with pytest.raises(ConfigError, match="output column 'bad col'"):
        sink.validate(T.StructType([T.StructField("bad col", T.LongType())]))
    with pytest.raises(ConfigError, match="has Spark type array<int>"):
        sink.validate(T.StructType([T.StructField("xs", T.ArrayType(T.IntegerType()))]))
    with pytest.raises(ConfigError, match=r"upsert keys \['id'\] are not columns"):
        upsert_sink.validate(T.StructType([T.StructField("v", T.StringType())]))
    sink.conn.execute("CREATE TABLE out (id INTEGER)")
    with pytest.raises(ConfigError, match=r"has no column\(s\) \['v'\]"):
        sink.validate(SCHEMA)


def test_sqlite_row_conversion(sink: SQLiteSink) -> None:
    schema = T.StructType(
        [
            T.StructField("flag", T.BooleanType()),
            T.StructField("amount", T.DecimalType(10, 2)),
            T.StructField("day", T.DateType()),
        ]
    )
    table = pa.table(
        {
            "flag": [True, None],
            "amount": pa.array([Decimal("12.50"), None], pa.decimal128(10, 2)),
            "day": [date(2024, 2, 29), None],
        }
    )
    assert sink.stager._rows_from_arrow(table, schema) == [
        (1, "12.50", "2024-02-29"),
        (None, None, None),
    ]
    plain = pa.table({"id": [1, 2], "v": ["a", None]})
    assert sink.stager._rows_from_arrow(plain, SCHEMA) == [(1, "a"), (2, None)]


def test_two_phase_is_postgres_only_and_never_shows_the_password() -> None:
    from sparkonce import PostgresTwoPhaseSink, sink_from_url

    with pytest.raises(ConfigError, match="two_phase=True needs a postgresql"):
        sink_from_url("sqlite:///x.db", "t", two_phase=True)
    sink = sink_from_url("postgresql://app:pw-123@db:5432/shop", "orders", two_phase=True)
    assert isinstance(sink, PostgresTwoPhaseSink)
    assert sink.precommit_table == "orders__sparkonce_data"
    assert "pw-123" not in repr(sink) and "2pc" in repr(sink)
    upsert = PostgresTwoPhaseSink("postgresql://db/shop", "t", mode="upsert", keys=["k"])
    assert upsert.precommit_table == "t__sparkonce_stage"
