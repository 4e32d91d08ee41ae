"""What a run reports: one :class:`BatchReport` per committed or skipped micro-batch and the
:class:`RunReport` that :meth:`sparkonce.Pipeline.run` returns.

Here, below the runner, so that the observers (which receive them) never import the
pipeline; :mod:`sparkonce.pipeline` re-exports both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkonce.ledger.base import CommitResult
from sparkonce.offsets import BatchRanges, TopicPartition
from sparkonce.outputs.dedup import DedupCounts


@dataclass(frozen=True)
class BatchReport:
    """What happened to one micro-batch."""

    spark_batch_id: int
    ranges: BatchRanges
    result: CommitResult
    seconds: float


@dataclass
class RunReport:
    """What one run did."""

    pipeline: str
    epoch: int
    resumed_from: str  # "start", "checkpoint" or "ledger"
    batches_committed: int = 0
    batches_skipped: int = 0  # replays: batches the ledger already held (step 2)
    rows_committed: int = 0  # the committed batches' output rows (the ledger's row counts)
    # Rows the sinks wrote into their tables: fewer than ``rows_committed`` when an upsert
    # with ``latest_by`` kept one row per key of a batch (each row inserted or updated).
    rows_written: int = 0
    # No-data batches (no new offsets) that emitted no rows: nothing to commit, no entry.
    batches_empty: int = 0
    end_offsets: dict[TopicPartition, int] = field(default_factory=dict)
    batches: list[BatchReport] = field(default_factory=list)
    # Per Spark batch id, what the query's dedup steps did (read from Spark's progress,
    # which comes after the batch's commit; monitoring only). Empty without ``dedupe``.
    dedup: dict[int, DedupCounts] = field(default_factory=dict)
