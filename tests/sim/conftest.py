"""Fixtures of the protocol simulation tests, and the counts printed at the end of the run.

Each campaign test records what it checked with :func:`record`; at the end of the
pytest run (``pytest_terminal_summary``) every record is printed: how many schedules
were fully run and checked against which store, in how long, how fast.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Generator, Iterator
from dataclasses import dataclass

import pytest

from sparkonce.verify.sim import SqlTarget, Summary, remove_sqlite, sqlite_url

_files = itertools.count(100)


@dataclass
class Record:
    what: str
    summary: Summary
    processes: int
    lanes: int


RECORDS: list[Record] = []
PLANTED: list[str] = []  # how many schedules each planted bug took to be caught


def record(what: str, summary: Summary, processes: int, lanes: int) -> None:
    RECORDS.append(Record(what, summary, processes, lanes))


SECTION = "protocol simulation: schedules fully run and checked"


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item,
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Hand what the test recorded to its report, which reaches the process that prints the
    summary (under pytest-xdist, not the worker that ran the test): tests/conftest.py prints
    the report's ``terminal-summary`` lines at the end of the run."""
    report = yield
    lines = []
    for r in RECORDS:
        s = r.summary
        cpu = f", {s.schedules / s.cpu_seconds:,.0f}/CPU-s" if s.cpu_seconds else ""
        lines.append(
            f"{r.what:<34} {s.schedules:>9,} schedules in {s.seconds:7.1f} s = "
            f"{s.rate:>7,.0f}/s{cpu} ({r.processes} process(es) x {r.lanes} lane(s)), "
            f"{s.failed_count} failed"
        )
    lines += [f"planted bug {line}" for line in PLANTED]
    RECORDS.clear()
    PLANTED.clear()
    report.user_properties += [("terminal-summary", (SECTION, line)) for line in lines]
    return report


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, "") or default)


@pytest.fixture
def sqlite_target() -> Iterator[SqlTarget]:
    """One SQLite file (in /dev/shm when it exists), reused by every schedule of a test."""
    url = sqlite_url(f"test-{next(_files)}")
    remove_sqlite(url)
    target = SqlTarget(url, owns_store=True)
    try:
        yield target
    finally:
        target.close()
