"""Naming the cause of a failed streaming query in one line.

A query that fails inside a Spark task or inside ``foreachBatch`` reaches the
driver as a Java exception wrapping a Python traceback wrapping, sometimes,
another Java exception: 50 to 200 lines whose first line names only the wrapper
(``[STREAM_FAILED] ... [FOREACH_BATCH_USER_FUNCTION_ERROR] ... Traceback (most
recent call last):``). :func:`find_cause` digs out what the user needs:

1. a sparkonce error raised in a task (for example ``SinkUnavailableError`` from a
   two-phase pre-commit, or a source's retention error), rebuilt as the same class
   so that it keeps its exit code;
2. otherwise a store's client that lost its connection in a task (psycopg's
   ``OperationalError``, a Kafka client's transport error): ``SinkUnavailableError``,
   exit 4, as the same outage gets on the driver;
3. otherwise Spark's own error class and message, such as
   ``[CAST_INVALID_INPUT] The value 'abc' ... cannot be cast to "BIGINT" ...``;
4. otherwise the last Python exception line of the traceback;
5. otherwise the first line of the text.

Pure string work over the exception's text: no pyspark import.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass

from sparkonce.errors import (
    RUNBOOKS,
    OffsetOutOfRangeError,
    SinkUnavailableError,
    SparkOnceError,
)

# Spark error classes that only wrap the real cause.
_WRAPPERS = frozenset(
    {
        "STREAM_FAILED",
        "FOREACH_BATCH_USER_FUNCTION_ERROR",
        "PYTHON_EXCEPTION",
        "PYTHON_DATA_SOURCE_ERROR",
        "TASK_WRITE_FAILED",
    }
)
# Spark's Kafka connector, with failOnDataLoss (always on in SparkKafkaSource): offsets the
# query needs are gone from Kafka.
_KAFKA_DATA_LOSS = re.compile(
    r"(?:\[KAFKA_DATA_LOSS[.\w]*\] |KafkaIllegalStateException: )"
    r"(Some data may have been lost[^\n]*)"
)
_KAFKA_OUT_OF_RANGE = re.compile(
    r"FetchPosition\{offset=(\d+).*? is out of range for partition (\S+)"
)
_DATA_LOSS_HINT = (
    " Records this run still needed were deleted from Kafka (retention, delete_records, or "
    "the topic was deleted and created again). Nothing was skipped: the run stopped. "
    "Operator action: if the records are lost for good, start the pipeline under a new name "
    "or from a new ledger (sparkonce reset, and a new checkpoint), knowing which offsets are "
    "missing; keep retention longer than the longest outage (runbook: "
    f"{RUNBOOKS}/offsets-gone.md)."
)
_SPARKONCE_LINE = re.compile(r"^\s*(sparkonce(?:\.\w+)+)\.(\w+): (.+)$", re.MULTILINE)
_SPARK_CLASS = re.compile(r"\[([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)\] ([^\n]*)")
_PYTHON_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt)): (.+)$", re.MULTILINE)
_MAX = 600
# A store's client whose connection failed or was cut off inside a task: psycopg's base
# OperationalError (its subclasses for SQL errors are named psycopg.errors.*, and only the
# server's shutdown ones count here), and a Kafka client's transport errors.
_CONNECTION_LOST = re.compile(
    r"^\s*((?:psycopg2?\.OperationalError|psycopg\.errors\.(?:AdminShutdown|CrashShutdown|"
    r"CannotConnectNow|ConnectionException|ConnectionFailure))"
    r"|(?:cimpl|confluent_kafka)\.KafkaException): ([^\n]*)$",
    re.MULTILINE,
)
_KAFKA_TRANSPORT = re.compile(
    r"_TRANSPORT|_ALL_BROKERS_DOWN|_TIMED_OUT|_MSG_TIMED_OUT|_RESOLVE|NOT_COORDINATOR"
)
_UNAVAILABLE_HINT = (
    " A Spark task lost its connection to the store. The batch's commit did not complete; "
    "committed batches are safe in the sink. Check that the store is running and reachable "
    "from every executor, then run again: the batch is replayed."
)


@dataclass(frozen=True)
class Cause:
    """The cause of a failure: its text, and the sparkonce error class if it was one."""

    message: str
    error: type[SparkOnceError] | None = None
    spark_class: str | None = None


def find_cause(text: str) -> Cause:
    """The most specific cause named in ``text`` (see the module docstring)."""
    loss = _KAFKA_DATA_LOSS.search(text)
    if loss is not None:
        where = _KAFKA_OUT_OF_RANGE.search(text)
        detail = f" (offset {where[1]} of {where[2]} is gone)" if where else ""
        message = _clip(loss[1].rstrip(";. ") + detail + ".")
        return Cause(message + _DATA_LOSS_HINT, OffsetOutOfRangeError)
    for module, name, message in _SPARKONCE_LINE.findall(text):
        cls = _error_class(module, name)
        if cls is not None:
            return Cause(_clip(message), cls)
    for client, message in _CONNECTION_LOST.findall(text):
        if "KafkaException" in client and not _KAFKA_TRANSPORT.search(message):
            continue
        name = client.rsplit(".", 1)[-1]
        return Cause(
            _clip(f"{client.split('.')[0]} {name}: {message}").rstrip(".")
            + "."
            + _UNAVAILABLE_HINT,
            SinkUnavailableError,
        )
    for spark_class, message in _SPARK_CLASS.findall(text):
        if spark_class.split(".")[0] not in _WRAPPERS:
            return Cause(_clip(f"[{spark_class}] {message}"), spark_class=spark_class)
    python = [m for m in _PYTHON_LINE.findall(text) if not m[0].startswith(("py4j.", "java."))]
    if python:
        name, message = python[-1]
        return Cause(_clip(f"{name.rsplit('.', 1)[-1]}: {message}"))
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return Cause(_clip(lines[0]) if lines else "unknown error")


def rebuild(cause: Cause, suffix: str) -> SparkOnceError | None:
    """The sparkonce error a task raised, rebuilt on the driver with ``suffix`` appended."""
    if cause.error is None:
        return None
    err = cause.error.__new__(cause.error)
    Exception.__init__(err, f"{cause.message} {suffix}".strip())
    return err


def where_suffix(message: str, pipeline: str, batch: str) -> str:
    """``(pipeline 'NAME', BATCH)``, the context a rebuilt error's message ends with, or
    nothing when the message names its batch already: on Spark Connect the batch function,
    which knows the batch, adds it where it runs (this process may not know it)."""
    if f"(pipeline {pipeline!r}, batch " in message:
        return ""
    return f"(pipeline {pipeline!r}, {batch})"


def _error_class(module: str, name: str) -> type[SparkOnceError] | None:
    try:
        cls = getattr(importlib.import_module(module), name, None)
    except ImportError:
        return None
    if isinstance(cls, type) and issubclass(cls, SparkOnceError):
        return cls
    return None


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= _MAX else text[: _MAX - 3] + "..."


def short_error(exc: BaseException) -> str:
    """The first line of ``exc``'s message (at most 500 characters), for an error of ours."""
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__
