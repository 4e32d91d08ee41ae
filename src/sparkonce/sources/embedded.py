"""PySpark streaming source over the embedded log (Python Data Source API).

Guarantee: a **replayable input** with deterministic batches. Each micro-batch
is a set of per-partition offset ranges, one Spark input partition per
non-empty range. The ranges themselves are the source offset Spark writes into
its checkpoint before the batch runs, so after a driver crash Spark rebuilds the
same batch from the same ranges, and re-reading a range returns exactly the
same records (the log is append-only with dense offsets). Paired with an
effectively-once sink, each record takes effect exactly once.

Where things run: ``initialOffset``, ``latestOffset`` and ``partitions`` run on
the driver side (in Spark's Python planner process); ``read`` runs on executors
and opens its own SQLite connection.

Read limits: ``max_records_per_partition`` caps each partition's range per
batch, ``max_records_per_batch`` caps the batch (shared out round-robin). Both
are ignored when Spark asks for everything available. In a query with an
event-time watermark (:meth:`~sparkonce.sources.base.Source.aligned`) they cap
the batch as a whole instead, shared out in proportion to each partition's
backlog (:func:`sparkonce.offsets.proportional_shares`).

Offsets (the wire form of :mod:`sparkonce.offsets`)::

    {"<topic>": {"<partition>": [start, end], ...}}
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.errors import ConfigError, SourceError, TopicNotFoundError
from sparkonce.log.storage import Topic, validate_topic_name
from sparkonce.offsets import OffsetRange, ReadLimits, TopicPartition
from sparkonce.protocol import FAIL_TASKS_ENV
from sparkonce.sources.base import Source, register_data_source, relocation_error
from sparkonce.sources.reader import (
    RangeStreamReader,
    injected_failure_offset,
    injected_read_failure,
    limit_options,
    parse_starting,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "sparkonce_log"
URI_SCHEME = "sparkonce-log"
SCHEMA_DDL = (
    "topic STRING, partition INT, offset BIGINT, key BINARY, value BINARY, "
    "timestamp TIMESTAMP, record_id STRING"
)


class EmbeddedLogSource(Source):
    """Read a topic of the embedded log as a stream (see the module docstring).

    ``starting_offsets`` applies only when neither Spark's checkpoint nor the
    sink's ledger has a position: ``"earliest"`` (default), ``"latest"``, or a
    JSON object ``{"<partition>": offset}``.
    """

    stable_task_numbers: ClassVar[bool] = True

    def __init__(
        self,
        path: str | Path,
        topic: str,
        *,
        max_records_per_partition: int | None = None,
        max_records_per_batch: int | None = None,
        starting_offsets: str = "earliest",
    ) -> None:
        self.path = Path(path).resolve()
        self.topic = validate_topic_name(topic)
        self.limits = ReadLimits(max_records_per_partition, max_records_per_batch)
        self.max_records_per_partition = max_records_per_partition
        self.max_records_per_batch = max_records_per_batch
        parse_starting(starting_offsets, self.topic)
        self.starting_offsets = starting_offsets

    def describe(self) -> str:
        return f"EmbeddedLogSource({self.path} topic={self.topic})"

    def uri(self) -> str:
        return f"{URI_SCHEME}://{self.path}?topic={self.topic}"

    @classmethod
    def from_uri(cls, uri: str) -> EmbeddedLogSource:
        path, topic = _parse_uri(uri)
        return cls(path, topic)

    def relocated(self, uri: str) -> EmbeddedLogSource:
        """The same source (read limits, starting offsets) over the log directory and topic
        that ``uri`` (``sparkonce-log://PATH?topic=TOPIC``) names; see :meth:`Source.relocated`."""
        form = f"{URI_SCHEME}://PATH?topic=TOPIC"
        if not isinstance(uri, str) or not uri.startswith(f"{URI_SCHEME}://"):
            raise relocation_error(self, uri, form)
        try:
            path, topic = _parse_uri(uri)
            return EmbeddedLogSource(
                path,
                topic,
                max_records_per_partition=self.max_records_per_partition,
                max_records_per_batch=self.max_records_per_batch,
                starting_offsets=self.starting_offsets,
            )
        except ConfigError as exc:
            raise relocation_error(self, uri, form, str(exc)) from None

    def __repr__(self) -> str:
        return self.describe()

    def options(self, start: Mapping[TopicPartition, int] | None = None) -> dict[str, str]:
        opts = {"path": str(self.path), "topic": self.topic, **limit_options(self.limits)}
        if start:
            opts["startingOffsets"] = json.dumps(
                {str(p): o for (t, p), o in sorted(start.items()) if t == self.topic}
            )
        else:
            opts["startingOffsets"] = self.starting_offsets
        return opts

    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        with Topic(self.path, self.topic):
            pass  # fail fast, on the driver, with TopicNotFoundError
        register(spark)
        return spark.readStream.format(FORMAT).options(**self.options(start)).load()

    def read_all(self, spark: SparkSession) -> DataFrame:
        """The whole topic as a batch DataFrame (for oracles and inspection)."""
        register(spark)
        return spark.read.format(FORMAT).options(**self.options()).load()

    def latest_offsets(self) -> dict[TopicPartition, int]:
        with Topic(self.path, self.topic) as t:
            return {(self.topic, p): o for p, o in t.end_offsets().items()}


def _parse_uri(uri: str) -> tuple[str, str]:
    """(log directory, topic) of ``sparkonce-log://PATH?topic=TOPIC``; PATH may be relative
    (``sparkonce-log://data/log?topic=t``) or absolute (``sparkonce-log:///srv/log?topic=t``)."""
    from urllib.parse import parse_qs, urlsplit

    parts = urlsplit(uri) if isinstance(uri, str) else None
    topics = parse_qs(parts.query).get("topic") if parts else None
    path = (parts.netloc + parts.path) if parts else ""
    if parts is None or parts.scheme != URI_SCHEME or not topics or not path:
        raise ConfigError(f"{uri!r} is not an embedded log URI ({URI_SCHEME}://PATH?topic=T)")
    return path, topics[0]


def register(spark: SparkSession) -> None:
    """Register the data source with ``spark`` (idempotent)."""
    register_data_source(spark, EmbeddedLogDataSource)


# --- The Spark side: Python Data Source API classes --------------------------------
# Spark's Python workers import these classes; the planning they share is in
# sparkonce.sources.reader.

from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)


