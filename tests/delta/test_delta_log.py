"""The Delta sink without a JVM (:mod:`sparkonce.spark.delta_log`, the adapter of Spark Connect
sessions), on a classic session here: its writes are Spark's DataFrame writer and its reads
are files, the same code either way.

- Its reads of a table the classic path wrote (a checkpoint included) agree with the classic
  adapter's: versions, ``txn`` versions, properties, ledger entries and row counts.
- Taking an epoch by a write: an older epoch's batch that commits between the acquire's read
  and its write is counted (the acquire stores its count), never moved back; an acquire that
  died before storing that count is counted by the next reader; and the naive acquire, with
  no look at the log, does move the count back here (so the race is really forced).
- What the reader does not read (v2 checkpoints) is refused, not guessed.

Rows are read from the table's log and Parquet files with pyarrow, not with sparkonce.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sparkonce import DeltaSink, FencedError
from sparkonce.errors import LedgerError
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.delta import DeltaLedgerStore, app_id, pack, unpack
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.spark.delta import DeltaTable
from sparkonce.spark.delta_log import ConnectDeltaTable
from tests.delta.test_sink import pipeline

SCHEMA = "partition int, offset long, key string, value long"
P = "p1"


def delta_rows(table: Path) -> list[dict[str, Any]]:
    """The table's rows: the files its JSON commits add and do not remove, read with pyarrow."""
    import pyarrow.parquet as pq

    live: dict[str, None] = {}
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return [r for f in live for r in pq.read_table(table / f).to_pylist()]


def jvm_free_sink(spark: SparkSession, path: Path) -> DeltaSink:
    """A DeltaSink on ``path`` whose table is the JVM-free adapter (as on Connect)."""
    sink = DeltaSink(path)
    if not (path / "_delta_log").exists():
        sink.validate(spark.createDataFrame([], SCHEMA).schema)
    sink._table = ConnectDeltaTable(spark, sink.path)
    sink.open()
    return sink


def commit(spark: SparkSession, sink: DeltaSink, epoch: int, offset: int) -> Any:
    """Commit one batch of one record (partition 0, ``offset``) under ``epoch``."""
    ranges = BatchRanges((OffsetRange("events", 0, offset, offset + 1),))
    ctx = BatchContext(P, epoch, ranges, spark_batch_id=offset, checkpoint_id="q")
    df = spark.createDataFrame([(0, offset, "k", offset)], SCHEMA)
    return sink.commit(ctx, df)


def stored(path: Path) -> tuple[int, int]:
    """``(epoch, entries)`` of the newest ``txn`` of the pipeline, from the JSON commits."""
    found = None
    for commit_file in sorted((path / "_delta_log").glob("*.json")):
        for line in commit_file.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"] == app_id(P):
                found = int(txn["version"])
    assert found is not None
    return unpack(found)


