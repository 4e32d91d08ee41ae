"""Effectively-once sinks; each docstring opens with its guarantee."""

from sparkonce.sinks.base import Sink
from sparkonce.sinks.delta import DeltaSink
from sparkonce.sinks.kafka import KafkaSink
from sparkonce.sinks.sql import PostgresSink, SQLiteSink, SqlSink
from sparkonce.sinks.twophase import PostgresTwoPhaseSink


def sink_from_url(
    url: str, table: str | None = None, *, two_phase: bool = False, **kwargs: object
) -> Sink:
    """A sink for ``url``: ``sqlite:///FILE`` or ``postgresql://...`` (with ``table``), or
    ``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` (the topic is in the URL), or
    ``delta:///PATH`` / ``delta:URI`` (a Delta Lake table: the directory ``PATH/table``
    with ``table``, else ``PATH`` itself).

    ``two_phase=True`` picks :class:`PostgresTwoPhaseSink` for a PostgreSQL URL (rows are
    pre-committed by the executors instead of passing through the driver).

    The URL's kind is looked up in :mod:`sparkonce.sinks.registry`; a URL of no kind
    raises :class:`~sparkonce.errors.ConfigError` naming every accepted form.
    """
    from sparkonce.sinks.registry import sink_for_url

    return sink_for_url(url, table, two_phase=two_phase, **kwargs)


__all__ = [
    "DeltaSink",
    "KafkaSink",
    "PostgresSink",
    "PostgresTwoPhaseSink",
    "SQLiteSink",
    "Sink",
    "SqlSink",
    "sink_from_url",
]
