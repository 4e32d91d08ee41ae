"""The store a simulation runs against, and a stand-in for Spark's executors.

A :class:`Target` is one namespace in one store (a pipeline name and its output: a
table, or a pair of topics) that one simulation lane uses, schedule after schedule.
It hands out :class:`Endpoint` s (what one run, one driver process, holds: its ledger
store and its stager, both the sink's real classes), empties its namespace between
schedules, and reads back what readers see for the invariant checks.

Sinks whose ``prepare`` starts Spark tasks (the two-phase and Kafka sinks) get a
:class:`TaskFrame` in place of the batch's DataFrame: the sink's own ``prepare`` runs,
and so do its own task functions, in this process, one task after the other, with a
:class:`pyspark.TaskContext` stand-in that gives each task its partition id and attempt
number. With ``fail``, each task's first attempt fails and is retried, as Spark would.
"""

from __future__ import annotations

import functools
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from sparkonce.commit import Stager
from sparkonce.ledger.base import LedgerEntry, LedgerStore, Owner
from sparkonce.offsets import BatchRanges, TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.commit import Staged
    from sparkonce.ledger.base import BatchContext


class Observer(Protocol):
    """Receives the ledger entries of every store transaction that committed."""

    def committed(self, entries: list[LedgerEntry]) -> None: ...


class ObservedStore(LedgerStore):
    """A real ledger store that also reports each committed transaction's entries to
    ``observer``, after its COMMIT returned (so an entry is reported only if its
    transaction really committed: a rollback, a crash or a lost connection raise first),
    and that loses the acknowledgement of its next ``lose_ack`` commits. It goes first
    among the bases: ``class ObservedSqlStore(ObservedStore, SqlLedgerStore)``."""

    observer: Observer | None = None
    lose_ack = 0  # fault: this many next commits succeed but the caller gets an error
    _recording: list[LedgerEntry] | None = None

    @abstractmethod
    def _lost_ack(self) -> Exception:
        """The error a caller sees when its commit went through but the answer was lost."""

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        recorded: list[LedgerEntry] = []
        self._recording = recorded
        with super().transaction() as txn:  # type: ignore[safe-super]  # the real store's
            yield txn
        self._recording = None
        if recorded and self.observer is not None:
            self.observer.committed(recorded)
        if self.lose_ack:
            self.lose_ack -= 1
            raise self._lost_ack()

    def record(self, txn: Any, entry: LedgerEntry) -> None:
        super().record(txn, entry)  # type: ignore[safe-super]  # the real store's
        if self._recording is not None:
            self._recording.append(entry)


@dataclass
class Endpoint:
    """What one run (one process) holds: its ledger store (observed) and its stager."""

    store: Any  # the sink's LedgerStore, subclassed to report commits (observer, lose_ack)
    stager: Stager
    sink: Any = None  # the sink whose store and stager these are, when the target needs it


class Running(Protocol):
    """What a target reads of one run (``world.Run``): the endpoint its driver holds."""

    @property
    def endpoint(self) -> Endpoint: ...


Row = tuple[Any, ...]  # an output row as the simulation writes and reads it: (p, o, v, epoch)


@dataclass(frozen=True)
class Planned:
    """One batch in a checkpoint's offset log."""

    batch_id: int
    ranges: BatchRanges
    nodata: bool
    quiet: bool = False  # a no-data batch that emits no row

    @functools.cached_property
    def ends(self) -> dict[TopicPartition, int]:
        return self.ranges.ends()


class Entry(NamedTuple):
    """A ledger entry as the invariant checks read it back from the store."""

    seq: int
    ranges: BatchRanges  # None until resolved, when only ``ranges_json`` was read back
    epoch: int
    row_count: int
    spark_batch_id: int | None
    checkpoint_id: str | None
    ranges_json: str | None = None

    @classmethod
    def of(cls, e: LedgerEntry) -> Entry:
        return cls(e.seq, e.ranges, e.epoch, e.row_count, e.spark_batch_id, e.checkpoint_id)


StageFn = Callable[[int], "Staged"]


class FrameStage:
    """A stage function that runs the sink's ``prepare`` on a :class:`TaskFrame`."""

    def __init__(self, fn: StageFn, frame: TaskFrame) -> None:
        self._fn = fn
        self.frame = frame

    def __call__(self, seq: int) -> Staged:
        return self._fn(seq)


