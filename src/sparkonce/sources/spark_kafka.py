"""A Kafka topic read through Spark's own connector (``spark-sql-kafka-0-10``).

Guarantee: a **replayable input** with deterministic batches, in the words of DESIGN.md
section 1, the same as :class:`~sparkonce.sources.kafka.KafkaSource`: Spark's Kafka
connector is itself the direct approach of section 4. It writes each batch's end offsets
per partition into the checkpoint's offset log before the batch runs, and a batch's
ranges are that entry and the one before (for the first batch, the initial offsets Spark
keeps in ``sources/0/0``). A replayed batch therefore reads the same ranges, and
re-reading a range returns the same records. The connector reads with
``kafka.isolation.level=read_committed`` (always: it cannot be changed), so aborted
transactions never appear. Paired with an effectively-once sink, each record takes
effect exactly once.

Limits, stated plainly:

- ``failOnDataLoss`` is always true. Records that retention (or ``delete_records``)
  removed before they were read stop the run with an
  :class:`~sparkonce.errors.OffsetOutOfRangeError`; nothing is skipped silently.
- The output columns are :class:`KafkaSource`'s. With ``value_format="utf8"``, key and
  value are checked with Spark's ``validate_utf8``: the first record that is not UTF-8
  fails the batch (KafkaSource reads the whole range first and counts the bad records).
  ``record_id`` is the ``sparkonce-record-id`` header, cast to a string (invalid bytes
  are not escaped, as KafkaSource does).
- On a compacted topic a replay can return fewer records (a warning is logged, as for
  KafkaSource). Read limits count offsets, not records.
- A partition added to the topic while the query runs starts at its log start; its
  first batch's range is recorded from offset 0.
- The connector can number a batch's partitions differently when it replays the batch
  (a hash map's order when planned, partition order when read back from the checkpoint).
  Spark's sinks do not care; :class:`~sparkonce.sinks.kafka.KafkaSink` names its tasks
  after the range each reads (:func:`~sparkonce.sinks.kafka.task_keys`), so a replay is
  recognised whatever the numbers.

When to pick it over :class:`KafkaSource`: when the connector's options are already tuned
(``minPartitions``, fetch sizes, ``kafka.*`` security settings), or for the connector's
throughput on large batches; ``benchmarks/kafka_source.py`` measures both readers on the
same topic. KafkaSource needs no JVM jars, reads per-partition limits
(``max_records_per_partition``), and decodes UTF-8 strictly per range.

The connector's jars come from ``$SPARKONCE_SPARK_KAFKA_JARS`` (a directory), ``spark-kafka/``
in ``$SPARKONCE_JAR_CACHE``, or ``.cache/jars/spark-kafka`` of the sparkonce checkout
(``scripts/fetch-jars.sh``); :meth:`SparkKafkaSource.spark_conf` puts them on
``spark.jars``, and ``sparkonce run`` applies it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.errors import CheckpointError, ConfigError
from sparkonce.jvm import spark_jars
from sparkonce.kafka.client import RETRY_S, TIMEOUT_S, masked
from sparkonce.offsets import BatchRanges, OffsetRange, TopicPartition
from sparkonce.sources.kafka import (
    RECORD_ID_HEADER,
    KafkaSource,
    _OffsetClient,
)
from sparkonce.spark.jars import CONNECTOR_JAR_PREFIX, KIND_ENV, fetch_hint, find_jars

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.spark.checkpoint import Checkpoint

log = logging.getLogger(__name__)

JARS_ENV = KIND_ENV["spark-kafka"]

# Connector options sparkonce sets itself, and why a user's value is refused.
_MANAGED_OPTIONS = {
    "subscribe": "the topic is the source's topic argument",
    "subscribepattern": "a sparkonce source reads one topic",
    "assign": "a sparkonce source reads every partition of its topic",
    "startingoffsets": "pass starting_offsets=...; the ledger's end wins when it has one",
    "startingoffsetsbytimestamp": "pass starting_offsets=...",
    "startingtimestamp": "pass starting_offsets=...",
    "startingoffsetsbytimestampstrategy": "pass starting_offsets=...",
    "endingoffsets": "a streaming source has no end",
    "endingoffsetsbytimestamp": "a streaming source has no end",
    "endingtimestamp": "a streaming source has no end",
    "failondataloss": "records lost to retention must stop the run, never be skipped",
    "includeheaders": "headers are read for record_id",
    "kafka.bootstrap.servers": "pass the brokers as bootstrap_servers",
    "kafka.isolation.level": "the source always reads with read_committed",
    "maxoffsetspertrigger": "pass max_records_per_batch=...",
}


def spark_kafka_jars() -> list[str]:
    """The connector's jars (see the module docstring); empty if none are found."""
    return find_jars("spark-kafka")


