"""The ledger of a Kafka sink: owner epochs and batch entries in a ledger topic.

The ledger topic (``<topic>.sparkonce-ledger`` for :class:`~sparkonce.sinks.kafka.KafkaSink`:
one partition, kept forever, created when missing) holds JSON records, read with
``read_committed`` and folded per pipeline (:class:`LedgerTopic`)::

    {"type": "owner",  "pipeline", "epoch", "holder", "source", "at"}
    {"type": "batch",  "pipeline", "seq", "ranges", "epoch", "rows", "spark_batch_id",
                       "checkpoint_id", "stateful", "commit_seconds", "at", ...}
    {"type": "marker", "pipeline", "partition", "seq", "ranges", ...}   (written by tasks)

:class:`KafkaLedgerStore` is the :class:`~sparkonce.ledger.base.LedgerStore` the
committer uses. Everything in it runs on the **driver**. Owner and batch records
are written by the driver's transactional producer, whose ``transactional.id``
``sparkonce.<pipeline>.<topic>.driver`` is the same for every run of a pipeline:
``acquire`` calls ``init_transactions()`` before it reads the ledger, which fences
every older run's producer (take over by writing before reading). A fenced run's
commit therefore fails at step 5 even if its step 1 passed: that is the "lock" that
step 1 holds until the transaction ends.

Errors: a fenced producer raises :class:`~sparkonce.errors.FencedError`; any other
Kafka failure raises :class:`~sparkonce.errors.KafkaUnavailableError`, which
explains itself and is not retried by the committer (``is_connection_error`` is
False). A retry would need a new driver producer, and its ``init_transactions()``
would fence whichever producer holds the id now, perhaps a newer run's: the run
stops instead, and the next run's ``acquire`` starts over.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkonce.config import check_pipeline_name
from sparkonce.errors import FencedError, SparkOnceError
from sparkonce.kafka.client import KafkaConnection
from sparkonce.kafka.consumer import KafkaReader
from sparkonce.ledger.base import BatchContext, LedgerEntry, LedgerStore, Owner
from sparkonce.offsets import BatchRanges

TIMEOUT_S = 30.0  # seconds: reading the ledger topic, initializing and committing transactions
_FENCED_CODES = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED")


def transactional_id(pipeline: str, topic: str, partition: int | str) -> str:
    """The ``transactional.id`` of a task's (``partition``) or the driver's producer."""
    return f"sparkonce.{pipeline}.{topic}.{partition}"


def is_fenced(exc: BaseException) -> bool:
    """Whether a producer error says a newer producer with the same id fenced this one.

    Follows the exception's causes: a fenced producer's ``flush()`` raises a
    ``SystemError`` caused by the fatal ``KafkaException`` (_FENCED) when a delivery
    callback runs while that error is pending.
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        err = current.args[0] if current.args else None
        name = getattr(err, "name", lambda: "")()
        if any(code in str(name) for code in _FENCED_CODES) or "fenced" in str(current).lower():
            return True
        current = current.__cause__ or current.__context__
    return False


# --- reading the ledger topic ---------------------------------------------------------------


@dataclass
class LedgerState:
    """What the ledger topic says about one pipeline, folded from its records."""

    owner: Owner | None = None
    entries: list[LedgerEntry] = field(default_factory=list)
    after_last_entry: int = 0  # ledger offset just after the last batch entry
    # Every task marker written after the last batch entry, in ledger order: a partly
    # committed batch's, or a fenced (zombie) attempt's that came too late.
    pending: list[dict[str, Any]] = field(default_factory=list)