class Target(ABC):
    """One namespace in one store, used by one simulation lane (see the module docstring)."""

    store_name: str = ""  # "sqlite", "postgres", "kafka"
    sink: str = "sql"
    pipeline: str = "sim"
    # Whether the committer retries a lost connection (SQL: yes; Kafka: the run stops).
    retries_connection_faults: bool = True
    # The error a run stops with when its store connection is lost (stores that do not
    # retry); with a retrying store, an injected drop must not surface at all.
    connection_fault_error: type[BaseException] | tuple[type[BaseException], ...] = ()
    # Whether a batch's rows become visible before its ledger entry (Kafka: per task).
    tasks_commit_early: bool = False

    def acquire(self, ep: Endpoint) -> Owner:
        """A new run takes the next epoch, as the sink's ``acquire`` does."""
        return ep.store.acquire(self.pipeline)

    @abstractmethod
    def take(self) -> Endpoint:
        """A run's endpoint (pooled: a dead process's session is, to the store, gone)."""

    @abstractmethod
    def give_back(self, ep: Endpoint) -> None:
        """The run is over (dead or done): roll back what its session left open."""

    @abstractmethod
    def reset(self) -> None:
        """Empty this namespace: output, owner and ledger."""

    @abstractmethod
    def visible_rows(self) -> list[Row]:
        """What readers see: ``(p, o, v, epoch)`` rows."""

    @abstractmethod
    def ledger(self) -> list[Entry]:
        """The pipeline's ledger, read back from the store, oldest first."""

    @abstractmethod
    def owner_epoch(self) -> int | None:
        """The owner's epoch, read back from the store."""

    @abstractmethod
    def stage(
        self, run: Running, ctx: BatchContext, batch: Planned, rows: list[Row], fail: bool
    ) -> tuple[StageFn, list[int], list[int]]:
        """The stage function of a commit.

        Returns ``(stage, attempts, failed)``: two-phase only, ``stage`` fills
        ``attempts`` with the task attempts Spark reports successful and ``failed``
        with the failed ones.
        """

    def check_after_event(self, failed_attempts: list[int]) -> int:
        """Two-phase: how many rows of ``failed_attempts`` readers see."""
        return 0

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections and files."""

    def describe(self) -> str:
        return f"{self.store_name} ({self.sink} sink)"


# --- a stand-in for Spark's executors ------------------------------------------------------


class _TaskContext:
    """What the sinks' task functions ask ``pyspark.TaskContext.get()``."""

    def __init__(self, partition: int, attempt: int) -> None:
        self._partition = partition
        self._attempt = attempt

    def partitionId(self) -> int:
        return self._partition

    def attemptNumber(self) -> int:
        return self._attempt


_tls = threading.local()
_patch_lock = threading.Lock()
_patched = False


def _install_task_context() -> None:
    """Make ``TaskContext.get()`` return this thread's stand-in while a task runs."""
    global _patched
    with _patch_lock:
        if _patched:
            return
        from pyspark import TaskContext

        original = TaskContext.get

        def get(cls: Any) -> Any:
            ctx = getattr(_tls, "task", None)
            return ctx if ctx is not None else original()

        TaskContext.get = classmethod(get)  # type: ignore[method-assign,assignment]
        _patched = True


class TaskFailure(RuntimeError):
    """An injected task failure (Spark retries the task)."""


class TaskFrame:
    """A batch's DataFrame, as far as the sinks' ``prepare`` uses it.

    ``tasks`` holds each task's Arrow batch (``None``: a task with no rows).
    ``mapInArrow(f, schema)`` runs ``f`` once per task, in this thread; with ``fail``
    each task's first attempt fails (even partitions while writing, before their
    transaction ends; odd partitions after it committed) and is run again as attempt 1.
    ``outputs`` and ``failed`` collect what the successful and failed attempts returned.
    """

    def __init__(self, schema: Any, tasks: list[Any], *, fail: bool = False) -> None:
        _install_task_context()
        self.schema = schema
        self.tasks = tasks
        self.fail = fail
        self.outputs: list[dict[str, Any]] = []
        self.failed: list[dict[str, Any]] = []
        self.before_tasks: Callable[[], None] | None = None  # runs before the first task

    @property
    def wrote(self) -> bool:
        """Whether a task attempt wrote its rows (Kafka: committed them, not finding its
        marker; two-phase: pre-committed them, invisible until the driver's commit)."""
        return any(o.get("skipped") is False for o in (*self.outputs, *self.failed))

    def mapInArrow(self, func: Callable[[Iterator[Any]], Iterator[Any]], schema: Any) -> _Mapped:
        return _Mapped(self, func)

    def _run(self, func: Callable[[Iterator[Any]], Iterator[Any]]) -> list[dict[str, Any]]:
        if self.before_tasks is not None:
            self.before_tasks()
        for pid, batch in enumerate(self.tasks):
            data = [] if batch is None else [batch]
            attempt = 0
            if self.fail:
                ok, out = self._attempt(func, pid, 0, data, fail=True)
                if ok:  # it finished without reading its input (nothing left to write)
                    self.outputs += out
                    continue
                attempt = 1
            self.outputs += self._attempt(func, pid, attempt, data, fail=False)[1]
        return self.outputs

    def _attempt(
        self,
        func: Callable[[Iterator[Any]], Iterator[Any]],
        pid: int,
        attempt: int,
        data: list[Any],
        *,
        fail: bool,
    ) -> tuple[bool, list[dict[str, Any]]]:
        """One task attempt; ``(succeeded, what it returned)``."""
        _tls.task = _TaskContext(pid, attempt)
        try:
            out: list[dict[str, Any]] = []
            if fail and pid % 2 == 0:
                try:
                    for rb in func(_failing(data)):
                        out += rb.to_pylist()
                except TaskFailure:
                    return False, []
                return True, out
            for rb in func(iter(data)):
                out += rb.to_pylist()
            if fail:  # the attempt's work is done, then it fails: Spark retries it
                self.failed += out
                return False, []
            return True, out
        finally:
            _tls.task = None


def _failing(data: list[Any]) -> Iterator[Any]:
    yield from data
    raise TaskFailure("injected task failure while writing")


class _Mapped:
    def __init__(self, frame: TaskFrame, func: Callable[[Iterator[Any]], Iterator[Any]]) -> None:
        self._frame = frame
        self._func = func

    def collect(self) -> list[dict[str, Any]]:
        return self._frame._run(self._func)

    def toArrow(self) -> Any:
        return _Rows(self._frame._run(self._func))


class _Rows:
    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._rows = rows

    def to_pylist(self) -> list[dict[str, Any]]:
        return self._rows
