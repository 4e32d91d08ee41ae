"""No-data batches: Spark runs a batch with no new input when the watermark moved or a
state timeout is due, and that batch can emit rows (windows that just closed, timeouts).

Spark writes the *same* source offset for such a batch as for the batch before. It must be
committed as a new batch (not skipped as a replay of the one before), and committed once.
Every sink family is covered. The expected rows are computed here, in plain Python from the
input, never from a sparkonce or Spark run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from tests.conftest import FAMILY_SINKS
from tests.spark.test_pipeline import forget_commit

from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url
from sparkonce.offsets import check_chain
from sparkonce.sinks.inspect import inspector_for
from sparkonce.spark.checkpoint import Checkpoint

RECORDS = 600  # event times 0..599 s after BASE, one partition, so no record is late
LIMIT = 150  # 4 data batches, then the no-data batch that closes the last windows
BASE = 1_700_000_040  # a whole minute
WINDOW_S = 60


def make_event_log(root: Path, records: int = RECORDS, keys: int = 1) -> Path:
    """One partition; record i has value ``BASE + i`` (its event time) and key k(i % keys)."""
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, "events", 1, exist_ok=True)
    with topic, IdempotentProducer(topic, "events-producer") as producer:
        for i in range(records):
            producer.send(str(BASE + i).encode(), f"k{i % keys}".encode())
    return root


def windows(df: DataFrame) -> DataFrame:
    """Per-minute counts, emitted once a window closes (append mode, watermark 0 s)."""
    ts = F.timestamp_seconds(F.col("value").cast("string").cast("long"))
    counted = (
        df.select(ts.alias("ts"))
        .withWatermark("ts", "0 seconds")
        .groupBy(F.window("ts", f"{WINDOW_S} seconds"))
        .count()
    )
    return counted.select(
        F.col("window.start").cast("long").alias("start"), F.col("count").alias("n")
    )


def windows_as_records(df: DataFrame) -> DataFrame:
    """The same windows as Kafka records (the sink writes key and value)."""
    w = windows(df)
    return w.select(
        F.col("start").cast("string").alias("key"),
        F.concat_ws(":", F.col("start").cast("string"), F.col("n").cast("string")).alias("value"),
    )


def expected_windows(records: int = RECORDS) -> Counter[tuple[int, int]]:
    """Windows whose end is at or below the final watermark (the largest event time)."""
    last = BASE + records - 1
    counts: Counter[int] = Counter()
    for i in range(records):
        t = BASE + i
        counts[t - t % WINDOW_S] += 1
    return Counter({(s, n): 1 for s, n in counts.items() if s + WINDOW_S <= last})


def _rows_as_windows(rows: list[dict[str, Any]]) -> Counter[tuple[int, int]]:
    out: Counter[tuple[int, int]] = Counter()
    for r in rows:
        if "value" in r:  # a Kafka record "start:n"
            start, n = str(r["value"]).split(":")
            out[(int(start), int(n))] += 1
        else:
            out[(int(r["start"]), int(r["n"]))] += 1
    return out


def _read(sink: Any, pipeline: str) -> tuple[list[dict[str, Any]], list[Any]]:
    sink.open()
    try:
        return inspector_for(sink).rows(), sink.ledger(pipeline)
    finally:
        sink.close()


@pytest.mark.parametrize("family_sink", FAMILY_SINKS, indirect=True)
def test_windows_closed_by_a_no_data_batch_reach_every_sink_family(
    spark: SparkSession, tmp_path: Path, family_sink: Callable[[str], Any]
) -> None:
    log_dir = make_event_log(tmp_path / "log")
    kafka = family_sink.family == "kafka"  # type: ignore[attr-defined]
    p = Pipeline(
        name="windows",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=LIMIT),
        transform=windows_as_records if kafka else windows,
        sink=family_sink("windows"),
        checkpoint=tmp_path / "chk",
        output_mode="append",
    )
    report = p.run(spark, timeout=300)
    rows, entries = _read(p.sink, p.name)
    want = expected_windows()
    assert len(want) == RECORDS // WINDOW_S - 1  # the last window never closes
    assert _rows_as_windows(rows) == want
    # Four data batches, then the no-data batch: empty ranges at the end, rows committed.
    assert report.batches_skipped == 0, report
    last = entries[-1]
    assert last.ranges.empty and last.ranges.ends() == {("events", 0): RECORDS}
    assert last.row_count > 0
    assert sum(e.row_count for e in entries) == len(want)
    assert check_chain(e.ranges for e in entries) == []

    # A second run over the same checkpoint finds nothing new and changes nothing.
    again = p.run(spark, timeout=300)
    assert again.batches_committed == 0
    assert _rows_as_windows(_read(p.sink, p.name)[0]) == want


def _sqlite_pipeline(
    tmp_path: Path, log_dir: Path, name: str, transform: Any, table: str
) -> Pipeline:
    """An append-mode pipeline over the event log into a SQLite table."""
    return Pipeline(
        name=name,
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=LIMIT),
        transform=transform,
        sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", table),
        checkpoint=tmp_path / "chk",
        output_mode="append",
    )


def test_replayed_no_data_batch_commits_once(spark: SparkSession, tmp_path: Path) -> None:
    """Spark forgets the no-data batch's commit (a crash after the sink's commit): the
    replay of the same no-data batch is skipped, and its rows are in the sink once."""
    p = _sqlite_pipeline(tmp_path, make_event_log(tmp_path / "log"), "windows", windows, "windows")
    p.run(spark, timeout=300)
    forget_commit(tmp_path / "chk", max(Checkpoint(tmp_path / "chk").batch_ids("commits")))
    report = p.run(spark, timeout=300)
    assert report.batches_skipped == 1 and report.batches_committed == 0, report
    assert "no-data batch already committed" in report.batches[0].result.reason
    rows, entries = _read(p.sink, p.name)
    assert _rows_as_windows(rows) == expected_windows()
    assert sum(1 for e in entries if e.ranges.empty) == 1


def _timeouts(df: DataFrame) -> DataFrame:
    """applyInPandasWithState: count per key; emit the count when the key's timeout fires.

    Every key's timeout is the same event time, 590 s after BASE, which only the final
    watermark (599 s) passes: the timeouts fire in the no-data batch after the last data.
    """
    import pandas as pd
    from pyspark.sql.streaming.state import GroupStateTimeout

    def count_until_timeout(key: tuple[Any, ...], pdfs: Any, state: Any) -> Any:
        if state.hasTimedOut:
            (n,) = state.get
            state.remove()
            yield pd.DataFrame({"key": [key[0]], "n": [n]})
            return
        n = state.get[0] if state.exists else 0
        for pdf in pdfs:
            n += len(pdf)
        state.update((n,))
        state.setTimeoutTimestamp((BASE + 590) * 1000)

    ts = F.timestamp_seconds(F.col("value").cast("string").cast("long"))
    return (
        df.select(F.col("key").cast("string").alias("key"), ts.alias("ts"))
        .withWatermark("ts", "0 seconds")
        .groupBy("key")
        .applyInPandasWithState(
            count_until_timeout,
            "key string, n long",
            "n long",
            "append",
            GroupStateTimeout.EventTimeTimeout,
        )
    )


def test_state_timeouts_that_fire_in_a_no_data_batch_are_committed(
    spark: SparkSession, tmp_path: Path
) -> None:
    log_dir = make_event_log(tmp_path / "log", keys=3)
    p = _sqlite_pipeline(tmp_path, log_dir, "timeouts", _timeouts, "finals")
    p.run(spark, timeout=300)
    rows, entries = _read(p.sink, p.name)
    want = Counter(f"k{i % 3}" for i in range(RECORDS))
    assert {r["key"]: r["n"] for r in rows} == dict(want)
    assert len(rows) == 3
    assert entries[-1].ranges.empty and entries[-1].row_count == 3


def _deduped(df: DataFrame) -> DataFrame:
    """Each value once within the watermark: its no-data batch only evicts state."""
    ts = F.timestamp_seconds(F.col("value").cast("string").cast("long"))
    return (
        df.select(F.col("value").cast("string").alias("v"), ts.alias("ts"))
        .withWatermark("ts", "0 seconds")
        .dropDuplicatesWithinWatermark(["v"])
    )


def test_a_no_data_batch_with_no_rows_is_not_counted_as_a_replay(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The watermark moves after the last data batch, so Spark runs a no-data batch that
    evicts the dedup state and emits nothing: it commits nothing, and the run's counts and
    summary say so, not "skipped 1 replayed batches"."""
    log_dir = make_event_log(tmp_path / "log")
    p = _sqlite_pipeline(tmp_path, log_dir, "nodata", _deduped, "deduped")
    report = p.run(spark, timeout=300)
    empty = [b for b in report.batches if b.ranges.empty]
    assert empty and all(b.result.skipped for b in empty), report.batches
    assert report.batches_skipped == 0, report
    assert all(b.result.empty for b in empty) and report.batches_empty == len(empty), report
    from sparkonce.cli.run import summary

    assert report.rows_committed == RECORDS
    line = summary(report)
    assert "skipped 0 replayed batches" in line, line
    assert f"{len(empty)} no-data batches with no rows to commit" in line, line
    rows, entries = _read(p.sink, p.name)
    assert len(rows) == RECORDS and not any(e.ranges.empty for e in entries)


