"""Schedules: what happens to one pipeline, generated from one integer seed.

A schedule holds a synthetic log (2-3 partitions of 5-30 records) and a list of
events over several runs of one pipeline (see :mod:`sparkonce.verify.sim` for what
each event does). :func:`generate` makes the schedule of a seed; the same seed always
gives the same schedule, whatever the store it later runs against.

Speed matters here (a soak runs millions of schedules): :func:`generate` draws from
``random.Random(seed)`` exactly as ``randint``, ``choice`` and ``randrange`` would
(the same rejection sampling on ``getrandbits``), without their Python layers, and
events are interned (a schedule reuses one frozen instance per distinct event).
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from sparkonce.protocol import CrashPoint


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
    fails before its transaction (two-phase and Kafka sinks: each task's first attempt
    fails, and Spark retries it); ``freeze``: the run freezes after staging (a zombie);
    ``nodata``: plan a no-data batch (same end offsets as the batch before) that emits
    one timer row, or nothing at all with ``quiet``.
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
        return events_to_json(self.events)

    def to_json(self) -> dict[str, Any]:
        """The whole schedule as a JSON object (:data:`SCHEMA_VERSION`), independent of
        :func:`generate`: a stored schedule replays the same whatever the generator does."""
        return {
            "schema": SCHEMA_VERSION,
            "seed": self.seed,
            "totals": list(self.totals),
            "initial": list(self.initial),
            "events": [_event_obj(e) for e in self.events],
            "final": _event_obj(self.final),
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Schedule:
        """The schedule :meth:`to_json` wrote; raises ``ValueError`` naming what is wrong."""
        check_schema(
            obj, "a stored schedule", SCHEMA_VERSION, "Store it again from its seed or events."
        )
        try:
            final = _event_from(dict(obj["final"]))
            if not isinstance(final, Start):
                raise ValueError(f"the final run must be a start event, not {final}")
            totals = tuple(int(n) for n in obj["totals"])
            initial = tuple(int(n) for n in obj["initial"])
            if len(totals) != len(initial):
                raise ValueError(f"totals {list(totals)} and initial {list(initial)} differ")
            events = tuple(_event_from(dict(d)) for d in obj["events"])
            return Schedule(int(obj["seed"]), totals, initial, events, final)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"a stored schedule is malformed: {exc!r}") from exc

    @staticmethod
    def parse_events(text: str) -> tuple[Event, ...]:
        return tuple(_event_from(d) for d in json.loads(text))


SCHEMA_VERSION = 1  # of Schedule.to_json; bump it when an event's fields change


def check_schema(obj: Mapping[str, Any], what: str, version: int, remedy: str = "") -> None:
    """Raise ``ValueError`` unless the stored JSON object ``obj`` (``what``, for the
    message: "a stored schedule") has ``"schema": version``; ``remedy`` ends the message."""
    found = obj.get("schema")
    if found != version:
        raise ValueError(
            f"{what} has schema version {found!r}; this sparkonce reads version {version}"
            + (f". {remedy}" if remedy else "")
        )


def _event_obj(e: Event) -> dict[str, Any]:
    d: dict[str, Any] = {"type": type(e).__name__.lower()}
    for f in fields(e):
        v = getattr(e, f.name)
        d[f.name] = list(v) if isinstance(v, tuple) else v
    return d


def _event_from(d: dict[str, Any]) -> Event:
    kind = d.pop("type", None)
    cls = _EVENT_TYPES.get(str(kind))
    if cls is None:
        raise ValueError(f"unknown event type {kind!r} (known: {sorted(_EVENT_TYPES)})")
    known = {f.name for f in fields(cls)}
    if set(d) - known:
        raise ValueError(f"event {kind!r} has unknown fields {sorted(set(d) - known)}")
    if d.get("crash") is not None:
        d["crash"] = (str(d["crash"][0]), int(d["crash"][1]))
    event: Event = cls(**d)
    return event


def events_to_json(events: tuple[Event, ...]) -> str:
    return json.dumps([_event_obj(e) for e in events], separators=(",", ":"))


# --- the generator ----------------------------------------------------------------------------

_POINTS = tuple(p.value for p in CrashPoint)
_MPP = (None, None, 1, 2, 3, 5, 8)
_MT = (None, None, 1, 2, 4, 7, 10)
_FINAL_MPP = (None, 5, 10)
_FINAL_MT = (None, 8, 16)
_RETRY_CRASHES = (("after-rows", 2), ("before-ledger-commit", 1))

_interned: dict[Any, Any] = {}


def _intern(cls: type[Any], *args: Any) -> Any:
    key = (cls, *args)
    e = _interned.get(key)
    if e is None:
        e = _interned[key] = cls(*args)
    return e


class _Draws:
    """``random.Random``'s ``randint``/``choice``/``randrange``/``random``, same results."""

    __slots__ = ("bits", "random")

    def __init__(self, seed: int) -> None:
        rng = random.Random(seed)
        self.bits = rng.getrandbits
        self.random = rng.random

    def below(self, n: int) -> int:
        """``Random._randbelow(n)``: rejection sampling on ``getrandbits``."""
        k = n.bit_length()
        r = self.bits(k)
        while r >= n:
            r = self.bits(k)
        return r

    def randint(self, a: int, b: int) -> int:
        return a + self.below(b - a + 1)

    def choice(self, seq: tuple[Any, ...]) -> Any:
        return seq[self.below(len(seq))]


