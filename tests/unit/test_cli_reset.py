"""``sparkonce reset`` against real SQLite and PostgreSQL stores: it forgets the pipeline's
owner epoch and ledger so the next run starts fresh, keeps the output unless asked, asks
first, and refuses while the run holding the epoch is alive.

A "run" here is the committer's own path without Spark: ``acquire`` then ``commit_rows``,
the calls a Spark batch makes. The run whose epoch must read as finished is a separate
Python process that has exited (its pid is gone); a live one is this test process.
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from sparkonce.cli import main
from sparkonce.cli.common import EXIT_FAIL, EXIT_RUNNING, EXIT_USAGE
from sparkonce.config import StoreURL
from sparkonce.ledger import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks import PostgresSink, SQLiteSink
from sparkonce.sinks.sql import SqlSink

if TYPE_CHECKING:
    from tests.services.postgres import PostgresServer

SRC = Path(__file__).resolve().parents[2] / "src"

# One batch, offsets 0..3 of ev[0], three rows: committed by a process that then exits.
RUN_ONCE = """
import sys
from pyspark.sql.types import LongType, StructField, StructType
from sparkonce.ledger import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks import sink_from_url

with sink_from_url(sys.argv[1], "out") as sink:
    epoch = sink.acquire("p").epoch
    ctx = BatchContext("p", epoch, BatchRanges((OffsetRange("ev", 0, 0, 3),)), 0)
    schema = StructType([StructField("v", LongType())])
    sink.commit_rows(ctx, schema, ["v"], [(1,), (2,), (3,)])
