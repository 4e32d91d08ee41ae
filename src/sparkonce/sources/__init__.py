"""Replayable sources: each micro-batch is a set of per-partition offset ranges."""

from sparkonce.errors import ConfigError
from sparkonce.sources.base import Source
from sparkonce.sources.delta import URI_SCHEME as DELTA_URI_SCHEME
from sparkonce.sources.delta import DeltaSource
from sparkonce.sources.embedded import URI_SCHEME, EmbeddedLogSource
from sparkonce.sources.kafka import URI_SCHEME as KAFKA_URI_SCHEME
from sparkonce.sources.kafka import KafkaSource
from sparkonce.sources.source_set import URI_SCHEME as SET_URI_SCHEME
from sparkonce.sources.source_set import SourceSet
from sparkonce.sources.spark_kafka import SparkKafkaSource
from sparkonce.sources.spark_query import URI_SCHEME as SPARK_URI_SCHEME
from sparkonce.sources.spark_query import SparkSource


def source_from_uri(uri: str) -> Source:
    """Reopen a source from the URI a run recorded in the sink's owner row."""
    if uri.startswith(f"{URI_SCHEME}://"):
        return EmbeddedLogSource.from_uri(uri)
    if uri.startswith(f"{KAFKA_URI_SCHEME}://"):
        return KafkaSource.from_uri(uri)
    if uri.startswith(f"{DELTA_URI_SCHEME}:"):
        return DeltaSource.from_uri(uri)
    if uri.startswith(f"{SET_URI_SCHEME}:"):
        return SourceSet.from_uri(uri)
    if uri.startswith(f"{SPARK_URI_SCHEME}:"):
        raise ConfigError(
            f"source {uri!r} is a query the user built (SparkSource): its lag is not read"
        )
    raise ConfigError(f"source URI {uri!r} is not one this version can open")


__all__ = [
    "DeltaSource",
    "EmbeddedLogSource",
    "KafkaSource",
    "Source",
    "SourceSet",
    "SparkKafkaSource",
    "SparkSource",
    "source_from_uri",
]
