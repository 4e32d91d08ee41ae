"""IcebergSink on the shared committer, batches given as Arrow tables (no Spark).

The oracle is the input: batch ``i`` holds the offsets ``[10 i, 10 i + 10)`` as values,
so the table must end with each offset once, read back by PyIceberg's scan.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.catalog.sql import SqlCatalog

import sparkonce
from sparkonce.commit.base import Staged
from sparkonce.errors import ConfigError, FencedError
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.ledger.iceberg import DataFiles
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.iceberg import IcebergSink, committed_files, staging_root

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


def stage_files(sink: IcebergSink, ctx: BatchContext, seq: int, rows: pa.Table) -> Staged:
    """A staging directory as Spark's job commit leaves it (part files, _SUCCESS), without
    Spark: what the executor route's publish adds."""
    import uuid

    import pyarrow.parquet as pq

    name = f"{ctx.epoch}-{seq}-{uuid.uuid4().hex}"
    d = staging_root(sink.store.load(), PIPE, "t") / name
    d.mkdir(parents=True)
    pq.write_table(rows, d / "part-00000-x.c000.snappy.parquet")
    (d / "_SUCCESS").touch()
    files = committed_files(d)
    data = DataFiles(tuple(f.as_uri() for f in files), rows.num_rows, name)
    return Staged(rows=rows.num_rows, payload=data, notes={"dir": d})


def test_nested_columns_validate_against_the_table_they_created(tmp_path: Path) -> None:
    """A map, a list and a struct of strings: Spark's schema as Arrow has large strings
    inside them, the table's schema read back has plain ones. A second run's ``validate``
    must take them as the same types, and still refuse a nested type that differs."""
    from pyspark.sql.types import (
        ArrayType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    def schema(value_type: object) -> StructType:
        return StructType(
            [
                StructField("v", LongType()),
                StructField("tags", MapType(StringType(), value_type)),  # type: ignore[arg-type]
                StructField("names", ArrayType(StringType())),
                StructField("who", StructType([StructField("name", StringType())])),
            ]
        )

    IcebergSink(catalog(tmp_path), "ns.out").validate(schema(StringType()))
    IcebergSink(catalog(tmp_path), "ns.out").validate(schema(StringType()))  # the next run
    with pytest.raises(ConfigError, match="column 'tags' is map<string, int64>"):
        IcebergSink(catalog(tmp_path), "ns.out").validate(schema(LongType()))


def test_the_orphan_sweep_deletes_only_unreferenced_dirs_of_committed_batches(
    tmp_path: Path,
) -> None:
    """Dirs of a committed seq other than its snapshot's go (after the grace period); the
    committed one, the in-flight batch's (seq above the ledger's) and a batch whose
    snapshot expired (which dir it added is unknown) stay."""
    sink = IcebergSink(catalog(tmp_path), "ns.out")
    sink.validate_arrow(batch(0, 1)[1].schema)
    epoch = sink.acquire(PIPE).epoch
    sink.open()
    assert sink._committer is not None
    dirs = []
    for i in range(3):
        ctx, rows = batch(i, epoch)
        lost = stage_files(sink, ctx, i, rows)  # a failed attempt of the same batch
        won = stage_files(sink, ctx, i, rows)
        assert not sink._committer.commit_with(ctx, lambda _seq, w=won: w).skipped  # type: ignore[misc]
        dirs.append((lost.notes["dir"], won.notes["dir"]))
    ctx3, rows3 = batch(3, epoch)
    inflight = stage_files(sink, ctx3, 3, rows3)
    assert values(sink) == list(range(30))
    # after_commit swept with the default grace period: every dir is still there.
    assert all(d.is_dir() for pair in dirs for d in pair)
    # Batch 0's snapshot expires from the history (the ledger keeps its resume point).
    table = sink.store.load()
    first = table.snapshots()[0]
    table.maintenance.expire_snapshots().by_id(first.snapshot_id).commit()
    gone = sink.sweep_orphans(PIPE, grace_seconds=0)
    assert sorted(gone) == sorted([dirs[1][0], dirs[2][0]])
    assert dirs[0][0].is_dir(), "a dir of an expired snapshot's seq was deleted"
    assert all(won.is_dir() for _, won in dirs) and inflight.notes["dir"].is_dir()
    assert values(sink) == list(range(30))


def test_the_sink_pickles_with_a_catalog_of_its_own_for_spark_connect(tmp_path: Path) -> None:
    """A Spark Connect batch function carries the sink to the server's Python worker: it
    pickles as the calls that built it and its catalog (a SQL catalog's engine does not
    pickle), and a pipeline with it is not refused on Connect."""
    import pickle

    from sparkonce import EmbeddedLogSource, Pipeline
    from sparkonce.faults import NO_FAULTS
    from sparkonce.pipeline.connect import refuse_on_connect

    for sink in (
        IcebergSink(catalog(tmp_path), "ns.out", mode="upsert", keys=["v"], latest_by="s"),
        IcebergSink(catalog=catalog(tmp_path), table="ns.out", orphan_grace_seconds=5),
    ):
        copy = pickle.loads(pickle.dumps(sink))
        assert isinstance(copy, IcebergSink) and copy.catalog is not sink.catalog
        assert (copy.table, copy.mode, copy.keys, copy.latest_by) == (
            sink.table,
            sink.mode,
            sink.keys,
            sink.latest_by,
        )
        assert copy.stager.grace_seconds == sink.stager.grace_seconds
        assert (copy.catalog.name, copy.catalog.properties) == (
            sink.catalog.name,
            sink.catalog.properties,
        )
        p = Pipeline(
            name=PIPE,
            source=EmbeddedLogSource(tmp_path / "log", "events"),
            sink=sink,
            checkpoint=tmp_path / "chk",
        )
        refuse_on_connect(p, faults=NO_FAULTS)  # no ConfigError
    assert not (tmp_path / "wh").exists()  # no table was created


def test_a_failed_batch_deletes_its_files_unless_the_commit_landed(tmp_path: Path) -> None:
    """abort() removes a failed attempt's staging directory, but not one the catalog
    committed before the error reached the run (a lost answer): the table needs it."""
    sink = IcebergSink(catalog(tmp_path), "ns.out")
    sink.validate_arrow(batch(0, 1)[1].schema)
    epoch = sink.acquire(PIPE).epoch
    sink.open()
    assert sink._committer is not None
    ctx, rows = batch(0, epoch)
    failed = stage_files(sink, ctx, 0, rows)
    with pytest.raises(RuntimeError, match="staging failed"):
        sink._committer.commit_with(ctx, lambda _seq: _fail_after(sink, failed))
    assert not failed.notes["dir"].exists()

    landed = stage_files(sink, ctx, 0, rows)
    real = sink.store._commit

    def commit_then_lose_the_answer(txn: Any) -> None:
        real(txn)
        raise RuntimeError("the catalog's answer was lost")

    sink.store._commit = commit_then_lose_the_answer  # type: ignore[method-assign]
    with pytest.raises(Exception, match="answer was lost"):
        sink._committer.commit_with(ctx, lambda _seq: landed)
    assert landed.notes["dir"].is_dir()
    assert values(sink) == list(range(10))


def _fail_after(sink: IcebergSink, staged: Staged) -> Staged:
    sink.stager._writing = staged.notes["dir"]  # as prepare() leaves it before Spark's write
    raise RuntimeError("staging failed")


def test_spark_s_files_need_optional_columns(tmp_path: Path) -> None:
    """Spark writes every Parquet column as optional: a table created from a StructType
    with NOT NULL fields gets optional columns, and an existing required column is refused
    before the epoch (PyIceberg's add_files would refuse the files inside the commit)."""
    from pyspark.sql.types import LongType, StructField, StructType

    strict = StructType([StructField("v", LongType(), nullable=False)])
    sink = IcebergSink(catalog(tmp_path), "ns.out")
    sink.validate(strict)
    assert [f.required for f in sink.store.load().schema().fields] == [False]
    c = catalog(tmp_path)
    c.create_table("ns.strict", schema=pa.schema([pa.field("v", pa.int64(), nullable=False)]))
    with pytest.raises(ConfigError, match=r"required \(NOT NULL\) columns \['v'\]"):
        IcebergSink(catalog(tmp_path), "ns.strict").validate(strict)


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "100"])
def test_keep_snapshots_must_be_a_whole_number_of_at_least_one(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ConfigError, match=r"keep_snapshots must be a whole number >= 1"):
        IcebergSink(catalog(tmp_path), "ns.out", keep_snapshots=bad)
    unbounded = IcebergSink(catalog(tmp_path), "ns.out", keep_snapshots=None)
    assert unbounded.store.keep_snapshots is None
    assert IcebergSink(catalog(tmp_path), "ns.out").store.keep_snapshots == 100


