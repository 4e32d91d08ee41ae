"""PySpark streaming source over an Apache Kafka topic (Python Data Source API, confluent-kafka).

Guarantee: a **replayable input** with deterministic batches, in the words of
DESIGN.md section 1 and the Spark direct Kafka approach of section 4. Each
micro-batch is *defined* by per-partition offset ranges, one Spark input
partition per non-empty range. The ranges are the source offset Spark writes
into its checkpoint before the batch runs, so after a driver crash Spark
rebuilds the same batch from the same ranges, and re-reading a range returns
exactly the same records. Everything is read with ``read_committed``
isolation: a range never ends past a partition's last stable offset, so the
records of aborted transactions never appear, and those of a transaction that
is still open appear only once it commits, in the batch after that.
Paired with an effectively-once sink, each record takes effect exactly once.

Limits, stated plainly:

- Kafka is a log with retention. A range Spark has planned but not read yet
  can be deleted by retention (or ``delete_records``); reading it then fails the
  batch with a :class:`~sparkonce.errors.SourceError` naming the topic,
  partition, range and log start offset. Records are never skipped silently.
- On a compacted topic (``cleanup.policy=compact``) the cleaner may remove
  records of a range before it is re-read, so a replay can return fewer
  records; :meth:`KafkaSource.stream` logs a warning for such topics.
- Consumer-group offsets (:meth:`KafkaSource.committed`) are written for lag
  monitoring only and never read back as the truth; progress lives in Spark's
  checkpoint and the sink's ledger.
- Read limits count offsets, not records: transaction markers and aborted
  records take offsets too.

Record ids: ``record_id`` is the value of a record header named
``sparkonce-record-id`` when there is one (decoded as UTF-8, invalid bytes
escaped), else NULL: a record its producer sent without an id has none, and
``sparkonce.outputs.dedupe`` passes it through and counts it. ``topic``,
``partition`` and ``offset`` always name the record.

Value formats: ``"binary"`` (default) gives BINARY ``key`` and ``value`` columns
and never fails. ``"utf8"`` gives STRING columns decoded as strict UTF-8; a
record that does not decode fails the batch (after the whole range is read,
with a count of the bad records), so no record is dropped.

Where things run: ``initialOffset``, ``latestOffset`` and ``partitions`` run on
the driver side (in Spark's Python planner process) with one long-lived
consumer used only to query offsets; ``read`` runs on executors and opens its
own consumer, assigned to the range, that never commits.

Offsets (the wire form of :mod:`sparkonce.offsets`)::

    {"<topic>": {"<partition>": [start, end], ...}}
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.errors import ConfigError, OffsetOutOfRangeError, SourceError
from sparkonce.kafka.client import RETRY_S, TIMEOUT_S, KafkaConnection, masked
from sparkonce.kafka.consumer import KafkaReader, new_consumer
from sparkonce.offsets import BatchRanges, OffsetRange, ReadLimits, TopicPartition
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

log = logging.getLogger(__name__)

FORMAT = "sparkonce_kafka"
URI_SCHEME = "kafka"
RECORD_ID_HEADER = "sparkonce-record-id"
VALUE_FORMATS = ("binary", "utf8")
# A read task that makes no progress for this long fails (Spark may retry it).
READ_STALL_TIMEOUT_S = 120.0
_CHUNK = 50_000  # rows per Arrow batch
_LEGAL_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")

# Settings sparkonce controls itself; a client_config may not change them.
_MANAGED = {
    "group.id": "pass group_id=... instead (it names the monitoring consumer group)",
    "enable.auto.commit": "sparkonce never commits reader offsets",
    "enable.auto.offset.store": "sparkonce never commits reader offsets",
    "auto.offset.reset": "ranges are explicit; a missing range is an error, never a reset",
    "isolation.level": "the source always reads with read_committed",
    "enable.partition.eof": "readers stop at the range end, not at partition EOF",
    "logger": "librdkafka logs go to the 'sparkonce.kafka.librdkafka' Python logger",
}


def schema_ddl(value_format: str = "binary") -> str:
    """The output schema: the embedded source's, with STRING key/value for ``"utf8"``."""
    kv = "STRING" if value_format == "utf8" else "BINARY"
    return (
        f"topic STRING, partition INT, offset BIGINT, key {kv}, value {kv}, "
        "timestamp TIMESTAMP, record_id STRING"
    )


