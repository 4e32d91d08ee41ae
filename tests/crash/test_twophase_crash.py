"""SIGKILL a driver writing through the two-phase PostgreSQL sink at every crash point.

The crash points map to the 2PC steps: ``before-commit`` is before the batch's tasks
pre-commit; ``after-rows`` is after the tasks' pre-commits are durable and the driver's
transaction has flipped the successful attempts; ``before-ledger-commit`` has the ledger row
too; ``after-ledger-commit`` is after the driver's COMMIT. Run 1 is killed in batch 1; run 2
(same checkpoint) must collect what run 1 pre-committed and finish with exactly the oracle's
output. A third test fails write tasks *after* their pre-commit is durable, so Spark retries
them and the failed attempts' rows must never show.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sparkonce.protocol import FAIL_TASKS_ENV, CrashPoint
from sparkonce.verify.campaign import RETRY_MASTER
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
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
pytestmark = [pytest.mark.postgres, pytest.mark.crash_lane]


def _pending(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sparkonce_attempts WHERE state = 'precommitted'"
        ).fetchone()
        assert row is not None
        return int(row[0])


@pytest.mark.parametrize("point", list(CrashPoint), ids=[p.value for p in CrashPoint])
def test_two_phase_crash_point_then_recover(
    point: CrashPoint,
    pg_url: str,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir=log_dir, sink_url=pg_url, two_phase=True)
    checkpoint = tmp_path / "checkpoint"

    run1 = Driver(pipeline_file, tmp_path / "run1.log", crash_at=point, crash_hit=2)
    drivers.append(run1.start())
    code = run_driver(run1)
    assert code == SIGKILL_EXIT, f"run 1 exited with {code}, not SIGKILL:\n{run1.log_tail()}"
    try:
        _check_intermediate(point, pg_url, STATELESS_TABLE, checkpoint)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun 1 log tail:\n{run1.log_tail()}") from None
    left = _pending(pg_url)
    if point in (CrashPoint.AFTER_ROWS, CrashPoint.BEFORE_LEDGER_COMMIT):
        # The tasks' pre-commits are durable, but the driver's flip was rolled back.
        assert left > 0, "the killed batch left no pre-committed attempts"
    else:
        assert left == 0

    run2 = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(run2.start())
    code = run_driver(run2)
    assert code == 0, f"run 2 exited with {code}:\n{run2.log_tail()}"
    if left:
        assert "collected" in run2.log_path.read_text(errors="replace"), run2.log_tail()
    try:
        _check_final(pg_url, oracle)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun 2 log tail:\n{run2.log_tail()}") from None
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
