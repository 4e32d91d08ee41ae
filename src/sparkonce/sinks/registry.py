"""One registry from a store URL to its store.

A store URL names one of five kinds of store (:data:`KINDS`), each with one entry here
that knows how to

* check the URL's form without touching the store (:func:`check_url`: the CLI's options),
* build the sink that writes into it (:func:`sink_for_url`: :func:`sparkonce.sink_from_url`),
* open its ledger to read owners and entries, without any output table
  (:func:`open_ledger`: ``sparkonce status``, ``sparkonce ui``).

=====================  ==============================================================
kind                   URL
=====================  ==============================================================
``sqlite``             ``sqlite:///PATH.db`` (``sqlite:////ABS/PATH.db``)
``postgresql``         ``postgresql://USER@HOST:PORT/DBNAME`` (``postgres://`` too)
``kafka``              ``kafka://HOST:PORT[,HOST:PORT]/TOPIC``: the output topic; its
                       ledger is the topic ``TOPIC.sparkonce-ledger``
``delta``              ``delta:///ABS/PATH`` or ``delta:URI`` (``delta:s3a://b/t``)
``iceberg``            ``iceberg+sqlite:////ABS/catalog.db?table=NS.NAME`` (or
                       ``iceberg+postgresql://...``): a table in a PyIceberg SQL
                       catalog (:mod:`sparkonce.sinks.iceberg_url`)
=====================  ==============================================================

A URL of no kind raises :class:`~sparkonce.errors.ConfigError` naming every form
(:data:`STORE_FORMS`). Messages never quote a password: URLs are shown through
:func:`~sparkonce.config.mask_url`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from sparkonce.config import StoreURL, mask_url
from sparkonce.errors import ConfigError
from sparkonce.sinks.iceberg_url import FORM as FORM_ICEBERG

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.ledger.base import LedgerEntry, LedgerStore, Owner
    from sparkonce.sinks.base import Sink

STORE_FORMS = (
    "sqlite:///PATH.db, postgresql://USER@HOST:PORT/DBNAME, "
    "kafka://HOST:PORT[,HOST:PORT]/TOPIC, delta:///PATH or "
    "iceberg+sqlite:////ABS/catalog.db?table=NS.NAME"
)


class StoreLedger:
    """The ledger of one store, opened from its URL for reading (status, ui): owners,
    entries and pipelines, read from the ledger store itself, no output table involved.
    It has the reading methods of a :class:`~sparkonce.sinks.base.Sink`."""

    def __init__(
        self,
        store: LedgerStore,
        label: str,
        pipelines: Callable[[], list[str]],
        close: Callable[[], None],
    ) -> None:
        self.store = store
        self.label = label  # the URL as given, password masked
        self._pipelines = pipelines
        self._close = close

    def __repr__(self) -> str:
        return f"StoreLedger({self.label})"

    def describe(self) -> str:
        return self.store.describe()

    def owner(self, pipeline: str) -> Owner | None:
        return self.store.owner(pipeline)

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        return self.store.entries(pipeline)

    def pipelines(self) -> list[str]:
        return self._pipelines()

    def close(self) -> None:
        self._close()

    def __enter__(self) -> StoreLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class StoreKind:
    """One kind of store: which URLs are its, and what the registry does with them."""

    name: str
    form: str
    claims: Callable[[str], bool]
    check: Callable[[str], None]
    sink: Callable[[str, str | None, bool, dict[str, Any]], Sink]
    ledger: Callable[[str], StoreLedger]


# -- SQL (SQLite, PostgreSQL) ----------------------------------------------------------------


def _sql_claims(url: str) -> bool:
    return not url.startswith(("kafka:", "delta:", "iceberg"))


def _sql_check(url: str) -> None:
    StoreURL.parse(url)


def _sql_sink(url: str, table: str | None, two_phase: bool, kwargs: dict[str, Any]) -> Sink:
    from sparkonce.sinks.sql import PostgresSink, SQLiteSink
    from sparkonce.sinks.twophase import PostgresTwoPhaseSink

    if not table:
        raise ConfigError(
            f"sink_from_url({mask_url(url)!r}): a SQL sink needs the output table's name"
        )
    parsed = StoreURL.parse(url)
    if two_phase:
        if parsed.scheme != "postgresql":
            raise ConfigError(
                f"two_phase=True needs a postgresql:// URL, got {str(parsed)!r}; the SQLite "
                "sink always commits on the driver"
            )
        return PostgresTwoPhaseSink(parsed, table, **kwargs)
    cls = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
    return cls(parsed, table, **kwargs)


def _sql_ledger(url: str) -> StoreLedger:
    from sparkonce.db import dialect_for
    from sparkonce.ledger.sql import SqlLedgerStore

    parsed = StoreURL.parse(url)
    if parsed.scheme == "sqlite" and parsed.path is not None and not parsed.path.exists():
        raise ConfigError(f"SQLite sink file {str(parsed.path)!r} does not exist")
    store = SqlLedgerStore(parsed, dialect_for(parsed))
    store.conn  # noqa: B018 - connects and creates the ledger tables when missing
    return StoreLedger(store, str(parsed), lambda: store.ledger.pipelines(store.conn), store.close)


# -- Kafka -----------------------------------------------------------------------------------


def _kafka_parts(url: str) -> tuple[str, str]:
    """(brokers, topic) of a ``kafka://`` URL; ConfigError without either."""
    try:
        parts = urlsplit(url)
    except ValueError:  # a malformed IPv6 host
        raise ConfigError("a Kafka sink URL names its brokers and its topic") from None
    topic = parts.path.lstrip("/")
    if not parts.netloc or not topic:
        raise ConfigError("a Kafka sink URL names its brokers and its topic")
    return parts.netloc, topic


