"""The protocol's named steps, as one object the committer calls: the seam for planted bugs.

:class:`~sparkonce.commit.Committer` runs the protocol (``docs/concepts/protocol.md``) and, at
each named point, calls its :class:`CommitSteps`:

* ``check_owner``: steps 0 and 1, the run's epoch must still be the owner's;
* ``check_coverage``: steps 0 and 2, a batch the ledger already holds is a replay;
* ``publish``: step 3, the stager makes exactly the staged rows visible;
* ``record``: step 4, the ledger entry, in the same transaction;
* ``committed``: after step 5, the transaction that recorded an entry committed;
* ``tasks``: the decisions of the Spark tasks of a stager whose tasks pre-commit (step 3
  in the executors: fenced? already written?), :mod:`sparkonce.commit.tasks`.

:data:`CORRECT_STEPS` (:class:`CorrectSteps`) is the protocol, and what every sink uses.
The protocol simulation's tests plant bugs by passing another implementation (one that
skips the epoch check, say), never by overriding the committer's private methods: a
change to these signatures fails the type check of such an implementation, and a
planted step that no longer runs is seen by its own counter (``tests/sim``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

from sparkonce.commit.tasks import CORRECT_TASK_STEPS, TaskSteps
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry
from sparkonce.offsets import Coverage, classify

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.commit.base import Staged, Stager
    from sparkonce.faults import FaultPlan
    from sparkonce.ledger.base import LedgerStore


class Committing(Protocol):
    """What a step may use of the :class:`~sparkonce.commit.Committer` that calls it.

    The committer passes itself; a planted bug's step uses the same three parts.
    """

    @property
    def store(self) -> LedgerStore:
        """The sink's ledger store."""
        ...

    @property
    def stager(self) -> Stager:
        """The sink's stager."""
        ...

    @property
    def faults(self) -> FaultPlan:
        """The run's fault plan (its crash points)."""
        ...


class CommitSteps(Protocol):
    """What the committer calls at each named step (``txn`` None: step 0, no transaction;
    ``c``: the committer, as :class:`Committing`)."""

    # What a pre-committing stager's tasks decide (the stager carries them to the tasks).
    tasks: TaskSteps

    def check_owner(self, c: Committing, txn: Any | None, ctx: BatchContext) -> None:
        """Raise ``FencedError`` unless ``ctx.epoch`` owns the pipeline."""
        ...

    def check_coverage(
        self, c: Committing, txn: Any | None, ctx: BatchContext, last: LedgerEntry | None
    ) -> CommitResult | None:
        """The skip result if the ledger (last entry ``last``) already holds the batch."""
        ...

    def publish(self, c: Committing, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        """Make exactly the staged rows visible, inside the transaction."""
        ...

    def record(self, c: Committing, txn: Any, entry: LedgerEntry) -> None:
        """Insert the ledger entry, inside the same transaction."""
        ...

    def committed(self, c: Committing, ctx: BatchContext, entry: LedgerEntry) -> None:
        """The transaction that recorded ``entry`` has committed."""
        ...


class CorrectSteps:
    """The protocol's steps, as DESIGN.md section 6 states them."""

    tasks: TaskSteps = CORRECT_TASK_STEPS

    def check_owner(self, c: Committing, txn: Any | None, ctx: BatchContext) -> None:
        c.store.check_owner(txn, ctx.pipeline, ctx.epoch)

    def check_coverage(
        self, c: Committing, txn: Any | None, ctx: BatchContext, last: LedgerEntry | None
    ) -> CommitResult | None:
        coverage = classify(ctx.ranges, {} if last is None else last.end_offsets)
        if coverage is Coverage.NEW:
            return None
        found = _find(c, ctx, last, txn)
        if coverage is Coverage.COMMITTED:
            return CommitResult(
                True,
                0,
                None if found is None else found.seq,
                "offsets already in the ledger (replay)",
            )
        if found is not None:  # a no-data batch: by its Spark identity
            return CommitResult(True, 0, found.seq, "no-data batch already committed (replay)")
        return None

    def publish(self, c: Committing, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        c.stager.publish(txn, ctx, staged)

    def record(self, c: Committing, txn: Any, entry: LedgerEntry) -> None:
        c.store.record(txn, entry)

    def committed(self, c: Committing, ctx: BatchContext, entry: LedgerEntry) -> None:
        return None


CORRECT_STEPS = CorrectSteps()


def _find(
    c: Committing, ctx: BatchContext, last: LedgerEntry | None, txn: Any | None
) -> LedgerEntry | None:
    if last is not None and _same_batch(last, ctx):
        return last
    return c.store.find(txn, ctx.pipeline, ctx)


def _same_batch(entry: LedgerEntry, ctx: BatchContext) -> bool:
    if entry.ranges != ctx.ranges:
        return False
    if not ctx.ranges.empty:
        return True
    return (
        ctx.checkpoint_id is not None
        and entry.checkpoint_id == ctx.checkpoint_id
        and entry.spark_batch_id == ctx.spark_batch_id
    )
