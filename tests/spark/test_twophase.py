"""The two-phase-commit PostgreSQL sink on the shared session, against the real server."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import (
    ConfigError,
    EmbeddedLogSource,
    FencedError,
    Pipeline,
    PostgresTwoPhaseSink,
    SinkError,
)
from sparkonce.commit.tasks import TaskResult
from sparkonce.ledger import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange, check_chain
from sparkonce.sinks.inspect import TwoPhaseInspector, inspector_for, relocate
from sparkonce.sinks.twophase import INSERT_ONLY_BACKOFF, _precommit_task, _TaskPlan


def values(df: DataFrame) -> DataFrame:
    return df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def pipeline(tmp_path: Path, log_dir: Path, sink: PostgresTwoPhaseSink, **kw: Any) -> Pipeline:
    return Pipeline(
        name="p2",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=100),
        sink=sink,
        checkpoint=tmp_path / "chk",
        transform=kw.pop("transform", values),
    )


def _pending(sink: PostgresTwoPhaseSink, pipeline: str) -> int:
    """The sink's pre-committed attempts of ``pipeline`` that are not committed or collected."""
    inspector = inspector_for(sink)
    assert isinstance(inspector, TwoPhaseInspector)
    return inspector.pending(pipeline)


def scalar(url: str, sql: str) -> Any:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(sql).fetchone()
        assert row is not None
        return row[0]


def test_append_commits_each_batch_once_through_the_view(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], pg_url: str
) -> None:
    log_dir = make_log(900, partitions=3)
    sink = PostgresTwoPhaseSink(pg_url, "events_out")
    p = pipeline(tmp_path, log_dir, sink)
    report = p.run(spark)
    with sink:
        rows = inspector_for(sink).rows()
        entries = sink.ledger("p2")
        assert _pending(sink, "p2") == 0
    assert sorted(r["value"] for r in rows) == list(range(1, 901))
    assert set(rows[0]) == {"record_id", "key", "value"}  # the view hides the attempt column
    assert report.batches_committed == len(entries) >= 3
    assert check_chain(e.ranges for e in entries) == []
    assert sum(e.row_count for e in entries) == 900
    # Readers see a view; the rows live in the data table, tagged with committed attempts.
    assert scalar(pg_url, "SELECT relkind FROM pg_class WHERE relname = 'events_out'") == "v"
    assert scalar(pg_url, "SELECT count(*) FROM events_out__sparkonce_data") == 900
    assert scalar(
        pg_url, "SELECT count(DISTINCT state) || ':' || min(state) FROM sparkonce_attempts"
    ) == ("1:committed")
    # A second run finds nothing new and writes nothing.
    again = p.run(spark)
    assert again.rows_committed == 0
    assert scalar(pg_url, "SELECT count(*) FROM events_out") == 900


def test_upsert_merges_by_key_at_commit(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], pg_url: str
) -> None:
    log_dir = make_log(600, partitions=3, keys=7)

    def latest(df: DataFrame) -> DataFrame:
        v = values(df)
        return v.groupBy("key").agg(F.max("value").alias("latest"), F.count("*").alias("n"))

    sink = PostgresTwoPhaseSink(pg_url, "latest", mode="upsert", keys=["key"])
    p = pipeline(tmp_path, log_dir, sink, transform=latest)
    report = p.run(spark)
    assert report.batches_committed >= 2
    with sink:
        rows = {r["key"]: r["latest"] for r in inspector_for(sink).rows()}
        assert _pending(sink, "p2") == 0
    # Each key holds the value of the last batch that touched it: the overall maximum.
    assert rows == {f"k{k}": max(i for i in range(1, 601) if i % 7 == k) for k in range(7)}
    assert scalar(pg_url, "SELECT count(*) FROM latest__sparkonce_stage") == 0
    # Merged attempts leave no attempt rows behind: the table does not grow with batches.
    assert scalar(pg_url, "SELECT count(*) FROM sparkonce_attempts WHERE target = 'latest'") == 0
    assert scalar(pg_url, "SELECT relkind FROM pg_class WHERE relname = 'latest'") == "r"


