"""What a sink brings to the committer besides its ledger store: a stager.

The committer (:mod:`sparkonce.commit.committer`) runs the protocol's five steps
once for every sink. What differs between stores is small:

* a :class:`~sparkonce.ledger.base.LedgerStore` keeps the owner epochs and the
  ledger inside the sink's store, and opens the store transaction that steps 1-5
  run in;
* a :class:`Stager` gets a batch's rows ready outside that transaction (collected
  on the driver, or pre-committed by Spark's tasks) and makes them visible inside
  it (step 3).

Where each hook runs: everything here runs on the **driver**, except what a
stager's ``prepare`` starts in Spark tasks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkonce.commit.tasks import CORRECT_TASK_STEPS, TaskSteps
from sparkonce.ledger.base import BatchContext

if TYPE_CHECKING:  # pragma: no cover
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType


@dataclass
class Staged:
    """A batch made ready by :meth:`Stager.prepare`: its rows, and what publishing needs.

    ``rows`` counts the batch's output rows (the ledger entry's row count).
    ``payload`` is the stager's own: collected rows, the ids of pre-committed task
    attempts, and so on. ``written`` counts the rows step 3 wrote into the table when
    that differs from ``rows`` (an upsert with ``latest_by`` writes one row per key);
    None: the same as ``rows``.
    """

    rows: int
    payload: Any = None
    notes: dict[str, Any] = field(default_factory=dict)
    written: int | None = None


class Stager(ABC):
    """How a sink gets a batch's rows ready and makes them visible.

    A stager that collects the rows on the driver may also say so
    (``stages_on_driver = True``) and take them already collected, as an Arrow table
    (:meth:`prepare_arrow`): several outputs with stable output then collect the batch
    once and keep their copy with pyarrow, instead of writing it with Spark and reading
    it back.
    """

    stages_on_driver: bool = False
    # The decisions of this stager's Spark tasks, when they pre-commit (two-phase, Kafka):
    # it puts them into each task's plan (sparkonce.commit.tasks). Only the protocol
    # simulation sets others (CommitSteps.tasks of a planted bug).
    task_steps: TaskSteps = CORRECT_TASK_STEPS

    @abstractmethod
    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        """Outside the store transaction: collect the rows, or pre-commit them in tasks.

        ``seq`` is the ledger entry the batch will become. Raising here commits
        nothing. A stager whose tasks find the run fenced raises ``FencedError``.
        """

    def prepare_arrow(
        self, ctx: BatchContext, table: pa.Table, schema: StructType, seq: int
    ) -> Staged:
        """Like :meth:`prepare`, for rows already collected: ``table`` holds exactly the rows
        and columns ``prepare`` would have collected from a DataFrame of ``schema``.

        Only called when ``stages_on_driver`` is True.
        """
        raise NotImplementedError(f"{type(self).__name__} stages its rows in Spark tasks")

    @abstractmethod
    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        """Step 3, inside the transaction: make exactly the staged rows visible."""

    def abort(self, ctx: BatchContext, staged: Staged | None) -> None:  # noqa: B027
        """The batch failed: clean up what ``prepare`` left (best effort, never raises)."""

    def after_commit(self, ctx: BatchContext) -> None:  # noqa: B027
        """After step 5 (for example, collect aborted pre-commits)."""

    def after_failed_commit(self) -> str:
        """What readers can see after the commit transaction failed (for the error message).

        The default fits stagers whose rows become visible only in step 3, inside the
        transaction. A stager whose tasks commit before the transaction says so.
        """
        return (
            "The transaction was rolled back; nothing of the batch is visible and the ledger "
            "is unchanged."
        )

    def counted(self, staged: Staged) -> Staged:
        """``staged`` with its final counts, once its transaction committed (step 5).

        The default returns it as it is; a stager whose store counts the rows only at the
        commit (a Delta write) sets them on ``staged`` then, and a stager of several
        outputs sums its parts here."""
        return staged

    def keeps_empty_no_data_batches(self) -> bool:
        """Whether a no-data batch with no rows still commits (complete mode empties)."""
        return False
