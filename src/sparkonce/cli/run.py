"""``sparkonce run``: run a pipeline file."""

from __future__ import annotations

import argparse
import contextlib
import logging
import threading
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    SINK_URL_EXPECTED,
    SOURCE_URI_EXPECTED,
    _add_env_switch,
    _check_checkpoint,
    _check_sink_url,
    _check_source_uri,
    _env,
    _env_checked,
    _help,
    _typed,
    add_spark_options,
    spark_target,
)
from sparkonce.cli.logs import spark_log_file

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.observe import RunObserver
    from sparkonce.observe.metrics import MetricsObserver
    from sparkonce.observe.report import RunReport

log = logging.getLogger("sparkonce.run")
PORT_EXPECTED = "a port number in 1..65535"
HOST_EXPECTED = "a host name or an IP address to listen on, such as 127.0.0.1 or 0.0.0.0"


def _check_host(text: str) -> None:
    """Only the form: whether the address can be bound is found when it is."""
    import re

    if not re.fullmatch(r"[A-Za-z0-9._-]+|[0-9A-Fa-f:.]+", text):
        raise ValueError("not a host name or IP address")


def cmd_run(args: argparse.Namespace) -> int:
    """Run a pipeline file. SIGTERM and SIGINT stop it cleanly between commits (exit
    143 and 130); Spark's and py4j's logs, with their stacks, go to the run's log file."""
    import signal

    from sparkonce.faults import FaultPlan
    from sparkonce.pipeline.loader import load_pipeline
    from sparkonce.spark.session import build_session

    faults = FaultPlan.from_env()  # the run's fault plan, parsed once (none set: no faults)
    pipeline = load_pipeline(args.pipeline_file).with_overrides(
        sink_url=args.sink, checkpoint=args.checkpoint, source_uri=args.source
    )
    stop = threading.Event()

    def request_stop(signum: int, _frame: object) -> None:
        stop.signal_number = signum  # type: ignore[attr-defined]
        stop.set()

    with contextlib.ExitStack() as stack:
        log_file = stack.enter_context(spark_log_file(pipeline.name, args.log_file))
        # Metrics are served before Spark starts and before the run takes its epoch: a port
        # in use or a missing prometheus_client stops here, and fences nobody.
        observer, metrics = _observers(pipeline.name, args.metrics_port, args.metrics_host)
        if metrics is not None:
            stack.callback(metrics.close)
        master, remote = spark_target(args)
        spark = build_session(
            master=master,
            remote=remote,
            app_name=f"sparkonce:{pipeline.name}",
            quick_start=args.quick_start,
            log_file=log_file,
            conf=pipeline.spark_conf(),
        )
        _quiet_accumulator_server(spark)
        # After the session: PySpark's SparkContext installs a SIGINT handler of its own.
        for signum in (signal.SIGTERM, signal.SIGINT):
            stack.callback(signal.signal, signum, signal.signal(signum, request_stop))
        try:
            report = pipeline.run(
                spark, timeout=args.timeout, stop=stop, faults=faults, observer=observer
            )
        finally:
            _stop_spark(spark, stop)
    print(summary(report))
    return 0


def summary(report: RunReport) -> str:
    """The run's last line: what it committed and skipped, each count named."""
    rows = f"{report.rows_committed} rows"
    if report.rows_written != report.rows_committed:
        # An upsert with latest_by wrote one row per key of a batch.
        rows += f" received, {report.rows_written} written: one per key"
    empty = (
        f", {report.batches_empty} no-data batches with no rows to commit"
        if report.batches_empty
        else ""
    )
    return (
        f"pipeline {report.pipeline}: epoch {report.epoch}, resumed from {report.resumed_from}; "
        f"committed {report.batches_committed} batches ({rows}), "
        f"skipped {report.batches_skipped} replayed batches{empty}"
    )


def _stop_spark(spark: object, stop: threading.Event) -> None:
    """Stop the session. A signal sent to the run's whole process group (``timeout``,
    ``kill -- -PGID``, systemd) stopped Spark's JVM too: then there is nothing left to stop,
    and the run's own outcome (stopped, exit 128 + the signal) is what counts."""
    try:
        spark.stop()  # type: ignore[attr-defined]
    except Exception as exc:
        if not stop.is_set():
            raise
        log.debug("Spark's JVM had already gone on the signal: %s", exc)


