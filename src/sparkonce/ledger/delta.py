"""The ledger of a Delta Lake sink: in the table's own transaction log, plus entry files.

A Delta table has no rows of ours to hold a ledger in, and no multi-table
transactions, so the ledger lives in two places, each written by the rule that
keeps it exact:

**The progress version, in Delta's log.** Each pipeline has one Delta
application id, ``sparkonce:<pipeline>``. Every commit of the pipeline carries a
``txn`` action (Delta's ``SetTransaction``) for it, whose version packs two
numbers::

    version = epoch << 32 | entries        (entries: how many batches are committed)

``txn`` actions are kept in Delta's checkpoints: log retention never loses the
newest one (unless the table sets ``delta.setTransactionRetentionDuration``, which
the sink refuses). Delta's own rules then do the protocol's work, atomically with
the batch's rows:

* A batch commit is a Delta write (``append``, ``overwrite`` or ``MERGE``) with
  ``txnAppId``/``txnVersion`` = ``(epoch, seq + 1)``. Inside the write's Delta
  transaction, Delta reads the stored version and **skips** the write when it is
  greater than or equal to ours. Stored ``(epoch, seq)`` means this is the next batch
  of the owner: it commits. Anything else skips, and the sink then reads the stored
  version to say why (:meth:`DeltaLedgerStore.after_write`): the same ``(epoch,
  seq + 1)`` means an earlier attempt of this very commit went through (a retry), a
  newer epoch means the run was fenced (:class:`~sparkonce.errors.FencedError`, never
  a silent skip), anything else is a :class:`~sparkonce.errors.LedgerError`.
* Taking an epoch (``acquire``) is a Delta transaction of its own that reads the
  stored version (recording the read in the transaction, as ``txnVersion`` does) and
  commits ``(epoch + 1, entries)``. A batch commit or another acquire that commits the
  same application id meanwhile makes one of them fail with Delta's
  ``ConcurrentTransactionException``: two runs can never both take the same epoch, and
  an acquire never misses a batch that committed while it ran. A run's batch write
  that loses such a race also fails, and the sink reports it as fenced.
* The rows and the new version are in **one Delta commit**: readers see both or
  neither. The commit's ``userMetadata`` holds the ledger entry (JSON) and its
  ``operationMetrics`` the row count, for Delta's history.

**Entry files, under the table's directory.** The stored version says how many
batches committed, not their offsets. Each entry's content (ranges, epoch, Spark
batch id, checkpoint id) is written to ``_sparkonce/<pipeline>/entries/<seq>/<epoch>.json``
*before* the Delta write that commits it, and never changed after (a retry of the
same ``(epoch, seq)`` finds it and keeps it). Delta ignores directories whose name
starts with ``_`` (``VACUUM`` included), and commit files expire, these do not. Which
file of a ``seq`` is the committed one: the one with the **highest epoch**. Proof:
say epoch ``e`` committed ``seq``. A run with a higher epoch ``f`` took ``f``
either before that commit, and then ``e``'s write would have found ``f`` stored and
skipped, a contradiction; or after it, and then it read ``entries > seq`` and never
staged ``seq``. So no file of ``seq`` has an epoch above ``e``. Files of lower
epochs are from fenced or crashed attempts, never committed.

After the commit, ``<epoch>.rows`` beside the entry file records the row count (the
commit's ``numOutputRows``, or ``numSourceRows`` for a ``MERGE``) and, after a space,
the commit's seconds up to the end of the Delta write; written through a temporary
file and a rename, so a crash leaves it whole or absent. An entry without it (a crash
right after the commit) reads its count from the commit in Delta's history, or ``-1``
once that has expired, and its seconds from the entry file (up to step 4).

The owner's details (host, pid, source) go to ``_sparkonce/<pipeline>/owners/<epoch>.json``
before the acquire commits; the epoch itself is the stored version's.

**Taking an epoch by a write** (a Spark Connect session: no Delta transaction object to
register a read in). The acquire reads the log at version ``r``: stored ``(e, n)``. It
commits ``(e + 1, n)`` by a write of zero rows with ``txnAppId``/``txnVersion`` (Delta 4.4.0
commits it as a ``WRITE`` holding only the ``txn`` action), its ``userMetadata`` naming it an
acquire, with ``r`` and a nonce. Delta's writer starts its own transaction at some version
``w >= r``, so commits in ``(r, w]`` are not conflicts for it: the trap is an older epoch's
batch ``(e, n + 1)`` landing there, which the write of ``(e + 1, n)`` would move back (the
next run would commit batch ``n`` again). So, once its commit ``c`` is found in the log (by
the nonce; not found: Delta skipped it, and the acquire starts over), the acquire reads the
commits of the application id in ``(r, c)`` (the *gap*):

1. one with epoch ``>= e + 1``: another acquire took ``e + 1`` first; this one starts over
   and takes a later epoch, which fences that one;
2. else, if the highest count ``m`` in the gap exceeds ``n``, it commits ``(e + 1, m)``
   again (a *repair*), which Delta accepts since ``(e + 1, m) > (e + 1, n)``; if Delta
   skips it and the stored version is not ``(e + 1, m)``, a newer run moved it: start over.

Why this holds:

* **The gap holds only batches of epoch e and acquires of epoch e + 1.** Delta's writer
  skips a write whose version is at most the stored one; it saw the stored version at
  ``w``, and committed ours: no commit up to ``w`` stored ``(e + 1, k)`` with ``k >= n``,
  nor any later epoch. Commits in ``(w, c)`` of the application id would have failed our
  write (``ConcurrentTransactionException``: the writer registers its read of the id).
  Batches of epochs below ``e`` were skipped by Delta (``e`` was stored at ``r``).
* **Counts never go back.** Batch commits carry the true count (each is ``seq + 1`` on top
  of its own epoch's previous batch). The older run's batches after ``c`` are skipped
  (epoch ``e + 1`` is stored), so the true count at ``c`` is the highest count in the gap,
  or ``n`` with none: exactly ``m``, which the repair stores. Until the repair lands, and if
  the acquiring process dies before it, a reader sees ``(e + 1, n)``: so every read of the
  count (:meth:`DeltaLedgerStore._entries_of`, the classic acquire's too) looks at the
  commit that stored the version, and when it is an acquire by write, takes the highest
  count in its gap, ``(r, c)``. The next acquire thus starts from the true count.
* **No two runs hold the same epoch.** Two acquires that commit ``e + 1`` at ``c1 < c2``:
  the second read at ``r2 < c1`` (had it read at or after ``c1`` it would have seen ``e +
  1`` and aimed higher), so ``c1`` is in its gap and it starts over (rule 1), taking a
  later epoch. The first keeps ``e + 1`` and is fenced by that later epoch at its next
  commit.
* Batch commits are unchanged: a write of ``(epoch, seq + 1)`` that Delta skips is looked
  up and explained as above, so a zombie is still told it is fenced.

A limit: a count is read through the gap's commit files. If an acquire died between its
write and its repair, and the commits of its gap expired (Delta's log retention, 30 days by
default) before the next acquire, the count read is the acquire's ``n``; a gap whose files
are gone while the acquire's own commit is still there raises a
:class:`~sparkonce.errors.LedgerError` instead.

Everything here runs on the **driver** (or, on a Spark Connect session, in the user's
process and in the server's Python worker), through the adapters in
:mod:`sparkonce.spark.delta` (the session's JVM: Delta's ``DeltaLog`` and Hadoop's
``FileSystem``, so any filesystem Spark can write Delta tables on works) and
:mod:`sparkonce.spark.delta_log` (no JVM: the log read with pyarrow).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

from sparkonce.errors import ConfigError, FencedError, LedgerError
from sparkonce.ledger.base import BatchContext, LedgerEntry, LedgerStore, Owner, behind_end
from sparkonce.ledger.records import DELTA_ENTRY
from sparkonce.spark.delta import (
    DeltaTable,
    is_concurrent_transaction,
    is_retryable_conflict,
    stored_version,
)
from sparkonce.spark.delta_log import ConnectDeltaTable

#: The adapter under the store: through the JVM (a classic session) or without it.
AnyDeltaTable = DeltaTable | ConnectDeltaTable

log = logging.getLogger(__name__)

SEQ_BITS = 32
SEQ_MASK = (1 << SEQ_BITS) - 1
LEDGER_DIR = "_sparkonce"
ACQUIRE_ATTEMPTS = 10  # an acquire that loses a race on the application id starts over


def app_id(pipeline: str) -> str:
    """The Delta application id of ``pipeline``'s commits."""
    return f"sparkonce:{pipeline}"