class RangePartition(InputPartition):
    """One offset range of one partition: the unit of a Spark input partition."""

    def __init__(self, path: str, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((path, topic, partition, start, end))
        self.path = path
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end


def _not_this_machine(part: RangePartition) -> str:
    import socket

    return (
        f"This task ran on host {socket.gethostname()!r}. The embedded log is a SQLite file "
        "read by the machine that holds it: on a cluster, every executor must see the same "
        f"file at {part.path} (executors on the driver's machine, or a filesystem mounted at "
        "that path on every node); otherwise read from Kafka (KafkaSource)"
    )


@contextmanager
def _open_on_executor(part: RangePartition) -> Iterator[Topic]:
    """The topic, opened where this task runs; a clear error when it is not there."""
    try:
        topic = Topic(Path(part.path), part.topic)
    except TopicNotFoundError as exc:
        raise SourceError(f"{exc}. {_not_this_machine(part)}") from None
    with topic:
        yield topic


def _arrow_batches(part: RangePartition, chunk: int = 50_000) -> Iterator[Any]:
    import pyarrow as pa

    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("timestamp", pa.timestamp("us", tz="UTC")),
            ("record_id", pa.string()),
        ]
    )
    fail_at = injected_failure_offset(part.topic, part.partition, part.start, part.end)
    with _open_on_executor(part) as t:
        lo = part.start
        while lo < part.end:
            if fail_at is not None and lo >= fail_at:
                raise injected_read_failure(
                    part.topic,
                    part.partition,
                    part.start,
                    part.end,
                    f"injected task failure while reading {part.topic}[{part.partition}] "
                    f"{part.start}..{part.end} ({FAIL_TASKS_ENV}); Spark retries the task",
                )
            hi = min(part.end, lo + chunk)
            if fail_at is not None and lo < fail_at:
                hi = min(hi, fail_at)
            try:
                cols = t.read_columns(part.partition, lo, hi)
            except SourceError as exc:
                raise SourceError(f"{exc}. {_not_this_machine(part)}") from None
            n = hi - lo
            yield pa.RecordBatch.from_arrays(
                [
                    pa.array([part.topic] * n, pa.string()),
                    pa.array(cols["partition"], pa.int32()),
                    pa.array(cols["offset"], pa.int64()),
                    pa.array(cols["key"], pa.binary()),
                    pa.array(cols["value"], pa.binary()),
                    pa.array(cols["timestamp_us"], pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                    pa.array(cols["record_id"], pa.string()),
                ],
                schema=schema,
            )
            lo = hi


class EmbeddedLogStreamReader(RangeStreamReader):
    """Plans batches as offset ranges; see the module docstring."""

    def __init__(self, options: Mapping[str, str]) -> None:
        try:
            self.path = options["path"]
            self.topic = options["topic"]
        except KeyError as exc:
            raise ConfigError(f"the {FORMAT} source needs option {exc.args[0]!r}") from None
        self._configure_limits(options)
        self._kept: Topic | None = None

    def _log_ends(self) -> dict[int, int]:
        # One connection kept across polls, not one per poll: a process stopped while it
        # opens or closes the last connection to a WAL database holds SQLite's shared-memory
        # lock, and every other opener then fails with "locking protocol" until it resumes.
        # An idle driver polls all the time, so per-poll connections made that window
        # likely whenever a run is paused (SIGSTOP, a debugger, a VM freeze).
        if self._kept is None:
            self._kept = Topic(Path(self.path), self.topic)
        try:
            return self._kept.end_offsets()
        except BaseException:
            self.stop()  # reopened on the next poll
            raise

    def stop(self) -> None:
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.close()

    def _log_starts(self) -> dict[int, int]:
        return dict.fromkeys(self._log_ends(), 0)  # the embedded log keeps every record

    def _range_partition(self, r: OffsetRange) -> InputPartition:
        return RangePartition(self.path, r.topic, r.partition, r.start, r.end)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        return _arrow_batches(partition)


class EmbeddedLogBatchReader(DataSourceReader):
    """Reads the whole topic up to its current end (``spark.read``)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.path = options["path"]
        self.topic = options["topic"]

    def partitions(self) -> list[InputPartition]:
        with Topic(Path(self.path), self.topic) as t:
            ends = t.end_offsets()
        return [RangePartition(self.path, self.topic, p, 0, e) for p, e in ends.items() if e > 0]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, RangePartition)
        return _arrow_batches(partition)


class EmbeddedLogDataSource(DataSource):
    """``spark.readStream.format("sparkonce_log")``: see :class:`EmbeddedLogSource`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SCHEMA_DDL

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return EmbeddedLogStreamReader(self.options)

    def reader(self, schema: Any) -> DataSourceReader:
        return EmbeddedLogBatchReader(self.options)
