"""Transactional Kafka sink: one Kafka transaction per Spark task, with its ledger marker.

Guarantee: **effectively-once for ``read_committed`` consumers**, when the
pipeline's transform is deterministic (the same input gives the same rows in
the same Spark partitions). Work may run more than once; only one attempt's
records per output partition of a batch ever become visible to
``read_committed`` readers.

How a batch commits: :class:`~sparkonce.commit.Committer` runs the steps of
:mod:`sparkonce.protocol` with the ledger topic as its ledger store
(:class:`~sparkonce.ledger.kafka_topic.KafkaLedgerStore`) and :class:`KafkaStager` as its
stager. Because Kafka commits per task, step 3 runs in the stager's
``prepare``, before the driver's transaction opens (the tasks' side is
:mod:`sparkonce.sinks.kafka_tasks`, their checks :mod:`sparkonce.commit.tasks`)::

    driver   committer  steps 1-2 (early look): the run's epoch is still the owner's (so
                        a fenced run starts no task); a batch the ledger already covers
                        is a replay: nothing runs
    driver   stager     a partly committed batch must be this one
    tasks    stager     step 3, each Spark task, by its task key k (below): init_transactions()
                        with transactional.id "sparkonce.<pipeline>.<topic>.<k>" (bumps the
                        producer epoch, which
                        fences and aborts any zombie attempt of the same task), then reads
                        the ledger topic: if a newer run took the pipeline, it writes
                        nothing (the driver raises FencedError); if its marker for this
                        batch is committed it does nothing; otherwise it writes its
                        records and its marker (pipeline, batch offsets, task key, Spark
                        batch) in ONE transaction and commits it. While the producer
                        starts and the ledger is read (a thread of the task), the task
                        reads its input ahead; it writes nothing before they are done
    driver   committer  step 1: the run's epoch is still the owner's (ledger topic; the
                        driver's transactional producer is fenced by any newer run)
    driver   committer  step 2: a replay is skipped; publish (step 3) has nothing left to do
    driver   committer  step 4: the batch's ledger entry, in the driver's own Kafka transaction
    driver   committer  step 5: commit it (and wait until it is readable); only then does
                        Spark write its commit log

A crash between step 3 and step 5 leaves some tasks' transactions committed.
The replay (same offsets, from Spark's checkpoint) runs every task again; the
tasks that find their marker skip, the others write, and step 4 completes the
batch. The owner epochs and ledger live in the sink's own store: the ledger
topic ``<topic>.sparkonce-ledger`` (one partition, kept forever), created when
missing. A start reads it from the pipeline's newest snapshot on, not from offset 0
(:mod:`sparkonce.ledger.kafka_topic`), so it takes the same time after a year of batches.

**Task keys.** A replay recognises the tasks that already committed by their task key,
which must name the same input in the run that replays a batch as in the run that planned
it. It is the Spark partition number (``"3"``) when that holds: after a shuffle (partition
numbers are hash buckets), and for sparkonce's own sources, which number a batch's input
partitions in sorted order. Spark's Kafka connector (``SparkKafkaSource``) numbers them in
the order of an unordered set, which can differ between the two runs; when a task reads one
of its input ranges without a shuffle between, the driver names the task after that range
instead (``"orders-3"``, or ``"orders-3.1"`` for the second split of partition 3 under
``minPartitions``), found by walking the batch's RDD lineage down to the connector's input
partitions (:func:`~sparkonce.spark.kafka_lineage.task_keys`). A transform that merges
the connector's input partitions without a shuffle (``coalesce``, ``union``) is refused
with :class:`SinkError`.

Limits, stated plainly:

* **Batch atomicity is per output partition.** ``read_committed`` readers can
  see some partitions of a batch before the others (until the replay after a
  crash finishes it); they never see a record twice or an aborted one.
* **Determinism.** A replay rewrites only the partitions whose marker is
  missing, so the transform must put the same rows in the same Spark
  partitions on a replay (the same input, code and ``spark.sql.shuffle.partitions``).
  A non-deterministic transform is only effectively-once per partition.
* **Transaction timeout.** A task whose transaction stays open longer than
  ``transaction_timeout_ms`` (a paused executor, say) is aborted by the
  coordinator: nothing of it becomes visible, the task fails, Spark retries it.
  The timeout aborts before the commit decision, so it never loses data that
  was reported committed. A run that dies with task transactions open does not make the
  next run wait for the timeout: its ``acquire`` aborts them
  (:meth:`~sparkonce.ledger.kafka_topic.KafkaLedgerStore.acquire`).
* **``read_uncommitted`` readers** see the records of aborted and zombie
  attempts too: duplicates are possible for them. Only ``read_committed``
  consumers get the guarantee.
* **Lost checkpoint mid-batch.** If the checkpoint is lost while a batch is
  partly committed, the new run stops with a :class:`~sparkonce.errors.LedgerError`
  naming the batch, unless it plans exactly the same batch again. A no-data batch
  (a stateful query's timers, no new input) counts as the same only with the same
  checkpoint and Spark batch id, so restoring the checkpoint is the fix there.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.commit import Staged, Stager
from sparkonce.commit.tasks import TASK_RESULT_DDL, results_of
from sparkonce.config import Guarantee, OutputMode, check_pipeline_name
from sparkonce.errors import (
    ConfigError,
    LedgerError,
    SinkError,
    TopicNotFoundError,
)
from sparkonce.kafka.client import RETRY_S, KafkaConnection
from sparkonce.ledger.base import BatchContext, LedgerEntry
from sparkonce.ledger.kafka_topic import (
    KafkaLedgerStore,
    LedgerState,
)
from sparkonce.offsets import BatchRanges, Coverage, classify
from sparkonce.sinks.base import TransactionalSink
from sparkonce.sinks.kafka_tasks import TaskPlan, write_task
from sparkonce.spark.kafka_lineage import task_keys

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

log = logging.getLogger(__name__)

LEDGER_SUFFIX = ".sparkonce-ledger"


def _describe_batch(ranges: BatchRanges, who: Any) -> str:
    """``batch t[0]:0..5``, or a no-data batch's Spark identity (``who``: a marker or a context)."""
    if not ranges.empty:
        return f"batch {ranges}"
    batch_id, query = who.spark_batch_id, who.checkpoint_id
    return f"no-data batch {batch_id} of checkpoint {query} (at {ranges})"


