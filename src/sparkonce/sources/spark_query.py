"""The user's own streaming DataFrame as a sparkonce source: :class:`SparkSource`.

A team that already has a ``spark.readStream...`` chain keeps it: sparkonce takes the
DataFrame (or a function ``spark -> DataFrame`` that builds it), finds the one streaming
relation its plan reads, and takes each batch's identity from the line Spark writes for that
relation into the checkpoint's offset log before the batch runs, never from Spark's
``batchId`` alone. The ledger stores it as :class:`~sparkonce.offsets.BatchRanges`, one
kind of source at a time, each line read as the source that owns the format reads it:

==================  ============================  ==============================================
kind                offset log line (Spark 4.x)   the batch in the ledger
==================  ============================  ==============================================
Kafka (connector)   ``{"events":{"0":12,...}}``   topic ``events``, per partition, as
                                                  :class:`SparkKafkaSource` (start of batch 0:
                                                  the connector's ``sources/0/0``)
Delta               ``{"reservoirVersion":2,...}``  ``delta:<table id>``, partition 0, positions
                                                  as :class:`DeltaSource`
files (json,        ``{"logOffset":4}``           ``spark:files:<directory>``, partition 0,
parquet, csv...)                                  ``[previous logOffset + 1, logOffset + 1)``
rate-micro-batch    ``{"offset":10,...}``         ``spark:rate-micro-batch``, partition 0,
                                                  ``[previous offset, offset)``
==================  ============================  ==============================================

Guarantee, in DESIGN.md section 1's words: a **replayable input** with deterministic batches
for Kafka, Delta and ``rate-micro-batch``, exactly as :class:`SparkKafkaSource` and
:class:`DeltaSource` state theirs (the same parsing). The file source is replayable under a
condition Spark's file source does not check: the batch's files are listed into the
checkpoint (``sources/0/<batch>``) before it runs and a replay reads that list again, so a
replay returns the same rows **only while no listed file is rewritten, appended to or
deleted**; and a file added with a modification time older than the newest one already seen
minus ``maxFileAge`` (7 days by default) is never read at all (Spark's
``FileStreamSource.SeenFilesMap.isNewFile``). ``sparkonce explain`` says so.

Refused, before anything starts: a plan with no streaming relation or more than one; the
``rate`` source (its offsets are seconds of the driver's clock since the query began, not
positions in stored input: a new checkpoint starts the clock, and so the values, again, and
what a batch holds depends on when it was planned; ``rate-micro-batch`` is its deterministic
twin); ``socket`` and every format whose offsets sparkonce does not know; a Kafka read with
``failOnDataLoss=false`` (skips lost records silently), ``subscribePattern``, ``assign`` or
several topics; a Delta read with options :class:`DeltaSource` refuses (``ignoreChanges``...);
a Spark Connect DataFrame; a SparkSource inside ``sources={...}``.

A replay, a checkpoint behind the ledger and one ahead of it: as every source (the runner
compares the ranges). A **lost checkpoint** needs the read to start at the ledger's end:
for Kafka (``startingOffsets``) and Delta (``startingVersion``, :class:`DeltaSource`'s rule:
only at a version's start) sparkonce can, when it was given a *function*: it calls it with a
session whose ``readStream...load()`` gets those options. A DataFrame built by hand cannot be
restarted at an offset, nor can a file or ``rate-micro-batch`` source (Spark keeps the file
source's seen files in the checkpoint): those refuse before the epoch with one
:class:`~sparkonce.errors.CheckpointLostError` line; nothing is ever re-read from the start.

The ledger stores the ranges; the raw offset JSON Spark wrote is not stored beside them (the
ledger record has no field for it yet: every ledger store would need a new column).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.errors import CheckpointError, CheckpointLostError, ConfigError, SourceError
from sparkonce.jvm import analyzed_plan, jvm
from sparkonce.offsets import BatchRanges, OffsetRange, TopicPartition
from sparkonce.sources.base import Source
from sparkonce.sources.delta import _MANAGED_OPTIONS as _DELTA_OPTIONS
from sparkonce.sources.delta import (
    OUT_OF_RANGE_CONF,
    VERSION_SPAN,
    DeltaSource,
    delta_ranges,
    version_of,
)
from sparkonce.sources.spark_kafka import (
    connector_initial_offset,
    connector_ranges,
    connector_spark_conf,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.spark.checkpoint import Checkpoint

log = logging.getLogger(__name__)

URI_SCHEME = "spark"
KAFKA, DELTA, FILES, RATE_MICRO_BATCH = "kafka", "delta", "files", "rate-micro-batch"
#: The kinds whose read sparkonce can start at the ledger's end (a function only).
RESTARTABLE = (KAFKA, DELTA)
_FILE_FORMATS = ("json", "parquet", "csv", "text", "orc", "avro", "xml")
# Delta options refused for a user's read: those that deliver rows twice, drop them silently,
# or change what the offsets mean (DeltaSource's reasons). Start and limit options are the
# user's own here.
_DELTA_REFUSED = {
    k: v
    for k, v in _DELTA_OPTIONS.items()
    if k not in ("startingversion", "startingtimestamp", "maxfilespertrigger", "skipchangecommits")
}
_RATE = (
    "Spark's rate source is not replayable: its offsets are seconds of the driver's clock since "
    "the query began, not positions in stored input, so what a batch holds depends on when it "
    "was planned and a new checkpoint starts its values again. Use format('rate-micro-batch') "
    "(rowsPerBatch=N), whose batches are fixed counts of rows"
)


@dataclass(frozen=True)
class Relation:
    """The one streaming relation of a user's query: its kind, where it reads (a topic, a
    directory, a table path) and its options (names lower-cased; never shown whole: Kafka's
    ``kafka.*`` options may hold credentials)."""

    kind: str
    location: str
    options: dict[str, str] = field(default_factory=dict, compare=False)

    def describe(self) -> str:
        where = {KAFKA: "topic", DELTA: "table", FILES: "directory"}.get(self.kind)
        return f"{self.kind} {where} {self.location}" if where else self.kind


def relations_of(df: DataFrame) -> list[tuple[str, str, dict[str, str]]]:
    """The streaming leaves of ``df``'s analyzed plan: (format, source name, options)."""
    plan = analyzed_plan(df)
    if plan is None:
        return []
    return relations_in(plan, jvm(df.sparkSession))


