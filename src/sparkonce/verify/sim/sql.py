"""SQL targets: SQLite and PostgreSQL, with the SQL sink or the two-phase sink.

The ledger store is the real :class:`~sparkonce.ledger.sql.SqlLedgerStore`, subclassed
only to report each committed transaction's ledger entries (:class:`ObservedSqlStore`)
and to inject a lost COMMIT acknowledgement. The stager is the real ``SQLiteSink``,
``PostgresSink`` or ``PostgresTwoPhaseSink``; the two-phase sink's own ``prepare`` and
task function run, on a :class:`~sparkonce.verify.sim.target.TaskFrame`.

SQLite: one throwaway file per target (on /dev/shm when it exists), written with
``synchronous=OFF`` (a durability pragma only: the file dies with the process anyway;
WAL mode, the write lock and every statement stay those of a real run).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.commit import Committer, Staged, Stager
from sparkonce.config import StoreURL
from sparkonce.db import connect, dialect_for, write_transaction
from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import Owner
from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE, SqlLedgerStore
from sparkonce.verify.sim.target import (
    Endpoint,
    Entry,
    ObservedStore,
    Planned,
    Row,
    Running,
    StageFn,
    Target,
    TaskFrame,
)
from sparkonce.verify.sim.world import InjectedFailure

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.ledger.base import BatchContext

COLUMNS = ("p", "o", "v", "epoch")


class ObservedSqlStore(ObservedStore, SqlLedgerStore):
    """The real SQL ledger store; it also reports each committed transaction's entries
    (:class:`~sparkonce.verify.sim.target.ObservedStore`). A lost acknowledgement loses
    the connection after its COMMIT went through."""

    relaxed = False  # SQLite: synchronous=OFF on every connection
    _relaxed_conn: Any = None

    @property
    def conn(self) -> Any:
        c = SqlLedgerStore.conn.fget(self)  # type: ignore[attr-defined]
        if self.relaxed and c is not self._relaxed_conn:
            c.execute("PRAGMA synchronous=OFF")
            self._relaxed_conn = c
        return c

    def _lost_ack(self) -> Exception:
        """The connection drops after COMMIT went through: the error the caller sees."""
        conn = self._conn
        if self.dialect.name == "sqlite":
            conn.close()
            try:
                conn.execute("SELECT 1")  # what the next statement gets
            except Exception as exc:
                return exc
            raise AssertionError("a closed SQLite connection ran a statement")
        import psycopg

        with contextlib.suppress(Exception):
            conn.close()
        return psycopg.OperationalError("server closed the connection unexpectedly (injected)")

    def rollback_if_open(self) -> None:
        """What a process's death does to its session: any open transaction is gone."""
        if self._conn is None:
            return
        try:
            if self.dialect.name == "sqlite":
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            else:
                from psycopg.pq import TransactionStatus

                if self._conn.info.transaction_status != TransactionStatus.IDLE:
                    self._conn.execute("ROLLBACK")
        except Exception:
            self.reconnect()