# --- the sink (driver side) -------------------------------------------------------------------


class KafkaStager(Stager):
    """How a Kafka sink stages a batch: step 3 in Spark's tasks, each committing its records
    and its marker in a Kafka transaction (:mod:`sparkonce.sinks.kafka_tasks`); the stager
    of :class:`KafkaSink`. ``sink`` is the sink's description, for error messages."""

    def __init__(
        self,
        conn: KafkaConnection,
        topic: str,
        ledger_topic: str,
        transaction_timeout_ms: int,
        store: KafkaLedgerStore,
        sink: str,
    ) -> None:
        self.conn = conn
        self.topic = topic
        self.ledger_topic = ledger_topic
        self.transaction_timeout_ms = transaction_timeout_ms
        self.store = store
        self.sink = sink
        # Whether a batch's Spark partition numbers name its input on a replay when there is
        # no JVM plan to check (a Spark Connect session); Sink.use_stable_task_numbers.
        self.numbers_stable = False

    def prepare(self, ctx: BatchContext, df: DataFrame, seq: int) -> Staged:
        """Step 3, in Spark tasks: each task commits its records and marker (driver starts them).

        First, on the driver: a partly committed batch must be this one (the committer
        has already checked that the run still owns the pipeline, so a fenced run starts
        no task). Returns the batch's row count; the payload is the tasks' stats.
        """
        from pyspark.sql.types import BinaryType

        state = self.store.folded(ctx.pipeline)
        self._check_pending(ctx, state, state.entries[-1] if state.entries else None)

        schema = df.schema
        plan = TaskPlan(
            conn=self.conn,
            topic=self.topic,
            ledger_topic=self.ledger_topic,
            pipeline=ctx.pipeline,
            epoch=ctx.epoch,
            ranges=ctx.ranges.to_json_obj(),
            seq=seq,
            scan_from=state.after_last_entry,
            spark_batch_id=ctx.spark_batch_id,
            checkpoint_id=ctx.checkpoint_id,
            transaction_timeout_ms=self.transaction_timeout_ms,
            value_is_binary=isinstance(schema["value"].dataType, BinaryType),
            key_column="key" in schema.names,
            partition_column="partition" in schema.names,
        )
        # The keys go to the tasks with the plan, so they are found on df, before the write
        # is planned; then again on the write's own plan, which the action below runs. Both
        # see the one RDD Spark made of the batch (foreachBatch hands it over as such), so
        # they agree; if they did not, nothing is written.
        keys = task_keys(df, numbers_stable=self.numbers_stable)
        plan = dataclasses.replace(plan, task_keys=keys, steps=self.task_steps)
        written = df.mapInArrow(lambda it: write_task(plan, it), TASK_RESULT_DDL)
        if keys is not None and task_keys(written, numbers_stable=self.numbers_stable) != keys:
            raise SinkError(
                f"pipeline {ctx.pipeline!r}: Spark planned this batch's Kafka input in two "
                "orders within one run, so KafkaSink cannot name its tasks; nothing was "
                "written, and the batch is replayed by the next run. Read with KafkaSource, "
                "whose task numbers are stable"
            )
        stats = results_of(written)
        # A task that found a newer owner wrote nothing ("fenced"); the committer's step 1
        # reads that owner record too and raises FencedError.
        return Staged(rows=sum(s.rows for s in stats), payload=stats)

    def after_failed_commit(self) -> str:
        return (
            "The ledger is unchanged, but tasks of the batch may already have committed their "
            "Kafka transactions: read_committed readers can see some of its output partitions. "
            "The replay writes only the partitions whose marker is missing, so nothing is "
            "duplicated."
        )

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        """Nothing to make visible: the tasks' transactions already did, per output partition.

        Adds the task counts to the batch's ledger record (``txn`` is the driver's
        :class:`~sparkonce.ledger.kafka_topic.KafkaLedgerTxn`).
        """
        stats = staged.payload
        txn.extra.update(tasks=len(stats), tasks_skipped=sum(1 for s in stats if s.skipped))

    def _check_pending(
        self, ctx: BatchContext, state: LedgerState, last: LedgerEntry | None
    ) -> None:
        """Refuse a batch that differs from a partly committed one (lost checkpoint).

        The markers written after the last batch entry belong to a batch whose tasks
        committed and whose entry did not land, unless they lie behind the ledger's end
        (a fenced attempt's, written too late; nothing can complete that batch). A
        no-data batch's markers sit at the ledger's end and name their Spark batch; those
        of its tasks that wrote no record do not count.
        """
        after = last.end_offsets if last else {}
        for marker in state.pending:
            ranges = marker.ranges
            if ranges.empty:
                mine = marker.is_for(ctx.ranges, ctx.spark_batch_id, ctx.checkpoint_id)
                if (ctx.ranges.empty and mine) or marker.rows == 0:
                    # This batch's own, from an earlier attempt; or another no-data batch's
                    # task that wrote no record (an empty no-data batch gets no entry).
                    continue
                behind = any(o < after.get(tp, 0) for tp, o in ranges.ends().items())
            else:
                if ranges == ctx.ranges:
                    continue
                try:
                    behind = classify(ranges, after) is Coverage.COMMITTED
                except LedgerError:
                    behind = False
            if behind:
                continue
            raise LedgerError(
                f"pipeline {ctx.pipeline!r}: {_describe_batch(ranges, marker)} is partly "
                f"committed in {self.sink} (task {marker.task} committed, the "
                f"batch's ledger entry is missing), but this run planned "
                f"{_describe_batch(ctx.ranges, ctx)} instead. This happens when the checkpoint "
                "was lost mid-batch. Operator action: restore the checkpoint directory, or "
                "re-run with the same read limits so the same batch is planned."
            )


