"""Logging for every command: sparkonce's lines on stderr, Spark's kept quiet, and the log
file of a ``run`` that keeps everything, tracebacks included."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparkonce.errors import SparkOnceError


def _setup_logging(verbose: int, debug: bool = False) -> None:
    """sparkonce's own progress (one line per batch) shows by default; -v adds its debug
    output. Spark's Python loggers (``pyspark``, ``py4j``) stay at WARNING unless -v is
    given (-v: INFO, -vv: DEBUG). Without -v or --debug, their tracebacks are left out
    (see :class:`_QuietCallbackErrors`): main() reports the error in one line, and
    --debug shows its traceback."""
    from rich.logging import RichHandler

    # On a terminal, rich formatting; in a log file, one plain line per record.
    handler: logging.Handler
    if sys.stderr.isatty():
        handler = RichHandler(show_path=False, rich_tracebacks=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # The filter sits on the terminal's handler, not on the loggers, so that a run's log
    # file (see _log_to_file, whose handlers run first) keeps every traceback.
    if not (verbose or debug):
        handler.addFilter(_QuietCallbackErrors())
    logging.basicConfig(level=logging.WARNING, handlers=[handler], force=True)
    logging.getLogger("sparkonce").setLevel(logging.DEBUG if verbose else logging.INFO)
    spark_level = {0: logging.WARNING, 1: logging.INFO}.get(verbose, logging.DEBUG)
    for name in ("py4j", "pyspark"):
        logging.getLogger(name).setLevel(spark_level)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record is emitted, not when the handler
    was made (main() may run more than once in a process, as in tests)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


_LOGGED_TO_FILE = ("sparkonce", "py4j", "pyspark")
# PySpark's own loggers for an error's query context (``PySparkException._log_exception``):
# they do not propagate, and each has a handler of its own on the stderr of the moment,
# which writes the error in JSON with its Java stack.
_QUERY_CONTEXT_LOGGERS = ("DataFrameQueryContextLogger", "SQLQueryContextLogger")
# Where Spark's Python code lives: py4j also logs on the root logger (``logging.exception(
# "Exception while sending command.")`` when the JVM has gone away).
_SPARK_PACKAGES = ("py4j", "pyspark")


def _is_spark_record(record: logging.LogRecord) -> bool:
    """A record of py4j or pyspark: by its logger, or by the file that logged it."""
    if record.name.split(".")[0] in _SPARK_PACKAGES:
        return True
    parts = Path(record.pathname).parts
    return any(package in parts for package in _SPARK_PACKAGES)


class _SparkRootRecords(logging.Filter):
    """Passes only the records that Spark's Python code logs on the root logger."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name == "root" and _is_spark_record(record)


class _RunLog:
    """Whether a command's log file takes Spark's Python records (see :func:`spark_log_file`);
    the terminal then shows none of them. ``ended``: a log file was closed, so the command's
    Spark work is over. Spark's records after that come from its threads winding down (a
    ``foreachBatch`` callback whose JVM went away on a signal to the process group, say),
    after the command's last line; the terminal shows none of them either."""

    active = 0
    ended = False


def _log_to_file(path: Path) -> tuple[logging.Handler, list[tuple[logging.Logger, list[Any]]]]:
    """Also write sparkonce's, py4j's and pyspark's records, tracebacks included, to ``path``.

    The handler sits on those loggers themselves, so it formats a record before the
    terminal's handler (on the root logger) drops its traceback. It also takes py4j's
    records on the root logger, and PySpark's query-context errors (see
    :data:`_QUERY_CONTEXT_LOGGERS`), whose own stderr handlers are set aside meanwhile.
    Returns the handler and the set-aside handlers, for :func:`_stop_logging_to_file`.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in _LOGGED_TO_FILE:
        logging.getLogger(name).addHandler(handler)
    root_records = logging.FileHandler(path, encoding="utf-8")
    root_records.setFormatter(handler.formatter)
    root_records.addFilter(_SparkRootRecords())
    logging.getLogger().addHandler(root_records)
    set_aside: list[tuple[logging.Logger, list[Any]]] = [(logging.getLogger(), [root_records])]
    for logger in _query_context_loggers():
        set_aside.append((logger, list(logger.handlers)))
        for own in list(logger.handlers):
            logger.removeHandler(own)
        # logging.Logger's own addHandler: PySparkLogger's would put its JSON formatter on
        # the shared handler.
        logging.Logger.addHandler(logger, handler)
    _RunLog.active += 1
    return handler, set_aside


def _stop_logging_to_file(
    handler: logging.Handler, set_aside: list[tuple[logging.Logger, list[Any]]]
) -> None:
    _RunLog.active -= 1
    _RunLog.ended = True
    for name in _LOGGED_TO_FILE:
        logging.getLogger(name).removeHandler(handler)
    root, (root_records,) = set_aside[0]
    root.removeHandler(root_records)
    root_records.close()
    for logger, handlers in set_aside[1:]:
        logging.Logger.removeHandler(logger, handler)
        for own in handlers:
            logging.Logger.addHandler(logger, own)
    handler.close()


def _query_context_loggers() -> list[logging.Logger]:
    """PySpark's query-context loggers, made now as PySpark makes them (none without
    pyspark.logger, as in PySpark 3)."""
    try:
        from pyspark.logger import PySparkLogger
    except ImportError:  # pragma: no cover - PySpark before 4.0
        return []
    loggers: list[logging.Logger] = []
    for name in _QUERY_CONTEXT_LOGGERS:
        logger = PySparkLogger.getLogger(name)
        logger.propagate = False
        loggers.append(logger)
    return loggers


def _default_log_file(pipeline: str) -> Path:
    import tempfile
    import time

    stamp = time.strftime("%Y%m%d-%H%M%S")
    return Path(tempfile.gettempdir()) / "sparkonce" / f"{pipeline}-{stamp}-{os.getpid()}.log"


@contextmanager
def spark_log_file(pipeline: str, given: str | None) -> Iterator[Path]:
    """The log file of a command that starts Spark (``--log-file``, else a new one under
    the temp directory): written while the block runs; a sparkonce error leaving the
    block names it (``exc.log_file``, printed after the error's line)."""
    path = Path(given) if given else _default_log_file(pipeline)
    handler, set_aside = _log_to_file(path)
    try:
        yield path
    except SparkOnceError as exc:
        exc.log_file = path  # type: ignore[attr-defined]
        raise
    finally:
        _stop_logging_to_file(handler, set_aside)


class _QuietCallbackErrors(logging.Filter):
    """Keeps tracebacks of Spark's Python loggers off stderr (without -v or --debug).

    While a command writes a log file (:func:`spark_log_file`), py4j's and pyspark's
    records go there only, and once it has closed, nowhere. Otherwise: py4j logs
    ``logger.exception`` when a Python callback raises, e.g. a FencedError in the batch
    handler. A sparkonce error reaches main(), which reports it in one line, so its record
    is dropped; any other record keeps its message, without the traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if (_RunLog.active or _RunLog.ended) and _is_spark_record(record):
            return False
        if record.exc_info is None:
            return True
        if isinstance(record.exc_info[1], SparkOnceError):
            return False
        record.exc_info, record.exc_text = None, None
        return True
