"""Every fault kind once per sink family, each in its own real driver run: make test's
crash tests for SQLite, PostgreSQL, two-phase PostgreSQL, Delta Lake and Apache Iceberg.

Each test is the ``make test`` representative (``covers``) of its family's four (family,
fault kind) pairs (Delta and Iceberg: three, they hold no store connection to drop);
tests/crash/test_kafka_crash.py has the Kafka sink's. The full matrix
(every crash point on every store, and so on) runs in ``make test-crash``, and zombie repeats
in ``make test-campaign``. A separate test
per pair would start about six drivers per family, which ``make test`` cannot afford; here
three drivers share one pipeline and one store, and each fault has its own run and its own
checks:

1. **task-failure, then zombie-to-be.** Run A (``local[2,4]``, so Spark retries tasks)
   commits batches 0 and 1 while about half of its read tasks fail halfway on their first
   attempt (two-phase: its write tasks too, after their pre-commit is durable; the choice
   depends on the task's data, and batch 1's write tasks are chosen). It then stops itself
   (SIGSTOP) inside its 3rd commit, before the sink transaction opens. Each batch must be
   exactly its 600 rows, once.
2. **crash-point.** Run B, the same pipeline from a new machine (its own empty checkpoint),
   takes epoch 2, which fences A, resumes from the ledger, and is SIGKILLed at the family's
   crash point in its first commit (batch 2). The store must hold what the protocol promises
   at that point: batch 2 committed in full, or not at all.
3. **db-drop.** Run C, on B's checkpoint, recovers B's batch and finishes while its store
   connection drops inside its first commit transaction (``after-rows@1``): it must commit on
   a new connection, once. The output must then equal the oracle's exactly.
4. **zombie.** A is continued: its commit must be fenced (exit code 3) and change nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest

from sparkonce.cli import EXIT_FENCED
from sparkonce.protocol import DROP_CONNECTION_ENV, FAIL_TASKS_ENV, PAUSE_ENV, CrashPoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from sparkonce.verify.injection import RETRY_MASTER
from tests.crash.conftest import (
    KEYS,
    PARTITIONS,
    RECORDS,
    ROWS_PER_BATCH,
    STATELESS_TABLE,
    Oracle,
    SinkState,
    event_tuples,
    open_transaction,
    read_sink,
    run_driver,
    wait_until_stopped,
    write_pipeline,
)
from tests.crash.test_crash_points import ROLLED_BACK, _check_final

# The crash point each family's run B dies at: one each of the three ways a batch can end.
CRASH_AT = {
    "sqlite": CrashPoint.AFTER_LEDGER_COMMIT,  # committed in the sink, not in Spark: a replay
    "postgres": CrashPoint.BEFORE_LEDGER_COMMIT,  # rows and ledger row written, rolled back
    "postgres-2pc": CrashPoint.AFTER_ROWS,  # pre-commits durable, flip rolled back: collected
    # Delta: the entry file of (epoch 2, batch 2) is written, the Delta commit is not; run C
    # commits batch 2 under epoch 3, and the ledger must read back epoch 3's entry.
    "delta": CrashPoint.BEFORE_LEDGER_COMMIT,
    # Iceberg: Spark's tasks have written batch 2's data files, the catalog commit that adds
    # them with the ledger entry has not run. They are never added; run C writes its own.
    "iceberg": CrashPoint.AFTER_ROWS,
}
NO_CONNECTION = ("delta", "iceberg")  # no store connection to drop, no transaction to see
KINDS = ("task-failure", "zombie", "crash-point", "db-drop")


def _family(name: str) -> object:
    kinds = [k for k in KINDS if k != "db-drop" or name not in NO_CONNECTION]
    return pytest.param(name, marks=[pytest.mark.covers(name, kind) for kind in kinds])


def _pending(url: str) -> int:
    """Two-phase sink: pre-committed attempts nobody has flipped or collected yet."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM sparkonce_attempts WHERE state = 'precommitted'"
        ).fetchone()
    assert row is not None
    return int(row[0])


def _visible_equals_ledger(state: SinkState, where: str) -> None:
    """The table holds exactly the rows of the ledger's ranges, each once."""
    covered = {
        (r.partition, o)
        for e in state.ledger
        for r in e.ranges.ranges
        for o in range(r.start, r.end)
    }
    visible = [(int(row["partition"]), int(row["offset"])) for row in state.rows]
    assert len(visible) == len(set(visible)), f"{where}: a row is visible twice"
    assert set(visible) == covered, f"{where}: rows outside the ledger's ranges, or missing"
    assert all(e.row_count == ROWS_PER_BATCH for e in state.ledger), where


