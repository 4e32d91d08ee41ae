"""The committer: the commit protocol, implemented once for every sink.

The protocol (a cheap look at the ledger before anything is staged, step 0, then steps
1-5 in one transaction of the store) is described once, in ``docs/concepts/protocol.md``;
:meth:`Committer.commit` runs it for one micro-batch, on the driver, with the sink's
ledger store (:class:`~sparkonce.ledger.base.LedgerStore`) and stager
(:class:`~sparkonce.commit.base.Stager`), and marks the crash points of
:class:`~sparkonce.protocol.CrashPoint` between the steps. What each step does is in
:mod:`sparkonce.commit.steps`; a lost store connection is retried under the one retry
policy, :meth:`Committer._retrying` (:data:`COMMIT_ATTEMPTS` attempts in all).

A no-data batch (empty ranges: the watermark moved or a timeout fired) that
emits no rows commits nothing and leaves no entry, unless the stager keeps such
batches (complete output mode empties the table).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, TypeVar

from sparkonce.commit.base import Staged, Stager
from sparkonce.commit.steps import CORRECT_STEPS, CommitSteps
from sparkonce.errors import (
    FencedError,
    LedgerError,
    SinkError,
    SinkUnavailableError,
    SparkOnceError,
)
from sparkonce.faults import NO_FAULTS, FaultPlan
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, LedgerStore
from sparkonce.protocol import CrashPoint

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

log = logging.getLogger(__name__)

T = TypeVar("T")

COMMIT_ATTEMPTS = 3  # a commit whose store connection dropped is retried on a new one


class Committer:
    """Runs steps 1-5 of the protocol for one sink: a ledger store plus a stager.

    ``steps`` (:mod:`sparkonce.commit.steps`): what each named step does; the default,
    :data:`~sparkonce.commit.steps.CORRECT_STEPS`, is the protocol. Only the protocol
    simulation's tests pass another (a planted bug).
    """

    def __init__(
        self,
        store: LedgerStore,
        stager: Stager,
        *,
        faults: FaultPlan | None = None,
        attempts: int = COMMIT_ATTEMPTS,
        steps: CommitSteps = CORRECT_STEPS,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.store = store
        self.stager = stager
        # The run's fault plan (its crash points), handed down by the sink; none: no faults.
        self.faults = faults if faults is not None else NO_FAULTS
        self.attempts = attempts
        self.steps = steps

    # -- the protocol -------------------------------------------------------------------
    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one micro-batch; calling it again for a committed batch is a no-op.

        A stateful query's replay is still computed, once, with nothing written: Spark
        commits the state stores of a batch only when its DataFrame runs in full, and
        refuses the batch otherwise (``STATE_STORE_COMMIT_VALIDATION_FAILED``).
        """
        staged: list[bool] = []

        def stage(seq: int) -> Staged:
            staged.append(True)
            return self.stager.prepare(ctx, df, seq)

        result = self.commit_with(ctx, stage)
        if not staged and ctx.stateful:
            df.write.format("noop").mode("overwrite").save()
        return result

    def commit_with(self, ctx: BatchContext, stage: Callable[[int], Staged]) -> CommitResult:
        """:meth:`commit`, with ``stage(seq)`` in place of the stager's ``prepare``.

        For callers that stage a batch without Spark (the protocol simulation, unit
        tests): the steps, retries and crash points are the same.
        """
        # Step 0, a cheap look outside the transaction, in the order of steps 1-2: a
        # fenced run stops before it stages anything (no task starts), and a replay of
        # a committed batch is skipped before anything is staged.
        started = time.monotonic()
        last = self._look(ctx)
        skipped = self.steps.check_coverage(self, None, ctx, last)
        if skipped is not None:
            return skipped
        seq = 0 if last is None else last.seq + 1

        self.faults.crash_point(CrashPoint.BEFORE_COMMIT)
        staged: Staged | None = None
        marks = [started, time.monotonic()]
        try:
            try:
                staged = stage(seq)
                marks.append(time.monotonic())
            except SparkOnceError:
                raise
            except Exception:
                # A run that was frozen here (a zombie) may find what it stages gone, such
                # as a stable copy the newer run collected: if it was fenced meanwhile, that
                # is the error to report.
                self._raise_if_fenced(ctx)
                raise
            result = self._commit_staged(ctx, seq, staged, started)
        except Exception:
            # The batch failed (not the process: a crash runs no cleanup, and what it
            # leaves is collected when the next run starts).
            self.stager.abort(ctx, staged)
            raise
        self.faults.crash_point(CrashPoint.AFTER_LEDGER_COMMIT)
        if result.skipped:
            return result
        marks.append(time.monotonic())
        self.stager.after_commit(ctx)
        marks.append(time.monotonic())
        steps = ("look", "stage", "commit", "after")
        spans = {k: round(b - a, 4) for k, a, b in zip(steps, marks[:-1], marks[1:], strict=True)}
        return replace(result, timings=spans)

    def _raise_if_fenced(self, ctx: BatchContext) -> None:
        """Raise ``FencedError`` if a newer run owns the pipeline (a failed read is ignored)."""
        try:
            self.steps.check_owner(self, None, ctx)
        except FencedError:
            raise
        except Exception as exc:  # the store is unreachable: the original error stands
            # A debug line, then ignored: its wording is no behaviour (not mutation tested).
            # pragma: no mutate block
            log.debug("pipeline %r: owner check after a failed stage: %s", ctx.pipeline, exc)

    def _look(self, ctx: BatchContext) -> LedgerEntry | None:
        """Step 0's reads (owner, last entry), under the same retry policy as the commit."""

        def look(_attempt: int) -> LedgerEntry | None:
            self.steps.check_owner(self, None, ctx)
            return self.store.last(ctx.pipeline)

        return self._retrying(ctx, "before the commit", look)

    def _commit_staged(
        self, ctx: BatchContext, seq: int, staged: Staged, started: float
    ) -> CommitResult:
        return self._retrying(
            ctx,
            "during commit",
            lambda attempt: self._transaction(ctx, seq, staged, started, retry=attempt > 1),
        )

    def _retrying(self, ctx: BatchContext, when: str, call: Callable[[int], T]) -> T:
        """The one retry policy: ``call(attempt)`` again on a new connection when the
        store's connection was lost, up to ``attempts`` times in all."""
        for attempt in range(1, self.attempts + 1):
            try:
                return call(attempt)
            except SparkOnceError:
                raise  # explains itself: fenced, ledger conflict, bad rows...
            except Exception as exc:
                lost = self.store.is_connection_error(exc)
                if not lost or attempt == self.attempts:
                    raise _write_error(ctx, self.store, self.stager, exc, lost) from exc
                log.warning(
                    "pipeline %r batch %s: connection to %s lost %s (%s); "
                    "retrying on a new connection (attempt %d/%d)",
                    ctx.pipeline,
                    ctx.ranges,
                    self.store.describe(),
                    when,
                    exc,
                    attempt + 1,
                    self.attempts,
                )
                self.store.reconnect()
        raise AssertionError("unreachable")  # pragma: no cover

    def _transaction(
        self, ctx: BatchContext, seq: int, staged: Staged, started: float, *, retry: bool = False
    ) -> CommitResult:
        store, steps = self.store, self.steps
        with store.transaction() as txn:
            # Step 1: still the owner? (the store holds the lock until step 5)
            steps.check_owner(self, txn, ctx)

            # Step 2: a replay, or a batch the ledger contradicts?
            last = store.last_in(txn, ctx.pipeline)
            skipped = steps.check_coverage(self, txn, ctx, last)
            if skipped is not None:
                if retry and skipped.seq == seq and last is not None and last.epoch == ctx.epoch:
                    # The COMMIT whose connection was lost had gone through: ours.
                    return _committed(self.stager.counted(staged), seq)
                return skipped
            if (0 if last is None else last.seq + 1) != seq:
                raise LedgerError(
                    f"pipeline {ctx.pipeline!r}: the ledger in {store.describe()} moved while "
                    f"batch {ctx.ranges} was being staged (expected entry {seq}); another "
                    "writer is using this pipeline's ledger. Nothing of the batch was committed."
                )
            empty = ctx.ranges.empty and staged.rows == 0
            if empty and not self.stager.keeps_empty_no_data_batches():
                return CommitResult(True, 0, None, "no new offsets and no rows", empty=True)

            # Step 3: make the staged rows visible.
            steps.publish(self, txn, ctx, staged)
            if self.faults.crash_point(CrashPoint.AFTER_ROWS):
                store.lose_connection(txn)

            # Step 4: the ledger entry, in the same transaction.
            entry = _entry(ctx, seq, staged, time.monotonic() - started)
            steps.record(self, txn, entry)
            self.faults.crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)
            # Step 5: commit, on leaving the with-block.
        steps.committed(self, ctx, entry)
        return _committed(self.stager.counted(staged), seq)