def _kafka_check(url: str) -> None:
    from sparkonce.kafka.client import parse_bootstrap

    brokers, _ = _kafka_parts(url)
    try:
        parse_bootstrap(brokers)
    except ConfigError:
        raise ConfigError("its brokers are not host:port[,host:port...]") from None


def _kafka_sink(url: str, table: str | None, two_phase: bool, kwargs: dict[str, Any]) -> Sink:
    from sparkonce.sinks.kafka import kafka_sink_from_uri

    return kafka_sink_from_uri(url, **kwargs)


def _kafka_ledger(url: str) -> StoreLedger:
    from sparkonce.errors import TopicNotFoundError
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.ledger.kafka_topic import KafkaLedgerStore
    from sparkonce.sinks.kafka import LEDGER_SUFFIX

    try:
        brokers, topic = _kafka_parts(url)
    except ConfigError:
        raise ConfigError(
            f"{mask_url(url)!r} is not a Kafka sink URI: use kafka://HOST:PORT[,HOST:PORT]/TOPIC"
        ) from None
    conn = KafkaConnection(brokers)
    try:
        conn.partitions(topic)  # no ledger topic is created for a topic that does not exist
    except TopicNotFoundError as exc:
        raise ConfigError(
            f"no Kafka sink at {mask_url(url)}: its output topic {topic!r} does not exist at "
            f"{conn.bootstrap}, so no pipeline ever wrote there; check the topic's name"
        ) from exc
    store = KafkaLedgerStore(conn, f"{topic}{LEDGER_SUFFIX}", topic=topic)
    store.open()
    return StoreLedger(store, mask_url(url), store.pipelines, store.close)


# -- Delta Lake ------------------------------------------------------------------------------


def _delta_check(url: str) -> None:
    from sparkonce.sinks.delta import delta_path

    delta_path(url)


def _delta_sink(url: str, table: str | None, two_phase: bool, kwargs: dict[str, Any]) -> Sink:
    from sparkonce.sinks.delta import DeltaSink, delta_path

    return DeltaSink(delta_path(url), table=table, **kwargs)


def _delta_ledger(url: str) -> StoreLedger:
    """``delta:///ROOT/TABLE`` (or ``delta:URI``) names the table's own directory; reading
    its ledger starts a local Spark session with Delta when the process has none."""
    from sparkonce.ledger.delta import DeltaLedgerStore
    from sparkonce.sinks.delta import DeltaSink, delta_path

    path = delta_path(url).rstrip("/")
    root, _, name = path.rpartition("/")
    table = DeltaSink(root or "/", table=name).table  # the table and its Spark session
    if not table.exists():
        raise ConfigError(
            f"no Delta table at {path}: give the table's own directory, as in "
            "delta:///ROOT/TABLE for DeltaSink('/ROOT', table='TABLE')"
        )
    store = DeltaLedgerStore(lambda: table, f"Delta table {table.path}")
    return StoreLedger(
        store, mask_url(url), lambda: store.pipelines() if table.exists() else [], store.forget
    )


# -- Apache Iceberg (a table in a PyIceberg SQL catalog) ------------------------------------


def _iceberg_check(url: str) -> None:
    from sparkonce.sinks.iceberg_url import parse_iceberg_url

    parse_iceberg_url(url)


