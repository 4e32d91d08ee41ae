"""SparkSource: the user's own streaming DataFrame as a pipeline's source, on the shared
local[2] session, against real SQLite (read back with sqlite3) and PostgreSQL (read back with
psycopg) and a real Kafka broker.

The oracle is always computed here in plain Python from the input the test wrote (files'
lines, produced records), never from what the source or the sink reports.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import (
    CheckpointLostError,
    ConfigError,
    KafkaSource,
    Pipeline,
    SparkSource,
    sink_from_url,
)
from sparkonce.offsets import BatchRanges, OffsetRange, check_chain
from sparkonce.sources.spark_query import Relation, classify
from tests.kafka.test_source import forget_commit, numbered, produce

# -- without Spark -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "options", "message"),
    [
        ("rate", {"rowsPerSecond": "5"}, "rate source is not replayable"),
        ("socket", {"host": "h"}, "cannot replay"),
        ("kafka", {"subscribe": "a,b"}, "one topic"),
        ("kafka", {"subscribePattern": "a.*"}, "subscribepattern"),
        ("kafka", {"subscribe": "a", "failOnDataLoss": "false"}, "failOnDataLoss=false"),
        ("delta", {"path": "/t", "ignoreChanges": "true"}, "duplicates"),
    ],
)
def test_reads_whose_offsets_do_not_replay_are_refused(
    fmt: str, options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        classify(fmt, fmt, options)


def test_each_kind_maps_its_offset_log_line_to_ranges(tmp_path: Path) -> None:
    """The lines Spark 4.x wrote in probes (files, rate-micro-batch, Kafka): one position per
    batch, start from the line before."""
    files = unbuilt()
    files.relation = Relation("files", "/in")
    topic = "spark:files:/in"
    assert files.batch_ranges(None, '{"logOffset":0}') == BatchRanges(
        (OffsetRange(topic, 0, 0, 1),)
    )
    assert files.batch_ranges('{"logOffset":0}', '{"logOffset":2}').ranges[0].count == 2
    assert files.batch_ranges('{"logOffset":2}', '{"logOffset":2}').empty
    rmb = unbuilt()
    # An option Spark's rate-micro-batch does not have (it was read as the first batch's
    # start, which made a false "offsets went back" once it was above the first batch's end).
    rmb.relation = Relation("rate-micro-batch", "rate-micro-batch", {"startingoffset": "70"})
    assert rmb.batch_ranges(None, '{"offset":12,"timestamp":1000}').ranges[0] == OffsetRange(
        "spark:rate-micro-batch:rate-micro-batch", 0, 0, 12
    )
    kafka = unbuilt()
    kafka.relation = Relation("kafka", "ev")
    got = kafka.batch_ranges('{"ev":{"0":2,"1":4}}', '{"ev":{"0":10,"1":4}}')
    assert got == BatchRanges((OffsetRange("ev", 0, 2, 10), OffsetRange("ev", 1, 4, 4)))
    # explain's notes: the connector's default isolation delivers aborted records; files'
    # replay holds only under a condition.
    note = kafka.read_note()
    assert note is not None and "read_uncommitted" in note and kafka.replay_condition() is None
    kafka.relation = Relation("kafka", "ev", {"kafka.isolation.level": "read_committed"})
    assert kafka.read_note() is None
    assert files.read_note() is None and "maxFileAge" in (files.replay_condition() or "")
    with pytest.raises(ConfigError, match="not been built"):
        unbuilt().batch_ranges(None, '{"logOffset":0}')


def unbuilt() -> SparkSource:
    """A SparkSource whose function was never called (its relation is set by hand)."""
    return SparkSource(lambda spark: spark.readStream.load())


def test_a_spark_source_is_refused_among_several_sources(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="a whole query of the user's own"):
        Pipeline(
            "p",
            sources={
                "a": unbuilt(),
                "b": KafkaSource("127.0.0.1:9", "b"),
            },
            sink=sink_from_url(f"sqlite:///{tmp_path / 's.db'}", "out"),
            checkpoint=tmp_path / "c",
        )


# -- files into SQLite -------------------------------------------------------------------------


def write_file(directory: Path, name: str, values: range) -> None:
    """Write a file whole elsewhere and move it in (the file source's condition)."""
    tmp = directory.parent / f".{name}"
    tmp.write_text("".join(json.dumps({"id": i, "k": f"k{i % 3}"}) + "\n" for i in values))
    tmp.rename(directory / name)


def sqlite_ids(db: Path, table: str = "out") -> list[int]:
    with sqlite3.connect(db) as conn:
        return sorted(r[0] for r in conn.execute(f"SELECT id FROM {table}"))


def files_pipeline(
    tmp_path: Path, query: Any, *, checkpoint: str = "chk", name: str = "files"
) -> Pipeline:
    return Pipeline(
        name=name,
        source=SparkSource(query),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
        checkpoint=tmp_path / checkpoint,
        transform=lambda df: df.select("id", "k", (F.col("id") * 10).alias("tenfold")),
    )


def read_files(directory: Path) -> Callable[[SparkSession], DataFrame]:
    def build(spark: SparkSession) -> DataFrame:
        return (
            spark.readStream.schema("id long, k string")
            .option("maxFilesPerTrigger", 1)
            .json(str(directory))
        )

    return build


def test_files_into_sqlite_through_a_replay_each_row_once(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Three files, one per batch; Spark then forgets its last commit (a crash before its
    commit log), so the rerun replays that batch: the sink skips it, two new files follow,
    and the table read with sqlite3 holds the oracle's rows once each."""
    inbox = tmp_path / "in"
    inbox.mkdir()
    oracle: list[int] = []
    for n in range(3):
        write_file(inbox, f"f{n}.json", range(n * 10, n * 10 + 7))
        oracle += list(range(n * 10, n * 10 + 7))
    first = files_pipeline(tmp_path, read_files(inbox)).run(spark)
    assert first.batches_committed == 3 and first.rows_committed == 21, first
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)

    forget_commit(tmp_path / "chk", 2)
    for n in (3, 4):
        write_file(inbox, f"f{n}.json", range(n * 10, n * 10 + 5))
        oracle += list(range(n * 10, n * 10 + 5))
    again = files_pipeline(tmp_path, read_files(inbox)).run(spark)
    assert again.batches_skipped == 1 and again.rows_committed == 10, again
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)
    p = files_pipeline(tmp_path, read_files(inbox))
    p.sink.open()
    try:
        entries = p.sink.ledger(p.name)
    finally:
        p.sink.close()
    assert [str(e.ranges) for e in entries] == [
        f"spark:files:{inbox}[0]:{n}..{n + 1}" for n in range(5)
    ]
    assert not check_chain(e.ranges for e in entries)

    # The checkpoint is lost: a file source cannot start at the ledger's end, so the run is
    # refused before the epoch, with one line naming the source; nothing is read again.
    with pytest.raises(CheckpointLostError, match=r"SparkSource\(files directory .*cannot start"):
        files_pipeline(tmp_path, read_files(inbox), checkpoint="chk-new").run(spark)
    assert sqlite_ids(tmp_path / "sink.db") == sorted(oracle)
    assert not (tmp_path / "chk-new" / "offsets").exists()


