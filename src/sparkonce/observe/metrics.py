"""Prometheus metrics of a run (``sparkonce run --metrics-port``).

Needs the ``metrics`` extra (``pip install 'sparkonce[metrics]'``, which brings
prometheus_client); without it, :class:`MetricsObserver` raises an ``ImportError`` that
names that command. Every metric carries the label ``pipeline``:

==========================================  =========  ========================================
name                                        type       what
==========================================  =========  ========================================
``sparkonce_batches_committed_total``       counter    batches this run committed
``sparkonce_rows_committed_total``          counter    rows those batches committed
``sparkonce_batches_skipped_total``         counter    batches skipped as replays
``sparkonce_commit_seconds``                histogram  each batch's commit, in seconds
``sparkonce_lag_records``                   gauge      per ``topic`` and ``partition``: the
                                                       source's end offset minus the
                                                       committed end offset
``sparkonce_owner_epoch``                   gauge      the owner epoch this run took
``sparkonce_fenced_total``                  counter    runs fenced by a newer run (0 or 1)
``sparkonce_input_rows_total``              counter    rows Spark read (its progress)
``sparkonce_input_rows_per_second``         gauge      Spark's input rate, last batch
``sparkonce_processed_rows_per_second``     gauge      Spark's processing rate, last batch
``sparkonce_batch_duration_seconds``        gauge      Spark's last micro-batch, whole trigger
==========================================  =========  ========================================

The metrics live in a registry of their own, not in prometheus_client's default one, so
several runs in one process do not collide; :meth:`MetricsObserver.serve` serves them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sparkonce.errors import ConfigError
from sparkonce.observe.base import RunObserver, RunStart
from sparkonce.offsets import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql.streaming.listener import StreamingQueryProgress

    from sparkonce.errors import FencedError
    from sparkonce.observe.report import BatchReport

METRICS_EXTRA = "pip install 'sparkonce[metrics]'"
DEFAULT_HOST = "127.0.0.1"
# Commit times range from milliseconds (SQLite, small batches) to minutes (a big batch
# through PostgreSQL COPY on a busy machine).
COMMIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


def prometheus_client() -> Any:
    """The prometheus_client module, or an ImportError naming the extra to install."""
    try:
        import prometheus_client as client
    except ImportError as exc:
        raise ImportError(
            f"metrics need prometheus_client, which is not installed: run {METRICS_EXTRA}"
        ) from exc
    return client


class MetricsObserver(RunObserver):
    """The Prometheus metrics of one run of ``pipeline`` (see the module docstring).

    Create it, :meth:`serve` it (before the run, so that a port in use fails before the
    run takes its epoch), pass it to ``Pipeline.run(spark, observer=...)``, and
    :meth:`close` it after the run. Every series of the pipeline exists from the start,
    at 0, except the lag series, which appear once the source's end was read.
    """

    def __init__(self, pipeline: str) -> None:
        prom = prometheus_client()
        self.pipeline = pipeline
        self.registry = prom.CollectorRegistry(auto_describe=True)

        def one(kind: Any, name: str, doc: str, **kw: Any) -> Any:
            """The pipeline's series of a new metric in this run's registry."""
            return kind(name, doc, ["pipeline"], registry=self.registry, **kw).labels(pipeline)

        self._committed = one(
            prom.Counter, "sparkonce_batches_committed", "Batches this run committed"
        )
        self._rows = one(
            prom.Counter, "sparkonce_rows_committed", "Rows the committed batches held"
        )
        self._skipped = one(
            prom.Counter,
            "sparkonce_batches_skipped",
            "Batches skipped as replays (the ledger already held them)",
        )
        self._commit_seconds = one(
            prom.Histogram,
            "sparkonce_commit_seconds",
            "Seconds each batch's commit took (the sink's commit protocol, staging included)",
            buckets=COMMIT_BUCKETS,
        )
        self._lag = prom.Gauge(
            "sparkonce_lag_records",
            "Records behind: the source's end offset minus the committed end offset",
            ["pipeline", "topic", "partition"],
            registry=self.registry,
        )
        self._epoch = one(prom.Gauge, "sparkonce_owner_epoch", "The owner epoch this run took")
        self._fenced = one(
            prom.Counter,
            "sparkonce_fenced",
            "Times this run was fenced by a newer run of the pipeline",
        )
        self._input_rows = one(
            prom.Counter, "sparkonce_input_rows", "Rows Spark read (its query progress)"
        )
        self._input_rate = one(
            prom.Gauge,
            "sparkonce_input_rows_per_second",
            "Spark's input rate in the last micro-batch",
        )
        self._processed_rate = one(
            prom.Gauge,
            "sparkonce_processed_rows_per_second",
            "Spark's processing rate in the last micro-batch",
        )
        self._batch_duration = one(
            prom.Gauge,
            "sparkonce_batch_duration_seconds",
            "Seconds Spark's last micro-batch took, from trigger to end",
        )
        self._server: Any = None
        self._lock = threading.Lock()

    # -- serving ---------------------------------------------------------------------------

    def serve(self, port: int, host: str = DEFAULT_HOST) -> None:
        """Serve the metrics at ``http://host:port/metrics`` on a daemon thread, from now
        until :meth:`close`. A port that cannot be bound raises ConfigError at once."""
        prom = prometheus_client()
        if not 1 <= port <= 65535:
            raise ConfigError(f"metrics port {port} is not a port number (1..65535)")
        try:
            server, _thread = prom.start_http_server(port, addr=host, registry=self.registry)
        except (OSError, OverflowError) as exc:
            why = getattr(exc, "strerror", None) or str(exc)
            raise ConfigError(
                f"pipeline {self.pipeline!r}: cannot serve metrics on {host}:{port}: {why}. "
                "Nothing was started (no epoch was taken). Operator action: choose a free "
                "port (sparkonce run --metrics-port), or stop what listens on it."
            ) from exc
        self._server = server

    @property
    def port(self) -> int | None:
        """The port being served, or None."""
        return None if self._server is None else int(self._server.server_address[1])

    def close(self) -> None:
        """Stop serving (idempotent)."""
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def exposition(self) -> str:
        """The metrics in Prometheus' text format, as a scrape would get them."""
        return str(prometheus_client().generate_latest(self.registry).decode())

    # -- the hooks ---------------------------------------------------------------------------

    def on_start(self, start: RunStart) -> None:
        self._epoch.set(start.epoch)

    def on_batch(self, report: BatchReport) -> None:
        if report.result.skipped:
            if report.result.replayed:  # not a no-data batch that had nothing to commit
                self._skipped.inc()
            return
        self._committed.inc()
        self._rows.inc(report.result.row_count)
        self._commit_seconds.observe(report.seconds)

    def on_lag(self, lag: Mapping[TopicPartition, int]) -> None:
        with self._lock:
            for (topic, partition), behind in lag.items():
                self._lag.labels(self.pipeline, topic, str(partition)).set(behind)

    def on_fenced(self, error: FencedError) -> None:
        self._fenced.inc()

    def on_progress(self, progress: StreamingQueryProgress) -> None:
        rows = progress.numInputRows
        if rows:
            self._input_rows.inc(rows)
        for gauge, value in (
            (self._input_rate, progress.inputRowsPerSecond),
            (self._processed_rate, progress.processedRowsPerSecond),
        ):
            if value is not None and math.isfinite(value):
                gauge.set(value)
        trigger_ms = (progress.durationMs or {}).get("triggerExecution")
        if trigger_ms is not None:
            self._batch_duration.set(trigger_ms / 1000.0)
