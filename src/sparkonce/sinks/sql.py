"""Transactional SQL sinks: SQLite (the embedded default) and PostgreSQL.

Guarantee: **effectively-once**. Each micro-batch's rows, the epoch check and
the ledger row commit in one transaction of the database, so a batch's rows
are visible exactly once whatever crashes, retries or zombie runs occur. Work
may run more than once; only one run's effects become visible. Because only one
attempt of a batch can ever commit, this holds for non-deterministic transforms
too, as long as this is the pipeline's only sink.

Where each hook runs: everything here runs on the **driver**. The batch's rows
are collected to the driver (``DataFrame.toArrow()``) and written from there,
which bounds a batch by driver memory; keep batches bounded with the source's
read limits.

Replay: a batch whose offsets the ledger already covers is skipped (step 2).
Fencing: a run whose epoch is no longer the owner's gets
:class:`~sparkonce.errors.FencedError` at step 1 and its batch is rolled back.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from datetime import date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.config import Guarantee, StoreURL, WriteMode, check_identifier
from sparkonce.db import (
    Dialect,
    connect,
    dialect_for,
    fetchall,
    qi,
    qlist,
    write_transaction,
)
from sparkonce.errors import ConfigError, SinkError, SparkOnceError
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, Owner
from sparkonce.ledger.sql import SqlLedger
from sparkonce.offsets import Coverage, TopicPartition, classify
from sparkonce.protocol import CrashPoint, crash_point
from sparkonce.sinks.base import Sink

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

COMMIT_ATTEMPTS = 3  # a commit whose connection dropped is retried on a new connection


class SqlSink(Sink):
    """Driver-commit transactional sink over a SQL store (see the module docstring).

    ``mode="append"`` inserts every row; ``mode="upsert"`` inserts or replaces
    rows by ``keys`` (the table gets a primary key on them when the sink creates
    it). The sink creates the output table from the DataFrame's schema if it is
    missing, and its own metadata tables ``sparkonce_owner`` and
    ``sparkonce_ledger``.
    """

    guarantee: ClassVar[Guarantee] = "effectively-once"
    supports_connection_drop: ClassVar[bool] = True
    scheme: ClassVar[str] = ""

    def __init__(
        self,
        url: str | StoreURL,
        table: str,
        *,
        mode: WriteMode = "append",
        keys: tuple[str, ...] | list[str] = (),
    ) -> None:
        self.url = url if isinstance(url, StoreURL) else StoreURL.parse(url)
        if self.scheme and self.url.scheme != self.scheme:
            raise ConfigError(
                f"{type(self).__name__} needs a {self.scheme} URL, got {str(self.url)!r}"
            )
        self.table = check_identifier(table, "table")
        if mode not in ("append", "upsert"):
            raise ConfigError(f"sink mode {mode!r} is not supported: use 'append' or 'upsert'")
        self.mode: WriteMode = mode
        self.keys = tuple(check_identifier(k, "key column") for k in keys)
        if mode == "upsert" and not self.keys:
            raise ConfigError(
                "sink mode 'upsert' needs keys=[...]: the columns that identify a row"
            )
        if mode == "append" and self.keys:
            raise ConfigError(
                "keys=[...] only applies to mode='upsert'; remove keys or set the mode"
            )
        if len(set(self.keys)) != len(self.keys):
            raise ConfigError(f"keys {list(self.keys)} name a column twice")
        self.dialect: Dialect = dialect_for(self.url)
        self._ledger = SqlLedger(self.dialect, inspect_hint=self._status_hint("{pipeline}"))
        self._conn: Any = None
        self._table_checked = False

    # -- lifecycle --------------------------------------------------------
    def open(self) -> None:
        if self._conn is not None:
            return
        self._conn = connect(self.url)
        self._ledger.ensure_schema(self._conn)

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def describe(self) -> str:
        keys = f" keys={list(self.keys)}" if self.keys else ""
        return f"{type(self).__name__}({self.url} table={self.table} mode={self.mode}{keys})"

    def __repr__(self) -> str:
        return self.describe()

    def _status_hint(self, pipeline: str) -> str:
        return f"sparkonce status --pipeline {pipeline} --sink '{self.url}'"

    @property
    def conn(self) -> Any:
        if self._conn is None:
            self.open()
        return self._conn

    # -- ownership and progress --------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        owner = self._ledger.acquire(self.conn, pipeline, source)
        log.info("pipeline %r took epoch %d in %s", pipeline, owner.epoch, self.url)
        return owner

    def owner(self, pipeline: str) -> Owner | None:
        return self._ledger.owner(self.conn, pipeline)

    def end_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        return self._ledger.end_offsets(self.conn, pipeline)

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        return self._ledger.entries(self.conn, pipeline)

    def pipelines(self) -> list[str]:
        return self._ledger.pipelines(self.conn)

    # -- schema --------------------------------------------------------------
    def validate(self, schema: StructType) -> None:
        names = [f.name for f in schema.fields]
        for name in names:
            check_identifier(name, "output column")
        missing = [k for k in self.keys if k not in names]
        if missing:
            raise ConfigError(
                f"upsert keys {missing} are not columns of the pipeline's output "
                f"(columns: {names}); fix keys=[...] or the transform"
            )
        for f in schema.fields:
            self.dialect.column_type(f.dataType, f.name)  # raises for unsupported types
        existing = self._existing_columns()
        if existing:
            absent = [n for n in names if n not in existing]
            if absent:
                raise ConfigError(
                    f"table {self.table!r} in {self.url} has no column(s) {absent}; its columns "
                    f"are {sorted(existing)}. Alter the table or rename the output columns."
                )

    def _existing_columns(self) -> set[str]:
        if self.dialect.name == "sqlite":
            rows = fetchall(self.conn, self.dialect, f"PRAGMA table_info({qi(self.table)})")
            return {str(r[1]) for r in rows}
        rows = fetchall(
            self.conn,
            self.dialect,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = %s",
            (self.table,),
        )
        return {str(r[0]) for r in rows}

    def _create_table(self, conn: Any, schema: StructType) -> None:
        cols = []
        for f in schema.fields:
            null = " NOT NULL" if f.name in self.keys else ""
            cols.append(f"{qi(f.name)} {self.dialect.column_type(f.dataType, f.name)}{null}")
        if self.keys:
            cols.append(f"PRIMARY KEY ({qlist(self.keys)})")
        conn.execute(f"CREATE TABLE IF NOT EXISTS {qi(self.table)} ({', '.join(cols)})")

    # -- the commit protocol ----------------------------------------------------
    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one micro-batch (runs on the driver, inside foreachBatch).

        The rows are collected first, outside the transaction, so the database
        lock is held only while writing. A dropped connection is retried on a
        fresh one: the retry's step 2 finds the batch if the lost COMMIT had
        in fact succeeded.
        """
        table = df.toArrow()
        columns = list(table.column_names)
        rows = self._rows_from_arrow(table, df.schema)
        crash_point(CrashPoint.BEFORE_COMMIT)
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                result = self._commit_once(ctx, df.schema, columns, rows)
                break
            except SparkOnceError:
                raise  # already explains itself (fenced, ledger conflict, bad rows, ...)
            except Exception as exc:
                if not self._is_connection_error(exc) or attempt == COMMIT_ATTEMPTS:
                    raise self._wrap_write_error(exc, ctx) from exc
                log.warning(
                    "pipeline %r batch %s: connection to %s lost during commit (%s); "
                    "retrying on a new connection (attempt %d/%d)",
                    ctx.pipeline,
                    ctx.ranges,
                    self.url.address,
                    exc,
                    attempt + 1,
                    COMMIT_ATTEMPTS,
                )
                self._drop_connection()
        crash_point(CrashPoint.AFTER_LEDGER_COMMIT)
        return result

    def _commit_once(
        self, ctx: BatchContext, schema: StructType, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> CommitResult:
        conn = self.conn
        with write_transaction(conn, self.dialect):
            # Step 1: this run's epoch must still be the owner's (row lock in PostgreSQL,
            # database write lock in SQLite, held until step 5).
            self._ledger.check_owner(conn, ctx.pipeline, ctx.epoch)

            # Step 2: a batch the ledger already covers is a replay: do nothing.
            last = self._ledger.last(conn, ctx.pipeline)
            coverage = classify(ctx.ranges, {} if last is None else last.end_offsets)
            if coverage is Coverage.COMMITTED:
                assert last is not None
                seq = self._covering_seq(conn, ctx, last)
                return CommitResult(True, 0, seq, "offsets already in the ledger (replay)")
            if coverage is Coverage.NO_DATA:
                seq = self._ledger.find_no_data_batch(
                    conn, ctx.pipeline, ctx.checkpoint_id, ctx.spark_batch_id
                )
                if seq is not None:
                    return CommitResult(True, 0, seq, "no-data batch already committed (replay)")
                if not rows:
                    return CommitResult(True, 0, None, "no new offsets and no rows")

            # Step 3: make the batch's rows visible.
            if not self._table_checked:
                self._create_table(conn, schema)
            self._write_rows(conn, columns, rows)
            if crash_point(CrashPoint.AFTER_ROWS):
                self._lose_connection(conn)

            # Step 4: the ledger row, in the same transaction.
            seq = 0 if last is None else last.seq + 1
            self._ledger.record(
                conn,
                pipeline=ctx.pipeline,
                seq=seq,
                ranges=ctx.ranges,
                epoch=ctx.epoch,
                row_count=len(rows),
                spark_batch_id=ctx.spark_batch_id,
                checkpoint_id=ctx.checkpoint_id,
            )
            crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)
            # Step 5: commit (on leaving the with-block).
        self._table_checked = True
        return CommitResult(False, len(rows), seq)

    def _covering_seq(self, conn: Any, ctx: BatchContext, last: LedgerEntry) -> int | None:
        if last.ranges == ctx.ranges:
            return last.seq
        for entry in reversed(self._ledger.entries(conn, ctx.pipeline)):
            if entry.ranges == ctx.ranges:
                return entry.seq
        return None

    # -- row writing ----------------------------------------------------------------
    def _write_rows(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if self.mode == "upsert":
            self._check_unique_keys(columns, rows)
        self._insert(conn, columns, rows)

    def _check_unique_keys(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        idx = [columns.index(k) for k in self.keys]
        counts = Counter(tuple(r[i] for i in idx) for r in rows)
        for key, n in counts.items():
            named = dict(zip(self.keys, key, strict=True))
            if any(v is None for v in key):
                raise SinkError(
                    f"upsert into {self.table!r}: a row has a NULL key {named}; "
                    "key columns must not be NULL. Nothing of this batch was committed."
                )
            if n > 1:
                raise SinkError(
                    f"upsert into {self.table!r}: the batch holds {n} rows for key "
                    f"{named}, so which one wins would depend on "
                    "row order. Aggregate or deduplicate by the key in the transform. Nothing of "
                    "this batch was committed."
                )

    def _insert(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        raise NotImplementedError

    def _upsert_clause(self, columns: list[str]) -> str:
        rest = [c for c in columns if c not in self.keys]
        if not rest:
            return f" ON CONFLICT ({qlist(self.keys)}) DO NOTHING"
        sets = ", ".join(f"{qi(c)} = excluded.{qi(c)}" for c in rest)
        return f" ON CONFLICT ({qlist(self.keys)}) DO UPDATE SET {sets}"

    def _rows_from_arrow(self, table: Any, schema: StructType) -> list[tuple[Any, ...]]:
        cols = [table.column(i).to_pylist() for i in range(table.num_columns)]
        return list(zip(*cols, strict=True)) if cols else []

    def _lose_connection(self, conn: Any) -> None:
        """Fault injection: lose the connection mid-transaction, as a network drop would."""
        log.warning("fault injection: dropping the connection to %s mid-commit", self.url.address)
        conn.close()

    # -- errors ----------------------------------------------------------------
    def _is_connection_error(self, exc: Exception) -> bool:
        import sqlite3

        return isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc)

    def _drop_connection(self) -> None:
        try:
            self.close()
        except Exception:
            log.debug("closing a broken connection failed", exc_info=True)
        self._conn = None

    def _wrap_write_error(self, exc: Exception, ctx: BatchContext) -> SinkError:
        return SinkError(
            f"pipeline {ctx.pipeline!r}: writing batch {ctx.ranges} to {self.table!r} in "
            f"{self.url} failed: {exc}. The transaction was rolled back; nothing of the batch "
            "is visible and the ledger is unchanged. Fix the cause and restart the run; the "
            "batch will be replayed."
        )

    # -- administration -------------------------------------------------------------
    def relocated(self, url: str | StoreURL) -> SqlSink:
        """The same sink (table, mode, keys) in another store, e.g. a test database."""
        parsed = url if isinstance(url, StoreURL) else StoreURL.parse(url)
        cls: type[SqlSink] = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
        return cls(parsed, self.table, mode=self.mode, keys=self.keys)

    def reset(self, pipeline: str) -> None:
        """Drop the output table and ``pipeline``'s owner and ledger rows. Destructive.

        Used by ``sparkonce verify`` to start each trial from a clean sink; never
        called by a pipeline run.
        """
        from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE

        conn = self.conn
        with write_transaction(conn, self.dialect):
            conn.execute(f"DROP TABLE IF EXISTS {qi(self.table)}")
            for t in (LEDGER_TABLE, OWNER_TABLE):
                conn.execute(self.dialect.q(f"DELETE FROM {t} WHERE pipeline = %s"), (pipeline,))
        self._table_checked = False

    # -- reading ----------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        if not self._existing_columns():
            return []
        cur = self.conn.execute(f"SELECT * FROM {qi(self.table)}")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur.fetchall()]


class SQLiteSink(SqlSink):
    """Transactional sink into a SQLite database file (the embedded default).

    Guarantee: **effectively-once** (see :mod:`sparkonce.sinks.sql`): rows, the
    epoch check and the ledger row commit in one SQLite transaction, taken with
    ``BEGIN IMMEDIATE`` and made durable with ``synchronous=FULL``.
    """

    scheme = "sqlite"

    def _insert(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        marks = ", ".join("?" for _ in columns)
        sql = f"INSERT INTO {qi(self.table)} ({qlist(columns)}) VALUES ({marks})"
        if self.mode == "upsert":
            sql += self._upsert_clause(columns)
        conn.executemany(sql, rows)

    def _rows_from_arrow(self, table: Any, schema: StructType) -> list[tuple[Any, ...]]:
        rows = super()._rows_from_arrow(table, schema)
        if not any(_needs_sqlite_conversion(f.dataType) for f in schema.fields):
            return rows
        return [tuple(_sqlite_value(v) for v in r) for r in rows]


def _needs_sqlite_conversion(dtype: Any) -> bool:
    from pyspark.sql import types as T

    return isinstance(
        dtype, (T.DecimalType, T.DateType, T.TimestampType, T.TimestampNTZType, T.BooleanType)
    )


def _sqlite_value(v: Any) -> Any:
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, (datetime, date)):
        return v.isoformat()
    if isinstance(v, bool):
        return int(v)
    return v


class PostgresSink(SqlSink):
    """Transactional sink into PostgreSQL, through psycopg 3.

    Guarantee: **effectively-once** (see :mod:`sparkonce.sinks.sql`): rows are
    loaded with COPY, and the epoch check (``SELECT ... FOR UPDATE`` on the
    owner row), the rows and the ledger row commit in one transaction. A
    connection dropped mid-commit is retried on a new connection; if the lost
    COMMIT had succeeded the retry finds the ledger row and does nothing.
    """

    scheme = "postgresql"

    def _insert(self, conn: Any, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        collist = qlist(columns)
        if self.mode == "append":
            with (
                conn.cursor() as cur,
                cur.copy(f"COPY {qi(self.table)} ({collist}) FROM STDIN") as cp,
            ):
                for r in rows:
                    cp.write_row(r)
            return
        conn.execute(
            f"CREATE TEMP TABLE sparkonce_stage (LIKE {qi(self.table)} INCLUDING DEFAULTS) "
            "ON COMMIT DROP"
        )
        with conn.cursor() as cur, cur.copy(f"COPY sparkonce_stage ({collist}) FROM STDIN") as cp:
            for r in rows:
                cp.write_row(r)
        conn.execute(
            f"INSERT INTO {qi(self.table)} ({collist}) SELECT {collist} FROM sparkonce_stage"
            + self._upsert_clause(columns)
        )

    def _lose_connection(self, conn: Any) -> None:
        log.warning("fault injection: terminating this PostgreSQL session mid-commit")
        import psycopg

        with contextlib.suppress(psycopg.OperationalError):  # the server closes the session
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        raise psycopg.OperationalError("server closed the connection (injected fault)")

    def _is_connection_error(self, exc: Exception) -> bool:
        import psycopg

        if isinstance(exc, psycopg.OperationalError):
            return True
        return bool(self._conn is not None and getattr(self._conn, "closed", False))