@pytest.mark.campaign_lane  # a 10-batch pipeline run first (about 40 s here)
def test_reads_agree_with_the_classic_adapter_on_a_table_the_classic_path_wrote(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(300, keys=5)
    path = tmp_path / "tables" / "out"
    # Another application's txn and a property, from the first commits: after the
    # checkpoint, only it holds them.
    spark.createDataFrame([], SCHEMA).write.format("delta").option("txnAppId", "other").option(
        "txnVersion", "7"
    ).save(str(path))
    spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('sparkonce.test' = 'x')")
    p = pipeline(tmp_path, log_dir, limit=10)  # 10+ batches: Delta checkpoints at version 10
    report = p.run(spark, timeout=300)
    n = report.batches_committed
    assert n >= 10, report
    assert (path / "_delta_log" / f"{10:020d}.checkpoint.parquet").exists()

    classic = DeltaTable(spark, str(path))
    free = ConnectDeltaTable(spark, str(path))
    assert free.version() == classic.version() >= 13
    assert free.txn_version(app_id(P)) == classic.txn_version(app_id(P)) == pack(1, n)
    assert free.txn_version("other") == classic.txn_version("other") == 7
    assert free.property("sparkonce.test") == classic.property("sparkonce.test") == "x"
    assert free.property("delta.appendOnly") == classic.property("delta.appendOnly")
    entries = p.sink.ledger(P)
    again = DeltaLedgerStore(lambda: free, "free").entries(P)
    assert [(e.seq, e.epoch, e.ranges, e.row_count) for e in again] == [
        (e.seq, e.epoch, e.ranges, e.row_count) for e in entries
    ]
    assert sum(e.row_count for e in again) == len(delta_rows(path)) == 300

    # Only the checkpoint and the commits after it are read: with the older commits gone
    # (as log retention leaves a table), the answers stay the same.
    for v in range(11):
        (path / "_delta_log" / f"{v:020d}.json").unlink()
    fresh = ConnectDeltaTable(spark, str(path))
    assert fresh.txn_version("other") == 7
    assert fresh.txn_version(app_id(P)) == pack(1, n)
    assert fresh.property("sparkonce.test") == "x"


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_a_multi_part_checkpoint_is_read(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    sink = jvm_free_sink(spark, path)
    assert sink.acquire(P).epoch == 1
    # Delta splits a checkpoint by its data files: one part per file here, at version 5.
    spark.conf.set("spark.databricks.delta.checkpoint.partSize", "1")
    try:
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.checkpointInterval'='5')")
        for offset in range(3):
            commit(spark, sink, 1, offset)
    finally:
        spark.conf.unset("spark.databricks.delta.checkpoint.partSize")
    parts = sorted(p.name for p in (path / "_delta_log").glob("*.checkpoint.*.parquet"))
    assert len(parts) >= 2, sorted(p.name for p in (path / "_delta_log").iterdir())
    for v in range(int(parts[0][:20])):
        (path / "_delta_log" / f"{v:020d}.json").unlink(missing_ok=True)
    fresh = ConnectDeltaTable(spark, str(path))
    assert fresh.txn_version(app_id(P)) == pack(1, 3)
    assert fresh.property("delta.checkpointInterval") == "5"


def test_a_v2_checkpoint_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    path = tmp_path / "t"
    spark.sql(
        f"CREATE TABLE delta.`{path}` (v BIGINT) USING delta TBLPROPERTIES "
        "('delta.feature.v2Checkpoint' = 'supported', 'delta.checkpointPolicy' = 'v2')"
    )
    with pytest.raises(LedgerError, match=r"v2 checkpoint.*classic Spark session"):
        ConnectDeltaTable(spark, str(path)).txn_version(app_id(P))


def race_batch_into_the_acquire(
    spark: SparkSession, newer: DeltaSink, older: DeltaSink, offset: int
) -> None:
    """Make ``newer``'s next epoch commit run ``older``'s batch at ``offset`` first: between
    the acquire's read of the table and its write."""
    table = newer.table
    assert isinstance(table, ConnectDeltaTable)
    real = table.commit_txn
    calls: list[int] = []

    def commit_txn(app: str, version: int, metadata: str) -> None:
        if not calls:
            commit(spark, older, 1, offset)  # the older run's batch lands first
        calls.append(version)
        real(app, version, metadata)

    table.commit_txn = commit_txn  # type: ignore[method-assign]


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_an_older_batch_between_the_acquires_read_and_write_is_counted(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    older = jvm_free_sink(spark, path)
    assert older.acquire(P).epoch == 1
    for offset in range(2):
        assert not commit(spark, older, 1, offset).skipped
    newer = jvm_free_sink(spark, path)
    race_batch_into_the_acquire(spark, newer, older, 2)
    assert newer.acquire(P).epoch == 2
    assert stored(path) == (2, 3)  # the older run's third batch counted, not moved back
    assert [e.seq for e in jvm_free_sink(spark, path).ledger(P)] == [0, 1, 2]
    with pytest.raises(FencedError):  # the older run's next batch
        commit(spark, older, 1, 3)
    assert commit(spark, newer, 2, 3).seq == 3
    offsets = Counter(r["offset"] for r in delta_rows(path))
    assert offsets == {0: 1, 1: 1, 2: 1, 3: 1}


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_the_naive_acquire_moves_the_count_back(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race against an acquire that writes what it read and never looks at the log
    (no commits between its read and its write): the count goes back from 3 to 2, and the
    newer run would commit batch 2 again. This is the trap the acquire by write avoids."""
    monkeypatch.setattr(DeltaLedgerStore, "_txns_between", lambda self, p, low, high: [])
    path = tmp_path / "t"
    older = jvm_free_sink(spark, path)
    older.acquire(P)
    for offset in range(2):
        commit(spark, older, 1, offset)
    newer = jvm_free_sink(spark, path)
    race_batch_into_the_acquire(spark, newer, older, 2)
    assert newer.acquire(P).epoch == 2
    assert stored(path) == (2, 2)


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_an_acquire_that_died_before_storing_the_count_is_counted_by_the_next_reader(
    spark: SparkSession, tmp_path: Path
) -> None:
    path = tmp_path / "t"
    older = jvm_free_sink(spark, path)
    older.acquire(P)
    for offset in range(2):
        commit(spark, older, 1, offset)
    dying = jvm_free_sink(spark, path)
    race_batch_into_the_acquire(spark, dying, older, 2)
    table = dying.table
    assert isinstance(table, ConnectDeltaTable)
    first = table.commit_txn

    def commit_txn(app: str, version: int, metadata: str) -> None:
        if json.loads(metadata).get("read") is None:  # the second write: the process dies
            raise SystemExit("killed")
        first(app, version, metadata)

    table.commit_txn = commit_txn  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        dying.acquire(P)
    assert stored(path) == (2, 2)  # the stored count is behind: epoch 2 wrote what it read
    reader = jvm_free_sink(spark, path)
    assert [e.seq for e in reader.ledger(P)] == [0, 1, 2]  # read through the epoch commit
    assert reader.acquire(P).epoch == 3
    assert stored(path) == (3, 3)
    assert commit(spark, reader, 3, 3).seq == 3
    with pytest.raises(FencedError):
        commit(spark, older, 1, 3)
    assert Counter(r["offset"] for r in delta_rows(path)) == {0: 1, 1: 1, 2: 1, 3: 1}


def _tasks_of_group(spark: SparkSession, group: str) -> list[int]:
    """The tasks of each Spark job started under job group ``group``, job by job."""
    tracker = spark.sparkContext.statusTracker()
    tasks = []
    for job in sorted(tracker.getJobIdsForGroup(group)):
        info = tracker.getJobInfo(job)
        assert info is not None
        stages = [tracker.getStageInfo(s) for s in info.stageIds]
        tasks.append(sum(s.numTasks for s in stages if s is not None))
    return tasks


def test_a_txn_write_replays_the_log_in_few_partitions(spark: SparkSession, tmp_path: Path) -> None:
    """Delta's writer replays the table's state on every txnAppId write, in 50 partitions
    unless the session says otherwise (measured on Connect, whose servers here set nothing:
    jobs of 52 and 53 tasks, 16-25 s per batch); the adapter's write runs it in a number
    sized to the log (2 for this small one), and keeps a number the session sets itself."""
    path = tmp_path / "t"
    sink = jvm_free_sink(spark, path)
    table = sink.table
    assert isinstance(table, ConnectDeltaTable)
    df = spark.createDataFrame([(0, 1, "k", 1)], SCHEMA)
    sc = spark.sparkContext
    # The test session has a number (build_session sets one); a Connect server has none.
    own_conf = spark.conf.get("spark.databricks.delta.snapshotPartitions", None)
    spark.conf.unset("spark.databricks.delta.snapshotPartitions")
    try:
        sc.setJobGroup("sparkonce-write-1", "a txn write")
        table.write(df, "app", 1, "{}")
        sc.setJobGroup("sparkonce-write-2", "a second txn write")
        table.write(df, "app", 2, "{}")
        # The write's own number was set for the write only.
        assert spark.conf.get("spark.databricks.delta.snapshotPartitions", None) is None
        spark.conf.set("spark.databricks.delta.snapshotPartitions", "7")
        sc.setJobGroup("sparkonce-write-3", "a txn write, the session's own number")
        table.write(df, "app", 3, "{}")
        assert spark.conf.get("spark.databricks.delta.snapshotPartitions") == "7"
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
        spark.conf.unset("spark.databricks.delta.snapshotPartitions")
        if own_conf is not None:
            spark.conf.set("spark.databricks.delta.snapshotPartitions", own_conf)
    for group in ("sparkonce-write-1", "sparkonce-write-2"):
        tasks = _tasks_of_group(spark, group)
        assert tasks and max(tasks) <= 10, (group, tasks)  # Delta's default: 50 and more
    own = _tasks_of_group(spark, "sparkonce-write-3")
    assert 7 <= max(own) < 50, own
    assert stored_txn(path, "app") == 3


def stored_txn(path: Path, app: str) -> int | None:
    """``app``'s newest ``txn`` version in the table's JSON commits."""
    found = None
    for commit_file in sorted((path / "_delta_log").glob("*.json")):
        for line in commit_file.read_text().splitlines():
            txn = json.loads(line).get("txn")
            if txn and txn["appId"] == app:
                found = int(txn["version"])
    return found
