"""The live progress display of ``sparkonce run`` on a terminal (rich.live).

A few lines at the bottom of the terminal, redrawn twice a second while the run goes on:
elapsed time, batches committed and skipped, rows committed, Spark's rows per second,
lag, and the last batch committed. Log lines print above it. Only for a terminal: when
the output is redirected, ``sparkonce run`` shows no display and its per-batch log lines
are plain text (see :func:`wants_live_progress`).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkonce.observe.base import RunObserver, RunStart
from sparkonce.offsets import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.streaming.listener import StreamingQueryProgress
    from rich.console import Console, RenderableType

    from sparkonce.errors import FencedError
    from sparkonce.observe.report import BatchReport, RunReport


def wants_live_progress() -> bool:
    """True when both stdout and stderr are a terminal (rich's log lines and the display
    share the terminal); anything redirected gets plain lines only."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


class LiveProgress(RunObserver):
    """A live view of one run on ``console`` (rich's default console if None)."""

    def __init__(self, console: Console | None = None, refresh_per_second: float = 2.0) -> None:
        self.console = console
        self.refresh_per_second = refresh_per_second
        self._lock = threading.Lock()
        self._live: Any = None
        self._start: RunStart | None = None
        self._started_at = time.monotonic()
        self._committed = 0
        self._skipped = 0
        self._rows = 0
        self._rate: float | None = None
        self._lag: dict[TopicPartition, int] | None = None
        self._last: BatchReport | None = None
        self._fenced = False
        self._ended_at: float | None = None

    def on_start(self, start: RunStart) -> None:
        from rich import get_console
        from rich.live import Live

        with self._lock:
            self._start = start
            self._started_at = time.monotonic()
        self._live = Live(
            # rich's global console is the one sparkonce's log handler writes through on a
            # terminal, so log lines print above the display.
            console=self.console if self.console is not None else get_console(),
            get_renderable=self.render,
            refresh_per_second=self.refresh_per_second,
            transient=False,
        )
        self._live.start(refresh=True)

    def on_batch(self, report: BatchReport) -> None:
        with self._lock:
            if report.result.skipped:
                self._skipped += int(report.result.replayed)
            else:
                self._committed += 1
                self._rows += report.result.row_count
                self._last = report

    def on_progress(self, progress: StreamingQueryProgress) -> None:
        rate = progress.processedRowsPerSecond
        if rate is not None and math.isfinite(rate):
            with self._lock:
                self._rate = rate

    def on_lag(self, lag: Mapping[TopicPartition, int]) -> None:
        with self._lock:
            self._lag = dict(lag)

    def on_fenced(self, error: FencedError) -> None:
        with self._lock:
            self._fenced = True

    def on_end(self, report: RunReport | None) -> None:
        with self._lock:
            self._ended_at = time.monotonic()
        live, self._live = self._live, None
        if live is not None:
            live.refresh()
            live.stop()

    def render(self) -> RenderableType:
        """The display as it is now."""
        from rich.table import Table

        with self._lock:
            start, last = self._start, self._last
            now = self._ended_at if self._ended_at is not None else time.monotonic()
            elapsed = now - self._started_at
            grid = Table.grid(padding=(0, 2))
            grid.add_column(style="bold")
            grid.add_column()
            name = start.pipeline if start else "?"
            epoch = f"epoch {start.epoch}" if start else ""
            if self._fenced:
                state = f"fenced by a newer run after {_clock(elapsed)}"
            elif self._ended_at is not None:
                state = f"ended after {_clock(elapsed)}"
            else:
                state = f"running {_clock(elapsed)}"
            grid.add_row(f"pipeline {name}", f"{epoch}, {state}")
            grid.add_row(
                "batches",
                f"{self._committed} committed, {self._skipped} skipped (replays); "
                f"{self._rows:,} rows committed",
            )
            rate = "-" if self._rate is None else f"{self._rate:,.1f}"
            grid.add_row("rows/s", f"{rate} (Spark, last micro-batch)")
            if self._lag is None:
                lag = "-"
            else:
                lag = f"{sum(self._lag.values()):,} records ({len(self._lag)} partitions)"
            grid.add_row("lag", lag)
            if last is None:
                grid.add_row("last batch", "none committed yet")
            else:
                grid.add_row(
                    "last batch",
                    f"{last.spark_batch_id}: {last.result.row_count:,} rows as ledger entry "
                    f"{last.result.seq} in {last.seconds:.2f} s",
                )
            return grid


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
