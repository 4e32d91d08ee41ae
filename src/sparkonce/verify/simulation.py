"""A deterministic simulation of the commit protocol: seeded schedules against real stores.

FoundationDB and TigerBeetle check their protocols by running many seeded schedules
of faults and checking invariants after each one. This module does the same for
sparkonce's commit protocol (DESIGN.md section 6), without Spark: it drives the
**real** :class:`~sparkonce.commit.Committer` against the **real** ledger stores
and stagers (SQLite files, PostgreSQL databases), so what it checks is the code that
runs in production, not a model of it. Real SIGKILL trials (``tests/crash``,
``sparkonce verify``) remain the ground truth; the simulation gives the volume.

A **schedule** is generated from one integer seed (``random.Random(seed)``). It holds
a synthetic log (2-3 partitions of 5-30 records; record ``(p, o)``'s row is
``(p, o, "<seed>/<p>/<o>", <epoch of the run that wrote it>)``) and a list of events
over several runs of one pipeline:

* ``start``: a new run takes a new epoch (fencing every older run) and either keeps
  the pipeline's checkpoint (Spark's offset log and commit log, held in memory) or
  starts with an empty one, planning from the ledger's end offsets as the runner does
  (with ``--restore``, also: a checkpoint restored from an old backup);
* ``step``: the newest run re-runs its pending batch (a replay) or plans its next one
  (each run has its own read limits, so batch boundaries differ between runs),
  commits it through the committer and marks it done in its checkpoint. A step may
  carry a fault: a crash at a :class:`~sparkonce.protocol.CrashPoint` (the run is then
  dead), a dropped store connection inside the commit or a lost acknowledgement of its
  COMMIT (the committer must retry and commit once), a failed batch, or a freeze after
  staging (a zombie, played by a thread blocked in the stage function); when no input
  is left a step may plan a no-data batch (the previous batch's end offsets) that
  emits one timer row, or none;
* ``thaw`` (a zombie resumes; if a newer run exists its commit must be fenced),
  ``repeat`` (the newest run commits its last done batch again: must be a skip),
  ``stale`` (an older run that does not know it was replaced commits: must not land),
  ``grow`` (more of the log becomes readable).

A final clean run then drains the log (zombies still frozen are thawed first), and
the invariants are checked against the schedule's own input, never against another
sparkonce run:

1. every input record's row is visible exactly once, with its value, and nothing else
   (no loss, no duplicate, nothing outside the ledger's ranges);
2. the ledger is gap-free and monotonic (:func:`~sparkonce.offsets.check_chain`), its
   ``seq`` is 0, 1, 2..., and it ends at the log's end;
3. every visible row lies in the ledger entry that covers it, carries that entry's
   epoch, and every entry's row count matches its visible rows (rows and ledger row
   committed together);
4. no commit lands from a fenced epoch: every store transaction that committed a
   ledger entry is stamped on a logical clock, on which the simulator also records
   each epoch acquisition; the entry's epoch must be the owner's at that tick;
5. each no-data batch's timer row appears once, with its ledger entry, and no-data
   batches that completed are all visible;
6. per event: the owner run's commit raises nothing but the injected fault, a
   repeated commit is a skip, a thawed zombie is fenced, a stale run never commits.
   With the two-phase sink, no row of a failed, aborted or zombie task attempt is
   ever visible (checked after every event).

Events run one at a time: after each one the simulator waits until every thread is
either finished or frozen, so a seed always replays the same interleaving. A failing
schedule is shrunk (greedy delta debugging over its events) and printed with the
command that replays it::

    python -m sparkonce.verify.simulation --store sqlite --schedules 10000 --seed 0
    python -m sparkonce.verify.simulation --store sqlite --replay 4242
    python -m sparkonce.verify.simulation --store postgres --url postgresql://... \\
        --schedules 500 [--sink twophase]

Fidelity notes. A crash raises :class:`SimCrash` (a ``BaseException``, so no
``except Exception`` cleanup runs, as with SIGKILL); the dying run's open transaction
is rolled back and its connection returned to a pool, which is what the store sees
when a process dies and a new one connects (``--fresh-connections`` opens a new
connection per run instead, slower). Spark's checkpoint is modelled, not run. The
two-phase sink's tasks run in-process (``_precommit_task``), one per partition, on
pooled connections (:class:`TaskConnections`). A zombie freezes only outside the
store transaction: one frozen inside it would hold the store's lock, and ordering its
commit against a newer run's epoch would then depend on thread timing.

Speed. The committer and the store dominate (a commit is seven statements and two
parses of the ledger's newest entry); ``--profile`` shows where the time goes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Literal

from sparkonce.commit import Committer, Staged, Stager
from sparkonce.config import StoreURL
from sparkonce.db import connect, dialect_for, write_transaction
from sparkonce.errors import FencedError, LedgerError
from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry
from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE, SqlLedgerStore
from sparkonce.offsets import BatchRanges, TopicPartition, check_chain, plan_batch
from sparkonce.protocol import CrashPoint

TOPIC = "events"
COLUMNS = ("p", "o", "v", "epoch")
TIMER_PARTITION = -1  # a no-data batch's timer row: (-1, batch id, checkpoint id, epoch)
THREAD_TIMEOUT_S = 60.0  # a simulated thread that neither freezes nor ends in this time hangs

SinkKind = Literal["sql", "twophase"]


class SimCrash(BaseException):
    """A simulated process death at a crash point (a ``BaseException``, like SIGKILL:
    no ``except Exception`` cleanup runs)."""


class InjectedFailure(RuntimeError):
    """A failed batch (a task failure that fails the query): the run stops."""


def _crash() -> None:
    raise SimCrash()


# --- schedules ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Start:
    """A new run: takes the next epoch; keeps the pipeline's checkpoint or starts empty.

    ``restore`` > 0: the checkpoint is restored from a backup instead, taken ``restore``
    offset-log writes ago (of whichever checkpoint the pipeline had then), so it is
    behind the ledger. Such a run may refuse to continue (``LedgerError``, whose message
    tells the operator to delete the checkpoint); it must never lose or duplicate.
    """

    keep_checkpoint: bool = True
    max_per_partition: int | None = None
    max_total: int | None = None
    restore: int = 0

    def __str__(self) -> str:
        ck = (
            f"restore -{self.restore}"
            if self.restore
            else "keep"
            if self.keep_checkpoint
            else "lost"
        )
        return f"start({ck}, mpp={self.max_per_partition}, mt={self.max_total})"


@dataclass(frozen=True)
class Step:
    """The newest run commits its pending batch or its next one, maybe with a fault.

    ``crash``: (crash point, hit) at which the run dies; ``drop``: the store connection
    is lost at after-rows (first hit); ``lost_ack``: the connection is lost just after
    the first COMMIT went through (the committer cannot know it did); ``fail``: the batch
    fails before its transaction (two-phase sink: each task's first attempt fails after
    its pre-commit); ``freeze``: the run freezes after staging (a zombie); ``nodata``: plan
    a no-data batch (same end offsets as the batch before) that emits one timer row, or
    nothing at all with ``quiet``.
    """

    nodata: bool = False
    crash: tuple[str, int] | None = None
    drop: bool = False
    lost_ack: bool = False
    fail: bool = False
    freeze: bool = False
    quiet: bool = False

    def __str__(self) -> str:
        parts = ["nodata"] if self.nodata else []
        if self.crash:
            parts.append(f"crash={self.crash[0]}@{self.crash[1]}")
        parts += [n for n in ("drop", "lost_ack", "fail", "freeze", "quiet") if getattr(self, n)]
        return f"step({', '.join(parts)})"


@dataclass(frozen=True)
class Thaw:
    """A frozen zombie resumes (``kill``: it dies instead, as a paused process killed)."""

    index: int = 0
    kill: bool = False

    def __str__(self) -> str:
        return f"thaw({self.index}{', kill' if self.kill else ''})"


@dataclass(frozen=True)
class Repeat:
    """The newest run commits its last done batch again: must be a skip."""

    def __str__(self) -> str:
        return "repeat()"


@dataclass(frozen=True)
class Stale:
    """An older live run (replaced, and not told) steps: its commit must not land."""

    index: int = 0

    def __str__(self) -> str:
        return f"stale({self.index})"


@dataclass(frozen=True)
class Grow:
    """``count`` more records of ``partition`` become readable."""

    partition: int = 0
    count: int = 1

    def __str__(self) -> str:
        return f"grow(p{self.partition}, +{self.count})"


Event = Start | Step | Thaw | Repeat | Stale | Grow
_EVENT_TYPES: dict[str, type[Any]] = {
    c.__name__.lower(): c for c in (Start, Step, Thaw, Repeat, Stale, Grow)
}


@dataclass(frozen=True)
class Schedule:
    """One seeded schedule: the log, the events, and the final clean run."""

    seed: int
    totals: tuple[int, ...]  # records per partition
    initial: tuple[int, ...]  # records readable at the start
    events: tuple[Event, ...]
    final: Start

    def describe(self) -> str:
        lines = [f"schedule seed={self.seed} log={list(self.totals)} readable={list(self.initial)}"]
        lines += [f"  {i:2d}. {e}" for i, e in enumerate(self.events)]
        lines.append(f"  final: {self.final} (then thaw every zombie, drain the log)")
        return "\n".join(lines)

    def events_json(self) -> str:
        """The events as JSON, for ``--events`` (replays a shrunk schedule exactly)."""
        out = []
        for e in self.events:
            d: dict[str, Any] = {"type": type(e).__name__.lower()}
            for f in fields(e):
                d[f.name] = getattr(e, f.name)
            out.append(d)
        return json.dumps(out, separators=(",", ":"))

    @staticmethod
    def parse_events(text: str) -> tuple[Event, ...]:
        events: list[Event] = []
        for d in json.loads(text):
            cls = _EVENT_TYPES[d.pop("type")]
            if "crash" in d and d["crash"] is not None:
                d["crash"] = (str(d["crash"][0]), int(d["crash"][1]))
            events.append(cls(**d))
        return tuple(events)


_POINTS = [p.value for p in CrashPoint]
_MPP = (None, None, 1, 2, 3, 5, 8)
_MT = (None, None, 1, 2, 4, 7, 10)
_FINAL_MPP = (None, 5, 10)
_FINAL_MT = (None, 8, 16)


def _limits(rng: random.Random) -> tuple[int | None, int | None]:
    return rng.choice(_MPP), rng.choice(_MT)


def generate(seed: int, *, with_restore: bool = False) -> Schedule:
    """The schedule of ``seed`` (the same seed always gives the same schedule).

    ``with_restore``: some new runs start from a checkpoint restored from an old backup (see
    :class:`Start`). Off by default: such schedules break the real protocol today (see
    ``tests/sim/test_known_bugs.py``). The random draws are the same either way, so a
    seed gives the same schedule with and without, but for those restores.
    """
    rng = random.Random(seed)
    parts = rng.randint(2, 3)
    totals = tuple(rng.randint(5, 30) for _ in range(parts))
    initial = tuple(rng.randint(0, t) for t in totals)
    events: list[Event] = [Start(True, *_limits(rng))]
    for _ in range(rng.randint(4, 24)):
        x = rng.random()
        if x < 0.50:
            events.append(_step(rng))
        elif x < 0.64:
            restore = rng.randint(1, 8) if rng.random() < 0.12 else 0
            restore = restore if with_restore else 0
            events.append(Start(rng.random() < 0.6, *_limits(rng), restore=restore))
        elif x < 0.74:
            events.append(Grow(rng.randrange(parts), rng.randint(1, 10)))
        elif x < 0.83:
            events.append(Thaw(rng.randrange(4), rng.random() < 0.15))
        elif x < 0.91:
            events.append(Stale(rng.randrange(4)))
        else:
            events.append(Repeat())
    # The final run drains what is left with larger limits: its batches carry no fault.
    final = Start(rng.random() < 0.6, rng.choice(_FINAL_MPP), rng.choice(_FINAL_MT))
    return Schedule(seed, totals, initial, tuple(events), final)


def _step(rng: random.Random) -> Step:
    nodata = rng.random() < 0.2
    quiet = nodata and rng.random() < 0.25
    x = rng.random()
    if x < 0.25:
        return Step(nodata, crash=(rng.choice(_POINTS), 1), quiet=quiet)
    if x < 0.33:
        crash = None
        if rng.random() < 0.3:  # a crash during the retry that follows the drop
            crash = rng.choice([("after-rows", 2), ("before-ledger-commit", 1)])
            crash = crash if rng.random() < 0.8 else ("after-ledger-commit", 1)
        return Step(nodata, crash=crash, drop=True, quiet=quiet)
    if x < 0.38:
        crash = ("after-ledger-commit", 1) if rng.random() < 0.2 else None
        return Step(nodata, crash=crash, lost_ack=True, quiet=quiet)
    if x < 0.42:
        return Step(nodata, fail=True, quiet=quiet)
    if x < 0.52:
        return Step(nodata, freeze=True, quiet=quiet)
    return Step(nodata, quiet=quiet)


# --- the store under test -----------------------------------------------------------------


class Observer:
    """Receives the ledger entries of every store transaction that committed."""

    def committed(self, entries: list[LedgerEntry]) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class ObservedStore(SqlLedgerStore):
    """The real SQL ledger store; it also reports each committed transaction's entries.

    The report is made after the COMMIT returned, so an entry is stamped only if its
    transaction really committed (a rollback, a crash or a lost connection raise first).
    """

    observer: Observer | None = None
    lose_ack = 0  # fault: this many next COMMITs succeed but their connection is lost

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        recorded: list[LedgerEntry] = []
        self._recording = recorded
        with super().transaction() as txn:
            yield txn
        if self.observer is not None and recorded:
            self.observer.committed(recorded)
        if self.lose_ack:
            self.lose_ack -= 1
            raise self._lost_after_commit()

    def _lost_after_commit(self) -> Exception:
        """The connection drops after COMMIT went through: the error the caller sees."""
        conn = self._conn
        if self.dialect.name == "sqlite":
            conn.close()
            try:
                conn.execute("SELECT 1")  # what the next statement gets
            except Exception as exc:
                return exc
            raise AssertionError("a closed SQLite connection ran a statement")
        import psycopg

        with contextlib.suppress(Exception):
            conn.close()
        return psycopg.OperationalError("server closed the connection unexpectedly (injected)")

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        super().record(txn, entry)
        getattr(self, "_recording", []).append(entry)

    def rollback_if_open(self) -> None:
        """What a process's death does to its session: any open transaction is gone."""
        if self._conn is None:
            return
        try:
            if self.dialect.name == "sqlite":
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            else:
                from psycopg.pq import TransactionStatus

                if self._conn.info.transaction_status != TransactionStatus.IDLE:
                    self._conn.execute("ROLLBACK")
        except Exception:
            self.reconnect()


