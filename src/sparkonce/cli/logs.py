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


def _log_to_file(path: Path) -> logging.Handler:
    """Also write sparkonce's, py4j's and pyspark's records, tracebacks included, to ``path``.

    The handler sits on those loggers themselves, so it formats a record before the
    terminal's handler (on the root logger) drops its traceback.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    for name in _LOGGED_TO_FILE:
        logging.getLogger(name).addHandler(handler)
    return handler


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
    handler = _log_to_file(path)
    try:
        yield path
    except SparkOnceError as exc:
        exc.log_file = path  # type: ignore[attr-defined]
        raise
    finally:
        for name in _LOGGED_TO_FILE:
            logging.getLogger(name).removeHandler(handler)
        handler.close()


class _QuietCallbackErrors(logging.Filter):
    """Keeps tracebacks of Spark's Python loggers off stderr (without -v or --debug).

    py4j logs ``logger.exception`` when a Python callback raises, e.g. a FencedError in
    the batch handler. A sparkonce error reaches main(), which reports it in one line, so
    its record is dropped; any other record keeps its message, without the traceback.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info is None:
            return True
        if isinstance(record.exc_info[1], SparkOnceError):
            return False
        record.exc_info, record.exc_text = None, None
        return True
