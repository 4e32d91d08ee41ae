"""Rotating shards of the crash and campaign lanes (``make test-shard K=<k>``).

Every test marked ``crash_lane`` or ``campaign_lane`` is in exactly one shard, and a test
stays in its shard when others come and go: ``tests/shard-map.json`` pins each known test
to its shard. It is written by this module, never by hand. A test the map does not name
is placed when the map is computed, so a new test needs no edit: it joins the shard that
holds most of its file (or shared directory) if the box has room there, else the shard
with the least time that has room, else a new shard at the end. Tests the map names that
are gone drop out; a shard left empty is dropped. ``--update`` writes that placement back
into the map; ``--rebalance`` packs everything afresh (after which every shard must pass
on its own again, so do it rarely).

Times come from ``tests/shard-durations.json`` (measured, or an estimate with its source)
or, for a test it does not name, from a default by path and lane (:func:`estimate`). A
fresh packing puts whole test files (the cluster suite as one directory: its session
fixtures start a cluster and pack a 100 MB environment), longest first, each into the shard
with the least time so far, with as few shards as keep every shard within
:data:`BOX_MINUTES`. A file longer than the box alone is split into its tests. The same
tests, durations and map give the same shards, whatever their order.

CI (``.ci/run``) runs ``make test`` and then one shard, chosen from the commit it tests:
``git rev-list --count HEAD`` modulo the number of shards, so every test runs once every
that many landings. ``python -m tests.shards --list`` prints the map (``make
test-shard-list``); ``--count`` the number of shards. The root conftest's ``--shard K``
option selects shard K in a pytest run of the whole suite, and ``--record-durations``
writes a run's measured times into the durations file.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DURATIONS_FILE = REPO / "tests" / "shard-durations.json"
MAP_FILE = REPO / "tests" / "shard-map.json"

# The time box of one shard. CI runs `make test` (about 21 min of .ci/run's time in fresh
# clones on the 2-core machine of 2026-11-28, setup included) and one shard, against a goal
# of 45 min: a 15-min shard fits, and a test alone in its shard may take up to 1.5 boxes.
BOX_MINUTES = 15.0
# What a shard costs besides its tests, counted in its estimate: pytest's start and
# collection, the class-data archive check, the Spark session and servers it starts.
SHARD_OVERHEAD_SECONDS = 60.0
# Lanes (tests/conftest.py's lane_of) whose tests are sharded; "test" is make test's.
SHARDED_LANES = ("crash", "campaign")
# Directories whose tests share session fixtures that are slow to start (a conftest.py
# there): packed as one unit while they fit in the box, else file by file.
SHARED_DIRS = ("tests/cluster/",)
# Defaults for a test the durations file does not name: the first matching path prefix,
# else its lane's. The crash lane measured 31 min 28 s for 23 tests (82 s each) on
# 2026-11-27; the campaign lane's tests run whole verify campaigns.
DEFAULT_BY_PATH = (("tests/packaging/", 300.0), ("tests/cluster/", 150.0))
DEFAULT_BY_LANE = {"crash": 90.0, "campaign": 120.0}


@dataclass(frozen=True)
class Estimate:
    seconds: float
    source: str


@dataclass(frozen=True)
class Shard:
    index: int
    tests: tuple[str, ...]  # node ids, sorted
    seconds: float

    def files(self) -> dict[str, int]:
        """Test file -> how many of its tests this shard runs."""
        counts: dict[str, int] = {}
        for nodeid in self.tests:
            path = nodeid.split("::", 1)[0]
            counts[path] = counts.get(path, 0) + 1
        return counts


def load_durations(path: Path = DURATIONS_FILE) -> dict[str, Estimate]:
    """The durations file's tests: node id -> seconds and where the figure comes from."""
    data = json.loads(path.read_text())
    return {
        nodeid: Estimate(float(entry["seconds"]), str(entry["source"]))
        for nodeid, entry in data["tests"].items()
    }


def estimate(nodeid: str, lane: str, durations: Mapping[str, Estimate]) -> Estimate:
    """A test's time: the durations file's figure, else the default for its path or lane."""
    if nodeid in durations:
        return durations[nodeid]
    for prefix, seconds in DEFAULT_BY_PATH:
        if nodeid.startswith(prefix):
            return Estimate(seconds, f"default for {prefix}")
    return Estimate(DEFAULT_BY_LANE.get(lane, max(DEFAULT_BY_LANE.values())), f"default ({lane})")


