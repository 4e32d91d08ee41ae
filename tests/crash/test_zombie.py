"""A zombie run alongside a newer one: the older run is fenced and writes nothing.

One test per SQL sink family (SQLite, PostgreSQL, two-phase PostgreSQL), in ``make
test-campaign``; ``make test`` fences a zombie of each family in
tests/crash/test_fault_kinds.py.

Run A stops itself (SIGSTOP through ``SPARKONCE_PAUSE_AT``) after its 1st commit and before its
2nd, outside any transaction: a driver that looks dead but is not. Run B, the same pipeline on
the same sink from a new machine (an empty checkpoint directory), takes epoch 2, resumes from
the ledger and finishes. Then A is continued: its 2nd commit must be fenced (exit code 3) and
the output must still be exactly the oracle's.

Where A pauses: ``before-commit@2``, inside its 2nd commit after the replay check (step 0)
and before its sink transaction opens, so it is stopped outside any transaction (which the
test checks). The pause stops the calling thread itself (see test_pause_point.py). A pause at
``after-ledger-commit@1`` would test less: A's next batches are then replays of what B
committed, which step 0 skips before any owner check, so A finishes (exit 0) without writing
anything and without being told it was fenced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import EXIT_FENCED
from sparkonce.offsets import check_chain
from sparkonce.protocol import PAUSE_ENV
from sparkonce.verify.driver import Driver
from tests.crash.conftest import (
    KEYS,
    PARTITIONS,
    RECORDS,
    ROWS_PER_BATCH,
    STATELESS_TABLE,
    Oracle,
    event_tuples,
    open_transaction,
    read_sink,
    run_driver,
    wait_until_stopped,
    write_pipeline,
)

ZOMBIE_PAUSE = "before-commit@2"


pytestmark = pytest.mark.campaign_lane


# One sink of each SQL family; tests/crash/test_kafka_crash.py has the Kafka zombie.
@pytest.mark.parametrize("family", ["sqlite", "postgres", "postgres-2pc"])
def test_zombie_run_is_fenced(
    family: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_log: Callable[..., Path],
    oracle: Oracle,
    drivers: list[Driver],
) -> None:
    store_url = (
        f"sqlite:///{tmp_path / 'sink.db'}"
        if family == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    two_phase = family == "postgres-2pc"
    log_dir = make_log(RECORDS, partitions=PARTITIONS, keys=KEYS)
    # Same pipeline name and sink, different checkpoint directories: two machines.
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    file_a = write_pipeline(
        tmp_path / "a",
        log_dir=log_dir,
        sink_url=store_url,
        checkpoint=tmp_path / "a" / "ckpt",
        two_phase=two_phase,
    )
    file_b = write_pipeline(
        tmp_path / "b",
        log_dir=log_dir,
        sink_url=store_url,
        checkpoint=tmp_path / "b" / "ckpt",
        two_phase=two_phase,
    )

    # Run A: commits batch 0, then stops itself before committing batch 1.
    run_a = Driver(file_a, tmp_path / "run_a.log", env={PAUSE_ENV: ZOMBIE_PAUSE})
    drivers.append(run_a.start())
    wait_until_stopped(run_a)
    paused = read_sink(store_url, STATELESS_TABLE)
    where = f"run A paused: ledger {paused.ledger}, owner {paused.owner}\n{run_a.log_tail()}"
    holder = open_transaction(store_url)
    assert holder is None, f"run A stopped inside a transaction: {holder}\n{where}"
    assert paused.owner is not None and paused.owner.epoch == 1, where
    assert [(e.seq, e.epoch) for e in paused.ledger] == [(0, 1)], where
    assert len(paused.rows) == ROWS_PER_BATCH, where

    # Run B: a new machine takes the pipeline over and finishes it.
    run_b = Driver(file_b, tmp_path / "run_b.log")
    drivers.append(run_b.start())
    code = run_driver(run_b)
    assert code == 0, f"run B exited with {code}:\n{run_b.log_tail()}"
    assert "resumed from ledger" in run_b.log_path.read_text(errors="replace"), run_b.log_tail()
    after_b = read_sink(store_url, STATELESS_TABLE)
    assert len(after_b.rows) == RECORDS, run_b.log_tail()

    # Run A wakes up: its 2nd commit must be fenced, and it must write nothing.
    assert run_a.poll() is None, f"run A died while paused:\n{run_a.log_tail()}"
    run_a.resume()
    code = run_driver(run_a)
    assert code == EXIT_FENCED, f"run A exited with {code}, not fenced (3):\n{run_a.log_tail()}"
    [fenced] = run_a.events("fenced")
    assert (fenced["epoch"], fenced["owner_epoch"]) == (1, 2), run_a.log_tail()

    final = read_sink(store_url, STATELESS_TABLE)
    assert final.ledger == after_b.ledger, "the fenced run changed the ledger"
    got = event_tuples(final.rows)
    ids = [str(r["record_id"]) for r in final.rows]
    assert len(ids) == len(set(ids)) == RECORDS, f"{len(ids)} rows, {len(set(ids))} distinct ids"
    missing, extra = oracle.events - got, got - oracle.events
    assert got == oracle.events, f"missing {list(missing)[:5]}, extra {list(extra)[:5]}"
    assert final.owner is not None and final.owner.epoch == 2, final.owner
    newer = final.ledger[len(paused.ledger) :]
    assert newer, "run B committed nothing"
    assert all(e.epoch == 2 for e in newer), [(e.seq, e.epoch) for e in final.ledger]
    assert check_chain(e.ranges for e in final.ledger) == []
    assert [e.seq for e in final.ledger] == list(range(len(final.ledger)))
    assert sum(e.row_count for e in final.ledger) == RECORDS
