"""SparkKafkaSource: Spark's own Kafka connector as a sparkonce source, against a real broker
and the shared Spark session (which has the connector's pinned jars).

The oracle is what the test produced (a plain confluent-kafka producer), never what the
source reports.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import TopicPartition as KTP
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import ConfigError, Pipeline, SparkKafkaSource, sink_from_url
from sparkonce.errors import CheckpointError, OffsetOutOfRangeError, TopicNotFoundError
from sparkonce.offsets import BatchRanges, OffsetRange, check_chain
from sparkonce.sinks.inspect import inspector_for
from sparkonce.spark.checkpoint import Checkpoint
from sparkonce.spark.jars import cached_jars
from tests.kafka.test_source import (
    forget_commit,
    numbered,
    produce,
    transactional,
    wait_for_ends,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def numbers(df: DataFrame) -> DataFrame:
    return df.select(
        "record_id",
        "partition",
        "offset",
        F.col("value").cast("string").cast("long").alias("n"),
    )


def pipeline(
    tmp_path: Path, source: SparkKafkaSource, *, checkpoint: str = "chk", name: str = "sk"
) -> Pipeline:
    return Pipeline(
        name=name,
        source=source,
        sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
        checkpoint=tmp_path / checkpoint,
        transform=numbers,
    )


def committed(p: Pipeline) -> tuple[list[dict[str, Any]], list[Any]]:
    p.sink.open()
    try:
        return inspector_for(p.sink).rows(), p.sink.ledger(p.name)
    finally:
        p.sink.close()


# --- without Spark ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "other"}, "topic argument"),
        ({"startingOffsets": "latest"}, "starting_offsets"),
        ({"failOnDataLoss": "false"}, "never be skipped"),
        ({"kafka.isolation.level": "read_uncommitted"}, "read_committed"),
        ({"maxOffsetsPerTrigger": "10"}, "max_records_per_batch"),
        ({"minPartitions": [1]}, "string, number or boolean"),
        ("minPartitions=4", "mapping"),
    ],
)
def test_options_sparkonce_sets_itself_are_refused(options: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SparkKafkaSource("127.0.0.1:9", "events", options=options)


def test_settings_and_repr_hide_secrets() -> None:
    source = SparkKafkaSource(
        "127.0.0.1:9",
        "events",
        max_records_per_batch=500,
        client_config={"sasl.password": "s3cret", "security.protocol": "SASL_PLAINTEXT"},
        options={"minPartitions": 4, "kafka.isolation.level": "read_committed"},
    )
    settings = source.connector_settings(None)
    assert settings["kafka.sasl.password"] == "s3cret"  # handed to the connector
    assert settings["startingOffsets"] == "earliest" and settings["subscribe"] == "events"
    assert settings["maxOffsetsPerTrigger"] == "500" and settings["minPartitions"] == "4"
    assert (settings["failOnDataLoss"], settings["kafka.isolation.level"]) == (
        "true",
        "read_committed",
    )
    assert "s3cret" not in repr(source) and "s3cret" not in source.describe()
    moved = source.relocated("kafka://127.0.0.1:10/other")
    assert isinstance(moved, SparkKafkaSource) and moved.topic == "other"
    assert moved.connector_options == source.connector_options
    with pytest.raises(ConfigError, match="another kind of source"):
        source.relocated("sparkonce-log:///tmp/log/events")


def test_a_kafka_sink_is_accepted_after_either_reader(tmp_path: Path) -> None:
    """KafkaSink names a task after the connector's range it reads (task_keys, tested with
    Spark below), so the connector's task numbers no longer matter and nothing is refused."""
    from sparkonce import KafkaSink, KafkaSource

    for source in (SparkKafkaSource("127.0.0.1:9", "in"), KafkaSource("127.0.0.1:9", "in")):
        p = Pipeline("p", source, KafkaSink("127.0.0.1:9", "out"), checkpoint=tmp_path / "c")
        assert isinstance(p.sink, KafkaSink)