def check_connector_matches(jars: list[str], spark_version: str) -> None:
    """Raise :class:`ConfigError` when the connector jar among ``jars`` was built for another
    Spark minor version than ``spark_version`` (PySpark's): the connector calls Spark's
    internals, so a mismatch fails deep inside a query, if at all visibly. Nothing to check
    when no connector jar is among them."""
    minor = ".".join(spark_version.split(".")[:2])
    for jar in jars:
        name = Path(jar).name
        if not name.startswith(CONNECTOR_JAR_PREFIX):
            continue
        version = name.rsplit("-", 1)[-1].removesuffix(".jar")
        if ".".join(version.split(".")[:2]) != minor:
            raise ConfigError(
                f"SparkKafkaSource: PySpark {spark_version} is installed, but the Kafka "
                f"connector found ({jar}) is {version}, built for Spark "
                f"{'.'.join(version.split('.')[:2])}. Maven Central has no connector for "
                f"Spark {minor} that sparkonce pins yet: put one built for Spark {minor} in a "
                f"directory and set {JARS_ENV} to it, install pyspark~=4.2.0, or read with "
                "KafkaSource, which needs no JVM jars."
            )


def connector_spark_conf() -> dict[str, str]:
    """``spark.jars`` with the connector's jars (checked against PySpark's version); empty
    when none are found."""
    import pyspark

    jars = spark_kafka_jars()
    check_connector_matches(jars, pyspark.__version__)
    return {"spark.jars": ",".join(jars)} if jars else {}


