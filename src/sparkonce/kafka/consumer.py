"""Reading Kafka partitions: the one consumer factory and the one read loop.

Everything in sparkonce that reads Kafka goes through this module: the source
(its offset queries on the driver, its range reads in Spark tasks, its monitoring
commits), the Kafka sink's ledger topic (driver and tasks) and output topic, and
``sparkonce kafka tail``.

:func:`new_consumer` builds every consumer: it never joins a group or commits on
its own (partitions are assigned, ``enable.auto.commit`` is off), reads with
``read_committed`` unless told otherwise, never resets an offset it cannot find
(``auto.offset.reset=error``), and turns a bad client configuration into a
:class:`~sparkonce.errors.ConfigError` whose text has secrets masked.

:meth:`KafkaReader.read` is the read loop. It reads ``[start, end)`` of one
partition and stops when the consumer's **position** reaches ``end``, never after
a count of messages: transaction markers and the records of aborted transactions
take offsets but are never delivered under ``read_committed``, so the last offsets
of a range may never arrive as messages. Errors:

- the cluster does not answer, or the read makes no progress for ``timeout``
  seconds: :class:`~sparkonce.errors.KafkaUnavailableError` naming the bootstrap
  servers, the partition, the range and the last client error (secrets masked);
- the partition no longer holds the offset being read (retention,
  ``delete_records``): :class:`~sparkonce.errors.OffsetOutOfRangeError` with the
  partition's log start offset; nothing is skipped;
- a missing topic or partition (offset queries): :class:`~sparkonce.errors.TopicNotFoundError`.

Transient client errors (a broker restarting, a leader moving) are retried by
librdkafka; the loop logs them at debug level and keeps reading until the timeout.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator, Mapping
from typing import Any

from sparkonce.errors import (
    ConfigError,
    KafkaUnavailableError,
    OffsetOutOfRangeError,
    TopicNotFoundError,
)
from sparkonce.kafka.client import TIMEOUT_S, TRANSIENT, KafkaConnection, classify, scrub
from sparkonce.kafka.producer import require_confluent_kafka

__all__ = [
    "ISOLATION_LEVELS",
    "READER_GROUP",
    "KafkaReader",
    "new_consumer",
]

log = logging.getLogger(__name__)

# librdkafka wants a group.id even for an assign()-only consumer; it is never joined, and
# nothing is committed to it.
READER_GROUP = "sparkonce-reader"
ISOLATION_LEVELS = ("read_committed", "read_uncommitted")
# consume() waits for the messages it asked for or for its timeout. The end of a range is
# often a transaction marker, which consume() never returns, so the last call of a read
# waits out its timeout: the wait starts short and doubles while nothing moves.
POLL_MIN_S = 0.002
POLL_S = 0.05  # the longest wait of one consume() call
CONSUME_MAX = 10_000  # messages per consume() call


def new_consumer(
    conn: KafkaConnection,
    *,
    group: str = READER_GROUP,
    isolation_level: str = "read_committed",
    settings: Mapping[str, Any] | None = None,
) -> Any:
    """A confluent-kafka consumer for ``conn`` that never commits on its own.

    ``group`` is only used by callers that commit offsets explicitly (the source's
    lag monitoring); readers assign partitions and never join it. The connection's
    client config (security settings...) applies; the settings below override it, and
    ``settings`` (librdkafka's names) override those.
    """
    if isolation_level not in ISOLATION_LEVELS:
        raise ConfigError(
            f"Kafka isolation level {isolation_level!r} is not one of {', '.join(ISOLATION_LEVELS)}"
        )
    ck = require_confluent_kafka()
    conf = conn.client_config()
    conf.update(
        {
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "isolation.level": isolation_level,
            "auto.offset.reset": "error",
            "enable.partition.eof": False,
        }
    )
    conf.update(settings or {})
    try:
        return ck.Consumer(conf)
    except (ck.KafkaException, ValueError) as exc:
        raise ConfigError(
            f"the Kafka client configuration for {conn.bootstrap} is not valid: "
            f"{scrub(str(exc), conn.config)}"
        ) from None


def _error_code(exc: BaseException) -> int | None:
    err = exc.args[0] if exc.args else None
    code = getattr(err, "code", None)
    return code() if callable(code) else None


class KafkaReader:
    """One consumer (from :func:`new_consumer`) and what sparkonce does with it.

    :meth:`watermarks` asks for a partition's offsets; :meth:`read` and
    :meth:`read_batches` read a range (see the module docstring). ``timeout`` (seconds)
    bounds each offset query and is the default stall timeout of reads. Use it as a
    context manager, or call :meth:`close`. Not thread-safe; never pickled.
    """

    def __init__(
        self,
        conn: KafkaConnection,
        *,
        timeout: float = TIMEOUT_S,
        isolation_level: str = "read_committed",
        settings: Mapping[str, Any] | None = None,
    ) -> None:
        self.conn = conn
        self.timeout = timeout
        self.isolation_level = isolation_level
        self.consumer: Any = new_consumer(conn, isolation_level=isolation_level, settings=settings)
        self._closed = False

    def __repr__(self) -> str:
        return f"KafkaReader({self.conn!r}, isolation_level={self.isolation_level})"

    def __enter__(self) -> KafkaReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def release(self) -> None:
        """Drop the partition a read assigned, so a consumer kept between reads does not
        go on fetching in the background (a failure is ignored: the next read assigns
        anew)."""
        with contextlib.suppress(Exception):
            self.consumer.unassign()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.consumer.close()

    def watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """(log start offset, end offset) of ``topic[partition]``, asked of the broker now.

        The end is the last stable offset under ``read_committed`` (records of open
        transactions are not counted), the high watermark under ``read_uncommitted``.
        Transient errors (no broker answered, the leader moved) are retried until the
        connection's ``retry_s`` deadline (:meth:`KafkaConnection.retrying`).
        """
        return self.conn.retrying(
            f"querying offsets of {topic}[{partition}]",
            lambda: self._watermarks_once(topic, partition),
        )

    def _watermarks_once(self, topic: str, partition: int) -> tuple[int, int]:
        ck = require_confluent_kafka()
        try:
            low, high = self.consumer.get_watermark_offsets(
                ck.TopicPartition(topic, partition), timeout=self.timeout, cached=False
            )
        except ck.KafkaException as exc:
            if _error_code(exc) in (
                ck.KafkaError.UNKNOWN_TOPIC_OR_PART,
                ck.KafkaError._UNKNOWN_TOPIC,
                ck.KafkaError._UNKNOWN_PARTITION,
            ) and not self._partition_listed(topic, partition):
                raise TopicNotFoundError(
                    f"Kafka topic {topic!r} partition {partition} does not exist at "
                    f"{self.conn.bootstrap} (was the topic deleted?)"
                ) from None
            error = self.conn.unavailable(f"querying offsets of {topic}[{partition}]", exc)
            if error.kind in TRANSIENT:
                self._refresh_metadata(topic)
            raise error from None
        return int(low), int(high)

    def _refresh_metadata(self, topic: str) -> None:
        """Ask the cluster for ``topic``'s metadata now, so that the next query goes to its
        current leader: a consumer with nothing assigned keeps a dead leader in its metadata
        cache for minutes (``topic.metadata.refresh.interval.ms``), and every offset query
        sent there times out."""
        with contextlib.suppress(Exception):  # best effort: the retry reports what fails
            self.consumer.list_topics(topic, timeout=min(self.timeout, 5.0))

    def _partition_listed(self, topic: str, partition: int) -> bool:
        """Whether the cluster's metadata, read now, lists ``topic[partition]``.

        librdkafka also says "unknown partition" when it has lost its brokers (its
        metadata cache is gone): a topic is missing only if the cluster answered without
        it. Raises KafkaUnavailableError when the metadata cannot be read.
        """
        ck = require_confluent_kafka()
        try:
            meta = self.consumer.list_topics(topic, timeout=self.timeout)
        except ck.KafkaException as exc:
            raise self.conn.unavailable(f"reading the metadata of {topic}", exc) from None
        found = meta.topics.get(topic)
        if not meta.brokers:
            raise self.conn.unavailable(f"reading the metadata of {topic} (no broker listed)")
        return found is not None and found.error is None and partition in found.partitions

    def read(
        self, topic: str, partition: int, start: int, end: int, *, timeout: float | None = None
    ) -> Iterator[Any]:
        """The records of ``topic[partition]`` offsets ``start..end`` (end excluded), in order.

        Yields confluent-kafka ``Message`` objects; see :meth:`read_batches`.
        """
        for batch in self.read_batches(topic, partition, start, end, timeout=timeout):
            yield from batch

    def read_batches(
        self, topic: str, partition: int, start: int, end: int, *, timeout: float | None = None
    ) -> Iterator[list[Any]]:
        """The records of ``topic[partition]`` offsets ``start..end`` in lists, as fetched.

        Stops once the consumer's position reaches ``end`` (records at or past ``end``
        are not yielded). ``end`` must not exceed the partition's end offset (its last
        stable offset under ``read_committed``), or the read stalls until ``timeout``:
        the seconds without progress before :class:`KafkaUnavailableError` (default:
        this reader's timeout). An empty range reads nothing and asks the broker nothing.
        """
        if start < 0 or end < start:
            raise ConfigError(
                f"cannot read {topic}[{partition}] offsets {start}..{end}: "
                "the range must satisfy 0 <= start <= end"
            )
        if start == end:
            return
        ck = require_confluent_kafka()
        # Transient errors (a broker restarting, a leader moving) are ridden out like a stall.
        stall_s = max(self.timeout, self.conn.retry_s) if timeout is None else timeout
        where = f"{topic}[{partition}] offsets {start}..{end}"
        tp = ck.TopicPartition(topic, partition)
        consumer = self.consumer
        pos = start
        last_error: str | None = None
        try:
            consumer.assign([ck.TopicPartition(topic, partition, start)])
        except ck.KafkaException as exc:
            raise self.conn.unavailable(f"reading {where}", exc) from None
        progress_at = time.monotonic()
        wait = POLL_MIN_S
        while pos < end:
            records: list[Any] = []
            seen = pos
            try:
                # Ask for no more than the range can still hold, so a range without markers
                # returns without waiting.
                messages = consumer.consume(num_messages=min(CONSUME_MAX, end - pos), timeout=wait)
                for m in messages:
                    err = m.error()
                    if err is not None:
                        last_error = self._check(err, topic, partition, where, pos) or last_error
                        continue
                    if m.topic() != topic or m.partition() != partition:
                        continue  # left over from an earlier assignment
                    offset = m.offset()
                    seen = max(seen, offset + 1)
                    if start <= offset < end:
                        records.append(m)
                # Offsets without records (markers, aborted records) move only the position.
                position = consumer.position([tp])[0].offset
            except ck.KafkaException as exc:
                if classify(exc) not in TRANSIENT:
                    raise self.conn.unavailable(f"reading {where}", exc) from None
                # The records received before the error are kept (and yielded below).
                last_error = scrub(str(exc), self.conn.config)
                position = pos
            new_pos = max(pos, seen, position)
            if new_pos > pos:
                pos = new_pos
                progress_at = time.monotonic()
                wait = POLL_MIN_S
            elif time.monotonic() - progress_at > stall_s:
                detail = f" (last client error: {last_error})" if last_error else ""
                raise self.conn.unavailable(
                    f"reading {where}: no progress past offset {pos} for {stall_s:g} s{detail}",
                    kind=self._kind(last_error),
                )
            else:
                wait = min(POLL_S, wait * 2)
            if records:
                yield records
                progress_at = time.monotonic()  # the caller's time is not a stall

    @staticmethod
    def _kind(last_error: str | None) -> str | None:
        """What a stalled read's last client error says (None: no answer, the default)."""
        if last_error and any(
            name in last_error.lower()
            for name in ("leader", "not_leader", "broker handle destroyed", "replica")
        ):
            return "leader moved"
        return None

    def _check(self, err: Any, topic: str, partition: int, where: str, pos: int) -> str | None:
        """Raise for an error event that ends the read; return the text of a transient one."""
        ck = require_confluent_kafka()
        code = err.code()
        if code == ck.KafkaError._PARTITION_EOF:
            return None  # not an error (and off in new_consumer): the position tells the end
        text = scrub(err.str(), self.conn.config)
        if code in (ck.KafkaError._AUTO_OFFSET_RESET, ck.KafkaError.OFFSET_OUT_OF_RANGE):
            raise self._out_of_range(topic, partition, where, pos, text)
        if err.fatal():
            raise self.conn.unavailable(f"reading {where}: fatal Kafka client error {text}")
        # Transient (broker restarting, leader moved): librdkafka retries; the stall timeout
        # ends the read if it never recovers.
        log.debug("reading %s at offset %d: %s", where, pos, text)
        return text

    def _out_of_range(
        self, topic: str, partition: int, where: str, pos: int, text: str
    ) -> OffsetOutOfRangeError:
        try:
            log_start: int | None = self.watermarks(topic, partition)[0]
        except (KafkaUnavailableError, TopicNotFoundError):
            log_start = None
        if log_start is not None and pos < log_start:
            why = (
                f"the partition's log now starts at offset {log_start}: retention (or "
                "delete_records) removed the records before they were read"
            )
        else:
            why = text
        return OffsetOutOfRangeError(
            f"cannot read {where} at offset {pos} from Kafka at {self.conn.bootstrap}: {why}",
            topic=topic,
            partition=partition,
            offset=pos,
            log_start=log_start,
        )
