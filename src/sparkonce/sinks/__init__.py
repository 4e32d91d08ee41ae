"""Effectively-once sinks; each docstring opens with its guarantee."""

from sparkonce.config import StoreURL
from sparkonce.errors import ConfigError
from sparkonce.sinks.base import Sink
from sparkonce.sinks.kafka import KafkaSink
from sparkonce.sinks.sql import PostgresSink, SQLiteSink, SqlSink
from sparkonce.sinks.twophase import PostgresTwoPhaseSink


def sink_from_url(url: str, table: str | None = None, **kwargs: object) -> Sink:
    """A sink for ``url``: ``sqlite:///FILE`` or ``postgresql://...`` (with ``table``), or
    ``kafka://HOST:PORT[,HOST:PORT]/TOPIC`` (the topic is in the URL)."""
    if url.startswith("kafka://"):
        from sparkonce.sinks.kafka import kafka_sink_from_uri

        return kafka_sink_from_uri(url, **kwargs)
    if not table:
        raise ConfigError(f"sink_from_url({url!r}): a SQL sink needs the output table's name")
    parsed = StoreURL.parse(url)
    cls = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
    return cls(parsed, table, **kwargs)  # type: ignore[arg-type]


__all__ = [
    "KafkaSink",
    "PostgresSink",
    "PostgresTwoPhaseSink",
    "SQLiteSink",
    "Sink",
    "SqlSink",
    "sink_from_url",
]
