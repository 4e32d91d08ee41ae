"""What a simulation keeps about the world: checkpoints, runs, zombies, outcomes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, Literal

from sparkonce.offsets import TopicPartition
from sparkonce.verify.sim.target import Planned

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.commit import Committer, Staged
    from sparkonce.ledger.base import BatchContext, CommitResult
    from sparkonce.verify.sim.target import Endpoint

THREAD_TIMEOUT_S = 120.0  # a simulated thread that neither freezes nor ends in this time hangs


class SimCrash(BaseException):
    """A simulated process death at a crash point (a ``BaseException``, like SIGKILL:
    no ``except Exception`` cleanup runs)."""


class InjectedFailure(RuntimeError):
    """A failed batch (a task failure that fails the query): the run stops."""


def crash() -> None:
    raise SimCrash()


@dataclass(frozen=True)
class Failure:
    """A broken invariant: ``kind`` groups failures (shrinking keeps the kind)."""

    kind: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.kind}] {self.detail}"


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
    refused: int = 0  # a run refused to continue (restored checkpoint, partly committed batch)

    def add(self, other: Stats) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def __str__(self) -> str:
        return ", ".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


# --- zombies ---------------------------------------------------------------------------------


class _Worker(threading.Thread):
    """A reusable thread for zombies' commits (starting a thread per zombie costs more)."""

    def __init__(self, pool: list[_Worker]) -> None:
        super().__init__(name="sim-zombie", daemon=True)
        self._pool = pool
        self._job: Callable[[], None] | None = None
        self._go = threading.Event()

    def submit(self, job: Callable[[], None]) -> None:
        self._job = job
        self._go.set()

    def run(self) -> None:
        while True:
            self._go.wait()
            self._go.clear()
            job, self._job = self._job, None
            if job is None:
                return
            try:
                job()
            finally:
                self._pool.append(self)


_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _run_in_worker(job: Callable[[], None]) -> None:
    with _idle_lock:
        worker = _idle.pop() if _idle else None
    if worker is None:
        worker = _Worker(_idle)
        worker.start()
    worker.submit(job)


class Zombie:
    """A run frozen after staging, before its transaction: a thread blocked in ``stage``.

    Sinks whose tasks commit (Kafka) may freeze it earlier instead, before its tasks
    start (:meth:`freeze_here` as the :class:`~sparkonce.verify.sim.target.TaskFrame`'s
    ``before_tasks`` hook): the zombie's tasks then write after it was fenced.
    """

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
        self.frame: Any = None  # the stage's TaskFrame, if its sink runs tasks
        self.paused = threading.Event()  # set when frozen, and when the commit ended
        self.ended = threading.Event()
        self.thawed = threading.Event()
        self.kill = False
        self.froze = False
        self.staged = False  # stage() returned: the batch's tasks ran (Kafka: committed)
        self.result: CommitResult | None = None
        self.error: BaseException | None = None

    def stage(self, seq: int) -> Staged:
        staged = self._stage(seq)
        self.staged = True
        if not self.froze:
            self.freeze_here()
        return staged

    def freeze_here(self) -> None:
        """Freeze this thread until thawed (in ``stage``, or earlier: a sink's hook)."""
        self.froze = True
        self.paused.set()
        self.thawed.wait()
        if self.kill:
            raise SimCrash()

    def _main(self) -> None:
        try:
            self.result = self.committer.commit_with(self.ctx, self.stage)
        except BaseException as exc:
            self.error = exc
        finally:
            self.ended.set()
            self.paused.set()

    def start(self) -> None:
        _run_in_worker(self._main)
        if not self.paused.wait(THREAD_TIMEOUT_S):
            raise RuntimeError("a zombie's commit neither froze nor ended")

    def thaw(self, kill: bool) -> None:
        self.kill = kill
        self.thawed.set()
        if not self.ended.wait(THREAD_TIMEOUT_S):
            raise RuntimeError("a thawed zombie's commit did not end")


def short(exc: BaseException) -> str:
    text = str(exc).split(". ")[0]
    return f"{type(exc).__name__}: {text[:200]}"


def spans(offsets: list[int]) -> str:
    out: list[str] = []
    start = prev = offsets[0]
    for o in [*offsets[1:], None]:
        if o is not None and o == prev + 1:
            prev = o
            continue
        out.append(f"{start}..{prev}" if prev > start else str(start))
        if o is not None:
            start = prev = o
    return ",".join(out)