def _group(nodeid: str, level: int) -> str:
    """The unit a test belongs to at ``level``: 0 its shared directory (or file), 1 its
    file, 2 itself."""
    path = nodeid.split("::", 1)[0]
    if level == 0:
        return next((d for d in SHARED_DIRS if path.startswith(d)), path)
    return path if level == 1 else nodeid


def _units(tests: Mapping[str, float], box: float) -> list[tuple[str, list[str], float]]:
    """Groups of tests packed whole: shared directories, else files, split one level
    further (directory -> files -> tests) while a group alone exceeds the box."""
    units: list[tuple[str, list[str], float]] = []

    def add(ids: list[str], level: int) -> None:
        groups: dict[str, list[str]] = {}
        for nodeid in ids:
            groups.setdefault(_group(nodeid, level), []).append(nodeid)
        for key, members in groups.items():
            seconds = sum(tests[n] for n in members)
            if seconds > box and level < 2 and len(members) > 1:
                add(members, level + 1)
            else:
                units.append((key, sorted(members), seconds))

    add(sorted(tests), 0)
    return units


def _lpt(
    units: list[tuple[str, list[str], float]], count: int
) -> list[tuple[list[str], float, int]]:
    """Longest first, each unit into the emptiest bin: (members, seconds, units) per bin."""
    bins: list[tuple[list[str], float, int]] = [([], 0.0, 0) for _ in range(count)]
    for _key, members, seconds in sorted(units, key=lambda u: (-u[2], u[0])):
        i = min(range(count), key=lambda j: (bins[j][1], j))
        bins[i] = (bins[i][0] + members, bins[i][1] + seconds, bins[i][2] + 1)
    return bins


def pack(
    tests: Mapping[str, float], box_seconds: float, overhead: float = SHARD_OVERHEAD_SECONDS
) -> list[Shard]:
    """The shards of ``tests`` (node id -> seconds): the fewest for which longest-first
    greedy packing keeps each, with ``overhead``, within ``box_seconds`` (a unit longer
    than the box alone gets a shard of its own, and that shard exceeds the box)."""
    if not tests:
        return []
    room = box_seconds - overhead
    units = _units(tests, room)
    count = max(1, math.ceil(sum(tests.values()) / room))
    bins = _lpt(units, count)
    # Over the room only where a unit longer than the room is alone in its shard.
    while any(seconds > room and n > 1 for _, seconds, n in bins):
        count += 1
        bins = _lpt(units, count)
    return [
        Shard(i, tuple(sorted(members)), round(seconds + overhead, 1))
        for i, (members, seconds, _n) in enumerate(bins)
    ]


def load_map(path: Path = MAP_FILE) -> list[list[str]]:
    """The pinned shards: each shard's node ids, in shard order (none if no map yet)."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    return [list(tests) for tests in data["shards"]]


def write_map(shards: list[Shard], box_minutes: float, path: Path = MAP_FILE) -> None:
    data = {
        "about": "Written by python -m tests.shards --update / --rebalance; never by hand.",
        "box_minutes": box_minutes,
        "shards": [list(s.tests) for s in shards],
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def place(
    pinned: list[list[str]],
    tests: Mapping[str, float],
    box_seconds: float,
    overhead: float = SHARD_OVERHEAD_SECONDS,
) -> list[Shard]:
    """``tests`` (node id -> seconds) in the shards of ``pinned``: a pinned test stays in its
    shard, a test no shard names joins one with room (see the module's docstring), gone
    tests drop out and empty shards are dropped."""
    room = box_seconds - overhead
    bins: list[list[str]] = []
    seen: set[str] = set()
    for members in pinned:
        kept = [n for n in members if n in tests and n not in seen]
        seen.update(kept)
        bins.append(kept)
    new = {n: s for n, s in tests.items() if n not in seen}
    for _key, members, seconds in sorted(_units(new, room), key=lambda u: (-u[2], u[0])):
        load = [sum(tests[n] for n in b) for b in bins]
        fits = [i for i in range(len(bins)) if load[i] + seconds <= room or not bins[i]]
        group = _group(members[0], 0)
        kin = [i for i in fits if any(_group(n, 0) == group for n in bins[i])]
        if kin:
            i = max(kin, key=lambda j: (sum(_group(n, 0) == group for n in bins[j]), -j))
        elif fits:
            i = min(fits, key=lambda j: (load[j], j))
        else:
            bins.append([])
            i = len(bins) - 1
        bins[i] = bins[i] + members
    shards = [b for b in bins if b]
    return [
        Shard(i, tuple(sorted(b)), round(sum(tests[n] for n in b) + overhead, 1))
        for i, b in enumerate(shards)
    ]


def plan(
    lanes: Mapping[str, str],
    durations: Mapping[str, Estimate] | None = None,
    box_minutes: float = BOX_MINUTES,
    pinned: list[list[str]] | None = None,
) -> list[Shard]:
    """The shard map of a collection: ``lanes`` maps every collected node id to its lane;
    ``pinned`` is the map file's shards (read from it by default; ``[]`` packs afresh)."""
    if durations is None:
        durations = load_durations()
    if pinned is None:
        pinned = load_map()
    tests = {
        nodeid: estimate(nodeid, lane, durations).seconds
        for nodeid, lane in lanes.items()
        if lane in SHARDED_LANES
    }
    if not pinned:
        return pack(tests, box_minutes * 60)
    return place(pinned, tests, box_minutes * 60)


def record_durations(
    measured: Mapping[str, float], source: str, path: Path = DURATIONS_FILE
) -> int:
    """Write measured times into the durations file (sorted, other entries kept), each to a
    tenth of a second and at least 0.1 s (a test quicker than that still costs its place);
    returns how many were written."""
    data = json.loads(path.read_text())
    for nodeid, seconds in measured.items():
        data["tests"][nodeid] = {"seconds": max(round(seconds, 1), 0.1), "source": source}
    data["tests"] = dict(sorted(data["tests"].items()))
    path.write_text(json.dumps(data, indent=1) + "\n")
    return len(measured)


def minutes(seconds: float) -> str:
    """``"9m 05s"``."""
    whole = round(seconds)
    return f"{whole // 60}m {whole % 60:02d}s"


def collect(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only -q ARGS...`` of this checkout (no test runs; a few seconds),
    its output captured. With the root conftest's ``--lanes-report=FILE`` it writes every
    collected test's lane to FILE; with ``--shard=K``, it prints shard K's tests."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"},
        timeout=timeout,
    )


