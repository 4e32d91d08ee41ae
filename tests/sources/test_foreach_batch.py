"""sparkonce.foreach_batch: the user's own ``writeStream.foreachBatch`` query keeps its read,
trigger and checkpoint; only the function is sparkonce's. On the shared local[2] session,
against real SQLite (read back with sqlite3) and PostgreSQL (read back with psycopg) and a
real Kafka broker.

The oracle is always computed here in plain Python from the input the test wrote (files'
lines, produced records), never from what sparkonce reports.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from sparkonce import (
    CheckpointError,
    CheckpointLostError,
    ConfigError,
    FencedError,
    foreach_batch,
    sink_from_url,
)
from sparkonce.offsets import BatchRanges, OffsetRange, check_chain
from sparkonce.pipeline.foreach_batch import ForeachBatch
from sparkonce.sinks.base import Sink
from sparkonce.sources.delta import VERSION_SPAN
from sparkonce.sources.spark_query import SparkSource
from tests.kafka.test_source import forget_commit, numbered, produce
from tests.sources.test_spark_source import pg_numbers, sqlite_ids, write_file

# -- without Spark -----------------------------------------------------------------------------


def running(fmt: str, **options: str) -> SparkSource:
    """The source of a running query that reads ``fmt`` (its plan's one leaf, by hand)."""
    return SparkSource.of_running_query([(fmt, fmt, options)])


def test_a_new_checkpoint_must_start_at_the_ledgers_end_else_the_option_is_printed() -> None:
    """A running query's new checkpoint against a ledger that is not empty: accepted when
    its batch 0 starts where the ledger ends; otherwise one CheckpointLostError line that
    prints the reader option in the form the kind takes (a file or rate-micro-batch read
    has none)."""
    kafka = running("kafka", subscribe="ev")
    end = {("ev", 0): 5, ("ev", 1): 7}
    kafka.first_batch = BatchRanges((OffsetRange("ev", 0, 5, 9), OffsetRange("ev", 1, 7, 7)))
    kafka.check_ledger_start(end)  # started at the ledger's end: accepted
    kafka.first_batch = BatchRanges((OffsetRange("ev", 0, 0, 9), OffsetRange("ev", 1, 0, 7)))
    with pytest.raises(CheckpointLostError) as lost:
        kafka.check_ledger_start(end)
    text = str(lost.value)
    assert "Nothing was written (no epoch was taken)" in text and "\n" not in text
    shown = re.search(r"startingOffsets', '(\{.*\})'", text)
    assert shown is not None and json.loads(shown[1]) == {"ev": {"0": 5, "1": 7}}, text
    # A partition the ledger never saw starts at 0; one the batch lacks is not the ledger's end.
    kafka.first_batch = BatchRanges((OffsetRange("ev", 0, 5, 9), OffsetRange("ev", 2, 0, 1)))
    with pytest.raises(CheckpointLostError):
        kafka.check_ledger_start(end)
    kafka.first_batch = BatchRanges((*kafka.first_batch.ranges, OffsetRange("ev", 1, 7, 8)))
    kafka.check_ledger_start(end)
    with pytest.raises(CheckpointLostError, match=r"topic\(s\) \['other'\]"):
        kafka.check_ledger_start({("other", 0): 3})

    delta = running("delta", path="/t")
    table = "delta:0f00"
    delta.first_batch = BatchRanges((OffsetRange(table, 0, 0, 2 * VERSION_SPAN),))
    with pytest.raises(CheckpointLostError, match=r"option\('startingVersion', 3\)"):
        delta.check_ledger_start({(table, 0): 3 * VERSION_SPAN})
    with pytest.raises(CheckpointLostError, match="inside version 3"):  # DeltaSource's rule
        delta.check_ledger_start({(table, 0): 3 * VERSION_SPAN + 1})

    for fmt, kind in (("json", "files"), ("rate-micro-batch", "rate-micro-batch")):
        other = running(fmt, path="/in")
        topic = other.topic
        other.first_batch = BatchRanges((OffsetRange(topic, 0, 0, 1),))
        with pytest.raises(CheckpointLostError, match=f"a {kind} read cannot start there"):
            other.check_ledger_start({(topic, 0): 4})
        assert other.restart_option({(topic, 0): 4}) is None


def test_refusals_before_any_query() -> None:
    with pytest.raises(ConfigError, match="rate source is not replayable"):  # SparkSource's line
        running("rate", rowsPerSecond="5")
    with pytest.raises(ConfigError, match="must be a sparkonce Sink"):
        foreach_batch(object(), name="p", checkpoint="/tmp/c")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="pipeline name"):
        foreach_batch(sink_from_url("sqlite:///x.db", "out"), name="", checkpoint="/tmp/c")


# -- a file query into SQLite ------------------------------------------------------------------


