"""Inspectors: what verification, the tests and the CLI do to a sink's store, off the run's path.

A run never reads a sink's whole output, wipes it, or moves the sink to another
store. ``sparkonce verify`` does (each trial starts from a clean store, and its
rows are compared with the oracle's), ``sparkonce run --sink URL`` moves a
pipeline's sink to another store, and the tests read what readers see. Those
operations live here, beside the sinks, so that the
:class:`~sparkonce.sinks.base.Sink` contract holds only what a run needs::

    inspector_for(sink)              the Inspector of the sink's store, using the sink's
                                     own connections (``fresh=True``: a copy of the sink
                                     with connections of its own)
    Inspector.rows()                 every row (or record) readers of the output see now
    Inspector.reset(pipeline)        drop the output and the pipeline's owner and ledger
                                     (destructive: for test stores only)
    Inspector.relocated(url)         the same sink (table, mode, keys...) in another store
    Inspector.fresh()                a new, unopened copy of the sink
    Inspector.ledger(p), owner(p)    the sink's, so one object answers a verifier
    relocate(sink, url)              ``inspector_for(sink).relocated(url)``
    register_inspector(cls, icls)    the inspector of another sink class (and subclasses)

Each store has its own inspector: :class:`SqlInspector` (SQLite and PostgreSQL),
:class:`TwoPhaseInspector` (the two-phase PostgreSQL sink: its view, data and
stage tables and its attempts), :class:`KafkaInspector` (the output and ledger
topics) and :class:`DeltaInspector` (the Delta table, read through Spark). A sink
subclass finds the inspector of its nearest registered base class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from sparkonce.config import StoreURL
from sparkonce.db import qi, table_rows, write_transaction
from sparkonce.errors import ConfigError
from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.sinks.base import Sink
from sparkonce.sinks.delta import DeltaSink, delta_path
from sparkonce.sinks.kafka import KafkaSink, kafka_sink_from_uri
from sparkonce.sinks.sql import PostgresSink, SQLiteSink, SqlSink
from sparkonce.sinks.twophase import (
    ATTEMPTS_TABLE,
    DATA_SUFFIX,
    STAGE_SUFFIX,
    PostgresTwoPhaseSink,
    forget_precommits,
)


class Inspector(ABC):
    """Verification and test operations on one sink's store (see the module docstring).

    It works through ``self.sink`` and its connections; :meth:`close` closes them.
    """

    def __init__(self, sink: Sink) -> None:
        self.sink = sink

    # -- connections -------------------------------------------------------------------
    def open(self) -> None:
        self.sink.open()

    def close(self) -> None:
        self.sink.close()

    def __enter__(self) -> Inspector:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------
    @abstractmethod
    def rows(self) -> list[dict[str, Any]]:
        """What readers of the output see now, one dict per row (or record)."""

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        return self.sink.ledger(pipeline)

    def owner(self, pipeline: str) -> Owner | None:
        return self.sink.owner(pipeline)

    # -- changing the store -------------------------------------------------------------
    @abstractmethod
    def reset(self, pipeline: str, *, output: bool = True) -> None:
        """Drop the output and ``pipeline``'s owner and ledger. Destructive: a clean sink
        for a verify trial, or ``sparkonce reset``; never called by a run.

        ``output=False`` keeps the output and drops only the owner and ledger, where the
        store can (a :class:`~sparkonce.errors.ConfigError` says why not otherwise). A
        two-phase sink's reset also deletes the pipeline's pre-committed attempts that never
        committed, and their rows, either way."""

    # -- other sinks -------------------------------------------------------------------
    @abstractmethod
    def relocated(self, url: str | StoreURL) -> Sink:
        """The same sink in the store at ``url`` (new and unopened)."""

    def fresh(self) -> Sink:
        """A new, unopened copy of the sink, with connections of its own."""
        return self.relocated(getattr(self.sink, "url"))  # noqa: B009


class SqlInspector(Inspector):
    """A SQLite or PostgreSQL sink's table (:class:`~sparkonce.sinks.sql.SqlSink`)."""

    sink: SqlSink

    def rows(self) -> list[dict[str, Any]]:
        sink = self.sink
        if not sink.stager._declared_types(sink.table):  # no such table (or view) yet
            return []
        return table_rows(sink.conn, sink.table)

    def reset(self, pipeline: str, *, output: bool = True) -> None:
        from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE

        sink = self.sink
        conn = sink.conn
        with write_transaction(conn, sink.dialect):
            if output:
                self._drop_output(conn, pipeline)
            self._forget(conn, pipeline)
            for t in (LEDGER_TABLE, OWNER_TABLE):
                conn.execute(sink.dialect.q(f"DELETE FROM {t} WHERE pipeline = %s"), (pipeline,))
        if output:
            sink._output_dropped()

    def _drop_output(self, conn: Any, pipeline: str) -> None:
        """Inside reset's transaction: drop what holds the output."""
        conn.execute(f"DROP TABLE IF EXISTS {qi(self.sink.table)}")

    def _forget(self, conn: Any, pipeline: str) -> None:
        """Inside reset's transaction: delete what else of the pipeline's progress the
        store keeps (the ledger and owner rows aside)."""

    def relocated(self, url: str | StoreURL) -> SqlSink:
        parsed = url if isinstance(url, StoreURL) else StoreURL.parse(url)
        s = self.sink
        cls: type[SqlSink] = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
        return cls(parsed, s.table, mode=s.mode, keys=s.keys, latest_by=s.latest_by)


