"""The ledger of an Apache Iceberg sink: in the table's own metadata, through PyIceberg.

An Iceberg table has no rows of ours to hold a ledger in, but every change to it is
one catalog commit that swaps the table's metadata file atomically (the SQL catalog:
``UPDATE iceberg_tables SET metadata_location = new WHERE metadata_location = old``,
which fails with ``CommitFailedException`` when another commit came first). The
ledger rides on those commits.

**The pipeline's state, in table properties.** Per pipeline ``p``:

* ``sparkonce.p.epoch``: the owner epoch;
* ``sparkonce.p.owner``: the owner's details (JSON: epoch, holder, source, time);
* ``sparkonce.p.last``: the newest ledger entry (JSON, :data:`ICEBERG_ENTRY`): its
  ``seq``, ranges (their ends are the resume point), epoch, rows, Spark batch id...

Table properties live in every metadata file: expiring snapshots never loses them,
and a concurrent append by another writer (not sparkonce) carries them over.

**Each batch is one Iceberg snapshot.** The batch's rows (an Arrow table) are appended
in one PyIceberg transaction that also sets ``sparkonce.p.last`` to the batch's entry;
the snapshot's summary holds the same entry under ``sparkonce.p.entry``, so older
entries are read from the snapshot history while it lasts (:meth:`entries`; expired
snapshots take their entries with them, never the resume point).

**The check is made on the metadata the commit swaps in.** The transaction carries a
requirement of its own (:class:`PipelineAt`) that PyIceberg's SQL catalog validates
against the metadata it has just loaded for the compare-and-swap: the stored epoch is
the batch's, and the stored ``last`` is the entry just before the batch (``seq - 1``).
PyIceberg re-applies the transaction's updates to that same metadata, and the swap
succeeds only if nothing committed in between. So:

* A **zombie** (an older epoch) fails the requirement: the store reads the table again
  and raises :class:`~sparkonce.errors.FencedError`, never a silent skip.
* A **retry of the same commit** after a lost acknowledgement finds ``last`` already at
  its own ``(epoch, seq)`` and does not append again.
* A **concurrent plain append** by another writer only moves the table on: the swap
  fails with ``CommitFailedException``, PyIceberg (or this store) reloads, the
  requirement is checked again on the newer metadata, and the batch commits.
* Anything else (``last`` at another seq) is a :class:`~sparkonce.errors.LedgerError`.

**Taking an epoch** (:meth:`acquire`) is a catalog commit of its own that sets
``sparkonce.p.epoch`` to ``e + 1`` under a requirement that the stored epoch is still
``e``: two stores racing can never both take ``e + 1``, and a batch commit of epoch
``e`` racing with it either lands first (and the acquire then sees it) or fails its
requirement (fenced).

The requirement is checked in this process by PyIceberg's catalog code: that holds for
the SQL catalog (tested on SQLite and PostgreSQL in ``tests/iceberg``). A REST catalog
checks requirements on its server, which does not know this one: other catalogs are
not supported by this slice.

**What a batch's snapshot adds.** Either Parquet data files that Spark's tasks wrote
into the table's location (:class:`DataFiles`, the sink's executor route: PyIceberg's
``add_files`` reads their footers for the manifest, nothing of the rows passes through
the driver), or an Arrow table that PyIceberg writes itself (``append``; the protocol
simulation's route, no Spark). Either way it is the same one transaction, so one
snapshot per batch with the entry in its summary. The executor route also records the
name of the batch's staging directory in the summary (``sparkonce.p.staged``): the
orphan sweep (:mod:`sparkonce.sinks.iceberg`) keeps exactly that directory of each
committed batch. An upsert's snapshot also removes the data files that hold the batch's
keys and adds their other rows, rewritten into the same directory
(:mod:`sparkonce.ledger.iceberg_upsert`): still one snapshot, one catalog commit.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pyiceberg.exceptions import CommitFailedException, NoSuchTableError, ValidationException
from pyiceberg.table import Table, Transaction
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.snapshots import Snapshot
from pyiceberg.table.update import (
    RemoveSnapshotsUpdate,
    ValidatableTableRequirement,
    update_table_metadata,
)

from sparkonce.errors import ConfigError, FencedError, LedgerError
from sparkonce.ledger.base import BatchContext, LedgerEntry, LedgerStore, Owner, behind_end
from sparkonce.ledger.iceberg_upsert import add_upsert, local_path
from sparkonce.ledger.records import ICEBERG_ENTRY

log = logging.getLogger(__name__)

PREFIX = "sparkonce."
COMMIT_ATTEMPTS = 20  # catalog swaps lost to other writers before the commit gives up
#: The most snapshots one batch commit expires. PyIceberg's removal compares every id to
#: expire with every snapshot of the table, so a table that enables retention with a long
#: history behind it sheds that history over several commits, each bounded.
EXPIRE_PER_COMMIT = 100
#: The properties of a table the sink creates. Manifest merging: an append adds a manifest,
#: and the manifest list each commit writes names every manifest of the table, so without
#: merging a commit grows with the batches ever committed (fast appends). With it, PyIceberg
#: merges the small manifests once there are 100 of them (Iceberg's default count).
TABLE_PROPERTIES = {"commit.manifest-merge.enabled": "true"}


def key(pipeline: str, name: str) -> str:
    """The table property (or snapshot summary key) ``name`` of ``pipeline``."""
    return f"{PREFIX}{pipeline}.{name}"


class PipelineMoved(ValidationException):
    """The metadata the catalog would commit on no longer holds what the commit expects.

    A :class:`ValidationException`: PyIceberg does not retry it, and deletes the
    files it wrote for the commit."""

    def __init__(self, epoch: int, last_seq: int | None) -> None:
        self.epoch = epoch
        self.last_seq = last_seq
        super().__init__(f"sparkonce: stored epoch {epoch}, last seq {last_seq}")


def _state(props: dict[str, str], pipeline: str) -> tuple[int, int | None]:
    epoch = int(props.get(key(pipeline, "epoch"), "0"))
    last = props.get(key(pipeline, "last"))
    return epoch, (int(json.loads(last)["seq"]) if last else None)


class PipelineAt(ValidatableTableRequirement):
    """The stored epoch of ``pipeline`` is ``epoch`` and its newest entry is ``last_seq``
    (None: no entry; -1: not checked). Validated by the catalog on the metadata it swaps."""

    type: Literal["sparkonce-pipeline-at"] = Field(default="sparkonce-pipeline-at")
    pipeline: str
    epoch: int
    last_seq: int | None = None
    check_last: bool = True
    check_epoch: bool = True  # False only in the simulation's planted bug

    def validate(self, base_metadata: TableMetadata | None) -> None:  # type: ignore[override]
        if base_metadata is None:
            raise CommitFailedException("sparkonce: the table's metadata is missing")
        epoch, last = _state(dict(base_metadata.properties), self.pipeline)
        if (self.check_epoch and epoch != self.epoch) or (
            self.check_last and last != self.last_seq
        ):
            raise PipelineMoved(epoch, last)


def require(txn: Any, requirement: PipelineAt) -> None:
    """Add ``requirement`` to a PyIceberg transaction (checked now, and by the catalog on
    the metadata it commits on). PyIceberg's public API has no way to add one of ours."""
    txn._apply((), (requirement,))