class KafkaSink(TransactionalSink):
    """Transactional sink into a Kafka topic (see the module docstring for the guarantee).

    The output DataFrame needs a ``value`` column (string or binary) and may have
    a ``key`` column (string or binary) and a ``partition`` column (int); other
    columns are refused. Keys are hashed like Java clients do (murmur2), so a key
    always lands in the same partition. ``client_config`` holds extra librdkafka
    settings (security...); its secrets never appear in reprs or logs.

    The ledger topic, created when missing, gets ``ledger_replication_factor`` replicas, by
    default the cluster's ``default.replication.factor``, and ``min.insync.replicas`` 2 (1
    with fewer than 3 replicas; never below the cluster's own); a ledger topic with fewer
    replicas than ``min.insync.replicas + 1`` on a cluster with more brokers gets a warning
    at start.

    ``retry_timeout`` (seconds, default 120): how long the ledger's reads, on the driver and
    in the tasks, keep retrying across leader changes and broker restarts before the run
    stops with :class:`~sparkonce.errors.KafkaUnavailableError` (exit 4). The transactional
    producers keep librdkafka's own retries.

    The output topic must exist (``sparkonce kafka create BOOTSTRAP TOPIC --partitions N``);
    :meth:`validate` refuses a missing one, and Spark's ``"complete"`` output mode (a topic
    can only be appended to), with :class:`ConfigError` before the run takes its epoch.
    """

    guarantee: ClassVar[Guarantee] = "effectively-once"
    store: KafkaLedgerStore
    stager: KafkaStager

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        client_config: Mapping[str, Any] | None = None,
        ledger_topic: str | None = None,
        transaction_timeout_ms: int = 60_000,
        ledger_replication_factor: int | None = None,
        retry_timeout: float = RETRY_S,
    ) -> None:
        self.conn = KafkaConnection(bootstrap_servers, client_config or {}, retry_s=retry_timeout)
        if not topic or not isinstance(topic, str):
            raise ConfigError("KafkaSink needs the output topic's name")
        self.topic = topic
        self.ledger_topic = ledger_topic or f"{topic}{LEDGER_SUFFIX}"
        if not isinstance(transaction_timeout_ms, int) or transaction_timeout_ms < 1000:
            raise ConfigError(
                f"transaction_timeout_ms must be an integer >= 1000, got {transaction_timeout_ms!r}"
            )
        self.transaction_timeout_ms = transaction_timeout_ms
        self.store = KafkaLedgerStore(
            self.conn,
            self.ledger_topic,
            topic=topic,
            transaction_timeout_ms=transaction_timeout_ms,
            inspect_hint=self._status_hint("{pipeline}"),
            replication_factor=ledger_replication_factor,
        )
        self.stager = KafkaStager(
            self.conn, topic, self.ledger_topic, transaction_timeout_ms, self.store, self.describe()
        )
        self._opened = False

    # -- the store --------------------------------------------------------------------------
    def open_store(self) -> None:
        if self._opened:
            return
        self._check_output_topic()  # ConfigError / KafkaUnavailableError
        self.store.open()
        self._opened = True

    def close_store(self) -> None:
        self.store.close()
        self._opened = False

    def check_acquire(self, pipeline: str) -> None:
        check_pipeline_name(pipeline)

    def describe(self) -> str:
        return f"KafkaSink({self.conn.bootstrap} topic={self.topic})"

    def __repr__(self) -> str:
        return self.describe()

    def _status_hint(self, pipeline: str) -> str:
        return f"sparkonce status --pipeline {pipeline} --sink 'kafka://{self.conn.bootstrap}/{self.topic}'"

    def use_stable_task_numbers(self, stable: bool) -> None:
        self.stager.numbers_stable = stable

    # -- schema -------------------------------------------------------------------------------
    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check the output and the topic (driver, once per run, before the epoch is taken).

        Refuses, with :class:`ConfigError`: Spark's ``"complete"`` output mode (a topic
        cannot be replaced, only appended to), a missing output topic, and output
        columns other than ``key``, ``value`` and ``partition`` or of the wrong types.
        """
        from pyspark.sql.types import BinaryType, IntegerType, LongType, StringType

        if output_mode == "complete":
            raise ConfigError(
                f"KafkaSink (topic {self.topic!r}) does not support Spark's output mode "
                "'complete': each batch would have to replace the whole topic, and a Kafka "
                "topic can only be appended to. Use output_mode='update' (each batch writes "
                "the rows that changed) or 'append', or write the complete result to "
                "SQLiteSink or PostgresSink, which replace the table's content each batch."
            )
        self._check_output_topic()
        names = {f.name: f.dataType for f in schema.fields}
        if "value" not in names:
            raise ConfigError(
                f"KafkaSink needs a 'value' column in the pipeline's output (columns: "
                f"{list(names)}); select value (and optionally key, partition)"
            )
        extra = [n for n in names if n not in ("key", "value", "partition")]
        if extra:
            raise ConfigError(
                f"KafkaSink writes only key, value and partition; the output also has {extra}. "
                "Serialize them into value (e.g. F.to_json(F.struct(...)))."
            )
        for name in ("key", "value"):
            if name in names and not isinstance(names[name], (StringType, BinaryType)):
                raise ConfigError(
                    f"KafkaSink column {name!r} must be string or binary, got "
                    f"{names[name].simpleString()}; cast it first"
                )
        if "partition" in names and not isinstance(names["partition"], (IntegerType, LongType)):
            raise ConfigError("KafkaSink column 'partition' must be an integer")

    def _check_output_topic(self) -> int:
        """The output topic's partition count; ConfigError (exit 2) when it does not exist."""
        try:
            return self.conn.partitions(self.topic)
        except TopicNotFoundError as exc:
            raise ConfigError(
                f"KafkaSink: output topic {self.topic!r} does not exist at "
                f"{self.conn.bootstrap}; the sink does not create it (its partition count is "
                f"yours to choose). Create it first: `sparkonce kafka create "
                f"{self.conn.bootstrap} {self.topic} --partitions N`, then run again. Nothing "
                "was written and no epoch was taken."
            ) from exc

    def _output_dropped(self) -> None:
        """Both topics were emptied (an inspector's reset): forget what was read of them."""
        self.store.forget()


def kafka_sink_from_uri(uri: str, **kwargs: Any) -> KafkaSink:
    """``kafka://host:port[,host:port]/topic`` → :class:`KafkaSink`."""
    from urllib.parse import urlsplit

    parts = urlsplit(uri)
    topic = parts.path.lstrip("/")
    if parts.scheme != "kafka" or not parts.netloc or not topic:
        raise ConfigError(
            f"{uri!r} is not a Kafka sink URI: use kafka://HOST:PORT[,HOST:PORT]/TOPIC"
        )
    return KafkaSink(parts.netloc, topic, **kwargs)
