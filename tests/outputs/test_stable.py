"""Stable batch output against real Spark: write once, replay reads the copy, collect drops it."""

from __future__ import annotations

import json
import logging
import re
import shutil
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparkonce.errors import CheckpointError, ConfigError
from sparkonce.outputs import BatchKey, StableOutput
from sparkonce.outputs.stable import MANIFEST, PARTITION_COLUMN

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

pytestmark = pytest.mark.spark

RANGES = '{"events":{"0":[0,10],"1":[0,7]}}'


def key(batch: int = 3, ranges: str = RANGES) -> BatchKey:
    return BatchKey("ckpt-1", batch, ranges)


def rows(df: DataFrame) -> list[tuple[object, ...]]:
    """The rows as sortable tuples (repr sorts any mix of types and None)."""
    return sorted((tuple(r) for r in df.collect()), key=repr)


def same_types(a: DataFrame, b: DataFrame) -> bool:
    """Same names, order and types; nullability aside (Parquet reads back nullable)."""
    return [(f.name, f.dataType.simpleString()) for f in a.schema.fields] == [
        (f.name, f.dataType.simpleString()) for f in b.schema.fields
    ]


def test_batch_key_dirname_sorts_by_batch_and_separates_inputs() -> None:
    assert key(7).dirname.startswith("000000000007-")
    assert len(key(7).dirname) == 12 + 1 + 16
    assert key(7).dirname != key(7, ranges='{"events":{"0":[10,20]}}').dirname
    assert key(7).dirname != BatchKey("ckpt-2", 7, RANGES).dirname
    assert sorted([key(10).dirname, key(9).dirname]) == [key(9).dirname, key(10).dirname]
    with pytest.raises(ConfigError, match="-1"):
        BatchKey("c", -1, "{}")


def test_root_must_be_local(tmp_path: Path) -> None:
    assert StableOutput(f"file://{tmp_path}/s").root == tmp_path / "s"
    assert StableOutput(tmp_path / "s").root == tmp_path / "s"
    with pytest.raises(ConfigError, match="s3a"):
        StableOutput("s3a://bucket/stable")
    with pytest.raises(ConfigError, match="hdfs"):
        StableOutput("hdfs://nn:8020/ckpt/stable")
    with pytest.raises(ConfigError, match="glob"):
        StableOutput(tmp_path / "a[1]")


def test_replay_reads_the_frozen_copy_and_runs_df_once(spark: SparkSession, tmp_path: Path) -> None:
    import random

    from pyspark.sql import functions as F

    executed = spark.sparkContext.accumulator(0)

    def noise() -> float:
        executed.add(1)  # one per row computed: counts executions of the batch
        return random.random()

    noisy = F.udf(noise, "double").asNondeterministic()

    def batch() -> DataFrame:
        # Built anew for each attempt, as a replaying driver does: rand() and uuid() take
        # their seeds when the DataFrame is built, the Python UDF on every execution.
        return (
            spark.range(1000)
            .withColumn("r", F.rand())
            .withColumn("u", F.expr("uuid()"))
            .withColumn("noise", noisy())
        )

    df = batch()
    # The test could fail: the batch gives other rows on every run, and every rebuild.
    first, second = rows(df), rows(df)
    assert first != second
    assert {r[2] for r in rows(batch())}.isdisjoint(r[2] for r in first)
    executed.value = 0

    stable = StableOutput(tmp_path / "stable")
    copy1 = stable.put(df, key())
    assert executed.value == 1000  # put ran df once: the write, nothing else
    expected = rows(copy1)
    assert rows(copy1) == expected  # the copy is frozen: no recomputation when read
    assert len(expected) == 1000 and len({r[2] for r in expected}) == 1000
    assert executed.value == 1000

    replay = stable.put(batch(), key())  # the driver died, Spark replays the batch
    assert executed.value == 1000  # a replay does not compute the batch again
    assert rows(replay) == expected
    assert copy1.columns == replay.columns == ["id", "r", "u", "noise"]
    got = stable.get(spark, key())
    assert got is not None and rows(got) == expected
    assert stable.get(spark, key(4)) is None

    # Partitioned, the write still runs the batch once, and the replay not at all.
    tagged = batch().withColumn("tag", (F.col("id") % 3).cast("string"))
    split = stable.put(tagged, key(9), partition_by="tag")
    assert executed.value == 2000
    frozen = rows(split)
    assert rows(stable.put(tagged, key(9), partition_by="tag")) == frozen
    assert executed.value == 2000
    assert sorted(r.tag for r in split.where("tag = '1'").collect()) == ["1"] * 333

    manifest = json.loads((tmp_path / "stable" / key().dirname / MANIFEST).read_text())
    assert manifest["rows"] == 1000
    assert manifest["key"] == {
        "checkpoint_id": "ckpt-1",
        "spark_batch_id": 3,
        "ranges_json": RANGES,
    }
    assert manifest["created_at"] and manifest["schema"]["type"] == "struct"


