"""Live readers: what a reader of each store sees *while* a verify trial runs.

The final-state check (:mod:`.checks`) compares a trial's output with the oracle once
the pipeline has finished. A sink can end right and still, during the run, show a row
of an attempt that is later rolled back, half a batch, a row twice for a moment, or a
row that disappears. A live reader polls each store at a steady rate
(:data:`DEFAULT_INTERVAL_S`) during the whole trial, every driver run and restart
included, and checks every observation.

The reader is a thread of the campaign process with connections of its own. The
pipeline runs in separate driver processes (:mod:`.driver`), so the reader shares
no state with it: it sees only what any reader of the store sees.

**Observations.** One observation of a store is its outputs' rows and its ledger:

* SQLite and PostgreSQL (the two-phase sink's view included): one read-only
  transaction on the reader's own connection reads every output of the store and
  the ledger (PostgreSQL ``REPEATABLE READ READ ONLY``; SQLite a deferred
  transaction on a WAL database), so rows and ledger are one instant of committed
  data. Each ``SELECT`` sees exactly what a read-committed ``SELECT`` at that instant
  sees: committed rows only.
* Kafka (:class:`~sparkonce.sinks.kafka.KafkaSink`): the ledger, then every output
  partition from its low watermark through a ``read_committed`` consumer, then the
  ledger again. It is not a snapshot: partitions are read one after another.
* Delta: a snapshot of the table's ``_delta_log`` (JSON commits read directly, the
  data files with pyarrow; no Spark), at its newest version: the rows of that version
  and the ledger it holds: Delta's ``txn`` version for ``sparkonce:<pipeline>`` counts the
  committed batches (a commit that raises the count is that batch's, with its row count
  in the commit's metrics), and each batch's offsets come from its entry file (see
  :mod:`sparkonce.ledger.delta`). Local tables only.

**The checks** (rows compared as in :mod:`.compare`, declared non-deterministic
columns left out; an output with upsert keys is *keyed*, matched by its keys):

``aborted-read``
    A visible row that no failure-free run shows: a row (keyed: a key) not among the
    oracle's rows of that output. A ``complete``-mode output without keys shows
    intermediate results, which are not the oracle's: it is not checked here.
``duplicate``
    A row visible more times than the oracle holds it (keyed: a key visible twice).
    Not checked for a ``complete``-mode output without keys.
``torn-batch``
    The observation is not a union of whole committed batches:

    (a) count: for a store with one output, in append mode without keys, the rows
        visible equal the sum of the ledger entries' row counts (``complete`` mode: the
        last entry's); no ledger entry, no row. A reader that reads the ledger before
        and after the rows (not a snapshot) checks this exactly when the two reads
        agree, and otherwise that the rows visible lie between the two sums. Not checked for
        keyed outputs (except: no entry, no row), or a ledger that lost old entries.
    (b) a function of the ledger: two observations with the same committed batches
        (entries' seq and offset ranges) show the same rows in every output. So an
        upsert's value changes only when a batch commits.

    ``KafkaSink`` commits each task's records (with its marker) in the task's own
    transaction before the driver's ledger entry: batch atomicity is per output partition,
    as its docstring states. For it, (a) is a lower bound only (the rows of every batch
    the ledger held before the read are all visible) and (b) is not checked; a task's
    records are not matched against its marker.
``non-monotonic``
    A row once seen disappears: a row visible fewer times than in the previous
    observation (keyed: a key no longer visible), or the ledger loses an entry. A
    ``complete``-mode output replaces its content on every batch (documented): its rows
    are exempt, its ledger is not.

A store reset by the campaign between two runs of a trial (a kill moved earlier)
starts the checks afresh (:meth:`LiveReader.paused`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkonce.ledger.base import LedgerEntry
from sparkonce.verify.compare import CanonicalRow, canonical_row

DEFAULT_INTERVAL_S = 0.25
EXAMPLES = 3  # examples kept per kind of anomaly
ANOMALY_KINDS = ("aborted-read", "duplicate", "torn-batch", "non-monotonic")


@dataclass(frozen=True)
class OutputSpec:
    """One output as the live checks see it."""

    name: str
    oracle: Sequence[Mapping[str, Any]]
    keys: tuple[str, ...] = ()  # the sink's upsert keys: matched by key
    complete: bool = False  # output mode complete: each batch replaces the content
    nondeterministic: tuple[str, ...] = ()


@dataclass
class Observation:
    """One read of a store: each output's rows and its ledger.

    ``ledger_after`` is None for a snapshot (rows and ledger at one instant); else the
    ledger read again after the rows (``ledger`` was read before them).
    """

    rows: dict[str, list[dict[str, Any]]]
    ledger: list[LedgerEntry]
    ledger_after: list[LedgerEntry] | None = None


def _ledger_key(entries: Sequence[LedgerEntry]) -> tuple[tuple[int, str], ...]:
    return tuple((e.seq, e.ranges.to_json()) for e in entries)


@dataclass
class _OutputState:
    spec: OutputSpec
    oracle_rows: Counter[CanonicalRow] = field(default_factory=Counter)
    oracle_keys: set[CanonicalRow] = field(default_factory=set)
    previous: Counter[CanonicalRow] | None = None

    def canon(self, row: Mapping[str, Any]) -> CanonicalRow:
        drop = self.spec.nondeterministic
        return canonical_row({k: v for k, v in row.items() if k not in drop})

    def key(self, row: CanonicalRow) -> CanonicalRow:
        return tuple(c for c in row if c[0] in self.spec.keys)


class LiveCheck:
    """The live checks of one store (see the module docstring). Pure: no I/O."""

    def __init__(self, outputs: Sequence[OutputSpec], *, tasks_commit: bool = False) -> None:
        """``tasks_commit``: the sink's tasks commit their rows before the batch's ledger
        entry, as documented (``KafkaSink``: per output partition), so only batches the
        ledger holds must be whole (see ``torn-batch`` in the module docstring)."""
        self.tasks_commit = tasks_commit
        self.outputs = {o.name: _OutputState(o) for o in outputs}
        for state in self.outputs.values():
            state.oracle_rows = Counter(state.canon(r) for r in state.spec.oracle)
            state.oracle_keys = {state.key(r) for r in state.oracle_rows}
        self.observations = 0
        self.anomalies: Counter[str] = Counter()
        self.examples: dict[str, list[str]] = {}
        self.forget()

    def forget(self) -> None:
        """Start afresh: the store was reset (its outputs and ledger dropped)."""
        for state in self.outputs.values():
            state.previous = None
        self._ledger: tuple[tuple[int, str], ...] | None = None
        self._by_ledger: dict[tuple[tuple[int, str], ...], str] = {}

    def _found(self, kind: str, detail: str) -> None:
        self.anomalies[kind] += 1
        shown = self.examples.setdefault(kind, [])
        if len(shown) < EXAMPLES:
            shown.append(f"observation {self.observations}: {detail}")

    def observe(self, obs: Observation) -> int:
        """Check one observation; returns how many anomalies it showed."""
        self.observations += 1
        before = sum(self.anomalies.values())
        visible = {
            name: Counter(state.canon(r) for r in obs.rows.get(name, []))
            for name, state in self.outputs.items()
        }
        settled = obs.ledger_after is None or _ledger_key(obs.ledger) == _ledger_key(
            obs.ledger_after
        )
        last = obs.ledger if obs.ledger_after is None else obs.ledger_after
        self._check_ledger(obs.ledger, last)
        for name, state in self.outputs.items():
            self._check_output(name, state, visible[name])
        self._check_count(obs, visible, settled)
        if settled and not self.tasks_commit:
            key = _ledger_key(last)
            digest = _digest(visible)
            seen = self._by_ledger.setdefault(key, digest)
            if seen != digest:
                self._found(
                    "torn-batch",
                    f"the same {len(key)} committed batches showed other rows than before "
                    f"({_sizes(visible)})",
                )
        return sum(self.anomalies.values()) - before

    def _check_ledger(self, first: list[LedgerEntry], last: list[LedgerEntry]) -> None:
        """The ledger only grows: the entries seen before are a prefix of those seen now."""
        now, before = _ledger_key(first), self._ledger
        if before is not None and now[: len(before)] != before:
            self._found(
                "non-monotonic",
                f"the ledger went from {len(before)} entries to {len(now)}, or changed an entry",
            )
        self._ledger = _ledger_key(last)

    def _check_output(self, name: str, state: _OutputState, now: Counter[CanonicalRow]) -> None:
        spec = state.spec
        checks_rows = bool(spec.keys) or not spec.complete
        if checks_rows:
            if spec.keys:
                keys = Counter(state.key(r) for r in now.elements())
                for k, n in keys.items():
                    if k not in state.oracle_keys:
                        self._found("aborted-read", f"{name}: key {dict(k)} is not the oracle's")
                    elif n > 1:
                        self._found("duplicate", f"{name}: key {dict(k)} visible {n} times")
            else:
                for row, n in now.items():
                    want = state.oracle_rows.get(row, 0)
                    if want == 0:
                        self._found("aborted-read", f"{name}: row {dict(row)} is not the oracle's")
                    elif n > want:
                        self._found(
                            "duplicate",
                            f"{name}: row {dict(row)} visible {n} times, the oracle has {want}",
                        )
        if state.previous is not None and not spec.complete:
            if spec.keys:
                gone_keys = {state.key(r) for r in state.previous} - {state.key(r) for r in now}
                for k in list(gone_keys)[:EXAMPLES]:
                    self._found("non-monotonic", f"{name}: key {dict(k)} disappeared")
                if len(gone_keys) > EXAMPLES:
                    self.anomalies["non-monotonic"] += len(gone_keys) - EXAMPLES
            else:
                gone = state.previous - now
                for row, n in list(gone.items())[:EXAMPLES]:
                    self._found("non-monotonic", f"{name}: {n} x row {dict(row)} disappeared")
                if len(gone) > EXAMPLES:
                    self.anomalies["non-monotonic"] += len(gone) - EXAMPLES
        state.previous = now

    def _check_count(
        self, obs: Observation, visible: Mapping[str, Counter[CanonicalRow]], settled: bool
    ) -> None:
        if len(self.outputs) != 1:
            return
        (state,) = self.outputs.values()
        shown = sum(next(iter(visible.values())).values())
        if self.tasks_commit:
            self._check_lower_bound(obs, state, shown)
            return
        if not obs.ledger and (obs.ledger_after is None or not obs.ledger_after):
            if shown:
                self._found("torn-batch", f"{shown} rows visible and no ledger entry")
            return
        if state.spec.keys:
            return
        ledgers = [obs.ledger] if obs.ledger_after is None else [obs.ledger, obs.ledger_after]
        if any(e.row_count < 0 for lg in ledgers for e in lg) or any(
            lg and lg[0].seq != 0 for lg in ledgers
        ):
            return  # an entry without its count, or old entries pruned
        if state.spec.complete:  # an unsettled read (Kafka) is not bounded here
            last = ledgers[-1][-1].row_count if ledgers[-1] else 0
            if settled and shown != last:
                self._found("torn-batch", f"{shown} rows visible, the last batch committed {last}")
            return
        low = sum(e.row_count for e in obs.ledger)
        high = sum(e.row_count for e in ledgers[-1])
        if settled and shown != low:
            self._found(
                "torn-batch",
                f"{shown} rows visible, the {len(obs.ledger)} committed batches hold {low}",
            )
        elif not settled and not low <= shown <= high:
            self._found(
                "torn-batch",
                f"{shown} rows visible, outside the {low} to {high} rows committed while "
                "the reader read",
            )

    def _check_lower_bound(self, obs: Observation, state: _OutputState, shown: int) -> None:
        """Tasks commit ahead of the ledger: every batch the ledger held before the read
        is whole, so at least its rows are visible (append outputs, counts known)."""
        if state.spec.keys or state.spec.complete or any(e.row_count < 0 for e in obs.ledger):
            return
        if obs.ledger and obs.ledger[0].seq != 0:
            return
        low = sum(e.row_count for e in obs.ledger)
        if shown < low:
            self._found(
                "torn-batch",
                f"{shown} rows visible, fewer than the {len(obs.ledger)} committed batches' {low}",
            )

    def report(self) -> dict[str, Any]:
        return {
            "observations": self.observations,
            "anomalies": {k: self.anomalies.get(k, 0) for k in ANOMALY_KINDS},
            "examples": {k: v for k, v in self.examples.items() if v},
        }


def _digest(visible: Mapping[str, Counter[CanonicalRow]]) -> str:
    h = hashlib.sha256()
    for name in sorted(visible):
        h.update(name.encode())
        for row, n in sorted(visible[name].items(), key=repr):
            h.update(repr((row, n)).encode())
    return h.hexdigest()


def _sizes(visible: Mapping[str, Counter[CanonicalRow]]) -> str:
    return ", ".join(f"{n}: {sum(c.values())} rows" for n, c in visible.items())


# -- readers: one observation of a store ----------------------------------------------------


class StoreReader(ABC):
    """Reads one observation of a store, on connections of its own."""

    kind = "store"

    @abstractmethod
    def read(self) -> Observation:
        """One observation: the outputs' rows, between (or with) reads of the ledger."""

    def close(self) -> None:  # noqa: B027
        """Close the reader's connections (the default: it keeps none open)."""


