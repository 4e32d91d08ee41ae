"""What the runner drives for a watched run (:class:`~sparkonce.observe.base.RunWatch`),
without Spark: lag from a real embedded log, and failures that must never stop a run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce import EmbeddedLogSource
from sparkonce.ledger.base import CommitResult
from sparkonce.observe import Observers, RunObserver, RunStart
from sparkonce.observe.base import RunWatch
from sparkonce.observe.report import BatchReport
from sparkonce.offsets import BatchRanges, OffsetRange


def report(ends: dict[int, tuple[int, int]], rows: int, *, skipped: bool = False) -> BatchReport:
    ranges = BatchRanges(tuple(OffsetRange("events", p, s, e) for p, (s, e) in ends.items()))
    return BatchReport(0, ranges, CommitResult(skipped, rows, None if skipped else 0), 0.01)


class Recorder(RunObserver):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def on_start(self, start: RunStart) -> None:
        self.calls.append(f"start {start.epoch}")

    def on_batch(self, report: BatchReport) -> None:
        self.calls.append(f"batch {report.result.row_count}")


class Broken(RunObserver):
    def on_batch(self, report: BatchReport) -> None:
        raise RuntimeError("observer bug")


def test_lag_is_the_source_end_minus_the_committed_end(make_log: Callable[..., Path]) -> None:
    log_dir = make_log(90, partitions=3)
    source = EmbeddedLogSource(log_dir, "events")
    latest = source.latest_offsets()
    watch = RunWatch(RunObserver(), "p", source)
    assert watch.read_lag() == {tp: end for tp, end in latest.items()}  # nothing committed
    watch.batch(report({0: (0, 5), 1: (0, latest[("events", 1)])}, 10))
    watch.batch(report({0: (0, 3)}, 0, skipped=True))  # a replay moves nothing back
    lag = watch.read_lag()
    assert lag == {
        ("events", 0): latest[("events", 0)] - 5,
        ("events", 1): 0,
        ("events", 2): latest[("events", 2)],
    }


def test_a_source_that_cannot_be_read_warns_once_and_the_run_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    watch = RunWatch(RunObserver(), "p", EmbeddedLogSource(tmp_path / "gone", "events"))
    with caplog.at_level(logging.DEBUG, logger="sparkonce.observe"):
        assert watch.read_lag() is None
        assert watch.read_lag() is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "could not read the source's end offsets for lag" in warnings[0].getMessage()


def test_an_observer_that_raises_is_logged_once_and_ignored(
    caplog: pytest.LogCaptureFixture, make_log: Callable[..., Path]
) -> None:
    recorder = Recorder()
    source = EmbeddedLogSource(make_log(9, partitions=1), "events")
    watch = RunWatch(Observers(Broken(), recorder), "p", source)
    with caplog.at_level(logging.WARNING, logger="sparkonce.observe"):
        watch.batch(report({0: (0, 4)}, 4))
        watch.batch(report({0: (4, 9)}, 5))
        watch.end(None)
        watch.end(None)  # once only
    assert recorder.calls == ["batch 4", "batch 5"]  # the other observer got every call
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "observer Broken failed in on_batch (ignored): observer bug" in warnings[0]
