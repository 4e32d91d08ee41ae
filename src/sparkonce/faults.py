"""The fault plan: which fault to inject where, parsed once, passed explicitly.

The crash tests and ``sparkonce verify`` inject faults into real driver processes
through the environment (see :mod:`sparkonce.protocol` for the variables and
their ``NAME[@N]`` form). Who reads them, and when:

* **The driver.** ``sparkonce run`` parses them once, when it starts
  (:meth:`FaultPlan.from_env`; a bad value stops the run with exit 2 before
  anything happens), and hands the plan to ``Pipeline.run``. The runner gives it to
  the sink (:meth:`~sparkonce.sinks.base.Sink.use_faults`), and the sink to its
  :class:`~sparkonce.commit.Committer`, which marks the crash points. Nothing
  else on the driver reads the environment. A run, sink or committer that is
  given no plan uses :data:`NO_FAULTS`, which injects nothing.
* **Spark's Python workers.** Task hooks (a read task failing halfway, a
  two-phase pre-commit task failing after its pre-commit) call
  :func:`worker_faults`: one plan per worker process, parsed from the worker's
  environment (inherited from the driver through Spark's JVM) the first time a
  task asks, then cached.

With no variable set, every hook returns at its first test: the no-op plan costs
one attribute check per crash point and one cached call per task.

Fault events
------------
A fault that fires is written as one JSON line to the file named by
``SPARKONCE_FAULT_EVENTS`` (when set), *before* it takes effect. So is a run
that ends fenced, which is how a zombie run's end is recognised. Every line is
one object (:class:`FaultEvent`, its codec) with these keys:

``version``
    The format's version (:data:`EVENT_VERSION`; lines written before it have none and
    read as version 1). A line of a newer version stops :func:`read_events` with a
    :class:`~sparkonce.errors.RecordVersionError` (see :mod:`sparkonce.records`).

``event``
    ``"crash"``, ``"pause"``, ``"drop-connection"``, ``"task-failure"``, ``"task-pause"``,
    ``"fenced"``, ``"resend-pause"``, ``"resend-done"`` or ``"phase"``.
``pid``, ``at``
    The process that wrote the line, and when (Unix time, seconds).
``point``, ``hit`` (crash, pause, drop-connection)
    The crash point, and which time this process reached it (1 = first).
``stage``, ``task``, ``attempt`` (task-failure, task-pause)
    ``"read"`` or ``"write"``, the task's data (``topic:partition:start:end``
    for a read, ``pipeline:seq:partition`` for a write, where a Kafka sink's task names
    its partition by its task key), and Spark's attempt number.
``pipeline``, ``epoch``, ``owner_epoch`` (fenced)
    The fenced run's pipeline and epoch, and the newer owner's epoch (``null``
    when the fencing was reported by a Spark task, whose error carries only text).
``name`` (phase)
    A driver's progress, not a fault: ``run-started`` (the run begins, its Spark session
    up) and ``query-started`` (the epoch taken, the streaming query started).
    ``sparkonce verify`` splits a recovery time by them.
``acked``, ``persisted`` (resend-pause); ``resumed_from``, ``sent``, ``records`` (resend-done)
    Written by the producer of a ``resend`` trial (:mod:`sparkonce.verify.resend`), not by
    a driver: the records acknowledged when it stopped to be killed and the count in its
    progress file then; the progress a finished run started from, the records it sent,
    and the records of the source.

For example::

    {"version": 1, "event": "crash", "point": "after-rows", "hit": 2, "pid": 4242,
     "at": 1795367650.4}
    {"event": "task-failure", "stage": "read", "task": "events:1:0:200", "attempt": 0, ...}
    {"event": "fenced", "pipeline": "sums", "epoch": 1, "owner_epoch": 2, ...}

Several processes append to the same file (the driver, and each Python worker
for task failures): each line is written with one ``write`` to a file opened
with ``O_APPEND``, so lines never interleave. The verifier and the crash tests
read these events (:func:`read_events`) instead of matching log text.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparkonce.errors import ConfigError
from sparkonce.protocol import (
    CRASH_ENV,
    DROP_CONNECTION_ENV,
    FAIL_TASKS_ENV,
    PAUSE_ENV,
    PAUSE_TASKS_ENV,
    CrashPoint,
    kill_self,
    parse_crash_spec,
)
from sparkonce.records import VERSION_KEY, record_version

EVENTS_ENV = "SPARKONCE_FAULT_EVENTS"
EVENT_KINDS = (
    "crash",
    "pause",
    "drop-connection",
    "task-failure",
    "task-pause",
    "fenced",
    "resend-pause",
    "resend-done",
)
_TASK_STAGES = ("read", "write")

Spec = tuple[CrashPoint, int]


EVENT_VERSION = 1
NEWER_EVENT = (
    "read the events with the sparkonce that wrote them (the driver's), or run the "
    "campaign and its drivers with one sparkonce"
)


@dataclass(frozen=True)
class FaultEvent:
    """One line of the events file (the module docstring lists the keys of each kind):
    ``event`` (its kind), the kind's own ``fields``, and the writer's ``pid`` and time
    ``at`` (None in a line that lacks them)."""

    event: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    pid: int | None = None
    at: float | None = None

    def encode(self) -> dict[str, Any]:
        return {
            VERSION_KEY: EVENT_VERSION,
            "event": self.event,
            **self.fields,
            "pid": self.pid,
            "at": self.at,
        }

    @classmethod
    def decode(cls, data: Mapping[str, Any], where: str) -> FaultEvent:
        """The event of one decoded line; ``where`` names it (file and line)."""
        record_version(data, EVENT_VERSION, f"fault event {where}", NEWER_EVENT)
        own = {k: v for k, v in data.items() if k not in (VERSION_KEY, "event", "pid", "at")}
        return cls(str(data["event"]), own, data.get("pid"), data.get("at"))

    def as_dict(self) -> dict[str, Any]:
        """The event as :func:`read_events` returns it: ``event``, its fields, and ``pid``
        and ``at`` when the line had them."""
        out: dict[str, Any] = {"event": self.event, **self.fields}
        if self.pid is not None:
            out["pid"] = self.pid
        if self.at is not None:
            out["at"] = self.at
        return out


class InjectedTaskFailure(RuntimeError):
    """A task failure the fault plan asked for; Spark retries the task."""


@dataclass(frozen=True)
class FaultPlan:
    """What to inject in this process; the empty plan injects nothing."""

    crash: Spec | None = None
    pause: Spec | None = None
    drop_connection: Spec | None = None
    fail_tasks: frozenset[str] = frozenset()
    pause_tasks: frozenset[str] = frozenset()
    events: Path | None = None
    # What a crash does: SIGKILL this process (and its group) in real runs. The protocol
    # simulation raises an exception instead, so one process can play many runs.
    on_crash: Callable[[], None] = kill_self
    _hits: dict[CrashPoint, int] = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (a Spark Connect batch function carries the run's plan to the server's
        Python worker): what to inject, not this process's hit counts or lock."""
        state = dict(self.__dict__)
        state["_hits"] = {}
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())  # frozen: no attribute setting

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FaultPlan:
        """Parse the fault variables; a bad value raises ``ConfigError`` naming it."""
        env = os.environ if env is None else env
        specs: dict[str, Spec | None] = {}
        variables = (("crash", CRASH_ENV), ("pause", PAUSE_ENV), ("drop", DROP_CONNECTION_ENV))
        for name, var in variables:
            raw = env.get(var, "").strip()
            specs[name] = parse_crash_spec(raw, var) if raw else None
        stages = frozenset(s.strip() for s in env.get(FAIL_TASKS_ENV, "").split(",") if s.strip())
        unknown = stages - set(_TASK_STAGES)
        if unknown:
            raise ConfigError(
                f"{FAIL_TASKS_ENV}={env.get(FAIL_TASKS_ENV)!r}: unknown stage(s) "
                f"{sorted(unknown)}; use read, write or read,write"
            )
        paused = frozenset(s.strip() for s in env.get(PAUSE_TASKS_ENV, "").split(",") if s.strip())
        if paused - {"write"}:
            raise ConfigError(
                f"{PAUSE_TASKS_ENV}={env.get(PAUSE_TASKS_ENV)!r}: unknown stage(s) "
                f"{sorted(paused - {'write'})}; only write (a Kafka sink task) can pause"
            )
        events = env.get(EVENTS_ENV, "").strip()
        return cls(
            crash=specs["crash"],
            pause=specs["pause"],
            drop_connection=specs["drop"],
            fail_tasks=stages,
            pause_tasks=paused,
            events=Path(events) if events else None,
        )

    @property
    def empty(self) -> bool:
        """Whether this plan injects nothing (it may still record a fencing)."""
        return not (
            self.crash or self.pause or self.drop_connection or self.fail_tasks or self.pause_tasks
        )

    # -- driver hooks -------------------------------------------------------------------
    def crash_point(self, point: CrashPoint) -> bool:
        """Mark ``point``: SIGKILL or SIGSTOP this process if the plan says so here.

        Returns True when the caller must drop its store connection at this point.
        """
        if self.crash is None and self.pause is None and self.drop_connection is None:
            return False
        with self._lock:
            self._hits[point] = hit = self._hits.get(point, 0) + 1
        if self.pause == (point, hit):
            self.record("pause", point=point.value, hit=hit)
            # Stop via this thread: the stop takes effect before it runs another line (a
            # process-directed SIGSTOP may first be taken by another thread).
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        if self.crash == (point, hit):
            self.record("crash", point=point.value, hit=hit)
            self.on_crash()
        if self.drop_connection == (point, hit):
            self.record("drop-connection", point=point.value, hit=hit)
            return True
        return False

    def fenced(self, pipeline: str, epoch: int | None, owner_epoch: int | None) -> None:
        """Record that this run ended fenced (a newer run owns ``pipeline``)."""
        self.record("fenced", pipeline=pipeline, epoch=epoch, owner_epoch=owner_epoch)

    def phase(self, name: str) -> None:
        """Record that the run reached ``name`` (``run-started``, ``query-started``):
        ``sparkonce verify`` splits a recovery time by them."""
        self.record("phase", name=name)

    # -- task hooks (Spark's Python workers) --------------------------------------------
    def fail_task(self, stage: str, key: str, attempt: int) -> bool:
        """Whether a task of ``stage`` with data ``key`` fails on this attempt.

        Only first attempts fail. The choice depends only on ``key``, so it is the
        same on every retry: about half of the tasks fail once, then succeed.
        """
        if stage not in self.fail_tasks or attempt > 0:
            return False
        # A bit of a cryptographic digest: every bit of a CRC is linear in the key's bits, so
        # keys that differ in one character (task 0, 1, 2) would all fail or none would.
        return hashlib.blake2b(key.encode(), digest_size=1).digest()[0] % 2 == 0

    def pause_task(self, stage: str, key: str, attempt: int) -> None:
        """Stop this worker (SIGSTOP) if the plan pauses first attempts of ``stage`` here."""
        if stage not in self.pause_tasks or attempt > 0:
            return
        self.record("task-pause", stage=stage, task=key, attempt=attempt)
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

    def task_failure(self, stage: str, key: str, attempt: int, message: str) -> InjectedTaskFailure:
        """Record a task failure the plan asked for; returns the error for the task to raise."""
        self.record("task-failure", stage=stage, task=key, attempt=attempt)
        return InjectedTaskFailure(message)

    # -- events -------------------------------------------------------------------------
    def record(self, event: str, **fields: Any) -> None:
        """Append one event line to the events file (nothing when there is none)."""
        if self.events is None:
            return
        line = FaultEvent(event, fields, os.getpid(), time.time()).encode()
        data = (json.dumps(line) + "\n").encode()
        fd = os.open(self.events, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, data)  # one write of one line: appenders never interleave
            os.fsync(fd)
        finally:
            os.close(fd)