def test_batch_ranges_from_the_offset_log_and_the_initial_offsets(tmp_path: Path) -> None:
    source = SparkKafkaSource("127.0.0.1:9", "events")
    initial = tmp_path / "sources" / "0" / "0"
    initial.parent.mkdir(parents=True)
    initial.write_bytes(b'\x00v1\n{"events":{"1":4,"0":2}}')
    first = source.initial_offset(Checkpoint(tmp_path))
    assert first is not None
    got = source.batch_ranges(first, '{"events":{"0":10,"1":4}}')
    assert got == BatchRanges((OffsetRange("events", 0, 2, 10), OffsetRange("events", 1, 4, 4)))
    # A partition added later starts at 0; a no-data batch has empty ranges.
    nxt = source.batch_ranges('{"events":{"0":10,"1":4}}', '{"events":{"0":12,"1":4,"2":3}}')
    assert [(r.partition, r.start, r.end) for r in nxt.ranges] == [
        (0, 10, 12),
        (1, 4, 4),
        (2, 0, 3),
    ]
    assert source.batch_ranges('{"events":{"0":10}}', '{"events":{"0":10}}').empty
    assert source.initial_offset(Checkpoint(tmp_path / "none")) is None
    with pytest.raises(CheckpointError, match="another source"):
        source.batch_ranges(None, '{"other":{"0":1}}')
    with pytest.raises(CheckpointError, match="besides"):
        source.batch_ranges(None, '{"events":{"0":1},"other":{"0":1}}')
    with pytest.raises(ConfigError, match="start <= end"):
        source.batch_ranges('{"events":{"0":10}}', '{"events":{"0":3}}')


def test_connector_jars_are_found_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = SparkKafkaSource("127.0.0.1:9", "t").spark_conf()["spark.jars"].split(",")
    assert any(Path(j).name.startswith("spark-sql-kafka-0-10_2.13-") for j in found)
    assert all(Path(j).is_file() for j in found)
    own = tmp_path / "jars"
    own.mkdir()
    (own / "spark-sql-kafka-0-10_2.13-9.9.jar").write_bytes(b"")
    (own / "extra.jar").write_bytes(b"")
    monkeypatch.setenv("SPARKONCE_SPARK_KAFKA_JARS", str(own))
    assert cached_jars(
        "spark-kafka", "SPARKONCE_SPARK_KAFKA_JARS", required_prefix="spark-sql-kafka"
    ) == [
        str(own / "extra.jar"),
        str(own / "spark-sql-kafka-0-10_2.13-9.9.jar"),
    ]


# --- with Spark and a real broker -----------------------------------------------------------