def start(
    df: DataFrame, write: Callable[[DataFrame, int], None], checkpoint: Path, **trigger: Any
) -> StreamingQuery:
    """The user's own writeStream, as written before sparkonce: only ``write`` is new."""
    return (
        df.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .trigger(**(trigger or {"availableNow": True}))
        .start()
    )


def run(df: DataFrame, write: ForeachBatch, checkpoint: Path) -> BaseException | None:
    """Run the query to its end; the error it failed with (as sparkonce raised it), if any."""
    query = start(df, write, checkpoint)
    try:
        query.awaitTermination()
    except StreamingQueryException:
        assert write.error is not None
        return write.error
    finally:
        write.close()
    return None


def owner_epoch(sink: Sink, name: str) -> int | None:
    sink.open()
    try:
        owner = sink.owner(name)
        return None if owner is None else owner.epoch
    finally:
        sink.close()


def test_files_query_into_sqlite_replay_reset_and_wrong_checkpoint(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three files, one per batch; Spark then forgets its last commit (a crash between the
    sink's commit and Spark's commit log), so the rerun replays that batch: skipped, two
    new files follow, and the table read with sqlite3 holds the oracle's ids once each. A
    reset checkpoint and a checkpoint that is another query's are refused before the epoch:
    nothing is written."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    db = f"sqlite:///{tmp_path / 'sink.db'}"
    oracle: list[int] = []
    for n in range(3):
        write_file(inbox, f"f{n}.json", range(n * 10, n * 10 + 7))
        oracle += range(n * 10, n * 10 + 7)

    def query() -> DataFrame:  # the user's own read, unchanged
        df = spark.readStream.schema("id long, k string").option("maxFilesPerTrigger", 1)
        return df.json(str(inbox)).select("id", "k", (F.col("id") * 10).alias("tenfold"))

    def write(checkpoint: str = "chk", name: str = "files") -> ForeachBatch:
        return foreach_batch(sink_from_url(db, "out"), name=name, checkpoint=tmp_path / checkpoint)

    first = write()
    assert run(query(), first, tmp_path / "chk") is None, first.error
    assert first.report is not None
    assert (first.report.resumed_from, first.report.batches_committed) == ("start", 3)
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)

    forget_commit(tmp_path / "chk", 2)
    for n in (3, 4):
        write_file(inbox, f"f{n}.json", range(n * 10, n * 10 + 5))
        oracle += range(n * 10, n * 10 + 5)
    again = write()
    assert run(query(), again, tmp_path / "chk") is None, again.error
    assert again.report is not None
    assert (again.report.batches_skipped, again.report.batches_committed) == (1, 2), again.report
    assert again.report.epoch == 2
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)
    sink = sink_from_url(db, "out")
    sink.open()
    try:
        entries = sink.ledger("files")
    finally:
        sink.close()
    assert [str(e.ranges) for e in entries] == [
        f"spark:files:{inbox}[0]:{n}..{n + 1}" for n in range(5)
    ]
    assert not check_chain(e.ranges for e in entries)

    # A reset checkpoint: the file read cannot start at the ledger's end, and this route
    # cannot restart it: refused at batch 0, before the epoch; nothing is read again.
    lost = run(query(), write("chk-new"), tmp_path / "chk-new")
    assert isinstance(lost, CheckpointLostError), lost
    assert "a files read cannot start there" in str(lost) and "\n" not in str(lost)
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)
    assert owner_epoch(sink_from_url(db, "out"), "files") == 2

    # The function names one checkpoint; a query on another is refused with one line.
    wrong = run(query(), write("chk"), tmp_path / "chk-other")
    assert isinstance(wrong, CheckpointError), wrong
    assert "is not the calling query's" in str(wrong) and "\n" not in str(wrong)
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)
    assert owner_epoch(sink_from_url(db, "out"), "files") == 2

    # A query that ran with a function of its own, converted on its checkpoint: its batches
    # are not in this pipeline's ledger, so the checkpoint is ahead of it, as for a Pipeline.
    write_file(inbox, "f5.json", range(50, 53))
    ahead = run(query(), write("chk", name="converted"), tmp_path / "chk")
    assert isinstance(ahead, CheckpointError) and "beyond the ledger" in str(ahead), ahead
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)
    assert owner_epoch(sink_from_url(db, "out"), "converted") is None