class OnceTransaction(Transaction):
    """PyIceberg's transaction, with its view of the metadata worked out once per change.

    PyIceberg 0.12's ``Transaction.table_metadata`` applies the pending updates to the
    table's metadata and deep-copies the result on every read, and one batch commit reads
    it again and again: 18 times with ``add_files`` (the sink's route, under cProfile), 23
    with ``append`` (counted in ``tests/iceberg/test_ledger.py``). Each copy is as large
    as the table's snapshot history, so a commit grew with the snapshot count: at 1,000
    snapshots the copies took 12.2 s of a 14.7 s commit under cProfile
    (``benchmarks/iceberg.py --mode snapshots``).
    Here the result is kept while the table's metadata object and the tuple of updates are
    the same objects (PyIceberg replaces both and never changes either in place: a refresh
    after a lost race assigns new metadata, a new update makes a new tuple), so it is
    worked out 3 times per commit, once per state. The metadata is a frozen model, of
    which PyIceberg makes changed copies; no reader in its commit path changes it.
    """

    _seen: tuple[Any, Any, TableMetadata] | None = None

    @property
    def table_metadata(self) -> TableMetadata:
        base, updates = self._table.metadata, self._updates
        seen = self._seen
        if seen is not None and seen[0] is base and seen[1] is updates:
            return seen[2]
        meta = update_table_metadata(base, updates)
        self._seen = (base, updates, meta)
        return meta


