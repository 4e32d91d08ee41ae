"""Crash tests: real driver processes (``sparkonce run FILE``) killed at named protocol steps.

Every test here is marked ``crash``. The helpers write pipeline files (the log directory, the
sink URL, the checkpoint directory and the read limit are baked into the file text, as
``sparkonce demo`` does), read a sink's table, ledger and owner, and compute the ORACLE: what
a failure-free run of the same pipeline writes, computed in plain Python from the input
(read with ``sqlite3``, not through sparkonce or Spark).

Input: ``make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)``. With 6 keys the records spread
evenly (crc32 of the key), 800 per partition, so ``LIMIT`` = 200 per partition makes exactly
``BATCHES`` = 4 batches of 600 rows.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest

from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.protocol import CrashPoint
from sparkonce.sinks import sink_from_url
from sparkonce.sinks.inspect import inspector_for
from sparkonce.verify.driver import SIGKILL_EXIT, Driver

RECORDS = 2400
PARTITIONS = 3
KEYS = 6
LIMIT = 200
BATCHES = 4
ROWS_PER_BATCH = RECORDS // BATCHES
TOPIC = "events"
STATELESS_TABLE = "events_out"
STATEFUL_TABLE = "sums"
DRIVER_TIMEOUT_S = 300.0  # a run takes 25-80 s (2 cores, shared); a hang fails, not blocks
PAUSE_TIMEOUT_S = 240.0

Kind = Literal["stateless", "stateful"]

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == _HERE:
            item.add_marker(pytest.mark.crash)


# -- pipeline files -------------------------------------------------------------------------------

# The crash-test transforms, as pipeline-file text: every crash pipeline file (this one's, and
# those of tests/crash/test_iceberg_crash.py) starts with them.
TRANSFORMS = """from pyspark.sql import functions as F


def stateless(df):
    return df.select(
        F.col("record_id"),
        F.col("partition"),
        F.col("offset"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def stateful(df):
    values = df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )
    return values.groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("records"))
