"""Effectively-once sinks; each docstring opens with its guarantee."""

from sparkonce.config import StoreURL
from sparkonce.errors import ConfigError
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
    """
    if url.startswith("delta:"):
        from sparkonce.sinks.delta import DeltaSink, delta_path

        return DeltaSink(delta_path(url), table=table, **kwargs)  # type: ignore[arg-type]
    if url.startswith("kafka://"):
        from sparkonce.sinks.kafka import kafka_sink_from_uri

        return kafka_sink_from_uri(url, **kwargs)
    if not table:
        raise ConfigError(f"sink_from_url({url!r}): a SQL sink needs the output table's name")
    parsed = StoreURL.parse(url)
    if two_phase:
        if parsed.scheme != "postgresql":
            raise ConfigError(
                f"two_phase=True needs a postgresql:// URL, got {str(parsed)!r}; the SQLite "
                "sink always commits on the driver"
            )
        return PostgresTwoPhaseSink(parsed, table, **kwargs)  # type: ignore[arg-type]
    cls = SQLiteSink if parsed.scheme == "sqlite" else PostgresSink
    return cls(parsed, table, **kwargs)  # type: ignore[arg-type]


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