def test_a_moved_sink_keeps_its_retention(tmp_path: Path) -> None:
    from sparkonce.sinks.inspect import inspector_for

    sink = IcebergSink(catalog(tmp_path), "ns.out", keep_snapshots=7)
    moved = inspector_for(sink).relocated(f"iceberg+sqlite:///{tmp_path}/other/catalog.db")
    assert isinstance(moved, IcebergSink) and moved.store.keep_snapshots == 7


def test_commits_sweep_at_most_once_per_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep after a commit lists one directory per batch ever staged, so a pipeline's
    commits run it at most once per SWEEP_EVERY_SECONDS (grace 0: after every commit). An
    orphan old enough is deleted by the first commit's sweep, kept through commits within
    the interval, and deleted by the first commit after it."""
    import os

    from sparkonce.sinks import iceberg as mod

    clock = [1000.0]
    monkeypatch.setattr(mod.time, "monotonic", lambda: clock[0])
    sink = IcebergSink(catalog(tmp_path), "ns.out", orphan_grace_seconds=120)
    sink.validate_arrow(batch(0, 1)[1].schema)
    epoch = sink.acquire(PIPE).epoch
    sink.open()
    assert sink._committer is not None

    def orphaned(i: int) -> Path:
        """Batch i committed from one directory, with a failed attempt's beside it, old."""
        ctx, rows = batch(i, epoch)
        lost = stage_files(sink, ctx, i, rows).notes["dir"]
        won = stage_files(sink, ctx, i, rows)
        assert sink._committer is not None
        assert not sink._committer.commit_with(ctx, lambda _seq: won).skipped
        os.utime(lost, (0, 0))  # past the grace period
        return lost

    first = orphaned(0)  # the first commit sweeps, before this orphan was made old
    clock[0] += 10
    second = orphaned(1)  # 10 s later: no sweep
    assert first.is_dir() and second.is_dir()
    clock[0] += mod.SWEEP_EVERY_SECONDS
    third = orphaned(2)  # past the interval: this commit sweeps the two older orphans
    assert not first.exists() and not second.exists() and third.is_dir()
    assert values(sink) == list(range(30))
