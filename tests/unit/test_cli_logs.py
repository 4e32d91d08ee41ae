"""Spark's Python records stay off the terminal while a run's log file takes them, and after
it has closed: a record that Spark's threads log while winding down (a ``foreachBatch``
callback whose JVM went away on a SIGTERM to the process group) must not follow the run's
last line (seen once in the crash lane: ``test_sigterm_to_the_whole_process_group``)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from sparkonce.cli import logs


def _record(name: str, exc: BaseException | None = None) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, "a message", None, exc_info)


@pytest.fixture
def fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logs._RunLog, "active", 0)
    monkeypatch.setattr(logs._RunLog, "ended", False, raising=False)


@pytest.mark.usefixtures("fresh")
def test_spark_records_after_the_run_log_closed_stay_off_the_terminal(tmp_path: Path) -> None:
    quiet = logs._QuietCallbackErrors()
    py4j = "py4j.clientserver"
    assert quiet.filter(_record(py4j, RuntimeError("no JVM"))), "shown before any run log"

    with logs.spark_log_file("p", str(tmp_path / "run.log")):
        assert not quiet.filter(_record(py4j, RuntimeError("no JVM"))), "goes to the file"
        logging.getLogger(py4j).error("while the run's file is open")
    assert "while the run's file is open" in (tmp_path / "run.log").read_text()

    assert not quiet.filter(_record(py4j, RuntimeError("no JVM"))), "after the run's line"
    assert quiet.filter(_record("sparkonce.run")), "sparkonce's own lines still show"


@pytest.mark.usefixtures("fresh")
def test_without_a_run_log_a_spark_record_keeps_its_line_and_loses_its_traceback() -> None:
    quiet = logs._QuietCallbackErrors()
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        record = logging.LogRecord(
            "pyspark.sql", logging.ERROR, __file__, 1, "failed", None, sys.exc_info()
        )
    assert quiet.filter(record) and record.exc_info is None