@pytest.mark.parametrize(
    "family", [_family(f) for f in ("sqlite", "postgres", "postgres-2pc", "delta", "iceberg")]
)
def test_each_fault_kind_once(
    family: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    two_phase = family == "postgres-2pc"
    delta = family == "delta"
    no_connection = family in NO_CONNECTION
    if family == "sqlite":
        url = f"sqlite:///{tmp_path / 'sink.db'}"
    elif delta:
        request.getfixturevalue("spark")  # the test process reads the table through Spark
        url = f"delta://{tmp_path / 'tables'}"
    elif family == "iceberg":  # read back with PyIceberg's scan (and DuckDB at the end)
        url = f"iceberg+sqlite:///{tmp_path / 'iceberg' / 'catalog.db'}?table=crash.events_out"
    else:
        url = str(request.getfixturevalue("pg_url"))
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    # Same pipeline name and sink, different checkpoint directories: two machines.
    files = {}
    for machine in ("a", "b"):
        (tmp_path / machine).mkdir()
        files[machine] = write_pipeline(
            tmp_path / machine,
            log_dir=log_dir,
            sink_url=url,
            checkpoint=tmp_path / machine / "ckpt",
            two_phase=two_phase,
        )

    # 1. task-failure: A commits batches 0 and 1 through failing (and retried) tasks, then
    # pauses.
    run_a = Driver(
        files["a"],
        tmp_path / "run_a.log",
        env={PAUSE_ENV: "before-commit@3", FAIL_TASKS_ENV: "read,write" if two_phase else "read"},
        extra_args=("--master", RETRY_MASTER),
    )
    drivers.append(run_a.start())
    wait_until_stopped(run_a)
    state = read_sink(url, STATELESS_TABLE)
    where = f"run A paused (task failures, then zombie-to-be)\n{run_a.log_tail()}"
    # Spark's Python workers record each injected failure as a fault event.
    stages = {e["stage"] for e in run_a.events("task-failure")}
    assert stages == ({"read", "write"} if two_phase else {"read"}), f"failed: {stages}; {where}"
    if not no_connection:
        assert open_transaction(url) is None, f"run A stopped inside a transaction: {where}"
    assert [(e.seq, e.epoch) for e in state.ledger] == [(0, 1), (1, 1)], where
    _visible_equals_ledger(state, where)
    if two_phase:
        assert _pending(url) == 0, f"failed attempts' pre-commits were not collected: {where}"

    # 2. crash-point: B takes over from a new machine and is killed in its first commit.
    point = CRASH_AT[family]
    run_b = Driver(files["b"], tmp_path / "run_b.log", crash_at=point, crash_hit=1)
    drivers.append(run_b.start())
    code = run_driver(run_b)
    assert code == SIGKILL_EXIT, f"run B exited {code}, not SIGKILL:\n{run_b.log_tail()}"
    state = read_sink(url, STATELESS_TABLE)
    where = f"run B killed at {point}: ledger {state.ledger}\n{run_b.log_tail()}"
    assert state.owner is not None and state.owner.epoch == 2, where
    batches = [(0, 1), (1, 1)] if point in ROLLED_BACK else [(0, 1), (1, 1), (2, 2)]
    assert [(e.seq, e.epoch) for e in state.ledger] == batches, where
    _visible_equals_ledger(state, where)
    if point is CrashPoint.AFTER_ROWS and two_phase:
        assert _pending(url) > 0, f"the killed batch left no pre-committed attempts: {where}"

    # 3. db-drop: C recovers on B's checkpoint and loses its connection in its first commit
    # (Delta, Iceberg: C only recovers; their commits have no store connection).
    env = {} if no_connection else {DROP_CONNECTION_ENV: "after-rows@1"}
    run_c = Driver(files["b"], tmp_path / "run_c.log", env=env)
    drivers.append(run_c.start())
    code = run_driver(run_c)
    assert code == 0, f"run C exited {code}:\n{run_c.log_tail()}"
    fired = run_c.events()
    want = [] if no_connection else [("drop-connection", "after-rows")]
    assert [(e["event"], e["point"]) for e in fired] == want, (
        f"fault events {fired}:\n{run_c.log_tail()}"
    )
    try:
        _check_final(url, oracle)  # every record once, as the oracle has it; a gap-free ledger
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nrun C log tail:\n{run_c.log_tail()}") from None
    if two_phase:
        assert _pending(url) == 0, "run C left pre-committed attempts behind"
    after_c = read_sink(url, STATELESS_TABLE)
    assert after_c.owner is not None and after_c.owner.epoch == 3, after_c.owner

    # 4. zombie: A wakes up inside its 3rd commit and must be fenced, writing nothing.
    assert run_a.poll() is None, f"run A died while paused:\n{run_a.log_tail()}"
    run_a.resume()
    code = run_driver(run_a)
    assert code == EXIT_FENCED, f"run A exited {code}, not fenced (3):\n{run_a.log_tail()}"
    [fenced] = run_a.events("fenced")
    assert (fenced["epoch"], fenced["owner_epoch"]) == (1, 3), run_a.log_tail()
    final = read_sink(url, STATELESS_TABLE)
    assert final.ledger == after_c.ledger, "the fenced run changed the ledger"
    assert event_tuples(final.rows) == event_tuples(after_c.rows), "the fenced run wrote rows"
    if family == "iceberg":  # a second reader that shares no code with PyIceberg
        from sparkonce.sinks.iceberg_url import parse_iceberg_url
        from tests.iceberg.readers import duckdb_rows

        catalog = parse_iceberg_url(url).open_catalog()
        cols = ["record_id", "partition", "offset", "value"]
        got = Counter(duckdb_rows(catalog, "crash.events_out", cols))
        assert got == event_tuples(final.rows), "DuckDB reads other rows than PyIceberg"