SCHEMA_DDL = schema_ddl("binary")


def validate_topic(topic: object) -> str:
    """A legal Kafka topic name (letters, digits, '.', '_', '-'; at most 249 characters)."""
    if not isinstance(topic, str) or not _LEGAL_TOPIC.match(topic) or topic in (".", ".."):
        raise ConfigError(
            f"Kafka topic name {topic!r} is not valid: use 1-249 characters from "
            "letters, digits, '.', '_' and '-'"
        )
    return topic


def validate_client_config(config: Mapping[str, Any] | None) -> dict[str, str | int | float | bool]:
    """Check extra librdkafka settings; returns a plain dict (values never shown in errors)."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise ConfigError(
            f"client_config must be a mapping of librdkafka settings, got {type(config).__name__}"
        )
    out: dict[str, str | int | float | bool] = {}
    for key, value in config.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"client_config keys must be setting names, got {key!r}")
        if key == "bootstrap.servers":
            raise ConfigError("pass the brokers as bootstrap_servers, not in client_config")
        if key in _MANAGED:
            if key == "isolation.level" and value == "read_committed":
                continue
            raise ConfigError(f"client_config may not set {key!r}: {_MANAGED[key]}")
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"client_config[{key!r}] must be a string, number or boolean, "
                f"got {type(value).__name__}"
            )
        out[key] = value
    return out


class KafkaSource(Source):
    """Read a Kafka topic as a stream of deterministic batches (see the module docstring).

    Guarantee: a replayable input with deterministic batches. Per-partition offset
    ranges go into Spark's checkpoint before each batch runs, and re-reading a range
    returns the same records, under ``read_committed``: aborted transactions never
    appear. Limits: retention can delete a range before it is read, which fails the
    batch with a clear :class:`~sparkonce.errors.SourceError` instead of losing records
    silently; consumer-group offsets written by :meth:`committed` are for monitoring
    only.

    ``starting_offsets`` applies only when neither Spark's checkpoint nor the
    sink's ledger has a position: ``"earliest"`` (default: each partition's log
    start offset), ``"latest"`` (the last stable offsets), or a JSON object
    ``{"<partition>": offset}`` (partitions it does not list start at 0).
    ``client_config`` holds extra librdkafka settings (security...); its secret
    values never appear in ``repr``, :meth:`describe`, :meth:`uri` or logs.
    ``timeout`` bounds each metadata and offset query, in seconds. ``retry_timeout``
    (seconds, default 120) is how long the planner's queries and the read tasks keep
    retrying across leader changes and broker restarts before the run stops with
    :class:`~sparkonce.errors.KafkaUnavailableError` (exit 4).
    """

    stable_task_numbers: ClassVar[bool] = True

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        max_records_per_partition: int | None = None,
        max_records_per_batch: int | None = None,
        starting_offsets: str = "earliest",
        value_format: str = "binary",
        client_config: Mapping[str, str | int | float | bool] | None = None,
        group_id: str | None = None,
        timeout: float = TIMEOUT_S,
        retry_timeout: float = RETRY_S,
    ) -> None:
        self.topic = validate_topic(topic)
        self.connection = KafkaConnection(
            bootstrap_servers, validate_client_config(client_config), retry_s=retry_timeout
        )
        self.limits = ReadLimits(max_records_per_partition, max_records_per_batch)
        self.max_records_per_partition = max_records_per_partition
        self.max_records_per_batch = max_records_per_batch
        if not isinstance(starting_offsets, str):
            raise ConfigError(
                f"starting_offsets must be a string, got {type(starting_offsets).__name__}"
            )
        parse_starting(starting_offsets, self.topic)
        self.starting_offsets = starting_offsets
        if value_format not in VALUE_FORMATS:
            raise ConfigError(
                f"value_format {value_format!r} is not supported: use 'binary' (BINARY key and "
                "value, never fails) or 'utf8' (STRING, strict UTF-8)"
            )
        self.value_format = value_format
        if group_id is not None and (not isinstance(group_id, str) or not group_id.strip()):
            raise ConfigError(f"group_id must be a non-empty string, got {group_id!r}")
        self.group_id = group_id
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not 0 < timeout <= 3600
        ):
            raise ConfigError(f"timeout must be a number of seconds in (0, 3600], got {timeout!r}")
        self.timeout = float(timeout)
        self._committer: Any = None
        self._committer_group: str | None = None

    @property
    def bootstrap_servers(self) -> str:
        return self.connection.bootstrap

    def describe(self) -> str:
        return f"KafkaSource({self.uri()} value_format={self.value_format})"

    def __repr__(self) -> str:
        extra = f" client_config={masked(self.connection.config)}" if self.connection.config else ""
        return f"KafkaSource({self.uri()} value_format={self.value_format}{extra})"

    def uri(self) -> str:
        return f"{URI_SCHEME}://{self.bootstrap_servers}/{self.topic}"

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> KafkaSource:
        """Reopen ``kafka://HOST:PORT[,HOST:PORT...]/TOPIC``; ``kwargs`` go to the constructor."""
        prefix = f"{URI_SCHEME}://"
        rest = uri[len(prefix) :] if isinstance(uri, str) and uri.startswith(prefix) else ""
        bootstrap, _, topic = rest.partition("/")
        if not bootstrap or not topic:
            raise ConfigError(f"{uri!r} is not a Kafka source URI ({prefix}HOST:PORT/TOPIC)")
        return cls(bootstrap, topic, **kwargs)

    def relocated(self, uri: str) -> KafkaSource:
        """The same source (read limits, value format, client settings, group, timeout,
        starting offsets) over the brokers and topic that ``uri``
        (``kafka://HOST:PORT[,HOST:PORT...]/TOPIC``) names; see :meth:`Source.relocated`."""
        form = f"{URI_SCHEME}://HOST:PORT[,HOST:PORT...]/TOPIC"
        if not isinstance(uri, str) or not uri.startswith(f"{URI_SCHEME}://"):
            raise relocation_error(self, uri, form)
        try:
            return type(self).from_uri(uri, **self._kept_options())
        except ConfigError as exc:
            raise relocation_error(self, uri, form, str(exc)) from None

    def _kept_options(self) -> dict[str, Any]:
        """The constructor's arguments other than the location (kept by :meth:`relocated`)."""
        return {
            "max_records_per_partition": self.max_records_per_partition,
            "max_records_per_batch": self.max_records_per_batch,
            "starting_offsets": self.starting_offsets,
            "value_format": self.value_format,
            "client_config": dict(self.connection.config),
            "group_id": self.group_id,
            "timeout": self.timeout,
            "retry_timeout": self.connection.retry_s,
        }

    def options(self, start: Mapping[TopicPartition, int] | None = None) -> dict[str, str]:
        """The data source options (contain client_config secrets: never log them)."""
        opts = {
            "bootstrapServers": self.bootstrap_servers,
            "topic": self.topic,
            "valueFormat": self.value_format,
            "timeoutSeconds": repr(self.timeout),
            "retrySeconds": repr(self.connection.retry_s),
        }
        if self.connection.config:
            # The option name contains "secret" so that Spark's default redaction pattern
            # (spark.redaction.regex) hides the value wherever Spark shows options.
            opts[_CONFIG_OPTION] = json.dumps(dict(self.connection.config), sort_keys=True)
        opts.update(limit_options(self.limits))
        if start:
            opts["startingOffsets"] = json.dumps(
                {str(p): o for (t, p), o in sorted(start.items()) if t == self.topic}
            )
        else:
            opts["startingOffsets"] = self.starting_offsets
        return opts

    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        # Fail fast, on the driver: TopicNotFoundError / KafkaUnavailableError.
        self.connection.partitions(self.topic, timeout=self.timeout)
        self._warn_if_compacted()
        register(spark)
        log.info("reading %s from %s", self.describe(), start or self.starting_offsets)
        return spark.readStream.format(FORMAT).options(**self.options(start)).load()

    def read_all(self, spark: SparkSession) -> DataFrame:
        """The whole topic, log start to last stable offset, as a batch DataFrame."""
        self.connection.partitions(self.topic, timeout=self.timeout)
        register(spark)
        return spark.read.format(FORMAT).options(**self.options()).load()

    def read_ranges(self, spark: SparkSession, ranges: BatchRanges) -> DataFrame:
        """Exactly the records of ``ranges`` (a batch to replay) as a batch DataFrame."""
        other = sorted({r.topic for r in ranges.ranges} - {self.topic})
        if other:
            raise ConfigError(f"{self.describe()} cannot read ranges of other topics: {other}")
        register(spark)
        opts = self.options()
        opts["ranges"] = ranges.to_json()
        return spark.read.format(FORMAT).options(**opts).load()

    def latest_offsets(self) -> dict[TopicPartition, int]:
        """Each partition's last stable offset (read_committed end)."""
        client = _OffsetClient(self.connection, self.topic, self.timeout)
        try:
            return {(self.topic, p): o for p, o in client.ends().items()}
        finally:
            client.close()

    def committed(self, pipeline: str, ranges: BatchRanges) -> None:
        """Commit the batch's end offsets to consumer group ``sparkonce-<pipeline>``.

        Synchronous, for lag monitoring only (``kafka-consumer-groups --describe``):
        these offsets are never read back as the truth. Progress lives in Spark's
        checkpoint and the sink's ledger. The group is ``group_id`` if one was given.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka import TopicPartition as KafkaTopicPartition

        offsets = [
            KafkaTopicPartition(r.topic, r.partition, r.end, metadata=_COMMIT_NOTE)
            for r in ranges.ranges
            if r.topic == self.topic
        ]
        if not offsets:
            return
        group = self.group_id or f"sparkonce-{pipeline}"
        if self._committer is None or self._committer_group != group:
            self.close()
            self._committer = new_consumer(self.connection, group=group)
            self._committer_group = group
        try:
            results = self._committer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            raise self.connection.unavailable(
                f"committing monitoring offsets of group {group!r}", exc
            ) from None
        failed = [tp for tp in results or [] if tp.error is not None]
        if failed:
            raise SourceError(
                f"Kafka at {self.bootstrap_servers} refused monitoring offsets of group "
                f"{group!r} for {self.topic} partitions {[tp.partition for tp in failed]}: "
                f"{failed[0].error}. The pipeline is unaffected (the sink's ledger holds "
                "progress); check the group's ACLs if lag monitoring matters."
            )

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the monitoring consumer of :meth:`committed` (a Spark Connect
        batch function carries the source to the server; a copy opens its own)."""
        state = dict(self.__dict__)
        state["_committer"] = state["_committer_group"] = None
        return state

    def close(self) -> None:
        """Close the monitoring consumer of :meth:`committed`, if one was opened."""
        committer, self._committer, self._committer_group = self._committer, None, None
        if committer is not None:
            committer.close()

    def _warn_if_compacted(self) -> None:
        from confluent_kafka.admin import ConfigResource

        try:
            admin = self.connection.admin()
            resource = ConfigResource(ConfigResource.Type.TOPIC, self.topic)
            entries = admin.describe_configs([resource])[resource].result(timeout=self.timeout)
            policy = str(entries["cleanup.policy"].value or "")
        except Exception as exc:  # advisory only
            log.debug("could not read cleanup.policy of %s: %s", self.topic, exc)
            return
        if "compact" in policy:
            log.warning(
                "Kafka topic %s has cleanup.policy=%s: compaction may remove records of a range "
                "before it is re-read, so a replayed batch can differ. Use a topic with "
                "cleanup.policy=delete for effectively-once pipelines.",
                self.topic,
                policy,
            )