def typed_frame(spark: SparkSession) -> DataFrame:
    schema = (
        "tag string, s string, b binary, d decimal(20,6), ts timestamp, a array<int>, "
        "m map<string,double>, n struct<x: int, inner: struct<y: string, z: array<string>>>, "
        "big long, f double"
    )
    data = [
        (
            "t1",
            "héllo\n",
            b"\x00\xff",
            Decimal("12345678901234.123456"),
            datetime(2026, 1, 2, 3, 4, 5, 678901),
            [1, None, 3],
            {"k": 1.5, "n": None},
            (1, ("y", ["p", None])),
            2**62,
            float("inf"),
        ),
        ("t2", "", b"", Decimal("-0.000001"), datetime(1500, 1, 1), [], {}, (None, None), -1, -0.0),
        ("", None, None, None, None, None, None, None, None, None),
        (
            None,
            "null tag",
            b"x",
            Decimal(0),
            datetime(1970, 1, 1),
            [7],
            {"a": 0.0},
            (2, None),
            0,
            1e300,
        ),
    ]
    return spark.createDataFrame(data, schema)


@pytest.mark.parametrize("partition_by", [None, "tag", "big"])
def test_types_order_and_rows_round_trip(
    spark: SparkSession, tmp_path: Path, partition_by: str | None
) -> None:
    df = typed_frame(spark)
    stable = StableOutput(tmp_path / "stable")
    copy = stable.put(df, key(), partition_by=partition_by)
    assert copy.columns == df.columns  # partition column not moved to the end
    assert same_types(copy, df)
    assert rows(copy) == rows(df)  # includes "" vs None tags and inf / -0.0
    got = stable.get(spark, key())
    assert got is not None and got.columns == df.columns and rows(got) == rows(df)
    data = tmp_path / "stable" / key().dirname / "data"
    partition_dirs = [p.name for p in data.iterdir() if p.is_dir()]
    if partition_by is None:
        assert partition_dirs == []
    else:
        assert all(name.startswith(f"{PARTITION_COLUMN}=") for name in partition_dirs)
        assert len(partition_dirs) >= 3


def test_partition_by_is_checked(spark: SparkSession, tmp_path: Path) -> None:
    df = typed_frame(spark)
    stable = StableOutput(tmp_path / "stable")
    with pytest.raises(ConfigError, match="nope"):
        stable.put(df, key(), partition_by="nope")
    with pytest.raises(ConfigError, match="array"):
        stable.put(df, key(), partition_by="a")
    assert stable.keys() == []


def test_empty_batch_gets_a_zero_row_copy(spark: SparkSession, tmp_path: Path) -> None:
    df = typed_frame(spark).where("false")
    stable = StableOutput(tmp_path / "stable")
    for batch, partition_by in ((1, None), (2, "tag")):
        copy = stable.put(df, key(batch), partition_by=partition_by)
        assert copy.count() == 0
        assert same_types(copy, df)
        again = stable.get(spark, key(batch))
        assert again is not None and again.count() == 0 and same_types(again, df)
    listed = stable.keys()
    assert [k.spark_batch_id for k in listed] == [1, 2]