def pack(epoch: int, entries: int) -> int:
    """The ``txn`` version of ``epoch`` after ``entries`` committed batches."""
    if not 0 <= entries <= SEQ_MASK:
        raise LedgerError(f"ledger entry count {entries} does not fit in {SEQ_BITS} bits")
    if not 0 <= epoch < 1 << (63 - SEQ_BITS):
        raise LedgerError(f"epoch {epoch} does not fit in a Delta txn version")
    return epoch << SEQ_BITS | entries


def unpack(version: int) -> tuple[int, int]:
    """``(epoch, entries)`` of a ``txn`` version."""
    return version >> SEQ_BITS, version & SEQ_MASK


@dataclass
class PipelineView:
    """What this run knows of one pipeline's ledger (refreshed by reads of the table)."""

    epoch: int = 0  # the owner's epoch (0: never acquired)
    entries: int = 0  # committed batches
    last: LedgerEntry | None = None


@dataclass
class DeltaTxn:
    """One batch commit in the making: the steps record into it, the exit writes it."""

    pipeline: str = ""
    entry: LedgerEntry | None = None
    # The sink's write: a callable(app, version, metadata) returning what DeltaTable.append
    # returns, or None when it wrote through Spark's writer or MERGE (looked up afterwards).
    publish: Any = None
    staged: Any = None  # the stager's Staged: its row count is set from the commit's metrics
    rows: int = 0
    notes: dict[str, Any] = field(default_factory=dict)