def test_a_restart_after_the_last_data_batch_runs_its_no_data_batch(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The first run stops right after Spark recorded the last data batch's commit, before
    it planned the no-data batch (no-data batches off: as a driver killed in that gap
    leaves the checkpoint). The restart has no new input, yet must release the window the
    last watermark closed: the last data batch runs again (skipped by the ledger) and the
    no-data batch after it commits that window."""
    p = _sqlite_pipeline(tmp_path, make_event_log(tmp_path / "log"), "windows", windows, "windows")
    key = "spark.sql.streaming.noDataMicroBatches.enabled"
    spark.conf.set(key, "false")
    try:
        first = p.run(spark, timeout=300)
    finally:
        spark.conf.set(key, "true")
    want = expected_windows()
    got = _rows_as_windows(_read(p.sink, p.name)[0])
    assert first.batches_committed == RECORDS // LIMIT and got != want
    # The windows the last data batch's watermark closed are missing, no others.
    before = expected_windows(RECORDS - LIMIT)
    assert got == before and len(want) - len(before) == 2

    report = p.run(spark, timeout=300)
    assert (report.batches_skipped, report.batches_committed) == (1, 1), report
    rows, entries = _read(p.sink, p.name)
    assert _rows_as_windows(rows) == want
    assert entries[-1].ranges.empty and entries[-1].row_count == 2
    assert check_chain(e.ranges for e in entries) == []
    # Nothing is pending any more: a third run changes nothing and runs nothing again.
    third = p.run(spark, timeout=300)
    assert (third.batches_skipped, third.batches_committed) == (0, 0), third