class SqlReader(StoreReader):
    """SQLite or PostgreSQL: one read-only transaction over every output and the ledger."""

    def __init__(self, sinks: Mapping[str, Any], pipeline: str) -> None:
        from sparkonce.ledger.sql import SqlLedger

        first = next(iter(sinks.values()))
        self.sinks = dict(sinks)
        self.pipeline = pipeline
        self.url = first.url
        self.dialect = first.dialect
        self.kind = f"{self.dialect.name} snapshot"
        self.ledger = SqlLedger(self.dialect)
        self._conn: Any = None

    def _connect(self) -> Any:
        from sparkonce.db import connect

        if self._conn is None:
            self._conn = connect(self.url)
        return self._conn

    def _exists(self, conn: Any, relation: str) -> bool:
        from sparkonce.db import qi

        if self.dialect.name == "sqlite":
            q = "SELECT 1 FROM sqlite_master WHERE name = ? AND type IN ('table', 'view')"
            return conn.execute(q, (relation,)).fetchone() is not None
        return conn.execute("SELECT to_regclass(%s)", (qi(relation),)).fetchone()[0] is not None

    def read(self) -> Observation:
        from sparkonce.db import table_rows
        from sparkonce.ledger.sql import LEDGER_TABLE

        conn = self._connect()
        if self.dialect.name == "sqlite":
            conn.execute("BEGIN")
        else:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            rows: dict[str, list[dict[str, Any]]] = {}
            for name, sink in self.sinks.items():
                rows[name] = []
                if self._exists(conn, sink.table):
                    rows[name] = table_rows(conn, sink.table)
            entries = (
                self.ledger.entries(conn, self.pipeline) if self._exists(conn, LEDGER_TABLE) else []
            )
        finally:
            try:
                conn.execute("COMMIT")
            except Exception:
                self.close()
        return Observation(rows, entries)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None