def test_explain_flags_the_file_source_condition_and_rate_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    inbox = tmp_path / "in"
    inbox.mkdir()
    explained = files_pipeline(tmp_path, read_files(inbox)).explain(spark)
    flagged = [p for p in explained.parts if p.part == "source replay"]
    assert len(flagged) == 1, explained.parts
    assert "rewritten, appended to or deleted" in flagged[0].why
    assert "maxFileAge" in flagged[0].why

    rmb = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 5).load()
    plain = Pipeline(
        "rmb",
        source=SparkSource(rmb),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
        checkpoint=tmp_path / "chk",
    )
    parts = plain.explain(spark).parts
    assert parts[0].verdict == "replayable input" and parts[0].part == "source", parts
    assert not [p for p in parts if "replay" in p.part]

    rate = spark.readStream.format("rate").option("rowsPerSecond", 5).load()
    with pytest.raises(ConfigError, match=r"rate source is not replayable.*rate-micro-batch"):
        SparkSource(rate)
    two = rmb.unionByName(
        spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 2).load()
    )
    with pytest.raises(ConfigError, match="exactly one streaming relation, it reads 2"):
        SparkSource(two)
    with pytest.raises(ConfigError, match="not streaming"):
        SparkSource(spark.range(3))


def test_rate_micro_batch_replays_the_same_rows(spark: SparkSession, tmp_path: Path) -> None:
    """rate-micro-batch as a DataFrame handed over: a run stopped after 3 or more batches of
    4 rows, its last batch then forgotten by Spark, and a second run stopped after the replay
    and one or more new batches: the replay is skipped, and the values 0..4n-1 of the n
    batches are in the table once each."""
    import threading

    from sparkonce import RunStopped

    def run(batches: int) -> list[Any]:
        df = spark.readStream.format("rate-micro-batch").option("rowsPerBatch", 4).load()
        p = Pipeline(
            name="rmb",
            source=SparkSource(df),
            sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
            checkpoint=tmp_path / "chk",
            transform=lambda d: d.select(F.col("value").alias("id")),
            trigger="processingTime=0 seconds",
        )
        seen: list[Any] = []
        stop = threading.Event()

        def each(report: Any) -> None:
            seen.append(report)
            if len(seen) >= batches:
                stop.set()  # the run stops between commits: no batch is cut short

        with pytest.raises(RunStopped):
            p.run(spark, timeout=300, on_batch=each, stop=stop)
        return seen

    first = run(3)  # a batch may commit while the stop is being noticed: 3 or more
    assert len(first) >= 3 and not any(r.result.skipped for r in first), first
    done = sorted(int(f.name) for f in (tmp_path / "chk" / "commits").iterdir() if f.name.isdigit())
    last = len(first) - 1  # the last batch the sink committed
    # A run stopped right after a sink commit may not have written Spark's commit of it yet.
    assert done in (list(range(last + 1)), list(range(last))), (done, last)
    # The state a crash after batch last's ledger commit leaves: Spark has not recorded
    # its commit, nor planned the next batch (a stopped run may have planned one).
    for f in (tmp_path / "chk" / "offsets").iterdir():
        if (
            f.name.lstrip(".").split(".")[0].isdigit()
            and int(f.name.lstrip(".").split(".")[0]) > last
        ):
            f.unlink()
    if last in done:
        forget_commit(tmp_path / "chk", last)
    again = run(2)
    assert (again[0].spark_batch_id, again[0].result.skipped) == (last, True), again
    assert len(again) >= 2 and not any(r.result.skipped for r in again[1:]), again
    batches = len(first) + len(again) - 1
    assert sqlite_ids(tmp_path / "sink.db") == list(range(4 * batches))