class TwoPhaseInspector(SqlInspector):
    """The two-phase sink: readers see the view (append) or the table (upsert)."""

    sink: PostgresTwoPhaseSink

    def _drop_output(self, conn: Any, pipeline: str) -> None:
        """The view (append) or table (upsert), the data or stage table, and the pipeline's
        attempts of this output."""
        sink = self.sink
        row = conn.execute(
            "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", (qi(sink.table),)
        ).fetchone()
        if row is not None:  # DROP VIEW refuses a table, and DROP TABLE a view
            conn.execute(f"DROP {'VIEW' if row[0] == 'v' else 'TABLE'} {qi(sink.table)}")
        for t in (sink.table + DATA_SUFFIX, sink.table + STAGE_SUFFIX):
            conn.execute(f"DROP TABLE IF EXISTS {qi(t)}")
        conn.execute(
            f"DELETE FROM {ATTEMPTS_TABLE} WHERE pipeline = %s AND target = %s",
            (pipeline, sink.table),
        )

    def _forget(self, conn: Any, pipeline: str) -> None:
        """The pipeline's pre-committed attempts (of every output) and their rows."""
        forget_precommits(conn, pipeline)

    def pending(self, pipeline: str) -> int:
        """How many pre-committed, not yet committed or collected attempts ``pipeline`` has."""
        sink = self.sink
        row = sink.conn.execute(
            f"SELECT count(*) FROM {ATTEMPTS_TABLE} WHERE pipeline = %s AND target = %s "
            "AND state = 'precommitted'",
            (pipeline, sink.table),
        ).fetchone()
        return int(row[0])

    def relocated(self, url: str | StoreURL) -> PostgresTwoPhaseSink:
        parsed = url if isinstance(url, StoreURL) else StoreURL.parse(url)
        if parsed.scheme != "postgresql":
            raise ConfigError(f"the two-phase sink needs a postgresql:// URL, got {str(parsed)!r}")
        s = self.sink
        return PostgresTwoPhaseSink(
            parsed, s.table, mode=s.mode, keys=s.keys, latest_by=s.latest_by
        )


class KafkaInspector(Inspector):
    """A Kafka sink's output topic, as ``read_committed`` consumers see it."""

    sink: KafkaSink

    def rows(self) -> list[dict[str, Any]]:
        """Every record ``read_committed`` consumers see in the output topic: key, value."""
        from sparkonce.kafka.consumer import KafkaReader
        from sparkonce.ledger.kafka_topic import TIMEOUT_S

        conn, topic = self.sink.conn, self.sink.topic
        out: list[dict[str, Any]] = []
        with KafkaReader(conn, timeout=TIMEOUT_S) as reader:
            for p in range(conn.partitions(topic)):
                low, high = reader.watermarks(topic, p)
                for m in reader.read(topic, p, low, max(low, high)):
                    out.append({"key": _text(m.key()), "value": _text(m.value())})
        return out

    def reset(self, pipeline: str, *, output: bool = True) -> None:
        """Make the output and ledger topics look empty (``delete_records`` up to their end).

        It drops every record of both topics (of the ledger topic only, with
        ``output=False``), whichever pipeline wrote them.
        """
        from confluent_kafka import KafkaException, TopicPartition

        from sparkonce.kafka.consumer import KafkaReader
        from sparkonce.ledger.kafka_topic import TIMEOUT_S

        sink = self.sink
        sink.open()  # the output topic must exist; the ledger topic is created if missing
        conn = sink.conn
        targets = []
        # read_uncommitted: the high watermark, past open and aborted transactions too.
        with KafkaReader(conn, timeout=TIMEOUT_S, isolation_level="read_uncommitted") as rd:
            for topic in (sink.topic, sink.ledger_topic) if output else (sink.ledger_topic,):
                for p in range(conn.partitions(topic)):
                    _low, high = rd.watermarks(topic, p)
                    if high > 0:
                        targets.append(TopicPartition(topic, p, high))
        if targets:
            admin = conn.admin()  # keep a reference: a collected client cancels its futures
            futures = admin.delete_records(
                targets, request_timeout=TIMEOUT_S, operation_timeout=TIMEOUT_S
            )
            for tp, f in futures.items():
                try:
                    f.result(timeout=TIMEOUT_S)
                except (KafkaException, TimeoutError) as exc:
                    raise conn.unavailable(
                        f"deleting the records of {tp.topic}[{tp.partition}]", exc
                    ) from None
        sink._output_dropped()

    def relocated(self, url: str | StoreURL) -> KafkaSink:
        """The same sink on another cluster or topic: ``kafka://HOST:PORT[,...]/TOPIC``."""
        s = self.sink
        return kafka_sink_from_uri(
            str(url), client_config=s.conn.config, transaction_timeout_ms=s.transaction_timeout_ms
        )

    def fresh(self) -> KafkaSink:
        s = self.sink
        return KafkaSink(
            s.conn.bootstrap,
            s.topic,
            client_config=s.conn.config,
            ledger_topic=s.ledger_topic,
            transaction_timeout_ms=s.transaction_timeout_ms,
        )


