"""The Iceberg target: the real IcebergSink and its ledger store on a real Iceberg table.

The table lives in a SQLite SQL catalog and a file warehouse in a directory of its own.
The ledger store is the real :class:`~sparkonce.ledger.iceberg.IcebergLedgerStore`,
subclassed only to report each commit's ledger entry and to inject faults: a lost
acknowledgement (the catalog commit went through, the run sees an error) and a failure
inside the commit before it. A batch's rows are an Arrow table given to the sink's own
``prepare_arrow``: no Spark. Each run (one simulated driver process) gets an endpoint of
its own, with its own catalog handle, as a real process has.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.commit import Committer, Staged
from sparkonce.errors import SinkUnavailableError
from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import Owner
from sparkonce.ledger.iceberg import IcebergLedgerStore
from sparkonce.verify.sim.target import (
    Endpoint,
    Entry,
    Observer,
    Planned,
    Row,
    Running,
    StageFn,
    Target,
)
from sparkonce.verify.sim.world import InjectedFailure

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.ledger.base import BatchContext

TABLE = "sim.out"


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("p", pa.int64()), ("o", pa.int64()), ("v", pa.string()), ("epoch", pa.int64())]
    )


class ObservedIcebergStore(IcebergLedgerStore):
    """The real Iceberg ledger store; it also reports each commit's ledger entry."""

    observer: Observer | None = None
    lose_ack = 0

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with super().transaction() as txn:
            yield txn
        if txn.entry is not None and self.observer is not None:
            self.observer.committed([txn.entry])
        if self.lose_ack and txn.entry is not None:
            self.lose_ack -= 1
            raise SinkUnavailableError("the Iceberg commit's result was lost (injected)")

    def lose_connection(self, txn: Any) -> None:
        """Fault injection: the run fails inside the commit, before the catalog commit."""
        raise SinkUnavailableError("the Iceberg catalog could not be reached (injected)")


class IcebergTarget(Target):
    """One pipeline and one Iceberg table in a directory of its own."""

    store_name = "iceberg"
    sink = "iceberg"
    retries_connection_faults = False
    connection_fault_error = SinkUnavailableError
    # The store class of every run (a planted bug's subclass, in tests/sim).
    store_class: type[ObservedIcebergStore] = ObservedIcebergStore

    def __init__(self, *, pipeline: str = "sim", root: str | None = None) -> None:
        self.pipeline = pipeline
        self._root = Path(root or tempfile.mkdtemp(prefix="sparkonce-sim-iceberg-"))
        self._owns_root = root is None
        self._admin = self._new_endpoint()

    def _catalog(self) -> Any:
        from pyiceberg.catalog.sql import SqlCatalog

        return SqlCatalog(
            "sim", uri=f"sqlite:///{self._root}/cat.db", warehouse=f"file://{self._root}/wh"
        )

    def _new_endpoint(self) -> Endpoint:
        from sparkonce.sinks.iceberg import IcebergSink

        sink = IcebergSink(self._catalog(), TABLE)
        store = self.store_class(sink.catalog, TABLE, schema=_schema())
        sink.store = store
        sink.stager.store = store
        sink._committer = Committer(store, sink.stager, faults=FaultPlan())
        store.load()  # creates the table on first use
        return Endpoint(store, sink.stager, sink)

    def take(self) -> Endpoint:
        return self._new_endpoint()  # a new process: a new catalog handle

    def give_back(self, ep: Endpoint) -> None:
        ep.store.observer = None
        ep.store.lose_ack = 0

    def acquire(self, ep: Endpoint) -> Owner:
        owner: Owner = ep.store.acquire(self.pipeline)
        return owner

    # -- the namespace -------------------------------------------------------------------
    def reset(self) -> None:
        catalog = self._catalog()
        with contextlib.suppress(Exception):
            catalog.purge_table(TABLE)
        self._admin = self._new_endpoint()

    def visible_rows(self) -> list[Row]:
        t = self._admin.store.load().scan().to_arrow()
        return [(r["p"], r["o"], r["v"], r["epoch"]) for r in t.to_pylist()]

    def ledger(self) -> list[Entry]:
        return [Entry.of(e) for e in self._admin.store.entries(self.pipeline)]

    def owner_epoch(self) -> int | None:
        owner = self._admin.store.owner(self.pipeline)
        return None if owner is None else owner.epoch

    # -- staging -------------------------------------------------------------------------
    def stage(
        self, run: Running, ctx: BatchContext, batch: Planned, rows: list[Row], fail: bool
    ) -> tuple[StageFn, list[int], list[int]]:
        if fail:

            def failing(seq: int) -> Staged:
                raise InjectedFailure("injected batch failure")

            return failing, [], []
        import pyarrow as pa

        stager: Any = run.endpoint.stager
        table = pa.Table.from_pylist(
            [dict(zip(("p", "o", "v", "epoch"), r, strict=True)) for r in rows], schema=_schema()
        )

        def stage(seq: int) -> Staged:
            return stager.prepare_arrow(ctx, table, None, seq)

        return stage, [], []

    def close(self) -> None:
        if self._owns_root:
            with contextlib.suppress(Exception):
                shutil.rmtree(self._root)
