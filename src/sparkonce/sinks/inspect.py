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
    Inspector.other_readers()        readers of the output that share no code with the sink
                                     or with rows() (name -> rows), for verify's final checks
    Inspector.leftovers(p)           what of ``p``'s failed attempts the store still holds
                                     (None: nothing it can count)
    relocate(sink, url)              ``inspector_for(sink).relocated(url)``
    register_inspector(cls, icls)    the inspector of another sink class (and subclasses)

Each store has its own inspector: :class:`SqlInspector` (SQLite and PostgreSQL),
:class:`TwoPhaseInspector` (the two-phase PostgreSQL sink: its view, data and
stage tables and its attempts), :class:`KafkaInspector` (the output and ledger
topics), :class:`DeltaInspector` (the Delta table, read through Spark) and
:class:`IcebergInspector` (the Iceberg table: PyIceberg's scan, and DuckDB's
``iceberg_scan`` as a second reader). A sink subclass finds the inspector of its nearest
registered base class. ``IcebergSink`` needs the ``iceberg`` extra, so this module never
imports it at the top: its inspector is registered by the sink's qualified name
(:data:`_BY_NAME`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.config import StoreURL, mask_url
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

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.sinks.iceberg import IcebergSink


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

    def other_readers(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        """Readers of the output other than :meth:`rows`, by name, each giving the rows it
        sees now. ``rows`` reads through sparkonce's own code where the store has no
        reader of its own that verify can trust alone (an Iceberg table, read with
        PyIceberg, which the sink also commits with); a reader here shares none of it, and
        ``sparkonce verify`` checks what it sees against the oracle too. None by default."""
        return {}

    def check_readers(self) -> None:
        """Raise ConfigError when an :meth:`other_readers` reader cannot run here (a
        package missing), naming what to install. Nothing to check by default."""
        return None

    def leftovers(self, pipeline: str) -> dict[str, int] | None:
        """What ``pipeline``'s failed, crashed or zombie attempts left in the store that no
        reader sees and the store will clean up later (counts by kind), or None when the
        store leaves nothing of the kind or cannot tell. Recorded per verify trial."""
        return None

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


class IcebergInspector(Inspector):
    """An Apache Iceberg table (:class:`~sparkonce.sinks.iceberg.IcebergSink`).

    :meth:`rows` reads the current snapshot with PyIceberg's scan; :meth:`other_readers`
    adds DuckDB's ``iceberg_scan`` of the table's current metadata file, a reader that
    shares no code with PyIceberg or sparkonce (the ``duckdb``, ``duckdb-extension-iceberg``
    and ``duckdb-extension-avro`` packages; without them :meth:`check_readers` says what to
    install). A fresh copy opens a new catalog of the same class and properties, so it has
    connections (a SQL catalog's engine) of its own.
    """

    sink: IcebergSink

    def _table(self) -> Any:
        return self.sink.store.existing()

    def rows(self) -> list[dict[str, Any]]:
        table = self._table()
        if table is None or table.current_snapshot() is None:
            return []
        rows: list[dict[str, Any]] = table.scan().to_arrow().to_pylist()
        return rows

    def other_readers(self) -> dict[str, Callable[[], list[dict[str, Any]]]]:
        return {"duckdb": self.duckdb_rows}

    def duckdb_rows(self) -> list[dict[str, Any]]:
        """The rows DuckDB's ``iceberg_scan`` reads from the table's current metadata file
        (timestamps in UTC, as PyIceberg gives them), through Arrow."""
        table = self._table()
        if table is None or table.current_snapshot() is None:
            return []
        con = _duckdb()
        try:
            con.sql("SET TimeZone = 'UTC'")
            where = table.metadata_location.replace("'", "''")
            got = con.sql(f"SELECT * FROM iceberg_scan('{where}')").to_arrow_table()
        finally:
            con.close()
        rows: list[dict[str, Any]] = got.to_pylist()
        return rows

    def check_readers(self) -> None:
        """Raise ConfigError unless DuckDB and its Iceberg extension can be loaded."""
        _duckdb().close()

    def leftovers(self, pipeline: str) -> dict[str, int] | None:
        """Staging directories of ``pipeline`` in the table's location that no snapshot in
        the table's history added (``orphan_dirs``), and the Parquet files in them
        (``orphan_files``): what crashed, aborted and zombie attempts left, which the sink's
        orphan sweep deletes once they are older than its grace period. The current
        snapshot's own files are never counted."""
        from sparkonce.sinks.iceberg import committed_dirs, staging_root

        table = self._table()
        if table is None:
            return {"orphan_dirs": 0, "orphan_files": 0}
        root = staging_root(table, pipeline, self.sink.describe())
        if not root.is_dir():
            return {"orphan_dirs": 0, "orphan_files": 0}
        kept = set(committed_dirs(table, pipeline).values()) if table.current_snapshot() else set()
        dirs = [d for d in root.iterdir() if d.is_dir() and d.name not in kept]
        files = sum(1 for d in dirs for f in d.rglob("*.parquet"))
        return {"orphan_dirs": len(dirs), "orphan_files": files}

    def reset(self, pipeline: str, *, output: bool = True) -> None:
        """Drop the table from its catalog and delete its directory (its rows, metadata,
        staging directories, and every pipeline's owner and ledger, which live in its
        metadata). ``output=False`` is refused: a pipeline's ledger is in the table's
        snapshots, which cannot be removed without the table."""
        import shutil

        from sparkonce.sinks.iceberg import local_location

        sink = self.sink
        if not output:
            raise ConfigError(
                f"{sink.describe()}: an Iceberg table's ledger is in its snapshots and goes "
                "only with the table (output=True)"
            )
        table = self._table()
        if table is None:
            return
        where = local_location(table, sink.describe())
        sink.catalog.drop_table(sink.table)
        shutil.rmtree(where, ignore_errors=True)
        sink.store.committed = None

    def relocated(self, url: str | StoreURL) -> Sink:
        """The same sink (table, mode, keys) in the catalog ``url`` names
        (``iceberg+sqlite:////ABS/catalog.db``; ``table=`` there renames the table)."""
        from sparkonce.sinks.iceberg import IcebergSink
        from sparkonce.sinks.iceberg_url import FORM, parse_iceberg_url

        text = str(url)
        if not text.startswith("iceberg"):
            raise ConfigError(
                f"{self.sink.describe()} cannot be moved to {mask_url(text)!r}: an Iceberg "
                f"sink moves only to another Iceberg catalog, {FORM}"
            )
        parsed = parse_iceberg_url(text)
        s = self.sink
        return IcebergSink(
            parsed.sink_catalog(),
            parsed.table or s.table,
            mode=s.mode,
            keys=s.keys,
            latest_by=s.latest_by or None,
            orphan_grace_seconds=s.stager.grace_seconds,
            keep_snapshots=s.store.keep_snapshots,
        )

    def fresh(self) -> Sink:
        from sparkonce.sinks.iceberg import IcebergSink

        s = self.sink
        catalog = type(s.catalog)(s.catalog.name, **dict(s.catalog.properties))
        return IcebergSink(
            catalog,
            s.table,
            mode=s.mode,
            keys=s.keys,
            latest_by=s.latest_by or None,
            orphan_grace_seconds=s.stager.grace_seconds,
            keep_snapshots=s.store.keep_snapshots,
        )

    def close(self) -> None:
        super().close()
        engine = getattr(self.sink.catalog, "engine", None)  # a SQL catalog's connections
        if engine is not None:
            engine.dispose()


def _duckdb() -> Any:
    """A DuckDB connection with the ``avro`` and ``iceberg`` extensions loaded from their
    wheels (DuckDB would otherwise download them, which a machine offline cannot)."""
    import importlib

    try:
        duckdb = importlib.import_module("duckdb")
        # avro first: the iceberg extension reads its manifests through it
        mods = [
            importlib.import_module(m)
            for m in ("duckdb_extension_avro", "duckdb_extension_iceberg")
        ]
    except ImportError as exc:
        raise ConfigError(
            f"sparkonce verify reads an Iceberg table with DuckDB too ({exc}): install "
            "duckdb, duckdb-extension-iceberg and duckdb-extension-avro of one version "
            "(pip install 'duckdb==1.5.5' 'duckdb-extension-iceberg==1.5.5' "
            "'duckdb-extension-avro==1.5.5')"
        ) from None
    con = duckdb.connect()
    try:
        for mod in mods:
            found = next(Path(str(mod.__file__)).parent.glob("**/*.duckdb_extension"), None)
            if found is None:
                raise ConfigError(f"{mod.__name__} holds no .duckdb_extension file; reinstall it")
            con.sql(f"LOAD '{found}'")
    except BaseException:
        con.close()
        raise
    return con


# -- which inspector -----------------------------------------------------------------------

_INSPECTORS: dict[type[Sink], type[Inspector]] = {
    SqlSink: SqlInspector,
    PostgresTwoPhaseSink: TwoPhaseInspector,
    KafkaSink: KafkaInspector,
    DeltaSink: DeltaInspector,
}
#: Inspectors of sinks this module does not import (their extras may be missing), by the
#: sink class's ``module.qualname``.
_BY_NAME: dict[str, type[Inspector]] = {
    "sparkonce.sinks.iceberg.IcebergSink": IcebergInspector,
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
        found = _INSPECTORS.get(cls) or _BY_NAME.get(f"{cls.__module__}.{cls.__qualname__}")
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