@dataclass
class Endpoint:
    """What one run (one process) holds: its store connection and its stager."""

    store: ObservedStore
    stager: Stager


class Target:
    """The store a simulation worker writes to: one pipeline, one output table.

    SQLite: one file (put it on /dev/shm), reused by every schedule of the worker.
    PostgreSQL: one database; several workers use different pipelines and tables.
    Tables are emptied between schedules (:meth:`reset`).
    """

    def __init__(
        self,
        url: str,
        *,
        sink: SinkKind = "sql",
        pipeline: str = "sim",
        table: str = "sim_out",
        fresh_connections: bool = False,
    ) -> None:
        self.url = StoreURL.parse(url)
        self.dialect = dialect_for(self.url)
        if sink == "twophase" and self.dialect.name != "postgresql":
            raise ValueError("the two-phase sink needs PostgreSQL")
        self.sink: SinkKind = sink
        self.pipeline = pipeline
        self.table = table
        self.fresh_connections = fresh_connections
        self._pool: list[Endpoint] = []
        self.task_connections = TaskConnections()
        self._admin = self._new_endpoint()
        self.read_table = table
        self._setup()

    # -- endpoints -----------------------------------------------------------------------
    def _new_endpoint(self) -> Endpoint:
        store = ObservedStore(self.url, self.dialect)
        store.conn  # noqa: B018 - connects and creates the ledger tables
        stager: Stager
        if self.sink == "twophase":
            from sparkonce.sinks.twophase import PostgresTwoPhaseSink

            tp = PostgresTwoPhaseSink(self.url, self.table)
            # The sink's own connection is the run's store: prepare's fence, the collector
            # and the commit all go through it, as in one driver process.
            tp._store = store
            tp._ledger = store.ledger
            tp._committer = Committer(store, tp, faults=FaultPlan())
            tp._ready = getattr(self, "_tables_ready", False)
            tp._table_checked = True
            stager = tp
        else:
            from sparkonce.sinks.sql import PostgresSink, SQLiteSink

            cls = SQLiteSink if self.dialect.name == "sqlite" else PostgresSink
            sql = cls(self.url, self.table)
            sql._table_checked = True  # the table is created by _setup
            stager = sql
        return Endpoint(store, stager)

    def take(self) -> Endpoint:
        if self._pool and not self.fresh_connections:
            return self._pool.pop()
        return self._new_endpoint()

    def give_back(self, ep: Endpoint) -> None:
        ep.store.observer = None
        if self.fresh_connections:
            ep.store.close()
            return
        ep.store.rollback_if_open()
        self._pool.append(ep)

    # -- tables --------------------------------------------------------------------------
    def _setup(self) -> None:
        conn = self._admin.store.conn
        if self.sink == "twophase":
            from pyspark.sql import types as T

            from sparkonce.sinks.twophase import PostgresTwoPhaseSink

            tp = self._admin.stager
            assert isinstance(tp, PostgresTwoPhaseSink)
            tp.open()
            schema = T.StructType(
                [
                    T.StructField("p", T.LongType()),
                    T.StructField("o", T.LongType()),
                    T.StructField("v", T.StringType()),
                    T.StructField("epoch", T.LongType()),
                ]
            )
            tp._ensure_tables(schema)
            self._tables_ready = True
            self.precommit_table = tp.precommit_table
            return
        big = "INTEGER" if self.dialect.name == "sqlite" else "BIGINT"
        with write_transaction(conn, self.dialect):
            conn.execute(
                f'CREATE TABLE IF NOT EXISTS "{self.table}" (p {big}, o {big}, v TEXT, epoch {big})'
            )

    def reset(self) -> None:
        """Empty the output and the pipeline's owner and ledger rows."""
        conn = self._admin.store.conn
        q = self.dialect.q
        with write_transaction(conn, self.dialect):
            if self.sink == "twophase":
                conn.execute(f'DELETE FROM "{self.precommit_table}"')
                conn.execute(
                    q("DELETE FROM sparkonce_attempts WHERE pipeline = %s"), (self.pipeline,)
                )
            else:
                conn.execute(f'DELETE FROM "{self.table}"')
            for t in (LEDGER_TABLE, OWNER_TABLE):
                conn.execute(q(f"DELETE FROM {t} WHERE pipeline = %s"), (self.pipeline,))

    def visible_rows(self) -> list[tuple[Any, ...]]:
        """What readers see (the table, or the two-phase sink's view)."""
        conn = self._admin.store.conn
        return [
            tuple(r) for r in conn.execute(f'SELECT p, o, v, epoch FROM "{self.table}"').fetchall()
        ]

    def entries(self) -> list[LedgerEntry]:
        return self._admin.store.entries(self.pipeline)

    def owner_epoch(self) -> int | None:
        owner = self._admin.store.owner(self.pipeline)
        return None if owner is None else owner.epoch

    def visible_attempts(self, attempts: Sequence[int]) -> int:
        """Two-phase: how many of ``attempts`` have rows readers can see."""
        if not attempts:
            return 0
        conn = self._admin.store.conn
        row = conn.execute(
            f'SELECT count(*) FROM "{self.precommit_table}" WHERE sparkonce_attempt = ANY(%s) '
            "AND sparkonce_attempt IN (SELECT attempt_id FROM sparkonce_attempts "
            "WHERE state = 'committed')",
            (list(attempts),),
        ).fetchone()
        return int(row[0])

    def close(self) -> None:
        for ep in [*self._pool, self._admin]:
            with contextlib.suppress(Exception):
                ep.store.close()
        self._pool.clear()
        self.task_connections.close()


