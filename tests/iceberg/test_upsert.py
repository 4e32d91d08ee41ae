"""IcebergSink upsert on the shared committer, without Spark: each batch's rows (one per key,
as Spark's tasks leave them) are staged as Parquet files the way Spark's job commit leaves
them, and the commit replaces the existing rows of those keys in one snapshot.

The oracle is a plain dict: key -> the row of the newest batch that held the key. Both
independent readers (PyIceberg's scan, DuckDB's ``iceberg_scan``) must see exactly it.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from sparkonce.commit.base import Staged
from sparkonce.errors import ConfigError, FencedError
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.ledger.iceberg import DataFiles, key
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks.iceberg import IcebergSink, committed_dirs, committed_files, staging_root
from tests.iceberg.readers import assert_rows, referenced_files

PIPE = "p1"
TABLE = "ns.up"
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64()), ("s", pa.string())])


def catalog(tmp_path: Path) -> SqlCatalog:
    return SqlCatalog("c", uri=f"sqlite:///{tmp_path}/cat.db", warehouse=f"file://{tmp_path}/wh")


def sink(tmp_path: Path) -> IcebergSink:
    s = IcebergSink(catalog(tmp_path), TABLE, mode="upsert", keys=["k"], orphan_grace_seconds=0)
    s.validate_arrow(SCHEMA)
    return s


def stage(s: IcebergSink, ctx: BatchContext, seq: int, parts: list[list[int]], i: int) -> Staged:
    """Batch ``i``'s rows (value ``1000 i + k``), one Parquet file per part, as Spark's job
    commit leaves them (``part-`` files and ``_SUCCESS``)."""
    name = f"{ctx.epoch}-{seq}-{uuid.uuid4().hex}"
    d = staging_root(s.store.load(), PIPE, TABLE) / name
    d.mkdir(parents=True)
    for n, ks in enumerate(parts):
        rows = pa.table(
            {"k": ks, "v": [1000 * i + k for k in ks], "s": [f"b{i}"] * len(ks)}, schema=SCHEMA
        )
        pq.write_table(rows, d / f"part-{n:05d}-x.c000.snappy.parquet")
    (d / "_SUCCESS").touch()
    files = committed_files(d)
    total = sum(len(p) for p in parts)
    data = DataFiles(tuple(f.as_uri() for f in files), total, name, ("k",))
    return Staged(rows=total, payload=data, notes={"dir": d})


def ctx_of(i: int, epoch: int) -> BatchContext:
    return BatchContext(PIPE, epoch, BatchRanges((OffsetRange("t", 0, 10 * i, 10 * i + 10),)), i)


def commit(s: IcebergSink, i: int, epoch: int, parts: list[list[int]]) -> CommitResult:
    s.open()
    assert s._committer is not None
    ctx = ctx_of(i, epoch)
    return s._committer.commit_with(ctx, lambda seq: stage(s, ctx, seq, parts, i))


# Batches of keys (one row per key each); keys repeat across batches and across the
# files of one batch's neighbours, and some files of the table hold no batch key.
BATCHES = [
    [[1, 2, 3], [10, 11, 12]],
    [[2, 3, 4]],
    [[20, 21], [30]],
    [[1, 30, 40]],
    [[11, 12, 13, 14]],
]


def oracle(upto: int) -> list[tuple[int, int, str]]:
    rows: dict[int, tuple[int, int, str]] = {}
    for i, parts in enumerate(BATCHES[:upto]):
        for ks in parts:
            for k in ks:
                rows[k] = (k, 1000 * i + k, f"b{i}")
    return sorted(rows.values())


def test_upsert_batches_replace_their_keys_in_one_snapshot_each(tmp_path: Path) -> None:
    s = sink(tmp_path)
    epoch = s.acquire(PIPE).epoch
    for i, parts in enumerate(BATCHES):
        before = referenced_files(catalog(tmp_path), TABLE)
        result = commit(s, i, epoch, parts)
        assert not result.skipped and result.seq == i, result
        assert_rows(catalog(tmp_path), TABLE, ["k", "v", "s"], oracle(i + 1))
        after = referenced_files(catalog(tmp_path), TABLE)
        # Only files holding a batch key were replaced; the others are untouched.
        keys = {k for ks in parts for k in ks}
        for f in before - after:
            held = set(pq.read_table(f, columns=["k"]).column("k").to_pylist())
            assert held & keys, f"{f.name} held no key of batch {i} but was rewritten"
        for f in before & after:
            held = set(pq.read_table(f, columns=["k"]).column("k").to_pylist())
            assert not held & keys, f"{f.name} still holds keys {held & keys} of batch {i}"
    table = catalog(tmp_path).load_table(TABLE)
    snaps = table.snapshots()
    assert len(snaps) == len(BATCHES), snaps  # one snapshot per batch, nothing between
    for i, snap in enumerate(snaps):
        assert snap.summary is not None
        assert json.loads(str(snap.summary[key(PIPE, "entry")]))["seq"] == i
    assert [e.seq for e in s.ledger(PIPE)] == list(range(len(BATCHES)))
    # Every referenced file (the batches' and the survivors') is in its batch's directory.
    winners = set(committed_dirs(table, PIPE).values())
    assert {f.parent.name for f in referenced_files(catalog(tmp_path), TABLE)} <= winners

    # A replay of batch 3 (a checkpoint behind the ledger) is skipped: nothing changes.
    replay = commit(s, 3, epoch, BATCHES[3])
    assert replay.replayed and replay.seq == 3
    assert len(catalog(tmp_path).load_table(TABLE).snapshots()) == len(BATCHES)
    assert_rows(catalog(tmp_path), TABLE, ["k", "v", "s"], oracle(len(BATCHES)))


def test_a_zombie_upsert_is_fenced_and_changes_nothing(tmp_path: Path) -> None:
    old = sink(tmp_path)
    e1 = old.acquire(PIPE).epoch
    commit(old, 0, e1, BATCHES[0])
    new = sink(tmp_path)
    e2 = new.acquire(PIPE).epoch
    with pytest.raises(FencedError) as info:
        commit(old, 1, e1, BATCHES[1])
    assert info.value.owner_epoch == e2
    assert_rows(catalog(tmp_path), TABLE, ["k", "v", "s"], oracle(1))
    assert len(catalog(tmp_path).load_table(TABLE).snapshots()) == 1
    # The owner goes on from the table's ledger.
    assert not commit(new, 1, e2, BATCHES[1]).skipped
    assert_rows(catalog(tmp_path), TABLE, ["k", "v", "s"], oracle(2))


def test_a_lost_catalog_race_redoes_the_merge_on_the_newer_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer appends (a row of key 2) after the batch's merge read the table and
    before its catalog swap: the swap fails, the merge is redone on the newer metadata (the
    batch's row replaces the other writer's row of its key too), and the lost attempt's
    survivors' files are deleted."""
    import sparkonce.ledger.iceberg as ledger

    s = sink(tmp_path)
    epoch = s.acquire(PIPE).epoch
    commit(s, 0, epoch, BATCHES[0])
    real = ledger.add_upsert
    raced: list[int] = []

    def merge_then_race(*args: object, **kw: object) -> tuple[list[Path], int]:
        out = real(*args, **kw)  # type: ignore[arg-type]
        if not raced:
            raced.append(len(out[0]))
            rows = pa.table({"k": [2, 99], "v": [-2, -99], "s": ["other", "other"]}, SCHEMA)
            catalog(tmp_path).load_table(TABLE).append(rows)
        return out

    monkeypatch.setattr(ledger, "add_upsert", merge_then_race)
    commit(s, 1, epoch, BATCHES[1])
    assert raced == [1]  # the lost attempt wrote one survivors' file
    want = [*oracle(2), (99, -99, "other")]
    assert_rows(catalog(tmp_path), TABLE, ["k", "v", "s"], sorted(want))
    table = catalog(tmp_path).load_table(TABLE)
    assert len(table.snapshots()) == 3  # batch 0, the other writer's append, batch 1
    d = staging_root(table, PIPE, TABLE) / str(committed_dirs(table, PIPE)[1])
    on_disk = set(d.glob("*.parquet"))
    assert on_disk <= referenced_files(catalog(tmp_path), TABLE), "a lost attempt's file stayed"