def history(table: Table) -> Iterator[Snapshot]:
    """The table's current snapshot and its ancestors, newest first.

    PyIceberg's ``ancestors_of`` finds each parent by a scan of the snapshot list, so a
    walk of the whole history is quadratic in its length: 7.2 s at 10,000 snapshots
    against 0.04 s at 1,000, and the orphan sweep walks it after every commit
    (``benchmarks/iceberg.py --mode snapshots``). Here the parents are looked up in a dict
    made once per walk."""
    by_id = {s.snapshot_id: s for s in table.metadata.snapshots}
    snap = table.current_snapshot()
    while snap is not None:
        yield snap
        parent = snap.parent_snapshot_id
        snap = by_id.get(parent) if parent is not None else None


def expired_by(meta: TableMetadata, keep: int) -> list[int]:
    """The snapshots a commit expires to keep the newest ``keep`` of the main branch's
    history (the current snapshot counts), oldest first and at most
    :data:`EXPIRE_PER_COMMIT`. Snapshots off that history (other branches, snapshots left
    behind by a rollback) and any snapshot a branch or tag points at are left alone."""
    by_id = {s.snapshot_id: s for s in meta.snapshots}
    line: list[int] = []
    snap = by_id.get(meta.current_snapshot_id) if meta.current_snapshot_id is not None else None
    while snap is not None:
        line.append(snap.snapshot_id)
        parent = snap.parent_snapshot_id
        snap = by_id.get(parent) if parent is not None else None
    held = {ref.snapshot_id for ref in meta.refs.values()}
    old = [i for i in reversed(line[keep:]) if i not in held]
    return old[:EXPIRE_PER_COMMIT]


def transaction(table: Table) -> Transaction:
    """A transaction on ``table`` (:class:`OnceTransaction`)."""
    return OnceTransaction(table)


@dataclass(frozen=True)
class DataFiles:
    """Parquet files already written into the table's location, to be added as they are.

    ``paths``: full URIs as the table's FileIO reads them; ``num_rows``: their rows in all
    (from the footers); ``staged``: the name of the directory they are in (recorded in the
    snapshot summary for the orphan sweep). ``keys``: an upsert's key columns (the files
    hold one row per key), whose existing rows the snapshot replaces
    (:mod:`sparkonce.ledger.iceberg_upsert`); empty for an append."""

    paths: tuple[str, ...]
    num_rows: int
    staged: str
    keys: tuple[str, ...] = ()


def staged_dir(data: DataFiles) -> Path:
    """The local staging directory of ``data``'s files (where an upsert's survivors go)."""
    return local_path(data.paths[0]).parent if data.paths else Path("/nonexistent")


@dataclass
class IcebergTxn:
    """One batch commit in the making: the steps record into it, the exit commits it."""

    table: Table
    pipeline: str = ""
    entry: LedgerEntry | None = None
    # The batch's rows (the stager's publish sets it): DataFiles, or a pyarrow.Table.
    data: Any = None
    rows: int = 0
    replayed: bool = False  # the exit found this very commit already in the table
    notes: dict[str, Any] = field(default_factory=dict)