def test_upsert_tries_a_plain_insert_and_falls_back_when_a_key_exists(
    spark: SparkSession, pg_url: str
) -> None:
    """New keys merge with a plain INSERT; a key already in the table rolls that try back
    and the batch (and the next ones, for a while) merges with ON CONFLICT, same result."""
    sink = PostgresTwoPhaseSink(pg_url, "ups", mode="upsert", keys=["k"])
    batches = [
        [("a", 1), ("b", 2)],  # all new: the plain INSERT holds
        [("a", 10), ("c", 3)],  # a exists: rolled back, merged with ON CONFLICT
        [("d", 4)],  # new, but within the back-off: ON CONFLICT at once
    ]
    backoff = []
    with sink:
        epoch = sink.acquire("p").epoch
        for i, rows in enumerate(batches):
            df = spark.createDataFrame(rows, "k string, v long")
            batch = BatchRanges((OffsetRange("t", 0, 2 * i, 2 * i + 2),))
            sink.commit(BatchContext("p", epoch, batch, i), df)
            backoff.append(sink.stager._insert_only_backoff)
        table = {r["k"]: r["v"] for r in inspector_for(sink).rows()}
    assert backoff == [0, INSERT_ONLY_BACKOFF, INSERT_ONLY_BACKOFF - 1]
    assert table == {"a": 10, "b": 2, "c": 3, "d": 4}
    assert scalar(pg_url, "SELECT count(*) FROM ups") == 4  # the rolled-back try left nothing
    assert scalar(pg_url, "SELECT count(*) FROM ups__sparkonce_stage") == 0
    # A NULL key fails the plain try as it fails ON CONFLICT: named, nothing committed. The
    # stage takes NULL keys (the merge names them); an older stage's NOT NULL is dropped.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE ups__sparkonce_stage ALTER COLUMN k SET NOT NULL")
    fresh = PostgresTwoPhaseSink(pg_url, "ups", mode="upsert", keys=["k"])
    df = spark.createDataFrame([("e", 5), (None, 6)], "k string, v long")
    with fresh:
        epoch = fresh.acquire("p").epoch
        with pytest.raises(SinkError, match="NULL key"):
            fresh.commit(BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 6, 8),)), 3), df)
        assert len(fresh.ledger("p")) == 3
    assert scalar(pg_url, "SELECT count(*) FROM ups") == 4


def test_a_batch_with_a_duplicate_key_fails_clearly_and_leaves_nothing(
    spark: SparkSession, pg_url: str
) -> None:
    sink = PostgresTwoPhaseSink(pg_url, "u", mode="upsert", keys=["k"])
    df = spark.createDataFrame([("a", 1), ("a", 2), ("b", 3)], "k string, v long")
    batch = BatchRanges((OffsetRange("t", 0, 0, 3),))
    with sink:
        epoch = sink.acquire("p").epoch
        with pytest.raises(SinkError) as info:
            sink.commit(BatchContext("p", epoch, batch, 0), df)
        assert "the batch holds 2 rows for key {'k': 'a'}" in str(info.value)
        assert "set latest_by=[...]" in str(info.value)
        assert inspector_for(sink).rows() == []
        assert sink.ledger("p") == []
        # the aborted batch's pre-commits were collected
        assert _pending(sink, "p") == 0
        assert scalar(pg_url, "SELECT count(*) FROM u__sparkonce_stage") == 0


def test_replayed_commit_is_a_no_op_and_fenced_runs_write_nothing(
    spark: SparkSession, pg_url: str
) -> None:
    sink = PostgresTwoPhaseSink(pg_url, "out")
    df = spark.createDataFrame([(i, f"v{i}") for i in range(50)], "id long, s string")
    batch = BatchRanges((OffsetRange("t", 0, 0, 50),))
    with sink:
        epoch = sink.acquire("p").epoch
        first = sink.commit(BatchContext("p", epoch, batch, 0), df.repartition(3))
        assert not first.skipped and first.row_count == 50
        again = sink.commit(BatchContext("p", epoch, batch, 0), df)
        assert again.skipped and again.seq == first.seq
        assert scalar(pg_url, "SELECT count(*) FROM out__sparkonce_data") == 50
        newer = sink.acquire("p").epoch
        nxt = BatchRanges((OffsetRange("t", 0, 50, 60),))
        with pytest.raises(FencedError):
            sink.commit(BatchContext("p", epoch, nxt, 1), df)
        assert newer == epoch + 1
        assert len(inspector_for(sink).rows()) == 50