def test_every_record_once_through_a_replay_and_a_new_checkpoint(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("sk", partitions=3)
    produce(kafka_broker.bootstrap, topic, numbered(150), record_ids=True)
    source = SparkKafkaSource(kafka_broker.bootstrap, topic, max_records_per_batch=60)
    p = pipeline(tmp_path, source)
    first = p.run(spark)
    assert first.rows_committed == 150 and first.batches_committed >= 3, first
    rows, entries = committed(p)
    assert sorted(r["n"] for r in rows) == list(range(150))
    assert {r["record_id"] for r in rows} == {f"id-{i}" for i in range(150)}
    assert not check_chain(e.ranges for e in entries)
    assert entries[0].ranges.starts() == {(topic, q): 0 for q in range(3)}
    assert entries[-1].ranges.ends() == {(topic, q): 50 for q in range(3)}
    assert sum(e.ranges.count for e in entries) == 150

    # Spark forgets its last batch (a crash before its commit log): replayed and skipped.
    last = max(int(f.name) for f in (tmp_path / "chk" / "commits").iterdir() if f.name.isdigit())
    forget_commit(tmp_path / "chk", last)
    again = pipeline(tmp_path, source).run(spark)
    assert again.batches_skipped == 1 and again.rows_committed == 0, again

    # More input and a brand-new checkpoint: the connector starts at the ledger's end.
    produce(kafka_broker.bootstrap, topic, numbered(180, start=150))
    third = pipeline(tmp_path, source, checkpoint="chk2").run(spark)
    assert third.resumed_from == "ledger" and third.rows_committed == 30, third
    rows, entries = committed(p)
    assert sorted(r["n"] for r in rows) == list(range(180))
    assert not check_chain(e.ranges for e in entries)


def test_aborted_transactions_are_never_read(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("sk-txn", partitions=1)
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topic, [(0, None, b"%d" % i) for i in range(3)])
    tx = transactional(bootstrap)
    tx.begin_transaction()
    for i in range(3):
        tx.produce(topic, b"%d" % (100 + i), partition=0)
    assert tx.flush(30) == 0
    tx.abort_transaction(30)
    tx.begin_transaction()
    tx.produce(topic, b"3", partition=0)
    tx.commit_transaction(30)
    source = SparkKafkaSource(bootstrap, topic)
    wait_for_ends(source, lambda e: e[(topic, 0)] == 9)  # plain, aborted, marker, one, marker
    p = pipeline(tmp_path, source)
    report = p.run(spark)
    rows, entries = committed(p)
    assert sorted(r["n"] for r in rows) == [0, 1, 2, 3], rows
    assert report.rows_committed == 4 and entries[-1].ranges.ends() == {(topic, 0): 9}


def test_records_lost_to_retention_stop_the_run(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    """A range the ledger resumes from, deleted by retention before it was read."""
    topic = kafka_topic("sk-ret", partitions=1)
    produce(kafka_broker.bootstrap, topic, [(0, None, b"%d" % i) for i in range(20)])
    source = SparkKafkaSource(kafka_broker.bootstrap, topic, max_records_per_batch=10)
    p = pipeline(tmp_path, source)
    first = p.run(spark)
    assert first.rows_committed == 20
    produce(kafka_broker.bootstrap, topic, [(0, None, b"%d" % i) for i in range(20, 30)])
    admin = kafka_broker.admin()
    for future in admin.delete_records([KTP(topic, 0, 25)], request_timeout=30).values():
        future.result(30)
    # A new checkpoint resumes from the ledger (offset 20), which retention removed.
    with pytest.raises(OffsetOutOfRangeError) as info:
        pipeline(tmp_path, source, checkpoint="chk2").run(spark)
    message = str(info.value)
    assert "retention" in message and "Nothing was skipped" in message, message
    rows, _ = committed(p)
    assert sorted(r["n"] for r in rows) == list(range(20))  # nothing of 20..24 written


def test_a_missing_topic_is_refused_before_spark_reads(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any
) -> None:
    with pytest.raises(TopicNotFoundError):
        SparkKafkaSource(kafka_broker.bootstrap, "no-such-topic", timeout=5).stream(spark, None)


def test_utf8_values_are_strings_and_a_bad_record_fails_its_batch(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    from sparkonce.errors import PipelineError

    topic = kafka_topic("sk-utf8", partitions=1)
    produce(kafka_broker.bootstrap, topic, [(0, "ключ".encode(), b"%d" % i) for i in range(10)])
    source = SparkKafkaSource(kafka_broker.bootstrap, topic, value_format="utf8")

    def keys(df: DataFrame) -> DataFrame:
        return df.select("key", F.col("value").cast("long").alias("n"), "partition", "offset")

    def utf8_pipeline() -> Pipeline:
        return Pipeline(
            name="sk-utf8",
            source=source,
            sink=sink_from_url(f"sqlite:///{tmp_path / 's.db'}", "out"),
            checkpoint=tmp_path / "chk",
            transform=keys,
        )

    p = utf8_pipeline()
    assert p.run(spark).rows_committed == 10
    got = committed(p)[0]
    assert {r["key"] for r in got} == {"ключ"} and sorted(r["n"] for r in got) == list(range(10))

    produce(kafka_broker.bootstrap, topic, [(0, b"\xff\xfe", b"10")])
    with pytest.raises(PipelineError, match="INVALID_UTF8_STRING"):
        utf8_pipeline().run(spark)
    assert len(committed(p)[0]) == 10  # nothing of the bad batch was committed


def test_task_keys_name_the_kafka_range_each_task_reads(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    """The driver names each task of a batch after the connector's input range it reads. The
    oracle is the rows themselves: which Kafka partition (and first offset) each Spark
    partition holds, by spark_partition_id(); the keys come from the RDD lineage."""
    from sparkonce import KafkaSource
    from sparkonce.errors import SinkError
    from sparkonce.spark.kafka_lineage import task_keys

    topic = kafka_topic("keys", partitions=5)
    produce(kafka_broker.bootstrap, topic, numbered(500, partitions=5))
    seen: dict[str, Any] = {}

    def held(df: DataFrame) -> list[tuple[int, int, int]]:
        rows = (
            df.groupBy(F.spark_partition_id().alias("pid"), "partition")
            .agg(F.min("offset").alias("start"))
            .collect()
        )
        return sorted((r["pid"], r["partition"], r["start"]) for r in rows)

    def check(df: DataFrame, batch_id: int) -> None:
        if batch_id > 0:
            return
        seen["keys"], seen["held"] = task_keys(df), held(df)
        narrow = df.select("value", "partition")
        seen["narrow"] = task_keys(narrow.mapInArrow(lambda it: it, narrow.schema))
        seen["shuffled"] = task_keys(df.repartition(2, "key"))
        try:
            task_keys(df.coalesce(1))
        except SinkError as exc:
            seen["coalesce"] = str(exc)

    def run(source: Any, name: str, each: Callable[[DataFrame, int], None]) -> None:
        query = (
            source.stream(spark, None)
            .writeStream.foreachBatch(each)
            .trigger(availableNow=True)
            .option("checkpointLocation", str(tmp_path / name))
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None, query.exception()

    run(SparkKafkaSource(kafka_broker.bootstrap, topic, max_records_per_batch=250), "a", check)
    keys, rows = seen["keys"], seen["held"]
    assert len(keys) == 5 and len(rows) == 5
    assert {pid: f"{topic}-{partition}" for pid, partition, _ in rows} == dict(enumerate(keys))
    assert seen["narrow"] == keys  # a one-to-one transform keeps each task's input
    assert seen["shuffled"] is None  # after a shuffle the numbers are hash buckets: stable
    assert "coalesce" in seen and "repartition(N)" in seen["coalesce"]

    # minPartitions splits a Kafka partition into several ranges: .k in offset order.
    seen.clear()
    run(
        SparkKafkaSource(
            kafka_broker.bootstrap, topic, max_records_per_batch=250, options={"minPartitions": 10}
        ),
        "b",
        check,
    )
    keys, rows = seen["keys"], seen["held"]
    assert len(keys) == len(rows) >= 10
    starts: dict[int, list[int]] = {}
    for _, partition, start in rows:
        starts.setdefault(partition, []).append(start)
    expected = {
        pid: f"{topic}-{partition}.{sorted(starts[partition]).index(start)}"
        if len(starts[partition]) > 1
        else f"{topic}-{partition}"
        for pid, partition, start in rows
    }
    assert expected == dict(enumerate(keys))
    assert len(set(keys)) == len(keys)

    # sparkonce's own Python source numbers its partitions in order: no keys needed.
    found: list[Any] = []
    run(
        KafkaSource(kafka_broker.bootstrap, topic, max_records_per_partition=50),
        "c",
        lambda df, batch_id: found.append(task_keys(df)),
    )
    assert found and all(k is None for k in found)