class KafkaLiveReader(StoreReader):
    """A Kafka sink's output topic through ``read_committed``, between two ledger reads."""

    kind = "kafka read_committed"

    def __init__(self, name: str, fresh: Callable[[], Any], pipeline: str) -> None:
        """``fresh()``: a new copy of the sink, with connections of its own (the reader
        takes a new one after a reset, so no cached ledger outlives the records)."""
        self.name = name
        self.fresh = fresh
        self._sink: Any = None
        self.pipeline = pipeline

    @property
    def sink(self) -> Any:
        if self._sink is None:
            self._sink = self.fresh()
        return self._sink

    def read(self) -> Observation:
        from sparkonce.sinks.inspect import inspector_for

        before = self.sink.ledger(self.pipeline)
        out = inspector_for(self.sink).rows()
        after = self.sink.ledger(self.pipeline)
        return Observation({self.name: out}, before, after)

    def close(self) -> None:
        if self._sink is not None:
            with contextlib.suppress(Exception):
                self._sink.close()
            self._sink = None


class DeltaLogReader(StoreReader):
    """A local Delta table's newest snapshot, from ``_delta_log`` and pyarrow (no Spark)."""

    kind = "delta snapshot"

    def __init__(self, name: str, path: str, pipeline: str) -> None:
        self.name = name
        self.root = Path(path.removeprefix("file://").removeprefix("file:"))
        self.pipeline = pipeline
        self.app = f"sparkonce:{pipeline}"

    def read(self) -> Observation:
        from urllib.parse import unquote

        import pyarrow.parquet as pq

        log = self.root / "_delta_log"
        versions = sorted(int(p.stem) for p in log.glob("*.json")) if log.is_dir() else []
        files: dict[str, dict[str, str | None]] = {}
        entries: list[LedgerEntry] = []
        for v in versions:
            txn: int | None = None
            rows_written = -1
            for line in (log / f"{v:020d}.json").read_text().splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                if "add" in action:
                    files[action["add"]["path"]] = action["add"].get("partitionValues") or {}
                elif "remove" in action:
                    files.pop(action["remove"]["path"], None)
                elif "txn" in action and action["txn"].get("appId") == self.app:
                    txn = int(action["txn"]["version"])
                elif "commitInfo" in action:
                    metrics = action["commitInfo"].get("operationMetrics") or {}
                    count = metrics.get("numOutputRows", metrics.get("numSourceRows"))
                    rows_written = int(count) if count is not None else -1
            if txn is None:
                continue
            # version = epoch << 32 | entries committed (sparkonce.ledger.delta): a commit
            # that counts one more entry is that batch's; an acquire keeps the count.
            epoch, committed = txn >> 32, txn & 0xFFFFFFFF
            if committed > len(entries):
                entries.append(self._entry(committed - 1, epoch, rows_written))
        out: list[dict[str, Any]] = []
        for path, parts in files.items():
            table = pq.read_table(self.root / unquote(path))
            for row in table.to_pylist():
                out.append({**row, **dict(parts)})
        return Observation({self.name: out}, entries)

    def _entry(self, seq: int, epoch: int, rows: int) -> LedgerEntry:
        """Entry ``seq``, committed by ``epoch``: the entry file written before the commit
        (``_sparkonce/<pipeline>/entries/<seq>/<epoch>.json``), with the commit's rows."""
        from sparkonce.ledger.records import DELTA_ENTRY

        entry = self.root / "_sparkonce" / self.pipeline / "entries" / str(seq) / f"{epoch}.json"
        data = json.loads(entry.read_text())
        return DELTA_ENTRY.decode(self.pipeline, data, where=str(entry), rows=rows)