def test_a_zombie_task_finishing_after_its_batch_was_aborted_stays_invisible(
    spark: SparkSession, pg_url: str
) -> None:
    """A task of an aborted batch pre-commits late: never visible, then collected."""
    import pyarrow as pa

    sink = PostgresTwoPhaseSink(pg_url, "z")
    df = spark.createDataFrame([(1, "a"), (2, "b")], "id long, s string")
    batch = BatchRanges((OffsetRange("t", 0, 0, 2),))
    with sink:
        epoch = sink.acquire("p").epoch
        sink.commit(BatchContext("p", epoch, batch, 0), df)
        plan = _TaskPlan(sink.url, sink.precommit_table, ("id", "s"), "p", "z", epoch, 1)
        late = pa.RecordBatch.from_pylist([{"id": 99, "s": "zombie"}])
        [out] = list(_precommit_task(plan, iter([late])))
        assert out.to_pylist()[0]["rows"] == 1 and not out.to_pylist()[0]["fenced"]
        assert _pending(sink, "p") == 1
        visible = inspector_for(sink).rows()
        assert sorted(r["id"] for r in visible) == [1, 2]  # durable, but invisible
        assert sink.collect("p", epoch) == 1
        assert _pending(sink, "p") == 0
        assert scalar(pg_url, "SELECT count(*) FROM z__sparkonce_data") == 2
        # A task of a fenced run writes nothing at all.
        sink.acquire("p")
        [out] = list(_precommit_task(plan, iter([late])))
        assert TaskResult.from_row(out.to_pylist()[0]) == TaskResult(0, skipped=True, fenced=True)
        assert scalar(pg_url, "SELECT count(*) FROM z__sparkonce_data") == 2


def test_a_zombie_run_never_collects_a_newer_runs_batch_in_flight(
    spark: SparkSession, pg_url: str
) -> None:
    import pyarrow as pa

    old = PostgresTwoPhaseSink(pg_url, "w")
    new = PostgresTwoPhaseSink(pg_url, "w")
    df = spark.createDataFrame([(1, "a")], "id long, s string")
    with old, new:
        e1 = old.acquire("p").epoch
        old.commit(BatchContext("p", e1, BatchRanges((OffsetRange("t", 0, 0, 1),)), 0), df)
        e2 = new.acquire("p").epoch
        plan = _TaskPlan(new.url, new.precommit_table, ("id", "s"), "p", "w", e2, 1)
        list(_precommit_task(plan, iter([pa.RecordBatch.from_pylist([{"id": 2, "s": "b"}])])))
        assert old.collect("p", e1) == 0  # fenced: collects nothing
        assert _pending(new, "p") == 1