class TaskConnections:
    """The two-phase sink's pre-commit tasks' connections, kept open from task to task.

    A real task opens a connection of its own and closes it. Opening one costs about 5 ms
    on PostgreSQL, more than the rest of a task; a connection whose transaction ended is,
    to the server, the same as a new one. While :meth:`installed`, the sink's tasks get
    one from here, and their ``close`` rolls back what is open and returns it.
    """

    def __init__(self) -> None:
        self._free: list[Any] = []

    def connect(self, url: StoreURL, **kwargs: Any) -> Any:
        return _TaskConnection(self._free.pop() if self._free else connect(url), self._free)

    @contextmanager
    def installed(self) -> Iterator[None]:
        from sparkonce.sinks import twophase

        saved = twophase.connect
        setattr(twophase, "connect", self.connect)  # noqa: B010 - mypy: a module attribute
        try:
            yield
        finally:
            setattr(twophase, "connect", saved)  # noqa: B010

    def close(self) -> None:
        for conn in self._free:
            with contextlib.suppress(Exception):
                conn.close()
        self._free.clear()


class _TaskConnection:
    """A pooled connection as a task sees it: ``close`` gives it back."""

    def __init__(self, conn: Any, free: list[Any]) -> None:
        self._conn = conn
        self._free = free

    def execute(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.execute(*args, **kwargs)

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.cursor(*args, **kwargs)

    def close(self) -> None:
        from psycopg.pq import TransactionStatus

        conn = self._conn
        try:
            if conn.info.transaction_status != TransactionStatus.IDLE:
                conn.execute("ROLLBACK")
        except Exception:
            with contextlib.suppress(Exception):
                conn.close()
            return
        self._free.append(conn)


# --- one schedule --------------------------------------------------------------------------


@dataclass(frozen=True)
class Failure:
    """A broken invariant: ``kind`` groups failures (shrinking keeps the kind)."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.detail}"


@dataclass(frozen=True)
class Planned:
    """One batch in a checkpoint's offset log."""

    batch_id: int
    ranges: BatchRanges
    nodata: bool
    quiet: bool = False  # a no-data batch that emits no row


@dataclass
class Checkpoint:
    """Spark's checkpoint, reduced to what the protocol reads: offset log and commit log."""

    id: str
    planned: list[Planned] = field(default_factory=list)
    done: int = 0  # batches 0..done-1 are in the commit log
    restored: bool = False  # restored from a backup (behind the ledger)

    @property
    def pending(self) -> Planned | None:
        return self.planned[self.done] if len(self.planned) > self.done else None

    @property
    def last_done(self) -> Planned | None:
        return self.planned[self.done - 1] if self.done else None

    def copy(self) -> Checkpoint:
        return Checkpoint(self.id, list(self.planned), self.done, self.restored)


@dataclass
class Run:
    """One run of the pipeline (one driver process)."""

    index: int
    epoch: int
    endpoint: Endpoint
    checkpoint: Checkpoint
    resume: dict[TopicPartition, int]  # where an empty checkpoint's first batch starts
    max_per_partition: int | None
    max_total: int | None
    state: Literal["live", "frozen", "dead"] = "live"
    zombie: Zombie | None = None


class Zombie:
    """A run frozen after staging, before its transaction: a thread blocked in ``stage``."""

    def __init__(
        self,
        committer: Committer,
        ctx: BatchContext,
        stage: Callable[[int], Staged],
        attempts: list[int],
    ) -> None:
        self.committer = committer
        self.ctx = ctx
        self._stage = stage
        self.attempts = attempts  # two-phase: the task attempts its stage pre-committed
        self.paused = threading.Event()  # set when frozen, or when the commit ended
        self.thawed = threading.Event()
        self.kill = False
        self.froze = False
        self.result: CommitResult | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name="sim-zombie", daemon=True)

    def stage(self, seq: int) -> Staged:
        staged = self._stage(seq)
        self.froze = True
        self.paused.set()
        self.thawed.wait()
        if self.kill:
            raise SimCrash()
        return staged

    def _main(self) -> None:
        try:
            self.result = self.committer.commit_with(self.ctx, self.stage)
        except BaseException as exc:
            self.error = exc
        finally:
            self.paused.set()

    def start(self) -> None:
        self.thread.start()
        if not self.paused.wait(THREAD_TIMEOUT_S):
            raise RuntimeError("a zombie's commit neither froze nor ended")

    def thaw(self, kill: bool) -> None:
        self.kill = kill
        self.thawed.set()
        self.thread.join(THREAD_TIMEOUT_S)
        if self.thread.is_alive():
            raise RuntimeError("a thawed zombie's commit did not end")


