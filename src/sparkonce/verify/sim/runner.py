"""Running many schedules: one target, lanes of threads, processes; shrinking failures.

A **lane** is one simulation at a time in its own namespace of the store (pipeline
name, table, topics). Several lanes in one process overlap the round trips of a
server store (PostgreSQL, Kafka); several processes use more cores. Every schedule
is still run alone in its lane, event after event, so its outcome depends only on
its seed: a failing seed replays the same way with ``--replay``, on one lane.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from sparkonce.commit import CORRECT_STEPS, CommitSteps
from sparkonce.verify.sim.core import Simulation
from sparkonce.verify.sim.schedule import Schedule, generate, simpler
from sparkonce.verify.sim.target import Target
from sparkonce.verify.sim.world import Failure, Stats

StoreName = Literal["sqlite", "postgres", "kafka", "delta", "iceberg"]


def run_schedule(
    schedule: Schedule, target: Target, steps: CommitSteps = CORRECT_STEPS
) -> tuple[list[Failure], Stats]:
    """Reset the target, run one schedule, return its failures (none: it passed).

    ``steps``: the committer's steps (:mod:`sparkonce.commit.steps`); tests plant bugs here.
    """
    target.reset()
    sim = Simulation(schedule, target, steps)
    failures = sim.run()
    return failures, sim.stats


def shrink(
    schedule: Schedule,
    target: Target,
    steps: CommitSteps = CORRECT_STEPS,
    *,
    budget: int = 400,
    seconds: float = 120.0,
) -> tuple[Schedule, list[Failure]]:
    """A smaller schedule that fails the same way (greedy delta debugging over its events).

    Removes chunks of events (halves, quarters... single events) while a failure of the
    same kind persists, then simplifies what is left one event at a time (no fault, no
    read limits, no restore). Stops after ``budget`` runs or ``seconds``.
    """
    failures, _ = run_schedule(schedule, target, steps)
    if not failures:
        return schedule, []
    kind = failures[0].kind
    runs = 0
    deadline = time.monotonic() + seconds

    def out_of_budget() -> bool:
        return runs >= budget or time.monotonic() > deadline

    def fails(candidate: Schedule) -> list[Failure] | None:
        nonlocal runs
        runs += 1
        got, _ = run_schedule(candidate, target, steps)
        return got if any(f.kind == kind for f in got) else None

    best, best_failures = schedule, failures
    events = list(schedule.events)
    n = 2
    while events and not out_of_budget():
        chunk = max(1, len(events) // n)
        for i in range(0, len(events), chunk):
            if out_of_budget():
                break
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
    changed = True
    while changed and not out_of_budget():  # simpler events, one at a time
        changed = False
        for i, e in enumerate(list(best.events)):
            for simple in simpler(e):
                if out_of_budget():
                    break
                events = list(best.events)
                events[i] = simple
                candidate = replace(best, events=tuple(events))
                got = fails(candidate)
                if got is not None:
                    best, best_failures, changed = candidate, got, True
                    break
    return best, best_failures


@dataclass
class Summary:
    """The outcome of many schedules."""

    schedules: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the processes that ran them (this one's threads)
    failed: list[tuple[int, list[Failure]]] = field(default_factory=list)
    failed_count: int = 0
    stats: Stats = field(default_factory=Stats)

    KEEP = 50  # failures kept with their details

    @property
    def rate(self) -> float:
        return self.schedules / self.seconds if self.seconds else 0.0

    def add_failure(self, seed: int, failures: list[Failure]) -> None:
        self.failed_count += 1
        if len(self.failed) < self.KEEP:
            self.failed.append((seed, failures))

    def merge(self, other: Summary) -> None:
        self.schedules += other.schedules
        self.cpu_seconds += other.cpu_seconds
        self.failed_count += other.failed_count
        self.failed = sorted(self.failed + other.failed)[: self.KEEP]
        self.stats.add(other.stats)


def run_schedules(
    target: Target,
    seeds: Iterable[int],
    steps: CommitSteps = CORRECT_STEPS,
    *,
    with_restore: bool = True,
    stop_at_first: bool = False,
    progress: Callable[[int, Stats, int, list[Failure]], None] | None = None,
) -> Summary:
    """Run the schedule of every seed in ``seeds`` against ``target``, one after another.

    ``progress(seed, stats, failed, failures)`` is called after each schedule.
    """
    summary = Summary()
    started = time.perf_counter()
    cpu = time.process_time()
    for seed in seeds:
        failures, stats = run_schedule(generate(seed, with_restore=with_restore), target, steps)
        summary.schedules += 1
        summary.stats.add(stats)
        if failures:
            summary.add_failure(seed, failures)
        if progress is not None:
            progress(seed, stats, len(failures) > 0, failures)
        if failures and stop_at_first:
            break
    summary.seconds = time.perf_counter() - started
    summary.cpu_seconds = time.process_time() - cpu
    return summary


# --- what to run against ---------------------------------------------------------------------


@dataclass(frozen=True)
class TargetSpec:
    """How to build a lane's target (picklable: worker processes build their own).

    ``url``: the PostgreSQL URL, or the Kafka bootstrap servers. ``namespace`` keeps
    the pipelines, tables and topics of one campaign apart from any other's.
    """

    store: StoreName = "sqlite"
    url: str = ""
    sink: str = "sql"
    fresh_connections: bool = False
    namespace: str = ""

    def build(self, worker: int = 0, lane: int = 0) -> Target:
        ns = self.namespace or uuid.uuid4().hex[:8]
        if self.store == "sqlite":
            from sparkonce.verify.sim.sql import SqlTarget, remove_sqlite, sqlite_url

            url = sqlite_url(f"{ns}-{worker}-{lane}")
            remove_sqlite(url)
            return SqlTarget(
                url, sink=self.sink, fresh_connections=self.fresh_connections, owns_store=True
            )
        if self.store == "postgres":
            from sparkonce.verify.sim.sql import SqlTarget

            if not self.url:
                raise ValueError("the postgres store needs a URL")
            return SqlTarget(
                self.url,
                sink=self.sink,
                pipeline=f"sim_{ns}_{worker}_{lane}",
                table=f"sim_{ns}_{worker}_{lane}",
                fresh_connections=self.fresh_connections,
            )
        if self.store == "kafka":
            from sparkonce.verify.sim.kafka import KafkaTarget

            if not self.url:
                raise ValueError("the kafka store needs the bootstrap servers")
            return KafkaTarget(self.url, name=f"sim-{ns}-{worker}-{lane}")
        if self.store == "delta":
            from sparkonce.verify.sim.delta import DeltaTarget

            return DeltaTarget(pipeline=f"sim_{ns}_{worker}_{lane}")
        if self.store == "iceberg":
            from sparkonce.verify.sim.iceberg import IcebergTarget

            return IcebergTarget(pipeline=f"sim_{ns}_{worker}_{lane}")
        raise ValueError(f"unknown store {self.store!r}")

    def replay_command(self, seed: int, *, with_restore: bool = True) -> str:
        cmd = f"python -m sparkonce.verify.sim --store {self.store} --replay {seed}"
        if self.store == "postgres":
            cmd += " --url URL"
        if self.store == "kafka":
            cmd += " --bootstrap HOST:PORT"
        if self.sink == "twophase":
            cmd += " --sink twophase"
        return cmd + ("" if with_restore else " --no-restore")


def close_target(target: Target) -> None:
    """Close a target, whatever state its store is in (a SQLite file of its own goes too)."""
    with contextlib.suppress(Exception):
        target.close()


@dataclass(frozen=True)
class Campaign:
    """Many schedules: which target, which seeds, how many processes and lanes."""

    target: TargetSpec = field(default_factory=TargetSpec)
    seed: int = 0
    schedules: int = 1000
    workers: int = 1  # processes
    lanes: int = 1  # concurrent schedules per process (threads), each in its own namespace
    with_restore: bool = True
    stop_at_first: bool = False
    steps: CommitSteps = CORRECT_STEPS
    # Time box: no schedule starts after this many seconds (those under way finish), so
    # the campaign checks as many schedules as fit, up to ``schedules``.
    seconds: float | None = None

    def replay_command(self, seed: int) -> str:
        return self.target.replay_command(seed, with_restore=self.with_restore)


class _Seeds:
    """Hands out the campaign's seeds to lanes and processes, in small chunks."""

    CHUNK = 16

    def __init__(
        self, first: int, count: int, shared: Any = None, stop_at: float | None = None
    ) -> None:
        self.first = first
        self.end = first + count
        self._shared = shared  # a multiprocessing Value (next seed) shared by processes
        self._stop_at = stop_at  # time.time() after which no schedule starts
        self._lock = threading.Lock()
        self._next = first
        self._mine: list[int] = []
        self.stop = False

    def take(self) -> int | None:
        with self._lock:
            if self.stop or (self._stop_at is not None and time.time() >= self._stop_at):
                return None
            if not self._mine:
                lo = self._claim()
                if lo >= self.end:
                    return None
                self._mine = list(range(lo, min(lo + self.CHUNK, self.end)))[::-1]
            return self._mine.pop()

    def _claim(self) -> int:
        if self._shared is None:
            lo, self._next = self._next, self._next + self.CHUNK
            return lo
        with self._shared.get_lock():
            lo = int(self._shared.value)
            self._shared.value = lo + self.CHUNK
        return lo


