"""Connections to the SQL stores sparkonce writes to: SQLite and PostgreSQL.

One :class:`Dialect` per store hides the few differences the ledger and the
sinks care about (placeholders, how a write transaction takes its lock, column
types). :func:`connect` opens a connection with bounded retries and, when the
store stays unreachable, raises :class:`~sparkonce.errors.SinkUnavailableError`
naming the host and port (never the password).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from sparkonce.config import StoreURL
from sparkonce.errors import ConfigError, SinkUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.types import DataType

log = logging.getLogger(__name__)

CONNECT_ATTEMPTS = 4  # 4 tries, 0.5 s then doubling: ~3.5 s of waiting before giving up
CONNECT_TIMEOUT_S = 5  # per attempt; a black-holed host costs at most this per try


def qi(name: str) -> str:
    """Quote an identifier (already validated by ``check_identifier``) for both stores.

    Quoting keeps reserved words such as ``offset`` usable as column names and
    keeps the exact case in PostgreSQL.
    """
    return '"' + name.replace('"', '""') + '"'


def qlist(names: Iterable[str]) -> str:
    return ", ".join(qi(n) for n in names)


class Dialect:
    """What differs between SQL stores. Subclassed once per store."""

    name: str
    placeholder: str

    def q(self, sql: str) -> str:
        """Rewrite ``%s`` placeholders into this store's style."""
        return sql if self.placeholder == "%s" else sql.replace("%s", self.placeholder)

    def begin_write(self, conn: Any) -> None:
        raise NotImplementedError

    def lock_suffix(self) -> str:
        """Appended to the owner-row SELECT at step 1 of the protocol."""
        return ""

    def column_type(self, dtype: DataType, column: str) -> str:
        raise NotImplementedError


class SQLiteDialect(Dialect):
    name = "sqlite"
    placeholder = "?"

    def begin_write(self, conn: Any) -> None:
        # IMMEDIATE takes the database's write lock now, so the epoch check at
        # step 1 and the commit at step 5 see the same owner row.
        conn.execute("BEGIN IMMEDIATE")

    def column_type(self, dtype: DataType, column: str) -> str:
        from pyspark.sql import types as T

        if isinstance(dtype, (T.LongType, T.IntegerType, T.ShortType, T.ByteType, T.BooleanType)):
            return "INTEGER"
        if isinstance(dtype, (T.DoubleType, T.FloatType)):
            return "REAL"
        if isinstance(dtype, (T.StringType, T.DecimalType, T.DateType, T.TimestampType)):
            return "TEXT"
        if isinstance(dtype, T.TimestampNTZType):
            return "TEXT"
        if isinstance(dtype, T.BinaryType):
            return "BLOB"
        raise _unsupported(dtype, column)


class PostgresDialect(Dialect):
    name = "postgresql"
    placeholder = "%s"

    def begin_write(self, conn: Any) -> None:
        conn.execute("BEGIN")

    def lock_suffix(self) -> str:
        # Row lock on the owner row: an epoch bump by a newer run waits for this
        # transaction, and this transaction waits for a bump in flight.
        return " FOR UPDATE"

    def column_type(self, dtype: DataType, column: str) -> str:
        from pyspark.sql import types as T

        simple = {
            T.LongType: "BIGINT",
            T.IntegerType: "INTEGER",
            T.ShortType: "SMALLINT",
            T.ByteType: "SMALLINT",
            T.BooleanType: "BOOLEAN",
            T.DoubleType: "DOUBLE PRECISION",
            T.FloatType: "REAL",
            T.StringType: "TEXT",
            T.BinaryType: "BYTEA",
            T.DateType: "DATE",
            T.TimestampType: "TIMESTAMPTZ",
            T.TimestampNTZType: "TIMESTAMP",
        }
        for cls, sql in simple.items():
            if isinstance(dtype, cls):
                return sql
        if isinstance(dtype, T.DecimalType):
            return f"NUMERIC({dtype.precision},{dtype.scale})"
        raise _unsupported(dtype, column)


def _unsupported(dtype: DataType, column: str) -> ConfigError:
    return ConfigError(
        f"column {column!r} has Spark type {dtype.simpleString()}, which the SQL sinks cannot "
        "store; cast it in the pipeline's transform (for example to a string or to JSON with "
        "to_json)"
    )


def dialect_for(url: StoreURL) -> Dialect:
    return SQLiteDialect() if url.scheme == "sqlite" else PostgresDialect()