@dataclass
class Stats:
    """What the schedules did (to show that the faults were reached)."""

    schedules: int = 0
    runs: int = 0
    commits: int = 0
    skips: int = 0
    crashes: int = 0
    drops: int = 0
    fenced: int = 0
    zombies: int = 0
    nodata: int = 0

    def add(self, other: Stats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


class Simulation(Observer):
    """Runs one schedule against a target and checks the invariants."""

    def __init__(
        self,
        schedule: Schedule,
        target: Target,
        committer_cls: type[Committer] = Committer,
    ) -> None:
        self.s = schedule
        self.t = target
        self.committer_cls = committer_cls
        self.available = {(TOPIC, p): n for p, n in enumerate(schedule.initial)}
        self.runs: list[Run] = []
        self.failures: list[Failure] = []
        self.stats = Stats(schedules=1)
        self.clock = 0
        self.acquired: list[tuple[int, int]] = []  # (tick, epoch), on the logical clock
        self.stamps: list[tuple[int, LedgerEntry]] = []  # (tick, entry) of committed txns
        self.completed_nodata: set[tuple[str, int]] = set()
        self.backups: list[Checkpoint] = []  # the pipeline's checkpoint after each plan
        self.failed_attempts: list[int] = []  # two-phase: attempts that must stay invisible

    # -- the logical clock --------------------------------------------------------------
    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def committed(self, entries: list[LedgerEntry]) -> None:
        t = self.tick()
        self.stamps += [(t, e) for e in entries]

    def owner_at(self, t: int) -> int | None:
        owner = None
        for at, epoch in self.acquired:
            if at < t:
                owner = epoch
        return owner

    def fail(self, kind: str, detail: str) -> None:
        self.failures.append(Failure(kind, detail))

    # -- driving ------------------------------------------------------------------------
    def run(self) -> list[Failure]:
        """Run the schedule, then check the invariants; returns the failures."""
        try:
            for i, event in enumerate(self.s.events):
                self._apply(i, event)
            self._final()
            self._check()
        except Exception as exc:  # the harness or the store failed: a failure too
            self.fail("harness", f"{type(exc).__name__}: {exc}")
        finally:
            self._release()
        return self.failures

    def _apply(self, i: int, event: Event) -> None:
        if isinstance(event, Start):
            self._start(event)
        elif isinstance(event, Step):
            run = self._newest()
            if run is not None and run.state == "live":
                self._step(run, event, f"event {i}")
        elif isinstance(event, Thaw):
            frozen = [r for r in self.runs if r.state == "frozen"]
            if frozen:
                self._thaw(frozen[event.index % len(frozen)], event.kill, f"event {i}")
        elif isinstance(event, Repeat):
            run = self._newest()
            if run is not None and run.state == "live":
                self._repeat(run, f"event {i}")
        elif isinstance(event, Stale):
            newest = self._newest()
            stale = [r for r in self.runs if r.state == "live" and r is not newest]
            if stale:
                self._stale(stale[event.index % len(stale)], f"event {i}")
        elif isinstance(event, Grow):
            tp = (TOPIC, event.partition % len(self.s.totals))
            self.available[tp] = min(self.s.totals[tp[1]], self.available[tp] + event.count)
        if self.t.sink == "twophase":
            self._check_attempts(f"after event {i}")

    def _newest(self) -> Run | None:
        return self.runs[-1] if self.runs else None

    def _start(self, ev: Start) -> Run:
        ep = self.t.take()
        ep.store.observer = self
        previous = self._newest()
        owner = ep.store.acquire(self.t.pipeline)
        if self.t.sink == "twophase":
            ep.stager.collect(self.t.pipeline, owner.epoch)  # type: ignore[attr-defined]
        last_epoch = self.acquired[-1][1] if self.acquired else 0
        if owner.epoch != last_epoch + 1:
            self.fail("epoch", f"acquire returned epoch {owner.epoch} after {last_epoch}")
        self.acquired.append((self.tick(), owner.epoch))
        self.stats.runs += 1
        if ev.restore and self.backups:
            checkpoint = self.backups[-min(ev.restore, len(self.backups))].copy()
            checkpoint.restored = True
        elif ev.keep_checkpoint and previous is not None:
            checkpoint = previous.checkpoint.copy()
        else:
            checkpoint = Checkpoint(f"q{len(self.runs)}")
        resume: dict[TopicPartition, int] = {}
        if not checkpoint.planned:  # a new or lost checkpoint: resume from the ledger,
            last = ep.store.last(self.t.pipeline)  # read after taking the epoch
            resume = {} if last is None else last.end_offsets
        run = Run(
            len(self.runs),
            owner.epoch,
            ep,
            checkpoint,
            resume,
            ev.max_per_partition,
            ev.max_total,
        )
        self.runs.append(run)
        return run

    def _plan(self, run: Run, nodata: bool, quiet: bool = False) -> Planned | None:
        """The run's next batch, written to its offset log (None: Spark runs no batch)."""
        ck = run.checkpoint
        start = ck.planned[-1].ranges.ends() if ck.planned else run.resume
        ranges = plan_batch(
            start,
            self.available,
            max_per_partition=run.max_per_partition,
            max_total=run.max_total,
        )
        nodata = nodata and ranges.count == 0  # as Spark: only when no new input is there
        if nodata:
            if not ck.planned:
                return None  # a no-data batch follows a batch of the same checkpoint
            ranges = BatchRanges.at(start)
        elif ranges.count == 0:
            return None
        batch = Planned(len(ck.planned), ranges, nodata, nodata and quiet)
        ck.planned.append(batch)
        if run is self._newest():  # the pipeline's checkpoint: a backup may copy it
            self.backups.append(ck.copy())
        return batch

    def _rows(self, run: Run, batch: Planned) -> list[tuple[Any, ...]]:
        if batch.nodata:
            if batch.quiet:
                return []
            return [(TIMER_PARTITION, batch.batch_id, run.checkpoint.id, run.epoch)]
        seed = self.s.seed
        return [
            (r.partition, o, f"{seed}/{r.partition}/{o}", run.epoch)
            for r in batch.ranges.ranges
            for o in range(r.start, r.end)
        ]

    def _ctx(self, run: Run, batch: Planned) -> BatchContext:
        return BatchContext(
            self.t.pipeline, run.epoch, batch.ranges, batch.batch_id, run.checkpoint.id
        )

    def _stage_fn(
        self, run: Run, batch: Planned, ev: Step
    ) -> tuple[Callable[[int], Staged], list[int]]:
        """The stage function of a commit, and the task attempts it pre-commits (2PC)."""
        rows = self._rows(run, batch)
        attempts: list[int] = []
        if self.t.sink == "twophase":
            ctx = self._ctx(run, batch)
            return lambda seq: self._precommit(run, ctx, seq, rows, ev.fail, attempts), attempts
        if ev.fail:

            def failing(seq: int) -> Staged:
                raise InjectedFailure("injected batch failure")

            return failing, attempts
        staged = Staged(len(rows), (None, list(COLUMNS), rows))
        return lambda seq: staged, attempts

    def _step(self, run: Run, ev: Step, where: str) -> None:
        batch = run.checkpoint.pending or self._plan(run, ev.nodata, ev.quiet)
        if batch is None:
            return
        ctx = self._ctx(run, batch)
        crash = (CrashPoint(ev.crash[0]), ev.crash[1]) if ev.crash else None
        drop = (CrashPoint.AFTER_ROWS, 1) if ev.drop else None
        plan = FaultPlan(crash=crash, drop_connection=drop, on_crash=_crash)
        committer = self.committer_cls(run.endpoint.store, run.endpoint.stager, faults=plan)
        stage, attempts = self._stage_fn(run, batch, ev)
        what = f"{where}: run {run.index} (epoch {run.epoch}) batch {batch.batch_id} [{ctx.ranges}]"
        if ev.freeze:
            zombie = Zombie(committer, ctx, stage, attempts)
            zombie.start()
            if zombie.froze:
                run.state, run.zombie = "frozen", zombie
                self.stats.zombies += 1
                return
            self._outcome(run, batch, zombie.result, zombie.error, what, owner=True)
            return
        self.stats.drops += ev.drop + ev.lost_ack
        store = run.endpoint.store
        store.lose_ack = int(ev.lost_ack)
        result: CommitResult | None = None
        error: BaseException | None = None
        try:
            result = committer.commit_with(ctx, stage)
        except (Exception, SimCrash) as exc:
            error = exc
        finally:
            store.lose_ack = 0
        landed = result is not None and not result.skipped
        if isinstance(error, SimCrash) and crash == (CrashPoint.AFTER_LEDGER_COMMIT, 1):
            landed = True  # (not for a skip, but a skip pre-commits nothing)
        if not landed:
            self.failed_attempts += attempts
        if ev.fail and isinstance(error, InjectedFailure):
            self._die(run)
            return
        self._outcome(run, batch, result, error, what, owner=True)

    def _outcome(
        self,
        run: Run,
        batch: Planned,
        result: CommitResult | None,
        error: BaseException | None,
        what: str,
        *,
        owner: bool,
    ) -> None:
        """Judge a commit's outcome; mark the batch done or the run dead."""
        if isinstance(error, SimCrash):
            self.stats.crashes += 1
            self._die(run)
            return
        if error is not None:
            if isinstance(error, FencedError):
                self.stats.fenced += 1
            restored = isinstance(error, LedgerError) and run.checkpoint.restored
            if owner and not restored:  # (a restored checkpoint may be refused)
                self.fail("owner-error", f"{what}: the owner's commit raised {_short(error)}")
            elif not isinstance(error, (FencedError, LedgerError)):
                self.fail("fenced-error", f"{what}: a fenced run's commit raised {_short(error)}")
            self._die(run)
            return
        assert result is not None
        if not owner and not result.skipped:
            self.fail("fenced-commit", f"{what}: a fenced run committed ({result})")
        if result.skipped:
            self.stats.skips += 1
        else:
            self.stats.commits += 1
        if batch.nodata:
            self.stats.nodata += 1
            if not batch.quiet:
                self.completed_nodata.add((run.checkpoint.id, batch.batch_id))
        if run.checkpoint.pending == batch:
            run.checkpoint.done += 1

    def _die(self, run: Run) -> None:
        run.state = "dead"
        self.t.give_back(run.endpoint)

    def _thaw(self, run: Run, kill: bool, where: str) -> None:
        zombie = run.zombie
        assert zombie is not None
        run.zombie = None
        run.state = "live"
        zombie.thaw(kill)
        batch = run.checkpoint.pending
        assert batch is not None
        fenced = run.epoch < self.acquired[-1][1]
        if zombie.result is None or zombie.result.skipped:
            self.failed_attempts += zombie.attempts
        what = f"{where}: zombie run {run.index} (epoch {run.epoch}) batch {batch.batch_id}"
        if fenced and not kill and not isinstance(zombie.error, FencedError):
            got = _short(zombie.error) if zombie.error else f"result {zombie.result}"
            self.fail("zombie-not-fenced", f"{what}: expected FencedError, got {got}")
            self._die(run)
            return
        self._outcome(run, batch, zombie.result, zombie.error, what, owner=not fenced)

    def _repeat(self, run: Run, where: str) -> None:
        batch = run.checkpoint.last_done
        if batch is None:
            return
        ctx = self._ctx(run, batch)
        committer = self.committer_cls(run.endpoint.store, run.endpoint.stager, faults=FaultPlan())
        rows = self._rows(run, batch)
        staged = Staged(len(rows), (None, list(COLUMNS), rows))
        what = f"{where}: run {run.index} repeats batch {batch.batch_id} [{ctx.ranges}]"
        try:
            result = committer.commit_with(ctx, lambda seq: staged)
        except Exception as exc:
            self.fail("repeat", f"{what}: raised {_short(exc)}")
            self._die(run)
            return
        if not result.skipped:
            self.fail("repeat", f"{what}: committed again ({result})")

    def _stale(self, run: Run, where: str) -> None:
        batch = run.checkpoint.pending or self._plan(run, False)
        if batch is None:
            return
        ctx = self._ctx(run, batch)
        committer = self.committer_cls(run.endpoint.store, run.endpoint.stager, faults=FaultPlan())
        what = f"{where}: stale run {run.index} (epoch {run.epoch}) batch {batch.batch_id}"
        result: CommitResult | None = None
        error: BaseException | None = None
        stage, attempts = self._stage_fn(run, batch, Step())
        try:
            result = committer.commit_with(ctx, stage)
        except (Exception, SimCrash) as exc:
            error = exc
        if result is None or result.skipped:
            self.failed_attempts += attempts
        self._outcome(run, batch, result, error, what, owner=False)

    def _final(self) -> None:
        for tp in self.available:
            self.available[tp] = self.s.totals[tp[1]]
        final = self.s.final
        newest = self._newest()
        if newest is not None and newest.checkpoint.restored:
            final = replace(final, keep_checkpoint=False)  # as the LedgerError advises
        run = self._start(final)
        for zombie_run in [r for r in self.runs if r.state == "frozen"]:
            self._thaw(zombie_run, False, "final")
        limit = sum(self.s.totals) + 3
        for _ in range(limit):
            if run.state != "live":
                self.fail("drain", f"the final run {run.index} died: it cannot drain the log")
                return
            if run.checkpoint.pending is None and self._plan(run, False) is None:
                return
            self._step(run, Step(), "final")
        self.fail("drain", f"the final run did not drain the log in {limit} batches")

    def _release(self) -> None:
        for run in self.runs:
            if run.zombie is not None:
                with contextlib.suppress(Exception):
                    run.zombie.thaw(kill=True)
                run.zombie = None
            if run.state != "dead":
                run.state = "dead"
                self.t.give_back(run.endpoint)

    # -- the two-phase sink -------------------------------------------------------------
    def _precommit(
        self,
        run: Run,
        ctx: BatchContext,
        seq: int,
        rows: list[tuple[Any, ...]],
        fail: bool,
        staged_attempts: list[int],
    ) -> Staged:
        """The two-phase sink's prepare, without Spark: one pre-commit task per partition.

        ``fail``: each task's first attempt fails after its pre-commit is durable, and
        Spark retries it; only the retry's attempt is reported successful.
        """
        import pyarrow as pa

        from sparkonce.sinks.twophase import PostgresTwoPhaseSink, _precommit_task, _TaskPlan

        sink = run.endpoint.stager
        assert isinstance(sink, PostgresTwoPhaseSink)
        sink._ledger.check_owner(sink.conn, ctx.pipeline, ctx.epoch)  # the cheap fence
        plan = _TaskPlan(
            url=sink.url,
            table=sink.precommit_table,
            columns=COLUMNS,
            pipeline=ctx.pipeline,
            target=sink.table,
            epoch=ctx.epoch,
            seq=seq,
        )
        tasks: dict[int, list[tuple[Any, ...]]] = {}
        for r in rows:
            tasks.setdefault(r[0], []).append(r)
        attempts: list[int] = []
        total = 0
        for part_rows in tasks.values():
            batch = pa.RecordBatch.from_pylist(
                [dict(zip(COLUMNS, r, strict=True)) for r in part_rows], schema=_arrow_schema()
            )
            for attempt_no in range(2 if fail else 1):
                with self.t.task_connections.installed():
                    out = next(_precommit_task(plan, iter([batch]))).to_pylist()[0]
                if out["fenced"]:
                    owner = sink.owner(ctx.pipeline)
                    raise FencedError(ctx.pipeline, ctx.epoch, owner.epoch if owner else 0)
                if fail and attempt_no == 0:
                    self.failed_attempts.append(int(out["attempt"]))
                    continue
                attempts.append(int(out["attempt"]))
                staged_attempts.append(int(out["attempt"]))
                total += int(out["rows"])
        return Staged(total, (seq, sorted(attempts), list(COLUMNS)))

    def _check_attempts(self, when: str) -> None:
        n = self.t.visible_attempts(self.failed_attempts)
        if n:
            self.fail("2pc-visible", f"{when}: {n} rows of failed task attempts are visible")

    # -- invariants ---------------------------------------------------------------------
    def _check(self) -> None:
        entries = self.t.entries()
        rows = self.t.visible_rows()
        self._check_ledger(entries)
        self._check_epochs(entries)
        self._check_rows(entries, rows)
        if self.t.sink == "twophase":
            self._check_attempts("at the end")

    def _check_ledger(self, entries: list[LedgerEntry]) -> None:
        seqs = [e.seq for e in entries]
        if seqs != list(range(len(entries))):
            self.fail("ledger", f"ledger seqs are {seqs}, not 0..{len(entries) - 1}")
        for problem in check_chain(e.ranges for e in entries):
            self.fail("ledger", problem)
        ends: dict[TopicPartition, int] = {}
        for e in entries:
            ends.update(e.end_offsets)
        want = {(TOPIC, p): n for p, n in enumerate(self.s.totals)}
        if ends != want:
            self.fail("ledger", f"the ledger ends at {ends}, the log at {want}")
        for e in entries:
            if e.ranges.empty and e.row_count == 0:
                self.fail("ledger", f"entry {e.seq} holds a no-data batch without rows")
        owner = self.t.owner_epoch()
        if owner != self.acquired[-1][1]:
            self.fail("epoch", f"the owner row holds epoch {owner}, the last run took a newer one")

    def _check_epochs(self, entries: list[LedgerEntry]) -> None:
        """Invariant 4: every entry committed while its epoch owned the pipeline."""
        stamped: dict[int, list[tuple[int, LedgerEntry]]] = {}
        for t, e in self.stamps:
            stamped.setdefault(e.seq, []).append((t, e))
        for e in entries:
            seen = [(t, s) for t, s in stamped.get(e.seq, []) if s.ranges == e.ranges]
            if len(seen) != 1:
                self.fail(
                    "fenced-commit",
                    f"ledger entry {e.seq} [{e.ranges}] was committed by {len(seen)} observed "
                    "store transactions (expected 1)",
                )
                continue
            t, _ = seen[0]
            owner = self.owner_at(t)
            if owner != e.epoch:
                self.fail(
                    "fenced-commit",
                    f"ledger entry {e.seq} [{e.ranges}] committed by epoch {e.epoch} at tick {t}, "
                    f"when epoch {owner} owned the pipeline",
                )

    def _check_rows(self, entries: list[LedgerEntry], rows: list[tuple[Any, ...]]) -> None:
        """Invariants 1, 3 and 5: each input row once, inside its ledger entry, same epoch."""
        by_offset: dict[tuple[int, int], LedgerEntry] = {}
        by_timer: dict[tuple[str, int], LedgerEntry] = {}
        for e in entries:
            if e.ranges.empty and e.checkpoint_id is not None and e.spark_batch_id is not None:
                by_timer[(e.checkpoint_id, e.spark_batch_id)] = e
            for r in e.ranges.ranges:
                for o in range(r.start, r.end):
                    by_offset[(r.partition, o)] = e
        counts: Counter[tuple[Any, int]] = Counter()
        per_entry: Counter[int] = Counter()
        found: dict[str, list[str]] = {}

        def problem(kind: str, text: str) -> None:
            found.setdefault(kind, []).append(text)

        for p, o, v, epoch in rows:
            if p == TIMER_PARTITION:
                counts[(v, o)] += 1
                covering = by_timer.get((v, o))
            else:
                counts[(p, o)] += 1
                if v != f"{self.s.seed}/{p}/{o}":
                    problem("value", f"({p}, {o}) holds {v!r}")
                covering = by_offset.get((p, o))
            if covering is None:
                problem("outside", f"timer {v}#{o}" if p == TIMER_PARTITION else f"({p}, {o})")
                continue
            e = covering
            per_entry[e.seq] += 1
            if epoch != e.epoch:
                problem("epoch", f"({p}, {o}) by epoch {epoch} in entry {e.seq} of epoch {e.epoch}")
        for p, total in enumerate(self.s.totals):
            missing = [o for o in range(total) if (p, o) not in counts]
            if missing:
                problem("loss", f"partition {p} offsets {_spans(missing)}")
        for key in sorted(self.completed_nodata):
            if key not in counts:
                problem("loss", f"the timer row of completed no-data batch {key[0]}#{key[1]}")
        for key, n in counts.items():
            if n > 1:
                problem("duplicate", f"{key} x{n}")
        for e in entries:
            if per_entry[e.seq] != e.row_count:
                problem(
                    "row-count",
                    f"entry {e.seq} [{e.ranges}] counts {e.row_count}, {per_entry[e.seq]} visible",
                )
        for kind, what in _ROW_PROBLEMS.items():
            items = found.get(kind)
            if items:
                more = f" (+{len(items) - 5} more)" if len(items) > 5 else ""
                self.fail(kind, f"{what}: {'; '.join(items[:5])}{more}")


_ROW_PROBLEMS = {
    "loss": "input records not visible",
    "duplicate": "rows visible more than once",
    "outside": "visible rows outside every ledger range (or no-data batch without an entry)",
    "value": "rows with a value their record does not have",
    "epoch": "rows written by another epoch than their ledger entry's (rows and ledger row "
    "not committed together)",
    "row-count": "ledger entries whose row count differs from their visible rows",
}


@functools.cache
def _arrow_schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [("p", pa.int64()), ("o", pa.int64()), ("v", pa.string()), ("epoch", pa.int64())]
    )


