"""DeltaSource against real Delta tables on the shared session: Delta -> SQLite and Delta ->
Delta, each row of the input once across a replay, a lost checkpoint, OPTIMIZE upstream; the
refusals (an update upstream, a lost checkpoint inside a version, vacuumed files).

The oracle is the input: each table version ``v`` appends ids ``v*100 .. v*100+ROWS-1`` in
``FILES`` files, so what every run must end with is computed here from the numbers. Outputs
are read with independent readers: ``sqlite3`` for SQLite, and pyarrow on the data files the
Delta log's last snapshot names for a Delta output.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import (
    CheckpointLostError,
    DeltaSink,
    DeltaSource,
    Pipeline,
    SourceError,
    SparkOnceError,
)
from sparkonce.sinks import sink_from_url
from tests.spark.test_pipeline import forget_commit

ROWS = 12  # rows per version
FILES = 3  # data files per version


def append_versions(spark: SparkSession, table: Path, versions: range) -> list[int]:
    """Append one commit per version number in ``versions``: ids v*100 .. v*100+ROWS-1."""
    ids: list[int] = []
    for v in versions:
        spark.range(v * 100, v * 100 + ROWS, numPartitions=FILES).select(
            F.col("id"), (F.col("id") % 7).alias("k")
        ).write.format("delta").mode("append").save(str(table))
        ids.extend(range(v * 100, v * 100 + ROWS))
    return ids


def keep(df: DataFrame) -> DataFrame:
    return df.select("id", "k")


def sqlite_pipeline(
    tmp_path: Path, table: Path, *, checkpoint: str = "chk", **source: Any
) -> Pipeline:
    return Pipeline(
        name="ds",
        source=DeltaSource(table, **source),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'out.db'}", "out"),
        checkpoint=tmp_path / checkpoint,
        transform=keep,
    )


def sqlite_ids(tmp_path: Path) -> list[int]:
    with sqlite3.connect(tmp_path / "out.db") as conn:
        return sorted(int(r[0]) for r in conn.execute("SELECT id FROM out"))


def delta_rows(table: Path, columns: list[str]) -> list[tuple[Any, ...]]:
    """The rows of a Delta table (``columns`` of them, duplicates kept), read without Spark:
    the log's add and remove actions give the live files, pyarrow reads them."""
    import pyarrow.parquet as pq

    live: set[str] = set()
    for commit in sorted((table / "_delta_log").glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live.add(action["add"]["path"])
            elif "remove" in action:
                live.discard(action["remove"]["path"])
    rows: list[tuple[Any, ...]] = []
    for name in live:
        data = pq.read_table(table / name, columns=columns).to_pydict()
        rows.extend(zip(*(data[c] for c in columns), strict=True))
    return rows


def delta_ids(table: Path) -> list[int]:
    """The ids in a Delta table, sorted, read without Spark (:func:`delta_rows`)."""
    return sorted(int(i) for (i,) in delta_rows(table, ["id"]))


@pytest.mark.campaign_lane  # several pipeline runs on real Delta tables (40-100 s)
def test_delta_to_sqlite_replay_new_checkpoint_and_optimize(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Every appended row once: a snapshot start split by max_files_per_batch, a replay of a
    committed batch (Spark forgot its commit), OPTIMIZE upstream (not read again), more
    versions, and a new checkpoint resuming from the ledger at a version boundary."""
    table = tmp_path / "src"
    expected = append_versions(spark, table, range(3))
    p = sqlite_pipeline(tmp_path, table, max_files_per_batch=2)
    first = p.run(spark, timeout=300)
    assert first.rows_committed == len(expected) and first.batches_committed >= 4, first
    assert sqlite_ids(tmp_path) == expected
    ledger = p.sink.ledger("ds")
    (topic,) = {r.topic for e in ledger for r in e.ranges.ranges}
    assert topic.startswith("delta:") and ledger[0].ranges.ranges[0].start == 0
    # The snapshot of version 2 ends where version 3's changes begin.
    assert ledger[-1].end_offsets == {(topic, 0): 3 * 2**32}

    forget_commit(tmp_path / "chk", max(e.spark_batch_id or 0 for e in ledger))
    second = p.run(spark, timeout=300)
    assert second.batches_skipped == 1 and second.rows_committed == 0, second
    assert sqlite_ids(tmp_path) == expected

    spark.sql(f"OPTIMIZE delta.`{table}`").collect()  # dataChange=false: nothing new
    expected += append_versions(spark, table, range(4, 6))
    third = p.run(spark, timeout=300)
    assert third.rows_committed == 2 * ROWS, third
    assert sqlite_ids(tmp_path) == expected

    # A new checkpoint: the ledger ends on a version boundary, so it resumes there.
    expected += append_versions(spark, table, range(6, 7))
    fresh = sqlite_pipeline(tmp_path, table, checkpoint="chk2", max_files_per_batch=FILES)
    fourth = fresh.run(spark, timeout=300)
    assert fourth.resumed_from == "ledger" and fourth.rows_committed == ROWS, fourth
    assert sqlite_ids(tmp_path) == expected


class _Enough(Exception):
    """Stops a run after its first batch committed (raised by on_batch)."""


def _stop_after_first(report: object) -> None:
    raise _Enough("enough")


@pytest.mark.campaign_lane  # several pipeline runs on real Delta tables (40-100 s)
def test_new_checkpoint_inside_a_version_is_refused(spark: SparkSession, tmp_path: Path) -> None:
    """A ledger ending inside a version (a batch of 2 of its 3 files) cannot resume on a new
    checkpoint: refused before the epoch, naming the source and the version; the pipeline's
    own checkpoint then finishes it, each row once."""
    table = tmp_path / "src"
    expected = append_versions(spark, table, range(2))
    p = sqlite_pipeline(tmp_path, table, starting_version=1, max_files_per_batch=2)
    with pytest.raises(SparkOnceError):
        p.run(spark, timeout=300, on_batch=_stop_after_first)
    (end,) = p.sink.end_offsets("ds").values()
    assert end == 1 * 2**32 + 2, end  # version 1, its first 2 files
    owner = p.sink.owner("ds")
    assert owner is not None

    fresh = sqlite_pipeline(tmp_path, table, checkpoint="chk2", max_files_per_batch=2)
    with pytest.raises(CheckpointLostError, match=r"DeltaSource\(delta:///.*inside version 1 "):
        fresh.run(spark, timeout=300)
    after = fresh.sink.owner("ds")
    assert after is not None and after.epoch == owner.epoch  # no epoch was taken

    rest = p.run(spark, timeout=300)
    assert rest.resumed_from == "checkpoint", rest
    assert sqlite_ids(tmp_path) == [i for i in expected if i >= 100]


@pytest.mark.campaign_lane  # several pipeline runs on real Delta tables (40-100 s)
def test_an_update_upstream_stops_the_run_unless_change_commits_are_skipped(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A DELETE upstream stops the run with a SourceError naming the source and the version,
    and commits nothing; with skip_change_commits=True the DELETE's commit is skipped (its
    rewritten rows are not delivered again, the deleted ones stay in the output) and the
    appends after it are delivered once."""
    table = tmp_path / "src"
    expected = append_versions(spark, table, range(2))
    p = sqlite_pipeline(tmp_path, table)
    assert p.run(spark, timeout=300).rows_committed == 2 * ROWS
    spark.sql(f"DELETE FROM delta.`{table}` WHERE id = 101").collect()  # version 2
    append_versions(spark, table, range(3, 4))  # version 3
    with pytest.raises(SourceError, match=r"DeltaSource\(delta:///.*version 2 of the table "):
        p.run(spark, timeout=300)
    assert sqlite_ids(tmp_path) == expected  # nothing of version 3 yet

    skipping = sqlite_pipeline(tmp_path, table, skip_change_commits=True)
    part = next(pt for pt in skipping.explain(spark).parts if pt.part == "source")
    assert part.verdict == "replayable input" and "rows are not delivered" in part.why, part
    report = skipping.run(spark, timeout=300)
    assert report.rows_committed == ROWS, report
    assert sqlite_ids(tmp_path) == sorted([*expected, *range(300, 300 + ROWS)])


@pytest.mark.campaign_lane  # several pipeline runs on real Delta tables (40-100 s)
def test_delta_to_delta_exact_across_a_replay_and_a_new_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Bronze to silver: each appended row once in the output table (read with pyarrow from
    the files its log names), through a replay and a new checkpoint."""
    bronze, silver = tmp_path / "bronze", tmp_path / "tables"
    expected = append_versions(spark, bronze, range(2))

    def make(checkpoint: str) -> Pipeline:
        return Pipeline(
            name="b2s",
            source=DeltaSource(bronze, max_files_per_batch=FILES),
            sink=DeltaSink(silver, table="silver"),
            checkpoint=tmp_path / checkpoint,
            transform=keep,
        )

    p = make("chk")
    assert p.run(spark, timeout=300).rows_committed == len(expected)
    assert delta_ids(silver / "silver") == expected
    ledger = p.sink.ledger("b2s")
    forget_commit(tmp_path / "chk", max(e.spark_batch_id or 0 for e in ledger))
    replay = p.run(spark, timeout=300)
    assert replay.batches_skipped == 1 and replay.rows_committed == 0, replay
    expected += append_versions(spark, bronze, range(2, 4))
    fresh = make("chk2").run(spark, timeout=300)
    assert fresh.resumed_from == "ledger" and fresh.rows_committed == 2 * ROWS, fresh
    assert delta_ids(silver / "silver") == expected