class LedgerTopic:
    """Reads and folds the ledger topic (``read_committed``) from an offset onwards.

    Used on the driver and in Spark tasks (which read their markers).
    """

    def __init__(self, conn: KafkaConnection, topic: str) -> None:
        self.conn = conn
        self.topic = topic

    def read(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Committed ledger records from ``start`` to the last stable offset, and that offset.

        Reads with the shared loop (:meth:`~sparkonce.kafka.consumer.KafkaReader.read`):
        ``read_committed``, so records of aborted transactions never appear, and the read
        ends at the last stable offset even though the last offsets are commit markers.
        """
        with KafkaReader(self.conn, timeout=TIMEOUT_S) as reader:
            low, high = reader.watermarks(self.topic, 0)
            pos = max(start, low)
            records: list[dict[str, Any]] = []
            for m in reader.read(self.topic, 0, pos, max(pos, high)):
                record = json.loads(m.value() or b"{}")
                record["_offset"] = m.offset()
                records.append(record)
            return records, max(pos, high)

    @staticmethod
    def fold(state: LedgerState, pipeline: str, records: list[dict[str, Any]]) -> LedgerState:
        for r in records:
            if r.get("pipeline") != pipeline:
                continue
            kind = r.get("type")
            if kind == "owner":
                state.owner = Owner(
                    pipeline,
                    int(r["epoch"]),
                    datetime.fromisoformat(r["at"]),
                    r.get("holder", ""),
                    r.get("source"),
                )
            elif kind == "batch":
                state.entries.append(
                    LedgerEntry(
                        pipeline,
                        int(r["seq"]),
                        BatchRanges.from_json_obj(r["ranges"]),
                        int(r["epoch"]),
                        int(r["rows"]),
                        datetime.fromisoformat(r["at"]),
                        r.get("spark_batch_id"),
                        r.get("checkpoint_id"),
                        r.get("stateful"),
                        r.get("commit_seconds"),
                    )
                )
                state.after_last_entry = int(r.get("_offset", -1)) + 1
                state.pending = []
            elif kind == "marker":
                state.pending.append(r)
        return state


# --- the ledger store (driver side) -----------------------------------------------------------


@dataclass
class KafkaLedgerTxn:
    """The driver's Kafka transaction on the ledger topic, begun by its first record.

    ``extra`` holds more fields for the batch record (the stager's, e.g. task counts).
    """

    producer: Any = None  # the driver's producer, once the transaction has begun
    pipeline: str = ""
    written: list[int] = field(default_factory=list)  # ledger offsets produced (-1: failed)
    extra: dict[str, Any] = field(default_factory=dict)


class KafkaLedgerStore(LedgerStore):
    """Owner epochs and the batch ledger in a Kafka ledger topic (see the module docstring).

    ``topic`` names the output topic, part of the producers' ``transactional.id``.
    ``inspect_hint`` is the command that shows a pipeline's owner (``{pipeline}`` is
    filled in), for :class:`~sparkonce.errors.FencedError`.

    ``transaction()`` yields a :class:`KafkaLedgerTxn`. The Kafka transaction begins
    with the first record (a transaction that records nothing writes nothing);
    leaving the block commits it and waits until ``read_committed`` readers see the
    record; an error inside the block aborts it.
    """

    def __init__(
        self,
        conn: KafkaConnection,
        ledger_topic: str,
        *,
        topic: str,
        transaction_timeout_ms: int = 60_000,
        inspect_hint: str = "",
    ) -> None:
        self.conn = conn
        self.ledger_topic = ledger_topic
        self.topic = topic
        self.transaction_timeout_ms = transaction_timeout_ms
        self.inspect_hint = inspect_hint
        self._ledger = LedgerTopic(conn, ledger_topic)
        self._states: dict[str, LedgerState] = {}
        self._position = 0  # ledger offset read so far
        self._records: list[dict[str, Any]] = []
        self._driver: Any = None  # transactional producer of the current run
        self._driver_pipeline: str | None = None
        self._epoch: int | None = None
        self._opened = False

    # -- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Create the ledger topic if missing (one partition, kept forever)."""
        if self._opened:
            return
        self.conn.ensure_topic(self.ledger_topic, 1, config={"retention.ms": "-1"})
        self._opened = True

    def close(self) -> None:
        if self._driver is not None:
            self._driver.flush(5)
            self._driver = None
        self._opened = False

    def forget(self) -> None:
        """Drop what was read and the driver's producer (after the topic was emptied)."""
        self._states.clear()
        self._records.clear()
        self._position = 0
        self._driver = None

    def describe(self) -> str:
        return f"Kafka ledger topic {self.ledger_topic!r} at {self.conn.bootstrap}"

    def _hint(self, pipeline: str) -> str:
        return self.inspect_hint.replace("{pipeline}", pipeline)

    # -- the ledger, folded -----------------------------------------------------------
    def refresh(self, pipeline: str) -> LedgerState:
        """Fold the ledger records written since the last read into every pipeline's state."""
        if not self._opened:
            self.open()
        self._read_new()
        if pipeline not in self._states:
            self._states[pipeline] = LedgerTopic.fold(LedgerState(), pipeline, self._records)
        return self._states[pipeline]

    def _read_new(self) -> None:
        """Read the ledger records written since the last read; fold them into every
        pipeline's state read so far."""
        new, self._position = self._ledger.read(self._position)
        self._records.extend(new)
        for name, st in self._states.items():
            LedgerTopic.fold(st, name, new)

    def pipelines(self) -> list[str]:
        """Every pipeline that took an epoch in this ledger topic, in the order of their
        first epoch (reads the records written since the last read)."""
        if not self._opened:
            self.open()
        self._read_new()
        owners = (r.get("pipeline") for r in self._records if r.get("type") == "owner")
        return [str(name) for name in dict.fromkeys(owners) if name]

    def folded(self, pipeline: str) -> LedgerState:
        """The state as last read (read now if this pipeline was never read)."""
        state = self._states.get(pipeline)
        return state if state is not None else self.refresh(pipeline)

    def _await_visible(self, offset: int) -> None:
        """Wait until read_committed readers see the ledger up to ``offset``.

        The last stable offset moves only once the coordinator has written the
        transaction markers, a moment after ``commit_transaction`` returns.
        """
        deadline = time.monotonic() + TIMEOUT_S
        while offset >= 0 and time.monotonic() < deadline:
            self._read_new()
            if self._position > offset:
                return
            time.sleep(0.05)
        if offset >= 0:
            raise self.conn.unavailable(f"waiting for ledger offset {offset} to become readable")

    # -- outside a commit -------------------------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take ``epoch + 1``: fence older runs' producers first, then read, then write."""
        check_pipeline_name(pipeline)
        self._driver = None
        self._driver_producer(pipeline)  # write before read: the fencing write comes first
        state = self.refresh(pipeline)
        epoch = (state.owner.epoch if state.owner else 0) + 1
        self._epoch = epoch
        record = {
            "type": "owner",
            "pipeline": pipeline,
            "epoch": epoch,
            "holder": f"{socket.gethostname()}:{os.getpid()}",
            "source": source,
            "at": datetime.now(UTC).isoformat(),
        }
        with self.transaction() as txn:
            self._produce(txn, pipeline, record)
        state = self.refresh(pipeline)
        assert state.owner is not None
        return state.owner

    def owner(self, pipeline: str) -> Owner | None:
        return self.refresh(pipeline).owner

    def entries(self, pipeline: str) -> list[LedgerEntry]:
        return list(self.refresh(pipeline).entries)

    def last(self, pipeline: str) -> LedgerEntry | None:
        entries = self.refresh(pipeline).entries
        return entries[-1] if entries else None

    # -- inside a commit --------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[KafkaLedgerTxn]:
        txn = KafkaLedgerTxn()
        try:
            yield txn
        except BaseException:
            if txn.producer is not None:
                self._abort(txn.producer)
            raise
        if txn.producer is not None:
            try:
                txn.producer.commit_transaction(TIMEOUT_S)
            except Exception as exc:
                raise self._failed(txn.pipeline, txn.producer, exc) from None
            self._await_visible(txn.written[0] if txn.written else -1)

    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        """Step 1: the ledger's newest owner record must carry ``epoch``.

        Reads the ledger topic anew. The driver's producer epoch keeps the check
        valid until the commit: a newer run's ``acquire`` fences that producer.
        """
        state = self.refresh(pipeline)
        if state.owner is not None and state.owner.epoch != epoch:
            raise FencedError(
                pipeline, epoch, state.owner.epoch, self._hint(pipeline), state.owner.holder
            )

    def last_in(self, txn: Any, pipeline: str) -> LedgerEntry | None:
        entries = self.folded(pipeline).entries
        return entries[-1] if entries else None

    def find(self, txn: Any, pipeline: str, ctx: BatchContext) -> LedgerEntry | None:
        entries = self.folded(pipeline).entries
        if not ctx.ranges.empty:
            return next((e for e in reversed(entries) if e.ranges == ctx.ranges), None)
        if ctx.checkpoint_id is None:
            return None
        for e in reversed(entries):
            if (
                e.ranges.empty
                and e.checkpoint_id == ctx.checkpoint_id
                and e.spark_batch_id == ctx.spark_batch_id
            ):
                return e
        return None

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        """Step 4: produce the batch record into the driver's open Kafka transaction."""
        record: dict[str, Any] = {
            "type": "batch",
            "pipeline": entry.pipeline,
            "seq": entry.seq,
            "ranges": entry.ranges.to_json_obj(),
            "epoch": entry.epoch,
            "rows": entry.row_count,
            **txn.extra,
            "spark_batch_id": entry.spark_batch_id,
            "checkpoint_id": entry.checkpoint_id,
            "stateful": entry.stateful,
            "commit_seconds": entry.commit_seconds,
            "at": entry.committed_at.isoformat(),
        }
        self._produce(txn, entry.pipeline, record)

    # -- the driver's transactional producer -----------------------------------------------
    def _driver_producer(self, pipeline: str) -> Any:
        from confluent_kafka import Producer

        if self._driver is None or self._driver_pipeline != pipeline:
            self._driver = Producer(
                self.conn.client_config(
                    transactional_id=transactional_id(pipeline, self.topic, "driver"),
                    transaction_timeout_ms=self.transaction_timeout_ms,
                    enable_idempotence=True,
                    acks="all",
                )
            )
            self._driver_pipeline = pipeline
            try:
                # Fences every older run's driver producer, and aborts its open transaction.
                self._driver.init_transactions(TIMEOUT_S)
            except Exception as exc:
                self._driver = None
                raise self.conn.unavailable(
                    "initializing the sink's transactional producer", exc
                ) from None
        return self._driver

    def _produce(self, txn: KafkaLedgerTxn, pipeline: str, record: dict[str, Any]) -> None:
        """Produce ``record`` into ``txn`` (beginning it) and wait until it is written."""
        producer = self._driver_producer(pipeline)
        try:
            if txn.producer is None:
                producer.begin_transaction()
                txn.producer, txn.pipeline = producer, pipeline
            producer.produce(
                self.ledger_topic,
                key=f"{record['type'][0]}:{pipeline}",
                value=json.dumps(record),
                partition=0,
                on_delivery=lambda err, msg: txn.written.append(-1 if err else msg.offset()),
            )
            producer.flush(TIMEOUT_S)
        except Exception as exc:
            txn.producer = None  # _failed aborts it
            raise self._failed(pipeline, producer, exc) from None

    def _failed(self, pipeline: str, producer: Any, exc: Exception) -> SparkOnceError:
        """The error for a failed ledger write: fenced, or Kafka unavailable (aborted).

        A fenced producer does not always say so in ``exc`` (its ``flush()`` can fail
        with a bare ``SystemError``); aborting it then raises the fatal _FENCED error.
        """
        fenced = is_fenced(exc)
        if not fenced:
            abort_error = self._abort(producer)
            fenced = abort_error is not None and is_fenced(abort_error)
        if fenced:
            self._driver = None
            owner = self.refresh(pipeline).owner
            return FencedError(
                pipeline,
                self._epoch or 0,
                owner.epoch if owner else 0,
                self._hint(pipeline),
                owner.holder if owner else "",
            )
        return self.conn.unavailable(f"writing to ledger topic {self.ledger_topic!r}", exc)

    def _abort(self, producer: Any) -> Exception | None:
        """Abort the open transaction; a producer that cannot is dropped (its error returned)."""
        with_abort = getattr(producer, "abort_transaction", None)
        if with_abort is not None:
            try:
                with_abort(5)
            except Exception as exc:
                self._driver = None
                return exc
        return None