def _text(b: bytes | None) -> str | bytes | None:
    if b is None:
        return None
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return b


class DeltaInspector(Inspector):
    """A Delta Lake table (:class:`~sparkonce.sinks.delta.DeltaSink`), read through Spark."""

    sink: DeltaSink

    def rows(self) -> list[dict[str, Any]]:
        sink = self.sink
        if not sink.table.exists():
            return []
        df = sink.table.spark.read.format("delta").load(sink.path)
        return [r.asDict() for r in df.collect()]

    def reset(self, pipeline: str, *, output: bool = True) -> None:
        """Delete the whole table directory (its rows, Delta log and every pipeline's ledger).

        ``output=False`` is refused: a pipeline's progress is a version in the table's own
        Delta log, which cannot be removed without the table.
        """
        sink = self.sink
        if not output:
            raise ConfigError(
                f"{sink.path}: a Delta table's ledger goes only with the table (output=True)"
            )
        table = sink.table
        table.delete(sink.path)
        gateway = getattr(table, "jvm", None)  # the classic adapter's; a Connect one has none
        if gateway is not None:  # Delta's cached log of the deleted table
            gateway.org.apache.spark.sql.delta.DeltaLog.clearCache()
        sink.forget_table()

    def relocated(self, url: str | StoreURL) -> DeltaSink:
        s = self.sink
        return DeltaSink(delta_path(str(url)), mode=s.mode, keys=s.keys, table=s.table_name)

    def fresh(self) -> DeltaSink:
        s = self.sink
        return DeltaSink(s.root, mode=s.mode, keys=s.keys, table=s.table_name)


# -- which inspector -----------------------------------------------------------------------

_INSPECTORS: dict[type[Sink], type[Inspector]] = {
    SqlSink: SqlInspector,
    PostgresTwoPhaseSink: TwoPhaseInspector,
    KafkaSink: KafkaInspector,
    DeltaSink: DeltaInspector,
}


def register_inspector(sink_cls: type[Sink], inspector_cls: type[Inspector]) -> None:
    """Make ``inspector_cls`` the inspector of ``sink_cls`` and of its subclasses."""
    _INSPECTORS[sink_cls] = inspector_cls


def inspector_for(sink: Sink, *, fresh: bool = False) -> Inspector:
    """The inspector of ``sink``'s store.

    It uses ``sink``'s own connections (so an in-process test sees what its sink
    wrote); with ``fresh=True`` it works on a new copy of the sink instead, with
    connections of its own, and closing it leaves ``sink`` alone.
    """
    for cls in type(sink).__mro__:
        found = _INSPECTORS.get(cls)
        if found is not None:
            inspector = found(sink)
            return found(inspector.fresh()) if fresh else inspector
    raise ConfigError(
        f"{type(sink).__name__} has no inspector, so it cannot be read back, reset or "
        "relocated (sparkonce verify, sparkonce run --sink); register one with "
        "sparkonce.sinks.inspect.register_inspector"
    )


def relocate(sink: Sink, url: str | StoreURL) -> Sink:
    """The same sink in the store at ``url`` (``sparkonce run --sink``, ``verify --sink``)."""
    return inspector_for(sink).relocated(url)
