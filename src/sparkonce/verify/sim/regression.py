"""Failing schedules kept as data: a shrunk schedule stored as JSON, replayed by the tests.

A regression test that names a seed depends on :func:`~sparkonce.verify.sim.generate`
never changing; a stored schedule does not. :class:`Regression` is one such file
(``tests/sim/regressions/*.json``): the schedule (:meth:`Schedule.to_json`), the store
it ran against, the failure kinds it showed, and, for a planted bug, that bug's name.
``python -m sparkonce.verify.sim ... --save DIR`` writes the first failing schedule,
shrunk, to ``DIR``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkonce.verify.sim.schedule import Schedule, check_schema

SCHEMA_VERSION = 1  # of the file around the schedule (the schedule has its own)


@dataclass(frozen=True)
class Regression:
    """One stored schedule and what it showed when it was stored."""

    name: str
    schedule: Schedule
    store: str = "sqlite"  # "sqlite", "postgres", "kafka", "delta"
    sink: str = "sql"  # "sql", "twophase", "kafka", "delta"
    kinds: tuple[str, ...] = ()  # the failure kinds it showed (none: a fixed bug's schedule)
    planted: str | None = None  # the planted bug it catches (tests/sim), or None
    note: str = ""
    # Stats the correct committer's replay must reach, at least (e.g. {"refused": 1}): the
    # schedule still drives the committer where the bug was.
    reached: tuple[tuple[str, int], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "name": self.name,
            "store": self.store,
            "sink": self.sink,
            "kinds": list(self.kinds),
            "planted": self.planted,
            "note": self.note,
            "reached": dict(self.reached),
            "schedule": self.schedule.to_json(),
        }

    @staticmethod
    def from_json(obj: dict[str, Any]) -> Regression:
        check_schema(obj, "a stored regression", SCHEMA_VERSION)
        return Regression(
            name=str(obj["name"]),
            schedule=Schedule.from_json(obj["schedule"]),
            store=str(obj.get("store", "sqlite")),
            sink=str(obj.get("sink", "sql")),
            kinds=tuple(str(k) for k in obj.get("kinds", ())),
            planted=None if obj.get("planted") is None else str(obj["planted"]),
            note=str(obj.get("note", "")),
            reached=tuple((str(k), int(v)) for k, v in dict(obj.get("reached", {})).items()),
        )

    def save(self, folder: str | Path) -> Path:
        """Write ``<folder>/<name>.json`` (the folder is created); returns the path."""
        path = Path(folder) / f"{self.name}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        return path

    @staticmethod
    def load(path: str | Path) -> Regression:
        try:
            return Regression.from_json(json.loads(Path(path).read_text()))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{path}: {exc}") from exc


def load_all(folder: str | Path) -> list[tuple[Path, Regression]]:
    """Every stored regression in ``folder``, by file name."""
    return [(p, Regression.load(p)) for p in sorted(Path(folder).glob("*.json"))]