class SparkKafkaSource(KafkaSource):
    """Read a Kafka topic through Spark's own Kafka connector (see the module docstring).

    Guarantee: a replayable input with deterministic batches, as :class:`KafkaSource`:
    Spark's offset log holds each batch's end offsets before the batch runs, the ranges
    are read again unchanged on a replay, and always under ``read_committed``. Limits:
    records removed by retention before they are read stop the run with a clear
    :class:`~sparkonce.errors.OffsetOutOfRangeError` (``failOnDataLoss`` is always on).

    ``options`` are the connector's own (``minPartitions``, ``kafka.fetch.max.bytes``,
    ``kafka.security.protocol``...), passed to ``readStream.format("kafka")`` as given;
    the ones sparkonce sets itself are refused with the argument to use instead.
    ``client_config`` is the same as KafkaSource's (librdkafka names, for the driver's
    offset queries); it is also given to the connector as ``kafka.``-prefixed options.
    ``max_records_per_batch`` becomes ``maxOffsetsPerTrigger``. The other arguments are
    KafkaSource's.
    """

    stable_task_numbers: ClassVar[bool] = False  # the connector can renumber a replay

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        max_records_per_batch: int | None = None,
        starting_offsets: str = "earliest",
        value_format: str = "binary",
        client_config: Mapping[str, str | int | float | bool] | None = None,
        group_id: str | None = None,
        timeout: float = TIMEOUT_S,
        options: Mapping[str, str | int | float | bool] | None = None,
        retry_timeout: float = RETRY_S,
    ) -> None:
        super().__init__(
            bootstrap_servers,
            topic,
            max_records_per_batch=max_records_per_batch,
            starting_offsets=starting_offsets,
            value_format=value_format,
            client_config=client_config,
            group_id=group_id,
            timeout=timeout,
            retry_timeout=retry_timeout,
        )
        self.connector_options = _check_options(options)

    def describe(self) -> str:
        return f"SparkKafkaSource({self.uri()} value_format={self.value_format})"

    def __repr__(self) -> str:
        extra = f" client_config={masked(self.connection.config)}" if self.connection.config else ""
        if self.connector_options:
            extra += f" options={masked(self.connector_options)}"
        return f"SparkKafkaSource({self.uri()} value_format={self.value_format}{extra})"

    def _kept_options(self) -> dict[str, Any]:
        kept = super()._kept_options()
        del kept["max_records_per_partition"]  # not an argument here
        return {**kept, "options": dict(self.connector_options)}

    def aligned(self) -> None:
        """None: Spark's connector already shares ``maxOffsetsPerTrigger`` out in
        proportion to each partition's backlog."""
        return None

    def spark_conf(self) -> dict[str, str]:
        return connector_spark_conf()

    # -- reading -------------------------------------------------------------------------
    def connector_settings(self, start: Mapping[TopicPartition, int] | None) -> dict[str, str]:
        """Everything given to ``readStream.format("kafka")`` (holds client_config
        secrets: never log it)."""
        opts = {f"kafka.{k}": str(v) for k, v in self.connection.config.items()}
        opts.update(self.connector_options)
        opts.update(
            {
                "kafka.bootstrap.servers": self.bootstrap_servers,
                "subscribe": self.topic,
                "kafka.isolation.level": "read_committed",
                "failOnDataLoss": "true",
                "includeHeaders": "true",
                "startingOffsets": self._starting(start),
            }
        )
        if self.max_records_per_batch:
            opts["maxOffsetsPerTrigger"] = str(self.max_records_per_batch)
        return opts

    def _starting(self, start: Mapping[TopicPartition, int] | None) -> str:
        """Spark's ``startingOffsets``: every partition of the topic, from the ledger's end
        offsets (``start``) or ``starting_offsets``; -2 is Spark's "earliest"."""
        given: dict[int, int] = {p: o for (t, p), o in (start or {}).items() if t == self.topic}
        if not given:
            if self.starting_offsets in ("earliest", "latest"):
                return self.starting_offsets
            given = {int(p): int(o) for p, o in json.loads(self.starting_offsets).items()}
            fill = 0  # KafkaSource's rule: partitions the JSON leaves out start at 0
        else:
            fill = -2  # a partition the ledger has not seen: its log start
        client = _OffsetClient(self.connection, self.topic, self.timeout)
        try:
            partitions = client.partitions()
        finally:
            client.close()
        return json.dumps({self.topic: {str(p): given.get(p, fill) for p in partitions}})

    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        from pyspark.errors import AnalysisException
        from pyspark.sql import functions as F

        # Fail fast, on the driver: TopicNotFoundError / KafkaUnavailableError.
        self.connection.partitions(self.topic, timeout=self.timeout)
        self._warn_if_compacted()
        settings = self.connector_settings(start)
        log.info("reading %s through Spark's Kafka connector from %s", self.describe(), start)
        try:
            raw = spark.readStream.format("kafka").options(**settings).load()
        except AnalysisException as exc:
            if "DATA_SOURCE_NOT_FOUND" in str(exc) or "Failed to find data source" in str(exc):
                raise ConfigError(_missing_connector(spark)) from None
            raise
        header = F.expr(
            "try_element_at(filter(headers, h -> h.key = "
            f"'{RECORD_ID_HEADER}' AND length(h.value) > 0), 1).value"
        )
        key, value = F.col("key"), F.col("value")
        if self.value_format == "utf8":
            key = F.validate_utf8(key.cast("string"))
            value = F.validate_utf8(value.cast("string"))
        return raw.select(
            F.col("topic"),
            F.col("partition"),
            F.col("offset"),
            key.alias("key"),
            value.alias("value"),
            F.col("timestamp"),
            header.cast("string").alias("record_id"),
        )

    def initial_offset(self, checkpoint: Checkpoint) -> str | None:
        """The offsets the connector started the query at (its ``sources/0/0`` file): the
        start of batch 0's ranges."""
        return connector_initial_offset(checkpoint)

    def batch_ranges(self, previous: str | None, current: str) -> BatchRanges:
        """A batch's ranges from Spark's offset log: this batch's end offsets, and the
        batch before's (or the query's initial offsets) as their starts."""
        return connector_ranges(self.topic, previous, current)


