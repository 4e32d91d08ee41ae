"""Deliberately broken sinks, for tests only: bugs ``sparkonce verify`` must catch.

``NonTransactionalSink`` commits the rows (step 3) in one transaction and the
ledger row (step 4) in a second one. A crash between the two leaves rows without
a ledger entry, so the replay writes them again.

``DropsABatchSink`` loses one batch's rows even without any fault, so the
failure-free run (the trials' oracle) loses them too: the reference run catches it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from sparkonce.commit import Staged
from sparkonce.ledger.base import BatchContext
from sparkonce.sinks.sql import SQLiteSink


class NonTransactionalSink(SQLiteSink):
    """Only at-least-once: a crash after the rows and before the ledger duplicates them."""

    guarantee = "at-least-once"

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        super().publish(txn, ctx, staged)
        # The bug: the rows commit now, in their own transaction; the ledger row and the
        # epoch check come in a second one (the committer's crash point after-rows is next).
        txn.execute("COMMIT")
        txn.execute("BEGIN IMMEDIATE")


class DropsABatchSink(SQLiteSink):
    """Loses every row of one micro-batch, silently, in every run (failure-free included).

    The batch still gets its ledger entry, so nothing looks wrong to a replay, and
    a failure-free run of this sink loses the same rows as every trial: only an
    oracle that does not go through the sink can notice.
    """

    drop_batch = 1  # Spark's batch id whose rows vanish

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        staged = super().prepare(ctx, df, seq)
        if ctx.spark_batch_id == self.drop_batch:
            schema, columns, _rows = staged.payload
            return Staged(0, (schema, columns, []))
        return staged
