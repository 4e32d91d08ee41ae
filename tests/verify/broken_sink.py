"""Deliberately broken sinks, for tests only: bugs ``sparkonce verify`` must catch.

``NonTransactionalSink`` commits the rows (step 3) in one transaction and the
ledger row (step 4) in a second one. A crash between the two leaves rows without
a ledger entry, so the replay writes them again.

``DropsABatchSink`` loses one batch's rows even without any fault, so the
failure-free run (the trials' oracle) loses them too: the reference run catches it.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql.types import StructType

from sparkonce.db import write_transaction
from sparkonce.ledger.base import BatchContext, CommitResult
from sparkonce.offsets import Coverage, classify
from sparkonce.protocol import CrashPoint, crash_point
from sparkonce.sinks.sql import SQLiteSink


class NonTransactionalSink(SQLiteSink):
    """Only at-least-once: a crash after the rows and before the ledger duplicates them."""

    guarantee = "at-least-once"

    def _commit_once(
        self, ctx: BatchContext, schema: StructType, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> CommitResult:
        conn = self.conn
        last = self._ledger.last(conn, ctx.pipeline)
        if classify(ctx.ranges, {} if last is None else last.end_offsets) is Coverage.COMMITTED:
            return CommitResult(True, 0, None, "offsets already in the ledger (replay)")
        with write_transaction(conn, self.dialect):
            self._create_table(conn, schema)
            self._write_rows(conn, columns, rows)
        crash_point(CrashPoint.AFTER_ROWS)  # rows are already committed here: the bug
        with write_transaction(conn, self.dialect):
            self._ledger.check_owner(conn, ctx.pipeline, ctx.epoch)
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
        return CommitResult(False, len(rows), seq)


class DropsABatchSink(SQLiteSink):
    """Loses every row of one micro-batch, silently, in every run (failure-free included).

    The batch still gets its ledger entry, so nothing looks wrong to a replay, and
    a failure-free run of this sink loses the same rows as every trial: only an
    oracle that does not go through the sink can notice.
    """

    drop_batch = 1  # Spark's batch id whose rows vanish

    def _commit_once(
        self, ctx: BatchContext, schema: StructType, columns: list[str], rows: list[tuple[Any, ...]]
    ) -> CommitResult:
        if ctx.spark_batch_id == self.drop_batch:
            rows = []
        return super()._commit_once(ctx, schema, columns, rows)
