"""An idempotent Kafka producer for writing a pipeline's input.

Guarantee: **exactly-once delivery** into the Kafka topic, *per producer
session*. The producer runs with ``enable.idempotence=true`` and ``acks=all``:
the broker gives the session a producer id, every record carries a sequence
number per partition, and the broker drops a retried duplicate (a resend after
a timeout or a lost acknowledgement) by producer id plus sequence number. Order
within a partition is kept across those retries.

That protection ends with the session. A producer process that restarts and
re-sends records gets a **new** producer id, so the broker cannot recognise
them: re-sent records are duplicates in the log, unless the application
deduplicates them by record id. Give each logical record a stable id with
``send(..., record_id=...)``; it travels in the ``sparkonce-record-id`` header,
which a Kafka source exposes to the pipeline.

A failed delivery is never dropped silently: :meth:`KafkaProducer.flush` raises
:class:`KafkaDeliveryError` naming the records that failed. A record reported
as failed after a timeout may still have reached the log (a failed call may
have succeeded), so resend it only where readers deduplicate by record id.

Delivery is not processing: this says a record is in the log once, nothing
about its effect downstream; that is the sinks' job.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from sparkonce.errors import ConfigError, SparkOnceError
from sparkonce.kafka.client import TIMEOUT_S, KafkaConnection

if TYPE_CHECKING:  # pragma: no cover
    from confluent_kafka import KafkaError, Message

RECORD_ID_HEADER = "sparkonce-record-id"
FLUSH_TIMEOUT_S = 30.0
_QUEUE_FULL_TIMEOUT_S = 30.0  # send() waits this long for room in librdkafka's local queue
# Settings the guarantee rests on: the producer sets them and refuses other values.
_FIXED = {"enable.idempotence": ("true",), "acks": ("all", "-1")}
_SHOWN_FAILURES = 5
_log = logging.getLogger("sparkonce.kafka.producer")


def require_confluent_kafka() -> ModuleType:
    """The ``confluent_kafka`` module, or a ConfigError saying how to install it."""
    try:
        import confluent_kafka as ck
    except ImportError:  # pragma: no cover - the dev environment has it
        raise ConfigError(
            "Kafka support needs the confluent-kafka package: pip install 'sparkonce[kafka]'"
        ) from None
    return ck


@dataclass(frozen=True)
class DeliveryFailure:
    """One record Kafka did not acknowledge."""

    record_id: str | None
    key: bytes | None
    partition: int | None  # the partition asked for, or the one the partitioner chose
    error: str
    code: int
    retriable: bool

    def describe(self) -> str:
        where = f"partition {self.partition}" if self.partition is not None else "no partition"
        rid = f"record id {self.record_id!r}" if self.record_id is not None else "no record id"
        key = f", key {self.key[:40]!r}" if self.key is not None else ""
        return f"{rid} ({where}{key}): {self.error}"


class KafkaDeliveryError(SparkOnceError):
    """Kafka refused or did not acknowledge some records.

    ``failures`` lists them (record id, key, partition, error); ``delivered``
    counts the records acknowledged in the same flush. ``retryable`` is True
    when every failure is one Kafka calls retriable.
    """

    def __init__(
        self,
        topic: str,
        bootstrap: str,
        failures: list[DeliveryFailure],
        *,
        delivered: int = 0,
        pending: int = 0,
        fatal: str | None = None,
    ) -> None:
        self.topic = topic
        self.failures = failures
        self.delivered = delivered
        self.pending = pending
        self.fatal = fatal
        self.retryable = fatal is None and bool(failures) and all(f.retriable for f in failures)
        shown = "; ".join(f.describe() for f in failures[:_SHOWN_FAILURES])
        more = (
            f"; and {len(failures) - _SHOWN_FAILURES} more"
            if len(failures) > _SHOWN_FAILURES
            else ""
        )
        parts = [
            ("1 record was" if len(failures) == 1 else f"{len(failures)} records were")
            + f" not delivered to Kafka topic {topic!r} at "
            f"{bootstrap} ({delivered} delivered"
            + (f", {pending} still unacknowledged" if pending else "")
            + ")"
            + (f": {shown}{more}" if failures else "")
            + "."
        ]
        if fatal is not None:
            parts.append(
                f"The producer hit a fatal error ({fatal}) and cannot send any more; "
                "open a new KafkaProducer."
            )
        parts.append(
            "A failed record may still be in the log if it timed out; resending it from a new "
            f"producer session makes a duplicate unless readers deduplicate by record id "
            f"(header {RECORD_ID_HEADER!r})."
        )
        super().__init__(" ".join(parts))


def _as_bytes(name: str, value: bytes | str | None) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise ConfigError(f"{name} must be bytes or str, got {type(value).__name__}")


class KafkaProducer:
    """Sends records to one Kafka topic with the idempotent producer.

    ``client_config`` holds extra librdkafka settings (security, linger,
    ``message.timeout.ms``...); secret values are never shown. Records with a
    key go to the partition Java clients would choose (``murmur2_random``:
    murmur2 of the key bytes); records without a key go to a random partition.
    The topic must exist: opening checks it (:class:`TopicNotFoundError`) and
    that the cluster answers within ``timeout`` seconds
    (:class:`KafkaUnavailableError`, naming the bootstrap servers).

    Use it as a context manager; leaving the block flushes::

        with KafkaProducer("broker:9092", "events") as producer:
            producer.send(b"42", key="user-7", record_id="order-1001")
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_config: Mapping[str, Any] | None = None,
        timeout: float = TIMEOUT_S,
    ) -> None:
        if not isinstance(topic, str) or not topic:
            raise ConfigError("topic must be a non-empty string")
        extra = dict(client_config or {})
        for name, allowed in _FIXED.items():
            if name in extra and str(extra[name]).lower() not in allowed:
                raise ConfigError(
                    f"client_config sets {name}={extra[name]!r}, but the idempotent producer "
                    f"needs {name}={allowed[0]}; leave it out"
                )
            extra.pop(name, None)
        if "transactional.id" in extra:
            raise ConfigError(
                "client_config sets transactional.id: KafkaProducer is idempotent, not "
                "transactional; leave it out"
            )
        ck = require_confluent_kafka()
        self.connection = KafkaConnection(bootstrap_servers, extra)
        self.topic = topic
        self.partitions = self.connection.partitions(topic, timeout)
        conf = self.connection.client_config(
            enable_idempotence=True, acks="all", partitioner="murmur2_random"
        )
        conf.setdefault("client.id", "sparkonce-producer")
        conf["error_cb"] = self._on_error
        try:
            self._producer: Any = ck.Producer(conf)
        except ck.KafkaException as exc:
            raise ConfigError(f"bad Kafka client_config for topic {topic!r}: {exc}") from None
        self._failures: list[DeliveryFailure] = []
        self._fatal: str | None = None
        self._reported = 0
        self.delivered = 0
        """Records acknowledged by the broker since this producer opened."""
        self.failed = 0
        """Records whose delivery failed since this producer opened."""

    @property
    def bootstrap_servers(self) -> str:
        return self.connection.bootstrap

    def __repr__(self) -> str:
        return f"KafkaProducer({self.connection!r}, topic={self.topic!r})"

    # -- callbacks (run inside poll/flush, on the calling thread) --------------------------
    def _on_error(self, err: KafkaError) -> None:
        if err.fatal():
            self._fatal = err.str()
            _log.error("Kafka producer for %r: fatal error: %s", self.topic, err.str())
        else:
            _log.warning("Kafka producer for %r: %s", self.topic, err.str())

    def _delivery_callback(
        self, record_id: str | None, key: bytes | None, partition: int | None
    ) -> Any:
        def on_delivery(err: KafkaError | None, msg: Message | None) -> None:
            if err is None:
                self.delivered += 1
                return
            self.failed += 1
            chosen = msg.partition() if msg is not None else None
            self._failures.append(
                DeliveryFailure(
                    record_id,
                    key,
                    partition if partition is not None else chosen,
                    err.str(),
                    err.code(),
                    err.retriable(),
                )
            )

        return on_delivery

    # -- API --------------------------------------------------------------------------------
    def send(
        self,
        value: bytes | str,
        key: bytes | str | None = None,
        *,
        record_id: str | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Queue one record; ``flush()`` says whether it was delivered.

        ``record_id`` (the logical record's stable id) goes in the
        ``sparkonce-record-id`` header. ``partition`` overrides the key
        partitioner. ``timestamp_ms`` sets the record's timestamp (milliseconds since
        the epoch; default: now): a producer re-sending a record gives it the original's,
        so that it keeps its event time. A record Kafka refuses at once (an unknown partition once
        the producer knows the topic, a fatal producer error) raises
        :class:`KafkaDeliveryError` here and is not queued.
        """
        if self._producer is None:
            raise ConfigError(f"the KafkaProducer for topic {self.topic!r} is closed")
        value_b = _as_bytes("value", value)
        if value_b is None:
            raise ConfigError("value must be bytes or str, got None")
        key_b = _as_bytes("key", key)
        if record_id is not None and (not isinstance(record_id, str) or not record_id):
            raise ConfigError(f"record_id must be a non-empty string, got {record_id!r}")
        if partition is not None and (isinstance(partition, bool) or partition < 0):
            raise ConfigError(f"partition must be >= 0, got {partition!r}")
        if timestamp_ms is not None and (
            isinstance(timestamp_ms, bool) or not isinstance(timestamp_ms, int) or timestamp_ms < 0
        ):
            raise ConfigError(
                f"timestamp_ms must be milliseconds since the epoch (an integer >= 0), "
                f"got {timestamp_ms!r}"
            )
        headers = [(RECORD_ID_HEADER, record_id.encode("utf-8"))] if record_id else None
        kwargs: dict[str, Any] = {} if partition is None else {"partition": partition}
        if timestamp_ms is not None:
            kwargs["timestamp"] = timestamp_ms
        on_delivery = self._delivery_callback(record_id, key_b, partition)
        ck = require_confluent_kafka()
        deadline: float | None = None
        while True:
            try:
                self._producer.produce(
                    self.topic,
                    value_b,
                    key_b,
                    on_delivery=on_delivery,
                    headers=headers,
                    **kwargs,
                )
                break
            except BufferError:
                # librdkafka's local queue is full: serve delivery reports until there is room.
                now = time.monotonic()
                deadline = deadline if deadline is not None else now + _QUEUE_FULL_TIMEOUT_S
                if now >= deadline:
                    raise self.connection.unavailable(
                        f"accepting records for topic {self.topic!r} (the local queue stayed "
                        f"full for {_QUEUE_FULL_TIMEOUT_S:.0f} s; {len(self._producer)} "
                        "records unacknowledged)"
                    ) from None
                self._producer.poll(0.1)
            except ck.KafkaException as exc:
                err = exc.args[0] if exc.args else None
                text = err.str() if err is not None else str(exc)
                failure = DeliveryFailure(
                    record_id,
                    key_b,
                    partition,
                    text,
                    err.code() if err is not None else -1,
                    bool(err is not None and err.retriable()),
                )
                self.failed += 1
                raise KafkaDeliveryError(
                    self.topic, self.bootstrap_servers, [failure], fatal=self._fatal
                ) from None
        self._producer.poll(0)

    def flush(self, timeout: float = FLUSH_TIMEOUT_S) -> int:
        """Wait up to ``timeout`` s for every queued record's acknowledgement.

        Returns how many records were delivered since the previous ``flush``
        (or since opening). Raises :class:`KafkaDeliveryError` if any record
        failed since then (each failure is reported once), and
        :class:`KafkaUnavailableError` if records are still unacknowledged when
        the time is up (they stay queued: call ``flush`` again to keep waiting).
        """
        if self._producer is None:
            return 0
        pending = int(self._producer.flush(timeout))
        failures, self._failures = self._failures, []
        delivered = self.delivered - self._reported
        self._reported = self.delivered
        if failures or self._fatal is not None:
            raise KafkaDeliveryError(
                self.topic,
                self.bootstrap_servers,
                failures,
                delivered=delivered,
                pending=pending,
                fatal=self._fatal,
            )
        if pending:
            raise self.connection.unavailable(
                f"acknowledging records for topic {self.topic!r}: {pending} records are still "
                f"unacknowledged after {timeout:g} s ({delivered} delivered). They stay queued; "
                "call flush() again to keep waiting"
            )
        return delivered

    def close(self, timeout: float = FLUSH_TIMEOUT_S) -> None:
        """Flush, then release the client. Records still unacknowledged after ``timeout`` s
        keep the producer open (the error says so), so that a later ``close`` can retry."""
        if self._producer is None:
            return
        try:
            self.flush(timeout)
        finally:
            if len(self._producer) == 0:
                self._producer.close()
                self._producer = None

    def __enter__(self) -> KafkaProducer:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        # The block failed: still deliver (or report) what was sent, without hiding its error.
        try:
            self.close()
        except SparkOnceError as close_exc:
            _log.error("while closing after an error: %s", close_exc)