"""


@pytest.fixture(autouse=True)
def wide_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # status prints through rich, which wraps


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'sink.db'}"
        return
    server: PostgresServer = request.getfixturevalue("pg_server")
    name = f"reset_{uuid.uuid4().hex[:8]}"
    yield server.create_database(name)
    server.drop_database(name)


@contextlib.contextmanager
def _sink(url: str) -> Iterator[SqlSink]:
    parsed = StoreURL.parse(url)
    sink = (SQLiteSink if parsed.scheme == "sqlite" else PostgresSink)(parsed, "out")
    with sink:
        yield sink


def _run_in_a_process_that_exits(url: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", RUN_ONCE, url], env=env, check=True, timeout=120)


def _rows(sink: SqlSink) -> list[Any]:
    return sorted(r[0] for r in sink.conn.execute('SELECT v FROM "out"').fetchall())


def test_reset_then_a_run_starts_fresh_and_the_output_is_kept(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _run_in_a_process_that_exits(url)
    with _sink(url) as sink:
        owner = sink.owner("p")
        assert owner is not None and owner.epoch == 1 and len(sink.ledger("p")) == 1
    capsys.readouterr()
    # status says what reset will check: the holder's process is gone.
    assert main(["status", "--pipeline", "p", "--sink", url]) == 0
    assert f"by {owner.holder}, no longer running)" in capsys.readouterr().out
    # Naming the output table does not delete it: only --output-rows does.
    assert main(["reset", "--pipeline", "p", "--sink", url, "--table", "out", "--yes"]) == 0
    out = capsys.readouterr().out
    assert "1 ledger entries and the owner epoch deleted, output kept" in out
    assert "Delete (or move away) the pipeline's checkpoint directory" in out
    with _sink(url) as sink:
        assert sink.owner("p") is None and sink.ledger("p") == []
        assert _rows(sink) == [1, 2, 3]  # the output rows are kept
    # The next run starts from offset 0 with epoch 1, and the same batch commits again
    # (before the reset, the ledger would have recognised it as already committed).
    _run_in_a_process_that_exits(url)
    with _sink(url) as sink:
        owner = sink.owner("p")
        [entry] = sink.ledger("p")
        assert owner is not None and owner.epoch == 1
        assert entry.seq == 0 and entry.epoch == 1
        assert _rows(sink) == [1, 1, 2, 2, 3, 3]
    # Nothing left to reset says so and succeeds.
    assert main(["reset", "--pipeline", "ghost", "--sink", url, "--yes"]) == 0
    assert "nothing to reset" in capsys.readouterr().out


def test_reset_refuses_while_the_holder_is_alive(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with _sink(url) as sink:
        owner = sink.acquire("p")  # held by this (live) process
        ctx = BatchContext("p", owner.epoch, BatchRanges((OffsetRange("ev", 0, 0, 2),)), 0)
        from pyspark.sql.types import LongType, StructField, StructType

        sink.commit_rows(ctx, StructType([StructField("v", LongType())]), ["v"], [(7,), (8,)])
    capsys.readouterr()
    assert main(["status", "--pipeline", "p", "--sink", url]) == 0
    assert f"pid {os.getpid()}, running on this host)" in capsys.readouterr().out
    assert main(["reset", "--pipeline", "p", "--sink", url, "--yes"]) == EXIT_RUNNING
    err = capsys.readouterr().err
    assert "still running:" in err and f"pid {os.getpid()}" in err and "still alive" in err
    assert "Nothing was deleted" in err
    with _sink(url) as sink:
        assert sink.owner("p") is not None and len(sink.ledger("p")) == 1
        # A holder on another host cannot be checked: refused unless the operator says
        # it is stopped.
        sink.conn.execute(
            sink.dialect.q("UPDATE sparkonce_owner SET holder = %s WHERE pipeline = %s"),
            ("elsewhere.example pid 4242", "p"),
        )
        sink.conn.commit()
    assert main(["reset", "--pipeline", "p", "--sink", url, "--yes"]) == EXIT_RUNNING
    assert "elsewhere.example pid 4242" in capsys.readouterr().err
    with _sink(url) as sink:
        assert sink.owner("p") is not None
    assert main(["reset", "--pipeline", "p", "--sink", url, "--yes", "--holder-stopped"]) == 0
    with _sink(url) as sink:
        assert sink.owner("p") is None and _rows(sink) == [7, 8]


def test_reset_asks_first_naming_what_goes(
    url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _run_in_a_process_that_exits(url)
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert main(["reset", "--pipeline", "p", "--sink", url]) == EXIT_FAIL
    captured = capsys.readouterr()
    assert "1 rows of 'p' in sparkonce_ledger" in captured.out
    assert "1 row of 'p' in sparkonce_owner (epoch 1, taken by" in captured.out
    assert "The output rows are kept" in captured.out and "Proceed? [y/N]" in captured.out
    assert "nothing was deleted" in captured.err
    with _sink(url) as sink:
        assert sink.owner("p") is not None and len(sink.ledger("p")) == 1
    # --output-rows on a SQL sink needs the table's name; then it says the output goes.
    assert main(["reset", "--pipeline", "p", "--sink", url, "--output-rows"]) == EXIT_USAGE
    assert "--table TABLE" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("y\n"))
    args = ["reset", "--pipeline", "p", "--sink", url, "--output-rows", "--table", "out"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "THE PIPELINE'S OUTPUT" in out and "the output table out: dropped" in out
    assert "output deleted" in out
    with _sink(url) as sink:
        assert sink.owner("p") is None and sink.ledger("p") == []
        assert not sink.stager._declared_types("out")  # the table is gone


# The two-phase sink, without Spark: its own prepare and task function run on the protocol
# simulation's stand-in DataFrame (TaskFrame). Batch 0 commits through the sink's committer;
# batch 1's task pre-commits its rows, then the driver "dies" before its commit, leaving an
# invisible pre-commit behind. The process then exits, so its epoch reads as finished.
RUN_TWO_PHASE = """
import sys
import pyarrow as pa
from pyspark.sql.types import LongType, StructField, StructType
from sparkonce.ledger import BatchContext
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks import PostgresTwoPhaseSink
from sparkonce.verify.sim import TaskFrame

url, mode = sys.argv[1], sys.argv[2]
schema = StructType([StructField("v", LongType(), False)])

def frame(values):
    arrow = pa.schema([pa.field("v", pa.int64(), nullable=False)])
    return TaskFrame(schema, [pa.RecordBatch.from_pylist([{"v": v} for v in values], arrow)])