class SqlTarget(Target):
    """One pipeline and one output table in a SQLite file or a PostgreSQL database.

    ``owns_store``: nothing else uses the store (a SQLite file of its own), so
    :meth:`reset` empties whole tables, and :meth:`close` removes the file; otherwise
    it deletes this pipeline's rows.
    """

    def __init__(
        self,
        url: str,
        *,
        sink: str = "sql",
        pipeline: str = "sim",
        table: str = "sim_out",
        fresh_connections: bool = False,
        owns_store: bool = False,
    ) -> None:
        self.url = StoreURL.parse(url)
        self.dialect = dialect_for(self.url)
        self.store_name = "sqlite" if self.dialect.name == "sqlite" else "postgres"
        if sink not in ("sql", "twophase"):
            raise ValueError(f"unknown SQL sink {sink!r}")
        if sink == "twophase" and self.dialect.name != "postgresql":
            raise ValueError("the two-phase sink needs PostgreSQL")
        self.sink = sink
        self.pipeline = pipeline
        self.table = table
        self.fresh_connections = fresh_connections
        self.owns_store = owns_store
        self._pool: list[Endpoint] = []
        self.task_connections = TaskConnections()
        self._tables_ready = False
        self._admin = self._new_endpoint()
        self._setup()
        q = self.dialect.q
        self._ledger_sql = q(
            "SELECT seq, ranges, epoch, row_count, spark_batch_id, checkpoint_id "
            f"FROM {LEDGER_TABLE} WHERE pipeline = %s ORDER BY seq"
        )
        self._owner_sql = q(f"SELECT epoch FROM {OWNER_TABLE} WHERE pipeline = %s")
        self._rows_sql = f'SELECT p, o, v, epoch FROM "{self.table}"'

    # -- endpoints -----------------------------------------------------------------------
    def _new_endpoint(self) -> Endpoint:
        store = ObservedSqlStore(self.url, self.dialect)
        store.relaxed = self.dialect.name == "sqlite"
        store.conn  # noqa: B018 - connects and creates the ledger tables
        stager: Stager
        if self.sink == "twophase":
            from sparkonce.sinks.twophase import PostgresTwoPhaseSink

            tp = PostgresTwoPhaseSink(self.url, self.table)
            # The sink's own connection is the run's store: prepare's fence, the collector
            # and the commit all go through it, as in one driver process.
            tp.store = tp.stager.store = store
            tp._committer = Committer(store, tp.stager, faults=FaultPlan())
            tp.stager._ready = self._tables_ready
            tp.stager._attempts_ready = self._tables_ready
            tp.stager._table_checked = True
            stager = tp.stager
        else:
            from sparkonce.sinks.sql import PostgresSink, SQLiteSink

            cls = SQLiteSink if self.dialect.name == "sqlite" else PostgresSink
            sql = cls(self.url, self.table)
            sql.stager._table_checked = True  # the table is created by _setup
            stager = sql.stager
        return Endpoint(store, stager)

    def take(self) -> Endpoint:
        if self._pool and not self.fresh_connections:
            return self._pool.pop()
        return self._new_endpoint()

    def give_back(self, ep: Endpoint) -> None:
        ep.store.observer = None
        ep.store.lose_ack = 0
        if self.fresh_connections:
            ep.store.close()
            return
        ep.store.rollback_if_open()
        self._pool.append(ep)

    def acquire(self, ep: Endpoint) -> Owner:
        owner = ep.store.acquire(self.pipeline)
        if self.sink == "twophase":  # as PostgresTwoPhaseSink.acquire: collect what is left
            ep.stager.collect(self.pipeline, owner.epoch)  # type: ignore[attr-defined]
        return owner

    # -- tables --------------------------------------------------------------------------
    def _setup(self) -> None:
        conn = self._admin.store.conn
        if self.sink == "twophase":
            from sparkonce.sinks.twophase import TwoPhaseStager

            tp = self._admin.stager
            assert isinstance(tp, TwoPhaseStager)
            tp.ensure_attempts_table()
            tp._ensure_tables(_spark_schema())
            self._tables_ready = True
            self.precommit_table = tp.precommit_table
            return
        big = "INTEGER" if self.dialect.name == "sqlite" else "BIGINT"
        with write_transaction(conn, self.dialect):
            conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{self.table}" (p {big}, o {big}, v TEXT, epoch {big})'
            )

    def reset(self) -> None:
        """Empty the output and the pipeline's owner and ledger rows."""
        conn = self._admin.store.conn
        if self.dialect.name == "postgresql":
            # One round trip (the pipeline name is the target's own, not user input).
            conn.execute(self._reset_sql)
            return
        with write_transaction(conn, self.dialect):
            conn.execute(f'DELETE FROM "{self.table}"')
            for t in (LEDGER_TABLE, OWNER_TABLE):
                if self.owns_store:
                    conn.execute(f"DELETE FROM {t}")  # SQLite truncates without a WHERE
                else:
                    conn.execute(f"DELETE FROM {t} WHERE pipeline = ?", (self.pipeline,))

    @property
    def _reset_sql(self) -> str:
        p = self.pipeline.replace("'", "''")
        first = (
            f'DELETE FROM "{self.precommit_table}"; '
            f"DELETE FROM sparkonce_attempts WHERE pipeline = '{p}'"
            if self.sink == "twophase"
            else f'DELETE FROM "{self.table}"'
        )
        return (
            f"BEGIN; {first}; DELETE FROM {LEDGER_TABLE} WHERE pipeline = '{p}'; "
            f"DELETE FROM {OWNER_TABLE} WHERE pipeline = '{p}'; COMMIT"
        )

    def visible_rows(self) -> list[Row]:
        return self._admin.store.conn.execute(self._rows_sql).fetchall()

    def ledger(self) -> list[Entry]:
        rows = self._admin.store.conn.execute(self._ledger_sql, (self.pipeline,)).fetchall()
        return [Entry(int(r[0]), None, int(r[2]), int(r[3]), r[4], r[5], r[1]) for r in rows]  # type: ignore[arg-type]

    def owner_epoch(self) -> int | None:
        row = self._admin.store.conn.execute(self._owner_sql, (self.pipeline,)).fetchone()
        return None if row is None else int(row[0])

    # -- staging -------------------------------------------------------------------------
    def stage(
        self, run: Running, ctx: BatchContext, batch: Planned, rows: list[Row], fail: bool
    ) -> tuple[StageFn, list[int], list[int]]:
        attempts: list[int] = []
        failed: list[int] = []
        if self.sink == "twophase":
            return self._twophase_stage(run, ctx, rows, fail, attempts, failed), attempts, failed
        if fail:

            def failing(seq: int) -> Staged:
                raise InjectedFailure("injected batch failure")

            return failing, attempts, failed
        staged = Staged(len(rows), (None, list(COLUMNS), rows))
        return lambda seq: staged, attempts, failed

    def _twophase_stage(
        self,
        run: Running,
        ctx: BatchContext,
        rows: list[Row],
        fail: bool,
        attempts: list[int],
        failed: list[int],
    ) -> StageFn:
        """The sink's own prepare: one pre-commit task per partition of the batch."""
        import pyarrow as pa

        from sparkonce.sinks.twophase import TwoPhaseStager

        sink = run.endpoint.stager
        assert isinstance(sink, TwoPhaseStager)
        by_task: dict[int, list[Row]] = {}
        for r in rows:
            by_task.setdefault(r[0], []).append(r)
        schema = _arrow_schema()
        tasks = [
            pa.RecordBatch.from_pylist(
                [dict(zip(COLUMNS, r, strict=True)) for r in part], schema=schema
            )
            for part in by_task.values()
        ]
        frame = TaskFrame(_spark_schema(), tasks, fail=fail)
        pool = self.task_connections

        def stage(seq: int) -> Staged:
            _task_pool.current = pool
            try:
                return sink.prepare(ctx, frame, seq)  # type: ignore[arg-type]
            finally:
                _task_pool.current = None
                attempts.extend(int(o["attempt"]) for o in frame.outputs if o["rows"])
                failed.extend(int(o["attempt"]) for o in frame.failed if o["rows"])

        return stage

    def check_after_event(self, failed_attempts: list[int]) -> int:
        if self.sink != "twophase" or not failed_attempts:
            return 0
        from sparkonce.sinks.twophase import ATTEMPTS_TABLE

        row = self._admin.store.conn.execute(
            f'SELECT count(*) FROM "{self.precommit_table}" WHERE sparkonce_attempt = ANY(%s) '
            f"AND sparkonce_attempt IN (SELECT attempt_id FROM {ATTEMPTS_TABLE} "
            "WHERE state = 'committed')",
            (list(failed_attempts),),
        ).fetchone()
        return int(row[0])

    def close(self) -> None:
        """Close every connection; a SQLite file this target owns is removed."""
        for ep in [*self._pool, self._admin]:
            with contextlib.suppress(Exception):
                ep.store.close()
        self._pool.clear()
        self.task_connections.close()
        if self.owns_store and self.dialect.name == "sqlite":
            remove_sqlite(str(self.url))


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("p", pa.int64()), ("o", pa.int64()), ("v", pa.string()), ("epoch", pa.int64())]
    )


