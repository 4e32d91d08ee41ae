"""Scale-out two-phase-commit sink into PostgreSQL: rows never pass through the driver.

Guarantee: **effectively-once**. Readers of the output see each batch's rows
exactly once, whatever crashes, task retries or zombie runs and tasks occur.
Work may run more than once (a task attempt can pre-commit rows that are then
thrown away); only the attempts of one run's commit ever become visible.
Because only one attempt of a batch ever commits, this holds for
non-deterministic transforms too, as long as this is the pipeline's only sink.

How a batch commits (the protocol of :mod:`sparkonce.protocol`, step 3 split in two):

**Pre-commit, in the executors.** Each Spark task of the batch opens its own
connection and, in one transaction, registers a fresh *attempt id* in
``sparkonce_attempts`` (pipeline, table, epoch, ledger seq, partition, state
``precommitted``) and loads its rows with ``COPY`` (Arrow batches written as
CSV), each row tagged with the attempt id. The attempt id is the task transaction's own
64-bit id (``txid_current()``: it never repeats in a PostgreSQL cluster, and every task
attempt is a transaction of its own), and the tag is the column's default, that same
call, so the id is never sent with the rows (it would nearly double the CSV of narrow
rows). An id already registered (an attempts table copied from another cluster) fails
the registration before any row is written, and the task takes a new transaction. Once
committed the rows are durable but invisible to readers. A task that finds the run
fenced writes nothing.

**Commit, on the driver.** ``collect`` returns exactly one result per partition:
the attempt Spark reports successful. One driver transaction then locks the
owner row and checks the epoch (step 1), checks the ledger (step 2), makes
exactly those attempts visible (step 3), inserts the ledger row (step 4) and
commits (step 5). Calling it again for a committed batch is a no-op.

- ``mode="append"``: the rows stay where the task wrote them, in the table
  ``<table>__sparkonce_data``. Readers read the **view** ``<table>``, which keeps
  only rows whose attempt is ``committed``. The commit flips one status row per
  task, so its cost does not grow with the batch (see
  ``benchmarks/results/precommit-mechanism.json``).
- ``mode="upsert"``: tasks pre-commit into ``<table>__sparkonce_stage``; the
  commit merges the successful attempts into the table ``<table>`` with
  ``INSERT ... ON CONFLICT (keys) DO UPDATE`` and deletes them, and their attempt
  rows, from the stage and the attempts table. Readers read the table ``<table>``.
  (The merge first tries a plain ``INSERT`` in a savepoint, which is cheaper when every
  key of the batch is new; a key already in the table rolls it back, and the batch, and
  the next 16, merge with ``ON CONFLICT``. Either way the table ends the same.)
  A key repeated in the batch is refused, naming the key (found with a ``GROUP BY``
  over the attempts being merged, in the commit's transaction), unless
  ``latest_by=[...]`` names output columns (typically the source's ``partition`` and
  ``offset``): the merge then keeps, per key, the row with the greatest ``latest_by``
  tuple (``DISTINCT ON (keys) ... ORDER BY keys, latest_by DESC NULLS LAST``, NULL
  lowest), and refuses a key with two rows of equal ``latest_by`` values.

**Output modes.** Spark's ``"append"`` and ``"update"`` output modes commit as above.
``"complete"`` is refused by :meth:`PostgresTwoPhaseSink.validate` (before the run takes
its epoch): every batch would have to replace the whole output, which pre-committed
attempts do not express; :class:`~sparkonce.PostgresSink` supports it.

**Schema check.** ``validate`` compares the output's Spark types with the declared
column types of ``<table>`` (view or table) and of ``<table>__sparkonce_data`` or
``<table>__sparkonce_stage``, and refuses a mismatch before the run takes its epoch.

**Abort and collection.** Rows of failed, speculative, aborted and zombie
attempts are never made visible. A collector deletes them, and their attempt
rows: after every commit, after a failed commit, and when a run starts (after
it takes its epoch), so a crash leaves nothing behind for long. A collector
only ever removes attempts of its own epoch or older, and only while its run
still owns the pipeline, so it never touches a newer run's batch in flight.

Limits: the view's filter costs readers a semi-join against the (small)
attempts table; upsert batches must hold at most one row per key (or set
``latest_by``), and key columns must not be NULL (the batch fails with
:class:`~sparkonce.errors.SinkError`, nothing committed). Task connections use the
sink URL, password included; it is never logged.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkonce.commit import Staged
from sparkonce.commit.tasks import (
    CORRECT_TASK_STEPS,
    TASK_RESULT_DDL,
    Task,
    TaskResult,
    TaskSteps,
    one_result,
    results_of,
)
from sparkonce.config import OutputMode, StoreURL, WriteMode
from sparkonce.db import connect, fetchall, qi, qlist, write_transaction
from sparkonce.errors import ConfigError, FencedError, LedgerError, SinkError
from sparkonce.ledger.base import BatchContext, Owner
from sparkonce.ledger.sql import SqlLedgerStore
from sparkonce.sinks.sql import (
    PostgresSink,
    PostgresStager,
    latest_by_tie_message,
    repeated_key_message,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

ATTEMPTS_TABLE = "sparkonce_attempts"
ATTEMPT_COLUMN = "sparkonce_attempt"
# A task's attempt id is its transaction's id, and the pre-commit table's attempt column
# takes it as its default, so the id never travels with each row. (The id was first a
# setting of the task's transaction, read by the default with ``current_setting``: that
# lookup and its text-to-bigint cast cost a quarter of a narrow row's COPY here.)
ATTEMPT_DEFAULT = "txid_current()"
# Registrations a task tries (each in a new transaction) before it gives up on ids that
# are already taken, which only an attempts table brought from another cluster can cause.
REGISTER_TRIES = 5
DATA_SUFFIX = "__sparkonce_data"
STAGE_SUFFIX = "__sparkonce_stage"
MAX_IDENTIFIER = 63  # PostgreSQL's NAMEDATALEN - 1

# Upsert: batches merged with ON CONFLICT at once after a plain INSERT met a key in the table.
INSERT_ONLY_BACKOFF = 16


class TwoPhaseStager(PostgresStager):
    """How the two-phase sink stages a batch: Spark's tasks pre-commit it (executors), and
    step 3 makes exactly the successful attempts visible (the stager of
    :class:`PostgresTwoPhaseSink`). It also collects the attempts that will never commit."""

    stages_on_driver = False  # its tasks pre-commit the rows

    def __init__(
        self,
        store: SqlLedgerStore,
        table: str,
        mode: WriteMode,
        keys: tuple[str, ...],
        latest_by: tuple[str, ...],
    ) -> None:
        super().__init__(store, table, mode, keys, latest_by)
        longest = self.table + max(DATA_SUFFIX, STAGE_SUFFIX, key=len)
        if len(longest) > MAX_IDENTIFIER:
            raise ConfigError(
                f"table name {self.table!r} is too long for the two-phase sink: it also creates "
                f"{longest!r}, over PostgreSQL's {MAX_IDENTIFIER}-character limit; use a name of "
                f"at most {MAX_IDENTIFIER - len(STAGE_SUFFIX)} characters"
            )
        # Where tasks pre-commit: the data table under the view, or the upsert stage.
        self.precommit_table = self.table + (DATA_SUFFIX if mode == "append" else STAGE_SUFFIX)
        self._ready = False
        self._attempts_ready = False
        self._insert_only_backoff = 0  # batches left to merge with ON CONFLICT at once

    def ensure_attempts_table(self) -> None:
        """Create the attempts table (once per sink; the sink's ``open``)."""
        if self._attempts_ready:
            return
        conn = self.conn
        with write_transaction(conn, self.dialect):
            conn.execute("SELECT pg_advisory_xact_lock(727274)")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {ATTEMPTS_TABLE} ("
                " attempt_id BIGINT PRIMARY KEY, pipeline TEXT NOT NULL, target TEXT NOT NULL,"
                " epoch BIGINT NOT NULL, seq BIGINT NOT NULL, partition INTEGER NOT NULL,"
                " row_count BIGINT NOT NULL,"
                " state TEXT NOT NULL CHECK (state IN ('precommitted', 'committed')),"
                " created_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            conn.execute(
                f"CREATE INDEX IF NOT EXISTS {ATTEMPTS_TABLE}_open ON {ATTEMPTS_TABLE} "
                "(pipeline, target) WHERE state = 'precommitted'"
            )
        self._attempts_ready = True

    # -- schema ------------------------------------------------------------------
    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """As :meth:`PostgresSink.validate`, over the output and its pre-commit table; also
        refuses Spark's ``"complete"`` output mode and a view/table of the wrong kind."""
        if output_mode == "complete":
            raise ConfigError(
                f"PostgresTwoPhaseSink ({self.table!r}) does not support Spark's output mode "
                "'complete': each batch would have to replace the whole output, and the "
                "executors' pre-commits only add rows. Use PostgresSink, which supports "
                "'complete' (each batch replaces the table's content in its commit "
                "transaction), or output_mode='update' with mode='upsert' and keys=[...]."
            )
        self._check_kinds()
        super().validate(schema, output_mode)

    def _relations(self) -> tuple[str, ...]:
        return (self.table, self.precommit_table)

    def _check_kinds(self) -> None:
        """The user-facing name must be a view (append) or a table (upsert), not the other."""
        rows = fetchall(
            self.conn,
            self.dialect,
            "SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relname = %s",
            (self.table,),
        )
        kind = rows[0][0] if rows else None
        want, other = ("v", "a table") if self.mode == "append" else ("r", "a view")
        if kind is not None and kind != want:
            raise ConfigError(
                f"{self.table!r} in {self.url} already exists as {other}. The two-phase sink in "
                f"{self.mode} mode exposes {self.table!r} as a "
                f"{'view' if want == 'v' else 'table'}; write to a new name, or drop or rename "
                "the existing one"
            )

    def _ensure_tables(self, schema: StructType) -> None:
        """Create the output (and view or stage) before any task pre-commits into it."""
        if self._ready:
            return
        self.ensure_attempts_table()  # the view reads it
        self._check_kinds()
        # The stage takes NULL keys, so a NULL key reaches the commit's merge, which refuses
        # it by name (SinkError), instead of failing the tasks' COPY with a database error.
        stage_cols = [
            f"{qi(f.name)} {self.dialect.column_type(f.dataType, f.name)}" for f in schema.fields
        ]
        cols = [
            c + (" NOT NULL" if f.name in self.keys else "")
            for c, f in zip(stage_cols, schema.fields, strict=True)
        ]
        names = qlist(f.name for f in schema.fields)
        conn = self.conn
        with write_transaction(conn, self.dialect):
            conn.execute("SELECT pg_advisory_xact_lock(727275)")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {qi(self.precommit_table)} ({', '.join(stage_cols)}, "
                f"{ATTEMPT_COLUMN} BIGINT NOT NULL DEFAULT {ATTEMPT_DEFAULT})"
            )
            self._upgrade_precommit_table(conn)
            if self.mode == "append":
                conn.execute(
                    f"CREATE OR REPLACE VIEW {qi(self.table)} AS SELECT {names} FROM "
                    f"{qi(self.precommit_table)} WHERE {ATTEMPT_COLUMN} IN (SELECT attempt_id "
                    f"FROM {ATTEMPTS_TABLE} WHERE state = 'committed')"
                )
            else:
                conn.execute(
                    f"CREATE TABLE IF NOT EXISTS {qi(self.table)} "
                    f"({', '.join(cols)}, PRIMARY KEY ({qlist(self.keys)}))"
                )
        self._ready = True

    def _upgrade_precommit_table(self, conn: Any) -> None:
        """Bring a pre-commit table made by an older sparkonce up to date, from one read of
        its columns (DDL only where needed, so a usual start takes no table lock): the
        attempt column gets its default, and an upsert stage's key columns lose NOT NULL, so
        a NULL key is refused by the merge, by name."""
        columns = {
            name: (default, nullable == "YES")
            for name, default, nullable in conn.execute(
                "SELECT column_name, column_default, is_nullable FROM information_schema.columns "
                "WHERE table_schema = current_schema() AND table_name = %s",
                (self.precommit_table,),
            ).fetchall()
        }
        if ATTEMPT_COLUMN not in columns:
            raise ConfigError(
                f"{self.precommit_table!r} in {self.url} has no {ATTEMPT_COLUMN!r} column, so it "
                f"is not a two-phase sink's pre-commit table; drop or rename it, or write to "
                f"another table than {self.table!r}"
            )
        table = qi(self.precommit_table)
        if (columns[ATTEMPT_COLUMN][0] or "") != ATTEMPT_DEFAULT:
            conn.execute(
                f"ALTER TABLE {table} ALTER COLUMN {ATTEMPT_COLUMN} SET DEFAULT {ATTEMPT_DEFAULT}"
            )
        if self.mode == "upsert":
            for key in self.keys:
                if key in columns and not columns[key][1]:
                    conn.execute(f"ALTER TABLE {table} ALTER COLUMN {qi(key)} DROP NOT NULL")

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        """The tasks pre-commit their rows, each under a fresh attempt id (executors)."""
        # (The committer has checked the owner already: a fenced run starts no task.)
        self._ensure_tables(df.schema)
        plan = _TaskPlan(
            url=self.url,
            table=self.precommit_table,
            columns=tuple(df.schema.fieldNames()),
            pipeline=ctx.pipeline,
            target=self.table,
            epoch=ctx.epoch,
            seq=seq,
            steps=self.task_steps,
        )
        results = results_of(df.mapInArrow(lambda it: _precommit_task(plan, it), TASK_RESULT_DDL))
        if any(r.fenced for r in results):
            owner = self.store.owner(ctx.pipeline)
            raise FencedError(
                ctx.pipeline,
                ctx.epoch,
                owner.epoch if owner else 0,
                self.store.ledger.inspect_hint.replace("{pipeline}", ctx.pipeline),
                owner.holder if owner else "",
            )
        attempts = sorted(r.attempt for r in results if r.rows)
        rows = sum(r.rows for r in results)
        return Staged(rows, (seq, attempts, list(plan.columns)))

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        """Step 3: make exactly the attempts Spark reported successful visible.

        Append mode flips their state (the view shows committed attempts); upsert
        mode merges their rows into the table, so their attempt rows go, and the
        attempts table only ever holds batches in flight.
        """
        seq, attempts, columns = staged.payload
        conn = txn
        change = (
            f"DELETE FROM {ATTEMPTS_TABLE}"
            if self.mode == "upsert"
            else f"UPDATE {ATTEMPTS_TABLE} SET state = 'committed'"
        )
        flipped = conn.execute(
            f"{change} WHERE attempt_id = ANY(%s) AND pipeline = %s AND target = %s "
            "AND epoch = %s AND seq = %s AND state = 'precommitted'",
            (attempts, ctx.pipeline, self.table, ctx.epoch, seq),
        ).rowcount
        if flipped != len(attempts):
            raise LedgerError(
                f"pipeline {ctx.pipeline!r} batch {ctx.ranges}: {len(attempts) - flipped} of "
                f"the {len(attempts)} successful task attempts have no pre-committed rows in "
                f"{ATTEMPTS_TABLE}; something removed them. Nothing of the batch was "
                "committed; restart the run to replay it."
            )
        if self.mode == "upsert" and attempts:
            staged.written = self._merge(conn, attempts, columns)

    def abort(self, ctx: BatchContext, staged: Staged | None) -> None:
        self._collect_after_failure(ctx)

    def after_commit(self, ctx: BatchContext) -> None:
        self.collect(ctx.pipeline, ctx.epoch)

    def _merge(self, conn: Any, attempts: list[int], columns: list[str]) -> int:
        """Upsert: merge the successful attempts' staged rows into the table by key.

        With ``latest_by``, each key's row with the greatest ``latest_by`` tuple wins
        (NULL lowest); without it, a repeated key is refused and named. Returns the rows
        inserted or updated (PostgreSQL's row count of the ``INSERT``).
        """
        import psycopg

        collist = qlist(columns)
        staged = f"{qi(self.precommit_table)} WHERE {ATTEMPT_COLUMN} = ANY(%s)"
        if self.latest_by:
            self._refuse_latest_by_tie(conn, attempts)
            order = ", ".join(
                [qi(k) for k in self.keys] + [f"{qi(c)} DESC NULLS LAST" for c in self.latest_by]
            )
            source = (
                f"(SELECT DISTINCT ON ({qlist(self.keys)}) {collist} FROM {staged} "
                f"ORDER BY {order}) AS latest"
            )
        else:
            source = staged
        insert = f"INSERT INTO {qi(self.table)} ({collist}) SELECT {collist} FROM {source}"
        try:
            written = self._insert_only(conn, insert, attempts)
            if written is None:
                with conn.transaction():  # a savepoint, so the error below is ours to explain
                    merge = conn.execute(insert + self._upsert_clause(columns), (attempts,))
                    written = int(merge.rowcount)
        except psycopg.errors.CardinalityViolation:
            # Back at the savepoint, in the same transaction: find a repeated key to name.
            row = conn.execute(
                f"SELECT {qlist(self.keys)}, count(*) FROM {staged} GROUP BY {qlist(self.keys)} "
                "HAVING count(*) > 1 LIMIT 1",
                (attempts,),
            ).fetchone()
            if row is None:  # cannot happen: the violation came from these rows
                raise SinkError(
                    f"upsert into {self.table!r}: the batch holds more than one row for a key "
                    f"{list(self.keys)}. Nothing of this batch was committed."
                ) from None
            message = repeated_key_message(self.table, self.keys, tuple(row[:-1]), int(row[-1]))
            raise SinkError(message) from None
        except psycopg.errors.NotNullViolation:
            raise SinkError(
                f"upsert into {self.table!r}: a row has a NULL key {list(self.keys)}; key "
                "columns must not be NULL. Nothing of this batch was committed."
            ) from None
        conn.execute(
            f"DELETE FROM {qi(self.precommit_table)} WHERE {ATTEMPT_COLUMN} = ANY(%s)",
            (attempts,),
        )
        return int(written)

    def _insert_only(self, conn: Any, insert: str, attempts: list[int]) -> int | None:
        """Merge the batch with a plain ``INSERT`` if none of its keys is in the table yet.

        A plain ``INSERT`` costs about a third less than ``INSERT ... ON CONFLICT``, which
        probes the key index twice per row (measured: 500k new keys into a table of 4.5M
        rows, 1.4 to 1.7 s of PostgreSQL CPU against 2.1 to 2.6 s). It runs in a savepoint:
        if a key is in the table already (or repeated in the batch), the savepoint is rolled
        back, nothing of it stays, and the caller merges with ``ON CONFLICT``. After such a
        fallback the next :data:`INSERT_ONLY_BACKOFF` batches go straight to ``ON CONFLICT``,
        so a pipeline that updates keys does not pay for a failed try every batch.
        Returns the rows inserted, or None when the caller must merge.
        """
        import psycopg

        if self._insert_only_backoff:
            self._insert_only_backoff -= 1
            return None
        try:
            with conn.transaction():
                inserted = int(conn.execute(insert, (attempts,)).rowcount)
        except psycopg.errors.UniqueViolation:
            self._insert_only_backoff = INSERT_ONLY_BACKOFF
            log.debug(
                "upsert into %s: a key is in the table already; merging with ON CONFLICT",
                self.table,
            )
            return None
        return inserted

    def _refuse_latest_by_tie(self, conn: Any, attempts: list[int]) -> None:
        """Refuse a key with two staged rows of equal ``latest_by`` values (NULLs equal)."""
        group = qlist((*self.keys, *self.latest_by))
        row = conn.execute(
            f"SELECT {group} FROM {qi(self.precommit_table)} WHERE {ATTEMPT_COLUMN} = ANY(%s) "
            f"GROUP BY {group} HAVING count(*) > 1 LIMIT 1",
            (attempts,),
        ).fetchone()
        if row is not None:
            n = len(self.keys)
            values = dict(zip(self.latest_by, row[n:], strict=True))
            raise SinkError(
                latest_by_tie_message(self.table, self.keys, tuple(row[:n]), self.latest_by, values)
            )

    # -- abort and collection ---------------------------------------------------------
    def collect(self, pipeline: str, epoch: int) -> int:
        """Delete the rows of attempts that will never commit; returns how many attempts.

        Removes ``pipeline``'s ``precommitted`` attempts of epoch ``epoch`` or older,
        only while ``epoch`` still owns the pipeline (a zombie never collects), and
        only between batches (the caller has no batch in flight).
        """
        conn = self.conn
        with write_transaction(conn, self.dialect):
            row = conn.execute(
                "SELECT epoch FROM sparkonce_owner WHERE pipeline = %s FOR UPDATE", (pipeline,)
            ).fetchone()
            if row is None or int(row[0]) != epoch:
                return 0
            ids = [
                int(r[0])
                for r in conn.execute(
                    f"SELECT attempt_id FROM {ATTEMPTS_TABLE} WHERE pipeline = %s AND target = %s "
                    "AND state = 'precommitted' AND epoch <= %s",
                    (pipeline, self.table, epoch),
                ).fetchall()
            ]
            if not ids:
                return 0
            if self._relation_exists(self.precommit_table):
                conn.execute(
                    f"DELETE FROM {qi(self.precommit_table)} WHERE {ATTEMPT_COLUMN} = ANY(%s)",
                    (ids,),
                )
            conn.execute(f"DELETE FROM {ATTEMPTS_TABLE} WHERE attempt_id = ANY(%s)", (ids,))
        log.info(
            "pipeline %r: collected %d aborted or failed attempt(s) from %s",
            pipeline,
            len(ids),
            self.precommit_table,
        )
        return len(ids)

    def _collect_after_failure(self, ctx: BatchContext) -> None:
        """Abort: the batch failed, so its pre-commits are garbage. Best effort."""
        try:
            self.store.reconnect()  # the failure may have broken the connection
            self.collect(ctx.pipeline, ctx.epoch)
        except Exception as exc:
            log.warning(
                "pipeline %r: could not collect the aborted batch's pre-committed rows (%s); "
                "the next run collects them when it starts",
                ctx.pipeline,
                exc,
            )

    def _relation_exists(self, name: str) -> bool:
        return relation_exists(self.conn, name)

    def _output_dropped(self) -> None:
        super()._output_dropped()
        self._ready = False


def relation_exists(conn: Any, name: str) -> bool:
    """Whether the table or view ``name`` exists (in the connection's search path)."""
    row = conn.execute("SELECT to_regclass(%s)", (qi(name),)).fetchone()
    return row is not None and row[0] is not None


def holds_two_phase(conn: Any, pipeline: str, table: str | None) -> bool:
    """Whether a PostgreSQL store holds a two-phase sink's output ``table`` (its data or
    stage table, names only this sink creates, exists) or attempts of ``pipeline``."""
    if table is not None and any(
        relation_exists(conn, table + suffix) for suffix in (DATA_SUFFIX, STAGE_SUFFIX)
    ):
        return True
    if not relation_exists(conn, ATTEMPTS_TABLE):
        return False
    row = conn.execute(
        f"SELECT 1 FROM {ATTEMPTS_TABLE} WHERE pipeline = %s LIMIT 1", (pipeline,)
    ).fetchone()
    return row is not None


def precommitted(conn: Any, pipeline: str) -> dict[str, list[int]]:
    """``pipeline``'s attempts that pre-committed and never committed, by output table
    (``target``); none when the store has no attempts table."""
    found: dict[str, list[int]] = {}
    if not relation_exists(conn, ATTEMPTS_TABLE):
        return found
    for attempt, target in conn.execute(
        f"SELECT attempt_id, target FROM {ATTEMPTS_TABLE} WHERE pipeline = %s "
        "AND state = 'precommitted' ORDER BY attempt_id",
        (pipeline,),
    ).fetchall():
        found.setdefault(str(target), []).append(int(attempt))
    return found


def forget_precommits(conn: Any, pipeline: str) -> int:
    """In the caller's transaction: delete ``pipeline``'s pre-committed attempts that never
    committed, and their rows in each output's data or stage table; returns how many.

    For ``sparkonce reset``: they are invisible pre-commits of batches the reset makes the
    pipeline forget, which no collector of a later run would look for. Committed attempts
    stay (in append mode they are what makes the kept output visible through the view).
    """
    found = precommitted(conn, pipeline)
    for target, ids in found.items():
        for suffix in (DATA_SUFFIX, STAGE_SUFFIX):
            if relation_exists(conn, target + suffix):
                conn.execute(
                    f"DELETE FROM {qi(target + suffix)} WHERE {ATTEMPT_COLUMN} = ANY(%s)", (ids,)
                )
        conn.execute(f"DELETE FROM {ATTEMPTS_TABLE} WHERE attempt_id = ANY(%s)", (ids,))
    return sum(len(ids) for ids in found.values())


class PostgresTwoPhaseSink(PostgresSink):
    """Two-phase-commit sink into PostgreSQL, writing from the executors.

    Guarantee: **effectively-once** (see :mod:`sparkonce.sinks.twophase`): the tasks'
    pre-committed rows become visible only through the driver's one transaction with the
    epoch check and the ledger row, and only for the attempts Spark reports successful.

    Same arguments as :class:`~sparkonce.PostgresSink` (``latest_by`` and ``ledger_keep``
    included). In append
    mode the name ``table`` is a view over ``<table>__sparkonce_data``; in upsert mode it is
    a table with a primary key on ``keys``. Spark's ``"complete"`` output mode is refused.

    It is the SQL ledger store plus its stager, :class:`TwoPhaseStager`.
    """

    stager_type = TwoPhaseStager
    stager: TwoPhaseStager

    def describe(self) -> str:
        return super().describe().replace("PostgresTwoPhaseSink(", "PostgresTwoPhaseSink(2pc ", 1)

    @property
    def precommit_table(self) -> str:
        """Where the tasks pre-commit: the data table under the view, or the upsert stage."""
        return self.stager.precommit_table

    # -- lifecycle -------------------------------------------------------------
    def open_store(self) -> None:
        super().open_store()
        self.stager.ensure_attempts_table()

    def after_acquire(self, pipeline: str, owner: Owner) -> None:
        """Collect the pre-commits older runs left (their epochs are fenced now)."""
        self.collect(pipeline, owner.epoch)

    def collect(self, pipeline: str, epoch: int) -> int:
        """Delete the rows of attempts that will never commit (:meth:`TwoPhaseStager.collect`)."""
        self.open()
        return self.stager.collect(pipeline, epoch)


# --- the task side (runs in Spark's Python workers) -----------------------------------------


@dataclass(frozen=True)
class _TaskPlan:
    """What a pre-commit task needs; pickled to the executors (the URL holds the password)."""

    url: StoreURL
    table: str
    columns: tuple[str, ...]
    pipeline: str
    target: str
    epoch: int
    seq: int
    # The tasks' decisions (sparkonce.commit.tasks); only the simulation's tests plant others.
    steps: TaskSteps = CORRECT_TASK_STEPS


def _precommit_task(plan: _TaskPlan, batches: Iterator[Any]) -> Iterator[Any]:
    """Pre-commit this task's rows in one transaction, tagged with a fresh attempt id."""
    task = Task.current(plan.pipeline, plan.epoch, plan.seq, steps=plan.steps)
    attempt = 0
    conn = None
    rows = 0
    fenced: TaskResult | None = None
    try:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if conn is None:
                conn = connect(plan.url)
                attempt, fenced = _register(conn, plan, task)
                if fenced is not None:
                    break  # a newer run owns the pipeline: write nothing
            _copy_batch(conn, plan, batch)
            rows += batch.num_rows
        if conn is not None and fenced is None:
            conn.execute(
                f"UPDATE {ATTEMPTS_TABLE} SET row_count = %s WHERE attempt_id = %s",
                (rows, attempt),
            )
            conn.execute("COMMIT")
        elif conn is not None:
            conn.execute("ROLLBACK")
    finally:
        if conn is not None:
            conn.close()
    if fenced is not None:
        yield from one_result(fenced)
        return
    # Fault injection: fail *after* the pre-commit is durable, so this attempt's rows exist
    # but Spark retries the task; only the retry's attempt may become visible.
    task.inject_failure(
        rows, f"injected task failure after the pre-commit of write task {task.key}"
    )
    yield from one_result(task.written(rows, attempt if rows else 0))


def _register(conn: Any, plan: _TaskPlan, task: Task) -> tuple[int, TaskResult | None]:
    """Begin the task's transaction, read the owner epoch and, unless the task is fenced
    (:meth:`Task.fenced`), register its attempt: the transaction's id, which the pre-commit
    table's attempt column takes as its default. Returns ``(attempt id, None)``, or ``(0, the
    fenced result)``: the transaction is then left open, with nothing written, to be
    rolled back."""
    from psycopg.errors import UniqueViolation

    for _ in range(REGISTER_TRIES):
        conn.execute("BEGIN")
        row = conn.execute(
            "SELECT epoch, txid_current() FROM sparkonce_owner WHERE pipeline = %s",
            (plan.pipeline,),
        ).fetchone()
        fenced = task.fenced(None if row is None else int(row[0]))
        if fenced is not None:
            return 0, fenced
        attempt = int(row[1])
        try:
            conn.execute(
                f"INSERT INTO {ATTEMPTS_TABLE} (attempt_id, pipeline, target, epoch, seq, "
                "partition, row_count, state) VALUES (%s, %s, %s, %s, %s, %s, 0, "
                "'precommitted')",
                (attempt, plan.pipeline, plan.target, plan.epoch, plan.seq, task.partition),
            )
        except UniqueViolation:
            conn.execute("ROLLBACK")  # nothing was written: take a new transaction, a new id
            continue
        return attempt, None
    raise SinkError(
        f"pipeline {plan.pipeline!r}: task {task.partition} could not register an attempt id "
        f"in {ATTEMPTS_TABLE}: {REGISTER_TRIES} transaction ids in a row were registered "
        f"already. Its rows were not written. Check that {ATTEMPTS_TABLE} belongs to this "
        "database."
    )


def _copy_batch(conn: Any, plan: _TaskPlan, batch: Any) -> None:
    """COPY one Arrow batch into the pre-commit table. The attempt id column is not sent:
    it takes its default, the task transaction's id (the attempt id it registered)."""
    import pyarrow.csv as pacsv

    cols = qlist(plan.columns)
    if any(_needs_row_copy(f.type) for f in batch.schema):
        # Binary values have no CSV form PostgreSQL reads as bytea: go row by row.
        with (
            conn.cursor() as cur,
            cur.copy(f"COPY {qi(plan.table)} ({cols}) FROM STDIN") as cp,
        ):
            for values in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                cp.write_row(values)
        return
    buf = io.BytesIO()
    pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
    with (
        conn.cursor() as cur,
        cur.copy(f"COPY {qi(plan.table)} ({cols}) FROM STDIN (FORMAT csv)") as cp,
    ):
        cp.write(buf.getbuffer())


def _needs_row_copy(dtype: Any) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_binary(dtype)
        or pa.types.is_large_binary(dtype)
        or pa.types.is_nested(dtype)
        or pa.types.is_dictionary(dtype)
    )