_CONFIG_OPTION = "clientConfigSecret"
_COMMIT_NOTE = "sparkonce: monitoring only; the sink ledger holds progress"


# --- confluent-kafka helpers (driver and executors) ---------------------------------------


class _OffsetClient:
    """Partition list and read_committed watermarks of one topic, over one reader."""

    def __init__(self, connection: KafkaConnection, topic: str, timeout: float) -> None:
        self.connection = connection
        self.topic = topic
        self.timeout = timeout
        self.reader = KafkaReader(connection, timeout=timeout)

    def close(self) -> None:
        self.reader.close()

    def partitions(self) -> list[int]:
        """The topic's partitions; transient errors are retried (``retry_s``)."""
        return self.connection.retrying(
            f"fetching metadata of topic {self.topic!r}", self._partitions_once
        )

    def _partitions_once(self) -> list[int]:
        from confluent_kafka import KafkaException

        try:
            meta = self.reader.consumer.list_topics(self.topic, timeout=self.timeout)
        except KafkaException as exc:
            raise self.connection.unavailable(
                f"fetching metadata of topic {self.topic!r}", exc
            ) from None
        t = meta.topics.get(self.topic)
        if t is None or t.error is not None or not t.partitions:
            # The canonical error (TopicNotFoundError or KafkaUnavailableError), or a count
            # if the topic appeared meanwhile.
            count = self.connection.partitions(self.topic, timeout=self.timeout)
            return list(range(count))
        return sorted(t.partitions)

    def watermarks(self, partition: int) -> tuple[int, int]:
        """(log start offset, last stable offset) of ``partition``."""
        return self.reader.watermarks(self.topic, partition)

    def ends(self) -> dict[int, int]:
        return {p: self.watermarks(p)[1] for p in self.partitions()}

    def starts(self) -> dict[int, int]:
        return {p: self.watermarks(p)[0] for p in self.partitions()}


