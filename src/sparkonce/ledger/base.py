"""What every ledger holds: the owner epoch and one entry per committed batch.

See :mod:`sparkonce.protocol` for the commit protocol these records serve.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

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
    # Seconds the batch's commit took, from its first look at the ledger (step 0) to the
    # write of this entry (step 4): staging and the rows' write. The store's own commit
    # (step 5) is not in it, except in a Delta table, whose rows are written at step 5
    # and whose entry records the time to the end of that write. None: not recorded.
    commit_seconds: float | None = None

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
    """What a commit did: ``committed`` rows, or ``skipped`` the batch: a replay (step 2),
    or a no-data batch with no rows (``empty``: nothing to commit, no ledger entry)."""

    skipped: bool
    # The batch's output rows: what the transform gave the sink (the ledger's row count).
    row_count: int
    seq: int | None  # the ledger entry that covers the batch (None for a no-op no-data batch)
    reason: str = ""
    # Rows committed per output, for a pipeline with several outputs (empty otherwise).
    per_output: Mapping[str, int] = field(default_factory=dict)
    # Rows the sink wrote into its table, when not ``row_count``: an upsert with
    # ``latest_by`` writes one row per key of the batch (each inserted or updated).
    # None: every output row was written.
    rows_written: int | None = None
    # A no-data batch (no new offsets) that emitted no rows: skipped, but not a replay.
    empty: bool = False
    # Where the commit's time went, in seconds, for a committed batch of one sink (empty
    # otherwise): "look" (step 0's reads), "stage" (the rows staged: collected, or written
    # by Spark's tasks), "commit" (steps 1-5, the store's transaction, retries included)
    # and "after" (the stager's clean-up after the commit).
    # Measurements, not what was committed: equal results may differ here.
    timings: Mapping[str, float] = field(default_factory=dict, compare=False)

    @property
    def replayed(self) -> bool:
        """Skipped because the ledger already holds the batch (step 2)."""
        return self.skipped and not self.empty

    @property
    def written(self) -> int:
        """Rows the sink wrote into its tables (``row_count`` unless an upsert kept fewer)."""
        return self.row_count if self.rows_written is None else self.rows_written


class LedgerReader(Protocol):
    """What reads a store's ledger (``sparkonce status``, ``sparkonce ui``): a sink, or
    the ledger opened from a store URL (:func:`sparkonce.sinks.registry.open_ledger`)."""

    def owner(self, pipeline: str) -> Owner | None: ...

    def ledger(self, pipeline: str) -> list[LedgerEntry]: ...

    def pipelines(self) -> list[str]: ...

    def describe(self) -> str: ...

    def close(self) -> None: ...


class LedgerStore(ABC):
    """Owner epochs and the batch ledger inside one store.

    ``transaction()`` opens the one store transaction in which the committer runs
    steps 1 to 5: leaving the block without an error commits it (step 5), an error
    rolls it back. The ``txn`` handle it yields is passed back to the other hooks
    and to the stager's ``publish``.
    """

    @abstractmethod
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take ``epoch + 1`` for ``pipeline`` (own transaction); older runs are fenced."""

    @abstractmethod
    def owner(self, pipeline: str) -> Owner | None:
        """The current owner, read outside any commit."""

    @abstractmethod
    def entries(self, pipeline: str) -> list[LedgerEntry]:
        """Every ledger entry of ``pipeline``, oldest first."""

    @abstractmethod
    def last(self, pipeline: str) -> LedgerEntry | None:
        """The newest ledger entry, read outside any commit (a cheap look before staging)."""

    @abstractmethod
    def pipelines(self) -> list[str]:
        """Every pipeline that has taken an epoch in this store (outside any commit)."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[Any]:
        """One store transaction for steps 1-5 (commit on success, rollback on error)."""

    @abstractmethod
    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        """Step 1: raise :class:`~sparkonce.errors.FencedError` unless ``epoch`` owns it.

        Must lock what it reads until the transaction ends (``SELECT ... FOR UPDATE``,
        SQLite's write lock, Kafka's producer epoch), so no newer run can take over
        between this check and the commit. With ``txn`` None (the committer's early
        look, step 0) it reads outside any transaction and keeps no lock.
        """

    @abstractmethod
    def last_in(self, txn: Any, pipeline: str) -> LedgerEntry | None:
        """Step 2: the newest ledger entry, read inside the transaction."""

    @abstractmethod
    def find(self, txn: Any | None, pipeline: str, ctx: BatchContext) -> LedgerEntry | None:
        """Step 2: the entry that committed exactly ``ctx``'s batch, if any.

        ``txn`` None reads outside any transaction (the cheap look before staging).

        A batch with offsets is found by its ranges; a no-data batch (empty ranges)
        by the checkpoint's query id and Spark's batch id.
        """

    @abstractmethod
    def record(self, txn: Any, entry: LedgerEntry) -> None:
        """Step 4: insert ``entry`` inside the transaction."""

    def is_connection_error(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the store connection was lost (the commit is retried)."""
        return False

    def reconnect(self) -> None:  # noqa: B027 - optional hook
        """Drop a broken connection; the next transaction opens a new one."""

    def lose_connection(self, txn: Any) -> None:
        """Fault injection: drop the connection inside the open transaction."""
        raise NotImplementedError(f"{type(self).__name__} cannot drop its connection")

    def describe(self) -> str:
        return type(self).__name__


def behind_end(entry: LedgerEntry, ends: Mapping[TopicPartition, int]) -> bool:
    """Whether ``entry`` ends before ``ends`` in a partition both name.

    Ledger entries chain without gaps, so every partition's end offset only grows with
    ``seq``: no entry at or before one behind ``ends`` can equal a batch sitting at
    ``ends`` (a no-data batch at the ledger's end), and the search for one stops there.
    """
    return any(end < ends[tp] for tp, end in entry.ranges.ends().items() if tp in ends)