"""

_PIPELINE_FILE = (
    '''"""A sparkonce crash-test pipeline ({kind}), written by tests/crash."""

'''
    + TRANSFORMS
    + """
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, {topic!r}, max_records_per_partition={limit}),
    transform={kind},
    sink=sink_from_url({sink_url!r}, {table!r}{sink_kwargs}),
    checkpoint={checkpoint!r},
)
"""
)


def table_for(kind: Kind) -> str:
    return STATELESS_TABLE if kind == "stateless" else STATEFUL_TABLE


def write_pipeline(
    tmp_path: Path,
    *,
    log_dir: Path,
    sink_url: str,
    kind: Kind = "stateless",
    name: str = "crash-test",
    checkpoint: Path | None = None,
    limit: int = LIMIT,
    file_name: str = "pipeline.py",
    two_phase: bool = False,
) -> Path:
    """Write a pipeline file into ``tmp_path``; return its path.

    ``stateless``: record_id, partition, offset, value (cast to long), appended into
    ``events_out``. ``stateful``: per-key sum and count of the values, upserted on ``key``
    into ``sums``. Checkpoint defaults to ``tmp_path/checkpoint``. ``two_phase`` writes
    through :class:`~sparkonce.PostgresTwoPhaseSink` (a PostgreSQL ``sink_url``).
    """
    checkpoint = checkpoint or tmp_path / "checkpoint"
    sink_kwargs = ', mode="upsert", keys=["key"]' if kind == "stateful" else ""
    if two_phase:
        sink_kwargs += ", two_phase=True"
    path = tmp_path / file_name
    path.write_text(
        _PIPELINE_FILE.format(
            kind=kind,
            name=name,
            log_dir=str(log_dir),
            topic=TOPIC,
            limit=limit,
            sink_url=sink_url,
            table=table_for(kind),
            sink_kwargs=sink_kwargs,
            checkpoint=str(checkpoint),
        )
    )
    return path


# -- reading a sink --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SinkState:
    rows: list[dict[str, Any]]
    ledger: list[LedgerEntry]
    owner: Owner | None


def read_sink(sink_url: str, table: str, pipeline: str = "crash-test") -> SinkState:
    """The table's rows, the pipeline's ledger entries and its owner, read in one go."""
    sink = sink_from_url(sink_url, table)
    try:
        return SinkState(inspector_for(sink).rows(), sink.ledger(pipeline), sink.owner(pipeline))
    finally:
        sink.close()


def read_rows(sink_url: str, table: str) -> list[dict[str, Any]]:
    return read_sink(sink_url, table).rows


def read_ledger(sink_url: str, pipeline: str = "crash-test") -> list[LedgerEntry]:
    return read_sink(sink_url, STATELESS_TABLE, pipeline).ledger


def read_owner(sink_url: str, pipeline: str = "crash-test") -> Owner | None:
    return read_sink(sink_url, STATELESS_TABLE, pipeline).owner


def open_transaction(sink_url: str) -> str | None:
    """Who holds a write transaction in the store (None: nobody), probed from outside.

    SQLite: a ``BEGIN IMMEDIATE`` that cannot get the write lock within 2 s. PostgreSQL:
    another session of the database with a transaction open.
    """
    from sparkonce.config import StoreURL

    url = StoreURL.parse(sink_url)
    if url.scheme == "sqlite":
        import sqlite3

        assert url.path is not None
        conn = sqlite3.connect(url.path, timeout=2.0, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("ROLLBACK")
            return None
        except sqlite3.OperationalError as exc:
            return f"SQLite write lock held ({exc})"
        finally:
            conn.close()
    import psycopg

    with psycopg.connect(sink_url, autocommit=True) as pg:
        rows = pg.execute(
            "SELECT pid, state, query FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
        ).fetchall()
    return f"PostgreSQL sessions in a transaction: {rows}" if rows else None


def event_tuples(rows: list[dict[str, Any]]) -> Counter[tuple[str, int, int, int]]:
    """The stateless table as a multiset of (record_id, partition, offset, value)."""
    return Counter(
        (str(r["record_id"]), int(r["partition"]), int(r["offset"]), int(r["value"])) for r in rows
    )


def sums_by_key(rows: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """The stateful table as key -> (total, records)."""
    return {str(r["key"]): (int(r["total"]), int(r["records"])) for r in rows}


# -- drivers ---------------------------------------------------------------------------------------


def run_driver(driver: Driver, timeout: float = DRIVER_TIMEOUT_S) -> int:
    """Start (if needed) and wait for ``driver``; kill it and fail if it hangs."""
    if driver.proc is None:
        driver.start()
    try:
        return driver.wait(timeout=timeout)
    except Exception:
        driver.kill()
        driver.wait(timeout=30)
        pytest.fail(
            f"driver {driver.log_path.name} did not finish within {timeout:.0f} s; "
            f"log tail:\n{driver.log_tail(40)}"
        )


def process_state(pid: int) -> str | None:
    """The state letter of ``pid`` from /proc/PID/stat (None if it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    # "pid (comm) S ...": comm may hold spaces or parentheses, so split after the last ')'.
    return stat.rsplit(")", 1)[1].split()[0]


def wait_until_stopped(driver: Driver, timeout: float = PAUSE_TIMEOUT_S) -> None:
    """Poll until the driver process is stopped (state 'T'); fail on exit or timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = driver.poll()
        if code is not None:
            pytest.fail(
                f"driver {driver.log_path.name} exited with code {code} before pausing; "
                f"log tail:\n{driver.log_tail(40)}"
            )
        if process_state(driver.pid) == "T":
            return
        time.sleep(0.1)
    driver.kill()
    driver.wait(timeout=30)
    pytest.fail(
        f"driver {driver.log_path.name} did not stop within {timeout:.0f} s; "
        f"log tail:\n{driver.log_tail(40)}"
    )


@contextmanager
def log_on_failure(driver: Driver, what: str) -> Iterator[None]:
    """Checks of the state ``driver`` left: a failed one also shows ``what``'s log tail."""
    try:
        yield
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{what} log tail:\n{driver.log_tail()}") from None


def kill_chain(
    pipeline_file: Path,
    tmp_path: Path,
    drivers: list[Driver],
    points: Iterable[CrashPoint],
    *,
    hit: Callable[[int, CrashPoint], int],
    check: Callable[[int, CrashPoint], None],
    env: dict[str, str] | None = None,
    entry: tuple[str, ...] = ("sparkonce", "run"),
) -> Driver:
    """Run ``pipeline_file`` once per crash point of ``points``, each run on the same
    checkpoint and SIGKILLed the ``hit(run, point)``-th time it reaches its point (runs count
    from 1); ``check(run, point)`` asserts the state each kill left. Then one more run, which
    must finish (exit code 0); it is returned, for the test's final checks. ``entry``: what
    runs the file (:class:`Driver`'s), ``sparkonce run`` by default."""
    for run, point in enumerate(points, start=1):
        killed = Driver(
            pipeline_file,
            tmp_path / f"run{run}.log",
            crash_at=point,
            crash_hit=hit(run, point),
            env=env or {},
            entry=entry,
        )
        drivers.append(killed.start())
        code = run_driver(killed)
        assert code == SIGKILL_EXIT, (
            f"run {run} ({point}) exited with {code}, not SIGKILL:\n{killed.log_tail()}"
        )
        with log_on_failure(killed, f"run {run}"):
            check(run, point)
    last = Driver(pipeline_file, tmp_path / "last.log", env=env or {}, entry=entry)
    drivers.append(last.start())
    code = run_driver(last)
    assert code == 0, f"the last run exited with {code}:\n{last.log_tail()}"
    return last


def replays_skipped(driver: Driver) -> int:
    """How many replayed batches the run's last summary line says it skipped (0: none, or no
    summary line)."""
    found = re.findall(r"skipped (\d+) replayed", driver.log_path.read_text(errors="replace"))
    return int(found[-1]) if found else 0


@pytest.fixture
def drivers() -> Iterator[list[Driver]]:
    """Drivers started by a test; any still running at teardown are killed (whole group)."""
    started: list[Driver] = []
    yield started
    for d in started:
        if d.proc is not None and d.poll() is None:
            d.resume()  # a stopped group must be continued to die cleanly from SIGKILL too
            d.kill()
            d.wait(timeout=30)


# -- the oracle ------------------------------------------------------------------------------------


def produce_log(root: Path) -> Path:
    """The same records as ``make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)``.

    tests/conftest.py's ``make_log`` is function-scoped; the oracle is computed once per
    session, so it produces an identical log here (same producer id, values and keys, so the
    same partitions, offsets and record ids).
    """
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, TOPIC, PARTITIONS, exist_ok=True)
    with topic, IdempotentProducer(topic, "test-producer") as producer:
        for i in range(1, RECORDS + 1):
            producer.send(str(i).encode(), f"k{i % KEYS}".encode())
    return root


