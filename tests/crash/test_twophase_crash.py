"""SIGKILL a driver writing through the two-phase PostgreSQL sink at every crash point.

The crash points map to the 2PC steps: ``before-commit`` is before the batch's tasks
pre-commit; ``after-rows`` is after the tasks' pre-commits are durable and the driver's
transaction has flipped the successful attempts; ``before-ledger-commit`` has the ledger row
too; ``after-ledger-commit`` is after the driver's COMMIT. As in test_crash_points.py, one
chain of runs on one checkpoint is killed at each point in turn, in batch 1: each run must
collect what the run before it pre-committed, and the run after the last kill must finish
with exactly the oracle's output. Another test fails write tasks *after* their pre-commit
is durable, so Spark retries them and the failed attempts' rows must never show.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sparkonce.protocol import FAIL_TASKS_ENV, CrashPoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from sparkonce.verify.injection import RETRY_MASTER
from tests.crash.conftest import (
    KEYS,
    PARTITIONS,
    RECORDS,
    STATEFUL_TABLE,
    STATELESS_TABLE,
    Oracle,
    read_sink,
    run_driver,
    sums_by_key,
    write_pipeline,
)
from tests.crash.test_crash_points import _check_final, _check_intermediate

# make test-crash; make test's two-phase crash test is in test_fault_kinds.py.
pytestmark = pytest.mark.crash_lane


def _pending(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sparkonce_attempts WHERE state = 'precommitted'"
        ).fetchone()
        assert row is not None
        return int(row[0])


def test_two_phase_every_crash_point_then_recover(
    pg_url: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir=log_dir, sink_url=pg_url, two_phase=True)
    checkpoint = tmp_path / "checkpoint"

    left = 0  # pre-committed attempts the killed run before left behind
    for run, point in enumerate(CrashPoint, start=1):
        hit = 2 if run == 1 else 1  # run 1 commits batch 0 first; later runs start at batch 1
        killed = Driver(pipeline_file, tmp_path / f"run{run}.log", crash_at=point, crash_hit=hit)
        drivers.append(killed.start())
        code = run_driver(killed)
        where = f"run {run} ({point})"
        assert code == SIGKILL_EXIT, f"{where} exited with {code}:\n{killed.log_tail()}"
        if left:
            assert "collected" in killed.log_path.read_text(errors="replace"), (
                f"{where} did not collect the {left} attempts left before it:\n{killed.log_tail()}"
            )
        try:
            _check_intermediate(point, pg_url, STATELESS_TABLE, checkpoint, epoch=run)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{where} log tail:\n{killed.log_tail()}") from None
        left = _pending(pg_url)
        if point in (CrashPoint.AFTER_ROWS, CrashPoint.BEFORE_LEDGER_COMMIT):
            # The tasks' pre-commits are durable, but the driver's flip was rolled back.
            assert left > 0, f"{where}: the killed batch left no pre-committed attempts"
        else:
            assert left == 0, f"{where}: {left} pre-committed attempts left"

    last = Driver(pipeline_file, tmp_path / "last.log")
    drivers.append(last.start())
    code = run_driver(last)
    assert code == 0, f"the last run exited with {code}:\n{last.log_tail()}"
    try:
        _check_final(pg_url, oracle)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nlast run's log tail:\n{last.log_tail()}") from None
    assert _pending(pg_url) == 0


def test_two_phase_upsert_survives_a_kill_after_the_flip(
    pg_url: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    """Per-key sums, merged into the table at commit: killed mid-commit, then exact."""
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(
        tmp_path, log_dir=log_dir, sink_url=pg_url, kind="stateful", two_phase=True
    )
    run1 = Driver(pipeline_file, tmp_path / "run1.log", crash_at=CrashPoint.AFTER_ROWS, crash_hit=2)
    drivers.append(run1.start())
    assert run_driver(run1) == SIGKILL_EXIT, run1.log_tail()
    assert len(read_sink(pg_url, STATEFUL_TABLE).ledger) == 1
    run2 = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(run2.start())
    assert run_driver(run2) == 0, run2.log_tail()
    state = read_sink(pg_url, STATEFUL_TABLE)
    assert sums_by_key(state.rows) == oracle.sums, run2.log_tail()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM sums__sparkonce_stage").fetchone()
    assert row == (0,)


def test_write_tasks_failing_after_their_pre_commit_are_retried_and_never_visible(
    pg_url: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir=log_dir, sink_url=pg_url, two_phase=True)
    run = Driver(
        pipeline_file,
        tmp_path / "run.log",
        env={FAIL_TASKS_ENV: "write"},
        extra_args=("--master", RETRY_MASTER),
    )
    drivers.append(run.start())
    assert run_driver(run) == 0, run.log_tail()
    failed = run.events("task-failure")  # recorded by Spark's Python workers
    assert failed and {e["stage"] for e in failed} == {"write"}, run.log_tail()
    text = run.full_log()  # the driver's output and Spark's log
    assert "collected" in text, "the failed attempts' rows were never collected"
    _check_final(pg_url, oracle)
    assert _pending(pg_url) == 0
