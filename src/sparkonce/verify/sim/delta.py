"""The Delta Lake target: the real DeltaSink and its ledger store on a real Delta table.

The ledger store is the real :class:`~sparkonce.ledger.delta.DeltaLedgerStore`,
subclassed only to report each commit's ledger entry (:class:`ObservedDeltaStore`) and
to inject faults: a lost acknowledgement (the Delta commit went through, the run sees an
error) and a failure before the write. The stager is the real
:class:`~sparkonce.DeltaSink`; a batch's rows become a Spark DataFrame, and the sink's
own ``prepare`` and ``publish`` run on it, through the session's JVM. Each run (one
simulated driver process) gets an endpoint of its own, with its own view of the ledger,
as a real process has.

Every commit is a real Delta transaction (about 0.3 s on a local table), so schedules
are slower than SQLite's: run a few hundred, not a million.
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
from sparkonce.ledger.delta import DeltaLedgerStore
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

SCHEMA = "p long, o long, v string, epoch long"


class ObservedDeltaStore(DeltaLedgerStore):
    """The real Delta ledger store; it also reports each commit's ledger entry."""

    observer: Observer | None = None
    lose_ack = 0

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with super().transaction() as txn:
            yield txn
        if txn.entry is not None and self.observer is not None:
            # The entry as committed: with the row count of the Delta commit's metrics.
            committed = self.last(txn.entry.pipeline)
            self.observer.committed([committed if committed is not None else txn.entry])
        if self.lose_ack and txn.entry is not None:
            self.lose_ack -= 1
            raise SinkUnavailableError("the Delta commit's result was lost (injected)")

    def lose_connection(self, txn: Any) -> None:
        """Fault injection: the run fails inside the commit, before Delta's write."""
        raise SinkUnavailableError("the Delta table could not be reached (injected)")


class DeltaTarget(Target):
    """One pipeline and one Delta table in a directory of its own."""

    store_name = "delta"
    sink = "delta"
    retries_connection_faults = False
    connection_fault_error = SinkUnavailableError

    def __init__(self, *, pipeline: str = "sim", root: str | None = None) -> None:
        from sparkonce.sinks.delta import _session

        self.spark = _session()
        self.pipeline = pipeline
        self._root = Path(root or tempfile.mkdtemp(prefix="sparkonce-sim-delta-"))
        self._owns_root = root is None
        self._admin = self._new_endpoint()

    @property
    def path(self) -> str:
        return str(self._root / "sim_out")

    def _new_endpoint(self) -> Endpoint:
        from sparkonce.sinks.delta import DeltaSink

        sink = DeltaSink(self._root, table="sim_out")
        store = ObservedDeltaStore(lambda: sink.table, sink.describe())
        sink.store = store
        sink._committer = Committer(store, sink.stager, faults=FaultPlan())
        if not sink.table.exists():
            sink.validate(self.spark.createDataFrame([], SCHEMA).schema)
        return Endpoint(store, sink.stager, sink)

    def take(self) -> Endpoint:
        return self._new_endpoint()  # a new process: a new view of the ledger

    def give_back(self, ep: Endpoint) -> None:
        ep.store.observer = None
        ep.store.lose_ack = 0

    def acquire(self, ep: Endpoint) -> Owner:
        owner: Owner = ep.store.acquire(self.pipeline)
        return owner

    # -- the namespace -------------------------------------------------------------------
    def reset(self) -> None:
        from sparkonce.sinks.inspect import inspector_for

        inspector_for(self._admin.sink).reset(self.pipeline)
        self._admin = self._new_endpoint()

    def visible_rows(self) -> list[Row]:
        df = self.spark.read.format("delta").load(self.path)
        return [(r["p"], r["o"], r["v"], r["epoch"]) for r in df.collect()]

    def ledger(self) -> list[Entry]:
        store = self._admin.store
        store.forget()
        return [Entry.of(e) for e in store.entries(self.pipeline)]

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
        sink = run.endpoint.stager
        df = self.spark.createDataFrame([tuple(r) for r in rows], SCHEMA)

        def stage(seq: int) -> Staged:
            return sink.prepare(ctx, df, seq)

        return stage, [], []

    def close(self) -> None:
        if self._owns_root:
            with contextlib.suppress(Exception):
                shutil.rmtree(self._root)