def _short(exc: BaseException) -> str:
    text = str(exc).split(". ")[0]
    return f"{type(exc).__name__}: {text[:200]}"


def _spans(offsets: list[int]) -> str:
    spans: list[str] = []
    start = prev = offsets[0]
    for o in [*offsets[1:], None]:
        if o is not None and o == prev + 1:
            prev = o
            continue
        spans.append(f"{start}..{prev}" if prev > start else str(start))
        if o is not None:
            start = prev = o
    return ",".join(spans)


# --- running many schedules -----------------------------------------------------------------


def run_schedule(
    schedule: Schedule, target: Target, committer_cls: type[Committer] = Committer
) -> tuple[list[Failure], Stats]:
    """Reset the target, run one schedule, return its failures (none: it passed)."""
    target.reset()
    sim = Simulation(schedule, target, committer_cls)
    failures = sim.run()
    return failures, sim.stats


def shrink(
    schedule: Schedule,
    target: Target,
    committer_cls: type[Committer] = Committer,
    *,
    budget: int = 400,
) -> tuple[Schedule, list[Failure]]:
    """A smaller schedule that fails the same way (greedy delta debugging over its events).

    Removes chunks of events (halves, quarters... single events) while the failure of
    the same kind persists, then strips faults and limits from what is left.
    """
    failures, _ = run_schedule(schedule, target, committer_cls)
    if not failures:
        return schedule, []
    kind = failures[0].kind
    runs = 0

    def fails(candidate: Schedule) -> list[Failure] | None:
        nonlocal runs
        runs += 1
        got, _ = run_schedule(candidate, target, committer_cls)
        return got if any(f.kind == kind for f in got) else None

    best, best_failures = schedule, failures
    events = list(schedule.events)
    n = 2
    while events and runs < budget:
        chunk = max(1, len(events) // n)
        for i in range(0, len(events), chunk):
            candidate = replace(best, events=tuple(events[:i] + events[i + chunk :]))
            got = fails(candidate)
            if got is not None:
                best, best_failures, events = candidate, got, list(candidate.events)
                n = max(n - 1, 2)
                break
        else:
            if chunk == 1:
                break
            n = min(len(events), n * 2)
    for i, e in enumerate(list(best.events)):  # simpler events, one at a time
        for simpler in _simpler(e):
            if runs >= budget:
                break
            events = list(best.events)
            events[i] = simpler
            candidate = replace(best, events=tuple(events))
            got = fails(candidate)
            if got is not None:
                best, best_failures = candidate, got
                break
    return best, best_failures


def _simpler(e: Event) -> list[Event]:
    if isinstance(e, Step):
        out: list[Event] = []
        if e.crash or e.drop or e.fail or e.freeze:
            out.append(Step(e.nodata))
        if e.nodata:
            out.append(replace(e, nodata=False))
        return out
    if isinstance(e, Start) and (e.max_per_partition or e.max_total):
        return [replace(e, max_per_partition=None, max_total=None)]
    return []


@dataclass
class Summary:
    """The outcome of many schedules."""

    schedules: int = 0
    seconds: float = 0.0
    failed: list[tuple[int, list[Failure]]] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)

    @property
    def rate(self) -> float:
        return self.schedules / self.seconds if self.seconds else 0.0