def relations_in(plan: Any, gateway: Any) -> list[tuple[str, str, dict[str, str]]]:
    """The streaming leaves of an analyzed plan (a JVM object): a DataFrame's, or a running
    query's (``StreamExecution.analyzedPlan``, which ``sparkonce.foreach_batch`` reads)."""
    found: list[tuple[str, str, dict[str, str]]] = []

    def seq(s: Any) -> list[Any]:
        return [s.apply(i) for i in range(s.size())]

    def node(n: Any) -> None:
        kids = seq(n.children())
        if not kids and n.isStreaming():
            found.append(_leaf(n, gateway))
        for c in kids:
            node(c)

    node(plan)
    return found


def _leaf(leaf: Any, gateway: Any) -> tuple[str, str, dict[str, str]]:
    name = str(leaf.nodeName())
    try:
        source_name = str(leaf.sourceName())
    except Exception:
        return name, name, {}
    try:  # Spark's V2 relation (Kafka, rate, rate-micro-batch)
        options = dict(leaf.extraOptions().asCaseSensitiveMap())
        return source_name, source_name, {str(k): str(v) for k, v in options.items()}
    except Exception:
        pass
    try:  # Spark's V1 relation (files, Delta): the DataSource it was made from
        ds = leaf.dataSource()
        converters = gateway.scala.jdk.javaapi.CollectionConverters
        options = dict(converters.asJava(ds.options()))
        return str(ds.className()), source_name, {str(k): str(v) for k, v in options.items()}
    except Exception:
        return source_name, source_name, {}


