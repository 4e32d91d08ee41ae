"""A deliberately broken Iceberg sink, for tests only: a bug ``sparkonce verify`` must catch.

``UncheckedIcebergSink`` is :class:`~sparkonce.sinks.iceberg.IcebergSink` whose ledger
store checks nothing at the commit: no owner check, no requirement on the metadata the
catalog swaps (epoch or newest entry), no look at what the table already holds, and the
ledger's newest entry inside the commit is the one the run read before it staged the
batch (step 0), not the table's. That is a check-then-act on stale data: a run paused
between its look and its commit (a zombie) commits a batch that a newer run committed
meanwhile, a second time.

Removing the owner and swap checks alone is not enough to plant it: the commit's coverage
check (step 2) re-reads the newest entry from the table it commits on, finds the batch
covered and skips it, and the zombie's next batch then fails on the checkpoint the newer
run moved on, which the runner reports as fenced (the owner's epoch is newer).
"""

from __future__ import annotations

from typing import Any

from pyiceberg.table import Table

from sparkonce.ledger.base import LedgerEntry
from sparkonce.ledger.iceberg import IcebergLedgerStore, PipelineAt
from sparkonce.sinks.iceberg import IcebergSink


class UncheckedIcebergLedgerStore(IcebergLedgerStore):
    looked: LedgerEntry | None = None  # what the run's step 0 read

    def last(self, pipeline: str) -> LedgerEntry | None:
        self.looked = super().last(pipeline)
        return self.looked

    def last_in(self, txn: Any, pipeline: str) -> LedgerEntry | None:
        return self.looked  # the bug: the look before the batch, not the table now

    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        if txn is not None:
            txn.pipeline = pipeline  # the bug: whoever the owner is, go on

    def _requirement(self, entry: LedgerEntry, expect: int | None) -> PipelineAt:
        return PipelineAt(
            pipeline=entry.pipeline, epoch=entry.epoch, check_epoch=False, check_last=False
        )

    def _already(self, entry: LedgerEntry, table: Table) -> bool:
        return False


class UncheckedIcebergSink(IcebergSink):
    """Declares effectively-once, as the real sink, but a zombie's commit is not refused."""

    def __init__(self, catalog: Any, table: str, **kwargs: Any) -> None:
        super().__init__(catalog, table, **kwargs)
        self.store = UncheckedIcebergLedgerStore(catalog, table)
        self.stager.store = self.store