@dataclass(frozen=True)
class Oracle:
    """What a failure-free run of each crash-test pipeline writes: ``events`` (the stateless
    one's rows, as :func:`event_tuples` counts them) and ``sums`` (the stateful one's, as
    :func:`sums_by_key` maps them)."""

    events: Counter[tuple[str, int, int, int]]
    sums: dict[str, tuple[int, int]]


@pytest.fixture(scope="session")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    """The crash tests' oracle, computed from their input alone: the records of the log
    :func:`produce_log` writes, read straight from its SQLite file with ``sqlite3`` (no Spark,
    no sparkonce code), then the two transforms done in plain Python."""
    log_dir = produce_log(tmp_path_factory.mktemp("oracle") / "log")
    conn = sqlite3.connect(log_dir / f"{TOPIC}.db")
    try:
        rows = conn.execute('SELECT record_id, partition, "offset", key, value FROM records')
        records = [
            (str(r), int(p), int(o), bytes(k).decode(), int(bytes(v))) for r, p, o, k, v in rows
        ]
    finally:
        conn.close()
    events = Counter((r, p, o, v) for r, p, o, _, v in records)
    totals: dict[str, tuple[int, int]] = {}
    for *_, key, value in records:
        total, count = totals.get(key, (0, 0))
        totals[key] = (total + value, count + 1)
    # The input itself must be what the tests assume: the values 1..RECORDS once each, with
    # distinct record ids, spread over every partition.
    assert sorted(v for *_, v in records) == list(range(1, RECORDS + 1))
    assert len({r for r, *_ in records}) == RECORDS
    assert {p for _, p, *_ in records} == set(range(PARTITIONS))
    return Oracle(events, totals)


def json_inbox(tmp_path: Path, files: int, per_file: int) -> tuple[Path, list[int]]:
    """A directory of ``files`` JSON-lines files of ``per_file`` records ``{"id", "k"}``
    each, every file written beside it and moved in whole (the file source's rule); the
    directory and the ids in order."""
    import json

    inbox = tmp_path / "in"
    inbox.mkdir()
    expected: list[int] = []
    for n in range(files):
        ids = range(n * 100, n * 100 + per_file)
        staged = tmp_path / f".f{n}.json"
        staged.write_text("".join(json.dumps({"id": i, "k": f"k{i % 3}"}) + "\n" for i in ids))
        staged.rename(inbox / f"f{n}.json")
        expected += ids
    return inbox, expected
