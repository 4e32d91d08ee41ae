"""The contract every sparkonce source follows.

A source is a **replayable input** (DESIGN.md section 3c): each micro-batch is
a set of per-partition offset ranges, written into Spark's checkpoint before
the batch runs, and re-reading a range returns exactly the same records. The
pipeline runner (on the driver) calls:

    stream(spark, start)            once per run: a streaming DataFrame that starts at
                                    ``start`` (the sink ledger's end offsets) when the
                                    checkpoint is new; Spark's checkpoint wins otherwise
    batch_ranges(prev, offset)      once per micro-batch: the batch's offset ranges from
                                    Spark's offset log entries (this batch and the one before)
    latest_offsets()                for status and lag, never as the truth
    committed(pipeline, ranges)     after each sink commit: progress for monitoring only
                                    (Kafka consumer-group offsets); never read back as truth

Sources never import sinks; the runner passes the ledger's offsets in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sparkonce.offsets import BatchRanges, TopicPartition, batch_from_offsets

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession


_registered: set[tuple[int, str]] = set()


def register_data_source(spark: SparkSession, data_source: type) -> None:
    """Register a Python Data Source class with ``spark`` once per session (idempotent)."""
    key = (id(spark), data_source.__name__)
    if key not in _registered:
        spark.dataSource.register(data_source)
        _registered.add(key)


class Source(ABC):
    """Base class of sources. Subclasses state their guarantee in their docstring."""

    @abstractmethod
    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        """A streaming DataFrame over the source. Runs on the driver."""

    def batch_ranges(self, previous: str | None, current: str) -> BatchRanges:
        """Offset ranges of a batch, from Spark's serialized offsets (previous may be None).

        Both sources write a batch's own ranges as its offset, so a no-data batch
        (the same offset as the batch before) covers empty ranges: see
        :func:`sparkonce.offsets.batch_from_offsets`.
        """
        before = None if previous is None else BatchRanges.from_json(previous)
        return batch_from_offsets(before, BatchRanges.from_json(current))

    @abstractmethod
    def latest_offsets(self) -> dict[TopicPartition, int]:
        """The source's current end offsets (next offset to be written)."""

    def committed(self, pipeline: str, ranges: BatchRanges) -> None:  # noqa: B027
        """Called on the driver after the sink committed ``ranges``; monitoring only.

        Failures here must not fail the pipeline: the sink's ledger already holds
        the truth. The default does nothing.
        """

    @abstractmethod
    def uri(self) -> str:
        """A URI that :func:`sparkonce.sources.source_from_uri` can reopen (for status)."""

    @abstractmethod
    def describe(self) -> str:
        """A one-line description, safe for logs (no secrets)."""