def classify(fmt: str, source_name: str, options: Mapping[str, str]) -> Relation:
    """The :class:`Relation` of one streaming leaf, or :class:`ConfigError` when its offsets
    are not ones sparkonce can replay (see the module docstring)."""
    opts = {k.lower(): v for k, v in options.items()}
    short = fmt.rsplit(".", 1)[-1].lower()
    if short in ("kafka", "kafkasourceprovider"):
        for key, why in (
            ("subscribepattern", "a pattern's topics change while the query runs"),
            ("assign", "SparkSource reads every partition of one topic"),
        ):
            if key in opts:
                raise ConfigError(f"SparkSource: the Kafka read sets {key!r}: {why}; use subscribe")
        topic = opts.get("subscribe", "")
        if not topic or "," in topic:
            raise ConfigError(
                f"SparkSource: the Kafka read subscribes to {topic!r}; SparkSource reads one "
                "topic (subscribe=TOPIC): give each topic a pipeline of its own"
            )
        if opts.get("failondataloss", "true").lower() == "false":
            raise ConfigError(
                "SparkSource: the Kafka read sets failOnDataLoss=false, which skips records "
                "retention removed before they were read without a word; remove the option "
                "(records lost so then stop the run with an error)"
            )
        return Relation(KAFKA, topic, opts)
    if short in ("delta", "deltadatasource"):
        for key, why in _DELTA_REFUSED.items():
            if key in opts:
                raise ConfigError(f"SparkSource: the Delta read sets {key!r}: {why}")
        return Relation(DELTA, opts.get("path", source_name), opts)
    if source_name.startswith("FileSource[") or short in _FILE_FORMATS:
        return Relation(FILES, opts.get("path", source_name[len("FileSource[") : -1]), opts)
    if short == "rate-micro-batch":
        return Relation(RATE_MICRO_BATCH, "rate-micro-batch", opts)
    if short == "rate":
        raise ConfigError(f"SparkSource: {_RATE}")
    raise ConfigError(
        f"SparkSource: the query reads format {fmt!r}, whose offsets sparkonce cannot replay "
        "or does not know. SparkSource takes Kafka (Spark's connector), Delta, file formats "
        "(json, parquet, csv, text, orc...) and rate-micro-batch"
    )


