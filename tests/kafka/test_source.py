"""The Kafka source against a real broker and the shared Spark session.

Records are produced with a plain confluent-kafka producer, so these tests do not depend
on sparkonce's own producer.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KTP
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

from sparkonce import KafkaSource, SourceError, faults
from sparkonce.errors import TopicNotFoundError
from sparkonce.faults import FaultPlan
from sparkonce.kafka import KafkaUnavailableError
from sparkonce.offsets import BatchRanges, OffsetRange, check_chain
from sparkonce.protocol import FAIL_TASKS_ENV
from sparkonce.sinks.inspect import inspector_for
from sparkonce.sources import source_from_uri
from sparkonce.sources.kafka import (
    RECORD_ID_HEADER,
    KafkaRangePartition,
    KafkaStreamReader,
)

pytestmark = pytest.mark.spark

Rows = list[tuple[Any, ...]]


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[int, bytes | None, bytes | None]],
    *,
    record_ids: bool = False,
) -> None:
    """Send ``(partition, key, value)`` records and wait until all are acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[Any] = []
    for i, (partition, key, value) in enumerate(records):
        headers: list[tuple[str, str | bytes | None]] | None = (
            [(RECORD_ID_HEADER, f"id-{i}".encode())] if record_ids else None
        )
        producer.produce(
            topic,
            value,
            key,
            partition=partition,
            headers=headers,
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(30) == 0
    assert not errors


def numbered(count: int, partitions: int = 3, start: int = 0) -> list[tuple[int, bytes, bytes]]:
    return [(i % partitions, f"k{i % 5}".encode(), str(i).encode()) for i in range(start, count)]


def transactional(bootstrap: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"test-tx-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    return producer


def read_in_process(source: KafkaSource, ranges: BatchRanges) -> Rows:
    """Run the stream reader's read() for each range here, as an executor would.

    Timestamps come back naive, in UTC, as Spark's ``collect`` gives them (session time zone UTC).
    """
    reader = KafkaStreamReader(source.options())
    rows: Rows = []
    for r in ranges.ranges:
        if r.empty:
            continue
        for batch in reader.read(KafkaRangePartition(r.topic, r.partition, r.start, r.end)):
            for row in batch.to_pylist():
                if row["timestamp"] is not None:
                    row["timestamp"] = row["timestamp"].replace(tzinfo=None)
                rows.append(tuple(row.values()))
    return rows


def wait_for_ends(
    source: KafkaSource, want: Callable[[dict[Any, int]], bool], timeout: float = 30
) -> dict[Any, int]:
    """Poll the last stable offsets until ``want`` holds (transaction markers land late)."""
    deadline = time.monotonic() + timeout
    while True:
        ends = source.latest_offsets()
        if want(ends):
            return ends
        assert time.monotonic() < deadline, f"offsets stuck at {ends}"
        time.sleep(0.1)


def run_available_now(
    df: DataFrame, checkpoint: Path, capture: Callable[[DataFrame, int], None]
) -> None:
    q = (
        df.writeStream.foreachBatch(capture)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert not q.isActive
    assert q.exception() is None


def forget_commit(checkpoint: Path, batch_id: int) -> None:
    """Make Spark forget a finished batch, as a crash before its commit log would."""
    (checkpoint / "commits" / str(batch_id)).unlink()
    (checkpoint / "commits" / f".{batch_id}.crc").unlink(missing_ok=True)


# --- Spark end to end ---------------------------------------------------------------------------


def test_stream_reads_every_record_once_and_replays_identically(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("src", partitions=3)
    produce(kafka_broker.bootstrap, topic, numbered(90), record_ids=True)
    source = KafkaSource(kafka_broker.bootstrap, topic, max_records_per_partition=10)
    seen: dict[int, Rows] = {}
    replays: list[tuple[int, Rows]] = []

    def capture(df: DataFrame, batch_id: int) -> None:
        rows = sorted(tuple(r) for r in df.collect())
        if batch_id in seen:
            replays.append((batch_id, rows))
        else:
            seen[batch_id] = rows

    chk = tmp_path / "chk"
    run_available_now(source.stream(spark, None), chk, capture)

    # 30 records per partition, at most 10 per partition and batch: three batches.
    assert sorted(seen) == [0, 1, 2]
    rows = [r for b in seen.values() for r in b]
    values = Counter(int(r[4].decode()) for r in rows)
    assert sorted(values) == list(range(90)) and set(values.values()) == {1}
    assert sorted(r[6] for r in rows) == sorted(f"id-{i}" for i in range(90))
    assert all(r[0] == topic and r[5] is not None for r in rows)
    for batch in seen.values():
        per_partition = Counter(r[1] for r in batch)
        assert set(per_partition.values()) == {10}
    # The batches Spark checkpointed are the wire form, gap-free and back to back.
    offsets = sorted((chk / "offsets").glob("[0-9]*"), key=lambda p: int(p.name))
    chain = [source.batch_ranges(None, p.read_text().splitlines()[-1]) for p in offsets]
    assert not check_chain(chain)
    assert chain[-1].ends() == {(topic, p): 30 for p in range(3)}

    # Spark rebuilds the last batch from its offset log: the same records again.
    forget_commit(chk, 2)
    run_available_now(source.stream(spark, None), chk, capture)
    assert [b for b, _ in replays] == [2]
    assert replays[0][1] == seen[2]


def test_pipeline_runner_commits_every_record_once(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    """The existing runner, unchanged, over the Kafka source into a SQLite sink."""
    from pyspark.sql import functions as F

    from sparkonce import Pipeline, sink_from_url

    topic = kafka_topic("pipe", partitions=3)
    produce(kafka_broker.bootstrap, topic, numbered(120))
    source = KafkaSource(kafka_broker.bootstrap, topic, max_records_per_partition=25)

    def transform(df: DataFrame) -> DataFrame:
        return df.select(
            "record_id",
            "partition",
            "offset",
            F.col("value").cast("string").cast("long").alias("n"),
        )

    def pipeline() -> Pipeline:
        return Pipeline(
            name=f"kp-{topic}",
            source=source,
            sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
            checkpoint=tmp_path / "chk",
            transform=transform,
        )

    p = pipeline()
    report = p.run(spark)
    assert report.rows_committed == 120 and report.batches_committed == 2
    produce(kafka_broker.bootstrap, topic, numbered(150, start=120))
    report = pipeline().run(spark)
    assert report.rows_committed == 30
    p.sink.open()
    try:
        rows = inspector_for(p.sink).rows()
        entries = p.sink.ledger(p.name)
    finally:
        p.sink.close()
    assert sorted(r["n"] for r in rows) == list(range(150))
    # Sent without the sparkonce-record-id header: no record id (dedupe counts these).
    assert {r["record_id"] for r in rows} == {None}
    assert not check_chain(e.ranges for e in entries)
    assert entries[-1].ranges.ends() == {(topic, q): 50 for q in range(3)}
    # The runner reported each commit to the source: group offsets for lag monitoring.
    probe = Consumer(
        {"bootstrap.servers": kafka_broker.bootstrap, "group.id": f"sparkonce-{p.name}"}
    )
    try:
        got = probe.committed([KTP(topic, q) for q in range(3)], timeout=10)
    finally:
        probe.close()
    assert {tp.partition: tp.offset for tp in got} == {0: 50, 1: 50, 2: 50}
    source.close()


def test_batch_reader_replays_explicit_ranges_identically(
    spark: SparkSession, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("replay", partitions=2)
    produce(kafka_broker.bootstrap, topic, numbered(40, partitions=2))
    tx = transactional(kafka_broker.bootstrap)
    tx.begin_transaction()
    tx.produce(topic, b"aborted", partition=0)
    assert tx.flush(30) == 0
    tx.abort_transaction(30)
    tx.begin_transaction()
    tx.produce(topic, b"committed", partition=0)
    tx.commit_transaction(30)
    produce(kafka_broker.bootstrap, topic, [(0, None, b"after")])
    source = KafkaSource(kafka_broker.bootstrap, topic)
    wait_for_ends(source, lambda e: e[(topic, 0)] >= 25)
    ranges = BatchRanges((OffsetRange(topic, 0, 5, 25), OffsetRange(topic, 1, 3, 17)))

    first = sorted(tuple(r) for r in source.read_ranges(spark, ranges).collect())
    second = sorted(tuple(r) for r in source.read_ranges(spark, ranges).collect())
    assert first == second
    assert sorted(read_in_process(source, ranges)) == first
    assert sorted(read_in_process(source, ranges)) == first
    values = [r[4] for r in first]
    assert b"aborted" not in values and b"committed" in values and b"after" in values
    # Partition 1 holds no transactions: its range is dense.
    assert [r[2] for r in first if r[1] == 1] == list(range(3, 17))

    everything = source.read_all(spark).collect()
    assert len(everything) == 40 + 2  # the aborted record and the markers are not records


def test_resumes_from_ledger_offsets(
    spark: SparkSession, tmp_path: Path, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("resume", partitions=3)
    produce(kafka_broker.bootstrap, topic, numbered(60))
    source = KafkaSource(kafka_broker.bootstrap, topic, starting_offsets="latest")
    ledger_end = {(topic, 0): 5, (topic, 1): 20, (topic, 2): 0}
    reader = KafkaStreamReader(source.options(ledger_end))
    assert reader.initialOffset() == {topic: {"0": [5, 5], "1": [20, 20], "2": [0, 0]}}
    reader.stop()

    got: Rows = []
    run_available_now(
        source.stream(spark, ledger_end),
        tmp_path / "chk",
        lambda df, _id: got.extend(tuple(r) for r in df.collect()),
    )
    offsets = sorted((r[1], r[2]) for r in got)
    want = sorted((p, o) for p, start in ((0, 5), (1, 20), (2, 0)) for o in range(start, 20))
    assert offsets == want


def test_invalid_utf8_fails_the_batch_with_a_count(
    spark: SparkSession, kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("utf8", partitions=2)
    records: list[tuple[int, bytes | None, bytes | None]] = [
        (1, b"k", f"v{i}".encode()) for i in range(20)
    ]
    records[12] = (1, b"k", b"\xff\xfe bad")
    records[15] = (1, b"\xc3\x28", b"bad key")
    records[17] = (1, None, b"\xed\xa0\x80")  # an encoded surrogate: not strict UTF-8
    records.append((0, None, "ünïcode".encode()))
    produce(kafka_broker.bootstrap, topic, records)

    text = KafkaSource(kafka_broker.bootstrap, topic, value_format="utf8")
    assert text.read_ranges(spark, BatchRanges((OffsetRange(topic, 0, 0, 1),))).collect()[0][
        "value"
    ] == ("ünïcode")
    ranges = BatchRanges((OffsetRange(topic, 1, 10, 20),))
    with pytest.raises(SourceError) as info:
        read_in_process(text, ranges)
    message = str(info.value)
    assert message.startswith(
        f"3 records in {topic}[1] offsets 10..20 are not valid UTF-8 in key or value "
        "(first at offset 12); the batch fails so none is lost"
    )
    assert "value_format='binary'" in message
    # Through Spark, the task fails with the same message.
    with pytest.raises(Exception, match=r"3 records in .* are not valid UTF-8"):
        text.read_ranges(spark, ranges).collect()
    # The bytes are still readable as binary, which never fails.
    raw = KafkaSource(kafka_broker.bootstrap, topic).read_ranges(spark, ranges).collect()
    assert [r["value"] for r in raw][2] == b"\xff\xfe bad"
    assert len(raw) == 10


# --- read_committed ----------------------------------------------------------------------------


def test_aborted_and_open_transactions_are_not_read(
    kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("txn", partitions=1)
    bootstrap = kafka_broker.bootstrap
    produce(bootstrap, topic, [(0, None, b"plain-%d" % i) for i in range(3)])
    tx = transactional(bootstrap)
    tx.begin_transaction()
    for i in range(3):
        tx.produce(topic, b"aborted-%d" % i, partition=0)
    assert tx.flush(30) == 0  # written to the log, then aborted (abort purges unsent ones)
    tx.abort_transaction(30)
    tx.begin_transaction()
    tx.produce(topic, b"committed-0", partition=0)
    tx.commit_transaction(30)
    source = KafkaSource(bootstrap, topic)
    # plain 0-2, aborted 3-5, abort marker 6, committed 7, commit marker 8.
    first_end = wait_for_ends(source, lambda e: e[(topic, 0)] == 9)[(topic, 0)]

    open_tx = transactional(bootstrap)
    open_tx.begin_transaction()
    open_tx.produce(topic, b"open-0", partition=0)
    open_tx.produce(topic, b"open-1", partition=0)
    assert open_tx.flush(30) == 0
    produce(bootstrap, topic, [(0, None, b"plain-after")])  # written after the open txn

    # The end is the last stable offset: the first offset of the open transaction. A
    # read_uncommitted consumer sees the high watermark beyond it.
    assert source.latest_offsets() == {(topic, 0): first_end}
    uncommitted = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": "probe", "isolation.level": "read_uncommitted"}
    )
    try:
        assert uncommitted.get_watermark_offsets(KTP(topic, 0), timeout=10) == (0, 12)
    finally:
        uncommitted.close()

    reader = KafkaStreamReader(source.options())
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end == {topic: {"0": [0, first_end]}}
    # Nothing more to plan while the transaction is open.
    assert reader.latestOffset(end, ReadAllAvailable()) == end
    rows = read_in_process(source, BatchRanges.from_json_obj(end))
    assert [r[4] for r in rows] == [b"plain-0", b"plain-1", b"plain-2", b"committed-0"]
    assert [r[2] for r in rows] == [0, 1, 2, 7]

    open_tx.commit_transaction(30)
    wait_for_ends(source, lambda e: e[(topic, 0)] == 13)
    nxt = reader.latestOffset(end, ReadAllAvailable())
    assert nxt == {topic: {"0": [first_end, 13]}}
    rows = read_in_process(source, BatchRanges.from_json_obj(nxt))
    assert [r[4] for r in rows] == [b"open-0", b"open-1", b"plain-after"]
    reader.stop()


# --- planning -----------------------------------------------------------------------------------


def test_read_limits_plan_the_expected_ranges(
    kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("limits", partitions=3)
    # 20 records in partition 0, 5 in partition 1, none in partition 2.
    produce(kafka_broker.bootstrap, topic, [(0, None, b"x")] * 20 + [(1, None, b"y")] * 5)

    per_partition = KafkaSource(kafka_broker.bootstrap, topic, max_records_per_partition=4)
    reader = KafkaStreamReader(per_partition.options())
    limit = reader.getDefaultReadLimit()
    assert isinstance(limit, ReadMaxRows) and limit.max_rows == 12
    b0 = reader.initialOffset()
    assert b0 == {topic: {"0": [0, 0], "1": [0, 0], "2": [0, 0]}}
    b1 = reader.latestOffset(b0, limit)
    assert b1 == {topic: {"0": [0, 4], "1": [0, 4], "2": [0, 0]}}
    b2 = reader.latestOffset(b1, limit)
    assert b2 == {topic: {"0": [4, 8], "1": [4, 5], "2": [0, 0]}}
    parts = reader.partitions(b1, b2)
    assert all(isinstance(p, KafkaRangePartition) for p in parts)
    got = [(p.partition, p.start, p.end) for p in cast("list[KafkaRangePartition]", parts)]
    assert got == [(0, 4, 8), (1, 4, 5)]
    assert reader.partitions(b2, b2) == []
    # Spark asking for everything ignores the limits.
    assert reader.latestOffset(b2, ReadAllAvailable()) == {
        topic: {"0": [8, 20], "1": [5, 5], "2": [0, 0]}
    }
    reader.stop()

    per_batch = KafkaSource(kafka_broker.bootstrap, topic, max_records_per_batch=6)
    reader = KafkaStreamReader(per_batch.options())
    assert reader.getDefaultReadLimit() == ReadMaxRows(6)
    b0 = reader.initialOffset()
    # Shared out round-robin over the partitions that have records.
    assert reader.latestOffset(b0, reader.getDefaultReadLimit()) == {
        topic: {"0": [0, 3], "1": [0, 3], "2": [0, 0]}
    }
    # availableNow: the target is fixed when the query starts; later records wait.
    reader.prepareForTriggerAvailableNow()
    produce(kafka_broker.bootstrap, topic, [(2, None, b"late")] * 4)
    wait_for_ends(per_batch, lambda e: e[(topic, 2)] == 4)
    everything = reader.latestOffset(b0, ReadAllAvailable())
    assert everything == {topic: {"0": [0, 20], "1": [0, 5], "2": [0, 0]}}
    assert reader.reportLatestOffset() == {topic: {"0": [20, 20], "1": [5, 5], "2": [0, 0]}}
    reader.stop()

    latest = KafkaSource(kafka_broker.bootstrap, topic, starting_offsets="latest")
    reader = KafkaStreamReader(latest.options())
    assert reader.initialOffset() == {topic: {"0": [20, 20], "1": [5, 5], "2": [4, 4]}}
    reader.stop()


def test_injected_read_failure_fails_half_the_ranges_once(
    kafka_broker: Any, kafka_topic: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    topic = kafka_topic("faults", partitions=1)
    produce(kafka_broker.bootstrap, topic, [(0, None, str(i).encode()) for i in range(40)])
    source = KafkaSource(kafka_broker.bootstrap, topic)
    monkeypatch.setenv(FAIL_TASKS_ENV, "read")
    monkeypatch.setattr(faults, "_worker_plan", None)  # this process's worker plan: parse again
    plan = FaultPlan(fail_tasks=frozenset({"read"}))
    failing = next(
        (s, s + 10) for s in range(30) if plan.fail_task("read", f"{topic}:0:{s}:{s + 10}", 0)
    )
    passing = next(
        (s, s + 10) for s in range(30) if not plan.fail_task("read", f"{topic}:0:{s}:{s + 10}", 0)
    )
    reader = KafkaStreamReader(source.options())
    got: list[int] = []
    with pytest.raises(RuntimeError, match="injected task failure"):
        for batch in reader.read(KafkaRangePartition(topic, 0, *failing)):
            got.extend(batch.column("offset").to_pylist())
    assert got == list(range(failing[0], failing[0] + 5))  # failed halfway
    rows = list(reader.read(KafkaRangePartition(topic, 0, *passing)))
    assert sum(b.num_rows for b in rows) == 10


# --- errors -------------------------------------------------------------------------------------


def test_missing_topic_and_unreachable_broker(spark: SparkSession, kafka_broker: Any) -> None:
    missing = KafkaSource(kafka_broker.bootstrap, f"no-such-topic-{uuid.uuid4().hex[:8]}")
    with pytest.raises(TopicNotFoundError, match="does not exist"):
        missing.stream(spark, None)
    with pytest.raises(TopicNotFoundError):
        missing.latest_offsets()

    down = KafkaSource("127.0.0.1:1", "events", timeout=1.0, retry_timeout=1.0)
    started = time.monotonic()
    with pytest.raises(KafkaUnavailableError, match=r"127\.0\.0\.1:1"):
        down.stream(spark, None)
    with pytest.raises(KafkaUnavailableError, match=r"127\.0\.0\.1:1"):
        down.latest_offsets()
    assert time.monotonic() - started < 15


def test_retention_deleted_range_is_a_clear_error(
    kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("retention", partitions=1)
    produce(kafka_broker.bootstrap, topic, [(0, None, str(i).encode()) for i in range(20)])
    admin = kafka_broker.admin()
    futures = admin.delete_records([KTP(topic, 0, 8)], request_timeout=30)
    for future in futures.values():
        future.result(30)
    source = KafkaSource(kafka_broker.bootstrap, topic)
    with pytest.raises(SourceError) as info:
        read_in_process(source, BatchRanges((OffsetRange(topic, 0, 5, 15),)))
    message = str(info.value)
    assert f"{topic}[0] offsets 5..15" in message
    assert "log now starts at offset 8" in message
    assert "lost to retention" in message
    rows = read_in_process(source, BatchRanges((OffsetRange(topic, 0, 8, 15),)))
    assert [r[2] for r in rows] == list(range(8, 15))
    # "earliest" means the log start offset.
    reader = KafkaStreamReader(source.options())
    assert reader.initialOffset() == {topic: {"0": [8, 8]}}
    reader.stop()


# --- monitoring ---------------------------------------------------------------------------------


def test_committed_writes_group_offsets_for_monitoring(
    kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("lag", partitions=2)
    produce(kafka_broker.bootstrap, topic, numbered(10, partitions=2))
    source = KafkaSource(kafka_broker.bootstrap, topic)
    uri_source = source_from_uri(source.uri())
    assert isinstance(uri_source, KafkaSource) and uri_source.topic == topic

    def group_offsets(group: str) -> dict[int, int]:
        probe = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": group})
        try:
            got = probe.committed([KTP(topic, 0), KTP(topic, 1)], timeout=10)
        finally:
            probe.close()
        return {tp.partition: tp.offset for tp in got}

    try:
        source.committed(
            "p1", BatchRanges((OffsetRange(topic, 0, 0, 3), OffsetRange(topic, 1, 0, 0)))
        )
        source.committed(
            "p1", BatchRanges((OffsetRange(topic, 0, 3, 5), OffsetRange(topic, 1, 0, 4)))
        )
        source.committed("p1", BatchRanges((OffsetRange("other", 0, 0, 9),)))  # not this topic
    finally:
        source.close()
    assert group_offsets("sparkonce-p1") == {0: 5, 1: 4}

    named = KafkaSource(kafka_broker.bootstrap, topic, group_id="lag-monitor")
    try:
        named.committed("p1", BatchRanges((OffsetRange(topic, 1, 4, 5),)))
    finally:
        named.close()
    assert group_offsets("lag-monitor")[1] == 5