NO_FAULTS = FaultPlan()
"""The plan of runs, sinks and committers that are given none: it injects nothing."""

_worker_plan: FaultPlan | None = None


def worker_faults() -> FaultPlan:
    """This worker process's plan: parsed from its environment on first use, then cached.

    For task hooks, which run in Spark's Python workers and cannot be handed the
    driver's plan object.
    """
    global _worker_plan
    plan = _worker_plan
    if plan is None:
        plan = _worker_plan = FaultPlan.from_env()
    return plan


WORKER_VARIABLES = (FAIL_TASKS_ENV, PAUSE_TASKS_ENV, EVENTS_ENV)
"""The variables task hooks read (:func:`worker_faults`)."""


def worker_fault_conf(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Spark settings that hand the task hooks' variables, when set here, to the executors
    (``spark.executorEnv.NAME``). Python workers inherit their executor's environment; in
    local mode that is this process's, but a cluster's executors are started by its
    workers, which never saw it. :func:`sparkonce.build_session` applies them."""
    env = os.environ if env is None else env
    return {
        f"spark.executorEnv.{name}": env[name]
        for name in WORKER_VARIABLES
        if env.get(name, "").strip()
    }


def reset_worker_faults() -> None:
    """Forget the cached worker plan, so the next task hook parses the environment again
    (for tests that change the environment within one process)."""
    global _worker_plan
    _worker_plan = None


def read_events(path: str | Path, event: str | None = None) -> list[dict[str, Any]]:
    """The events in ``path``, oldest first (none if the file does not exist);
    with ``event``, only those of that kind, and without it every kind but ``phase``
    (progress marks, not faults). A torn last line is skipped; a line of a newer format
    version raises :class:`~sparkonce.errors.RecordVersionError`."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # only a writer killed mid-write leaves one; it recorded nothing
        if not isinstance(record, dict) or record.get("event") is None:
            continue
        found = FaultEvent.decode(record, f"{path} line {number}")
        if found.event == event or (event is None and found.event != "phase"):
            out.append(found.as_dict())
    return out
