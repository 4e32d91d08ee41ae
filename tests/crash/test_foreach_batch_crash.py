"""sparkonce.foreach_batch in a user's own PySpark program, SIGKILLed at every crash point of
the commit protocol.

The program is the user's: it builds its session, reads four JSON files written here (moved
in whole, one per batch) and hands ``writeStream.foreachBatch`` sparkonce's function, on one
checkpoint for every run. The oracle is the files' ids, each once, computed here; the output
is read with sqlite3.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sparkonce.ledger.base import LedgerEntry
from sparkonce.offsets import check_chain
from sparkonce.protocol import CrashPoint
from sparkonce.sinks import sink_from_url
from sparkonce.verify.driver import Driver
from tests.crash.conftest import json_inbox, kill_chain, replays_skipped

pytestmark = pytest.mark.crash_lane  # five driver processes

FILES = 4
PER_FILE = 6

_PROGRAM = '''"""A user's own query whose foreachBatch is sparkonce's."""

from sparkonce import build_session, foreach_batch, sink_from_url
from sparkonce.faults import FaultPlan

spark = build_session(quick_start=True)
events = (
    spark.readStream.schema("id long, k string").option("maxFilesPerTrigger", 1).json({inbox!r})
)
write = foreach_batch(
    sink_from_url({sink!r}, "out"),
    name="user-write",
    checkpoint={checkpoint!r},
    faults=FaultPlan.from_env(),
)
query = (
    events.select("id", "k")
    .writeStream.foreachBatch(write)
    .option("checkpointLocation", {checkpoint!r})
    .trigger(availableNow=True)
    .start()
)
query.awaitTermination()
report = write.report
print(
    f"committed {{report.batches_committed}} batches, "
    f"skipped {{report.batches_skipped}} replayed batches"
)
'''


def sqlite_ids(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return sorted(r[0] for r in conn.execute("SELECT id FROM out"))


def ledger(url: str) -> list[LedgerEntry]:
    sink = sink_from_url(url, "out")
    sink.open()
    try:
        return sink.ledger("user-write")
    finally:
        sink.close()


def test_user_program_killed_at_every_crash_point_then_exact(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """Runs 1-3 commit one batch each and die in the next (before its commit, after its
    rows, before its ledger commit); run 4 dies right after batch 3's ledger commit, before
    Spark's commit log. After each kill the table holds exactly the ledger's batches; the
    last run skips the replayed batch 3 and the table holds each id once."""
    inbox, expected = json_inbox(tmp_path, FILES, PER_FILE)
    db = tmp_path / "sink.db"
    url = f"sqlite:///{db}"
    program = tmp_path / "program.py"
    program.write_text(
        _PROGRAM.format(inbox=str(inbox), sink=url, checkpoint=str(tmp_path / "checkpoint"))
    )

    def check(run: int, point: CrashPoint) -> None:
        entries = ledger(url)
        assert len(entries) == run, f"after the kill at {point}: {len(entries)} entries"
        assert sqlite_ids(db) == sorted(expected[: run * PER_FILE]), f"after the kill at {point}"

    last = kill_chain(
        program,
        tmp_path,
        drivers,
        CrashPoint,
        hit=lambda _run, point: 1 if point is CrashPoint.AFTER_LEDGER_COMMIT else 2,
        check=check,
        entry=("tests.crash.user_program",),
    )
    assert replays_skipped(last) == 1, last.log_tail()
    assert sqlite_ids(db) == sorted(expected), last.log_tail()
    entries = ledger(url)
    assert check_chain(e.ranges for e in entries) == []
    assert [e.epoch for e in entries] == [1, 2, 3, 4], entries
