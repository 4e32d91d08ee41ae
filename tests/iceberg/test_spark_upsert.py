"""IcebergSink upsert in Spark pipelines on the shared classic session: Spark's tasks check
and reduce each batch to one row per key, write it as Parquet, and the commit replaces the
keys' existing rows in the batch's one snapshot.

The oracle is plain Python over the input: ``make_log`` writes the values 1..N, each with
the log key ``k{value % 5}`` (so all values of one log key are in one partition, in
increasing offsets). The upsert key is ``value % KEYS`` with KEYS a multiple of 5: every
value of one upsert key is in one partition, so a later batch holds greater values of it,
and within a batch ``latest_by="value"`` keeps the greatest. The table must end with, per
key, its greatest value, as read by PyIceberg's scan and by DuckDB's ``iceberg_scan``.
(Upsert replaces a key's row with the newest batch's, whatever its value: latest_by only
chooses among one batch's rows, as in the other upsert sinks.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, SinkError
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.iceberg import key
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.iceberg import IcebergSink
from tests.iceberg.readers import assert_rows
from tests.spark.test_pipeline import forget_commit
from tests.spark.test_pipeline import values as spark_values

RECORDS = 300
KEYS = 35  # a multiple of make_log's 5 log keys (see the module docstring)
TABLE = "ns.latest"


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def keyed(df: DataFrame) -> DataFrame:
    return spark_values(df).select((F.col("value") % KEYS).alias("k"), "value", "partition")


def sink(tmp_path: Path, **kw: object) -> IcebergSink:
    opts: dict[str, object] = {"keys": ["k"], "latest_by": "value", **kw}
    return IcebergSink(catalog(tmp_path), TABLE, mode="upsert", **opts)  # type: ignore[arg-type]


def pipeline(tmp_path: Path, log_dir: Path, *, checkpoint: str = "chk") -> Pipeline:
    return Pipeline(
        name="p1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=50),
        sink=sink(tmp_path),
        checkpoint=tmp_path / checkpoint,
        transform=keyed,
    )


def oracle(n: int) -> list[tuple[int, int]]:
    latest: dict[int, int] = {}
    for v in range(1, n + 1):
        latest[v % KEYS] = max(latest.get(v % KEYS, 0), v)
    return sorted(latest.items())


@pytest.mark.crash_lane  # three Spark runs, about a minute: the rotating shards run it
def test_an_upsert_pipeline_keeps_the_latest_row_per_key_across_a_replay_and_a_new_checkpoint(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS, keys=5)
    first = pipeline(tmp_path, log_dir).run(spark, timeout=300)
    # Each batch (up to 150 rows over 35 keys) repeats keys, and keys repeat across batches.
    assert first.batches_committed >= 2, first
    assert_rows(catalog(tmp_path), TABLE, ["k", "value"], oracle(RECORDS))
    table = catalog(tmp_path).load_table(TABLE)
    ours = [s for s in table.snapshots() if s.summary and s.summary[key("p1", "entry")]]
    assert len(ours) == len(table.snapshots()) == first.batches_committed
    assert first.rows_committed == sum(e.row_count for e in sink(tmp_path).ledger("p1"))
    assert first.rows_committed <= first.batches_committed * KEYS  # one row per key each

    # A replay: Spark forgets its last batch; the run skips it.
    last_batch = max(
        int(f.name) for f in (tmp_path / "chk" / "commits").iterdir() if f.name.isdigit()
    )
    forget_commit(tmp_path / "chk", last_batch)
    second = pipeline(tmp_path, log_dir).run(spark, timeout=300)
    assert second.batches_skipped == 1 and second.rows_committed == 0, second
    assert len(catalog(tmp_path).load_table(TABLE).snapshots()) == first.batches_committed
    assert_rows(catalog(tmp_path), TABLE, ["k", "value"], oracle(RECORDS))

    # A lost checkpoint and more input: the table says where to resume; newer values win.
    make_log(100, keys=5, start=RECORDS + 1)
    third = pipeline(tmp_path, log_dir, checkpoint="chk2").run(spark, timeout=300)
    assert third.resumed_from == "ledger" and third.batches_committed >= 1, third
    assert_rows(catalog(tmp_path), TABLE, ["k", "value"], oracle(RECORDS + 100))


def test_null_repeated_and_tied_keys_are_refused_by_spark_s_tasks(
    spark: SparkSession, tmp_path: Path
) -> None:
    """What the other upsert sinks refuse, refused before anything is written: a NULL key, a
    repeated key without latest_by, two rows of a key with equal latest_by values. With
    latest_by, the greatest value wins and NULL is lowest."""
    schema = "k long, value long, partition int"
    ctx = BatchContext("p1", 1, BatchRanges((OffsetRange("events", 0, 0, 3),)), 0)
    cases: list[tuple[dict[str, object], list[tuple[object, ...]], str]] = [
        ({}, [(None, 1, 0), (2, 2, 0)], r"a row of batch .* has a NULL key \{'k': None\}"),
        ({"latest_by": None}, [(1, 1, 0), (1, 2, 0)], r"the batch holds 2 rows for key"),
        ({}, [(1, 5, 0), (1, 5, 1)], r"same latest_by values \{'value': 5\}"),
    ]
    for kw, rows, match in cases:
        s = sink(tmp_path, **kw)
        s.validate(spark.createDataFrame([], schema).schema)
        with pytest.raises(SinkError, match=match):
            s.stager.prepare(ctx, spark.createDataFrame(rows, schema), 0)
    s = sink(tmp_path)
    rows = [(1, None, 0), (1, 3, 0), (1, 2, 0), (2, None, 0)]
    kept = s.stager.one_row_per_key(ctx, spark.createDataFrame(rows, schema))
    assert sorted(kept.collect(), key=lambda r: r.k) == [(1, 3, 0), (2, None, 0)]
