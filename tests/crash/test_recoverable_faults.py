"""Faults a run recovers from by itself, in a real driver: no restart, exact output.

- **db-drop**: the sink loses its store connection inside the commit transaction of batch 1
  (``SPARKONCE_DROP_CONNECTION_AT=after-rows@2``; SQLite closes the connection, PostgreSQL
  terminates the session). The committer must retry on a new connection and commit the batch
  exactly once. Applies to the SQL sink families: SQLite, PostgreSQL, two-phase PostgreSQL.
- **task-failure**: about half of the read tasks fail halfway on their first attempt
  (``SPARKONCE_FAIL_TASKS=read``) under a master that retries tasks (``local[2,4]``); the
  retries must read the same records. The two-phase sink's own case, write tasks failing
  after their pre-commit, is in test_twophase_crash.py, and Kafka's in test_kafka_crash.py.

Each test is the ``make test`` representative of its (sink family, fault kind) pair.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.faults import EVENTS_ENV
from sparkonce.protocol import DROP_CONNECTION_ENV, FAIL_TASKS_ENV
from sparkonce.verify.campaign import RETRY_MASTER
from sparkonce.verify.driver import Driver
from tests.crash.conftest import KEYS, PARTITIONS, RECORDS, Oracle, run_driver, write_pipeline
from tests.crash.test_crash_points import _check_final


def _store_url(family: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if family == "sqlite":
        return f"sqlite:///{tmp_path / 'sink.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.covers(family, "db-drop"))
        for family in ("sqlite", "postgres", "postgres-2pc")
    ],
)
def test_a_connection_dropped_mid_commit_is_retried_and_commits_once(
    family: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    url = _store_url(family, tmp_path, request)
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(
        tmp_path, log_dir=log_dir, sink_url=url, two_phase=family == "postgres-2pc"
    )
    events = tmp_path / "faults.jsonl"
    run = Driver(
        pipeline_file,
        tmp_path / "run.log",
        env={DROP_CONNECTION_ENV: "after-rows@2", EVENTS_ENV: str(events)},
    )
    drivers.append(run.start())
    code = run_driver(run)
    assert code == 0, f"the run exited {code}:\n{run.log_tail()}"
    fired = (
        [json.loads(line) for line in events.read_text().splitlines()] if events.exists() else []
    )
    assert [(e["event"], e["point"], e["hit"]) for e in fired] == [
        ("drop-connection", "after-rows", 2)
    ], f"fault events {fired}:\n{run.log_tail()}"
    # The connection was gone inside batch 1's transaction: the run could only finish (exit
    # 0) with every record once by committing that batch again on a new connection.
    try:
        _check_final(url, oracle)  # every record once, a gap-free ledger
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun log tail:\n{run.log_tail()}") from None


@pytest.mark.parametrize(
    "family",
    [
        pytest.param(family, marks=pytest.mark.covers(family, "task-failure"))
        for family in ("sqlite", "postgres")
    ],
)
def test_failed_read_tasks_are_retried_and_commit_every_record_once(
    family: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    url = _store_url(family, tmp_path, request)
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    pipeline_file = write_pipeline(tmp_path, log_dir=log_dir, sink_url=url)
    run = Driver(
        pipeline_file,
        tmp_path / "run.log",
        env={FAIL_TASKS_ENV: "read"},
        extra_args=("--master", RETRY_MASTER),
    )
    drivers.append(run.start())
    code = run_driver(run)
    assert code == 0, f"the run exited {code}:\n{run.log_tail()}"
    # Spark's Python workers record each injected failure as a fault event.
    assert run.events("task-failure"), "no read task failed: nothing was tested"
    try:
        _check_final(url, oracle)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun log tail:\n{run.log_tail()}") from None