def _committed(staged: Staged, seq: int) -> CommitResult:
    written = None if staged.written is None or staged.written == staged.rows else staged.written
    return CommitResult(False, staged.rows, seq, rows_written=written)


def _entry(ctx: BatchContext, seq: int, staged: Staged, seconds: float) -> LedgerEntry:
    from datetime import UTC, datetime

    return LedgerEntry(
        pipeline=ctx.pipeline,
        seq=seq,
        ranges=ctx.ranges,
        epoch=ctx.epoch,
        row_count=staged.rows,
        committed_at=datetime.now(UTC),
        spark_batch_id=ctx.spark_batch_id,
        checkpoint_id=ctx.checkpoint_id,
        stateful=ctx.stateful,
        commit_seconds=round(seconds, 6),
    )


def _write_error(
    ctx: BatchContext, store: LedgerStore, stager: Stager, exc: Exception, lost: bool = False
) -> SinkError:
    """The batch's commit failed; ``lost``: on a store connection lost at every attempt
    (SinkUnavailableError, exit 4, as when it cannot connect at all)."""
    return (SinkUnavailableError if lost else SinkError)(
        f"pipeline {ctx.pipeline!r}: committing batch {ctx.ranges} to {store.describe()} "
        f"failed: {exc}. {stager.after_failed_commit()} Fix the cause and restart the run; "
        "the batch will be replayed."
    )