def test_types_survive_the_csv_copy_and_binary_goes_row_by_row(
    spark: SparkSession, pg_url: str
) -> None:
    from datetime import UTC, date, datetime
    from decimal import Decimal

    sink = PostgresTwoPhaseSink(pg_url, "typed")
    rows = [
        (
            'a,b\n"q"',
            None,
            True,
            datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC),
            Decimal("1.50"),
            date(2024, 1, 2),
            1.5,
            b"\x00\xff",
        ),
        ("", 7, None, None, None, None, None, None),
    ]
    schema = (
        "s string, i long, b boolean, ts timestamp, d decimal(10,2), dt date, f double, raw binary"
    )
    df = spark.createDataFrame(rows, schema)
    with sink:
        epoch = sink.acquire("p").epoch
        sink.commit(BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 0, 2),)), 0), df)
        got = sorted(inspector_for(sink).rows(), key=lambda r: r["s"])
    assert got[0]["s"] == "" and got[0]["i"] == 7 and got[0]["b"] is None
    assert got[1]["s"] == 'a,b\n"q"' and got[1]["i"] is None and got[1]["b"] is True
    assert got[1]["ts"] == datetime(2024, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert got[1]["d"] == Decimal("1.50") and got[1]["dt"] == date(2024, 1, 2)
    assert bytes(got[1]["raw"]) == b"\x00\xff"


def test_bad_configuration_is_refused_before_anything_is_written(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE plain (id bigint)")
    sink = PostgresTwoPhaseSink(pg_url, "plain")
    from pyspark.sql.types import LongType, StructField, StructType

    with sink, pytest.raises(ConfigError, match="already exists as a table"):
        sink.validate(StructType([StructField("id", LongType())]))
    with pytest.raises(ConfigError, match="too long"):
        PostgresTwoPhaseSink(pg_url, "x" * 50)
    with pytest.raises(ConfigError, match="postgresql://"):
        relocate(sink, "sqlite:///x.db")


def test_upsert_latest_by_keeps_each_keys_latest_row_in_the_merge(
    spark: SparkSession, pg_url: str
) -> None:
    """A change stream updating a key several times in one batch, from several tasks."""
    sink = PostgresTwoPhaseSink(
        pg_url, "cdc", mode="upsert", keys=["k"], latest_by=["partition", "offset"]
    )
    rows = [(f"k{i % 4}", f"v{i}", i % 2, i) for i in range(40)]
    df = spark.createDataFrame(rows, "k string, v string, partition int, offset long")
    with sink:
        sink.validate(df.schema, "update")
        epoch = sink.acquire("p").epoch
        batch = BatchRanges((OffsetRange("t", 0, 0, 20), OffsetRange("t", 1, 0, 20)))
        res = sink.commit(BatchContext("p", epoch, batch, 0), df.repartition(3))
        assert (res.skipped, res.row_count) == (False, 40)
        assert res.rows_written == 4  # one row per key: PostgreSQL's count of the merge
        got = {r["k"]: (r["v"], r["partition"], r["offset"]) for r in inspector_for(sink).rows()}
        # k0 and k2 only ever come from partition 0, k1 and k3 from partition 1
        assert got == {
            "k0": ("v36", 0, 36),
            "k1": ("v37", 1, 37),
            "k2": ("v38", 0, 38),
            "k3": ("v39", 1, 39),
        }
        assert _pending(sink, "p") == 0
        assert scalar(pg_url, "SELECT count(*) FROM cdc__sparkonce_stage") == 0


def test_upsert_latest_by_tie_is_refused_naming_the_key(spark: SparkSession, pg_url: str) -> None:
    sink = PostgresTwoPhaseSink(pg_url, "cdc", mode="upsert", keys=["k"], latest_by=["offset"])
    df = spark.createDataFrame(
        [("k1", "a", 0, 5), ("k2", "x", 0, 6), ("k1", "b", 1, 5), ("k1", "c", 0, 1)],
        "k string, v string, partition int, offset long",
    )
    with sink:
        epoch = sink.acquire("p").epoch
        batch = BatchRanges((OffsetRange("t", 0, 0, 7), OffsetRange("t", 1, 0, 6)))
        with pytest.raises(SinkError) as info:
            sink.commit(BatchContext("p", epoch, batch, 0), df.repartition(2))
        assert "several rows for key {'k': 'k1'} with the same latest_by values {'offset': 5}" in (
            str(info.value)
        )
        assert inspector_for(sink).rows() == [] and sink.ledger("p") == []
        assert _pending(sink, "p") == 0
        assert scalar(pg_url, "SELECT count(*) FROM cdc__sparkonce_stage") == 0


def test_complete_output_mode_is_refused_before_the_epoch(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], pg_url: str
) -> None:
    def counts(df: DataFrame) -> DataFrame:
        return values(df).groupBy("key").count()

    sink = PostgresTwoPhaseSink(pg_url, "counts", mode="upsert", keys=["key"])
    p = Pipeline(
        name="p2",
        source=EmbeddedLogSource(make_log(10), "events", max_records_per_partition=5),
        sink=sink,
        checkpoint=tmp_path / "chk",
        transform=counts,
        output_mode="complete",
    )
    with pytest.raises(ConfigError) as info:
        p.run(spark)
    msg = str(info.value)
    assert "does not support Spark's output mode 'complete'" in msg
    assert "Use PostgresSink, which supports 'complete'" in msg
    with sink:
        assert sink.owner("p2") is None  # refused before the run took an epoch
        assert inspector_for(sink).rows() == []


def test_rows_take_their_attempt_id_from_the_task_and_old_tables_are_upgraded(
    spark: SparkSession, pg_url: str
) -> None:
    """Each pre-committed row carries its own task's attempt id, although no row sends it
    (the column's default is the task transaction's id); a pre-commit table an older
    version made without that default gets it, and the batch commits."""
    import pyarrow as pa

    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE up__sparkonce_stage (id bigint NOT NULL, s text, "
            "sparkonce_attempt bigint NOT NULL)"
        )
    sink = PostgresTwoPhaseSink(pg_url, "up", mode="upsert", keys=["id"])
    df = spark.createDataFrame([(1, "a"), (2, "b"), (3, "c")], "id long, s string").repartition(3)
    with sink:
        epoch = sink.acquire("p").epoch
        sink.commit(BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 0, 3),)), 0), df)
        assert scalar(pg_url, "SELECT string_agg(s, ',' ORDER BY id) FROM up") == "a,b,c"
        # Two tasks of a later batch, pre-committed but not yet merged: each of its rows
        # carries its own task's attempt id, and that id is the one registered.
        ids = []
        for i, rows in enumerate(
            ([{"id": 4, "s": "d"}, {"id": 5, "s": "e"}], [{"id": 6, "s": "f"}])
        ):
            plan = _TaskPlan(sink.url, sink.precommit_table, ("id", "s"), "p", "up", epoch, 1)
            [out] = list(_precommit_task(plan, iter([pa.RecordBatch.from_pylist(rows)])))
            ids.append(out.to_pylist()[0]["attempt"])
            assert out.to_pylist()[0]["rows"] == len(rows), i
        with psycopg.connect(pg_url, autocommit=True) as conn:
            staged = conn.execute(
                "SELECT id, sparkonce_attempt FROM up__sparkonce_stage ORDER BY id"
            ).fetchall()
            registered = conn.execute(
                "SELECT attempt_id, row_count FROM sparkonce_attempts WHERE target = 'up' "
                "ORDER BY row_count DESC"
            ).fetchall()
        assert staged == [(4, ids[0]), (5, ids[0]), (6, ids[1])]
        assert registered == [(ids[0], 2), (ids[1], 1)]
        assert ids[0] != ids[1]
        # A row written outside a task gets its own transaction's id, which no attempt
        # names: the next commit merges the batch's registered attempts, never that row.
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute("INSERT INTO up__sparkonce_stage (id, s) VALUES (7, 'g')")
            stray = conn.execute(
                "SELECT sparkonce_attempt FROM up__sparkonce_stage WHERE id = 7"
            ).fetchone()
        assert stray is not None and stray[0] not in ids
        more = spark.createDataFrame([(8, "h")], "id long, s string")
        sink.commit(BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 3, 4),)), 1), more)
        assert scalar(pg_url, "SELECT string_agg(s, ',' ORDER BY id) FROM up") == "a,b,c,h"