# -- the reader thread ---------------------------------------------------------------------


@dataclass
class LiveStore:
    """One store under watch: its name (as the report gives it), reader and checks."""

    name: str
    reader: StoreReader | None
    check: LiveCheck
    unsupported: str | None = None  # why this store is not read live
    read_errors: int = 0
    first_error: str | None = None

    def report(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"store": self.name, "reader": getattr(self.reader, "kind", None)}
        doc.update(self.check.report())
        doc["read_errors"] = self.read_errors
        if self.first_error:
            doc["first_read_error"] = self.first_error
        if self.unsupported:
            doc["not_read"] = self.unsupported
        return doc


class LiveReader:
    """Polls every store every ``interval_s`` seconds on a thread, and checks each
    observation (see the module docstring). ``with reader:`` runs it."""

    def __init__(self, stores: Sequence[LiveStore], interval_s: float = DEFAULT_INTERVAL_S):
        self.stores = list(stores)
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> LiveReader:
        self._thread = threading.Thread(target=self._run, name="verify-live-reader", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.poll()  # one last look at the end state
        for s in self.stores:
            if s.reader is not None:
                s.reader.close()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No observation while the block runs (the campaign resets the stores); the
        checks then start afresh."""
        with self._lock:
            yield
            for s in self.stores:
                s.check.forget()
                if s.reader is not None:
                    s.reader.close()  # reconnects on its next read

    def poll(self) -> None:
        with self._lock:
            for s in self.stores:
                if s.reader is None:
                    continue
                try:
                    obs = s.reader.read()
                except Exception as exc:  # a store busy or restarting: counted, not checked
                    s.read_errors += 1
                    if s.first_error is None:
                        s.first_error = f"{type(exc).__name__}: {str(exc)[:200]}"
                    s.reader.close()
                    continue
                s.check.observe(obs)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.poll()
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
            next_at = max(next_at, time.monotonic() - self.interval_s)

    def anomalies(self) -> int:
        return sum(sum(s.check.anomalies.values()) for s in self.stores)

    def report(self) -> list[dict[str, Any]]:
        return [s.report() for s in self.stores]