keys = ["v"] if mode == "upsert" else ()
with PostgresTwoPhaseSink(url, "out", mode=mode, keys=keys) as sink:
    epoch = sink.acquire("p").epoch
    first = BatchContext("p", epoch, BatchRanges((OffsetRange("ev", 0, 0, 3),)), 0)
    assert sink.commit(first, frame([1, 2, 3])).row_count == 3
    second = BatchContext("p", epoch, BatchRanges((OffsetRange("ev", 0, 3, 5),)), 1)
    sink.stager.prepare(second, frame([4, 5]), 1)
"""


@pytest.fixture
def pg_db(pg_server: PostgresServer) -> Iterator[str]:
    name = f"reset_{uuid.uuid4().hex[:8]}"
    yield pg_server.create_database(name)
    pg_server.drop_database(name)


def _two_phase_run(url: str, mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run(
        [sys.executable, "-c", RUN_TWO_PHASE, url, mode], env=env, check=True, timeout=120
    )


def _pg(url: str, sql: str, *args: Any) -> list[Any]:
    with _sink(url) as sink:
        return [tuple(r) for r in sink.conn.execute(sql, args).fetchall()]


def _attempts(url: str) -> list[Any]:
    return _pg(
        url, "SELECT state, count(*) FROM sparkonce_attempts WHERE pipeline = 'p' GROUP BY 1"
    )


def _relations(url: str) -> list[Any]:
    return _pg(
        url,
        "SELECT relname, relkind FROM pg_class WHERE relname LIKE 'out%%' "
        "AND relkind IN ('r', 'v') ORDER BY 1",
    )


@pytest.mark.parametrize("mode", ["append", "upsert"])
def test_reset_of_a_two_phase_sink_drops_its_view_tables_and_attempts(
    pg_db: str, mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _two_phase_run(pg_db, mode)
    assert sorted(r[0] for r in _pg(pg_db, 'SELECT v FROM "out"')) == [1, 2, 3]
    kind = "v" if mode == "append" else "r"
    precommit = "out__sparkonce_data" if mode == "append" else "out__sparkonce_stage"
    assert _relations(pg_db) == sorted([("out", kind), (precommit, "r")])
    assert ("precommitted", 1) in _attempts(pg_db)  # batch 1's task, never committed
    capsys.readouterr()
    args = ["reset", "--pipeline", "p", "--sink", pg_db, "--output-rows", "--table", "out"]
    assert main([*args, "--yes"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "output deleted" in out
    assert _relations(pg_db) == []  # the view or table, and the data or stage table
    assert _attempts(pg_db) == []
    with _sink(pg_db) as sink:
        assert sink.owner("p") is None and sink.ledger("p") == []


def test_ledger_only_reset_of_a_two_phase_sink_deletes_its_pre_commits(
    pg_db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_phase_run(pg_db, "append")
    data = 'SELECT count(*) FROM "out__sparkonce_data"'
    assert _pg(pg_db, data) == [(5,)]  # 3 committed rows, 2 pre-committed ones
    capsys.readouterr()
    monkeypatch.setattr(sys, "stdin", io.StringIO("n\n"))
    assert main(["reset", "--pipeline", "p", "--sink", pg_db]) == EXIT_FAIL
    out = capsys.readouterr().out
    assert "1 pre-committed attempt of 'p' in sparkonce_attempts" in out
    assert "invisible pre-commits of batches the reset forgets" in out
    assert "The output rows are kept" in out
    assert ("precommitted", 1) in _attempts(pg_db)  # answered no: nothing deleted
    assert main(["reset", "--pipeline", "p", "--sink", pg_db, "--yes"]) == 0
    assert "output kept" in capsys.readouterr().out
    # The output is kept and still visible (its committed attempts stay); the pre-commit
    # and its rows are gone.
    assert sorted(r[0] for r in _pg(pg_db, 'SELECT v FROM "out"')) == [1, 2, 3]
    assert _attempts(pg_db) == [("committed", 1)]
    assert _pg(pg_db, data) == [(3,)]
    with _sink(pg_db) as sink:
        assert sink.owner("p") is None and sink.ledger("p") == []