def collect_lanes(extra_args: Iterable[str] = ()) -> dict[str, str]:
    """Every test of the suite and its lane, from one :func:`collect` through the root
    conftest's ``--lanes-report``."""
    with tempfile.TemporaryDirectory(prefix="sparkonce-shards-") as tmp:
        out = Path(tmp) / "lanes.json"
        done = collect(f"--lanes-report={out}", *extra_args)
        if done.returncode != 0:
            raise SystemExit(
                "error: pytest --collect-only failed, so there is no shard map:\n"
                + done.stdout[-3000:]
                + done.stderr[-3000:]
            )
        report = json.loads(out.read_text())
    return {nodeid: str(info["lane"]) for nodeid, info in report.items()}


def describe(shards: list[Shard], box_minutes: float = BOX_MINUTES) -> str:
    total = sum(s.seconds for s in shards)
    lines = [
        f"{len(shards)} shards of the crash and campaign lanes, "
        f"{sum(len(s.tests) for s in shards)} tests, estimated {minutes(total)} in all "
        f"({SHARD_OVERHEAD_SECONDS:g} s of start per shard included), box {box_minutes:g} min "
        f"(tests/shards.py; times from {DURATIONS_FILE.name})"
    ]
    for shard in shards:
        lines.append(
            f"shard {shard.index}: {shard.seconds / 60:.1f} min, {len(shard.tests)} tests"
            f"  (make test-shard K={shard.index})"
        )
        for path, count in sorted(shard.files().items()):
            lines.append(f"    {count:3d}  {path}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.shards", description=__doc__)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--list", action="store_true", help="print the shard map")
    what.add_argument("--count", action="store_true", help="print the number of shards")
    what.add_argument(
        "--update", action="store_true", help=f"write the map's placement into {MAP_FILE.name}"
    )
    what.add_argument(
        "--rebalance",
        action="store_true",
        help=f"pack every test afresh and write {MAP_FILE.name} (every shard must pass again)",
    )
    args = parser.parse_args(argv)
    lanes = collect_lanes()
    shards = plan(lanes, pinned=[] if args.rebalance else None)
    if args.update or args.rebalance:
        write_map(shards, BOX_MINUTES)
        print(f"{MAP_FILE.name}: {len(shards)} shards")
        return 0
    print(len(shards) if args.count else describe(shards))
    return 0


def run(argv: list[str] | None = None) -> int:
    """:func:`main` as a command: a reader that stops early (``--list | head``) ends it
    quietly, with no BrokenPipeError traceback (exit 1, as Python's docs advise)."""
    try:
        code = main(argv)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        # Python flushes stdout again at exit: point it at /dev/null so that fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


if __name__ == "__main__":
    sys.exit(run())