def run_schedules(
    target: Target,
    seeds: Sequence[int] | range,
    committer_cls: type[Committer] = Committer,
    *,
    with_restore: bool = False,
    stop_at_first: bool = False,
    progress: Callable[[Summary], None] | None = None,
) -> Summary:
    """Run the schedule of every seed in ``seeds`` against ``target``."""
    summary = Summary()
    started = time.perf_counter()
    for seed in seeds:
        schedule = generate(seed, with_restore=with_restore)
        failures, stats = run_schedule(schedule, target, committer_cls)
        summary.schedules += 1
        summary.stats.add(stats)
        if failures:
            summary.failed.append((seed, failures))
            if stop_at_first:
                break
        if progress is not None and summary.schedules % 1000 == 0:
            summary.seconds = time.perf_counter() - started
            progress(summary)
    summary.seconds = time.perf_counter() - started
    return summary


def sqlite_url(worker: int = 0) -> str:
    """A SQLite file for one worker, in /dev/shm when it exists (memory, no disk syncs)."""
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(os.environ.get("TMPDIR", "/tmp"))
    return f"sqlite:///{base / f'sparkonce-sim-{os.getpid()}-{worker}.db'}"


def remove_sqlite(url: str) -> None:
    path = StoreURL.parse(url).path
    if path is None:
        return
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{path}{suffix}")