def test_a_rate_query_is_refused_with_spark_sources_line(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The read's kind is checked on the running query's plan, with SparkSource's line."""
    rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    db = f"sqlite:///{tmp_path / 'sink.db'}"
    refused = run(
        rate,
        foreach_batch(sink_from_url(db, "out"), name="r", checkpoint=tmp_path / "c"),
        tmp_path / "c",
    )
    assert isinstance(refused, ConfigError), refused
    assert str(refused).startswith("SparkSource: Spark's rate source is not replayable")
    assert owner_epoch(sink_from_url(db, "out"), "r") is None


# -- a Kafka query into PostgreSQL: a zombie, and a reset checkpoint restarted -------------------


def test_kafka_query_into_postgres_zombie_fenced_and_reset_restarted_at_the_ledgers_end(
    spark: SparkSession,
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    pg_url: str,
) -> None:
    """An old query commits its batch 0 and stalls before its batch 1 (a GC pause). A new
    query on a new checkpoint reading from the earliest offsets is refused (nothing
    written, the old run still owns the pipeline); started with the startingOffsets the
    refusal printed, it resumes at the ledger's end, takes the epoch and reads the rest.
    The old query then wakes up: its batch is fenced. PostgreSQL, read with psycopg, holds
    every produced number once."""
    topic = kafka_topic("fb", partitions=2)
    produce(kafka_broker.bootstrap, topic, numbered(24, partitions=2))

    def query(starting: str = "earliest") -> DataFrame:
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_broker.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", starting)
            .option("maxOffsetsPerTrigger", 8)
            .load()
            .select(F.col("value").cast("string").cast("long").alias("n"))
        )

    def write(checkpoint: str) -> ForeachBatch:
        return foreach_batch(
            sink_from_url(pg_url, "out"), name="kq", checkpoint=tmp_path / checkpoint
        )

    old = write("old")
    stalled, wake = threading.Event(), threading.Event()

    def old_write(df: DataFrame, batch_id: int) -> None:  # the old driver, paused by a GC
        if batch_id == 1:
            stalled.set()
            wake.wait(180)
        old(df, batch_id)

    zombie = start(query(), old_write, tmp_path / "old", processingTime="0 seconds")
    try:
        assert stalled.wait(180), old.error
        committed = pg_numbers(pg_url)
        assert len(committed) == 8, committed

        lost = run(query(), write("new"), tmp_path / "new")
        assert isinstance(lost, CheckpointLostError), lost
        assert owner_epoch(sink_from_url(pg_url, "out"), "kq") == 1  # nothing written
        shown = re.search(r"startingOffsets', '(\{.*\})'", str(lost))
        assert shown is not None, lost

        new = write("restarted")
        assert run(query(shown[1]), new, tmp_path / "restarted") is None, new.error
        assert new.report is not None
        assert (new.report.resumed_from, new.report.epoch) == ("ledger", 2), new.report
        assert new.report.rows_committed == 16, new.report

        wake.set()
        with pytest.raises(StreamingQueryException):
            zombie.awaitTermination(180)
        assert isinstance(old.error, FencedError), old.error
    finally:
        wake.set()
        zombie.stop()
        old.close()
    assert pg_numbers(pg_url) == list(range(24))


# -- a Delta query: a reset checkpoint restarted with the printed startingVersion ----------------


@pytest.mark.campaign_lane  # Delta writes and three query runs
def test_delta_query_reset_checkpoint_restarted_with_the_printed_starting_version(
    spark: SparkSession, tmp_path: Path
) -> None:
    """A Delta read through the function: the table's snapshot, then a reset checkpoint whose
    batch 0 is the whole table again: refused, nothing written, the line printing Delta's
    startingVersion; the query started with it on a new checkpoint reads only the versions
    the ledger lacks. The output read with sqlite3 holds each appended id once."""
    from tests.delta.test_source import append_versions

    table = tmp_path / "bronze"
    expected = append_versions(spark, table, range(2))
    db = f"sqlite:///{tmp_path / 'sink.db'}"

    def query(**options: str) -> DataFrame:
        return spark.readStream.format("delta").options(**options).load(str(table))

    def write(checkpoint: str) -> ForeachBatch:
        return foreach_batch(sink_from_url(db, "out"), name="dq", checkpoint=tmp_path / checkpoint)

    first = write("chk")
    assert run(query().select("id", "k"), first, tmp_path / "chk") is None, first.error
    assert sqlite_ids(tmp_path / "sink.db") == sorted(expected)

    expected += append_versions(spark, table, range(2, 4))
    lost = run(query().select("id", "k"), write("reset"), tmp_path / "reset")
    assert isinstance(lost, CheckpointLostError), lost
    assert owner_epoch(sink_from_url(db, "out"), "dq") == 1  # nothing written
    shown = re.search(r"option\('startingVersion', (\d+)\)", str(lost))
    assert shown is not None, lost

    again = write("restarted")
    df = query(startingVersion=shown[1]).select("id", "k")
    assert run(df, again, tmp_path / "restarted") is None, again.error
    assert again.report is not None and again.report.resumed_from == "ledger", again.report
    assert sqlite_ids(tmp_path / "sink.db") == sorted(expected)