# -- the connector's offsets (also read by SparkSource, for a query the user built) ---------


def connector_initial_offset(checkpoint: Checkpoint) -> str | None:
    """The offsets the Kafka connector started a query at (the checkpoint's ``sources/0/0``
    file), None when it has none yet."""
    data = checkpoint.read_bytes("sources", "0", "0")
    if data is None:
        return None
    text = data.lstrip(b"\x00").decode("utf-8")  # a 0 byte leads (SPARK-19517)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("v"):
        where = f"{checkpoint.path}/sources/0/0"
        raise CheckpointError(f"{where}: not the Kafka connector's initial offsets ({lines[:1]})")
    return lines[1]


def connector_ranges(topic: str, previous: str | None, current: str) -> BatchRanges:
    """A batch's ranges of ``topic`` from the connector's offsets in Spark's offset log:
    ``current`` holds the batch's end offsets, ``previous`` (the batch before's, or the
    query's initial offsets; None: 0) their starts."""
    ends = connector_offsets(topic, current)
    starts = connector_offsets(topic, previous) if previous is not None else {}
    return BatchRanges(
        tuple(OffsetRange(topic, p, starts.get(p, 0), end) for p, end in sorted(ends.items()))
    )


def connector_offsets(topic: str, text: str) -> dict[int, int]:
    """The connector's offset JSON ``{"<topic>": {"<partition>": offset}}`` as offsets by
    partition; :class:`CheckpointError` unless it names ``topic`` alone."""
    try:
        data = json.loads(text)
        parts = data[topic]
        out = {int(p): int(o) for p, o in parts.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointError(
            f"Spark's Kafka offsets {text[:200]!r} do not name topic {topic!r} with an "
            f"offset per partition ({type(exc).__name__}: {exc}); the checkpoint belongs to "
            "another source. Operator action: use this pipeline's own checkpoint directory"
        ) from None
    other = sorted(set(data) - {topic})
    if other:
        raise CheckpointError(
            f"Spark's Kafka offsets name topics {other} besides {topic!r}; a sparkonce "
            "pipeline reads one topic. Operator action: use this pipeline's own checkpoint"
        )
    # -2/-1 (earliest/latest) never reach the offset log: Spark resolves them first.
    if any(o < 0 for o in out.values()):
        raise CheckpointError(f"Spark's Kafka offsets {text[:200]!r} hold a negative offset")
    return out


def _check_options(options: Mapping[str, str | int | float | bool] | None) -> dict[str, str]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"options must be a mapping of Spark Kafka connector options, got "
            f"{type(options).__name__}"
        )
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"options keys must be connector option names, got {key!r}")
        why = _MANAGED_OPTIONS.get(key.lower())
        if why is not None and not (
            key.lower() == "kafka.isolation.level" and str(value) == "read_committed"
        ):
            raise ConfigError(f"options may not set {key!r}: {why}")
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"options[{key!r}] must be a string, number or boolean, got {type(value).__name__}"
            )
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out


def _missing_connector(spark: SparkSession) -> str:
    listed = spark_jars(spark)
    if listed is None:  # a Spark Connect session: the server's classpath, not ours
        return (
            "SparkKafkaSource needs Spark's Kafka connector "
            "(org.apache.spark:spark-sql-kafka-0-10_2.13 and its kafka-clients and commons-pool2) "
            "on the Spark Connect server's classpath, which does not have it. Start the server "
            "with them (start-connect-server.sh --jars ..., or spark.jars in its configuration); "
            f"the pinned jars: {fetch_hint('spark-kafka')}"
        )
    jars = listed or "(none)"
    found = spark_kafka_jars()
    where = (
        f"found here: {', '.join(found)}; build the session with them"
        if found
        else f"none found: {fetch_hint('spark-kafka')}; or set {JARS_ENV} to a directory "
        "holding them"
    )
    return (
        "SparkKafkaSource needs Spark's Kafka connector "
        "(org.apache.spark:spark-sql-kafka-0-10_2.13 and its kafka-clients and commons-pool2) "
        f"on spark.jars, which is {jars}. Jars {where}. "
        "sparkonce run and sparkonce.build_session(conf=pipeline.spark_conf()) add them."
    )
