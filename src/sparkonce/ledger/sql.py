"""The owner and ledger tables inside a SQL sink (SQLite or PostgreSQL).

Tables (created by :meth:`SqlLedger.ensure_schema`)::

    sparkonce_owner (pipeline PK, epoch, acquired_at, holder)
    sparkonce_ledger(pipeline, seq, ranges JSON, epoch, row_count, committed_at,
                     spark_batch_id, checkpoint_id, stateful, commit_seconds, version,
                     PK (pipeline, seq))

``stateful`` records whether the query kept state in Spark's checkpoint when the
batch committed, so that a lost checkpoint is recognised from the ledger alone.
``commit_seconds`` is how long the commit took up to the ledger row's insert
(:attr:`~sparkonce.ledger.base.LedgerEntry.commit_seconds`). ``version`` is the
entry's format version (:mod:`sparkonce.ledger.records`; NULL in rows an older sparkonce
wrote, which read as version 1). All three columns are added to a ledger table an older
sparkonce created.

The ledger's newest entry holds the pipeline's resume point: its end offsets.
Every method takes a connection, so the sink can run the ledger's statements in
the same transaction as its own rows (steps 1, 2 and 4 of the protocol).

**A long history.** Every statement of a start (the owner row, the newest entry) and of a
commit reads a bounded number of rows through an index, however many batches the ledger
holds: the primary key ``(pipeline, seq)`` finds the newest entry and an entry by seq, and
the index ``sparkonce_ledger_spark_batch`` on ``(pipeline, checkpoint_id, spark_batch_id)``
finds a no-data batch by its Spark identity (:meth:`SqlLedger.find_no_data_batch`, which
every new no-data batch asks; without the index it read every row of the pipeline).
:meth:`SqlLedger.entries` alone reads them all (status, ``sparkonce verify``).

**Pruning** (:meth:`SqlLedger.prune`, and ``SqlSink(ledger_keep=N)``, which prunes in
every commit's transaction) deletes a pipeline's oldest entries, keeping the newest
``keep`` (at least 1) and every entry that ends at the ledger's end. Why nothing a run
asks of the ledger changes:

* the resume point and the stateful flag are the newest entry's, which is kept;
* a replayed batch is classified against the newest entry's end offsets
  (:func:`sparkonce.offsets.classify`): a replay of a pruned batch is still recognised
  as committed and skipped, with no entry to name (``seq`` None in its result);
* a no-data batch is found by its Spark identity only when it sits exactly at the
  ledger's end, and every entry that ends there is kept (entries before the newest one
  behind the end can never equal such a batch: ends only grow along the ledger);
* the seq chain stays gap-free: pruning removes a prefix, and new entries go on from the
  newest seq; ``entries`` then starts at the first kept seq;
* the owner table is not touched, so fencing is unchanged.
"""

from __future__ import annotations

import logging
import os
import socket
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from sparkonce.config import StoreURL
from sparkonce.db import Dialect, connect, execute, fetchall, fetchone, write_transaction
from sparkonce.errors import ConfigError, FencedError
from sparkonce.ledger.base import BatchContext, LedgerEntry, LedgerStore, Owner
from sparkonce.ledger.records import ENTRY_VERSION, SQL_COLUMNS, entry_from_row
from sparkonce.offsets import BatchRanges, TopicPartition

log = logging.getLogger(__name__)

OWNER_TABLE = "sparkonce_owner"
LEDGER_TABLE = "sparkonce_ledger"
SPARK_BATCH_INDEX = "sparkonce_ledger_spark_batch"
# How a no-data batch is looked up by its Spark identity (through SPARK_BATCH_INDEX).
NO_DATA_QUERY = (
    f"SELECT seq, ranges FROM {LEDGER_TABLE} "
    "WHERE pipeline = %s AND checkpoint_id = %s AND spark_batch_id = %s"
)
PRUNE_ROWS = 10_000  # at most this many entries deleted per prune (a commit stays short)