def _quiet_accumulator_server(spark: object) -> None:
    """PySpark's accumulator server prints a traceback on stderr when Spark's JVM goes
    away mid-connection (an ``EOFError``, as when the run's process group gets SIGTERM,
    often after the run's log file is closed): keep it for ``-vv`` (debug) instead."""
    from sparkonce.jvm import accumulator_server

    server = accumulator_server(spark)  # None on Connect: no SparkContext in this process
    if server is None:
        return
    spark_log = logging.getLogger("pyspark.accumulators")

    def handle_error(_request: object, client_address: object) -> None:
        spark_log.debug("accumulator update connection %s ended", client_address, exc_info=True)

    server.handle_error = handle_error


def _observers(
    pipeline: str, metrics_port: int | None, metrics_host: str
) -> tuple[RunObserver | None, MetricsObserver | None]:
    """The run's observer (metrics if a port is given, live progress on a terminal) and
    its metrics, already served."""
    from sparkonce.observe import Observers
    from sparkonce.observe.progress import LiveProgress, wants_live_progress

    observers: list[RunObserver] = []
    metrics = None
    if metrics_port is not None:
        from sparkonce.observe.metrics import MetricsObserver, prometheus_client

        # An ImportError names the extra to install. This process is the run's own, so the
        # client's global switch is ours: no ``*_created`` series beside each counter.
        prometheus_client().disable_created_metrics()
        metrics = MetricsObserver(pipeline)
        metrics.serve(metrics_port, metrics_host)
        log.info(
            "pipeline %s: metrics at http://%s:%d/metrics", pipeline, metrics_host, metrics_port
        )
        observers.append(metrics)
    if wants_live_progress():
        observers.append(LiveProgress())
    if not observers:
        return None, None
    return (observers[0] if len(observers) == 1 else Observers(*observers)), metrics


def add_parser(sub: SubParsers) -> None:
    from sparkonce.observe.metrics import METRICS_EXTRA

    p = sub.add_parser("run", help="run a pipeline file (defines `pipeline = Pipeline(...)`)")
    p.add_argument("pipeline_file")
    add_spark_options(
        p,
        "write Spark's and the run's full log, stacks included, here (default: a new file "
        "under the temp directory's sparkonce/, named in every error)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="stop after this many seconds (for processingTime triggers)",
    )
    p.add_argument(
        "--sink",
        type=_env_checked("--sink", SINK_URL_EXPECTED, _check_sink_url, secret=True),
        default=_env("SPARKONCE_RUN_SINK"),
        help=_help("write to this store instead of the file's sink URL", "SPARKONCE_RUN_SINK"),
    )
    p.add_argument(
        "--source",
        type=_env_checked("--source", SOURCE_URI_EXPECTED, _check_source_uri, secret=True),
        default=_env("SPARKONCE_RUN_SOURCE"),
        help=_help(
            "read from this location instead of the file source's: the same kind of source "
            "(an embedded log or a Kafka topic), every other option of the file's source kept",
            "SPARKONCE_RUN_SOURCE",
        ),
    )
    p.add_argument(
        "--checkpoint",
        type=_env_checked("--checkpoint", "a directory path or a URL", _check_checkpoint),
        default=_env("SPARKONCE_RUN_CHECKPOINT"),
        help=_help("use this checkpoint directory instead", "SPARKONCE_RUN_CHECKPOINT"),
    )
    _add_env_switch(
        p,
        "--quick-start",
        env="SPARKONCE_QUICK_START",
        help="start Spark's JVM for a short run (C1 JIT, serial GC): about a quarter less "
        "CPU for runs of a minute; keep it off for long-running jobs",
    )
    p.add_argument(
        "--metrics-port",
        type=_typed(int, "--metrics-port", PORT_EXPECTED, lambda n: 1 <= n <= 65535),
        default=_env("SPARKONCE_METRICS_PORT"),
        help=_help(
            "serve Prometheus metrics at http://HOST:PORT/metrics while the run goes on "
            f"(needs {METRICS_EXTRA}); default: no metrics",
            "SPARKONCE_METRICS_PORT",
        ),
    )
    p.add_argument(
        "--metrics-host",
        type=_env_checked("--metrics-host", HOST_EXPECTED, _check_host),
        default=_env("SPARKONCE_METRICS_HOST", "127.0.0.1"),
        help=_help(
            "the address the metrics listen on, default 127.0.0.1 (0.0.0.0: every interface)",
            "SPARKONCE_METRICS_HOST",
        ),
    )
    p.set_defaults(func=cmd_run)