class SparkSource(Source):
    """The user's own streaming DataFrame as the pipeline's source (see the module docstring).

    Guarantee: a replayable input with deterministic batches for Kafka, Delta and
    ``rate-micro-batch`` reads, as :class:`SparkKafkaSource` and :class:`DeltaSource` state
    theirs; for a file source only while no file already listed is rewritten or deleted
    (``sparkonce explain`` flags it). Each batch's identity comes from Spark's offset log.

    ``query``: a function ``spark -> DataFrame`` (``sparkonce run`` and every restart rebuild
    the query with it; a lost checkpoint of a Kafka or Delta read can then resume from the
    ledger), or a streaming DataFrame already built on the pipeline's SparkSession. Its plan
    must read exactly one streaming relation of a kind whose offsets replay. ``reads``:
    ``"kafka"`` or ``"delta"`` adds what the session needs for that read (the connector's
    jars; Delta's jars, extension and catalog) to :meth:`spark_conf`, which ``sparkonce run``
    applies; ``spark_conf``: any other settings the read needs.
    """

    stable_task_numbers: ClassVar[bool] = False
    _frame: DataFrame | None
    _build: Callable[[SparkSession], DataFrame] | None
    relation: Relation | None
    _delta: DeltaSource | None
    #: A running query's first batch (batch 0), when its checkpoint is new: set by
    #: ``sparkonce.foreach_batch`` before :meth:`check_ledger_start`.
    first_batch: BatchRanges | None

    def __init__(
        self,
        query: DataFrame | Callable[[SparkSession], DataFrame],
        *,
        reads: str | None = None,
        spark_conf: Mapping[str, str] | None = None,
    ) -> None:
        from pyspark.sql import DataFrame

        if reads not in (None, KAFKA, DELTA):
            raise ConfigError(
                f"SparkSource reads={reads!r}: give 'kafka' (Spark's Kafka connector jars) or "
                "'delta' (Delta's jars, extension and catalog), or leave it out"
            )
        self._setup(reads, spark_conf)
        if isinstance(query, DataFrame):
            self._frame = query
            self.relation = self._inspect(query)
        elif callable(query):
            self._build = query
        else:
            raise ConfigError(
                "SparkSource takes a streaming DataFrame or a function spark -> DataFrame, got "
                f"{type(query).__name__}"
            )

    def _setup(self, reads: str | None, spark_conf: Mapping[str, str] | None) -> None:
        self.reads = reads
        self._conf = dict(spark_conf or {})
        self._frame = None
        self._build = None
        self.relation = None
        self._delta = None
        self._restarted = False  # this run's function got the ledger's end as its start
        self._running = False  # the read of a query already running (of_running_query)
        self.first_batch = None

    @classmethod
    def of_running_query(cls, leaves: list[tuple[str, str, dict[str, str]]]) -> SparkSource:
        """The read of a streaming query that is already running, from the streaming leaves
        of its analyzed plan (:func:`relations_in`): how ``sparkonce.foreach_batch`` names a
        user's batches. The same kinds, parsing and refusals as a DataFrame's. sparkonce
        cannot restart such a read (the user's code started it), so a new checkpoint with a
        ledger that is not empty is accepted only when the query's :attr:`first_batch`
        starts exactly at the ledger's end (:meth:`check_ledger_start`)."""
        source = cls.__new__(cls)
        source._setup(None, None)
        source._running = True
        source.relation = source._relation(leaves)
        return source

    # -- naming ------------------------------------------------------------------------------
    def uri(self) -> str:
        if self.relation is None:
            return f"{URI_SCHEME}:query"
        return f"{URI_SCHEME}:{self.relation.kind}:{self.relation.location}"

    def describe(self) -> str:
        route = "DataFrame" if self._frame is not None else "function"
        what = "not built yet" if self.relation is None else self.relation.describe()
        if self._running:
            return f"SparkSource({what}, of a running query)"
        return f"SparkSource({what}, from a {route})"

    def __repr__(self) -> str:
        return self.describe()

    def spark_conf(self) -> dict[str, str]:
        """``spark_conf`` as given, with the jars (and Delta's settings) that ``reads``
        names: what ``sparkonce run`` builds its session with."""
        from sparkonce.spark.session import merge_spark_conf

        if self.reads == KAFKA:
            return merge_spark_conf(connector_spark_conf(), self._conf)
        if self.reads == DELTA:
            from sparkonce.spark.delta_conf import delta_spark_conf

            return merge_spark_conf(delta_spark_conf("SparkSource"), self._conf)
        return dict(self._conf)

    def latest_offsets(self) -> dict[TopicPartition, int]:
        """Empty: the user's read is Spark's, so no lag in records is shown."""
        return {}

    @property
    def topic(self) -> str:
        """The ledger's topic of this source's batches."""
        rel = self._known()
        if rel.kind == KAFKA:
            return rel.location
        return f"{URI_SCHEME}:{rel.kind}:{rel.location}"

    # -- the query ---------------------------------------------------------------------------
    def _inspect(self, df: DataFrame) -> Relation:
        from sparkonce.spark.session import is_connect

        if is_connect(df.sparkSession):
            raise ConfigError(
                "SparkSource: Spark Connect sessions are not supported yet (the offset log's "
                "lines are matched to the query's plan through the driver's JVM); build the "
                "query on a classic SparkSession"
            )
        if not df.isStreaming:
            raise ConfigError(
                "SparkSource: the DataFrame is not streaming (spark.read); build it with "
                "spark.readStream"
            )
        return self._relation(relations_of(df))

    def _relation(self, leaves: list[tuple[str, str, dict[str, str]]]) -> Relation:
        """The one relation of a query whose streaming leaves are ``leaves``, classified."""
        found = list(dict.fromkeys((f, s, tuple(sorted(o.items()))) for f, s, o in leaves))
        if len(found) != 1:
            shown = ", ".join(s for _, s, _ in found) or "none"
            raise ConfigError(
                f"SparkSource: the query must read exactly one streaming relation, it reads "
                f"{len(found)} ({shown}). Join other data as static tables (spark.read), or "
                "give each stream a pipeline of its own"
            )
        fmt, name, options = found[0]
        rel = classify(fmt, name, dict(options))
        if rel.kind == DELTA:
            self._delta = self._delta_twin(rel)
        return rel

    def _delta_twin(self, rel: Relation) -> DeltaSource:
        """DeltaSource's view of the user's Delta read: its positions, start and failures."""
        if self._delta is not None and self._delta.path == DeltaSource(rel.location).path:
            return self._delta
        twin = DeltaSource(rel.location)
        version = rel.options.get("startingversion", "")
        twin._first_start = int(version) * VERSION_SPAN if version.isdigit() else 0
        return twin

    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        from sparkonce.spark.session import is_connect

        if self._frame is not None:
            if self._frame.sparkSession is not spark:
                raise ConfigError(
                    "SparkSource: the DataFrame was built on another SparkSession than the "
                    "pipeline runs on; build it on the same session, or give SparkSource a "
                    "function spark -> DataFrame"
                )
            return self._frame
        assert self._build is not None
        if is_connect(spark):
            raise ConfigError(
                "SparkSource: Spark Connect sessions are not supported yet; run the pipeline "
                "on a classic SparkSession"
            )
        self._restarted = False
        session: Any = _Restarting(spark, self, dict(start)) if start else spark
        try:
            df = self._build(session)
        except Exception as exc:
            if isinstance(exc, (ConfigError, SourceError)):
                raise
            raise ConfigError(
                f"SparkSource: the function that builds the query failed: {exc}"
            ) from exc
        from pyspark.sql import DataFrame

        if not isinstance(df, DataFrame):
            raise ConfigError(
                f"SparkSource: the function must return a streaming DataFrame, got "
                f"{type(df).__name__}"
            )
        self.relation = self._inspect(df)
        return df

    def start_options(
        self,
        spark: SparkSession,
        fmt: str | None,
        path: str | None,
        start: Mapping[TopicPartition, int],
    ) -> dict[str, str]:
        """The reader options that start the function's read at the ledger's end ``start``
        (Kafka's ``startingOffsets``, Delta's ``startingVersion``); none for other kinds."""
        kind = (fmt or "").lower()
        if kind == KAFKA:
            ends: dict[str, dict[str, int]] = {}
            for (topic, partition), offset in start.items():
                ends.setdefault(topic, {})[str(partition)] = offset
            self._restarted = True
            return {"startingOffsets": json.dumps(ends, sort_keys=True)}
        if kind == DELTA and path:
            self._delta = DeltaSource(path)
            self._restarted = True
            return self._delta.start_options(spark, start)
        return {}

    # -- batches -----------------------------------------------------------------------------
    def _known(self) -> Relation:
        if self.relation is None:
            raise ConfigError(
                "SparkSource: the query has not been built yet (the runner builds it first)"
            )
        return self.relation

    def initial_offset(self, checkpoint: Checkpoint) -> str | None:
        rel = self._known()
        if rel.kind == KAFKA:
            return connector_initial_offset(checkpoint)
        if rel.kind == DELTA:
            assert self._delta is not None
            return self._delta.initial_offset(checkpoint)
        return None

    def batch_ranges(self, previous: str | None, current: str) -> BatchRanges:
        rel = self._known()
        if rel.kind == KAFKA:
            return connector_ranges(rel.location, previous, current)
        if rel.kind == DELTA:
            return delta_ranges(previous, current)
        if rel.kind == FILES:
            end = _position(current, "logOffset", rel) + 1
            begin = 0 if previous is None else _position(previous, "logOffset", rel) + 1
        else:
            end = _position(current, "offset", rel)
            # rate-micro-batch always starts at 0: Spark 4.2's source has no starting offset
            # option (rowsPerBatch, numPartitions, startTimestamp, advanceMillisPerBatch),
            # and ignores any other it is given.
            begin = 0 if previous is None else _position(previous, "offset", rel)
        if begin > end:
            raise CheckpointError(
                f"{self.describe()}: Spark's offsets went back ({begin} to {end}) in the "
                "offset log; the checkpoint was changed by hand"
            )
        return BatchRanges((OffsetRange(self.topic, 0, begin, end),))

    def check_ledger_start(self, start: Mapping[TopicPartition, int]) -> None:
        rel = self._known()
        hint = (
            "restore the pipeline's checkpoint directory; or recompute the output from "
            "scratch (sparkonce reset --output-rows, and a new checkpoint)"
        )
        if self._running:
            self._check_running_start(rel, start)
            return
        if rel.kind in RESTARTABLE and self._frame is not None:
            raise CheckpointLostError(
                f"{self.describe()}: the checkpoint is new and the ledger already covers "
                f"{BatchRanges.at(start)}, but a DataFrame built by hand cannot be restarted at "
                "an offset, so the read would start from its own options again. Nothing was "
                "changed (no epoch was taken). Operator action: give SparkSource the function "
                "that builds the DataFrame (SparkSource(lambda spark: spark.readStream...)), "
                f"which sparkonce then starts at the ledger's end; or {hint}"
            )
        if rel.kind not in RESTARTABLE or not self._restarted:
            why = {
                FILES: "Spark's file source keeps the files it has read in the checkpoint "
                "(sources/0), so a new checkpoint would read every file of the directory again",
                RATE_MICRO_BATCH: "sparkonce does not start a rate-micro-batch read at an offset",
            }.get(rel.kind, "the read was not started with .load(), where sparkonce sets it")
            raise CheckpointLostError(
                f"{self.describe()}: the checkpoint is new and the ledger already covers "
                f"{BatchRanges.at(start)}; this read cannot start there ({why}). Nothing was "
                f"changed (no epoch was taken). Operator action: {hint}"
            )
        if rel.kind == KAFKA:
            self._check_same_topic(rel, start, "changed")
            return
        assert self._delta is not None
        self._delta.check_ledger_start(start)

    def _check_same_topic(
        self, rel: Relation, start: Mapping[TopicPartition, int], nothing: str
    ) -> None:
        """A Kafka read's ledger must name the query's topic only (``nothing``: what the
        message says was not done, "changed" or "written")."""
        other = sorted({t for t, _ in start} - {rel.location})
        if other:
            raise CheckpointLostError(
                f"{self.describe()}: the ledger's offsets name topic(s) {other}, not the "
                f"query's topic {rel.location!r}: the pipeline read another source before. "
                f"Nothing was {nothing} (no epoch was taken). Operator action: give this "
                "query a pipeline name of its own"
            )

    def _check_running_start(self, rel: Relation, start: Mapping[TopicPartition, int]) -> None:
        """A running query's new checkpoint, against a ledger that ends at ``start``: its
        first batch must start exactly there (the user started the read at the ledger's
        end), else :class:`CheckpointLostError` with the reader option that would."""
        if rel.kind == KAFKA:
            self._check_same_topic(rel, start, "written")
        if rel.kind == DELTA:
            assert self._delta is not None
            self._delta.check_ledger_start(start)  # a version's middle: no option starts there
        first = self.first_batch
        if first is not None:
            begins = first.starts()
            if set(start) <= set(begins) and all(
                pos == start.get(tp, 0) for tp, pos in begins.items()
            ):
                return  # the user's read starts where the ledger ends: nothing read twice
        began = "nothing" if first is None else str(BatchRanges.at(first.starts()))
        option = self.restart_option(start)
        if option is None:
            why = (
                "Spark's file source keeps the files it has read in the checkpoint, so a new "
                "one reads every file of the directory again"
                if rel.kind == FILES
                else "it has no option that starts it at an offset"
            )
            raise CheckpointLostError(
                f"{self.describe()}: the query's checkpoint is new (its batch 0 starts at "
                f"{began}) and the ledger already covers {BatchRanges.at(start)}; a "
                f"{rel.kind} read cannot start there ({why}). "
                "Nothing was written (no epoch was taken). Operator action: stop the query and "
                "restore its checkpoint directory; or recompute the output from scratch "
                "(sparkonce reset --output-rows, and a new checkpoint)"
            )
        raise CheckpointLostError(
            f"{self.describe()}: the query's checkpoint is new (its batch 0 starts at {began}) "
            f"and the ledger already covers {BatchRanges.at(start)}; sparkonce cannot restart "
            "a read the user's query started, and would read records again or skip some. "
            "Nothing was written (no epoch was taken). Operator action: stop the query, delete "
            "its checkpoint (it holds no committed batch) or take a new one, and start the "
            f"query with {option} on its readStream, where the ledger ends; or hand sparkonce "
            "the read as a function, Pipeline(source=SparkSource(lambda spark: ...)), which "
            "starts it there itself"
        )

    def restart_option(self, start: Mapping[TopicPartition, int]) -> str | None:
        """The reader option, as code, that starts this kind of read at the ledger's end
        ``start`` (Kafka's ``startingOffsets`` JSON, Delta's ``startingVersion``); None for a
        file or ``rate-micro-batch`` read, which have none (Spark 4.x's rate-micro-batch
        takes no starting offset)."""
        rel = self._known()
        if rel.kind == KAFKA:
            ends: dict[str, dict[str, int]] = {}
            for (topic, partition), offset in sorted(start.items()):
                ends.setdefault(topic, {})[str(partition)] = offset
            return f".option('startingOffsets', '{json.dumps(ends, sort_keys=True)}')"
        if rel.kind == DELTA:
            version = max((version_of(pos) for pos in start.values()), default=0)
            return (
                f".option('startingVersion', {version}) (if the table has no version {version} "
                f"yet, also set the session's {OUT_OF_RANGE_CONF}=true)"
            )
        return None

    def read_failure(self, text: str, ranges: BatchRanges | None) -> SourceError | None:
        if self.relation is not None and self.relation.kind == DELTA and self._delta is not None:
            return self._delta.read_failure(text, ranges)
        return None

    def replay_condition(self) -> str | None:
        """When a replayed batch of this read returns the same rows only under a condition
        Spark does not check: that condition, for ``sparkonce explain``; None otherwise."""
        rel = self._known()
        if rel.kind == FILES:
            return (
                "the files of a batch are listed into the checkpoint before it runs and a "
                "replay reads that list again, so it returns the same rows only while no "
                f"file of {rel.location} is rewritten, appended to or deleted once listed "
                "(write each file elsewhere and move it in whole); and a file whose "
                "modification time is older than the newest file already seen minus "
                "maxFileAge (7 days by default) is never read (Spark's FileStreamSource "
                "rule)"
                + (
                    "; cleanSource moves or deletes files once Spark committed their batch"
                    if "cleansource" in rel.options
                    else ""
                )
            )
        return None

    def read_note(self) -> str | None:
        """What the read delivers beyond committed input, though a replay repeats it
        exactly: a Kafka read at the connector's default ``read_uncommitted`` (records of
        aborted transactions); None otherwise. For ``sparkonce explain``."""
        rel = self._known()
        if rel.kind == KAFKA and rel.options.get("kafka.isolation.level") != "read_committed":
            return (
                "the Kafka read uses the connector's default read_uncommitted, so records of "
                "aborted transactions are delivered too (a replay delivers the same ones)"
            )
        return None