def test_a_task_whose_transaction_id_is_registered_already_takes_a_new_one(
    spark: SparkSession, pg_url: str
) -> None:
    """An attempts table brought from another cluster can hold the id the task's transaction
    gets: the registration fails before any row is written, and the task registers again
    under a new transaction's id; its rows carry that one."""
    import pyarrow as pa

    sink = PostgresTwoPhaseSink(pg_url, "taken_ids", mode="upsert", keys=["id"])
    df = spark.createDataFrame([(1, "a")], "id long, s string")
    with sink:
        epoch = sink.acquire("p").epoch
        sink.commit(BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 0, 1),)), 0), df)
        plan = _TaskPlan(sink.url, sink.precommit_table, ("id", "s"), "p", "taken_ids", epoch, 1)
        batch = pa.RecordBatch.from_pylist([{"id": 2, "s": "b"}])
        # The next 3 transaction ids are registered already (one transaction, id `now`, takes
        # them): the task's registration fails 3 times, then takes the 4th.
        now = take_next_transaction_ids(pg_url, 3)
        [out] = list(_precommit_task(plan, iter([batch])))
        got = out.to_pylist()[0]
        assert got["rows"] == 1 and got["attempt"] > now + 3
        staged = scalar(pg_url, "SELECT sparkonce_attempt FROM taken_ids__sparkonce_stage")
        assert staged == got["attempt"]
        # More taken than the task tries: it fails, naming why, and writes nothing.
        take_next_transaction_ids(pg_url, 10)
        with pytest.raises(SinkError, match="could not register an attempt id"):
            list(_precommit_task(plan, iter([batch])))
        assert scalar(pg_url, "SELECT count(*) FROM taken_ids__sparkonce_stage") == 1


def take_next_transaction_ids(pg_url: str, n: int) -> int:
    """Register the next ``n`` transaction ids as attempts of another pipeline, in one
    transaction; its own id is returned."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "INSERT INTO sparkonce_attempts (attempt_id, pipeline, target, epoch, seq, partition, "
            "row_count, state) SELECT txid_current() + g, 'other', 'x', 1, 1, 0, 0, 'committed' "
            "FROM generate_series(1, %s) AS g RETURNING txid_current()",
            (n,),
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_table_in_the_pre_commit_tables_place_without_an_attempt_column_is_refused(
    spark: SparkSession, pg_url: str
) -> None:
    """Someone else's table under the pre-commit name: a clear error, and it is untouched."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE taken__sparkonce_data (id bigint, s text)")
        conn.execute("INSERT INTO taken__sparkonce_data VALUES (1, 'theirs')")
    sink = PostgresTwoPhaseSink(pg_url, "taken")
    df = spark.createDataFrame([(2, "b")], "id long, s string")
    with sink:
        epoch = sink.acquire("p").epoch
        with pytest.raises(ConfigError, match=r"'taken__sparkonce_data' .* no 'sparkonce_attempt'"):
            sink.commit(BatchContext("p", epoch, BatchRanges((OffsetRange("t", 0, 0, 1),)), 0), df)
    assert scalar(pg_url, "SELECT string_agg(s, ',') FROM taken__sparkonce_data") == "theirs"
    assert scalar(pg_url, "SELECT count(*) FROM sparkonce_ledger WHERE pipeline = 'p'") == 0