def register(spark: SparkSession) -> None:
    """Register the data source with ``spark`` (idempotent)."""
    register_data_source(spark, KafkaDataSource)


# --- The Spark side: Python Data Source API classes --------------------------------
# Spark's Python workers import these classes; the planning they share is in
# sparkonce.sources.reader.

from pyspark.sql.datasource import (  # noqa: E402
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)


class KafkaRangePartition(InputPartition):
    """One offset range of one Kafka partition: the unit of a Spark input partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __str__(self) -> str:
        return f"{self.topic}[{self.partition}] offsets {self.start}..{self.end}"


def _injected_failure(part: KafkaRangePartition) -> Exception:
    """The injected failure of a read task of ``part`` (:func:`injected_read_failure`)."""
    return injected_read_failure(
        part.topic,
        part.partition,
        part.start,
        part.end,
        f"injected task failure while reading {part} ({FAIL_TASKS_ENV}); Spark retries the task",
    )


def _retention_error(part: KafkaRangePartition, log_start: int) -> SourceError:
    return SourceError(
        f"cannot read {part}: the partition's log now starts at offset {log_start}, so "
        f"records {part.start}..{min(log_start, part.end)} were lost to retention (or "
        "delete_records) before this pipeline read them. The batch failed and nothing of it "
        "was committed. Operator action: raise the topic's retention.ms/retention.bytes so "
        "pipelines keep up; to accept the loss, restart the pipeline from a later offset."
    )


class _Columns:
    """Arrow columns of one range being read, filled chunk by chunk."""

    def __init__(self, part: KafkaRangePartition, value_format: str) -> None:
        import pyarrow as pa

        self.part = part
        self.utf8 = value_format == "utf8"
        kv = pa.string() if self.utf8 else pa.binary()
        self.kv_type = kv
        self.schema = pa.schema(
            [
                ("topic", pa.string()),
                ("partition", pa.int32()),
                ("offset", pa.int64()),
                ("key", kv),
                ("value", kv),
                ("timestamp", pa.timestamp("us", tz="UTC")),
                ("record_id", pa.string()),
            ]
        )
        self.bad = 0
        self.first_bad: int | None = None
        self._reset()

    def _reset(self) -> None:
        self.offsets: list[int] = []
        self.keys: list[Any] = []
        self.values: list[Any] = []
        self.stamps: list[int | None] = []
        self.ids: list[str | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, messages: list[Any], end: int) -> bool:
        """Append the records of ``messages`` below ``end``; True once one reaches ``end``."""
        offsets, keys, values, stamps, ids = (
            self.offsets,
            self.keys,
            self.values,
            self.stamps,
            self.ids,
        )
        utf8 = self.utf8
        for m in messages:
            off = m.offset()
            if off >= end:
                return True
            key = m.key()
            value = m.value()
            if utf8:
                try:
                    key = None if key is None else key.decode("utf-8")
                    value = None if value is None else value.decode("utf-8")
                except UnicodeDecodeError:
                    self.bad += 1
                    if self.first_bad is None:
                        self.first_bad = off
                    key = value = None
            kind, ms = m.timestamp()
            rid = None
            headers = m.headers()
            if headers:
                for name, raw in headers:
                    if name == RECORD_ID_HEADER and raw:
                        rid = raw.decode("utf-8", "backslashreplace")
                        break
            offsets.append(off)
            keys.append(key)
            values.append(value)
            stamps.append(ms * 1000 if kind else None)  # kind 0: TIMESTAMP_NOT_AVAILABLE
            ids.append(rid)
        return False

    def flush(self) -> Any:
        import pyarrow as pa

        n = len(self.offsets)
        batch = pa.RecordBatch.from_arrays(
            [
                pa.array([self.part.topic] * n, pa.string()),
                pa.array([self.part.partition] * n, pa.int32()),
                pa.array(self.offsets, pa.int64()),
                pa.array(self.keys, self.kv_type),
                pa.array(self.values, self.kv_type),
                pa.array(self.stamps, pa.int64()).cast(pa.timestamp("us", tz="UTC")),
                pa.array(self.ids, pa.string()),
            ],
            schema=self.schema,
        )
        self._reset()
        return batch


def read_range(
    connection: KafkaConnection,
    part: KafkaRangePartition,
    value_format: str = "binary",
    timeout: float = TIMEOUT_S,
    chunk: int = _CHUNK,
) -> Iterator[Any]:
    """The records of ``part`` as pyarrow RecordBatches (runs on executors).

    Reads with the shared loop (:meth:`~sparkonce.kafka.consumer.KafkaReader.read_batches`),
    which stops when the consumer's position reaches the range end, not after a count of
    messages: transactional topics have offsets without records (markers, aborted records).
    """
    fail_at = injected_failure_offset(part.topic, part.partition, part.start, part.end)
    offsets = _OffsetClient(connection, part.topic, timeout)
    try:
        log_start, stable_end = offsets.watermarks(part.partition)
        if part.start < log_start:
            raise _retention_error(part, log_start)
        if part.end > stable_end:
            raise SourceError(
                f"cannot read {part}: the partition's last stable offset is {stable_end}, "
                f"below the range end {part.end} that was planned earlier. The log lost "
                "records (topic deleted and recreated, or an unclean leader election). "
                "Nothing of the batch was committed; check the topic before restarting."
            )
        if part.start == part.end:
            return
        cols = _Columns(part, value_format)
        batches = offsets.reader.read_batches(
            part.topic,
            part.partition,
            part.start,
            part.end,
            timeout=max(READ_STALL_TIMEOUT_S, connection.retry_s),
        )
        try:
            for records in batches:
                if fail_at is not None and any(m.offset() >= fail_at for m in records):
                    cols.add([m for m in records if m.offset() < fail_at], part.end)
                    if len(cols):
                        yield cols.flush()
                    raise _injected_failure(part)
                cols.add(records, part.end)
                if len(cols) >= chunk:
                    yield cols.flush()
        except OffsetOutOfRangeError as exc:
            # Retention (or delete_records) removed records of the range while it was read.
            if exc.log_start is not None and exc.offset < exc.log_start:
                raise _retention_error(part, exc.log_start) from None
            raise
        if len(cols):
            yield cols.flush()
        if fail_at is not None:  # no record at or after fail_at (markers only): fail anyway
            raise _injected_failure(part)
        if cols.bad:
            raise SourceError(
                f"{cols.bad} record{'s' if cols.bad != 1 else ''} in "
                f"{part.topic}[{part.partition}] offsets {part.start}..{part.end} "
                f"{'are' if cols.bad != 1 else 'is'} not valid UTF-8 in key or value "
                f"(first at offset {cols.first_bad}); the batch fails so none is lost: fix the "
                "producer, or read with value_format='binary'"
            )
    finally:
        offsets.close()


class _KafkaReaderBase:
    """Options shared by the stream and batch readers; the consumer is never pickled."""

    def _configure(self, options: Mapping[str, str]) -> None:
        try:
            bootstrap = options["bootstrapServers"]
            self.topic = validate_topic(options["topic"])
        except KeyError as exc:
            raise ConfigError(f"the {FORMAT} source needs option {exc.args[0]!r}") from None
        raw_config = options.get(_CONFIG_OPTION) or "{}"
        try:
            config = json.loads(raw_config)
        except json.JSONDecodeError:
            raise ConfigError(f"option {_CONFIG_OPTION} must be a JSON object") from None
        try:
            retry_s = float(options.get("retrySeconds") or RETRY_S)
        except ValueError:
            raise ConfigError("option retrySeconds must be a number") from None
        self.connection = KafkaConnection(
            bootstrap, validate_client_config(config), retry_s=retry_s
        )
        self.value_format = options.get("valueFormat") or "binary"
        if self.value_format not in VALUE_FORMATS:
            raise ConfigError(f"option valueFormat={self.value_format!r}: use 'binary' or 'utf8'")
        try:
            self.timeout = float(options.get("timeoutSeconds") or TIMEOUT_S)
        except ValueError:
            raise ConfigError("option timeoutSeconds must be a number") from None
        self._client: _OffsetClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_client"] = None
        return state

    def _offsets(self) -> _OffsetClient:
        if self._client is None:
            self._client = _OffsetClient(self.connection, self.topic, self.timeout)
        return self._client

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, KafkaRangePartition)
        return read_range(self.connection, partition, self.value_format, self.timeout)


class KafkaStreamReader(_KafkaReaderBase, RangeStreamReader):
    """Plans batches as offset ranges up to the last stable offsets; see the module docstring."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._configure(options)
        self._configure_limits(options)

    def _log_ends(self) -> dict[int, int]:
        return self._offsets().ends()

    def _log_starts(self) -> dict[int, int]:
        return self._offsets().starts()

    def _range_partition(self, r: OffsetRange) -> InputPartition:
        return KafkaRangePartition(r.topic, r.partition, r.start, r.end)

    def stop(self) -> None:
        self._close()


class KafkaBatchReader(_KafkaReaderBase, DataSourceReader):
    """``spark.read``: the whole topic (log start to last stable offset) or explicit ranges."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self._configure(options)
        raw = options.get("ranges")
        self.ranges = BatchRanges.from_json(raw) if raw else None

    def partitions(self) -> list[KafkaRangePartition]:
        if self.ranges is not None:
            ranges = [r for r in self.ranges.ranges if r.topic == self.topic]
        else:
            client = self._offsets()
            try:
                ranges = [
                    OffsetRange(self.topic, p, *client.watermarks(p)) for p in client.partitions()
                ]
            finally:
                self._close()
        return [
            KafkaRangePartition(r.topic, r.partition, r.start, r.end) for r in ranges if not r.empty
        ]


class KafkaDataSource(DataSource):
    """``spark.readStream.format("sparkonce_kafka")``: see :class:`KafkaSource`."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return schema_ddl(self.options.get("valueFormat") or "binary")

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)

    def reader(self, schema: Any) -> DataSourceReader:
        return KafkaBatchReader(self.options)
