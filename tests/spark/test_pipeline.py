"""Pipelines on the shared local[2] session, against real SQLite and PostgreSQL sinks."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tests.conftest import SQL_STORES

from sparkonce import (
    CheckpointError,
    CheckpointLostError,
    ConfigError,
    EmbeddedLogSource,
    FencedError,
    Pipeline,
    SinkError,
    sink_from_url,
)
from sparkonce.offsets import check_chain
from sparkonce.sinks.inspect import inspector_for


def values(df: DataFrame) -> DataFrame:
    return df.select(
        "record_id",
        "partition",
        "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def sums(df: DataFrame) -> DataFrame:
    return values(df).groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))


def make_pipeline(
    tmp_path: Path,
    log_dir: Path,
    url: str,
    *,
    transform: Callable[[DataFrame], DataFrame] = values,
    table: str = "events_out",
    limit: int | None = 100,
    checkpoint: str = "chk",
    **sink_kwargs: Any,
) -> Pipeline:
    return Pipeline(
        name="p1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=limit),
        sink=sink_from_url(url, table, **sink_kwargs),
        checkpoint=tmp_path / checkpoint,
        transform=transform,
    )


def forget_commit(checkpoint: Path, batch_id: int) -> None:
    """Make Spark forget a finished batch, as a crash before its commit log would."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


def partition_sizes(log_dir: Path) -> dict[int, int]:
    from sparkonce.log import Topic

    with Topic(log_dir, "events") as t:
        return t.end_offsets()


def table_rows(p: Pipeline) -> list[dict[str, Any]]:
    p.sink.open()
    try:
        return inspector_for(p.sink).rows()
    finally:
        p.sink.close()


def ledger(p: Pipeline) -> list[Any]:
    p.sink.open()
    try:
        return p.sink.ledger(p.name)
    finally:
        p.sink.close()


