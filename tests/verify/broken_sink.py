"""Deliberately broken sinks, for tests only: bugs ``sparkonce verify`` must catch.

``NonTransactionalSink`` commits the rows (step 3) in one transaction and the
ledger row (step 4) in a second one. A crash between the two leaves rows without
a ledger entry, so the replay writes them again.

``DropsABatchSink`` loses one batch's rows even without any fault, so the
failure-free run (the trials' oracle) loses them too: the reference run catches it.

``VisibleBeforeCommitSink`` ends with the right rows, but makes them visible before
their ledger entry commits and deletes them again after a crash: the live readers catch it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from sparkonce.commit import Staged
from sparkonce.db import qi, write_transaction
from sparkonce.ledger.base import BatchContext, Owner
from sparkonce.sinks.sql import SQLiteSink, SQLiteStager


def _table_exists(conn: Any, name: str) -> bool:
    q = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"
    return conn.execute(q, (name,)).fetchone() is not None


class NonTransactionalStager(SQLiteStager):
    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        super().publish(txn, ctx, staged)
        # The bug: the rows commit now, in their own transaction; the ledger row and the
        # epoch check come in a second one (the committer's crash point after-rows is next).
        txn.execute("COMMIT")
        txn.execute("BEGIN IMMEDIATE")


class NonTransactionalSink(SQLiteSink):
    """Only at-least-once: a crash after the rows and before the ledger duplicates them."""

    guarantee = "at-least-once"
    stager_type = NonTransactionalStager


class DropsABatchStager(SQLiteStager):
    drop_batch = 1  # Spark's batch id whose rows vanish

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        staged = super().prepare(ctx, df, seq)
        if ctx.spark_batch_id == self.drop_batch:
            schema, columns, _rows = staged.payload
            return Staged(0, (schema, columns, []))
        return staged


class DropsABatchSink(SQLiteSink):
    """Loses every row of one micro-batch, silently, in every run (failure-free included).

    The batch still gets its ledger entry, so nothing looks wrong to a replay, and
    a failure-free run of this sink loses the same rows as every trial: only an
    oracle that does not go through the sink can notice.
    """

    stager_type = DropsABatchStager


PENDING_TABLE = "planted_pending"  # VisibleBeforeCommitSink's note of rows not yet in a ledger


class VisibleBeforeCommitStager(SQLiteStager):
    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        txn.execute(
            f"CREATE TABLE IF NOT EXISTS {PENDING_TABLE} (pipeline TEXT, first_rowid INTEGER)"
        )
        first = 0
        if _table_exists(txn, self.table):
            first = txn.execute(f"SELECT coalesce(max(rowid), 0) FROM {qi(self.table)}").fetchone()[
                0
            ]
        super().publish(txn, ctx, staged)
        txn.execute(f"INSERT INTO {PENDING_TABLE} VALUES (?, ?)", (ctx.pipeline, first))
        # The bug: the rows commit now; the ledger row (and the note's removal) come in a
        # second transaction (the committer's crash point after-rows is next).
        txn.execute("COMMIT")
        txn.execute("BEGIN IMMEDIATE")
        txn.execute(f"DELETE FROM {PENDING_TABLE} WHERE pipeline = ?", (ctx.pipeline,))


class VisibleBeforeCommitSink(SQLiteSink):
    """Right at the end, wrong on the way: rows visible before their ledger entry commits.

    It commits a batch's rows (with a note of where they start) in one transaction and
    the ledger row (deleting the note) in a second one. A crash between the two leaves the
    rows visible without a ledger entry; the next run deletes them when it takes its epoch
    (a "rollback"), and then replays the batch. So its final state is right: only a reader
    that looks while it runs sees rows that later vanish, and rows no ledger entry covers.

    ``rolled_back`` counts the rollbacks this process did (the bug's own code ran).
    """

    guarantee = "at-least-once"
    rolled_back = 0
    stager_type = VisibleBeforeCommitStager

    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        owner = super().acquire(pipeline, source)
        conn = self.conn
        with write_transaction(conn, self.dialect):
            if _table_exists(conn, PENDING_TABLE):
                q = f"SELECT first_rowid FROM {PENDING_TABLE} WHERE pipeline = ?"
                found = conn.execute(q, (pipeline,)).fetchone()
                if found is not None and _table_exists(conn, self.table):
                    conn.execute(f"DELETE FROM {qi(self.table)} WHERE rowid > ?", (found[0],))
                    type(self).rolled_back += 1
                conn.execute(f"DELETE FROM {PENDING_TABLE} WHERE pipeline = ?", (pipeline,))
        return owner