def _position(text: str, key: str, rel: Relation) -> int:
    try:
        value = int(json.loads(text)[key])
    except (ValueError, KeyError, TypeError) as exc:
        raise CheckpointError(
            f"Spark's offset {text[:200]!r} is not a {rel.kind} source's offset "
            f"({type(exc).__name__}: {exc}); the checkpoint belongs to another query. Operator "
            "action: use this pipeline's own checkpoint directory"
        ) from None
    if value < 0:
        raise CheckpointError(f"Spark's offset {text[:200]!r} holds a negative position")
    return value


class _Restarting:
    """The session a SparkSource function gets when its read must start at the ledger's end:
    the real session, except that ``readStream...load()`` adds the start options."""

    def __init__(
        self, spark: SparkSession, source: SparkSource, start: Mapping[TopicPartition, int]
    ) -> None:
        self._spark = spark
        self._source = source
        self._start = start

    def __getattr__(self, name: str) -> Any:
        return getattr(self._spark, name)

    @property
    def readStream(self) -> _StartingReader:
        return _StartingReader(self)


class _StartingReader:
    """A ``DataStreamReader`` that adds the start options to its ``load``."""

    def __init__(self, owner: _Restarting) -> None:
        self._owner = owner
        self._reader = owner._spark.readStream
        self._format: str | None = None

    def format(self, source: str) -> _StartingReader:
        self._format = source
        self._reader.format(source)
        return self

    def load(
        self, path: str | None = None, format: str | None = None, schema: Any = None, **options: Any
    ) -> DataFrame:
        o = self._owner
        extra = o._source.start_options(
            o._spark, format or self._format, path or options.get("path"), o._start
        )
        return self._reader.load(path, format, schema, **{**options, **extra})

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._reader, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            out = attr(*args, **kwargs)
            return self if out is self._reader else out

        return call