class DeltaLedgerStore(LedgerStore):
    """Owner epochs and the batch ledger of one Delta table (see the module docstring).

    ``transaction()`` yields a :class:`DeltaTxn`; the committer's steps fill it and
    the block's exit runs the Delta write that commits the batch's rows, the ``txn``
    version and the entry together. Steps 1 and 2 inside the block read this run's
    view, which only this run changes while it owns the pipeline: Delta's write
    checks both again, atomically, against the table (see the module docstring).
    """

    def __init__(self, table: Any, describe: str, *, inspect_hint: str = "") -> None:
        # ``table`` is a callable returning the DeltaTable (the session may come later).
        self._table_of = table
        self._describe = describe
        self.inspect_hint = inspect_hint
        self._views: dict[str, PipelineView] = {}

    @property
    def table(self) -> AnyDeltaTable:
        t: AnyDeltaTable = self._table_of()
        return t

    def describe(self) -> str:
        return self._describe

    def _dir(self, pipeline: str, *parts: str) -> str:
        return "/".join([self.table.path.rstrip("/"), LEDGER_DIR, pipeline, *parts])

    def _hint(self, pipeline: str) -> str:
        return self.inspect_hint.replace("{pipeline}", pipeline)

    # -- reading -----------------------------------------------------------------------
    def read_view(self, pipeline: str) -> PipelineView:
        """Read the pipeline's stored version and its newest entry from the table."""
        t = self.table
        if not t.exists():
            view = PipelineView()
        else:
            at, stored = t.read_txn(app_id(pipeline))
            if stored is None:
                view = PipelineView()
            else:
                epoch = unpack(stored)[0]
                entries = self._entries_of(pipeline, stored, at)
                last = self._entry(pipeline, entries - 1) if entries else None
                view = PipelineView(epoch, entries, last)
        self._views[pipeline] = view
        return view

    def _view(self, pipeline: str) -> PipelineView:
        view = self._views.get(pipeline)
        return view if view is not None else self.read_view(pipeline)

    def _entry(self, pipeline: str, seq: int) -> LedgerEntry:
        """The committed entry ``seq``: the file of the highest epoch (module docstring)."""
        t = self.table
        names = t.list_names(self._dir(pipeline, "entries", str(seq)))
        epochs = sorted(
            (int(n[: -len(".json")]) for n in names if n.endswith(".json") and n[:-5].isdigit()),
            reverse=True,
        )
        if not epochs:
            raise LedgerError(
                f"pipeline {pipeline!r}: Delta table {t.path} says batch {seq} is committed, "
                f"but its ledger entry file is missing from {self._dir(pipeline, 'entries')}. "
                f"The table's {LEDGER_DIR} directory was changed by hand; restore it from a "
                "backup of the table directory, or start the pipeline under a new name."
            )
        epoch = epochs[0]
        base = self._dir(pipeline, "entries", str(seq), str(epoch))
        text = t.read_text(base + ".json")
        assert text is not None
        data = json.loads(text)
        fields = (t.read_text(base + ".rows") or "").split()
        if fields and fields[0].lstrip("-").isdigit():
            rows = int(fields[0])
        else:
            rows = self._rows_from_history(pipeline, epoch, seq)
        entry = DELTA_ENTRY.decode(pipeline, data, where=base + ".json", rows=rows)
        if len(fields) > 1:
            with contextlib.suppress(ValueError):  # else the entry file's seconds stay
                entry = replace(entry, commit_seconds=float(fields[1]))
        return entry

    def _rows_from_history(self, pipeline: str, epoch: int, seq: int) -> int:
        """The row count of the commit of ``(epoch, seq)``, read from Delta's history
        (newest first); -1 once that commit's file has expired."""
        t = self.table
        want = pack(epoch, seq + 1)
        app = app_id(pipeline)
        v = t.version()
        while v >= 0:
            actions = t.commit_actions(v)
            if actions is None:
                break
            for a in actions:
                txn = a.get("txn")
                if txn and txn.get("appId") == app:
                    if int(txn["version"]) == want:
                        return _rows_of(actions)
                    if int(txn["version"]) < want:
                        return -1
            v -= 1
        return -1

    def owner(self, pipeline: str) -> Owner | None:
        view = self.read_view(pipeline)
        if view.epoch == 0:
            return None
        text = self.table.read_text(self._dir(pipeline, "owners", f"{view.epoch}.json"))
        data = json.loads(text) if text else {}
        at = data.get("at")
        return Owner(
            pipeline,
            view.epoch,
            datetime.fromisoformat(at) if at else datetime.fromtimestamp(0, UTC),
            str(data.get("holder", "unknown")),
            data.get("source"),
        )

    def entries(self, pipeline: str) -> list[LedgerEntry]:
        view = self.read_view(pipeline)
        return [self._entry(pipeline, s) for s in range(view.entries)]

    def last(self, pipeline: str) -> LedgerEntry | None:
        return self._view(pipeline).last

    def pipelines(self) -> list[str]:
        t = self.table
        base = "/".join([t.path.rstrip("/"), LEDGER_DIR])
        return sorted(p for p in t.list_names(base) if t.txn_version(app_id(p)) is not None)

    # -- owner epochs ----------------------------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take ``epoch + 1`` in one Delta transaction that reads the stored version (or,
        without one, by a write and a look at the log: :meth:`_acquire_by_write`)."""
        if not self.table.transactions:
            return self._acquire_by_write(pipeline, source)
        t = cast(DeltaTable, self.table)
        app = app_id(pipeline)
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        for attempt in range(1, ACQUIRE_ATTEMPTS + 1):
            txn = t.start_transaction()
            # What txn.txnVersion(app) does, without building the table's whole state (a
            # Spark job: 9 s of a 5-batch run's 29 s here): register the read, so that a
            # concurrent commit of ``app`` fails this one, and take the stored version
            # from the snapshot's checksum (stored_version).
            txn.readTxn().addOne(app)
            snapshot = txn.snapshot()
            stored = stored_version(snapshot, app)
            epoch, entries = unpack(stored) if stored is not None else (0, 0)
            if stored is not None:
                entries = self._entries_of(pipeline, stored, int(snapshot.version()))
            new = epoch + 1
            now = datetime.now(UTC)
            self._write_owner(pipeline, new, holder, source, now)
            meta = json.dumps({"sparkonce": "acquire", "pipeline": pipeline, "epoch": new})
            try:
                t._commit_set_transaction(txn, app, pack(new, entries), meta)
            except Exception as exc:
                if is_concurrent_transaction(exc) and attempt < ACQUIRE_ATTEMPTS:
                    log.info(
                        "pipeline %r: another commit took %s first; acquiring again", pipeline, app
                    )
                    continue
                raise
            last = self._entry(pipeline, entries - 1) if entries else None
            self._views[pipeline] = PipelineView(new, entries, last)
            return Owner(pipeline, new, now, holder, source)
        raise AssertionError("unreachable")  # pragma: no cover

    def _write_owner(
        self, pipeline: str, epoch: int, holder: str, source: str | None, now: datetime
    ) -> None:
        """The owner's details, written before the acquire commits ``epoch``."""
        self.table.write_text(
            self._dir(pipeline, "owners", f"{epoch}.json"),
            json.dumps({"epoch": epoch, "holder": holder, "source": source, "at": now.isoformat()}),
            overwrite=True,
        )

    def _acquire_by_write(self, pipeline: str, source: str | None) -> Owner:
        """Take ``epoch + 1`` without a Delta transaction object (a Spark Connect session):
        a write of ``(epoch + 1, entries)``, then a look at the commits between the read
        and that write, and a second write if an older epoch's batch committed there. The
        module docstring ("Taking an epoch by a write") has the reasoning."""
        t = cast(ConnectDeltaTable, self.table)
        app = app_id(pipeline)
        holder = f"{socket.gethostname()} pid {os.getpid()}"
        for _ in range(ACQUIRE_ATTEMPTS):
            read, stored = t.read_txn(app)
            epoch, entries = (0, 0) if stored is None else unpack(stored)
            if stored is not None:
                entries = self._entries_of(pipeline, stored, read)
            new = epoch + 1
            now = datetime.now(UTC)
            self._write_owner(pipeline, new, holder, source, now)
            nonce = uuid.uuid4().hex
            meta = {"sparkonce": "acquire", "pipeline": pipeline, "epoch": new, "read": read}
            at = self._commit_epoch(pipeline, pack(new, entries), {**meta, "nonce": nonce}, read)
            if at is None:
                continue  # Delta skipped it (a newer epoch is stored) or lost a race: again
            gap = [unpack(v) for v in self._txns_between(pipeline, read, at)]
            if any(e >= new for e, _ in gap):
                # Another run committed this same epoch first (it read before an older
                # batch that this run saw): this run takes a later epoch, fencing it.
                log.info("pipeline %r: another run took epoch %d too; again", pipeline, new)
                continue
            counted = max([entries, *(n for _, n in gap)])
            if counted > entries:
                log.info(
                    "pipeline %r: a batch of epoch %d committed while epoch %d was taken; "
                    "storing %d batches instead of %d",
                    pipeline,
                    epoch,
                    new,
                    counted,
                    entries,
                )
                nonce = uuid.uuid4().hex
                fixed = pack(new, counted)
                meta = {"sparkonce": "acquire", "pipeline": pipeline, "epoch": new}
                done = self._commit_epoch(pipeline, fixed, {**meta, "nonce": nonce}, at)
                if done is None and t.txn_version(app) != fixed:
                    continue  # a newer run moved the version meanwhile: start over
                entries = counted
            last = self._entry(pipeline, entries - 1) if entries else None
            self._views[pipeline] = PipelineView(new, entries, last)
            return Owner(pipeline, new, now, holder, source)
        raise LedgerError(
            f"pipeline {pipeline!r}: could not take an epoch of Delta table {t.path} in "
            f"{ACQUIRE_ATTEMPTS} attempts: other runs of the pipeline kept taking epochs at the "
            "same time. Stop the other runs of this pipeline, then start one."
        )

    def _commit_epoch(
        self, pipeline: str, version: int, meta: dict[str, Any], after: int
    ) -> int | None:
        """Commit only ``txn(app, version)``; the commit's log version, or None when Delta
        skipped it or it lost a race on the application id (nothing committed)."""
        t = cast(ConnectDeltaTable, self.table)
        app = app_id(pipeline)
        try:
            t.commit_txn(app, version, json.dumps(meta))
        except Exception as exc:
            if is_concurrent_transaction(exc):
                log.info("pipeline %r: another commit took %s first", pipeline, app)
                return None
            raise
        for v in range(after + 1, t.version() + 1):
            actions = t.commit_actions(v)
            if (
                actions is not None
                and _txn_of(actions, app) == version
                and _metadata_of(actions).get("nonce") == meta["nonce"]
            ):
                return v
        return None

    def _txns_between(self, pipeline: str, low: int, high: int) -> list[int]:
        """The ``txn`` versions of ``pipeline`` committed after log version ``low`` and
        before ``high``."""
        t = self.table
        app = app_id(pipeline)
        found = []
        for v in range(low + 1, high):
            actions = t.commit_actions(v)
            if actions is None:
                raise LedgerError(
                    f"pipeline {pipeline!r}: commit {v} of Delta table {t.path} is gone from "
                    "its log, and the epoch commit after it needs it to count the batches "
                    "committed meanwhile. Restore the table's _delta_log from a backup, or "
                    "start the pipeline under a new name."
                )
            value = _txn_of(actions, app)
            if value is not None:
                found.append(value)
        return found

    def _entries_of(self, pipeline: str, stored: int, at: int) -> int:
        """The committed batches when ``stored`` is the stored version at log version
        ``at``: its count, unless an epoch commit by write stored it, and a batch of an
        older epoch committed between that commit's read and itself (module docstring,
        "Taking an epoch by a write"): then that batch's count."""
        t = self.table
        app = app_id(pipeline)
        entries = unpack(stored)[1]
        v = at
        while v >= 0:
            actions = t.commit_actions(v)
            if actions is None:
                return entries  # that commit expired (a limit: module docstring)
            value = _txn_of(actions, app)
            if value is not None and value <= stored:
                meta = _metadata_of(actions)
                if value == stored and meta.get("sparkonce") == "acquire" and "read" in meta:
                    gap = self._txns_between(pipeline, int(meta["read"]), v)
                    entries = max([entries, *(unpack(g)[1] for g in gap)])
                return entries
            v -= 1
        return entries

    # -- the committer's steps -----------------------------------------------------------
    @contextmanager
    def transaction(self) -> Iterator[DeltaTxn]:
        txn = DeltaTxn()
        yield txn
        # Leaving the block without an error: the Delta write commits everything (step 5).
        if txn.entry is None:
            return  # a replay or an empty no-data batch: nothing to commit
        self._write(txn)

    def check_owner(self, txn: Any, pipeline: str, epoch: int) -> None:
        if txn is None:
            view = self.read_view(pipeline)  # the early look and after a failed stage: read
        else:
            view = self._view(pipeline)
            txn.pipeline = pipeline
        if view.epoch != epoch:
            self._fenced(pipeline, epoch, view.epoch)

    def _fenced(self, pipeline: str, epoch: int, current: int) -> None:
        owner = self.owner(pipeline) if current else None
        raise FencedError(
            pipeline, epoch, current, self._hint(pipeline), owner.holder if owner else ""
        )

    def last_in(self, txn: Any, pipeline: str) -> LedgerEntry | None:
        return self._view(pipeline).last

    def find(self, txn: Any | None, pipeline: str, ctx: BatchContext) -> LedgerEntry | None:
        """The committed entry of exactly ``ctx``'s batch: newest first, through the entry
        files (a replay of an older batch, after a checkpoint behind the ledger).

        The walk stops where no older entry can match: for a batch with offsets, at an
        entry that ends before the batch starts; for a no-data batch (asked for every new
        one, which sits at the ledger's end), at the first entry behind its position
        (:func:`~sparkonce.ledger.base.behind_end`): the newest data batch, or the entry
        before it. Without that stop, every new no-data batch read every entry file.
        """
        view = self._view(pipeline)
        at = ctx.ranges.ends()
        for seq in range(view.entries - 1, -1, -1):
            e = self._entry(pipeline, seq)
            if e.ranges == ctx.ranges and (
                not ctx.ranges.empty
                or (e.checkpoint_id == ctx.checkpoint_id and e.spark_batch_id == ctx.spark_batch_id)
            ):
                return e
            if ctx.ranges.empty and behind_end(e, at):
                return None  # entries this old end before the no-data batch's position
            starts = ctx.ranges.starts()
            if not ctx.ranges.empty and all(
                e.ranges.ends().get(tp, 0) <= start for tp, start in starts.items()
            ):
                return None  # entries this old end before the batch starts
        return None

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        """Step 4: the entry file, written before the Delta write that commits it."""
        self.table.write_text(
            self._dir(entry.pipeline, "entries", str(entry.seq), f"{entry.epoch}.json"),
            json.dumps(DELTA_ENTRY.encode(entry)),
            overwrite=False,
        )
        txn.entry = entry
        txn.notes["recorded"] = time.monotonic()

    # -- the write --------------------------------------------------------------------
    def _write(self, txn: DeltaTxn) -> None:
        entry = txn.entry
        assert entry is not None and txn.publish is not None
        t = self.table
        app = app_id(entry.pipeline)
        version = pack(entry.epoch, entry.seq + 1)
        before = t.version()
        metadata = json.dumps({"sparkonce": "batch", **DELTA_ENTRY.encode(entry)})
        try:
            outcome = txn.publish(app, version, metadata)
        except Exception as exc:
            if is_concurrent_transaction(exc):
                # Another commit of this pipeline's application id won the race: a newer run
                # took the pipeline (or, if not, the ledger says what happened below).
                self._explain_skip(entry, version, exc)
            raise
        if entry.commit_seconds is not None and "recorded" in txn.notes:
            # The rows were written just now (step 5): count that write in the seconds.
            written = entry.commit_seconds + time.monotonic() - txn.notes["recorded"]
            entry = replace(entry, commit_seconds=round(written, 6))
        if outcome is None:
            rows = self.after_write(entry, version, before)
        else:
            committed, at = outcome
            if committed:
                actions = t.commit_actions(at)
                rows = self._committed(entry, -1 if actions is None else _rows_of(actions))
            else:
                self._explain_skip(entry, version, None)  # raises unless it was ours
                rows = self._committed(
                    entry, self._rows_from_history(entry.pipeline, entry.epoch, entry.seq)
                )
        txn.rows = rows
        if txn.staged is not None and rows >= 0:
            txn.staged.rows = rows

    def after_write(self, entry: LedgerEntry, version: int, before: int) -> int:
        """Did the write commit? Returns its row count, or raises why it was skipped."""
        t = self.table
        app = app_id(entry.pipeline)
        after = t.version()
        for v in range(after, before, -1):
            actions = t.commit_actions(v)
            if actions is None:
                break
            for a in actions:
                txn = a.get("txn")
                if txn and txn.get("appId") == app and int(txn["version"]) == version:
                    return self._committed(entry, _rows_of(actions))
        self._explain_skip(entry, version, None)
        # The same (epoch, seq) was stored already: an earlier attempt of this commit.
        return self._committed(
            entry, self._rows_from_history(entry.pipeline, entry.epoch, entry.seq)
        )

    def _explain_skip(self, entry: LedgerEntry, version: int, exc: BaseException | None) -> None:
        """Raise why Delta did not commit ``version``, unless it was committed before."""
        stored = self.table.txn_version(app_id(entry.pipeline))
        if stored == version:
            return
        epoch, entries = unpack(stored) if stored is not None else (0, 0)
        if epoch != entry.epoch:
            self._views.pop(entry.pipeline, None)
            self._fenced(entry.pipeline, entry.epoch, epoch)
        raise LedgerError(
            f"pipeline {entry.pipeline!r}: Delta table {self.table.path} did not commit batch "
            f"{entry.seq} ({entry.ranges}): the table's ledger says epoch {epoch} with "
            f"{entries} batches, and this run expected {entry.seq} batches before it. Another "
            "writer is using this pipeline's application id "
            f"{app_id(entry.pipeline)!r}. Nothing of the batch was committed."
        ) from exc

    def _committed(self, entry: LedgerEntry, rows: int) -> int:
        t = self.table
        base = self._dir(entry.pipeline, "entries", str(entry.seq), str(entry.epoch))
        if rows >= 0:
            text = str(rows)
            if entry.commit_seconds is not None:
                text += f" {entry.commit_seconds}"
            try:
                t.write_text(base + ".rows", text, overwrite=False)
            except Exception as exc:  # only the count is lost: history still has it
                log.warning(
                    "pipeline %r: could not record batch %d's row count: %s",
                    entry.pipeline,
                    entry.seq,
                    exc,
                )
        committed = replace(entry, row_count=rows)
        self._views[entry.pipeline] = PipelineView(entry.epoch, entry.seq + 1, committed)
        return rows

    def is_connection_error(self, exc: BaseException) -> bool:
        """Delta's write conflicts other than on our application id: nothing of the write
        was committed, so the committer runs it again (its retry policy)."""
        return is_retryable_conflict(exc)

    # -- tests and verification ------------------------------------------------------------
    def forget(self) -> None:
        """Drop this run's views (the next read goes to the table)."""
        self._views.clear()


