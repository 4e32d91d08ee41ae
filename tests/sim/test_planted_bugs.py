"""The simulation must fail on broken committers: three bugs planted on purpose.

Each broken committer subclasses the real :class:`~sparkonce.commit.Committer` and
changes one thing the protocol depends on:

(a) ``SkipsEpochCheck``: step 1 is skipped, so a fenced run (a thawed zombie) can commit;
(b) ``ChecksCoverageAfterWriting``: step 2 runs after step 3 (and there is no look at
    the ledger before staging), so a replay's rows are written before it is found out;
(c) ``LedgerInSecondTransaction``: the rows commit, then the ledger row is recorded in a
    second transaction; a crash between the two leaves rows without a ledger entry.

Each must be caught within ``BUDGET`` schedules; the number it took, and how many of
the first 500 schedules fail, are printed in the summary at the end of the run.
Measured on 2026-11-22 (SQLite, restores on, seeds from 0): (a) caught by schedule 4
(seed 3, the logical-clock epoch check), 144 of 500 fail; (b) by schedule 2 (seed 1,
rows of another epoch than their entry), 229 of 500; (c) by schedule 1 (seed 0,
duplicates), 236 of 500. Before restores were on: 4, 2 and 1 as well (143, 217, 240).
"""

from __future__ import annotations

import time
from typing import Any, cast

import pytest

from sparkonce.commit import Committer, Staged
from sparkonce.commit.committer import _entry
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerStore
from sparkonce.protocol import CrashPoint
from sparkonce.verify.sim import (
    Schedule,
    SqlTarget,
    generate,
    run_schedule,
    run_schedules,
    shrink,
)
from tests.sim.conftest import PLANTED

BUDGET = 2_000


class _NoFence:
    """The real store, except that step 1 (the epoch check) does nothing."""

    def __init__(self, store: Any) -> None:
        self._store = store

    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class SkipsEpochCheck(Committer):
    """Bug (a): the epoch is never checked, so zombies commit."""

    def __init__(self, store: Any, stager: Any, **kwargs: Any) -> None:
        super().__init__(cast("LedgerStore", _NoFence(store)), stager, **kwargs)


class ChecksCoverageAfterWriting(Committer):
    """Bug (b): the rows are written first; a replay is noticed only afterwards."""

    def commit_with(self, ctx: BatchContext, stage: Any) -> CommitResult:
        last = self.store.last(ctx.pipeline)
        seq = 0 if last is None else last.seq + 1
        self.faults.crash_point(CrashPoint.BEFORE_COMMIT)
        result = self._commit_staged(ctx, seq, stage(seq), time.monotonic())
        self.faults.crash_point(CrashPoint.AFTER_LEDGER_COMMIT)
        return result

    def _transaction(
        self, ctx: BatchContext, seq: int, staged: Staged, started: float, *, retry: bool = False
    ) -> CommitResult:
        store = self.store
        with store.transaction() as txn:
            store.check_owner(txn, ctx.pipeline, ctx.epoch)
            self.stager.publish(txn, ctx, staged)  # step 3 before step 2: the bug
            if self.faults.crash_point(CrashPoint.AFTER_ROWS):
                store.lose_connection(txn)
            last = store.last_in(txn, ctx.pipeline)
            skipped = self._replay(ctx, last, txn)
            if skipped is not None:
                return skipped  # ...and the rows written above commit with it
            seq = 0 if last is None else last.seq + 1
            store.record(txn, _entry(ctx, seq, staged, time.monotonic() - started))
            self.faults.crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)
        return CommitResult(False, staged.rows, seq)


class LedgerInSecondTransaction(Committer):
    """Bug (c): rows in one transaction, the ledger row in a second one."""

    def _transaction(
        self, ctx: BatchContext, seq: int, staged: Staged, started: float, *, retry: bool = False
    ) -> CommitResult:
        store = self.store
        with store.transaction() as txn:
            store.check_owner(txn, ctx.pipeline, ctx.epoch)
            skipped = self._replay(ctx, store.last_in(txn, ctx.pipeline), txn)
            if skipped is not None:
                return skipped
            self.stager.publish(txn, ctx, staged)
        # The bug: the rows are committed now; the ledger row follows in a second transaction.
        if self.faults.crash_point(CrashPoint.AFTER_ROWS):
            store.reconnect()
        with store.transaction() as txn:
            store.record(txn, _entry(ctx, seq, staged, time.monotonic() - started))
            self.faults.crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)
        return CommitResult(False, staged.rows, seq)


@pytest.mark.parametrize(
    ("bug", "caught_as"),
    [
        (SkipsEpochCheck, {"zombie-not-fenced", "fenced-commit"}),
        (ChecksCoverageAfterWriting, {"duplicate", "epoch", "row-count", "ledger", "owner-error"}),
        (LedgerInSecondTransaction, {"duplicate", "epoch", "row-count", "ledger", "owner-error"}),
    ],
)
def test_planted_bug_is_caught(
    sqlite_target: SqlTarget,
    bug: type[Committer],
    caught_as: set[str],
) -> None:
    summary = run_schedules(sqlite_target, range(BUDGET), bug, stop_at_first=True)
    assert summary.failed, f"{bug.__name__} survived {summary.schedules} schedules"
    seed, failures = summary.failed[0]
    kinds = {f.kind for f in failures}
    assert kinds & caught_as, failures
    first500 = run_schedules(sqlite_target, range(500), bug)
    PLANTED.append(
        f"{bug.__name__}: caught by schedule {summary.schedules} (seed {seed}, "
        f"[{failures[0].kind}]); {first500.failed_count} of the first 500 schedules fail"
    )


def test_a_failure_shrinks_and_replays(sqlite_target: SqlTarget) -> None:
    """The shrunk schedule is smaller, fails the same way, and replays from its JSON."""
    summary = run_schedules(
        sqlite_target, range(BUDGET), LedgerInSecondTransaction, stop_at_first=True
    )
    seed, failures = summary.failed[0]
    schedule = generate(seed)
    small, small_failures = shrink(schedule, sqlite_target, LedgerInSecondTransaction)
    assert len(small.events) <= len(schedule.events)
    assert small_failures and small_failures[0].kind == failures[0].kind
    again = Schedule(
        small.seed,
        small.totals,
        small.initial,
        Schedule.parse_events(small.events_json()),
        small.final,
    )
    replayed, _ = run_schedule(again, sqlite_target, LedgerInSecondTransaction)
    assert [f.kind for f in replayed] == [f.kind for f in small_failures]
    # The real committer passes the same schedule.
    assert run_schedule(again, sqlite_target)[0] == []
