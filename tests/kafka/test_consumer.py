"""The one consumer factory and read loop (sparkonce.kafka.consumer) against the real broker.

Records are produced with plain confluent-kafka producers, so these tests do not depend on
sparkonce's own producer.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka import TopicPartition as KTP

from sparkonce.errors import (
    ConfigError,
    KafkaUnavailableError,
    OffsetOutOfRangeError,
    StoreUnavailableError,
    TopicNotFoundError,
)
from sparkonce.kafka import KafkaConnection, KafkaReader, new_consumer

pytestmark = pytest.mark.kafka

SECRET = "hunter2-do-not-show"


def plain(bootstrap: str, topic: str, *values: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(30) == 0


def in_transaction(bootstrap: str, topic: str, *values: bytes, commit: bool) -> None:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"test-rd-{uuid.uuid4().hex}"}
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for v in values:
        producer.produce(topic, v, partition=0)
    assert producer.flush(30) == 0
    if commit:
        producer.commit_transaction(30)
    else:
        producer.abort_transaction(30)


def settle(bootstrap: str, topic: str, high: int) -> None:
    """Wait until the partition's log and its last stable offset both reach ``high``.

    Transaction markers are written a moment after commit/abort returns; waiting keeps
    the offsets of later records fixed.
    """
    with (
        KafkaReader(KafkaConnection(bootstrap)) as committed,
        KafkaReader(KafkaConnection(bootstrap), isolation_level="read_uncommitted") as everything,
    ):
        deadline = time.monotonic() + 30
        while (committed.watermarks(topic, 0)[1], everything.watermarks(topic, 0)[1]) != (
            high,
            high,
        ):
            assert time.monotonic() < deadline, "transaction markers did not land"
            time.sleep(0.05)


@pytest.fixture
def mixed_topic(kafka_broker: Any, kafka_topic: Callable[..., str]) -> str:
    """One partition: plain records, committed and aborted transactions, and their markers.

    offset: 0 p0, 1 p1, 2 c0, 3 c1, 4 commit marker, 5 a0, 6 a1, 7 abort marker, 8 p2,
    9 c2, 10 commit marker, 11 a2, 12 abort marker; the end (last stable offset) is 13.
    """
    bootstrap = kafka_broker.bootstrap
    topic = kafka_topic("mixed", partitions=1)
    plain(bootstrap, topic, b"p0", b"p1")
    in_transaction(bootstrap, topic, b"c0", b"c1", commit=True)
    settle(bootstrap, topic, 5)
    in_transaction(bootstrap, topic, b"a0", b"a1", commit=False)
    settle(bootstrap, topic, 8)
    plain(bootstrap, topic, b"p2")
    in_transaction(bootstrap, topic, b"c2", commit=True)
    settle(bootstrap, topic, 11)
    in_transaction(bootstrap, topic, b"a2", commit=False)
    settle(bootstrap, topic, 13)
    return topic


def read(reader: KafkaReader, topic: str, start: int, end: int) -> list[tuple[int, bytes]]:
    return [(m.offset(), m.value()) for m in reader.read(topic, 0, start, end)]


def test_read_skips_aborted_records_and_markers_and_stops_at_the_end(
    kafka_broker: Any, mixed_topic: str
) -> None:
    topic = mixed_topic
    with KafkaReader(KafkaConnection(kafka_broker.bootstrap), timeout=20) as reader:
        assert reader.watermarks(topic, 0) == (0, 13)
        started = time.monotonic()
        # The range ends with an aborted transaction and its marker: offsets 11 and 12 are
        # never delivered, and the loop stops by position, not by a count of messages.
        assert read(reader, topic, 0, 13) == [
            (0, b"p0"),
            (1, b"p1"),
            (2, b"c0"),
            (3, b"c1"),
            (8, b"p2"),
            (9, b"c2"),
        ]
        # Ranges that end on a commit marker, on an abort marker, or in the middle.
        assert read(reader, topic, 0, 5) == [(0, b"p0"), (1, b"p1"), (2, b"c0"), (3, b"c1")]
        assert read(reader, topic, 3, 9) == [(3, b"c1"), (8, b"p2")]
        assert read(reader, topic, 2, 3) == [(2, b"c0")]
        assert read(reader, topic, 9, 11) == [(9, b"c2")]
        # Ranges holding no committed record at all read nothing, and end without waiting.
        assert read(reader, topic, 4, 5) == []
        assert read(reader, topic, 5, 8) == []
        assert read(reader, topic, 10, 13) == []
        # Every read above ended by position: none waited for the 20 s stall timeout.
        assert time.monotonic() - started < 15
        batches = list(reader.read_batches(topic, 0, 0, 13))
        assert [m.offset() for b in batches for m in b] == [0, 1, 2, 3, 8, 9]
        assert all(b for b in batches)


def test_read_stops_at_the_end_while_the_partition_grows(
    kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("grow", partitions=1)
    plain(kafka_broker.bootstrap, topic, *[str(i).encode() for i in range(50)])
    with KafkaReader(KafkaConnection(kafka_broker.bootstrap), timeout=10) as reader:
        assert [o for o, _ in read(reader, topic, 10, 20)] == list(range(10, 20))
        # Stopping early leaves the reader usable for the next range.
        first = next(iter(reader.read(topic, 0, 0, 50)))
        assert first.offset() == 0
        plain(kafka_broker.bootstrap, topic, b"later")
        assert [o for o, _ in read(reader, topic, 45, 50)] == list(range(45, 50))
        assert read(reader, topic, 50, 51) == [(50, b"later")]


def test_an_empty_range_reads_nothing_and_asks_no_broker(
    kafka_broker: Any, mixed_topic: str
) -> None:
    with KafkaReader(KafkaConnection(kafka_broker.bootstrap), timeout=5) as reader:
        assert read(reader, mixed_topic, 0, 0) == []
        assert read(reader, mixed_topic, 13, 13) == []
        assert list(reader.read_batches(mixed_topic, 0, 7, 7)) == []
        with pytest.raises(ConfigError, match=r"offsets 5\.\.4"):
            read(reader, mixed_topic, 5, 4)
    # An empty range is answered without the cluster: even an unreachable one.
    with KafkaReader(KafkaConnection("127.0.0.1:1"), timeout=1) as down:
        started = time.monotonic()
        assert read(down, "anything", 3, 3) == []
        assert time.monotonic() - started < 0.5


def test_unreachable_broker_names_the_bootstrap_servers_without_secrets() -> None:
    conn = KafkaConnection(
        "127.0.0.1:1",
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "reader",
            "sasl.password": SECRET,
        },
        retry_s=1,
    )
    with KafkaReader(conn, timeout=1.0) as reader:
        assert SECRET not in repr(reader)
        started = time.monotonic()
        with pytest.raises(KafkaUnavailableError) as info:
            list(reader.read("events", 0, 0, 10))
        assert time.monotonic() - started < 10
        message = str(info.value)
        assert "127.0.0.1:1" in message and "events[0] offsets 0..10" in message
        assert "no progress past offset 0" in message
        assert SECRET not in message
        with pytest.raises(KafkaUnavailableError) as info:
            reader.watermarks("events", 0)
        assert "127.0.0.1:1" in str(info.value) and SECRET not in str(info.value)
    # One hierarchy: the CLI maps every store-unavailable error to exit code 4.
    assert isinstance(info.value, StoreUnavailableError) and info.value.retryable


def test_records_removed_by_retention_are_an_error_not_a_skip(
    kafka_broker: Any, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("gone", partitions=1)
    plain(kafka_broker.bootstrap, topic, *[str(i).encode() for i in range(10)])
    admin = kafka_broker.admin()  # keep a reference: a collected client cancels its futures
    futures = admin.delete_records([KTP(topic, 0, 6)], request_timeout=30)
    for future in futures.values():
        future.result(30)
    with KafkaReader(KafkaConnection(kafka_broker.bootstrap), timeout=10) as reader:
        assert reader.watermarks(topic, 0) == (6, 10)
        with pytest.raises(OffsetOutOfRangeError) as info:
            read(reader, topic, 2, 10)
        err = info.value
        assert (err.topic, err.partition, err.offset, err.log_start) == (topic, 0, 2, 6)
        assert "log now starts at offset 6" in str(err)
        assert [o for o, _ in read(reader, topic, 6, 10)] == [6, 7, 8, 9]
        with pytest.raises(TopicNotFoundError, match="does not exist"):
            reader.watermarks(f"no-such-topic-{uuid.uuid4().hex[:8]}", 0)


def test_consumer_factory_settings_and_bad_config() -> None:
    consumer = new_consumer(KafkaConnection("127.0.0.1:1"))
    consumer.close()
    with pytest.raises(ConfigError, match="isolation level"):
        new_consumer(KafkaConnection("127.0.0.1:1"), isolation_level="read_everything")
    bad = KafkaConnection("127.0.0.1:1", {"no.such.setting": "x", "sasl.password": SECRET})
    with pytest.raises(ConfigError, match="not valid") as info:
        new_consumer(bad)
    assert "no.such.setting" in str(info.value) and SECRET not in str(info.value)
