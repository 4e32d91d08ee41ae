"""Every source and sink family on the standalone cluster, one ``sparkonce run --master
spark://...`` driver each, its executors running the shipped environment:

- ``KafkaSource`` (sparkonce's own reader, in executor tasks) -> ``KafkaSink`` (executor
  tasks write in Kafka transactions), the output read back ``read_committed``;
- ``SparkKafkaSource`` (Spark's connector: its jars reach the executors through
  ``spark.jars``) -> ``PostgresSink``;
- the embedded log -> ``DeltaSink`` (executors write the table's files, the driver commits);
- the embedded log -> ``PostgresSink`` in upsert mode behind a ``groupBy(key)`` sum, so the
  state store lives on the executors.

(tests/cluster/test_pipeline.py and test_kills.py run the embedded log into SQLite and into
``PostgresTwoPhaseSink``.) Each test knows what it wrote into the input, with the offset
every record got, and checks against that alone: the output holds every input record once
with its values (or each key's exact sum and count), and the ledger has one entry per
batch whose ranges are the ones the read limit cuts from the input's offsets.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaPartition

from sparkonce import DeltaSink, PostgresSink
from sparkonce.kafka import RECORD_ID_HEADER
from sparkonce.ledger.base import LedgerEntry
from sparkonce.log import Topic
from sparkonce.sinks import KafkaSink
from sparkonce.spark.jars import CONNECTOR_JAR_PREFIX
from tests.cluster.conftest import StartDriver, sparkonce_run
from tests.services.spark_cluster import SparkCluster

pytestmark = pytest.mark.campaign_lane

PARTITIONS = 3
KEYS = 6
LIMIT = 200  # Kafka inputs: records per partition and batch
KAFKA_RECORDS = 1800  # 600 per partition: 3 batches
LOG_RECORDS = 1200  # embedded log: 400 per partition (two keys each)...
LOG_LIMIT = 100  # ...read 100 per partition and batch: 4 batches
NAME = "families"
TABLE = "families_out"
READ_TIMEOUT_S = 60.0


@dataclasses.dataclass(frozen=True)
class Record:
    """One input record, as the test wrote it and where it landed."""

    record_id: str
    partition: int
    offset: int
    key: str
    value: int


# --- the pipeline files -------------------------------------------------------------------------

_PIPELINE_FILE = '''"""A sparkonce pipeline of tests/cluster/test_families.py."""

from pyspark.sql import functions as F

from sparkonce import (
    DeltaSink,
    EmbeddedLogSource,
    KafkaSink,
    KafkaSource,
    Pipeline,
    PostgresSink,
    SparkKafkaSource,
)


def records(df):
    """Each record's identity and value, one row each."""
    return df.select(
        F.col("record_id").cast("string").alias("record_id"),
        F.col("partition"),
        F.col("offset"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def as_messages(df):
    """For a Kafka topic: the record's key, and its identity and value in the value."""
    return df.select(
        F.col("key").cast("string").alias("key"),
        F.concat_ws(
            "|",
            F.col("value").cast("string"),
            F.col("record_id").cast("string"),
            F.col("partition").cast("string"),
            F.col("offset").cast("string"),
        ).alias("value"),
    )


def totals(df):
    """Stateful: each key's sum and count so far."""
    return records(df).groupBy("key").agg(
        F.sum("value").alias("total"), F.count(F.lit(1)).alias("n")
    )


pipeline = Pipeline(
    name={name!r},
    source={source},
    transform={transform},
    sink={sink},
    checkpoint={checkpoint!r},
)
'''


def run_on_cluster(
    start_driver: StartDriver,
    cluster: SparkCluster,
    tmp_path: Path,
    *,
    source: str,
    transform: str,
    sink: str,
) -> str:
    """Write the pipeline (``source`` and ``sink`` are Python expressions), run it to the end
    as a driver on ``cluster``, and return the driver's output."""
    path = tmp_path / "pipeline.py"
    path.write_text(
        _PIPELINE_FILE.format(
            name=NAME,
            source=source,
            transform=transform,
            sink=sink,
            checkpoint=str(tmp_path / "checkpoint"),
        )
    )
    driver = start_driver(sparkonce_run(path, cluster, tmp_path / "spark.log"))
    assert driver.wait() == 0, driver.tail()
    return driver.log.read_text(errors="replace")


# --- the inputs ---------------------------------------------------------------------------------


def produce_kafka(bootstrap: str, topic: str, count: int) -> list[Record]:
    """Send ``count`` records (record i: partition i % 3, key k{i % 6}, value i + 1, record
    id header r{i}) with a plain producer; return them with the offsets the broker gave."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    landed: dict[int, tuple[int, int]] = {}
    errors: list[Any] = []

    def delivered(i: int) -> Callable[[Any, Any], None]:
        def report(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                landed[i] = (msg.partition(), msg.offset())

        return report

    for i in range(count):
        producer.produce(
            topic,
            value=str(i + 1).encode(),
            key=f"k{i % KEYS}".encode(),
            partition=i % PARTITIONS,
            headers=[(RECORD_ID_HEADER, f"r{i}".encode())],
            on_delivery=delivered(i),
        )
    assert producer.flush(30) == 0
    assert not errors, errors
    assert len(landed) == count
    return [
        Record(f"r{i}", landed[i][0], landed[i][1], f"k{i % KEYS}", i + 1) for i in range(count)
    ]


def log_records(log_dir: Path, topic: str = "events") -> list[Record]:
    """The embedded log's records (``make_log``: values 1..N, key k{value % keys})."""
    out = []
    with Topic(log_dir, topic) as t:
        for partition, end in t.end_offsets().items():
            for r in t.read(partition, 0, end):
                assert r.key is not None and r.value is not None
                out.append(Record(r.record_id, r.partition, r.offset, r.key.decode(), int(r.value)))
    return out


# --- the oracle ---------------------------------------------------------------------------------

Ranges = dict[int, tuple[int, int]]  # partition -> [start, end) of one batch


def expected_batches(records: Iterable[Record], per_partition: int) -> list[Ranges]:
    """The batches a read limit of ``per_partition`` records per partition cuts from the
    input: batch i reads offsets [i * limit, (i + 1) * limit) of each partition (up to its
    end), and a partition with nothing left is not in the batch."""
    ends: Counter[int] = Counter()
    for r in records:
        ends[r.partition] = max(ends[r.partition], r.offset + 1)
    batches = []
    i = 0
    while any(i * per_partition < end for end in ends.values()):
        start, stop = i * per_partition, (i + 1) * per_partition
        batches.append(
            {p: (start, min(stop, end)) for p, end in sorted(ends.items()) if start < end}
        )
        i += 1
    return batches


def in_batch(batch: Ranges, r: Record) -> bool:
    start, end = batch.get(r.partition, (0, 0))
    return start <= r.offset < end


def check_ledger(
    ledger: list[LedgerEntry],
    topic: str,
    batches: list[Ranges],
    row_counts: list[int],
    *,
    stateful: bool = False,
) -> None:
    """One entry per expected batch, numbered from 0, each with that batch's ranges (of
    ``topic`` only), its row count and whether Spark kept state."""
    got = [
        (
            e.seq,
            {r.partition: (r.start, r.end) for r in e.ranges.ranges if not r.empty},
            {r.topic for r in e.ranges.ranges},
            e.row_count,
            bool(e.stateful),
        )
        for e in ledger
    ]
    want = [
        (i, b, {topic}, n, stateful)
        for i, (b, n) in enumerate(zip(batches, row_counts, strict=True))
    ]
    assert got == want


def committed(output: str, batches: int, rows: int) -> None:
    assert f"committed {batches} batches ({rows} rows)" in output, output[-3000:]


# --- reading the outputs, without sparkonce ------------------------------------------------------


def read_committed(bootstrap: str, topic: str) -> list[tuple[str, str]]:
    """Every (key, value) of ``topic`` a ``read_committed`` consumer sees, to each
    partition's end."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=30).topics[topic].partitions
        consumer.assign([KafkaPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        done: set[int] = set()
        out = []
        deadline = time.monotonic() + READ_TIMEOUT_S
        while done != set(partitions):
            assert time.monotonic() < deadline, f"{topic}: no end seen on {set(partitions) - done}"
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err, partition, key, value = msg.error(), msg.partition(), msg.key(), msg.value()
            if err is not None:
                assert err.code() == KafkaError._PARTITION_EOF, err
                assert partition is not None, msg
                done.add(partition)
                continue
            assert key is not None and value is not None, msg
            out.append((key.decode(), value.decode()))
        return out
    finally:
        consumer.close()


def app_dirs(cluster: SparkCluster) -> set[Path]:
    """The applications' directories in the live workers' work dirs."""
    return {d for w in cluster.workers if w.alive for d in w.workdir.glob("app-*")}


def pg_rows(url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(url) as conn:
        return list(conn.execute(query).fetchall())


def pg_ledger(url: str) -> list[LedgerEntry]:
    sink = PostgresSink(url, TABLE)
    try:
        return sink.ledger(NAME)
    finally:
        sink.close()


def record_rows(records: Iterable[Record]) -> Counter[tuple[str, int, int, str, int]]:
    return Counter((r.record_id, r.partition, r.offset, r.key, r.value) for r in records)


# --- the tests ----------------------------------------------------------------------------------


def test_kafka_source_into_kafka_sink(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    tmp_path: Path,
) -> None:
    source_topic = kafka_topic("fam-in", partitions=PARTITIONS)
    out_topic = kafka_topic("fam-out", partitions=2)
    records = produce_kafka(kafka_broker.bootstrap, source_topic, KAFKA_RECORDS)
    bootstrap = kafka_broker.bootstrap
    output = run_on_cluster(
        start_driver,
        spark_cluster,
        tmp_path,
        source=f"KafkaSource({bootstrap!r}, {source_topic!r}, max_records_per_partition={LIMIT})",
        transform="as_messages",
        sink=f"KafkaSink({bootstrap!r}, {out_topic!r})",
    )
    batches = expected_batches(records, LIMIT)
    assert len(batches) == 3
    committed(output, len(batches), KAFKA_RECORDS)

    # Exactly the input, each record once, as read_committed consumers see the topic.
    want = Counter((r.key, f"{r.value}|{r.record_id}|{r.partition}|{r.offset}") for r in records)
    assert Counter(read_committed(bootstrap, out_topic)) == want

    sink = KafkaSink(bootstrap, out_topic)
    try:
        ledger = sink.ledger(NAME)
    finally:
        sink.close()
    sizes = [sum(1 for r in records if in_batch(b, r)) for b in batches]
    check_ledger(ledger, source_topic, batches, sizes)


def test_spark_kafka_source_into_postgres(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    kafka_broker: Any,
    kafka_topic: Callable[..., str],
    pg_url: str,
    tmp_path: Path,
) -> None:
    source_topic = kafka_topic("fam-spark", partitions=PARTITIONS)
    records = produce_kafka(kafka_broker.bootstrap, source_topic, KAFKA_RECORDS)
    bootstrap = kafka_broker.bootstrap
    # maxOffsetsPerTrigger is shared out over the partitions by what each has left: with
    # equal partitions, LIMIT each.
    per_batch = LIMIT * PARTITIONS
    apps_before = app_dirs(spark_cluster)
    output = run_on_cluster(
        start_driver,
        spark_cluster,
        tmp_path,
        source=f"SparkKafkaSource({bootstrap!r}, {source_topic!r}, "
        f"max_records_per_batch={per_batch})",
        transform="records",
        sink=f"PostgresSink({pg_url!r}, {TABLE!r})",
    )
    batches = expected_batches(records, LIMIT)
    assert len(batches) == 3
    committed(output, len(batches), KAFKA_RECORDS)

    # Nothing was installed on the workers: each executor of the run fetched the connector
    # jar from the driver (spark.jars, which SparkKafkaSource.spark_conf sets) into its
    # working directory.
    (app,) = {d.name for d in app_dirs(spark_cluster) - apps_before}
    fetched = {
        w.index
        for w in spark_cluster.workers
        if w.alive and any((w.workdir / app).glob(f"*/{CONNECTOR_JAR_PREFIX}*.jar"))
    }
    assert fetched == {w.index for w in spark_cluster.workers if w.alive}, app

    rows = pg_rows(pg_url, f'SELECT record_id, "partition", "offset", key, value FROM {TABLE}')
    assert Counter(rows) == record_rows(records)
    sizes = [sum(1 for r in records if in_batch(b, r)) for b in batches]
    check_ledger(pg_ledger(pg_url), source_topic, batches, sizes)


def test_embedded_log_into_delta(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    spark: Any,
    tmp_path: Path,
) -> None:
    log_dir = make_log(LOG_RECORDS, partitions=PARTITIONS, keys=KEYS)
    records = log_records(log_dir)
    table = tmp_path / "delta" / TABLE
    output = run_on_cluster(
        start_driver,
        spark_cluster,
        tmp_path,
        source=f"EmbeddedLogSource({str(log_dir)!r}, 'events', "
        f"max_records_per_partition={LOG_LIMIT})",
        transform="records",
        sink=f"DeltaSink({str(table)!r})",
    )
    batches = expected_batches(records, LOG_LIMIT)
    assert len(batches) == 4
    committed(output, len(batches), LOG_RECORDS)

    # The table as Delta's own reader sees it (the tests' local session).
    df = spark.read.format("delta").load(str(table))
    rows = Counter(
        (r.record_id, r.partition, r.offset, r.key, r.value)
        for r in df.select("record_id", "partition", "offset", "key", "value").collect()
    )
    assert rows == record_rows(records)
    sink = DeltaSink(str(table))
    sizes = [sum(1 for r in records if in_batch(b, r)) for b in batches]
    check_ledger(sink.ledger(NAME), "events", batches, sizes)


def test_embedded_log_aggregated_into_postgres_upsert(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    pg_url: str,
    tmp_path: Path,
) -> None:
    log_dir = make_log(LOG_RECORDS, partitions=PARTITIONS, keys=KEYS)
    records = log_records(log_dir)
    output = run_on_cluster(
        start_driver,
        spark_cluster,
        tmp_path,
        source=f"EmbeddedLogSource({str(log_dir)!r}, 'events', "
        f"max_records_per_partition={LOG_LIMIT})",
        transform="totals",
        sink=f"PostgresSink({pg_url!r}, {TABLE!r}, mode='upsert', keys=['key'])",
    )
    batches = expected_batches(records, LOG_LIMIT)
    assert len(batches) == 4
    # Update mode: a batch writes one row per key it changed.
    changed = [len({r.key for r in records if in_batch(b, r)}) for b in batches]
    committed(output, len(batches), sum(changed))

    totals: dict[str, tuple[int, int]] = {}
    for r in records:
        total, n = totals.get(r.key, (0, 0))
        totals[r.key] = (total + r.value, n + 1)
    assert len(totals) == KEYS
    rows = pg_rows(pg_url, f"SELECT key, total, n FROM {TABLE}")
    assert len(rows) == KEYS  # one row per key
    assert {key: (total, n) for key, total, n in rows} == totals
    check_ledger(pg_ledger(pg_url), "events", batches, changed, stateful=True)