@dataclass
class _Progress:
    """Shared counters a worker updates (``done``, ``failed``) and a failure queue."""

    done: Any = None  # multiprocessing Value or None
    failed: Any = None
    queue: Any = None
    local: Callable[[int, Stats, int, list[Failure]], None] | None = None

    def update(self, seed: int, stats: Stats, failed: int, failures: list[Failure]) -> None:
        if self.done is not None:
            with self.done.get_lock():
                self.done.value += 1
            if failed:
                with self.failed.get_lock():
                    self.failed.value += 1
                if self.queue is not None:
                    self.queue.put((seed, [(f.kind, f.detail) for f in failures]))
        if self.local is not None:
            self.local(seed, stats, failed, failures)


def _run_lanes(c: Campaign, worker: int, seeds: _Seeds, progress: _Progress) -> Summary:
    """Run lanes (threads) in this process until the seeds run out."""
    lock = threading.Lock()
    total = Summary()
    errors: list[BaseException] = []

    def lane(index: int) -> None:
        try:
            target = c.target.build(worker, index)
        except BaseException as exc:
            errors.append(exc)
            seeds.stop = True
            return
        part = Summary()
        try:
            while (seed := seeds.take()) is not None:
                schedule = generate(seed, with_restore=c.with_restore)
                failures, stats = run_schedule(schedule, target, c.steps)
                part.schedules += 1
                part.stats.add(stats)
                if failures:
                    part.add_failure(seed, failures)
                    if c.stop_at_first:
                        seeds.stop = True
                progress.update(seed, stats, len(failures) > 0, failures)
        except BaseException as exc:
            errors.append(exc)
            seeds.stop = True
        finally:
            close_target(target)
            with lock:
                total.merge(part)

    cpu = time.process_time()
    if c.lanes == 1:
        lane(0)
    else:
        threads = [
            threading.Thread(target=lane, args=(i,), name=f"sim-lane-{i}", daemon=True)
            for i in range(c.lanes)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    total.cpu_seconds = time.process_time() - cpu
    if errors:
        raise errors[0]
    return total


def _worker(
    c: Campaign,
    worker: int,
    shared: Any,
    done: Any,
    failed: Any,
    queue: Any,
    results: Any,
    stop_at: float | None,
) -> None:
    import logging

    logging.getLogger("sparkonce").setLevel(logging.ERROR)
    try:
        seeds = _Seeds(c.seed, c.schedules, shared, stop_at)
        results.put((worker, _run_lanes(c, worker, seeds, _Progress(done, failed, queue)), None))
    except BaseException as exc:
        results.put((worker, None, f"{type(exc).__name__}: {exc}"))


def run_campaign(
    c: Campaign,
    *,
    progress: Callable[[int, int], None] | None = None,
    on_failure: Callable[[int, list[Failure]], None] | None = None,
    interval: float = 0.5,
) -> Summary:
    """Run seeds ``c.seed .. c.seed + c.schedules - 1`` on ``c.workers`` processes of
    ``c.lanes`` lanes each. ``progress(done, failed)`` is called every ``interval`` s."""
    started = time.perf_counter()
    stop_at = None if c.seconds is None else time.time() + c.seconds
    if c.workers <= 1:
        done = [0, 0]

        def local(seed: int, stats: Stats, failed: int, failures: list[Failure]) -> None:
            done[0] += 1
            done[1] += failed
            if failed and on_failure is not None:
                on_failure(seed, failures)

        ticker = _Ticker(lambda: progress(done[0], done[1]) if progress else None, interval)
        with ticker:
            seeds = _Seeds(c.seed, c.schedules, stop_at=stop_at)
            total = _run_lanes(c, 0, seeds, _Progress(local=local))
        total.seconds = time.perf_counter() - started
        return total
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["sparkonce.verify.sim"])
    shared = ctx.Value("q", c.seed)
    done_v = ctx.Value("q", 0)
    failed_v = ctx.Value("q", 0)
    queue = ctx.Queue() if on_failure is not None else None

    def poll() -> None:
        if queue is not None:
            while True:
                try:
                    seed, items = queue.get_nowait()
                except Exception:
                    break
                assert on_failure is not None
                on_failure(seed, [Failure(k, d) for k, d in items])
        if progress is not None:
            progress(int(done_v.value), int(failed_v.value))

    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_worker,
            args=(c, i, shared, done_v, failed_v, queue, results, stop_at),
            name=f"sim-worker-{i}",
            daemon=True,
        )
        for i in range(c.workers)
    ]
    for proc in procs:
        proc.start()
    parts: list[Summary] = []
    errors: list[str] = []
    try:
        while len(parts) + len(errors) < len(procs):
            try:
                _i, part, error = results.get(timeout=interval)
            except Exception:  # queue.Empty
                poll()
                if not any(p.is_alive() for p in procs) and results.empty():
                    errors.append("a worker process died")
                continue
            if part is not None:
                parts.append(part)
            if error is not None:
                errors.append(error)
        poll()
    finally:
        for proc in procs:
            proc.join(timeout=10)
            if proc.is_alive():
                proc.terminate()
    if errors:
        raise RuntimeError(f"simulation worker failed: {errors[0]}")
    total = Summary()
    for part in parts:
        total.merge(part)
    total.seconds = time.perf_counter() - started
    return total


class _Ticker:
    """Calls ``fn`` every ``interval`` seconds from a background thread while entered."""

    def __init__(self, fn: Callable[[], Any], interval: float) -> None:
        self._fn = fn
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> _Ticker:
        def loop() -> None:
            while not self._stop.wait(self._interval):
                self._fn()

        self._thread = threading.Thread(target=loop, name="sim-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._fn()


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1