def test_interrupted_write_is_ignored_then_rewritten(spark: SparkSession, tmp_path: Path) -> None:
    root = tmp_path / "stable"
    stable = StableOutput(root)
    df = spark.range(50).selectExpr("id", "id * 2 AS twice")
    # A crash before the rename leaves a temp dir; one after a half-copied final dir
    # (a hand copy, say) leaves a final name without manifest.
    small = spark.range(5).selectExpr("id", "id AS twice")
    done = StableOutput(tmp_path / "other").put(small, key())
    tmp = root / f".tmp-{key().dirname}-deadbeef0000"
    shutil.copytree(tmp_path / "other" / key().dirname / "data", tmp / "data")
    shutil.copytree(tmp_path / "other" / key().dirname / "data", root / key().dirname / "data")
    assert done.count() == 5

    assert stable.get(spark, key()) is None
    assert stable.keys() == []
    copy = stable.put(df, key())
    assert sorted(r.id for r in copy.collect()) == list(range(50))
    assert not tmp.exists()
    assert [p.name for p in root.iterdir()] == [key().dirname]
    got = stable.get(spark, key())
    assert got is not None and got.count() == 50


def test_corrupt_copy_raises_checkpoint_error(spark: SparkSession, tmp_path: Path) -> None:
    stable = StableOutput(tmp_path / "stable")
    df = spark.range(10).toDF("id")
    stable.put(df, key(1))
    stable.put(df, key(2))
    manifest = tmp_path / "stable" / key(1).dirname / MANIFEST
    manifest.write_text('{"format": 1, "key": ')
    with pytest.raises(CheckpointError, match=re.escape(str(manifest))):
        stable.get(spark, key(1))
    with pytest.raises(CheckpointError, match=re.escape(str(manifest))):
        stable.put(df, key(1))  # never silently recomputed
    with pytest.raises(CheckpointError, match=re.escape(str(manifest))):
        stable.keys()
    # A manifest without a schema is corrupt too.
    good = json.loads((tmp_path / "stable" / key(2).dirname / MANIFEST).read_text())
    del good["schema"]
    manifest.write_text(json.dumps(good))
    with pytest.raises(CheckpointError, match="schema"):
        stable.get(spark, key(1))
    # A data file gone missing behind a good manifest.
    data = tmp_path / "stable" / key(2).dirname / "data"
    next(data.glob("part-*.parquet")).unlink()
    with pytest.raises(CheckpointError, match="missing"):
        stable.get(spark, key(2))


