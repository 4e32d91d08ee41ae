"""IcebergSink on the shared committer, batches given as Arrow tables (no Spark).

The oracle is the input: batch ``i`` holds the offsets ``[10 i, 10 i + 10)`` as values,
so the table must end with each offset once, read back by PyIceberg's scan.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

import sparkonce
from sparkonce.errors import ConfigError, FencedError
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.iceberg import IcebergSink

PIPE = "p1"


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def batch(i: int, epoch: int) -> tuple[BatchContext, pa.Table]:
    ranges = BatchRanges((OffsetRange("topic", 0, 10 * i, 10 * i + 10),))
    rows = pa.table({"v": pa.array(range(10 * i, 10 * i + 10), pa.int64()), "s": ["x"] * 10})
    return BatchContext(PIPE, epoch, ranges, i), rows


def commit(sink: IcebergSink, ctx: BatchContext, rows: pa.Table) -> CommitResult:
    sink.open()
    assert sink._committer is not None
    return sink._committer.commit_with(
        ctx, lambda seq: sink.stager.prepare_arrow(ctx, rows, None, seq)
    )


def values(sink: IcebergSink) -> list[int]:
    return sorted(sink.store.load().scan().to_arrow().column("v").to_pylist())


def test_batches_commit_once_and_a_replay_is_skipped(tmp_path: Path) -> None:
    assert sparkonce.IcebergSink is IcebergSink
    sink = IcebergSink(catalog(tmp_path), "ns.out")
    sink.validate_arrow(batch(0, 1)[1].schema)  # creates the table from the batch schema
    epoch = sink.acquire(PIPE).epoch
    for i in range(3):
        result = commit(sink, *batch(i, epoch))
        assert not result.skipped and result.seq == i and result.row_count == 10
    replay = commit(sink, *batch(1, epoch))  # a checkpoint behind the ledger
    assert replay.replayed and replay.seq == 1
    assert values(sink) == list(range(30))
    assert sink.end_offsets(PIPE) == batch(2, epoch)[0].ranges.ends()
    assert [e.seq for e in sink.ledger(PIPE)] == [0, 1, 2]


def test_an_older_run_is_fenced(tmp_path: Path) -> None:
    old = IcebergSink(catalog(tmp_path), "ns.out")
    old.validate_arrow(batch(0, 1)[1].schema)
    e1 = old.acquire(PIPE).epoch
    commit(old, *batch(0, e1))
    new = IcebergSink(catalog(tmp_path), "ns.out")
    new.acquire(PIPE)
    with pytest.raises(FencedError):
        commit(old, *batch(1, e1))
    assert values(new) == list(range(10))


def test_a_schema_mismatch_is_a_config_error_naming_the_column(tmp_path: Path) -> None:
    sink = IcebergSink(catalog(tmp_path), "ns.out")
    sink.validate_arrow(batch(0, 1)[1].schema)
    wrong = pa.schema([("v", pa.string()), ("s", pa.string())])
    with pytest.raises(ConfigError, match=r"column 'v' is string in the batch but int64"):
        IcebergSink(catalog(tmp_path), "ns.out").validate_arrow(wrong)
    with pytest.raises(ConfigError, match="not supported yet"):
        IcebergSink(catalog(tmp_path), "ns.out", mode="upsert")


def test_validate_takes_spark_s_schema_before_the_epoch(tmp_path: Path) -> None:
    """The runner's ``validate(StructType)`` (no JVM needed): creates the table from it,
    and refuses a mismatch naming the column."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    good = StructType([StructField("v", LongType()), StructField("s", StringType())])
    sink = IcebergSink(catalog(tmp_path), "ns.out")
    sink.validate(good)
    assert [f.name for f in sink.store.load().schema().fields] == ["v", "s"]
    bad = StructType([StructField("v", StringType()), StructField("s", StringType())])
    with pytest.raises(ConfigError, match="column 'v'"):
        IcebergSink(catalog(tmp_path), "ns.out").validate(bad)
    assert sink.owner(PIPE) is None  # no epoch was taken