@functools.cache
def _spark_schema() -> Any:
    from pyspark.sql import types as T

    return T.StructType(
        [
            T.StructField("p", T.LongType()),
            T.StructField("o", T.LongType()),
            T.StructField("v", T.StringType()),
            T.StructField("epoch", T.LongType()),
        ]
    )


# --- the two-phase sink's task connections ---------------------------------------------------


class _TaskPool(threading.local):
    current: TaskConnections | None = None


_task_pool = _TaskPool()
_connect_lock = threading.Lock()
_connect_installed = False


def _install_task_connect() -> None:
    """Route the two-phase tasks' ``connect`` to this thread's pool, when it has one."""
    global _connect_installed
    with _connect_lock:
        if _connect_installed:
            return
        from sparkonce.sinks import twophase

        real = twophase.connect

        def task_connect(url: StoreURL, **kwargs: Any) -> Any:
            pool = _task_pool.current
            return real(url, **kwargs) if pool is None else pool.connect(url)

        setattr(twophase, "connect", task_connect)  # noqa: B010 - mypy: a module attribute
        _connect_installed = True


class TaskConnections:
    """The two-phase sink's pre-commit tasks' connections, kept open from task to task.

    A real task opens a connection of its own and closes it. Opening one costs about 5 ms
    on PostgreSQL, more than the rest of a task; a connection whose transaction ended is,
    to the server, the same as a new one. While a lane's stage runs, the sink's tasks get
    one from here, and their ``close`` rolls back what is open and returns it.
    """

    def __init__(self) -> None:
        self._free: list[Any] = []
        _install_task_connect()

    def connect(self, url: StoreURL) -> Any:
        return _TaskConnection(self._free.pop() if self._free else connect(url), self._free)

    def close(self) -> None:
        for conn in self._free:
            with contextlib.suppress(Exception):
                conn.close()
        self._free.clear()


class _TaskConnection:
    """A pooled connection as a task sees it: ``close`` gives it back."""

    def __init__(self, conn: Any, free: list[Any]) -> None:
        self._conn = conn
        self._free = free

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.execute(*args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.cursor(*args, **kwargs)

    def close(self) -> None:
        from psycopg.pq import TransactionStatus

        conn = self._conn
        try:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            return
        self._free.append(conn)


# --- SQLite files ----------------------------------------------------------------------------


def sqlite_url(name: str | int = 0) -> str:
    """A SQLite file for one target, in /dev/shm when it exists (memory, no disk syncs)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return f"sqlite:///{base / f'sparkonce-sim-{os.getpid()}-{name}.db'}"


def remove_sqlite(url: str) -> None:
    path = StoreURL.parse(url).path
    if path is None:
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")