def _txn_of(actions: list[dict[str, Any]], app: str) -> int | None:
    """The ``txn`` version of ``app`` in a commit's actions (None: the commit has none)."""
    for a in actions:
        txn = a.get("txn")
        if txn and txn.get("appId") == app:
            return int(txn["version"])
    return None


def _metadata_of(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """A commit's ``userMetadata``, as sparkonce wrote it (JSON), or {}."""
    for a in actions:
        info = a.get("commitInfo")
        if info and info.get("userMetadata"):
            with contextlib.suppress(ValueError):
                data = json.loads(info["userMetadata"])
                return data if isinstance(data, dict) else {}
    return {}


def _rows_of(actions: list[dict[str, Any]]) -> int:
    for a in actions:
        info = a.get("commitInfo")
        if info:
            metrics = info.get("operationMetrics") or {}
            op = str(info.get("operation", ""))
            key = "numSourceRows" if op == "MERGE" else "numOutputRows"
            if key in metrics:
                return int(metrics[key])
            return 0
    return -1


def check_table_properties(table: AnyDeltaTable) -> None:
    """Refuse a table whose ``txn`` actions expire (the ledger's progress would vanish)."""
    value = table.property("delta.setTransactionRetentionDuration")
    if value:
        raise ConfigError(
            f"Delta table {table.path} sets delta.setTransactionRetentionDuration = {value!r}: "
            "Delta would drop the pipeline's progress version once it is older than that, and a "
            "restart would then read from the start again. Unset it (ALTER TABLE ... UNSET "
            "TBLPROPERTIES ('delta.setTransactionRetentionDuration')) to use DeltaSink."
        )
