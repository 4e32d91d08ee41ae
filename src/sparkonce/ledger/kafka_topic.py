"""The ledger of a Kafka sink: owner epochs and batch entries in a ledger topic.

The ledger topic (``<topic>.sparkonce-ledger`` for :class:`~sparkonce.sinks.kafka.KafkaSink`:
one partition, kept forever, created when missing) holds JSON records, read with
``read_committed`` and folded per pipeline (:class:`LedgerTopic`)::

    {"type": "owner",  "pipeline", "epoch", "holder", "source", "at"}
    {"type": "batch",  "version", "pipeline", "seq", "ranges", "epoch", "rows",
                       "spark_batch_id", "checkpoint_id", "stateful", "commit_seconds", "at",
                       ...}                          (the codec: sparkonce.ledger.records)
    {"type": "marker", "v", "pipeline", "partition", "task", "seq", ...} (written by tasks:
                       :mod:`sparkonce.ledger.kafka_marker` is its codec)
    {"type": "snapshot", "pipeline", "v": 1, "through", "owner", "entries", "after_last_entry",
                       "pending", "at"}                                 (written by the driver)

:class:`KafkaLedgerStore` is the :class:`~sparkonce.ledger.base.LedgerStore` the
committer uses. Everything in it runs on the **driver**. Owner and batch records
are written by the driver's transactional producer, whose ``transactional.id``
``sparkonce.<pipeline>.<topic>.driver`` is the same for every run of a pipeline:
``acquire`` calls ``init_transactions()`` before it reads the ledger, which fences
every older run's producer (take over by writing before reading). A fenced run's
commit therefore fails at step 5 even if its step 1 passed: that is the "lock" that
step 1 holds until the transaction ends. Before it reads, ``acquire`` also aborts the task
transactions a dead run left open on the ledger topic (``init_transactions`` with each
one's ``transactional.id``, named by its marker), so a restart does not wait out their
``transaction_timeout_ms``; :meth:`KafkaLedgerStore.acquire` says why that keeps the
marker's exactly-once rule.

**Snapshots: start-up does not read the whole history.** A pipeline that commits for a
year leaves millions of records in its ledger topic, and folding them all from offset 0
on every start would make each start slower than the last. So the driver writes a
*snapshot* record of the pipeline's folded state (:class:`LedgerState`): in the same
Kafka transaction as its owner record on every ``acquire``, and as a batch record once
:data:`SNAPSHOT_EVERY` ledger offsets have passed since the newest snapshot. A snapshot
holds the fold of every committed record **below its** ``through`` **offset** (the last
stable offset the driver had read when it wrote it): the owner, the newest entries (at
most :data:`SNAPSHOT_ENTRIES`), ``after_last_entry`` and the pending markers. Loading a
pipeline (:meth:`KafkaLedgerStore.refresh`) finds the newest snapshot by reading windows
of the topic backwards from its end (:meth:`LedgerTopic.newest_snapshot`), starts from
its state and folds the records from ``through`` on, which include the records written
meanwhile and the transaction's own owner or batch record. Why the result is the same
fold as a read from offset 0 (and so every guarantee below holds unchanged):

* under ``read_committed``, everything below the last stable offset is decided, so the
  fold of ``[0, through)`` is final when the snapshot is written, and the snapshot
  becomes visible only if its transaction (with the owner or batch record) commits;
* a fenced driver cannot commit a snapshot at all (its producer is fenced), and a
  snapshot written by a run that was later fenced is still a correct fold of what it read;
* the resume point, the owner epoch and the pending markers of a partly committed batch
  are all in the state; the entries before the window are not, and only two things ever
  read them: :meth:`KafkaLedgerStore.entries` (status, ``sparkonce verify``), which then
  reads the whole topic once, as before; and :meth:`KafkaLedgerStore.find` for a replayed
  batch older than the window, which falls back to the same full read. A replay of the
  last batch (the only one Spark replays after a crash) never needs it.

A ledger topic written by an older sparkonce has no snapshot: its first start folds it
from offset 0, as before, and writes the first snapshot; later starts read from there.
Older sparkonce versions ignore snapshot records (their fold skips unknown types), so a
topic stays readable by them. Spark tasks read only the records after the last batch
entry (``after_last_entry``), as before. A topic shared by several pipelines: a pipeline
reads back to its own newest snapshot, through the others' records since; past
:data:`SEARCH_LIMIT` offsets it gives up and folds the topic from its start, as a topic
without snapshots is read (slower, never different).

Errors: a fenced producer raises :class:`~sparkonce.errors.FencedError`; any other
Kafka failure raises :class:`~sparkonce.errors.KafkaUnavailableError`, which
explains itself and is not retried by the committer (``is_connection_error`` is
False). A retry would need a new driver producer, and its ``init_transactions()``
would fence whichever producer holds the id now, perhaps a newer run's: the run
stops instead, and the next run's ``acquire`` starts over.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sparkonce.config import check_pipeline_name
from sparkonce.errors import FencedError, KafkaUnavailableError, SparkOnceError
from sparkonce.kafka.client import TRANSACTION_OPEN, KafkaConnection
from sparkonce.kafka.consumer import KafkaReader
from sparkonce.ledger.base import BatchContext, LedgerEntry, LedgerStore, Owner, behind_end
from sparkonce.ledger.kafka_marker import Marker
from sparkonce.ledger.records import KAFKA_ENTRY

log = logging.getLogger(__name__)


def _transaction_open(message: str) -> KafkaUnavailableError:
    """The error for a ledger held back by an open transaction that is named in ``message``."""
    error = KafkaUnavailableError(message)
    error.kind = TRANSACTION_OPEN
    return error


TIMEOUT_S = 30.0  # seconds: reading the ledger topic, initializing and committing transactions
_FENCED_CODES = ("PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH", "_FENCED")


# The broker's longest wait for a fetch of the driver's kept ledger reader (librdkafka's
# fetch.wait.max.ms, 500 by default); see LedgerTopic.
FETCH_WAIT_MS = 10


def ledger_topic_config(replication_factor: int, cluster_min_isr: int) -> dict[str, str]:
    """Topic settings of a new ledger topic with ``replication_factor`` replicas.

    Kept forever (``retention.ms=-1``). ``min.insync.replicas`` is 2 when there are 3 or
    more replicas, else 1 (so one broker's loss never stops commits), and never lower than
    the cluster's own, nor higher than the replica count (a topic could not be written at
    all): every ledger write is acknowledged by all in-sync replicas
    (``acks=all``, the transactional producers' setting), so a committed ledger record is
    on at least that many brokers.
    """
    wanted = max(cluster_min_isr, min(2, max(1, replication_factor - 1)))
    min_isr = min(replication_factor, wanted)
    return {"retention.ms": "-1", "min.insync.replicas": str(min_isr)}


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

SNAPSHOT_VERSION = 1
# A batch record writes a snapshot once this many ledger offsets have passed since the
# pipeline's newest one, so a start reads about this many records after it (plus the first
# backward window). A snapshot costs one record of up to SNAPSHOT_MAX_BYTES.
SNAPSHOT_EVERY = 2_000
SNAPSHOT_ENTRIES = 100  # newest entries a snapshot carries (Spark keeps 100 batches of offsets)
SNAPSHOT_MAX_BYTES = 512 * 1024  # under Kafka's default 1 MiB record limit, with room
SEARCH_WINDOW = 4_096  # offsets read in the first backward window; doubles while not found
# Offsets the backward search reads at most before it gives up and folds from the log start
# (a topic written by an older sparkonce, or a pipeline idle while others wrote this much).
SEARCH_LIMIT = 16 * SEARCH_WINDOW
MEMORY_ENTRIES = 1_000  # entries kept in memory for a pipeline loaded from a snapshot


@dataclass
class LedgerState:
    """What the ledger topic says about one pipeline, folded from its records."""

    owner: Owner | None = None
    entries: list[LedgerEntry] = field(default_factory=list)
    after_last_entry: int = 0  # ledger offset just after the last batch entry
    # Every task marker written after the last batch entry, in ledger order: a partly
    # committed batch's, or a fenced (zombie) attempt's that came too late.
    pending: list[Marker] = field(default_factory=list)
    position: int = 0  # the ledger offset folded up to (exclusive)
    # Whether ``entries`` holds every entry since the topic's start (False: loaded from a
    # snapshot, or trimmed in memory; the older entries are read from the topic on demand).
    complete: bool = True
    snapshot_at: int = -1  # offset of the pipeline's newest snapshot seen (-1: none)


class LedgerTopic:
    """Reads and folds the ledger topic (``read_committed``) from an offset onwards.

    Used on the driver and in Spark tasks (which read their markers).
    """

    def __init__(
        self,
        conn: KafkaConnection,
        topic: str,
        *,
        keep_reader: bool = False,
        isolation_level: str = "read_committed",
    ) -> None:
        """``keep_reader``: one consumer for every read until :meth:`close` (the driver's
        store reads the topic several times per batch; a new consumer each time costs a
        connection and a metadata round trip, measured at 30 ms to 0.7 s). Without it,
        each read opens and closes its own (a Spark task reads once).

        The kept consumer fetches with a short broker wait (``FETCH_WAIT_MS``): a fetch
        left waiting at the end of the topic by one read (500 ms by default) would hold up
        the next read's first fetch, which made each commit slower than a new consumer
        did. Between reads it holds no partition, so it fetches nothing.

        ``isolation_level``: ``read_committed`` for everything that folds the ledger;
        ``read_uncommitted`` only to look at the records of open transactions
        (:meth:`KafkaLedgerStore.acquire` finds a dead run's task transactions so)."""
        self.conn = conn
        self.topic = topic
        self.keep_reader = keep_reader
        self.isolation_level = isolation_level
        self._reader: KafkaReader | None = None
        self._lock = threading.Lock()

    @contextmanager
    def _reading(self) -> Iterator[KafkaReader]:
        if not self.keep_reader:
            with KafkaReader(
                self.conn, timeout=TIMEOUT_S, isolation_level=self.isolation_level
            ) as reader:
                yield reader
            return
        with self._lock:
            if self._reader is None:
                self._reader = KafkaReader(
                    self.conn,
                    timeout=TIMEOUT_S,
                    isolation_level=self.isolation_level,
                    settings={"fetch.wait.max.ms": FETCH_WAIT_MS},
                )
            try:
                yield self._reader
            except BaseException:
                self._drop_reader()  # a failed read starts the next on a new consumer
                raise
            self._reader.release()

    def _drop_reader(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            with contextlib.suppress(Exception):  # a broken consumer is dropped either way
                reader.close()

    def close(self) -> None:
        """Close the kept consumer, if any (the next read opens a new one)."""
        with self._lock:
            self._drop_reader()

    def read(self, start: int = 0) -> tuple[list[dict[str, Any]], int]:
        """Committed ledger records from ``start`` to the last stable offset, and that offset.

        Reads with the shared loop (:meth:`~sparkonce.kafka.consumer.KafkaReader.read`):
        ``read_committed``, so records of aborted transactions never appear, and the read
        ends at the last stable offset even though the last offsets are commit markers.
        """
        with self._reading() as reader:
            low, high = reader.watermarks(self.topic, 0)
            pos = max(start, low)
            records: list[dict[str, Any]] = []
            for m in reader.read(self.topic, 0, pos, max(pos, high)):
                record = json.loads(m.value() or b"{}")
                record["_offset"] = m.offset()
                records.append(record)
            return records, max(pos, high)

    def watermarks(self) -> tuple[int, int]:
        """(log start offset, last stable offset) of the ledger topic (under
        ``read_uncommitted``: its high watermark instead of the last stable offset)."""
        with self._reading() as reader:
            return reader.watermarks(self.topic, 0)

    def newest_snapshot(
        self,
        pipeline: str,
        low: int,
        high: int,
        *,
        window: int = SEARCH_WINDOW,
        limit: int = SEARCH_LIMIT,
    ) -> tuple[dict[str, Any], int, int] | None:
        """The newest snapshot record of ``pipeline`` below ``high``, with the offsets read.

        Reads windows backwards from ``high`` (``window`` offsets, doubling each time),
        looking only at records keyed ``s:<pipeline>``, until one holds a snapshot, or the
        log start ``low`` or ``limit`` offsets read are passed. Returns ``(record, its
        offset, offsets read)``, or None when none was found (a topic written by an older
        sparkonce, or a pipeline that never wrote one). A snapshot of an unknown version counts as
        none (the caller then reads the whole topic).
        """
        key = f"s:{pipeline}".encode()
        end = high
        with self._reading() as reader:
            while end > low and high - end < limit:
                start = max(low, end - window)
                found: Any = None
                for m in reader.read(self.topic, 0, start, end):
                    if m.key() == key:
                        found = m
                if found is not None:
                    record = json.loads(found.value() or b"{}")
                    if record.get("v") != SNAPSHOT_VERSION:
                        return None
                    return record, int(found.offset()), high - start
                end, window = start, window * 2
        return None

    @staticmethod
    def fold(state: LedgerState, pipeline: str, records: list[dict[str, Any]]) -> LedgerState:
        for r in records:
            if r.get("pipeline") != pipeline:
                continue
            kind = r.get("type")
            if kind == "owner":
                state.owner = _owner(pipeline, r)
            elif kind == "batch":
                state.entries.append(_entry(pipeline, r))
                state.after_last_entry = int(r.get("_offset", -1)) + 1
                state.pending = []
            elif kind == "marker":
                state.pending.append(Marker.from_record(r))
            elif kind == "snapshot":
                # Older news than the records folded here: only where it is matters.
                state.snapshot_at = max(state.snapshot_at, int(r.get("_offset", -1)))
        return state

    @staticmethod
    def snapshot(pipeline: str, state: LedgerState) -> dict[str, Any] | None:
        """The snapshot record of ``state`` (the fold below ``state.position``), or None
        when even its newest entry alone would be too large for one record."""
        owner = state.owner
        record: dict[str, Any] = {
            "type": "snapshot",
            "pipeline": pipeline,
            "v": SNAPSHOT_VERSION,
            "through": state.position,
            "owner": None
            if owner is None
            else {
                "epoch": owner.epoch,
                "holder": owner.holder,
                "source": owner.source,
                "at": owner.acquired_at.isoformat(),
            },
            "after_last_entry": state.after_last_entry,
            "pending": [m.to_record() for m in state.pending],
            "at": datetime.now(UTC).isoformat(),
        }
        keep = min(len(state.entries), SNAPSHOT_ENTRIES)
        while True:
            record["entries"] = [_entry_record(e) for e in state.entries[-keep:]] if keep else []
            record["complete"] = state.complete and keep == len(state.entries)
            text = json.dumps(record)
            if len(text) <= SNAPSHOT_MAX_BYTES:
                return record
            if keep <= 1:
                return None
            keep = max(1, keep // 2)

    @staticmethod
    def from_snapshot(pipeline: str, record: dict[str, Any], offset: int) -> LedgerState:
        """The state a snapshot holds: the fold of every record below its ``through``."""
        owner = record.get("owner")
        return LedgerState(
            owner=None if owner is None else _owner(pipeline, owner),
            entries=[_entry(pipeline, e) for e in record.get("entries", [])],
            after_last_entry=int(record["after_last_entry"]),
            pending=[Marker.from_record(m) for m in record.get("pending", [])],
            position=int(record["through"]),
            complete=bool(record.get("complete", False)),
            snapshot_at=offset,
        )


def _owner(pipeline: str, r: dict[str, Any]) -> Owner:
    return Owner(
        pipeline,
        int(r["epoch"]),
        datetime.fromisoformat(r["at"]),
        r.get("holder", ""),
        r.get("source"),
    )


def _entry(pipeline: str, r: dict[str, Any]) -> LedgerEntry:
    offset = r.get("_offset")
    return KAFKA_ENTRY.decode(
        pipeline, r, where="" if offset is None else f"batch record at offset {offset}"
    )


def _entry_record(entry: LedgerEntry) -> dict[str, Any]:
    """A batch record of ``entry`` (what :func:`_entry` reads back)."""
    return {"type": "batch", **KAFKA_ENTRY.encode(entry)}


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

    ``snapshot_every``: ledger offsets between two snapshots (module docstring);
    ``search_window``: the first backward window of the snapshot search. The tests make
    both small.
    """

    def __init__(
        self,
        conn: KafkaConnection,
        ledger_topic: str,
        *,
        topic: str,
        transaction_timeout_ms: int = 60_000,
        inspect_hint: str = "",
        snapshot_every: int = SNAPSHOT_EVERY,
        search_window: int = SEARCH_WINDOW,
        replication_factor: int | None = None,
    ) -> None:
        self.conn = conn
        self.replication_factor = replication_factor
        # The warning of replication_warning() found at open(), for explain and status.
        self.replication_note: str | None = None
        self.ledger_topic = ledger_topic
        self.topic = topic
        self.transaction_timeout_ms = transaction_timeout_ms
        self.inspect_hint = inspect_hint
        self.snapshot_every = snapshot_every
        self.search_window = search_window
        self._ledger = LedgerTopic(conn, ledger_topic, keep_reader=True)
        self._states: dict[str, LedgerState] = {}
        self._names: dict[str, None] = {}  # pipelines with an owner record, in order
        self._names_position = 0
        self._driver: Any = None  # transactional producer of the current run
        self._driver_pipeline: str | None = None
        self._epoch: int | None = None
        self._opened = False
        # Offsets the last load of a pipeline read (the snapshot search and the fold), for
        # the tests and the benchmark.
        self.last_load: dict[str, int] = {}
        # How long acquire waits for the ledger's open transactions to end once it has
        # aborted the dead run's (seconds; the tests make it short).
        self.clear_timeout_s = TIMEOUT_S
        # The transactional ids the last acquire fenced (for the tests and the log).
        self.last_fenced: list[str] = []

    # -- lifecycle ----------------------------------------------------------------------
    def open(self) -> None:
        """Create the ledger topic if missing (one partition, kept forever, replicated as the
        cluster says: :func:`ledger_topic_config`); warn when it is replicated less than
        the cluster allows (:meth:`replication_warning`)."""
        if self._opened:
            return
        if self.ledger_topic not in self.conn.topics():
            defaults = self.conn.cluster_defaults()
            self.conn.ensure_topic(
                self.ledger_topic,
                1,
                replication_factor=self.replication_factor,
                config=ledger_topic_config(
                    self.replication_factor or defaults.replication_factor,
                    defaults.min_insync_replicas,
                ),
            )
        self.replication_note = self.replication_warning()
        if self.replication_note is not None:
            log.warning("%s", self.replication_note)
        self._opened = True

    def replication_warning(self) -> str | None:
        """A warning when the ledger topic has fewer replicas than ``min.insync.replicas + 1``
        on a cluster with more brokers than it has replicas: one broker's loss then stops
        every commit, or loses the ledger with the broker's disk. None when it is fine."""
        # Right after the topic's creation a broker may not know it yet: retried, as are a
        # broker restarting and a leader election.
        replicas, min_isr = self.conn.retrying(
            "reading the ledger topic's replication",
            lambda: self.conn.replication(self.ledger_topic),
        )
        brokers = self.conn.retrying(
            "reading the cluster's broker count", lambda: self.conn.cluster_defaults().brokers
        )
        if replicas >= min_isr + 1 or brokers <= replicas:
            return None
        return (
            f"Kafka ledger topic {self.ledger_topic!r} at {self.conn.bootstrap} has "
            f"{replicas} replica{'s' if replicas != 1 else ''} and min.insync.replicas="
            f"{min_isr} on a cluster of {brokers} brokers: losing one broker stops every "
            "commit of this sink, and losing its disk loses the pipeline's progress and "
            "fencing. Give the topic more replicas (kafka-reassign-partitions), e.g. 3 with "
            "min.insync.replicas=2"
        )

    def close(self) -> None:
        if self._driver is not None:
            self._driver.flush(5)
            self._driver = None
        self._ledger.close()
        self._opened = False

    def forget(self) -> None:
        """Drop what was read and the driver's producer (after the topic was emptied)."""
        self._states.clear()
        self._names.clear()
        self._names_position = 0
        self._driver = None
        self._ledger.close()

    def describe(self) -> str:
        return f"Kafka ledger topic {self.ledger_topic!r} at {self.conn.bootstrap}"

    def _hint(self, pipeline: str) -> str:
        return self.inspect_hint.replace("{pipeline}", pipeline)

    # -- the ledger, folded -----------------------------------------------------------
    def refresh(self, pipeline: str) -> LedgerState:
        """The pipeline's state, with the ledger records written since the last read folded
        in (loaded from its newest snapshot on the first call)."""
        if not self._opened:
            self.open()
        state = self._states.get(pipeline)
        if state is None:
            state = self._states[pipeline] = self._load(pipeline)
        else:
            self._read_into(pipeline, state)
        if not state.complete and len(state.entries) > 2 * MEMORY_ENTRIES:
            del state.entries[:-MEMORY_ENTRIES]  # a long run: memory stays flat too
        return state

    def _load(self, pipeline: str) -> LedgerState:
        """Start from the newest snapshot (none: the log start) and fold what follows."""
        low, high = self._ledger.watermarks()
        found = self._ledger.newest_snapshot(
            pipeline, low, high, window=self.search_window, limit=16 * self.search_window
        )
        searched = 0
        if found is not None:
            record, offset, searched = found
            state = LedgerTopic.from_snapshot(pipeline, record, offset)
            if state.position < low:  # records below the log start are gone: read from 0
                state = LedgerState(position=low)
        else:
            state = LedgerState(position=low)
        start = state.position
        self._read_into(pipeline, state)
        self.last_load[pipeline] = searched + state.position - start
        return state

    def _read_into(self, pipeline: str, state: LedgerState) -> None:
        """Fold the records from ``state.position`` to the last stable offset into it."""
        new, state.position = self._ledger.read(state.position)
        LedgerTopic.fold(state, pipeline, new)

    def history(self, pipeline: str) -> LedgerState:
        """The pipeline's state with every entry since the topic's start (reads the whole
        topic once if the state was loaded from a snapshot; kept up to date after that)."""
        state = self.refresh(pipeline)
        if state.complete:
            return state
        low, _ = self._ledger.watermarks()
        full = LedgerState(position=low)
        self._read_into(pipeline, full)
        self._states[pipeline] = full
        return full

    def pipelines(self) -> list[str]:
        """Every pipeline that took an epoch in this ledger topic, in the order of their
        first epoch (reads the owner records written since the last call)."""
        if not self._opened:
            self.open()
        records, self._names_position = self._ledger.read(self._names_position)
        for r in records:
            if r.get("type") == "owner" and r.get("pipeline"):
                self._names.setdefault(str(r["pipeline"]), None)
        return list(self._names)

    def folded(self, pipeline: str) -> LedgerState:
        """The state as last read (read now if this pipeline was never read)."""
        state = self._states.get(pipeline)
        return state if state is not None else self.refresh(pipeline)

    def _await_visible(self, pipeline: str, offset: int) -> None:
        """Wait until read_committed readers see the ledger up to ``offset``.

        The last stable offset moves only once the coordinator has written the
        transaction markers, a moment after ``commit_transaction`` returns.
        """
        deadline = time.monotonic() + TIMEOUT_S
        while offset >= 0 and time.monotonic() < deadline:
            if self.refresh(pipeline).position > offset:
                return
            time.sleep(0.05)
        if offset >= 0:
            blocked = self._open_transaction(pipeline)
            if blocked is not None:
                raise _transaction_open(
                    f"pipeline {pipeline!r}: ledger offset {offset} did not become readable "
                    f"within {TIMEOUT_S:g} s because {blocked}"
                )
            # The reads answered: the last stable offset is held back by an open transaction.
            raise self.conn.unavailable(
                f"waiting for ledger offset {offset} to become readable",
                kind=TRANSACTION_OPEN,
            )

    # -- a dead run's open transactions --------------------------------------------------
    def _clear_dead_transactions(self, pipeline: str) -> None:
        """Abort the open task transactions a dead run left on the ledger, then wait until
        the ledger is readable up to its end as it is now (see :meth:`acquire`).

        A task's marker is the last record of its transaction, so a task that died (or
        hangs) between writing it and committing holds the ledger's last stable offset
        behind it: ``read_committed`` readers see nothing after it until the transaction
        ends, at the latest after ``transaction_timeout_ms``. The records of open
        transactions are read with ``read_uncommitted`` (only those, from the last stable
        offset to the end); each of this pipeline's markers among them names its task key,
        and so the ``transactional.id`` its task used (:func:`transactional_id`).
        ``init_transactions()`` on that id aborts the open transaction and bumps the
        producer epoch. Anything else still open when :attr:`clear_timeout_s` has passed
        (another pipeline's task on a shared ledger topic, a transaction that opened since)
        raises :class:`~sparkonce.errors.KafkaUnavailableError` naming it, before this run
        has written anything.
        """
        self.last_fenced = []
        if not self._opened:
            self.open()
        uncommitted = LedgerTopic(
            self.conn, self.ledger_topic, keep_reader=True, isolation_level="read_uncommitted"
        )
        try:
            end = uncommitted.watermarks()[1]  # every transaction below it began before now
            deadline = time.monotonic() + self.clear_timeout_s
            looked = -1  # the last stable offset whose open records were looked at
            while True:
                stable = self._ledger.watermarks()[1]
                if stable >= end:
                    return
                if stable != looked:
                    looked = stable
                    records, _ = uncommitted.read(stable)
                    for marker in _markers(pipeline, records, below=end):
                        tid = transactional_id(pipeline, self.topic, marker.task)
                        if tid not in self.last_fenced:
                            self._fence(pipeline, tid, marker)
                            self.last_fenced.append(tid)
                if time.monotonic() > deadline:
                    blocked = self._open_transaction(pipeline, uncommitted, stable)
                    raise _transaction_open(
                        f"pipeline {pipeline!r}: cannot take the pipeline over yet: "
                        f"{blocked or 'a transaction is still open on the ledger topic'}. "
                        "No owner record was written."
                    )
                time.sleep(0.05)
        finally:
            uncommitted.close()

    def _fence(self, pipeline: str, tid: str, marker: Marker) -> None:
        """``init_transactions()`` with ``tid``: aborts its open transaction, fences its task."""
        from confluent_kafka import Producer

        try:
            producer = Producer(self.conn.transactional_config(tid, self.transaction_timeout_ms))
            producer.init_transactions(TIMEOUT_S)
        except Exception as exc:
            raise self.conn.unavailable(
                f"aborting the open transaction of transactional id {tid!r}", exc
            ) from None
        log.warning(
            "pipeline %s: aborted the open Kafka transaction of transactional id %s (task %s "
            "of %s, epoch %d, attempt %d), left by a run that stopped before its commit; "
            "its records never become visible, and its task is fenced",
            pipeline,
            tid,
            marker.task,
            f"batch {marker.ranges}" if not marker.ranges.empty else "a no-data batch",
            marker.epoch,
            marker.attempt,
        )

    def _open_transaction(
        self, pipeline: str, uncommitted: LedgerTopic | None = None, stable: int | None = None
    ) -> str | None:
        """What holds the ledger's last stable offset back (an open transaction), in words;
        None when nothing does or it cannot be told (the cluster does not answer)."""
        own = uncommitted is None
        if uncommitted is None:
            uncommitted = LedgerTopic(
                self.conn, self.ledger_topic, isolation_level="read_uncommitted"
            )
        try:
            if stable is None:
                stable = self._ledger.watermarks()[1]
            end = uncommitted.watermarks()[1]
            if stable >= end:
                return None
            records = [r for r in uncommitted.read(stable)[0] if r.get("_offset") == stable]
        except SparkOnceError:
            return None
        finally:
            if own:
                uncommitted.close()
        what = _who_wrote(records[0], self.topic) if records else "a transaction"
        return (
            f"a transaction is still open on the ledger topic {self.ledger_topic!r} at offset "
            f"{stable} ({what}), and read_committed readers see nothing past it until it ends. "
            "A new run aborts the open task transactions a dead run of this pipeline left; "
            "this one is not such a transaction, or it began after this run started. It ends "
            "when its producer commits or aborts it, or when the broker aborts it after its "
            "transaction timeout "
            f"(this sink's transaction_timeout_ms: {self.transaction_timeout_ms}); then run "
            "again"
        )

    # -- outside a commit -------------------------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take ``epoch + 1``: fence older runs' producers first, then read, then write.

        In this order:

        1. ``init_transactions()`` on the driver's producer: every older run's driver is
           fenced, and its open transaction (an owner or batch record) aborted.
        2. The dead run's open task transactions are aborted
           (:meth:`_clear_dead_transactions`): ``init_transactions()`` on the
           transactional id of each of this pipeline's task markers still in an open
           transaction; then the ledger must be readable (``read_committed``) up to its
           end as it was at this step. A restart after a driver crash so proceeds within
           seconds, whatever ``transaction_timeout_ms`` is, instead of waiting for the
           broker to time those transactions out.
        3. The ledger is read, and only then is the epoch chosen and the owner record
           written. Nothing is written when step 2 gives up: a start that cannot read the
           whole ledger never writes an owner record of an epoch it may have read wrong
           (when a dead task's open marker held the ledger back, each failed start used to
           write one more owner record with the same epoch).

        Why step 2 keeps the marker's exactly-once rule (DESIGN.md section 6, step 3: a
        task's output is visible iff its marker is, and a task writes only if no marker
        of its task key for the batch is committed when it reads the ledger after its own
        ``init_transactions()``):

        * aborting only takes away what was never decided: the dead run's driver wrote a
          batch's ledger entry only after every task's commit had returned, and a
          committed transaction cannot be aborted. An aborted task's marker and records
          never become visible, so its batch is not complete, and the replay's task of
          the same key (same transactional id) writes them once.
        * a transaction open at step 2 cannot commit after it: its producer epoch is
          bumped, so the zombie task's commit fails (fenced) even if the task is only
          paused and wakes up later. So no such marker can appear after this run read
          the ledger at step 3.
        * a task of the old run that starts (``init_transactions``) after step 2 reads
          the ledger after its own ``init_transactions``, as every task does: once this
          run's owner record is readable it finds a newer epoch and writes nothing;
          before, it may commit (as without step 2), and then the replay's task of its
          key finds its marker and writes nothing again. The owner record's own wait
          (:meth:`_await_visible`) ends only once every such transaction that began
          before it has ended, so the state this method returns includes them.

        The owner record's transaction also holds a snapshot of the state just read (its
        ``through`` is what was read), so the next start reads from here on.
        """
        check_pipeline_name(pipeline)
        self._driver = None
        self._driver_producer(pipeline)  # write before read: the fencing write comes first
        self._clear_dead_transactions(pipeline)
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
        snapshot = LedgerTopic.snapshot(pipeline, state)
        with self.transaction() as txn:
            self._produce(txn, pipeline, record)
            if snapshot is not None:
                self._produce(txn, pipeline, snapshot)
        state = self.refresh(pipeline)
        assert state.owner is not None
        return state.owner

    def owner(self, pipeline: str) -> Owner | None:
        return self.refresh(pipeline).owner

    def entries(self, pipeline: str) -> list[LedgerEntry]:
        """Every entry since the topic's start (see :meth:`history`)."""
        return list(self.history(pipeline).entries)

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
            self._await_visible(txn.pipeline, txn.written[0] if txn.written else -1)

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
        """The entry of exactly ``ctx``'s batch, newest first.

        The walk stops where no older entry can match: for a batch with offsets, at an
        entry that ends at or before the batch's start; for a no-data batch, at an entry
        behind its position (:func:`behind_end`). When the entries in memory (a snapshot's
        window) end before that point, the whole history is read (:meth:`history`), so
        the answer is always the one a read from offset 0 gives.
        """
        state = self.folded(pipeline)
        found, decided = _search(state.entries, ctx)
        if found is not None or decided or state.complete:
            return found
        return _search(self.history(pipeline).entries, ctx)[0]

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        """Step 4: produce the batch record into the driver's open Kafka transaction.

        Once :attr:`snapshot_every` offsets have passed since the pipeline's newest
        snapshot, a snapshot of the state read at step 1 follows it in the same transaction
        (the module docstring says why that is exact).
        """
        record = {**txn.extra, **_entry_record(entry)}  # extra: the sink's task counts
        self._produce(txn, entry.pipeline, record)
        state = self.folded(entry.pipeline)
        if state.position - max(state.snapshot_at, 0) >= self.snapshot_every:
            snapshot = LedgerTopic.snapshot(entry.pipeline, state)
            if snapshot is not None:
                self._produce(txn, entry.pipeline, snapshot)

    # -- the driver's transactional producer -----------------------------------------------
    def _driver_producer(self, pipeline: str) -> Any:
        from confluent_kafka import Producer

        if self._driver is None or self._driver_pipeline != pipeline:
            self._driver = Producer(
                self.conn.transactional_config(
                    transactional_id(pipeline, self.topic, "driver"), self.transaction_timeout_ms
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


def _markers(pipeline: str, records: list[dict[str, Any]], *, below: int) -> list[Marker]:
    """``pipeline``'s task markers among ``records`` at offsets below ``below``."""
    return [
        Marker.from_record(r)
        for r in records
        if r.get("type") == "marker"
        and r.get("pipeline") == pipeline
        and int(r.get("_offset", below)) < below
    ]


def _who_wrote(record: dict[str, Any], topic: str) -> str:
    """Who wrote a ledger record of an open transaction, in words (with its transactional id
    when the record tells it)."""
    pipeline = record.get("pipeline")
    kind = record.get("type")
    if kind == "marker":
        try:
            marker = Marker.from_record(record)
        except SparkOnceError:
            return f"a task marker of pipeline {pipeline!r}"
        return (
            f"the marker of task {marker.task} of pipeline {pipeline!r}, epoch {marker.epoch}, "
            f"whose transactional id is {transactional_id(str(pipeline), topic, marker.task)!r} "
            "when it writes to this sink's topic"
        )
    if kind in ("owner", "batch", "snapshot"):
        return (
            f"a {kind} record of pipeline {pipeline!r}, by the driver whose transactional id "
            f"is {transactional_id(str(pipeline), topic, 'driver')!r}"
        )
    return "a record sparkonce did not write"


def _search(entries: list[LedgerEntry], ctx: BatchContext) -> tuple[LedgerEntry | None, bool]:
    """``ctx``'s entry in ``entries`` (newest first), and whether the walk reached a point
    where no older entry can match (so a longer history would not change the answer)."""
    if not ctx.ranges.empty:
        starts = ctx.ranges.starts()
        for e in reversed(entries):
            if e.ranges == ctx.ranges:
                return e, True
            if all(e.ranges.ends().get(tp, 0) <= start for tp, start in starts.items()):
                return None, True  # entries this old end before the batch starts
        return None, False
    if ctx.checkpoint_id is None:
        return None, True
    at = ctx.ranges.ends()
    for e in reversed(entries):
        if (
            e.ranges == ctx.ranges
            and e.checkpoint_id == ctx.checkpoint_id
            and e.spark_batch_id == ctx.spark_batch_id
        ):
            return e, True
        if behind_end(e, at):
            return None, True
    return None, False
