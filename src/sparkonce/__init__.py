"""sparkonce: effectively-once streaming pipelines on Apache Spark (PySpark).

The public API is what ``__all__`` lists; everything else is internal.
"""

from typing import TYPE_CHECKING

from sparkonce.errors import (
    CheckpointError,
    CheckpointLostError,
    ConfigError,
    FencedError,
    KafkaUnavailableError,
    LedgerError,
    PipelineRunningError,
    RunStopped,
    SinkError,
    SinkUnavailableError,
    SourceError,
    SparkOnceError,
    StoreUnavailableError,
)
from sparkonce.kafka import KafkaProducer
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.pipeline import BatchReport, Pipeline, RunReport, build_session
from sparkonce.pipeline.foreach_batch import foreach_batch
from sparkonce.pipeline.reset import reset_pipeline
from sparkonce.protocol import CrashPoint
from sparkonce.sinks import (
    DeltaSink,
    KafkaSink,
    PostgresSink,
    PostgresTwoPhaseSink,
    Sink,
    SQLiteSink,
    sink_from_url,
)
from sparkonce.sources import (
    DeltaSource,
    EmbeddedLogSource,
    KafkaSource,
    Source,
    SparkKafkaSource,
    SparkSource,
)

if TYPE_CHECKING:  # pragma: no cover - imported on first use, by __getattr__ below
    from sparkonce.sinks.iceberg import IcebergSink

__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """``IcebergSink`` is imported on first use: it needs the ``iceberg`` extra (PyIceberg)."""
    if name == "IcebergSink":
        from sparkonce.sinks.iceberg import IcebergSink

        return IcebergSink
    raise AttributeError(f"module 'sparkonce' has no attribute {name!r}")


__all__ = [
    "BatchReport",
    "CheckpointError",
    "CheckpointLostError",
    "ConfigError",
    "CrashPoint",
    "DeltaSink",
    "DeltaSource",
    "EmbeddedLogSource",
    "FencedError",
    "IcebergSink",
    "IdempotentProducer",
    "KafkaProducer",
    "KafkaSink",
    "KafkaSource",
    "KafkaUnavailableError",
    "LedgerError",
    "Pipeline",
    "PipelineRunningError",
    "PostgresSink",
    "PostgresTwoPhaseSink",
    "RunReport",
    "RunStopped",
    "SQLiteSink",
    "Sink",
    "SinkError",
    "SinkUnavailableError",
    "Source",
    "SourceError",
    "SparkKafkaSource",
    "SparkOnceError",
    "SparkSource",
    "StoreUnavailableError",
    "Topic",
    "build_session",
    "foreach_batch",
    "reset_pipeline",
    "sink_from_url",
]
