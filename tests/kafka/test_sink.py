"""The transactional Kafka sink against a real broker and the shared Spark session."""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import ConfigError, EmbeddedLogSource, FencedError, Pipeline
from sparkonce.ledger.kafka_topic import transactional_id as _transactional_id
from sparkonce.offsets import check_chain
from sparkonce.pipeline.runner import run_pipeline
from sparkonce.sinks.inspect import inspector_for
from sparkonce.sinks.kafka import KafkaSink

pytestmark = pytest.mark.spark


def as_records(df: DataFrame) -> DataFrame:
    return df.select(
        F.col("key").cast("string").alias("key"),
        F.concat_ws(":", F.col("value").cast("string"), F.col("record_id")).alias("value"),
    )


def pipeline(tmp_path: Path, log_dir: Path, sink: KafkaSink, *, limit: int = 100) -> Pipeline:
    return Pipeline(
        name="k1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=limit),
        sink=sink,
        checkpoint=tmp_path / "chk",
        transform=as_records,
    )


@pytest.fixture
def out_topic(kafka_topic: Callable[..., str]) -> str:
    return kafka_topic("out", partitions=2)


def test_log_to_kafka_writes_every_record_once(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], kafka_broker, out_topic
) -> None:
    log_dir = make_log(600)
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    report = run_pipeline(pipeline(tmp_path, log_dir, sink), spark)
    assert report.batches_committed >= 2 and report.rows_committed == 600
    rows = inspector_for(sink, fresh=True).rows()
    values = Counter(r["value"].split(":")[0] for r in rows)
    assert sorted(int(v) for v in values) == list(range(1, 601))
    assert set(values.values()) == {1}
    entries = inspector_for(sink).fresh().ledger("k1")
    assert [e.seq for e in entries] == list(range(report.batches_committed))
    assert not check_chain(e.ranges for e in entries)
    assert sum(e.row_count for e in entries) == 600
    # sparkonce verify's live reader reads the same records, between two reads of the ledger.
    from sparkonce.verify.live import KafkaLiveReader

    live = KafkaLiveReader("out", inspector_for(sink).fresh, "k1")
    try:
        seen = live.read()
    finally:
        live.close()
    assert Counter(map(str, seen.rows["out"])) == Counter(map(str, rows))
    assert seen.ledger == seen.ledger_after == entries
    # The verifier's reset between trials: both topics look empty afterwards.
    inspector_for(sink).reset("k1")
    assert inspector_for(sink, fresh=True).rows() == []
    assert inspector_for(sink).fresh().ledger("k1") == []


def test_replayed_batch_skips_committed_tasks(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], kafka_broker, out_topic
) -> None:
    """A batch whose tasks committed but whose ledger entry is missing is finished, not redone."""
    from sparkonce.ledger.base import BatchContext
    from sparkonce.offsets import BatchRanges, OffsetRange

    log_dir = make_log(300)
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    sink.open()
    owner = sink.acquire("k1")
    src = EmbeddedLogSource(log_dir, "events")
    df = as_records(src.read_all(spark)).repartition(2)
    ranges = BatchRanges(tuple(OffsetRange("events", p, 0, 100) for p in range(3)))
    ctx = BatchContext("k1", owner.epoch, ranges, 0)
    first = sink.commit(ctx, df)
    assert not first.skipped and first.row_count == 300
    # Forget the ledger entry: simulate a crash after the tasks committed (step 3 done).
    sink2 = KafkaSink(kafka_broker.bootstrap, out_topic)
    state_entries = sink2.ledger("k1")
    assert len(state_entries) == 1
    # Same batch again through the task path: each task finds its marker and skips.

    again = sink2.commit(ctx, df)
    assert again.skipped  # step 2: the ledger covers it
    assert len(inspector_for(sink2).rows()) == 300


def test_zombie_producer_is_fenced(kafka_broker, out_topic) -> None:
    """Two producers with the same transactional.id: the newer init fences the older one."""
    from confluent_kafka import KafkaException, Producer

    conf = {
        "bootstrap.servers": kafka_broker.bootstrap,
        "transactional.id": _transactional_id("k1", out_topic, 0),
    }
    old = Producer(conf)
    old.init_transactions(30)
    old.begin_transaction()
    old.produce(out_topic, value=b"zombie", partition=0)
    old.flush(10)
    new = Producer(conf)
    new.init_transactions(30)  # bumps the epoch: aborts old's open transaction
    new.begin_transaction()
    new.produce(out_topic, value=b"successor", partition=0)
    new.commit_transaction(30)
    with pytest.raises(KafkaException) as err:
        old.commit_transaction(30)
    assert err.value.args[0].fatal() or "fenced" in str(err.value).lower()
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    assert [r["value"] for r in inspector_for(sink).rows()] == ["successor"]


