"""Crash tests: real driver processes (``sparkonce run FILE``) killed at named protocol steps.

Every test here is marked ``crash``. The helpers write pipeline files (the log directory, the
sink URL, the checkpoint directory and the read limit are baked into the file text, as
``sparkonce demo`` does), read a sink's table, ledger and owner, and compute the ORACLE: the
output of a failure-free in-process run of the same pipeline on the same input.

Input: ``make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)``. With 6 keys the records spread
evenly (crc32 of the key), 800 per partition, so ``LIMIT`` = 200 per partition makes exactly
``BATCHES`` = 4 batches of 600 rows.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import pytest

from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.sinks import sink_from_url
from sparkonce.sinks.inspect import inspector_for
from sparkonce.verify.driver import Driver

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


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

_PIPELINE_FILE = '''"""A sparkonce crash-test pipeline ({kind}), written by tests/crash."""

from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url


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


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, {topic!r}, max_records_per_partition={limit}),
    transform={kind},
    sink=sink_from_url({sink_url!r}, {table!r}{sink_kwargs}),
    checkpoint={checkpoint!r},
)
'''


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


def build_pipeline(
    *, log_dir: Path, sink_url: str, checkpoint: Path, kind: Kind, name: str = "oracle"
) -> Any:
    """The same pipeline as :func:`write_pipeline`, as an in-process ``Pipeline`` object."""
    namespace: dict[str, Any] = {}
    text = _PIPELINE_FILE.format(
        kind=kind,
        name=name,
        log_dir=str(log_dir),
        topic=TOPIC,
        limit=LIMIT,
        sink_url=sink_url,
        table=table_for(kind),
        sink_kwargs=', mode="upsert", keys=["key"]' if kind == "stateful" else "",
        checkpoint=str(checkpoint),
    )
    exec(compile(text, f"<{kind} oracle pipeline>", "exec"), namespace)
    return namespace["pipeline"]


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


@dataclass
class Oracle:
    """The failure-free output of both crash-test pipelines: ``events`` (the stateless one's
    rows) is computed at once; ``sums`` (the stateful one's) on first use, since make test's
    crash tests only need the stateless one (a Spark run saved)."""

    events: Counter[tuple[str, int, int, int]]
    run_stateful: Callable[[], dict[str, tuple[int, int]]]
    _sums: dict[str, tuple[int, int]] | None = None

    @property
    def sums(self) -> dict[str, tuple[int, int]]:
        if self._sums is None:
            self._sums = self.run_stateful()
        return self._sums


@pytest.fixture(scope="session")
def oracle(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Oracle:
    """Failure-free in-process runs of both pipelines on the crash tests' input."""
    work = tmp_path_factory.mktemp("oracle")
    log_dir = produce_log(work / "log")

    def run(kind: Literal["stateless", "stateful"]) -> list[dict[str, Any]]:
        saved = {
            k: os.environ.pop(k)
            for k in ("SPARKONCE_CRASH_AT", "SPARKONCE_PAUSE_AT")
            if k in os.environ
        }
        try:
            url = f"sqlite:///{work / f'{kind}.db'}"
            p = build_pipeline(
                log_dir=log_dir, sink_url=url, checkpoint=work / f"{kind}-checkpoint", kind=kind
            )
            report = p.run(spark, timeout=300)
            assert report.batches_skipped == 0, report
            return read_sink(url, table_for(kind), "oracle").rows
        finally:
            os.environ.update(saved)

    def stateful_sums() -> dict[str, tuple[int, int]]:
        sums = sums_by_key(run("stateful"))
        # The oracle itself must be right: the arithmetic sums.
        expected: dict[str, list[int]] = {}
        for i in range(1, RECORDS + 1):
            agg = expected.setdefault(f"k{i % KEYS}", [0, 0])
            agg[0] += i
            agg[1] += 1
        assert sums == {k: (t, n) for k, (t, n) in expected.items()}
        return sums

    events = event_tuples(run("stateless"))
    # The oracle itself must be right: every record once.
    assert sum(events.values()) == RECORDS and len(events) == RECORDS
    assert sorted(v for (_, _, _, v) in events) == list(range(1, RECORDS + 1))
    return Oracle(events, stateful_sums)