class SqlLedger:
    """Owner epochs and the batch ledger, as SQL over one connection at a time."""

    def __init__(self, dialect: Dialect, *, inspect_hint: str = "") -> None:
        """``inspect_hint``: the command to inspect a pipeline; ``{pipeline}`` is filled in."""
        self.dialect = dialect
        self.inspect_hint = inspect_hint

    # -- schema ------------------------------------------------------------
    def ensure_schema(self, conn: Any) -> None:
        ts = "TEXT" if self.dialect.name == "sqlite" else "TIMESTAMPTZ"
        big = "INTEGER" if self.dialect.name == "sqlite" else "BIGINT"
        flag = "INTEGER" if self.dialect.name == "sqlite" else "BOOLEAN"
        real = "REAL" if self.dialect.name == "sqlite" else "DOUBLE PRECISION"
        # Columns newer than the table, added in this order to one an older sparkonce created.
        added = {"version": "INTEGER", "stateful": flag, "commit_seconds": real}
        stmts = [
            f"CREATE TABLE IF NOT EXISTS {OWNER_TABLE} ("
            f" pipeline TEXT PRIMARY KEY, epoch {big} NOT NULL CHECK (epoch >= 1),"
            f" acquired_at {ts} NOT NULL, holder TEXT NOT NULL, source TEXT)",
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ("
            f" pipeline TEXT NOT NULL, seq {big} NOT NULL CHECK (seq >= 0),"
            f" ranges TEXT NOT NULL, epoch {big} NOT NULL, row_count {big} NOT NULL,"
            f" committed_at {ts} NOT NULL, spark_batch_id {big}, checkpoint_id TEXT,"
            f" stateful {flag}, commit_seconds {real}, version INTEGER,"
            " PRIMARY KEY (pipeline, seq))",
            # A new no-data batch is looked up by its Spark identity: an index, not a scan.
            f"CREATE INDEX IF NOT EXISTS {SPARK_BATCH_INDEX} ON {LEDGER_TABLE}"
            " (pipeline, checkpoint_id, spark_batch_id)",
        ]
        # The PostgreSQL branch and its two helpers are left out of mutation testing: only
        # tests/postgres reaches them, not the fast tests mutmut runs ([tool.mutmut]).
        if self.dialect.name == "postgresql":  # pragma: no mutate block
            # DDL only for what is missing, and never a lock upgrade on the ledger table:
            # CREATE INDEX takes a SHARE lock and ALTER TABLE an ACCESS EXCLUSIVE one, even
            # with IF NOT EXISTS, so running them on every open deadlocked with other runs'
            # commits into the same database (the PostgreSQL simulation caught it). The
            # catalog reads take no table lock.
            with write_transaction(conn, self.dialect):
                missing = self._pg_missing(conn, added)
            if not missing:
                return
            # Two first runs may race to create the tables; serialise them, then look again
            # in a transaction begun once the lock is held. A transaction begun before the
            # wait (the lock's own) kept the catalog cache of its start: it still saw no
            # tables after another run had created them, ran the DDL on the tables in use,
            # and deadlocked with their commits (seen in the simulation).
            conn.execute("SELECT pg_advisory_lock(727274)")  # autocommit: a session lock
            try:
                self._pg_create(conn, added, stmts)
            finally:
                try:
                    conn.execute("SELECT pg_advisory_unlock(727274)")
                except Exception:  # a lost connection took its session lock with it
                    log.debug("advisory unlock failed", exc_info=True)
        else:
            for s in stmts:
                conn.execute(s)
            columns = {str(r[1]) for r in conn.execute(f"PRAGMA table_info({LEDGER_TABLE})")}
            for name, kind in added.items():
                if name not in columns:  # a ledger written by an older sparkonce
                    conn.execute(f"ALTER TABLE {LEDGER_TABLE} ADD COLUMN {name} {kind}")

    def _pg_create(
        self, conn: Any, added: dict[str, str], stmts: list[str]
    ) -> None:  # pragma: no mutate block
        """What ``ensure_schema`` lacks on PostgreSQL, looked up again under its lock."""
        with write_transaction(conn, self.dialect):
            missing = self._pg_missing(conn, added)
            if missing and "tables" not in missing:
                # An older ledger table: take the strongest lock first, waiting for the
                # commits in flight, rather than upgrading a weaker one later.
                conn.execute(f"LOCK TABLE {LEDGER_TABLE} IN ACCESS EXCLUSIVE MODE")
            if "tables" in missing:
                for stmt in stmts[:2]:
                    conn.execute(stmt)
            if "tables" in missing or "index" in missing:
                conn.execute(stmts[2])
            for name, kind in added.items():
                if "tables" in missing or name in missing:
                    conn.execute(
                        f"ALTER TABLE {LEDGER_TABLE} ADD COLUMN IF NOT EXISTS {name} {kind}"
                    )

    def _pg_missing(self, conn: Any, added: dict[str, str]) -> set[str]:  # pragma: no mutate block
        """What PostgreSQL's schema lacks: ``"tables"``, ``"index"`` and the names of added
        columns (catalog reads only: no table lock)."""
        row = fetchone(
            conn,
            self.dialect,
            "SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)",
            (OWNER_TABLE, LEDGER_TABLE, SPARK_BATCH_INDEX),
        )
        assert row is not None
        if row[0] is None or row[1] is None:
            return {"tables"}
        missing = set() if row[2] is not None else {"index"}
        columns = fetchall(
            conn,
            self.dialect,
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_name = %s AND table_schema = current_schema()",
            (LEDGER_TABLE,),
        )
        return missing | (set(added) - {str(c[0]) for c in columns})

    # -- owner epochs ---------------------------------------------------------
    def acquire(self, conn: Any, pipeline: str, source: str | None = None) -> Owner:
        """Take ``epoch + 1`` for ``pipeline`` in its own transaction (fences older runs).

        ``source`` (a source URI, for status and lag) is recorded beside the epoch.
        """
        now = _now()
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        with write_transaction(conn, self.dialect):
            row = fetchone(
                conn,
                self.dialect,
                f"INSERT INTO {OWNER_TABLE}(pipeline, epoch, acquired_at, holder, source) "
                "VALUES (%s, 1, %s, %s, %s) ON CONFLICT (pipeline) DO UPDATE SET "
                f"epoch = {OWNER_TABLE}.epoch + 1, acquired_at = excluded.acquired_at, "
                "holder = excluded.holder, source = excluded.source RETURNING epoch",
                (pipeline, self._ts(now), holder, source),
            )
        return Owner(pipeline, int(row[0]), now, holder, source)

    def owner(self, conn: Any, pipeline: str) -> Owner | None:
        row = fetchone(
            conn,
            self.dialect,
            f"SELECT epoch, acquired_at, holder, source FROM {OWNER_TABLE} WHERE pipeline = %s",
            (pipeline,),
        )
        if row is None:
            return None
        return Owner(pipeline, int(row[0]), _parse_ts(row[1]), str(row[2]), row[3])

    def check_owner(self, conn: Any, pipeline: str, epoch: int) -> None:
        """Step 1, inside the commit transaction: raise FencedError unless we own it."""
        row = fetchone(
            conn,
            self.dialect,
            f"SELECT epoch, holder FROM {OWNER_TABLE} WHERE pipeline = %s"
            + self.dialect.lock_suffix(),
            (pipeline,),
        )
        current = int(row[0]) if row else 0
        if current != epoch:
            hint = self.inspect_hint.replace("{pipeline}", pipeline)
            raise FencedError(pipeline, epoch, current, hint, str(row[1]) if row else "")

    # -- ledger ---------------------------------------------------------------
    def last(self, conn: Any, pipeline: str) -> LedgerEntry | None:
        row = fetchone(
            conn,
            self.dialect,
            f"SELECT {_COLS} FROM {LEDGER_TABLE} WHERE pipeline = %s ORDER BY seq DESC LIMIT 1",
            (pipeline,),
        )
        return None if row is None else _entry(pipeline, row)

    def entry(self, conn: Any, pipeline: str, seq: int) -> LedgerEntry | None:
        """Entry ``seq`` (None: never committed, or pruned)."""
        row = fetchone(
            conn,
            self.dialect,
            f"SELECT {_COLS} FROM {LEDGER_TABLE} WHERE pipeline = %s AND seq = %s",
            (pipeline, seq),
        )
        return None if row is None else _entry(pipeline, row)

    def prune(self, conn: Any, pipeline: str, keep: int, *, limit: int = PRUNE_ROWS) -> int:
        """Delete the oldest entries of ``pipeline``, keeping the newest ``keep`` (>= 1) and
        every entry that ends at the ledger's end (see the module docstring for why that is
        safe). Deletes at most ``limit`` rows per call; returns how many it deleted.

        Run it inside the commit's transaction (``SqlSink(ledger_keep=...)`` does), or on its
        own: it changes nothing a run reads, so it needs no epoch.
        """
        if not isinstance(keep, int) or keep < 1:
            raise ConfigError(
                f"ledger keep must be an integer >= 1 (the newest entry), got {keep!r}"
            )
        last = self.last(conn, pipeline)
        if last is None:
            return 0
        cut = min(last.seq - keep + 1, self._first_at_end(conn, pipeline, last))
        row = fetchone(
            conn,
            self.dialect,
            f"SELECT min(seq) FROM {LEDGER_TABLE} WHERE pipeline = %s",
            (pipeline,),
        )
        first = int(row[0]) if row and row[0] is not None else cut
        upto = min(cut, first + limit)
        if upto <= first:
            return 0
        execute(
            conn,
            self.dialect,
            f"DELETE FROM {LEDGER_TABLE} WHERE pipeline = %s AND seq < %s",
            (pipeline, upto),
        )
        return upto - first

    def _first_at_end(self, conn: Any, pipeline: str, last: LedgerEntry) -> int:
        """The seq of the oldest entry in the run of newest entries that end at ``last``'s
        end offsets (the newest data batch and the no-data batches after it)."""
        ends = last.end_offsets
        first, below = last.seq, last.seq
        while below > 0:
            rows = fetchall(
                conn,
                self.dialect,
                f"SELECT seq, ranges FROM {LEDGER_TABLE} WHERE pipeline = %s AND seq < %s "
                "ORDER BY seq DESC LIMIT 100",
                (pipeline, below),
            )
            for seq, text in rows:
                if any(
                    end < ends[tp]
                    for tp, end in BatchRanges.from_json(text).ends().items()
                    if tp in ends
                ):
                    return first
                first = int(seq)
            if len(rows) < 100:
                return first
            below = first
        return first

    def end_offsets(self, conn: Any, pipeline: str) -> dict[TopicPartition, int]:
        """The resume point: end offsets of the newest ledger entry (empty if none)."""
        last = self.last(conn, pipeline)
        return {} if last is None else last.end_offsets

    def entries(self, conn: Any, pipeline: str) -> list[LedgerEntry]:
        rows = fetchall(
            conn,
            self.dialect,
            f"SELECT {_COLS} FROM {LEDGER_TABLE} WHERE pipeline = %s ORDER BY seq",
            (pipeline,),
        )
        return [_entry(pipeline, r) for r in rows]

    def find_no_data_batch(
        self, conn: Any, pipeline: str, checkpoint_id: str | None, spark_batch_id: int
    ) -> int | None:
        """The seq of a committed no-data batch with this Spark identity, if any.

        Only an entry with empty ranges counts: a data batch of an older run of the same
        checkpoint (restored from a backup, say) can carry the same identity.
        """
        if checkpoint_id is None:
            return None
        rows = fetchall(
            conn, self.dialect, NO_DATA_QUERY, (pipeline, checkpoint_id, spark_batch_id)
        )
        # Sorted here, not by ORDER BY: SQLite would rather walk the primary key in seq order
        # (every row of the pipeline) than use the index and sort its few rows.
        for seq, ranges in sorted(rows, key=lambda r: -int(r[0])):
            if BatchRanges.from_json(ranges).empty:
                return int(seq)
        return None

    def record(
        self,
        conn: Any,
        *,
        pipeline: str,
        seq: int,
        ranges: BatchRanges,
        epoch: int,
        row_count: int,
        spark_batch_id: int | None,
        checkpoint_id: str | None,
        stateful: bool = False,
        commit_seconds: float | None = None,
    ) -> None:
        """Step 4: insert the ledger row (inside the commit transaction)."""
        execute(
            conn,
            self.dialect,
            f"INSERT INTO {LEDGER_TABLE}(pipeline, seq, ranges, epoch, row_count, committed_at, "
            "spark_batch_id, checkpoint_id, stateful, commit_seconds, version) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)",
            (
                pipeline,
                seq,
                ranges.to_json(),
                epoch,
                row_count,
                self._ts(_now()),
                spark_batch_id,
                checkpoint_id,
                int(stateful) if self.dialect.name == "sqlite" else stateful,
                commit_seconds,
                ENTRY_VERSION,
            ),
        )

    def pipelines(self, conn: Any) -> list[str]:
        return [
            str(r[0]) for r in fetchall(conn, self.dialect, f"SELECT pipeline FROM {OWNER_TABLE}")
        ]

    def _ts(self, value: datetime) -> Any:
        return value.isoformat() if self.dialect.name == "sqlite" else value


_COLS = SQL_COLUMNS


def _entry(pipeline: str, row: Any) -> LedgerEntry:
    return entry_from_row(pipeline, row, LEDGER_TABLE)


def _now() -> datetime:
    return datetime.now(UTC)


def _parse_ts(value: Any) -> datetime:
    if isinstance(value, datetime):
        return value
    return datetime.fromisoformat(str(value))


class SqlLedgerStore(LedgerStore):
    """The ledger store of a SQL sink: :class:`SqlLedger` over the sink's one connection.

    ``transaction()`` is the database's write transaction (``BEGIN IMMEDIATE`` in
    SQLite, which takes the write lock; ``BEGIN`` in PostgreSQL, where step 1's
    ``SELECT ... FOR UPDATE`` locks the owner row). Both are held until step 5.
    """

    def __init__(
        self,
        url: StoreURL,
        dialect: Dialect,
        *,
        inspect_hint: str = "",
        keep: int | None = None,
    ) -> None:
        """``keep``: prune each pipeline's ledger to its newest ``keep`` entries in every
        commit's transaction (:meth:`SqlLedger.prune`); None keeps every entry."""
        self.url = url
        self.dialect = dialect
        self.ledger = SqlLedger(dialect, inspect_hint=inspect_hint)
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ConfigError(f"ledger_keep must be an integer >= 1 or None, got {keep!r}")
        self.keep = keep
        self._conn: Any = None

    # -- the connection ---------------------------------------------------------------
    @property
    def conn(self) -> Any:
        if self._conn is None:
            self._conn = connect(self.url)
            self.ledger.ensure_schema(self._conn)
        return self._conn

    @property
    def connected(self) -> bool:
        return self._conn is not None

    def close(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None

    def reconnect(self) -> None:
        try:
            self.close()
        except Exception:
            # A debug line: its wording is no behaviour (not mutation tested, as in commit/).
            log.debug("closing a broken connection failed", exc_info=True)  # pragma: no mutate
        self._conn = None

    def is_connection_error(self, exc: BaseException) -> bool:
        if self.dialect.name == "sqlite":
            return isinstance(exc, sqlite3.ProgrammingError) and "closed" in str(exc)
        # pragma: no mutate block (PostgreSQL only, as in ensure_schema)
        import psycopg

        if isinstance(exc, psycopg.OperationalError):
            return True
        return bool(self._conn is not None and getattr(self._conn, "closed", False))

    def lose_connection(self, txn: Any) -> None:
        """Fault injection: lose the connection mid-transaction, as a network drop would."""
        if self.dialect.name == "sqlite":
            log.warning("fault injection: dropping the connection to %s mid-commit", self.url)
            txn.close()
            return
        # pragma: no mutate block (PostgreSQL only, as in ensure_schema)
        import contextlib

        import psycopg

        log.warning("fault injection: terminating this PostgreSQL session mid-commit")
        with contextlib.suppress(psycopg.OperationalError):  # the server closes the session
            txn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        raise psycopg.OperationalError("server closed the connection (injected fault)")

    def describe(self) -> str:
        return str(self.url)

    # -- outside a commit -------------------------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        return self.ledger.acquire(self.conn, pipeline, source)

    def owner(self, pipeline: str) -> Owner | None:
        return self.ledger.owner(self.conn, pipeline)

    def entries(self, pipeline: str) -> list[LedgerEntry]:
        return self.ledger.entries(self.conn, pipeline)

    def last(self, pipeline: str) -> LedgerEntry | None:
        return self.ledger.last(self.conn, pipeline)

    def pipelines(self) -> list[str]:
        return self.ledger.pipelines(self.conn)

    # -- inside a commit --------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[Any]:
        conn = self.conn
        with write_transaction(conn, self.dialect):
            yield conn

    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        # txn None: the committer's early look, on the autocommit connection (no lock kept).
        self.ledger.check_owner(self.conn if txn is None else txn, pipeline, epoch)

    def last_in(self, txn: Any, pipeline: str) -> LedgerEntry | None:
        return self.ledger.last(txn, pipeline)

    def find(self, txn: Any | None, pipeline: str, ctx: BatchContext) -> LedgerEntry | None:
        txn = self.conn if txn is None else txn
        if ctx.ranges.empty:
            seq = self.ledger.find_no_data_batch(
                txn, pipeline, ctx.checkpoint_id, ctx.spark_batch_id
            )
        else:
            row = fetchone(
                txn,
                self.dialect,
                f"SELECT seq FROM {LEDGER_TABLE} WHERE pipeline = %s AND ranges = %s "
                "ORDER BY seq DESC LIMIT 1",
                (pipeline, ctx.ranges.to_json()),
            )
            seq = None if row is None else int(row[0])
        if seq is None:
            return None
        return self.ledger.entry(txn, pipeline, seq)

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        self.ledger.record(
            txn,
            pipeline=entry.pipeline,
            seq=entry.seq,
            ranges=entry.ranges,
            epoch=entry.epoch,
            row_count=entry.row_count,
            spark_batch_id=entry.spark_batch_id,
            checkpoint_id=entry.checkpoint_id,
            stateful=bool(entry.stateful),
            commit_seconds=entry.commit_seconds,
        )
        if self.keep is not None:
            # Same transaction as the new entry, which is the newest: it is always kept.
            self.ledger.prune(txn, entry.pipeline, self.keep)
