"""SparkSource in real driver processes (``sparkonce run FILE``) SIGKILLed at a protocol step.

The pipeline file hands sparkonce the user's own ``spark.readStream...json(dir)`` query as a
function; the input is four JSON files written here (moved in whole), one file per batch. The
oracle is their ids, each once, computed here; the output is read with sqlite3.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from tests.crash.conftest import json_inbox, replays_skipped, run_driver

FILES = 4
PER_FILE = 6

_PIPELINE = '''"""A SparkSource crash-test pipeline (tests/crash/test_spark_source_crash.py)."""

from sparkonce import Pipeline, SparkSource, sink_from_url


def events(spark):
    return (
        spark.readStream.schema("id long, k string")
        .option("maxFilesPerTrigger", 1)
        .json({inbox!r})
    )


pipeline = Pipeline(
    name="user-query",
    source=SparkSource(events),
    transform=lambda df: df.select("id", "k"),
    sink=sink_from_url({sink!r}, "out"),
    checkpoint={checkpoint!r},
)
'''


def sqlite_ids(db: Path) -> list[int]:
    with sqlite3.connect(db) as conn:
        return sorted(r[0] for r in conn.execute("SELECT id FROM out"))


@pytest.mark.crash_lane
def test_user_query_killed_after_its_ledger_commit_then_rerun_is_exact(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    """SIGKILL after batch 1's SQLite commit, before Spark's commit log: the rerun replays
    batch 1 from the file source's own log, skips it by its range, reads on, and the table
    holds each id of the four files once."""
    inbox, expected = json_inbox(tmp_path, FILES, PER_FILE)
    db = tmp_path / "sink.db"
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _PIPELINE.format(
            inbox=str(inbox), sink=f"sqlite:///{db}", checkpoint=str(tmp_path / "checkpoint")
        )
    )

    run1 = Driver(
        pipeline_file, tmp_path / "run1.log", crash_at=CrashPoint.AFTER_LEDGER_COMMIT, crash_hit=2
    )
    drivers.append(run1.start())
    code = run_driver(run1)
    assert code == SIGKILL_EXIT, f"run 1 exited with {code}, not SIGKILL:\n{run1.log_tail()}"
    assert sqlite_ids(db) == sorted(expected[: 2 * PER_FILE]), run1.log_tail()

    run2 = Driver(pipeline_file, tmp_path / "run2.log")
    drivers.append(run2.start())
    code = run_driver(run2)
    assert code == 0, f"run 2 exited with {code}:\n{run2.log_tail()}"
    assert replays_skipped(run2) == 1, run2.log_tail()
    assert sqlite_ids(db) == sorted(expected), run2.log_tail()