@dataclass(frozen=True)
class Campaign:
    """Many schedules: which store and sink, which seeds, how many processes."""

    store: Literal["sqlite", "postgres"] = "sqlite"
    url: str = ""  # PostgreSQL; SQLite uses one file per worker (sqlite_url)
    sink: SinkKind = "sql"
    seed: int = 0
    schedules: int = 1000
    workers: int = 1
    with_restore: bool = False
    fresh_connections: bool = False

    def replay_command(self, seed: int) -> str:
        cmd = f"python -m sparkonce.verify.simulation --store {self.store} --replay {seed}"
        if self.store == "postgres":
            cmd += " --url URL"
        if self.sink != "sql":
            cmd += f" --sink {self.sink}"
        return cmd + (" --restore" if self.with_restore else "")


def _worker(job: tuple[Campaign, int, int, int]) -> Summary:
    c, worker, first, count = job
    url = sqlite_url(worker) if c.store == "sqlite" else c.url
    target = Target(
        url,
        sink=c.sink,
        pipeline=f"sim-{worker}",
        table=f"sim_out_{worker}",
        fresh_connections=c.fresh_connections,
    )
    try:
        return run_schedules(target, range(first, first + count), with_restore=c.with_restore)
    finally:
        target.close()
        if c.store == "sqlite":
            remove_sqlite(url)


