"""Effectively-once sinks; each docstring opens with its guarantee."""

from sparkonce.config import StoreURL
from sparkonce.sinks.base import Sink
from sparkonce.sinks.sql import PostgresSink, SQLiteSink, SqlSink


def sink_from_url(url: str, table: str, **kwargs: object) -> SqlSink:
    """A SQL sink for ``url`` (``sqlite:///...`` or ``postgresql://...``)."""
    parsed = StoreURL.parse(url)
    cls = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
    return cls(parsed, table, **kwargs)  # type: ignore[arg-type]


__all__ = ["PostgresSink", "SQLiteSink", "Sink", "SqlSink", "sink_from_url"]
