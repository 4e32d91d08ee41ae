"""IcebergSink on a real Spark Connect session: the batch function runs in the server's
Python worker with a catalog of its own (the sink pickles as the calls that built it),
Spark's tasks write each batch's Parquet files there, and PyIceberg commits them with the
ledger entry. The table is read back with PyIceberg's scan and DuckDB's ``iceberg_scan``
(tests/iceberg/readers.py), never through sparkonce."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline
from sparkonce.ledger.iceberg import key
from tests.connect.test_connect_pipeline import forget_last_commit
from tests.iceberg.readers import assert_each_value_once

# In the CI rotation, as the other Connect tests.
pytestmark = pytest.mark.campaign_lane

TABLE = "lake.events"


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def values(df: DataFrame) -> DataFrame:
    return df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def pipeline(tmp_path: Path, log_dir: Path) -> Pipeline:
    return Pipeline(
        name="ice-connect",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=10),
        sink=IcebergSink(catalog(tmp_path), TABLE),
        checkpoint=tmp_path / "chk",
        transform=values,
    )


def test_append_on_connect_is_exact_and_a_replay_after_a_restart_is_skipped(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(90, partitions=3)
    report = pipeline(tmp_path, log_dir).run(connect_spark)
    assert report.rows_committed == 90 and report.batches_committed >= 2, report
    assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, 91)))
    table = catalog(tmp_path).load_table(TABLE)
    ours = [s for s in table.snapshots() if s.summary and s.summary[key("ice-connect", "entry")]]
    assert len(ours) == report.batches_committed == len(table.snapshots())

    # A restart replays the batch Spark forgot: skipped by the ledger; new records follow.
    forget_last_commit(tmp_path / "chk")
    make_log(30, partitions=3, start=91)
    again = pipeline(tmp_path, log_dir).run(connect_spark)
    assert again.batches_skipped == 1 and again.rows_committed == 30, again
    assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, 121)))