def test_new_run_fences_old_driver(kafka_broker, out_topic) -> None:
    a = KafkaSink(kafka_broker.bootstrap, out_topic)
    b = KafkaSink(kafka_broker.bootstrap, out_topic)
    ea = a.acquire("k1").epoch
    eb = b.acquire("k1").epoch
    assert eb == ea + 1
    from sparkonce.ledger.base import BatchContext
    from sparkonce.offsets import BatchRanges

    with pytest.raises(FencedError):
        a.commit(BatchContext("k1", ea, BatchRanges(()), 0), None)  # type: ignore[arg-type]


def test_bad_output_schema_is_refused(spark: SparkSession, kafka_broker, out_topic) -> None:
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    df = spark.createDataFrame([(1, "a")], "n INT, value STRING")
    with pytest.raises(ConfigError, match="only key, value and partition"):
        sink.validate(df.schema)
    with pytest.raises(ConfigError, match="'value' column"):
        sink.validate(spark.createDataFrame([("a",)], "key STRING").schema)


def test_missing_output_topic_is_a_config_error_before_the_epoch(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], kafka_broker
) -> None:
    """A missing output topic is bad input (exit 2), refused before the run takes an epoch."""
    from pyspark.sql.types import StringType, StructField, StructType

    from sparkonce.cli import EXIT_USAGE, _report

    topic = f"no-such-topic-{tmp_path.name}"
    create = f"sparkonce kafka create {kafka_broker.bootstrap} {topic} --partitions N"
    schema = StructType([StructField("value", StringType())])
    sink = KafkaSink(kafka_broker.bootstrap, topic)
    with pytest.raises(ConfigError, match=f"output topic '{topic}' does not exist") as info:
        sink.validate(schema)
    assert create in str(info.value)
    with pytest.raises(ConfigError, match=f"output topic '{topic}' does not exist"):
        sink.open()
    with pytest.raises(ConfigError, match=f"output topic '{topic}' does not exist") as info:
        run_pipeline(pipeline(tmp_path, make_log(10), sink), spark)
    assert _report(info.value) == EXIT_USAGE == 2
    # Neither the output topic nor the ledger topic was created; no epoch was taken.
    assert not {topic, f"{topic}.sparkonce-ledger"} & set(sink.conn.topics())


def test_complete_output_mode_is_refused(spark: SparkSession, kafka_broker, out_topic) -> None:
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    schema = spark.createDataFrame([("k", "1")], "key STRING, value STRING").schema
    sink.validate(schema, "update")
    sink.validate(schema, "append")
    with pytest.raises(ConfigError) as info:
        sink.validate(schema, "complete")
    msg = str(info.value)
    assert "does not support Spark's output mode 'complete'" in msg
    assert "SQLiteSink or PostgresSink" in msg


def test_checkpoint_deleted_resumes_from_ledger(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], kafka_broker, out_topic
) -> None:
    log_dir = make_log(300)
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    run_pipeline(pipeline(tmp_path, log_dir, sink), spark)
    shutil.rmtree(tmp_path / "chk")
    make_log(300, start=301)
    report = run_pipeline(
        pipeline(tmp_path, log_dir, KafkaSink(kafka_broker.bootstrap, out_topic)), spark
    )
    assert report.resumed_from == "ledger"
    values = Counter(int(r["value"].split(":")[0]) for r in inspector_for(sink, fresh=True).rows())
    assert sorted(values) == list(range(1, 601)) and set(values.values()) == {1}


def test_a_record_the_broker_refuses_fails_the_batch_with_nothing_visible(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path], kafka_broker, out_topic
) -> None:
    """Delivery reports come only for failures (one Python call per record otherwise): a
    record the broker rejects must still fail its task, abort its transaction and say so."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = kafka_broker.admin()
    small = ConfigEntry("max.message.bytes", "300", incremental_operation=AlterConfigOpType.SET)
    res = ConfigResource("topic", out_topic, incremental_configs=[small])
    for f in admin.incremental_alter_configs([res]).values():
        f.result()
    log_dir = make_log(60)
    sink = KafkaSink(kafka_broker.bootstrap, out_topic)
    p = Pipeline(
        name="k1",
        source=EmbeddedLogSource(log_dir, "events"),
        sink=sink,
        checkpoint=tmp_path / "chk",
        transform=lambda df: as_records(df).select(
            "key", F.concat(F.col("value"), F.lit("x" * 1000)).alias("value")
        ),
    )
    with pytest.raises(Exception) as failed:
        run_pipeline(p, spark)
    assert "could not write" in str(failed.value) and "too large" in str(failed.value).lower()
    assert inspector_for(sink, fresh=True).rows() == []
    assert inspector_for(sink).fresh().ledger("k1") == []