def run_parallel(c: Campaign) -> Summary:
    """Split seeds ``c.seed .. c.seed + c.schedules - 1`` over ``c.workers`` processes."""
    w = c.workers
    per = [c.schedules // w + (1 if i < c.schedules % w else 0) for i in range(w)]
    jobs = []
    first = c.seed
    for i, n in enumerate(per):
        jobs.append((c, i, first, n))
        first += n
    started = time.perf_counter()
    if w == 1:
        parts = [_worker(jobs[0])]
    else:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(w) as pool:
            parts = pool.map(_worker, jobs)
    total = Summary()
    for part in parts:
        total.schedules += part.schedules
        total.failed += part.failed
        total.stats.add(part.stats)
    total.seconds = time.perf_counter() - started
    return total


# --- the command line ----------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m sparkonce.verify.simulation",
        description="Seeded schedules of runs, crashes, dropped connections and zombies, "
        "driving the real committer against a real store; invariants checked after each.",
    )
    p.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    p.add_argument("--url", help="PostgreSQL URL (--store postgres)")
    p.add_argument("--sink", choices=("sql", "twophase"), default="sql")
    p.add_argument("--schedules", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0, help="first seed (schedule i has seed+i)")
    p.add_argument("--workers", type=int, default=1, help="processes (SQLite: one file each)")
    p.add_argument("--replay", type=int, metavar="SEED", help="run one schedule, print it")
    p.add_argument("--events", help="with --replay: the events as JSON (a shrunk schedule)")
    p.add_argument("--no-shrink", action="store_true", help="print failures unshrunk")
    p.add_argument(
        "--restore",
        action="store_true",
        help="also restore old checkpoint backups (finds a known protocol bug today)",
    )
    p.add_argument("--fresh-connections", action="store_true", help="a new connection per run")
    p.add_argument("--profile", action="store_true", help="cProfile the run (one worker)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # The committer logs every injected drop and retry; thousands of schedules inject many.
    logging.getLogger("sparkonce").setLevel(logging.ERROR)
    if args.store == "postgres" and not args.url:
        print("error: --store postgres needs --url postgresql://...", file=sys.stderr)
        return 2
    campaign = Campaign(
        store=args.store,
        url=args.url or "",
        sink=args.sink,
        seed=args.seed,
        schedules=args.schedules,
        workers=1 if args.profile else args.workers,
        with_restore=args.restore,
        fresh_connections=args.fresh_connections,
    )
    if args.replay is not None:
        return _replay(args, campaign)
    if args.profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        summary = prof.runcall(run_parallel, campaign)
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    else:
        summary = run_parallel(campaign)
    print(
        f"{summary.schedules} schedules ({campaign.store}, {campaign.sink} sink, "
        f"{campaign.workers} worker(s)) in {summary.seconds:.1f} s: {summary.rate:.0f} "
        f"schedules/s; {len(summary.failed)} failed"
    )
    print(f"  {summary.stats}")
    for seed, failures in summary.failed[:5]:
        more = f" (+{len(failures) - 1})" if failures[1:] else ""
        print(f"  seed {seed}: {failures[0]}{more}")
    if summary.failed:
        print(f"replay and shrink the first: {campaign.replay_command(summary.failed[0][0])}")
        return 1
    return 0


def _replay(args: argparse.Namespace, c: Campaign) -> int:
    url = sqlite_url() if c.store == "sqlite" else c.url
    target = Target(url, sink=c.sink)
    try:
        schedule = generate(args.replay, with_restore=c.with_restore)
        if args.events:
            schedule = replace(schedule, events=Schedule.parse_events(args.events))
        print(schedule.describe())
        failures, stats = run_schedule(schedule, target)
        print(f"  {stats}")
        if not failures:
            print("passed: every invariant holds")
            return 0
        print(f"FAILED ({len(failures)}):")
        for f in failures:
            print(f"  {f}")
        if not args.no_shrink:
            small, small_failures = shrink(schedule, target)
            print(f"\nshrunk to {len(small.events)} of {len(schedule.events)} events:")
            print(small.describe())
            for f in small_failures:
                print(f"  {f}")
            print(
                f"replay exactly: {c.replay_command(args.replay)} --events '{small.events_json()}'"
            )
        return 1
    finally:
        target.close()
        if c.store == "sqlite":
            remove_sqlite(url)


if __name__ == "__main__":
    sys.exit(main())