def test_upsert_options_are_checked_before_the_epoch(tmp_path: Path) -> None:
    from pyspark.sql.types import (
        DoubleType,
        LongType,
        MapType,
        StringType,
        StructField,
        StructType,
    )

    out = StructType(
        [
            StructField("k", LongType()),
            StructField("v", LongType()),
            StructField("m", MapType(StringType(), StringType())),
            StructField("d", DoubleType()),
        ]
    )
    with pytest.raises(ConfigError, match=r"needs keys=\[\.\.\.\]"):
        IcebergSink(catalog(tmp_path), TABLE, mode="upsert")
    with pytest.raises(ConfigError, match=r"latest_by=\[\.\.\.\] only applies to mode='upsert'"):
        IcebergSink(catalog(tmp_path), TABLE, latest_by="v")
    one = IcebergSink(catalog(tmp_path), TABLE, mode="upsert", keys=["k"], latest_by="v")
    assert one.latest_by == ("v",) and "latest_by=['v']" in one.describe()
    cases = [
        (dict(keys=["x"]), r"upsert keys \['x'\] are not columns of the pipeline's output"),
        (dict(keys=["k"], latest_by=["y"]), r"latest_by columns \['y'\] are not columns"),
        (dict(keys=["k"], latest_by=["m"]), r"latest_by column 'm' is map<string,string>"),
        (dict(keys=["d"]), r"upsert key 'd' is double"),
    ]
    for kw, match in cases:
        with pytest.raises(ConfigError, match=match):
            IcebergSink(catalog(tmp_path), TABLE, mode="upsert", **kw).validate(out)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"IcebergSink upserts: Spark's 'complete' output"):
        IcebergSink(catalog(tmp_path), TABLE, mode="upsert", keys=["k"]).validate(out, "complete")
    assert not (tmp_path / "wh").exists()  # nothing created, no epoch taken
    # The Arrow route (the protocol simulation's, no Spark) appends only: refused, not wrong.
    arrow = IcebergSink(catalog(tmp_path), TABLE, mode="upsert", keys=["k"])
    rows = pa.table({"k": [1], "v": [1], "s": ["x"]}, schema=SCHEMA)
    with pytest.raises(ConfigError, match="upsert stages batches with Spark's tasks only"):
        arrow.stager.prepare_arrow(ctx_of(0, 1), rows, None, 0)
