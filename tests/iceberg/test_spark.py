"""IcebergSink in Spark pipelines on the shared classic session: rows written by Spark's
tasks as Parquet files, added to the table in the batch's one snapshot.

The oracle is the input itself: ``make_log`` writes the values 1..N, so the table must end
with each of them once, as read by PyIceberg's scan and by DuckDB's ``iceberg_scan``
(:mod:`tests.iceberg.readers`), never through sparkonce.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.catalog.sql import SqlCatalog
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import ConfigError, EmbeddedLogSource, FencedError, Pipeline
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.iceberg import key
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.iceberg import IcebergSink, staging_root
from tests.iceberg.readers import assert_each_value_once, referenced_files
from tests.spark.test_pipeline import forget_commit
from tests.spark.test_pipeline import values as spark_values

RECORDS = 300
TABLE = "ns.out"
RAW = "record_id string, partition int, offset long, key binary, value binary"


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def stamped(df: DataFrame) -> DataFrame:
    """The records, with a timestamp column (Spark writes it as INT96 unless told otherwise,
    which Iceberg cannot read) and a map of strings (nested strings are large in the table's
    schema read back, plain in Spark's: every run after the first validates against it)."""
    return spark_values(df).select(
        "*",
        F.timestamp_seconds(F.col("value")).alias("at"),
        F.create_map(F.lit("v"), F.col("value").cast("string")).alias("tags"),
    )


def pipeline(tmp_path: Path, log_dir: Path, *, checkpoint: str = "chk") -> Pipeline:
    return Pipeline(
        name="p1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=50),
        sink=IcebergSink(catalog(tmp_path), TABLE),
        checkpoint=tmp_path / checkpoint,
        transform=stamped,
    )


def staged_dirs(tmp_path: Path) -> set[Path]:
    root = staging_root(catalog(tmp_path).load_table(TABLE), "p1", TABLE)
    return {d for d in root.iterdir() if d.is_dir()}


def check_snapshots(tmp_path: Path, batches: int) -> None:
    """One snapshot per committed batch, each naming its staging directory, and the table's
    files exactly the committed directories' files (nothing of Spark's _temporary)."""
    table = catalog(tmp_path).load_table(TABLE)
    ours = [s for s in table.snapshots() if s.summary and s.summary[key("p1", "entry")]]
    assert len(ours) == batches == len(table.snapshots()), table.snapshots()
    named = {s.summary[key("p1", "staged")] for s in ours if s.summary}
    files = referenced_files(catalog(tmp_path), TABLE)
    assert {f.parent.name for f in files} <= named
    assert all(f.name.startswith("part-") and f.suffix == ".parquet" for f in files), files
    for d in staged_dirs(tmp_path):
        assert d.name in named, f"an unreferenced staging directory: {d}"
        assert not (d / "_temporary").exists()
        assert {f for f in d.glob("*.parquet")} <= files


def test_a_spark_pipeline_is_exact_across_a_replay_a_new_checkpoint_and_a_zombie(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS, keys=5)
    p = pipeline(tmp_path, log_dir)
    first = p.run(spark, timeout=300)
    assert first.batches_committed >= 2 and first.rows_committed == RECORDS, first
    assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, RECORDS + 1)))
    check_snapshots(tmp_path, first.batches_committed)
    at = catalog(tmp_path).load_table(TABLE).scan().to_arrow().column("at")
    assert str(at.type) == "timestamp[us, tz=UTC]"
    assert min(at.to_pylist()).timestamp() == 1
    read = catalog(tmp_path).load_table(TABLE).scan(selected_fields=("value", "tags")).to_arrow()
    pairs = zip(read["value"].to_pylist(), read["tags"].to_pylist(), strict=True)
    assert all(t == [("v", str(v))] for v, t in pairs)

    # A replay: Spark forgets its last batch; the run skips it, nothing is added twice.
    last_batch = max(
        int(f.name) for f in (tmp_path / "chk" / "commits").iterdir() if f.name.isdigit()
    )
    forget_commit(tmp_path / "chk", last_batch)
    second = pipeline(tmp_path, log_dir).run(spark, timeout=300)
    assert second.batches_skipped == 1 and second.rows_committed == 0, second
    assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, RECORDS + 1)))

    # A lost checkpoint: a new one starts at Spark's batch 0; the table says where to resume.
    make_log(100, keys=5, start=RECORDS + 1)
    third = pipeline(tmp_path, log_dir, checkpoint="chk2").run(spark, timeout=300)
    assert third.resumed_from == "ledger" and third.rows_committed == 100, third
    assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, RECORDS + 101)))
    check_snapshots(tmp_path, first.batches_committed + third.batches_committed)

    # A zombie: a run of an older epoch stages a batch with Spark, then its commit is fenced.
    zombie = IcebergSink(catalog(tmp_path), TABLE)
    zombie.open()
    old = zombie.acquire("p1")
    newer = IcebergSink(catalog(tmp_path), TABLE)
    newer.open()
    new = newer.acquire("p1")
    seq = len(newer.ledger("p1"))
    end = newer.end_offsets("p1")[("events", 0)]
    one = BatchRanges((OffsetRange("events", 0, end, end + 1),))
    df = stamped(spark.createDataFrame([("r", 0, end, b"k", b"10001")], RAW))
    ctx = BatchContext("p1", old.epoch, one, spark_batch_id=99)
    z = zombie.stager.prepare(ctx, df, seq)
    assert z.rows == 1
    with pytest.raises(FencedError) as info:
        assert zombie._committer is not None
        zombie._committer._transaction(ctx, seq, z, time.monotonic())
    assert info.value.owner_epoch == new.epoch
    assert_each_value_once(catalog(tmp_path), TABLE, list(range(1, RECORDS + 101)))
    zombie_dir = z.notes["dir"]
    assert zombie_dir.is_dir() and zombie_dir not in {
        f.parent for f in referenced_files(catalog(tmp_path), TABLE)
    }

    # The sweep: the owner's in-flight batch (the same seq, not committed yet) survives it,
    # and so does the zombie's, whose seq nobody committed yet.
    ctx2 = BatchContext("p1", new.epoch, one, spark_batch_id=7)
    inflight = newer.stager.prepare(ctx2, df, seq)
    assert newer.sweep_orphans("p1", grace_seconds=0) == []
    assert inflight.notes["dir"].is_dir() and zombie_dir.is_dir()
    # The owner commits it; the sweep after the commit keeps the zombie's (grace period),
    # one with no grace deletes it, and never the committed directory.
    assert newer._committer is not None
    done = newer._committer.commit_with(ctx2, lambda s: inflight)
    assert not done.skipped and done.seq == seq
    assert zombie_dir.is_dir()
    assert newer.sweep_orphans("p1", grace_seconds=0) == [zombie_dir]
    assert not zombie_dir.exists() and inflight.notes["dir"].is_dir()
    assert_each_value_once(catalog(tmp_path), TABLE, [*range(1, RECORDS + 101), 10001])
    check_snapshots(tmp_path, first.batches_committed + third.batches_committed + 1)


def test_a_type_mismatch_is_refused_by_a_real_run_before_the_epoch(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """The runner's validate(StructType) meets an existing table whose ``value`` is a
    string: the run stops before it takes an epoch or reads anything."""
    import pyarrow as pa

    log_dir = make_log(30, keys=5)
    cat = catalog(tmp_path)
    cat.create_namespace("ns")
    schema = pa.schema(
        [
            ("record_id", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.string()),
            ("value", pa.string()),
            ("at", pa.timestamp("us", tz="UTC")),
        ]
    )
    cat.create_table(TABLE, schema=schema)
    p = pipeline(tmp_path, log_dir)
    with pytest.raises(
        ConfigError, match=r"column 'value' is int64 in the batch but (large_)?string"
    ):
        p.run(spark, timeout=300)
    sink = IcebergSink(catalog(tmp_path), TABLE)
    assert sink.owner("p1") is None  # no epoch was taken
    assert catalog(tmp_path).load_table(TABLE).snapshots() == []
    assert not (tmp_path / "chk" / "commits").exists()