# -- a user-built Kafka connector DataFrame into PostgreSQL ------------------------------------


def kafka_reader(bootstrap: str, topic: str) -> Callable[[SparkSession], DataFrame]:
    def build(spark: SparkSession) -> DataFrame:
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("kafka.isolation.level", "read_committed")
            .option("maxOffsetsPerTrigger", 40)
            .load()
        )

    return build


def pg_numbers(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return sorted(r[0] for r in conn.execute("SELECT n FROM out").fetchall())


def test_kafka_connector_query_into_postgres_replay_and_lost_checkpoint(
    spark: SparkSession,
    tmp_path: Path,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    pg_url: str,
) -> None:
    topic = kafka_topic("sq", partitions=3)
    produce(kafka_broker.bootstrap, topic, numbered(90))
    build = kafka_reader(kafka_broker.bootstrap, topic)

    def pipeline(query: Any, checkpoint: str = "chk") -> Pipeline:
        return Pipeline(
            name="kq",
            source=SparkSource(query),
            sink=sink_from_url(pg_url, "out"),
            checkpoint=tmp_path / checkpoint,
            transform=lambda df: df.select(F.col("value").cast("string").cast("long").alias("n")),
        )

    first = pipeline(build(spark)).run(spark)  # the DataFrame route
    assert first.rows_committed == 90 and first.batches_committed >= 3, first
    assert pg_numbers(pg_url) == list(range(90))

    last = max(int(f.name) for f in (tmp_path / "chk" / "commits").iterdir() if f.name.isdigit())
    forget_commit(tmp_path / "chk", last)
    produce(kafka_broker.bootstrap, topic, numbered(120, start=90))
    again = pipeline(build(spark)).run(spark)
    assert again.batches_skipped == 1 and again.rows_committed == 30, again
    assert pg_numbers(pg_url) == list(range(120))

    # A lost checkpoint: the DataFrame built by hand cannot restart at an offset...
    produce(kafka_broker.bootstrap, topic, numbered(150, start=120))
    with pytest.raises(CheckpointLostError, match="built by hand cannot be restarted"):
        pipeline(build(spark), checkpoint="chk2").run(spark)
    # ...the function can: it starts at the ledger's end, and nothing is read twice.
    third = pipeline(build, checkpoint="chk2").run(spark)
    assert third.resumed_from == "ledger" and third.rows_committed == 30, third
    assert pg_numbers(pg_url) == list(range(150))


# -- a Delta read the user wrote -----------------------------------------------------------------


@pytest.mark.campaign_lane  # three pipeline runs on a real Delta table (40 s beside a helper)
def test_delta_query_resumes_a_lost_checkpoint_at_the_ledgers_version(
    spark: SparkSession, tmp_path: Path
) -> None:
    """The user's ``format("delta").load(path)`` as a function: batches are DeltaSource's
    positions; after a lost checkpoint the function's read starts at the ledger's version
    (startingVersion), so the output read with sqlite3 holds each id once; the same read
    handed over as a DataFrame is refused instead."""
    from sparkonce.sources.delta import VERSION_SPAN
    from tests.delta.test_source import append_versions

    table = tmp_path / "bronze"
    expected = append_versions(spark, table, range(2))

    def bronze(session: SparkSession) -> DataFrame:
        return session.readStream.format("delta").option("maxFilesPerTrigger", 3).load(str(table))

    def pipeline(query: Any, checkpoint: str) -> Pipeline:
        return Pipeline(
            name="dq",
            source=SparkSource(query),
            sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
            checkpoint=tmp_path / checkpoint,
            transform=lambda df: df.select("id", "k"),
        )

    first = pipeline(bronze, "chk").run(spark)
    assert first.rows_committed == len(expected), first
    p = pipeline(bronze, "chk")
    p.sink.open()
    try:
        ends = p.sink.end_offsets(p.name)
    finally:
        p.sink.close()
    ((topic, _), end) = next(iter(ends.items()))
    assert topic.startswith("delta:") and end % VERSION_SPAN == 0, ends

    expected += append_versions(spark, table, range(2, 4))
    with pytest.raises(CheckpointLostError, match="built by hand cannot be restarted"):
        pipeline(bronze(spark), "chk-lost").run(spark)
    again = pipeline(bronze, "chk-lost").run(spark)
    assert again.resumed_from == "ledger", again
    assert sqlite_ids(tmp_path / "sink.db") == sorted(expected)