class IcebergLedgerStore(LedgerStore):
    """Owner epochs and the batch ledger of one Iceberg table (see the module docstring).

    ``catalog``: a PyIceberg catalog (``SqlCatalog``); ``identifier``: ``"ns.table"``.
    ``schema``: a pyarrow schema to create the table with when it does not exist yet
    (None: the table must exist). ``keep_snapshots``: each batch commit also expires the
    main branch's snapshots older than the newest ``keep_snapshots`` (:func:`expired_by`),
    in the same catalog commit; None keeps them all.
    """

    def __init__(
        self,
        catalog: Any,
        identifier: str,
        schema: Any = None,
        *,
        keep_snapshots: int | None = None,
    ) -> None:
        self.catalog = catalog
        self.identifier = identifier
        self.schema = schema
        self.keep_snapshots = keep_snapshots
        # The table as the last batch commit of this store left it (None: none yet), for
        # what runs after the commit (the orphan sweep) without loading it again.
        self.committed: Table | None = None

    def describe(self) -> str:
        return f"Iceberg table {self.identifier}"

    # -- reads ------------------------------------------------------------------------
    def load(self) -> Table:
        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            if self.schema is None:
                raise ConfigError(
                    f"Iceberg table {self.identifier} does not exist in catalog "
                    f"{self.catalog.name!r}: create it, or give the sink the batch schema "
                    "to create it with."
                ) from None
            return self._create()

    def existing(self) -> Table | None:
        """The table, or None when it does not exist yet: the reads before the run's checks
        (owner, ledger, resume point) find nothing committed, and create nothing."""
        try:
            return self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            return None

    def _create(self) -> Table:
        ns = tuple(self.identifier.split(".")[:-1])
        if ns:
            self.catalog.create_namespace_if_not_exists(ns)
        try:
            return self.catalog.create_table(
                self.identifier, schema=self.schema, properties=TABLE_PROPERTIES
            )
        except Exception:  # another run created it first
            return self.catalog.load_table(self.identifier)

    def _last(self, props: dict[str, str], pipeline: str) -> LedgerEntry | None:
        text = props.get(key(pipeline, "last"))
        if not text:
            return None
        return ICEBERG_ENTRY.decode(pipeline, json.loads(text), where=key(pipeline, "last"))

    def owner(self, pipeline: str) -> Owner | None:
        table = self.existing()
        if table is None:
            return None
        props = dict(table.properties)
        epoch, _ = _state(props, pipeline)
        if epoch == 0:
            return None
        data = json.loads(props.get(key(pipeline, "owner"), "{}"))
        at = data.get("at")
        return Owner(
            pipeline,
            epoch,
            datetime.fromisoformat(at) if at else datetime.fromtimestamp(0, UTC),
            str(data.get("holder", "unknown")),
            data.get("source"),
        )

    def last(self, pipeline: str) -> LedgerEntry | None:
        table = self.existing()
        return None if table is None else self._last(dict(table.properties), pipeline)

    def entries(self, pipeline: str) -> list[LedgerEntry]:
        """The entries in the snapshot history (newest entry always, from the properties);
        entries of expired snapshots are gone."""
        table = self.existing()
        if table is None:
            return []
        found: dict[int, LedgerEntry] = {}
        name = key(pipeline, "entry")
        for snap in history(table):
            text = snap.summary[name] if snap.summary is not None else None
            if text:
                e = ICEBERG_ENTRY.decode(
                    pipeline, json.loads(text), where=f"snapshot {snap.snapshot_id}"
                )
                found.setdefault(e.seq, e)
        last = self._last(dict(table.properties), pipeline)
        if last is not None:
            found[last.seq] = last
        return [found[s] for s in sorted(found)]

    def pipelines(self) -> list[str]:
        table = self.existing()
        if table is None:
            return []
        props = table.properties
        return sorted(
            k[len(PREFIX) : -len(".epoch")]
            for k in props
            if k.startswith(PREFIX) and k.endswith(".epoch")
        )

    # -- owner epochs ---------------------------------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take ``epoch + 1`` in a catalog commit that requires the stored epoch unchanged."""
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            table = self.load()
            epoch, _ = _state(dict(table.properties), pipeline)
            new = epoch + 1
            now = datetime.now(UTC)
            owner = {"epoch": new, "holder": holder, "source": source, "at": now.isoformat()}
            txn = transaction(table)
            try:
                require(txn, PipelineAt(pipeline=pipeline, epoch=epoch, check_last=False))
                txn.set_properties(
                    {key(pipeline, "epoch"): str(new), key(pipeline, "owner"): json.dumps(owner)}
                )
                txn.commit_transaction()
            except (CommitFailedException, PipelineMoved):
                if attempt == COMMIT_ATTEMPTS:
                    raise
                log.info("pipeline %r: another commit came first; acquiring again", pipeline)
                continue
            return Owner(pipeline, new, now, holder, source)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- the committer's steps ---------------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[IcebergTxn]:
        txn = IcebergTxn(self.load())
        yield txn
        # Leaving the block without an error: the catalog commit (step 5).
        if txn.entry is None:
            return  # a replay or an empty no-data batch: nothing to commit
        self._commit(txn)

    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        table = self.load() if txn is None else txn.table
        if txn is not None:
            txn.pipeline = pipeline
        current, _ = _state(dict(table.properties), pipeline)
        if current != epoch:
            self._fenced(pipeline, epoch, current)

    def _fenced(self, pipeline: str, epoch: int, current: int) -> None:
        owner = self.owner(pipeline) if current else None
        raise FencedError(pipeline, epoch, current, "", owner.holder if owner else "")

    def last_in(self, txn: Any, pipeline: str) -> LedgerEntry | None:
        return self._last(dict(txn.table.properties), pipeline)

    def find(self, txn: Any | None, pipeline: str, ctx: BatchContext) -> LedgerEntry | None:
        """The entry of exactly ``ctx``'s batch, newest first (as the Delta ledger's)."""
        at = ctx.ranges.ends()
        starts = ctx.ranges.starts()
        for e in reversed(self.entries(pipeline)):
            if e.ranges == ctx.ranges and (
                not ctx.ranges.empty
                or (e.checkpoint_id == ctx.checkpoint_id and e.spark_batch_id == ctx.spark_batch_id)
            ):
                return e
            if ctx.ranges.empty and behind_end(e, at):
                return None
            if not ctx.ranges.empty and all(
                e.ranges.ends().get(tp, 0) <= start for tp, start in starts.items()
            ):
                return None
        return None

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        """Step 4: the entry rides on the catalog commit at the block's exit."""
        txn.entry = entry
        txn.notes["recorded"] = time.monotonic()

    # -- the commit -----------------------------------------------------------------------
    def _commit(self, txn: IcebergTxn) -> None:
        entry = txn.entry
        assert entry is not None
        self.committed = None
        if txn.data is None:
            raise LedgerError(
                f"pipeline {entry.pipeline!r}: batch {entry.seq} reached its Iceberg commit "
                "without rows staged (the stager did not publish); nothing was committed."
            )
        if entry.commit_seconds is not None and "recorded" in txn.notes:
            spent = entry.commit_seconds + time.monotonic() - txn.notes["recorded"]
            entry = replace(entry, commit_seconds=round(spent, 6))
        entry = replace(entry, row_count=txn.data.num_rows)
        doc = json.dumps(ICEBERG_ENTRY.encode(entry))
        expect = entry.seq - 1 if entry.seq > 0 else None
        table = txn.table
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            if self._already(entry, table):
                txn.replayed = True
                break
            written: list[Path] = []
            t = transaction(table)
            try:
                # Checked now on ``table``, and again by the catalog on the metadata it swaps:
                # a failure there reloads, and _already says what happened.
                require(t, self._requirement(entry, expect))
                t.set_properties({key(entry.pipeline, "last"): doc})
                summary = {key(entry.pipeline, "entry"): doc}
                if isinstance(txn.data, DataFiles) and txn.data.keys:
                    summary[key(entry.pipeline, "staged")] = txn.data.staged
                    # The rows the batch replaces go in the same one snapshot (copy-on-write).
                    written, replaced = add_upsert(
                        t, txn.data.paths, txn.data.keys, summary, staged_dir(txn.data)
                    )
                    txn.notes["replaced"] = replaced
                elif isinstance(txn.data, DataFiles):
                    summary[key(entry.pipeline, "staged")] = txn.data.staged
                    # No duplicate check: it reads every manifest of the table (a cost that
                    # grows with the table), and cannot fire: the files sit in a directory
                    # unique to this attempt, and a second commit of the batch is stopped
                    # by the requirement above (its ``last`` moved) or by _already.
                    t.add_files(
                        list(txn.data.paths),
                        snapshot_properties=summary,
                        check_duplicate_files=False,
                    )
                else:
                    t.append(txn.data, snapshot_properties=summary)
                if self.keep_snapshots is not None:
                    # Expiry rides on the batch's own commit: the batch's snapshot is the
                    # current one here, so it counts among those kept.
                    old = expired_by(t.table_metadata, self.keep_snapshots)
                    if old:
                        t._apply((RemoveSnapshotsUpdate.model_validate({"snapshot-ids": old}),), ())
                        txn.notes["expired"] = len(old)
                self.committed = t.commit_transaction()
                break
            except (CommitFailedException, ValidationException, ValueError) as exc:
                # PyIceberg's ValueError here: a snapshot this commit expires was expired by
                # another writer first, found when the catalog applies the commit on the
                # newer metadata (nothing landed). Any other ValueError is not a race.
                if isinstance(exc, ValueError) and not (
                    txn.notes.get("expired") and "does not exist" in str(exc)
                ):
                    raise
                # Neither landed (PyIceberg's word, and PipelineMoved is ours): an upsert's
                # survivors were read from metadata that moved on; they go, and are redone.
                for f in written:
                    f.unlink(missing_ok=True)
                if attempt == COMMIT_ATTEMPTS:
                    raise
                log.info(
                    "pipeline %r: batch %d lost a catalog race (%s); again",
                    entry.pipeline,
                    entry.seq,
                    exc,
                )
                table = self.catalog.load_table(self.identifier)
        txn.entry = entry
        txn.rows = entry.row_count

    def _requirement(self, entry: LedgerEntry, expect: int | None) -> PipelineAt:
        """What the catalog must find on the metadata it commits ``entry`` on."""
        return PipelineAt(pipeline=entry.pipeline, epoch=entry.epoch, last_seq=expect)

    def _already(self, entry: LedgerEntry, table: Table) -> bool:
        """Whether ``table`` holds this very commit; raise if it cannot take it."""
        props = dict(table.properties)
        epoch, last = _state(props, entry.pipeline)
        if epoch != entry.epoch:
            self._fenced(entry.pipeline, entry.epoch, epoch)
        if last == entry.seq:
            stored = self._last(props, entry.pipeline)
            assert stored is not None
            if stored.epoch == entry.epoch and stored.ranges == entry.ranges:
                return True  # an earlier attempt of this commit landed
        if last != (entry.seq - 1 if entry.seq > 0 else None):
            raise LedgerError(
                f"pipeline {entry.pipeline!r}: Iceberg table {self.identifier} did not commit "
                f"batch {entry.seq} ({entry.ranges}): its ledger's newest entry is {last}, and "
                f"this run expected {entry.seq - 1}. Another writer is setting this pipeline's "
                f"{key(entry.pipeline, 'last')!r} property. Nothing of the batch was committed."
            )
        return False
