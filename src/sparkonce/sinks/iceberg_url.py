"""The store URL of an Apache Iceberg table: its SQL catalog, the catalog's name, the table.

An :class:`~sparkonce.sinks.iceberg.IcebergSink` is built in a pipeline file from a
PyIceberg catalog object. ``sparkonce status``, ``ui``, ``reset`` and ``verify --sink``
take stores as URLs, so an Iceberg table has one too::

    iceberg+sqlite:////ABS/catalog.db?table=NS.NAME&catalog=NAME&warehouse=/ABS/DIR
    iceberg+postgresql://USER@HOST:PORT/DBNAME?table=NS.NAME&catalog=NAME&warehouse=/ABS/DIR

* After ``iceberg+`` comes the SQL catalog's database as SQLAlchemy spells it
  (``sqlite:///relative.db``, ``sqlite:////absolute.db``); a PostgreSQL catalog is reached
  through psycopg 3. A relative SQLite path is made absolute where the URL is read.
* ``table``: the table as ``namespace.name``. ``sparkonce status`` and ``ui`` need it;
  ``verify --sink`` and ``sink_from_url`` take the pipeline's table when it is left out.
* ``catalog``: the catalog's name, the first argument of ``SqlCatalog(name, ...)``. A SQL
  catalog keeps each table under its catalog's name, so another name finds no table.
  Default ``default`` (PyIceberg's own default name).
* ``warehouse``: where new tables go (a local directory: the sink's Spark tasks write
  there). Only creating a table needs it. Default for SQLite: ``warehouse`` beside the
  catalog file; a PostgreSQL catalog that must create a table needs it given.

The fencing guarantee is the SQL catalog's atomic commit, on SQLite and on PostgreSQL
alike (see :mod:`sparkonce.ledger.iceberg`). Nothing here imports PyIceberg until a
catalog is built, so checking a URL's form needs no ``iceberg`` extra.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from sparkonce.config import mask_url
from sparkonce.errors import ConfigError, StoreUnavailableError

SCHEMES = ("iceberg+sqlite", "iceberg+postgresql")
FORM = "iceberg+sqlite:////ABS/catalog.db?table=NS.NAME[&catalog=NAME][&warehouse=/ABS/DIR]"
_PARAMETERS = ("table", "catalog", "warehouse")
DEFAULT_CATALOG = "default"


@dataclass(frozen=True)
class IcebergURL:
    """A parsed Iceberg store URL. ``uri`` is the SQLAlchemy URL of the catalog's database
    (it may hold a password: show :attr:`label`, never ``uri``)."""

    uri: str
    catalog: str
    table: str | None
    warehouse: str | None
    label: str  # the URL as given, password masked
    sqlite_file: Path | None  # the catalog's SQLite file (None: PostgreSQL)

    def __repr__(self) -> str:
        return f"IcebergURL({self.label})"

    def sink_catalog(self) -> Any:
        """The catalog a sink writes through: one that can create the table, so a
        PostgreSQL catalog needs ``warehouse=`` (SQLite has a default)."""
        if self.warehouse is None:
            raise ConfigError(
                f"{self.label!r}: a sink into a PostgreSQL Iceberg catalog needs "
                "warehouse=/ABS/DIR, the local directory where it creates the table"
            )
        return self.open_catalog()

    def open_catalog(self) -> Any:
        """The PyIceberg ``SqlCatalog`` this URL names. It connects at once, creating its
        own tables, and for SQLite the file and its directory when missing (a sink moved
        to a new store): callers that only read check the file exists first."""
        try:
            from pyiceberg.catalog.sql import SqlCatalog
        except ImportError as exc:  # pragma: no cover - the extra is in every test run
            raise ConfigError(
                f"{self.label} is an Iceberg table: install the iceberg extra "
                "(pip install 'sparkonce[iceberg]')"
            ) from exc
        if self.sqlite_file is not None:
            self.sqlite_file.parent.mkdir(parents=True, exist_ok=True)
        props = {"uri": self.uri}
        if self.warehouse is not None:
            props["warehouse"] = self.warehouse
        from sqlalchemy.exc import OperationalError

        try:
            return SqlCatalog(self.catalog, **props)
        except OperationalError as exc:
            raise StoreUnavailableError(
                f"the Iceberg catalog's database at {self.label} did not answer: "
                f"{mask_url(str(exc.orig))}. Check that it runs and the URL is right."
            ) from None


def parse_iceberg_url(url: str) -> IcebergURL:
    """Parse ``url`` (see the module docstring); ConfigError saying what is wrong."""
    label = mask_url(url)
    try:
        parts = urlsplit(url)
    except ValueError:
        raise ConfigError(f"{label!r} is not a URL; an Iceberg table's URL is {FORM}") from None
    if parts.scheme not in SCHEMES:
        raise ConfigError(
            f"{label!r}: an Iceberg table's URL starts with iceberg+sqlite:// or "
            f"iceberg+postgresql:// (its SQL catalog's database), as in {FORM}"
        )
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - set(_PARAMETERS))
    if unknown:
        raise ConfigError(
            f"{label!r}: unknown parameter(s) {', '.join(unknown)}; an Iceberg table's URL "
            f"takes {', '.join(_PARAMETERS)} ({FORM})"
        )
    one: dict[str, str] = {}
    for name, values in query.items():
        if len(values) != 1 or not values[0]:
            raise ConfigError(f"{label!r}: give {name}= once, with a value")
        one[name] = values[0]
    table = one.get("table")
    if table is not None and "." not in table:
        raise ConfigError(f"{label!r}: table= is 'namespace.name', got {table!r}")
    warehouse = one.get("warehouse")
    if warehouse is not None:
        path = warehouse[len("file://") :] if warehouse.startswith("file://") else warehouse
        if not path.startswith("/"):
            raise ConfigError(
                f"{label!r}: warehouse= is an absolute local directory (/ABS/DIR or "
                f"file:///ABS/DIR), got {warehouse!r}: IcebergSink's Spark tasks write there"
            )
        warehouse = "file://" + path
    sqlite_file: Path | None = None
    if parts.scheme == "iceberg+sqlite":
        if parts.netloc or not parts.path.startswith("/") or len(parts.path) < 2:
            raise ConfigError(
                f"{label!r}: a SQLite catalog is iceberg+sqlite:///RELATIVE.db or "
                "iceberg+sqlite:////ABS/PATH.db"
            )
        sqlite_file = Path(parts.path[1:]).absolute()
        uri = f"sqlite:///{sqlite_file}"
        if warehouse is None:
            warehouse = f"file://{sqlite_file.parent / 'warehouse'}"
    else:
        if not parts.netloc or parts.path in ("", "/"):
            raise ConfigError(
                f"{label!r}: a PostgreSQL catalog is "
                "iceberg+postgresql://USER@HOST:PORT/DBNAME?table=NS.NAME"
            )
        uri = f"postgresql+psycopg://{parts.netloc}{parts.path}"
    return IcebergURL(
        uri=uri,
        catalog=one.get("catalog", DEFAULT_CATALOG),
        table=table,
        warehouse=warehouse,
        label=label,
        sqlite_file=sqlite_file,
    )
