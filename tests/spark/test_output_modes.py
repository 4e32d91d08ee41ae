"""Spark's output modes (append, update, complete) x the SQL sinks' modes (append, upsert).

Real pipeline runs on the shared local[2] session, with small read limits so each run has
several micro-batches. What each combination leaves in the table:

- append output (a stateless transform): an append sink holds every output row once; an
  upsert sink holds one row per key (``latest_by`` picks the latest row of a key that a
  batch repeats).
- update output (an aggregation): an append sink holds one row per batch that changed a
  group (a history of changes); an upsert sink holds the final aggregate per key.
- complete output: either sink holds exactly the final result, since each batch replaces
  the table's content in its commit transaction.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url
from sparkonce.cli.run import summary
from sparkonce.observe.report import RunReport
from sparkonce.sinks.inspect import inspector_for

RECORDS = 60
KEYS = 4
PARTITIONS = 3
LIMIT = 7  # records per partition per batch: at least 3 batches for 60 records


def records(df: DataFrame) -> DataFrame:
    return df.select(
        "partition",
        "offset",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def counts(df: DataFrame) -> DataFrame:
    return records(df).groupBy("key").count()


FINAL_COUNTS = dict(Counter(f"k{i % KEYS}" for i in range(1, RECORDS + 1)))


def run(
    spark: SparkSession,
    tmp_path: Path,
    log_dir: Path,
    url: str,
    *,
    output_mode: str,
    transform: Callable[[DataFrame], DataFrame],
    **sink_kwargs: Any,
) -> tuple[list[dict[str, Any]], RunReport]:
    sink = sink_from_url(url, "out", **sink_kwargs)
    pipeline = Pipeline(
        name="modes",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=LIMIT),
        sink=sink,
        checkpoint=tmp_path / "chk",
        transform=transform,
        output_mode=output_mode,  # type: ignore[arg-type]
    )
    report = pipeline.run(spark)
    with sink:
        return inspector_for(sink).rows(), report


@pytest.mark.parametrize("sink_mode", ["append", "upsert"])
def test_complete_mode_leaves_exactly_the_final_result(
    spark: SparkSession,
    tmp_path: Path,
    make_log: Callable[..., Path],
    store_url: str,
    sink_mode: str,
) -> None:
    """The reported bug: complete mode into an append sink stacked every full result."""
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    kwargs = {"mode": "upsert", "keys": ["key"]} if sink_mode == "upsert" else {}
    rows, report = run(
        spark, tmp_path, log_dir, store_url, output_mode="complete", transform=counts, **kwargs
    )
    assert report.batches_committed >= 3
    assert len(rows) == KEYS
    assert {r["key"]: r["count"] for r in rows} == FINAL_COUNTS


def test_update_mode_into_an_upsert_sink_keeps_the_final_aggregates(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], tmp_sqlite: str
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    rows, report = run(
        spark,
        tmp_path,
        log_dir,
        tmp_sqlite,
        output_mode="update",
        transform=counts,
        mode="upsert",
        keys=["key"],
    )
    assert report.batches_committed >= 3
    assert {r["key"]: r["count"] for r in rows} == FINAL_COUNTS
    assert len(rows) == KEYS


def test_update_mode_into_an_append_sink_keeps_a_history_of_changes(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], tmp_sqlite: str
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    rows, report = run(spark, tmp_path, log_dir, tmp_sqlite, output_mode="update", transform=counts)
    assert report.batches_committed >= 3
    # One row per group per batch that changed it; the latest of each is the final count.
    history: dict[str, list[int]] = {}
    for r in rows:
        history.setdefault(r["key"], []).append(r["count"])
    assert {k: max(v) for k, v in history.items()} == FINAL_COUNTS
    assert len(rows) > KEYS
    assert all(len(set(v)) == len(v) for v in history.values())  # counts only grow


def test_append_mode_into_an_append_sink_writes_every_row_once(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], tmp_sqlite: str
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    rows, report = run(
        spark, tmp_path, log_dir, tmp_sqlite, output_mode="append", transform=records
    )
    assert report.batches_committed >= 3
    assert sorted(r["value"] for r in rows) == list(range(1, RECORDS + 1))


def test_append_mode_into_an_upsert_sink_with_latest_by_keeps_each_keys_last_change(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], store_url: str
) -> None:
    """A change stream with several updates of a key per batch (each key has one partition,
    so its offsets are its change order)."""
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    rows, report = run(
        spark,
        tmp_path,
        log_dir,
        store_url,
        output_mode="append",
        transform=records,
        mode="upsert",
        keys=["key"],
        latest_by=["partition", "offset"],
    )
    assert report.batches_committed >= 3
    last = {f"k{k}": max(i for i in range(1, RECORDS + 1) if i % KEYS == k) for k in range(KEYS)}
    assert {r["key"]: r["value"] for r in rows} == last
    # Every record reached the sink; each batch wrote one row per key it held. The summary
    # names both counts (it said "N rows" for rows the table never gained).
    batches = [b for b in report.batches if not b.result.skipped]
    assert report.rows_committed == RECORDS
    assert report.rows_written == sum(b.result.written for b in batches)
    assert KEYS <= report.rows_written <= KEYS * len(batches) < RECORDS
    assert (
        f"committed {report.batches_committed} batches ({RECORDS} rows received, "
        f"{report.rows_written} written: one per key)" in summary(report)
    )


@pytest.fixture
def tmp_sqlite(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'sink.db'}"


def test_an_output_mode_spark_refuses_is_refused_before_the_epoch(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], tmp_sqlite: str
) -> None:
    """An aggregation without a watermark cannot run in append mode: Spark's own check, run
    through the JVM before the epoch (not when the query starts, after it), says so, and no
    owner row is written."""
    import sqlite3

    from sparkonce import ConfigError

    log_dir = make_log(RECORDS, partitions=PARTITIONS)
    with pytest.raises(ConfigError, match="Spark does not support this query with output_mode"):
        run(spark, tmp_path, log_dir, tmp_sqlite, output_mode="append", transform=counts)
    with sqlite3.connect(tmp_path / "sink.db") as conn:
        assert conn.execute("SELECT COUNT(*) FROM sparkonce_owner").fetchone() == (0,)