def generate(seed: int, *, with_restore: bool = True) -> Schedule:
    """The schedule of ``seed`` (the same seed always gives the same schedule).

    ``with_restore`` (the default): some new runs start from a checkpoint restored from
    an old backup (see :class:`Start`). The random draws are the same either way, so a
    seed gives the same schedule with and without, but for those restores.
    """
    d = _Draws(seed)
    rnd = d.random
    parts = d.randint(2, 3)
    totals = tuple(d.randint(5, 30) for _ in range(parts))
    initial = tuple(d.randint(0, t) for t in totals)
    events: list[Event] = [_intern(Start, True, d.choice(_MPP), d.choice(_MT), 0)]
    for _ in range(d.randint(4, 24)):
        x = rnd()
        if x < 0.50:
            events.append(_step(d))
        elif x < 0.64:
            restore = d.randint(1, 8) if rnd() < 0.12 else 0
            restore = restore if with_restore else 0
            keep = rnd() < 0.6
            events.append(_intern(Start, keep, d.choice(_MPP), d.choice(_MT), restore))
        elif x < 0.74:
            events.append(_intern(Grow, d.below(parts), d.randint(1, 10)))
        elif x < 0.83:
            events.append(_intern(Thaw, d.below(4), rnd() < 0.15))
        elif x < 0.91:
            events.append(_intern(Stale, d.below(4)))
        else:
            events.append(_intern(Repeat))
    # The final run drains what is left with larger limits: its batches carry no fault.
    keep = rnd() < 0.6
    final = _intern(Start, keep, d.choice(_FINAL_MPP), d.choice(_FINAL_MT), 0)
    return Schedule(seed, totals, initial, tuple(events), final)


def _step(d: _Draws) -> Step:
    rnd = d.random
    nodata = rnd() < 0.2
    quiet = nodata and rnd() < 0.25
    x = rnd()
    crash: tuple[str, int] | None = None
    if x < 0.25:
        return _intern(Step, nodata, (d.choice(_POINTS), 1), False, False, False, False, quiet)
    if x < 0.33:
        if rnd() < 0.3:  # a crash during the retry that follows the drop
            crash = d.choice(_RETRY_CRASHES)
            crash = crash if rnd() < 0.8 else ("after-ledger-commit", 1)
        return _intern(Step, nodata, crash, True, False, False, False, quiet)
    if x < 0.38:
        crash = ("after-ledger-commit", 1) if rnd() < 0.2 else None
        return _intern(Step, nodata, crash, False, True, False, False, quiet)
    if x < 0.42:
        return _intern(Step, nodata, None, False, False, True, False, quiet)
    if x < 0.52:
        return _intern(Step, nodata, None, False, False, False, True, quiet)
    return _intern(Step, nodata, None, False, False, False, False, quiet)


def simpler(e: Event) -> list[Event]:
    """Simpler variants of one event, for shrinking."""
    if isinstance(e, Step):
        out: list[Event] = []
        if e.crash or e.drop or e.lost_ack or e.fail or e.freeze:
            out.append(Step(e.nodata, quiet=e.quiet))
        if e.nodata:
            out.append(replace(e, nodata=False, quiet=False))
        return out
    if isinstance(e, Start):
        out = []
        if e.restore:
            out.append(replace(e, restore=0))
        if e.max_per_partition or e.max_total:
            out.append(replace(e, max_per_partition=None, max_total=None))
        return out
    return []