def test_collect_removes_exactly_the_covered_copies(
    spark: SparkSession, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "stable"
    stable = StableOutput(root)
    assert stable.keys() == [] and stable.collect(lambda k: True) == 0
    df = spark.range(3).toDF("id")
    keys = [key(b) for b in (5, 1, 3, 2)] + [BatchKey("ckpt-1", 4, '{"other":{}}')]
    for k in keys:
        stable.put(df, k)
    assert stable.keys() == sorted(keys, key=lambda k: k.spark_batch_id)
    (root / ".trash-000000000000-0-abc").mkdir()  # left by a crash mid-delete

    seen: list[BatchKey] = []

    def covered(k: BatchKey) -> bool:
        seen.append(k)
        return k.spark_batch_id <= 3

    with caplog.at_level(logging.DEBUG, logger="sparkonce.outputs.stable"):
        assert stable.collect(covered) == 3
    collected = [r.getMessage() for r in caplog.records if "collected" in r.getMessage()]
    assert len(collected) == 3 and all(" rows in " in m for m in collected)
    assert sorted(seen, key=lambda k: k.spark_batch_id) == stable_sorted(keys)
    left = stable.keys()
    assert [k.spark_batch_id for k in left] == [4, 5]
    assert left[0].ranges_json == '{"other":{}}'
    assert sorted(p.name for p in root.iterdir()) == sorted(k.dirname for k in left)
    for k in keys:
        assert (stable.get(spark, k) is None) == (k.spark_batch_id <= 3)
    # A collected batch that is replayed gets a fresh copy.
    assert stable.put(df, key(1)).count() == 3


def stable_sorted(keys: list[BatchKey]) -> list[BatchKey]:
    return sorted(keys, key=lambda k: k.spark_batch_id)


def test_table_copy_round_trips_and_replays_without_collecting(
    spark: SparkSession, tmp_path: Path
) -> None:
    """put_tables: the tables collected once are written as Arrow IPC; a replay gets the
    first attempt's tables back exactly and never collects the new batch."""
    from pyspark.sql import functions as F

    executed = spark.sparkContext.accumulator(0)

    def noise() -> str:
        import uuid

        executed.add(1)
        return str(uuid.uuid4())

    noisy = F.udf(noise, "string").asNondeterministic()

    def collect(df: DataFrame) -> dict[str, object]:
        return {"all": df.toArrow(), "t1 only": df.where("tag = 't1'").toArrow()}

    df = typed_frame(spark).withColumn("u", noisy()).localCheckpoint()  # computed once here
    assert executed.value == 4
    stable = StableOutput(tmp_path / "stable")
    first = stable.put_tables(key(), df.schema, lambda: collect(df))
    assert list(first) == ["all", "t1 only"]
    assert first["all"].column_names == df.columns and first["all"].num_rows == 4
    assert first["t1 only"].num_rows == 1

    def must_not_run() -> dict[str, object]:
        raise AssertionError("a replay collected the batch again")

    again = stable.put_tables(key(), df.schema, must_not_run)
    assert list(again) == list(first)
    assert all(again[n].equals(first[n]) for n in first)  # same types and values
    read = stable.get_tables(key())
    assert read is not None and all(read[n].equals(first[n]) for n in first)
    assert stable.copy_writer(key()) == "arrow"
    with pytest.raises(CheckpointError, match="get_tables"):
        stable.get(spark, key())

    manifest = json.loads((tmp_path / "stable" / key().dirname / MANIFEST).read_text())
    assert manifest["writer"] == "arrow" and manifest["rows"] == 5
    assert manifest["tables"] == {"all": "table-0000.arrow", "t1 only": "table-0001.arrow"}
    assert sorted(manifest["files"]) == ["table-0000.arrow", "table-0001.arrow"]

    # A copy written by Spark is not a table copy; its writer says so.
    stable.put(typed_frame(spark), key(5), partition_by="tag")
    assert stable.copy_writer(key(5)) == "spark" and stable.get_tables(key(5)) is None
    assert stable.copy_writer(key(6)) is None


def test_table_copy_of_an_empty_batch_and_a_damaged_copy(
    spark: SparkSession, tmp_path: Path
) -> None:
    df = typed_frame(spark).where("false")
    stable = StableOutput(tmp_path / "stable")
    empty = stable.put_tables(key(1), df.schema, lambda: {"out": df.toArrow()})
    assert empty["out"].num_rows == 0 and empty["out"].column_names == df.columns
    got = stable.get_tables(key(1))
    assert got is not None and got["out"].equals(empty["out"])

    stable.put_tables(key(2), df.schema, lambda: {"out": typed_frame(spark).toArrow()})
    data = tmp_path / "stable" / key(2).dirname / "data" / "table-0000.arrow"
    data.write_bytes(data.read_bytes()[:-10])
    with pytest.raises(CheckpointError, match=r"table-0000\.arrow"):
        stable.get_tables(key(2))
    with pytest.raises(CheckpointError, match="not recomputed"):
        stable.put_tables(key(2), df.schema, lambda: {"out": df.toArrow()})
