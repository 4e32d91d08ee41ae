"""The idempotent producer of the embedded log.

Guarantee: **exactly-once delivery** into the log, per producer id. Each
partition's appends carry consecutive sequence numbers; the log stores the last
acknowledged one per (producer id, partition) in the same transaction as the
records, so an append retried after an ambiguous failure (a timeout, a locked
database, a crash before the answer arrived) is a no-op. A restarted producer
with the same id continues after the last acknowledged sequence.

Delivery is not processing: this says a record is in the log once, nothing
about its effect downstream; that is the sinks' job.
"""

from __future__ import annotations

import sqlite3
import time
import zlib
from collections.abc import Iterable

from sparkonce.errors import ConfigError, SinkUnavailableError
from sparkonce.log.storage import AppendResult, NewRecord, Topic

_RETRIES = 5  # an append that hits a locked database is retried this often, 0.2 s apart and up


def partition_for_key(key: bytes, partitions: int) -> int:
    """Deterministic key partitioning (CRC-32 of the key bytes)."""
    return zlib.crc32(key) % partitions


class IdempotentProducer:
    """Buffers records per partition and appends them with sequence numbers.

    Records with a key go to ``crc32(key) % partitions``; records without a
    key go round-robin. ``flush()`` (also called every ``batch_size`` records
    and on close) appends each partition's buffer atomically.
    """

    def __init__(self, topic: Topic, producer_id: str, *, batch_size: int = 5000) -> None:
        if not producer_id or not isinstance(producer_id, str):
            raise ConfigError("producer_id must be a non-empty string")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size}")
        self.topic = topic
        self.producer_id = producer_id
        self.batch_size = batch_size
        seqs = topic.producer_sequences()
        self._next_seq = {p: seqs.get((producer_id, p), -1) + 1 for p in range(topic.partitions)}
        self._buffers: dict[int, list[NewRecord]] = {p: [] for p in range(topic.partitions)}
        self._buffered = 0
        self._rr = 0
        self.sent = 0

    def send(
        self,
        value: bytes | None,
        key: bytes | None = None,
        *,
        partition: int | None = None,
        record_id: str | None = None,
        timestamp_us: int | None = None,
    ) -> int:
        """Buffer one record; returns its partition."""
        if partition is None:
            if key is not None:
                partition = partition_for_key(key, self.topic.partitions)
            else:
                partition = self._rr % self.topic.partitions
                self._rr += 1
        elif not 0 <= partition < self.topic.partitions:
            raise ConfigError(
                f"partition {partition} is out of range for topic {self.topic.name!r} "
                f"(0..{self.topic.partitions - 1})"
            )
        self._buffers[partition].append(NewRecord(value, key, record_id, timestamp_us))
        self._buffered += 1
        if self._buffered >= self.batch_size:
            self.flush()
        return partition

    def send_many(self, items: Iterable[tuple[bytes | None, bytes | None]]) -> None:
        """Buffer many ``(key, value)`` pairs."""
        for key, value in items:
            self.send(value, key)

    def flush(self) -> list[AppendResult]:
        """Append every buffered record; retried appends are no-ops."""
        results = []
        for p, buf in self._buffers.items():
            if not buf:
                continue
            results.append(self._append_with_retry(p, buf, self._next_seq[p]))
            self._next_seq[p] += len(buf)
            self.sent += len(buf)
            self._buffers[p] = []
        self._buffered = 0
        return results

    def _append_with_retry(self, p: int, buf: list[NewRecord], seq: int) -> AppendResult:
        delay = 0.2
        for attempt in range(_RETRIES + 1):
            try:
                return self.topic.append(p, buf, producer_id=self.producer_id, first_seq=seq)
            except sqlite3.OperationalError as exc:
                # Ambiguous failure: the same first_seq makes the retry safe.
                if attempt == _RETRIES:
                    raise SinkUnavailableError(
                        f"append to {self.topic.name}[{p}] failed {attempt + 1} times: {exc}. "
                        "Nothing after the last acknowledged sequence was lost; retry later."
                    ) from exc
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> IdempotentProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
