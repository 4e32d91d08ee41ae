"""Read-only views of a Kafka topic for the CLI: committed offsets and the last records.

Both read at isolation level ``read_committed``: the end offset of a partition is
its last stable offset (records of open transactions are not counted), and
records of aborted transactions are never shown.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sparkonce.errors import ConfigError
from sparkonce.kafka.client import TIMEOUT_S, KafkaConnection
from sparkonce.kafka.consumer import KafkaReader
from sparkonce.kafka.producer import RECORD_ID_HEADER, require_confluent_kafka


@dataclass(frozen=True)
class PartitionOffsets:
    """``start``: the log start offset; ``end``: the committed (read_committed) end offset."""

    partition: int
    start: int
    end: int


@dataclass(frozen=True)
class KafkaRecord:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    record_id: str | None  # the sparkonce-record-id header, if the record has one
    timestamp_ms: int | None


def partition_offsets(
    conn: KafkaConnection, topic: str, timeout: float = TIMEOUT_S
) -> list[PartitionOffsets]:
    """Log start and committed end offset of every partition of ``topic``."""
    ck = require_confluent_kafka()
    from confluent_kafka.admin import OffsetSpec

    count = conn.partitions(topic, timeout)
    parts = [ck.TopicPartition(topic, p) for p in range(count)]
    admin = conn.admin()  # keep a reference: a collected client cancels its futures
    found: dict[str, dict[int, int]] = {}
    for name, spec in (("start", OffsetSpec.earliest()), ("end", OffsetSpec.latest())):
        futures = admin.list_offsets(
            {tp: spec for tp in parts},
            isolation_level=ck.IsolationLevel.READ_COMMITTED,
            request_timeout=timeout,
        )
        found[name] = {}
        for tp, future in futures.items():
            try:
                found[name][tp.partition] = int(future.result(timeout=timeout).offset)
            except (ck.KafkaException, TimeoutError) as exc:
                raise conn.unavailable(f"listing offsets of {topic}[{tp.partition}]", exc) from None
    return [PartitionOffsets(p, found["start"][p], found["end"][p]) for p in range(count)]


def tail(
    conn: KafkaConnection,
    topic: str,
    limit: int = 10,
    *,
    partition: int | None = None,
    timeout: float = TIMEOUT_S,
) -> Iterator[KafkaRecord]:
    """The last ``limit`` committed records of one or every partition, oldest first.

    Aborted transactions and transaction markers take offsets too, so a partition
    may show fewer than ``limit`` records.
    """
    if limit < 1:
        raise ConfigError(f"the number of records (-n) must be >= 1, got {limit}")
    ck = require_confluent_kafka()
    offsets = partition_offsets(conn, topic, timeout)
    if partition is not None:
        if not 0 <= partition < len(offsets):
            raise ConfigError(
                f"partition {partition} is out of range for Kafka topic {topic!r} "
                f"(0..{len(offsets) - 1})"
            )
        offsets = [offsets[partition]]
    with KafkaReader(conn, timeout=timeout) as reader:
        for po in offsets:
            first = max(po.start, po.end - limit)
            for m in reader.read(topic, po.partition, first, max(first, po.end)):
                rid = next((v for k, v in m.headers() or [] if k == RECORD_ID_HEADER), None)
                ts_type, ts = m.timestamp()
                yield KafkaRecord(
                    po.partition,
                    int(m.offset()),
                    m.key(),
                    m.value(),
                    rid.decode("utf-8", errors="replace") if rid is not None else None,
                    ts if ts_type != ck.TIMESTAMP_NOT_AVAILABLE else None,
                )
