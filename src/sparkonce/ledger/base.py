"""What every ledger holds: the owner epoch and one entry per committed batch.

See :mod:`sparkonce.protocol` for the commit protocol these records serve.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sparkonce.offsets import BatchRanges, TopicPartition


@dataclass(frozen=True)
class Owner:
    """The current owner of a pipeline in one sink: the latest epoch taken."""

    pipeline: str
    epoch: int
    acquired_at: datetime
    holder: str  # free text naming the run that took the epoch (host, pid)
    source: str | None = None  # the source's URI, for status and lag


@dataclass(frozen=True)
class LedgerEntry:
    """One committed batch. ``seq`` counts 0, 1, 2... per pipeline without gaps."""

    pipeline: str
    seq: int
    ranges: BatchRanges
    epoch: int
    row_count: int
    committed_at: datetime
    spark_batch_id: int | None = None
    checkpoint_id: str | None = None
    # Whether the query kept state in Spark's checkpoint when this batch committed, as
    # Spark reported it (None: written by a sparkonce that did not record it).
    stateful: bool | None = None

    @property
    def end_offsets(self) -> dict[TopicPartition, int]:
        return self.ranges.ends()


@dataclass(frozen=True)
class BatchContext:
    """Everything a sink needs to know about the batch it is committing."""

    pipeline: str
    epoch: int
    ranges: BatchRanges
    spark_batch_id: int
    checkpoint_id: str | None = None
    stateful: bool = False  # the query keeps state in the checkpoint (recorded in the ledger)


@dataclass(frozen=True)
class CommitResult:
    """What a commit did: ``committed`` rows, or ``skipped`` a replay (step 2)."""

    skipped: bool
    row_count: int
    seq: int | None  # the ledger entry that covers the batch (None for a no-op no-data batch)
    reason: str = ""
