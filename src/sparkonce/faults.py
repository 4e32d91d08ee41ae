"""The fault plan: which fault to inject where, parsed once, passed explicitly.

The crash tests and ``sparkonce verify`` inject faults into real driver processes
through the environment (see :mod:`sparkonce.protocol` for the variables and
their ``NAME[@N]`` form). :meth:`FaultPlan.from_env` parses them once; code that
has a fault hook takes the plan as an argument, and the default plan (no
variables set) does nothing.

A fault that fires is written as one JSON line to the file named by
``SPARKONCE_FAULT_EVENTS`` (when set), *before* it takes effect::

    {"fault": "crash", "point": "after-rows", "hit": 2, "pid": 4242, "at": 1795367650.4}

The verifier reads these events instead of matching log text.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sparkonce.errors import ConfigError
from sparkonce.protocol import (
    CRASH_ENV,
    DROP_CONNECTION_ENV,
    FAIL_TASKS_ENV,
    PAUSE_ENV,
    CrashPoint,
    kill_self,
    parse_crash_spec,
)

EVENTS_ENV = "SPARKONCE_FAULT_EVENTS"
_TASK_STAGES = ("read", "write")

Spec = tuple[CrashPoint, int]


@dataclass
class FaultPlan:
    """What to inject in this process; the empty plan injects nothing."""

    crash: Spec | None = None
    pause: Spec | None = None
    drop_connection: Spec | None = None
    fail_tasks: frozenset[str] = frozenset()
    events: Path | None = None
    # What a crash does: SIGKILL this process (and its group) in real runs. The protocol
    # simulation raises an exception instead, so one process can play many runs.
    on_crash: Callable[[], None] = kill_self
    _hits: dict[CrashPoint, int] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FaultPlan:
        """Parse the fault variables; a bad value raises ``ConfigError`` naming it."""
        env = os.environ if env is None else env
        specs: dict[str, Spec | None] = {}
        for name, var in (("crash", CRASH_ENV), ("pause", PAUSE_ENV)):
            raw = env.get(var, "").strip()
            specs[name] = parse_crash_spec(raw, var) if raw else None
        raw_drop = env.get(DROP_CONNECTION_ENV, "").strip()
        drop = parse_crash_spec(raw_drop, DROP_CONNECTION_ENV) if raw_drop else None
        stages = frozenset(s.strip() for s in env.get(FAIL_TASKS_ENV, "").split(",") if s.strip())
        unknown = stages - set(_TASK_STAGES)
        if unknown:
            raise ConfigError(
                f"{FAIL_TASKS_ENV}={env.get(FAIL_TASKS_ENV)!r}: unknown stage(s) "
                f"{sorted(unknown)}; use read, write or read,write"
            )
        events = env.get(EVENTS_ENV, "").strip()
        return cls(
            crash=specs["crash"],
            pause=specs["pause"],
            drop_connection=drop,
            fail_tasks=stages,
            events=Path(events) if events else None,
        )

    @property
    def empty(self) -> bool:
        return not (self.crash or self.pause or self.drop_connection or self.fail_tasks)

    def crash_point(self, point: CrashPoint) -> bool:
        """Mark ``point``: SIGKILL or SIGSTOP this process if the plan says so here.

        Returns True when the caller must drop its store connection at this point.
        """
        if self.crash is None and self.pause is None and self.drop_connection is None:
            return False
        with self._lock:
            self._hits[point] = hit = self._hits.get(point, 0) + 1
        if self.pause == (point, hit):
            self._event("pause", point, hit)
            # Stop via this thread: it takes effect before the thread runs another line.
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
        if self.crash == (point, hit):
            self._event("crash", point, hit)
            self.on_crash()
        if self.drop_connection == (point, hit):
            self._event("drop-connection", point, hit)
            return True
        return False

    def fail_task(self, stage: str, key: str, attempt: int) -> bool:
        """Whether a task of ``stage`` with data ``key`` fails now (first attempts only).

        The choice depends only on ``key``, so it is the same on every retry: about
        half of the tasks fail once, then succeed.
        """
        if stage not in self.fail_tasks or attempt > 0:
            return False
        import zlib

        return zlib.crc32(key.encode()) % 2 == 0

    def _event(self, fault: str, point: CrashPoint, hit: int) -> None:
        if self.events is None:
            return
        record = {
            "fault": fault,
            "point": point.value,
            "hit": hit,
            "pid": os.getpid(),
            "at": time.time(),
        }
        with open(self.events, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())


def read_events(path: Path) -> list[dict[str, object]]:
    """The fault events written to ``path`` (none if the file does not exist)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(json.loads(line))
    return out