def _iceberg_sink(url: str, table: str | None, two_phase: bool, kwargs: dict[str, Any]) -> Sink:
    from sparkonce.sinks.iceberg import IcebergSink
    from sparkonce.sinks.iceberg_url import parse_iceberg_url

    parsed = parse_iceberg_url(url)
    if two_phase:
        raise ConfigError("two_phase=True is for PostgreSQL sinks; an Iceberg table commits once")
    name = parsed.table or table
    if not name:
        raise ConfigError(
            f"sink_from_url({parsed.label!r}): name the Iceberg table, with table=NS.NAME in "
            "the URL or the table argument"
        )
    return IcebergSink(parsed.sink_catalog(), name, **kwargs)


def _iceberg_ledger(url: str) -> StoreLedger:
    """The table's ledger, read from its current snapshot through the catalog: never
    from the newest metadata file on disk, which may be a commit the catalog refused."""
    from sparkonce.ledger.iceberg import IcebergLedgerStore
    from sparkonce.sinks.iceberg_url import parse_iceberg_url

    parsed = parse_iceberg_url(url)
    if parsed.table is None:
        raise ConfigError(
            f"{parsed.label!r}: name the table to read, with table=NS.NAME in the URL"
        )
    if parsed.sqlite_file is not None and not parsed.sqlite_file.exists():
        raise ConfigError(f"Iceberg catalog file {str(parsed.sqlite_file)!r} does not exist")
    catalog = parsed.open_catalog()
    store = IcebergLedgerStore(catalog, parsed.table)
    if store.existing() is None:
        catalog.engine.dispose()
        raise ConfigError(
            f"no Iceberg table {parsed.table} in catalog {parsed.catalog!r} at {parsed.label}: "
            "check the table's name, and name the catalog with catalog=NAME (the first "
            "argument of SqlCatalog(NAME, ...))"
        )
    return StoreLedger(store, parsed.label, store.pipelines, catalog.engine.dispose)


KINDS: tuple[StoreKind, ...] = (
    StoreKind(
        "kafka",
        "kafka://HOST:PORT[,HOST:PORT]/TOPIC",
        lambda url: url.startswith("kafka:"),
        _kafka_check,
        _kafka_sink,
        _kafka_ledger,
    ),
    StoreKind(
        "delta",
        "delta:///PATH or delta:URI",
        lambda url: url.startswith("delta:"),
        _delta_check,
        _delta_sink,
        _delta_ledger,
    ),
    StoreKind(
        "iceberg",
        FORM_ICEBERG,
        lambda url: url.startswith("iceberg"),
        _iceberg_check,
        _iceberg_sink,
        _iceberg_ledger,
    ),
    # Last: StoreURL.parse names what is wrong with any other URL.
    StoreKind(
        "sql",
        "sqlite:///PATH.db or postgresql://USER@HOST:PORT/DBNAME",
        _sql_claims,
        _sql_check,
        _sql_sink,
        _sql_ledger,
    ),
)
_SQL_SCHEMES = ("sqlite", "postgresql", "postgres")


def store_kind(url: str) -> StoreKind:
    """The kind of store ``url`` names. A URL with a scheme of no kind (``mysql://``) is a
    ConfigError naming every accepted form; a malformed URL of a kind is left to that
    kind's check, whose message is more precise."""
    if not isinstance(url, str):
        raise ConfigError(f"a sink URL is text, not {type(url).__name__}; use {STORE_FORMS}")
    for kind in KINDS:
        if kind.claims(url):
            break
    scheme = url.partition("://")[0].lower() if "://" in url else ""
    if kind.name == "sql" and scheme and scheme not in _SQL_SCHEMES:
        raise ConfigError(f"sink URL scheme {scheme!r} is not supported: use {STORE_FORMS}")
    return kind


def check_url(url: str) -> None:
    """Only the form of ``url`` (ConfigError saying what is wrong); whether the store
    answers is the caller's business."""
    store_kind(url).check(url)


def sink_for_url(
    url: str, table: str | None = None, *, two_phase: bool = False, **kwargs: Any
) -> Sink:
    """The sink writing into the store at ``url`` (see :func:`sparkonce.sink_from_url`)."""
    return store_kind(url).sink(url, table, two_phase, kwargs)


def open_ledger(url: str) -> StoreLedger:
    """The ledger of the store at ``url``, opened for reading (status, ui). Raises
    :class:`ConfigError` for a bad URL, a missing SQLite file, Kafka output topic or Delta
    table, and :class:`~sparkonce.errors.StoreUnavailableError` for a store that does not
    answer."""
    return store_kind(url).ledger(url)