@pytest.mark.parametrize("store_url", SQL_STORES, indirect=True)
def test_stateless_append_is_exact_and_respects_read_limit(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    log_dir = make_log(900, partitions=3)
    p = make_pipeline(tmp_path, log_dir, store_url, limit=100)
    report = p.run(spark)
    rows = table_rows(p)
    assert sorted(r["value"] for r in rows) == list(range(1, 901))
    assert len({r["record_id"] for r in rows}) == 900
    entries = ledger(p)
    expected_batches = -(-max(partition_sizes(log_dir).values()) // 100)
    assert expected_batches >= 3
    assert report.batches_committed == len(entries) == expected_batches
    assert all(r.count <= 100 for e in entries for r in e.ranges.ranges)
    assert check_chain(e.ranges for e in entries) == []
    assert [e.seq for e in entries] == list(range(expected_batches))
    assert sum(e.row_count for e in entries) == 900


def test_replayed_batch_reads_the_same_records(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """Spark rebuilds the last batch from its offset log; the records must be identical."""
    from sparkonce.sources.embedded import register

    log_dir = make_log(600, partitions=3)
    source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=100)
    seen: dict[int, list[tuple[Any, ...]]] = {}
    replays: list[tuple[int, list[tuple[Any, ...]]]] = []

    def capture(df: DataFrame, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.collect())
        if batch_id in seen:
            replays.append((batch_id, rows))
        else:
            seen[batch_id] = rows

    register(spark)
    chk = tmp_path / "chk"

    def run() -> None:
        q = (
            source.stream(spark, None)
            .writeStream.foreachBatch(capture)
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()

    run()
    last = max(seen)
    assert last >= 1
    assert sum(len(rows) for rows in seen.values()) == 600
    # Forget that the last batch finished: Spark must replay it from its offset log.
    forget_commit(chk, last)
    run()
    assert [b for b, _ in replays] == [last]
    assert replays[0][1] == seen[last]
    assert len(seen[last]) > 0


@pytest.mark.parametrize("store_url", SQL_STORES, indirect=True)
def test_sink_skips_a_batch_it_already_committed(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    log_dir = make_log(600, partitions=3)
    p = make_pipeline(tmp_path, log_dir, store_url)
    p.run(spark)
    before_rows = table_rows(p)
    before_ledger = ledger(p)
    # A crash after the sink's commit but before Spark's commit log looks like this:
    last = max(int(f.name) for f in (p.checkpoint_path / "commits").iterdir() if f.name.isdigit())
    forget_commit(p.checkpoint_path, last)
    report = p.run(spark)
    assert report.batches_skipped == 1
    assert report.batches_committed == 0
    assert Counter(r["record_id"] for r in table_rows(p)) == Counter(
        r["record_id"] for r in before_rows
    )
    assert ledger(p) == before_ledger


@pytest.mark.parametrize("store_url", SQL_STORES, indirect=True)
def test_stateless_pipeline_resumes_from_ledger_after_checkpoint_loss(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    log_dir = make_log(600, partitions=3)
    p = make_pipeline(tmp_path, log_dir, store_url)
    p.run(spark)
    shutil.rmtree(p.checkpoint_path)
    make_log(300, partitions=3, start=601)
    report = p.run(spark)
    assert report.resumed_from == "ledger"
    rows = table_rows(p)
    assert sorted(r["value"] for r in rows) == list(range(1, 901))
    assert check_chain(e.ranges for e in ledger(p)) == []


def test_upsert_mode_keeps_one_row_per_key(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    log_dir = make_log(500, partitions=2, keys=5)
    p = make_pipeline(
        tmp_path, log_dir, store_url, transform=sums, table="sums", mode="upsert", keys=["key"]
    )
    p.run(spark)
    make_log(500, partitions=2, keys=5, start=501)
    p.run(spark)
    got = {r["key"]: (r["total"], r["n"]) for r in table_rows(p)}
    want: dict[str, list[int]] = {}
    for i in range(1, 1001):
        agg = want.setdefault(f"k{i % 5}", [0, 0])
        agg[0] += i
        agg[1] += 1
    assert got == {k: (v[0], v[1]) for k, v in want.items()}


def test_stateful_pipeline_refuses_to_resume_without_its_checkpoint(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(300, partitions=2)
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    p = make_pipeline(
        tmp_path, log_dir, url, transform=sums, table="sums", mode="upsert", keys=["key"]
    )
    p.run(spark)
    before = table_rows(p)
    shutil.rmtree(p.checkpoint_path)
    with pytest.raises(CheckpointLostError, match="stateful") as info:
        p.run(spark)
    assert "restore the checkpoint" in str(info.value)
    assert table_rows(p) == before


def test_checkpoint_ahead_of_the_ledger_is_refused(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(300, partitions=2)
    first = make_pipeline(tmp_path, log_dir, f"sqlite:///{tmp_path / 'a.db'}")
    first.run(spark)
    other_sink = make_pipeline(tmp_path, log_dir, f"sqlite:///{tmp_path / 'b.db'}")
    with pytest.raises(CheckpointError, match="never reached this sink"):
        other_sink.run(spark)


@pytest.mark.parametrize("store_url", SQL_STORES, indirect=True)
def test_a_newer_run_fences_the_older_one(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    log_dir = make_log(600, partitions=3)
    p = make_pipeline(tmp_path, log_dir, store_url)
    rival = sink_from_url(store_url, "events_out")

    def newer_run_starts(report: Any) -> None:
        # After the first batch commits, a newer run takes the pipeline over.
        if report.spark_batch_id == 0:
            with rival:
                rival.acquire("p1")

    with pytest.raises(FencedError) as info:
        p.run(spark, on_batch=newer_run_starts)
    msg = str(info.value)
    assert "epoch 1" in msg and "now 2" in msg and "sparkonce status" in msg
    entries = ledger(p)
    assert len(entries) == 1
    assert len(table_rows(p)) == entries[0].row_count == entries[0].ranges.count > 0


@pytest.mark.parametrize("store_url", SQL_STORES, indirect=True)
def test_a_failing_batch_commits_nothing(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    """Upsert rows with a NULL key in the second batch: that batch must leave no trace."""
    log_dir = make_log(400, partitions=2)

    def null_keys_later(df: DataFrame) -> DataFrame:
        v = values(df)
        return v.select(
            F.when(F.col("offset") >= 100, F.lit(None)).otherwise(F.col("record_id")).alias("id"),
            "value",
        )

    p = make_pipeline(
        tmp_path, log_dir, store_url, transform=null_keys_later, mode="upsert", keys=["id"]
    )
    with pytest.raises(SinkError, match="NULL key"):
        p.run(spark)
    entries = ledger(p)
    assert len(entries) == 1  # only the first batch (offsets 0..99 of each partition)
    rows = table_rows(p)
    assert len(rows) == entries[0].ranges.count > 0
    assert all(r["id"] is not None for r in rows)


@pytest.mark.parametrize(
    ("kwargs", "transform", "match"),
    [
        ({"mode": "upsert", "keys": ["nope"]}, values, "upsert keys \\['nope'\\]"),
        ({}, lambda df: df.select(F.array("offset").alias("arr")), "column 'arr'"),
        ({}, lambda df: 42, "transform must return"),
    ],
)
def test_bad_pipeline_configuration_is_reported_before_anything_runs(
    spark: SparkSession,
    tmp_path: Path,
    make_log: Callable[..., Path],
    kwargs: dict[str, Any],
    transform: Callable[[DataFrame], Any],
    match: str,
) -> None:
    log_dir = make_log(100, partitions=1)
    p = make_pipeline(
        tmp_path, log_dir, f"sqlite:///{tmp_path / 's.db'}", transform=transform, **kwargs
    )
    with pytest.raises(ConfigError, match=match):
        p.run(spark)
    assert not (p.checkpoint_path / "offsets").exists()


def test_existing_table_with_other_columns_is_reported(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    import sqlite3

    log_dir = make_log(100, partitions=1)
    db = tmp_path / "s.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE events_out (something TEXT)")
    p = make_pipeline(tmp_path, log_dir, f"sqlite:///{db}")
    with pytest.raises(ConfigError, match="has no column"):
        p.run(spark)


def test_pipeline_rejects_bad_fields(tmp_path: Path, make_log: Callable[..., Path]) -> None:
    log_dir = make_log(10, partitions=1)
    sink = sink_from_url(f"sqlite:///{tmp_path / 's.db'}", "t")
    source = EmbeddedLogSource(log_dir, "events")
    with pytest.raises(ConfigError, match="pipeline name"):
        Pipeline(name="bad name!", source=source, sink=sink, checkpoint=tmp_path)
    with pytest.raises(ConfigError, match="sink must be"):
        Pipeline(name="ok", source=source, sink="sqlite:///x.db", checkpoint=tmp_path)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="trigger"):
        Pipeline(name="ok", source=source, sink=sink, checkpoint=tmp_path, trigger="sometimes")
    with pytest.raises(ConfigError, match="max_records_per_partition"):
        EmbeddedLogSource(log_dir, "events", max_records_per_partition=0)
