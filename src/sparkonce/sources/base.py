"""The contract every sparkonce source follows.

A source is a **replayable input** (DESIGN.md section 3c): each micro-batch is
a set of per-partition offset ranges, written into Spark's checkpoint before
the batch runs, and re-reading a range returns exactly the same records. The
pipeline runner (on the driver) calls:

    stream(spark, start)            once per run: a streaming DataFrame that starts at
                                    ``start`` (the sink ledger's end offsets) when the
                                    checkpoint is new; Spark's checkpoint wins otherwise
    batch_ranges(prev, offset)      once per micro-batch: the batch's offset ranges from
                                    Spark's offset log entries (this batch and the one before;
                                    for batch 0, ``initial_offset(checkpoint)``)
    latest_offsets()                for status and lag, never as the truth
    relocated(uri)                  before a run (``sparkonce run --source``): the same source
                                    reading from another location of the same kind
    committed(pipeline, ranges)     after each sink commit: progress for monitoring only
                                    (Kafka consumer-group offsets); never read back as truth
    check_ledger_start(start)       before the epoch, when a new checkpoint resumes from the
                                    ledger's end: raises when the source cannot start there
    read_failure(text, ranges)      when the query failed: the source's own error for a
                                    failure it recognises (a Delta table's missing files)

Sources never import sinks; the runner passes the ledger's offsets in.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, ClassVar, Self

from sparkonce.config import mask_url
from sparkonce.errors import ConfigError, SparkOnceError
from sparkonce.offsets import BatchRanges, ReadLimits, TopicPartition, batch_from_offsets

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.spark.checkpoint import Checkpoint


_registered: set[tuple[int, str]] = set()


def register_data_source(spark: SparkSession, data_source: type) -> None:
    """Register a Python Data Source class with ``spark`` once per session (idempotent)."""
    key = (id(spark), data_source.__name__)
    if key not in _registered:
        spark.dataSource.register(data_source)
        _registered.add(key)


# The URI scheme of each kind of source, and what a relocated source of that kind is called.
_KINDS = {"sparkonce-log": "an embedded log", "kafka": "a Kafka topic"}


def relocation_error(
    source: Source, uri: object, form: str, problem: str | None = None
) -> ConfigError:
    """The error of :meth:`Source.relocated` for ``uri``: what is wrong and what to give
    (``form``, the URI form of ``source``'s kind). Passwords in ``uri`` are masked."""
    shown = mask_url(uri)
    if problem is None:
        scheme = uri.partition("://")[0] if isinstance(uri, str) and "://" in uri else None
        kind = _KINDS.get(scheme or "")
        problem = (
            f"it names {kind}, another kind of source than the pipeline's"
            if kind
            else "it is not a source URI"
        )
    return ConfigError(
        f"--source {shown!r}: {mask_url(problem)}. The pipeline reads {source.describe()}; "
        "--source moves it to another location of the same kind, keeping every other option "
        f"of the file's source: give {form}"
    )


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

    def offset_from_log(self, lines: list[str], where: str) -> str:
        """This source's offset from the source lines of one offset log file ``where`` (one
        line per streaming relation of the query): one source's, the same in every line (a
        self-join), else :class:`~sparkonce.errors.CheckpointError`. A
        :class:`~sparkonce.sources.source_set.SourceSet` gives each line to its source."""
        from sparkonce.spark.checkpoint import one_source_offset

        return one_source_offset(lines, where)

    def initial_offset(self, checkpoint: Checkpoint) -> str | None:
        """The start of batch 0, for a source whose offsets hold only ends (Spark's Kafka
        connector keeps it in the checkpoint); None (the default) for sources whose
        offsets hold whole ranges."""
        return None

    # The source's read limits (none by default); a source with limits sets its own.
    limits: ReadLimits = ReadLimits()
    #: Whether Spark task ``i`` of a batch reads the same input when the batch is replayed:
    #: sparkonce's own sources plan their partitions in order, so they do. A sink that keys
    #: tasks by their input relies on it where it cannot walk the plan (Spark Connect).
    stable_task_numbers: ClassVar[bool] = False

    def aligned(self) -> Self | None:
        """This source as a query with an event-time watermark must read it: a copy whose
        read limits cap each batch as a whole, shared out in proportion to each partition's
        unread backlog (:func:`sparkonce.offsets.proportional_shares`), so that no partition
        runs ahead of another in event time and lets the watermark pass the other's unread
        records. None when nothing changes: no read limit, or limits that already share
        out so (:meth:`ReadLimits.aligned <sparkonce.offsets.ReadLimits.aligned>`). Runs on
        the driver."""
        limits = self.limits.aligned()
        if limits is None:
            return None
        twin = copy.copy(self)
        twin.limits = limits
        return twin

    def read_limits(self) -> dict[str, int]:
        """The read limits set on this source, by argument name (none by default)."""
        return self.limits.by_argument()

    def spark_conf(self) -> dict[str, str]:
        """Settings the SparkSession needs for this source (jars); none by default."""
        return {}

    @abstractmethod
    def latest_offsets(self) -> dict[TopicPartition, int]:
        """The source's current end offsets (next offset to be written)."""

    def committed(self, pipeline: str, ranges: BatchRanges) -> None:  # noqa: B027
        """Called on the driver after the sink committed ``ranges``; monitoring only.

        Failures here must not fail the pipeline: the sink's ledger already holds
        the truth. The default does nothing.
        """

    def check_ledger_start(self, start: Mapping[TopicPartition, int]) -> None:  # noqa: B027
        """Called on the driver before the epoch, when the checkpoint is new and the query
        resumes from the ledger's end offsets ``start``: raise
        :class:`~sparkonce.errors.CheckpointLostError` when the source cannot start a query
        exactly there (it would read records again, or skip some). The default accepts: a
        source that takes ``start`` in :meth:`stream` as given starts there."""

    def read_failure(self, text: str, ranges: BatchRanges | None) -> SparkOnceError | None:
        """The source's own error for a failed query whose exception text is ``text``
        (``ranges``: the batch being committed, when known), or None when the source does
        not recognise it (the default). Runs on the driver."""
        return None

    def relocated(self, uri: str) -> Source:
        """A copy of this source that reads from ``uri`` instead (``sparkonce run --source``).

        Only the location changes (for example the log directory and topic, or the
        bootstrap servers and topic); every other option (read limits, value format,
        client settings...) is kept. ``uri`` must name a source of the same kind, in the
        form :meth:`uri` writes; anything else is a :class:`~sparkonce.errors.ConfigError`.
        Runs on the driver. The default refuses: a source that cannot move says so.
        """
        raise ConfigError(
            f"--source {mask_url(uri)!r}: {self.describe()} cannot read from another "
            "location; only EmbeddedLogSource and KafkaSource can. Leave --source out, or "
            "edit the pipeline file"
        )

    @abstractmethod
    def uri(self) -> str:
        """A URI that :func:`sparkonce.sources.source_from_uri` can reopen (for status)."""

    @abstractmethod
    def describe(self) -> str:
        """A one-line description, safe for logs (no secrets)."""
