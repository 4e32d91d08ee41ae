"""Delta to PostgreSQL in real driver processes (``sparkonce run FILE``), SIGKILLed at every
crash point of the commit protocol in turn, then run to the end.

The source table is written here, on the shared session, before any driver starts: versions
0..3, each appending ids ``v*100 .. v*100+11`` in 3 files; the pipeline starts at version 0
and reads 3 files a batch, so batch ``n`` is version ``n``. Run 1 dies at ``before-commit``
in batch 1, run 2 at ``after-rows`` in batch 2, run 3 at ``before-ledger-commit`` in batch
3, run 4 at ``after-ledger-commit`` of batch 3 (committed in PostgreSQL, not in Spark's
commit log); the last run replays batch 3 and skips it. The oracle is the upstream table
read without Spark (pyarrow on the files its log names); the output is read with psycopg.
After every kill the table holds exactly the batches the ledger has, and at the end every
upstream row once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkonce.ledger.base import LedgerEntry
from sparkonce.offsets import check_chain
from sparkonce.protocol import CrashPoint
from sparkonce.sinks import sink_from_url
from sparkonce.verify.driver import Driver
from tests.crash.conftest import kill_chain
from tests.crash.test_delta_source_crash import write_pipeline
from tests.delta.test_delta_pg import pg_rows
from tests.delta.test_source import ROWS, append_versions, delta_ids

pytestmark = pytest.mark.crash_lane  # five driver runs (100-200 s)

VERSIONS = 4


def test_kill_delta_to_postgres_at_every_crash_point_then_recover(
    spark: SparkSession, tmp_path: Path, pg_url: str, drivers: list[Driver]
) -> None:
    upstream = tmp_path / "bronze"
    written = append_versions(spark, upstream, range(VERSIONS))
    assert delta_ids(upstream) == written  # the oracle, read without Spark
    want = [(i, i % 7) for i in written]
    sink = f'sink_from_url({pg_url!r}, "out")'
    pipeline_file = write_pipeline(tmp_path, upstream, sink, ", starting_version=0")

    def check(run: int, point: CrashPoint) -> None:
        ledger = _ledger(pg_url)
        # Exactly the batches in the ledger are visible, each once: version n is batch n.
        assert pg_rows(pg_url, "out") == want[: len(ledger) * ROWS], f"after the kill at {point}"
        # Runs 1-3 committed one batch each before they died; run 4 its batch, then died.
        assert len(ledger) == run, f"after the kill at {point}: {len(ledger)} entries"

    last = kill_chain(
        pipeline_file,
        tmp_path,
        drivers,
        CrashPoint,
        # Runs 1-3 commit one batch each and die in the next; run 4 dies right after batch
        # 3's commit, before Spark's commit log has it.
        hit=lambda _run, point: 1 if point is CrashPoint.AFTER_LEDGER_COMMIT else 2,
        check=check,
    )
    assert "skipped 1 replayed batches" in last.log_path.read_text(errors="replace"), (
        last.log_tail()
    )
    assert pg_rows(pg_url, "out") == want, last.log_tail()
    ledger = _ledger(pg_url)
    assert check_chain(e.ranges for e in ledger) == []
    assert [e.seq for e in ledger] == list(range(VERSIONS))
    assert [e.row_count for e in ledger] == [ROWS] * VERSIONS


def _ledger(url: str) -> list[LedgerEntry]:
    sink = sink_from_url(url, "out")
    try:
        return sink.ledger("delta-src")
    finally:
        sink.close()