def connect(url: StoreURL, *, attempts: int = CONNECT_ATTEMPTS) -> Any:
    """Open a connection in autocommit mode (transactions are begun explicitly).

    Retries connection failures ``attempts`` times with exponential backoff,
    then raises :class:`SinkUnavailableError` naming the store's address.
    """
    if url.scheme == "sqlite":
        assert url.path is not None
        if url.path.parent and not url.path.parent.exists():
            url.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            url.path, timeout=60.0, isolation_level=None, check_same_thread=False
        )
        try:
            conn.execute("PRAGMA journal_mode=WAL")  # the first read of the file
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA busy_timeout=60000")
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise _sqlite_open_error(url, exc) from exc
        return conn
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError(
            "the PostgreSQL sink needs psycopg 3: pip install 'sparkonce[postgres]'"
        ) from exc
    kwargs: dict[str, Any] = {
        "host": url.host,
        "port": url.port,
        "dbname": url.dbname,
        "autocommit": True,
        "connect_timeout": CONNECT_TIMEOUT_S,
    }
    if url.user:
        kwargs["user"] = url.user
    if url.password:
        kwargs["password"] = url.password
    for key, value in url.params:
        kwargs[key] = value
    delay = 0.5
    last: Exception | None = None
    for attempt in range(1, attempts + 1):
        try:
            return psycopg.connect(**kwargs)
        except psycopg.OperationalError as exc:
            last = exc
            if _is_auth_or_missing_db(exc):
                break
            if attempt < attempts:
                log.warning(
                    "PostgreSQL at %s not reachable (attempt %d/%d); retrying in %.1f s",
                    url.address,
                    attempt,
                    attempts,
                    delay,
                )
                time.sleep(delay)
                delay *= 2
    reason = _first_line(last)
    raise SinkUnavailableError(
        f"cannot connect to PostgreSQL at {url.address} (database {url.dbname!r}, user "
        f"{url.user!r}) after {attempt} attempt(s): {reason}. Check that the server is running "
        "and reachable from this machine, and that the URL's host, port, database and user "
        "are right. Nothing was written."
    ) from last


def _sqlite_open_error(url: StoreURL, exc: sqlite3.DatabaseError) -> Exception:
    """A ConfigError for a path that is not a usable SQLite file; other errors unchanged.

    ``file is not a database`` (SQLITE_NOTADB) and a corrupt header (SQLITE_CORRUPT)
    mean the URL points at something else; SQLITE_CANTOPEN means a directory or a file
    this process may not open. A locked database (an OperationalError) stays as it is.
    """
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        return ConfigError(
            f"SQLite store {str(url.path)!r} (sink URL {url}) is not a SQLite database "
            f"({exc}); point the URL at a sparkonce SQLite file or at a new path. "
            "Nothing was written."
        )
    if code == sqlite3.SQLITE_CANTOPEN:
        return ConfigError(
            f"cannot open SQLite store {str(url.path)!r} (sink URL {url}): {exc}; the path "
            "must be a file (or a new file) in a directory this process can write"
        )
    return exc


def _is_auth_or_missing_db(exc: Exception) -> bool:
    text = str(exc)
    return "password authentication failed" in text or (
        "database" in text and "does not exist" in text
    )


def _first_line(exc: Exception | None) -> str:
    if exc is None:
        return "unknown error"
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    return lines[-1] if lines else type(exc).__name__


@contextmanager
def write_transaction(conn: Any, dialect: Dialect) -> Iterator[Any]:
    """An explicit write transaction: commits on success, rolls back on any error."""
    dialect.begin_write(conn)
    try:
        yield conn
    except BaseException:
        try:
            conn.execute("ROLLBACK")
        except Exception:  # the connection itself may be gone; nothing was committed
            log.debug("rollback failed", exc_info=True)
        raise
    else:
        conn.execute("COMMIT")


def table_rows(conn: Any, table: str) -> list[dict[str, Any]]:
    """Every row of ``table`` (or view) on ``conn``, one dict per row by column name."""
    cur = conn.execute(f"SELECT * FROM {qi(table)}")
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


def fetchone(conn: Any, dialect: Dialect, sql: str, params: Sequence[Any] = ()) -> Any:
    return conn.execute(dialect.q(sql), tuple(params)).fetchone()


def fetchall(conn: Any, dialect: Dialect, sql: str, params: Sequence[Any] = ()) -> list[Any]:
    return list(conn.execute(dialect.q(sql), tuple(params)).fetchall())


def execute(conn: Any, dialect: Dialect, sql: str, params: Sequence[Any] = ()) -> None:
    conn.execute(dialect.q(sql), tuple(params))
