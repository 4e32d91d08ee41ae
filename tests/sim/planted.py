"""Bugs planted on purpose, through the committer's seam (:mod:`sparkonce.commit.steps`).

Each is a :class:`~sparkonce.commit.CommitSteps` that changes one step the protocol
depends on, and counts in ``ran`` how often its own code changed what the correct step
would have done (so a test can tell a bug that was exercised from one that never ran).
``correct = True`` makes it behave as :class:`~sparkonce.commit.CorrectSteps` while
still counting: the tests use it to show that a planted bug's test fails without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sparkonce.commit import Committing, CorrectSteps, CorrectTaskSteps, Staged, Task, TaskResult
from sparkonce.errors import FencedError
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry
from sparkonce.protocol import CrashPoint
from sparkonce.verify.sim import (
    Regression,
    Target,
    TargetSpec,
    close_target,
    generate,
    run_schedules,
    shrink,
)

REGRESSIONS = Path(__file__).parent / "regressions"


class Planted(CorrectSteps):
    """A planted bug: ``ran`` counts the times its code made a difference."""

    caught_as: frozenset[str] = frozenset()  # the failure kinds its invariant gives

    def __init__(self, *, correct: bool = False) -> None:
        self.ran = 0
        self.correct = correct


class SkipsEpochCheck(Planted):
    """Steps 0 and 1 let a fenced run go on: zombies and stale runs commit."""

    caught_as = frozenset({"zombie-not-fenced", "fenced-commit"})

    def check_owner(self, c: Committing, txn: Any | None, ctx: BatchContext) -> None:
        try:
            super().check_owner(c, txn, ctx)
        except FencedError:
            self.ran += 1  # a fenced run's check, skipped
            if self.correct:
                raise


class ChecksCoverageAfterWriting(Planted):
    """Step 2 runs after step 3: a replay's rows are written before it is found out, and
    stay (the batch records no second entry, but its rows commit)."""

    caught_as = frozenset({"duplicate", "epoch", "repeat"})

    def check_coverage(
        self, c: Committing, txn: Any | None, ctx: BatchContext, last: LedgerEntry | None
    ) -> CommitResult | None:
        if self.correct:
            return super().check_coverage(c, txn, ctx, last)
        return None  # not before writing: see record

    def record(self, c: Committing, txn: Any, entry: LedgerEntry) -> None:
        batch_id = -1 if entry.spark_batch_id is None else entry.spark_batch_id
        ctx = BatchContext(entry.pipeline, entry.epoch, entry.ranges, batch_id, entry.checkpoint_id)
        if super().check_coverage(c, txn, ctx, c.store.last_in(txn, entry.pipeline)):
            self.ran += 1  # a replay, found out after its rows were published
            return
        super().record(c, txn, entry)


class LedgerInSecondTransaction(Planted):
    """The rows commit in one transaction, the ledger entry in a second one: a commit whose
    acknowledgement is lost (or a crash in between) leaves rows without their entry."""

    caught_as = frozenset({"duplicate", "outside", "row-count"})

    def record(self, c: Committing, txn: Any, entry: LedgerEntry) -> None:
        if self.correct:
            super().record(c, txn, entry)
            return
        self.ran += 1  # not here: in committed(), after the rows' transaction

    def committed(self, c: Committing, ctx: BatchContext, entry: LedgerEntry) -> None:
        if self.correct:
            return
        with c.store.transaction() as txn:
            super().record(c, txn, entry)
            c.faults.crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)


class FlipsEveryAttempt(Planted):
    """Two-phase sink, step 3: every pre-committed attempt of the batch is flipped, not
    only those Spark reported successful, so a failed task attempt's rows show."""

    caught_as = frozenset({"2pc-visible", "duplicate"})

    def publish(self, c: Committing, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        from sparkonce.sinks.twophase import ATTEMPTS_TABLE

        if self.correct:
            super().publish(c, txn, ctx, staged)
            return
        seq, attempts, _columns = staged.payload
        flipped = txn.execute(
            f"UPDATE {ATTEMPTS_TABLE} SET state = 'committed' WHERE pipeline = %s "
            "AND target = %s AND epoch = %s AND seq = %s AND state = 'precommitted'",
            (ctx.pipeline, getattr(c.stager, "table"), ctx.epoch, seq),  # noqa: B009
        ).rowcount
        if flipped > len(attempts):
            self.ran += 1  # attempts Spark did not report successful, made visible


class _TasksSkipMarkerCheck(CorrectTaskSteps):
    """The task side of :class:`SkipsMarkerCheck` (counts into it)."""

    def __init__(self, bug: SkipsMarkerCheck) -> None:
        self.bug = bug

    def already_written(self, task: Task, found: TaskResult | None) -> TaskResult | None:
        if found is None:
            return None
        self.bug.ran += 1  # a task whose output is committed already, writing it again
        return found if self.bug.correct else None


class SkipsMarkerCheck(Planted):
    """Kafka sink, step 3 in a task: a replayed task does not look for its committed marker
    and writes its records again (a batch whose tasks committed before the driver's ledger
    entry did, replayed after a crash)."""

    caught_as = frozenset({"duplicate"})

    def __init__(self, *, correct: bool = False) -> None:
        super().__init__(correct=correct)
        self.tasks = _TasksSkipMarkerCheck(self)


SQL_BUGS: tuple[type[Planted], ...] = (
    SkipsEpochCheck,
    ChecksCoverageAfterWriting,
    LedgerInSecondTransaction,
)
BUGS: dict[str, type[Planted]] = {
    cls.__name__: cls for cls in (*SQL_BUGS, FlipsEveryAttempt, SkipsMarkerCheck)
}
NOT_CAUGHT = frozenset({"owner-error", "fenced-error", "harness"})  # never count as caught


def store(bug: type[Planted], target: Target, spec: TargetSpec, seeds: range) -> Path | None:
    """Find the bug's first failing seed, shrink it, store it in ``regressions/``."""
    summary = run_schedules(target, seeds, bug(), stop_at_first=True)
    if not summary.failed:
        return None
    seed = summary.failed[0][0]
    small, failures = shrink(generate(seed), target, bug())
    kinds = tuple(dict.fromkeys(f.kind for f in failures if f.kind not in NOT_CAUGHT))
    return Regression(
        f"planted-{bug.__name__}",
        small,
        store=spec.store,
        sink=spec.sink,
        kinds=kinds,
        planted=bug.__name__,
        note=f"seed {seed} (schedule {summary.schedules} of a search from seed "
        f"{seeds.start}), shrunk; stored by python -m tests.sim.planted",
    ).save(REGRESSIONS)


def main(argv: list[str] | None = None) -> None:
    """``python -m tests.sim.planted [POSTGRES_URL] [--kafka BOOTSTRAP]``: store each bug's
    shrunk schedule (the two-phase bug's with PostgreSQL, the Kafka bug's with a broker)."""
    import logging
    import sys
    import uuid

    logging.getLogger("sparkonce").setLevel(logging.ERROR)
    args = list(sys.argv[1:] if argv is None else argv)
    jobs: list[tuple[type[Planted], TargetSpec]] = [(b, TargetSpec("sqlite")) for b in SQL_BUGS]
    ns = uuid.uuid4().hex[:6]
    if "--kafka" in args:
        i = args.index("--kafka")
        bootstrap = args[i + 1]
        del args[i : i + 2]
        jobs.append((SkipsMarkerCheck, TargetSpec("kafka", bootstrap, "kafka", namespace=ns)))
    if args:
        jobs.append((FlipsEveryAttempt, TargetSpec("postgres", args[0], "twophase", namespace=ns)))
    for bug, spec in jobs:
        target = spec.build()
        try:
            print(bug.__name__, store(bug, target, spec, range(2000)))
        finally:
            close_target(target)


if __name__ == "__main__":
    main()
