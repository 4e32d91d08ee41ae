"""Running a pipeline on a Spark Connect session (``SparkSession.builder.remote(...)``).

Under Spark Connect the function given to ``foreachBatch`` is pickled and runs in a Python
worker beside the Spark server, not in the user's process. :class:`ConnectBatch` is that
function: it holds plain values only (the pipeline's name, the run's epoch, the sink's
settings, the source, the checkpoint's path) and opens its own sink, with its own store
connection, where it runs, at its first batch. Fencing holds as on a classic session: the
user's process takes the epoch before the query starts and passes it in by value, and
every commit checks it against the store. The user's process learns what was committed
from the ledger and from the query's progress once the query ends
(:func:`connect_report`).

Several outputs (stable output, dead letters, a late output) run the same way: the
:class:`~sparkonce.outputs.output_set.OutputSet` travels with the layout of the transform's
outputs and the epoch the run took in each store, and commits store after store in the
worker; the client's report reads every store's ledger (:class:`LedgerFeed`).

What does not run on Connect yet is refused before the epoch is taken
(:func:`refuse_on_connect`), with one line that names it and the way out.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sparkonce.errors import (
    CheckpointError,
    ConfigError,
    SparkOnceError,
    SparkServerUnavailableError,
)
from sparkonce.faults import NO_FAULTS, FaultPlan
from sparkonce.files import ArrowSettings
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry
from sparkonce.observe.report import BatchReport, RunReport
from sparkonce.outputs.output_set import SINGLE_OUTPUT, OutputSet
from sparkonce.pipeline.failure import short_error
from sparkonce.sinks.delta import DeltaSink
from sparkonce.sinks.kafka import KafkaSink
from sparkonce.sinks.sql import PostgresSink, SQLiteSink
from sparkonce.sinks.twophase import PostgresTwoPhaseSink
from sparkonce.sources.embedded import EmbeddedLogSource
from sparkonce.sources.kafka import KafkaSource
from sparkonce.sources.spark_kafka import SparkKafkaSource
from sparkonce.spark.checkpoint import Checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from sparkonce.pipeline.spec import PipelineSpec
    from sparkonce.sinks.base import Sink
    from sparkonce.sources.base import Source

log = logging.getLogger("sparkonce.run")

#: The sinks and sources a pipeline on a Spark Connect session may use today (and
#: IcebergSink, looked up by module: it needs the iceberg extra).
CONNECT_SINKS = (SQLiteSink, PostgresSink, PostgresTwoPhaseSink, KafkaSink, DeltaSink)
CONNECT_SOURCES = (EmbeddedLogSource, KafkaSource, SparkKafkaSource)
_CLASSIC = "use a classic Spark session (SparkSession.builder.master(...), no remote)"


def refuse_on_connect(pipeline: PipelineSpec, *, faults: FaultPlan) -> None:
    """Raise :class:`ConfigError` for what cannot run on a Spark Connect session yet.

    Called before anything is read or written (no epoch is taken): each message names
    what is not supported, says that Spark Connect sessions do not support it yet, and
    what to use instead. Several outputs (stable output and dead letters too) are checked
    output by output: each output's sink must be one that runs on Connect, as a single
    sink must."""
    name = pipeline.name
    what = _unsupported_sink(pipeline)
    if what is None and type(pipeline.source) not in CONNECT_SOURCES:
        what = f"the source {pipeline.source.describe()}"
    elif what is None and (faults.fail_tasks or faults.pause_tasks):
        what = "injected task faults (SPARKONCE_FAIL_TASKS, SPARKONCE_PAUSE_TASKS)"
    if what is not None:
        raise ConfigError(
            f"pipeline {name!r}: Spark Connect sessions do not support {what} yet; {_CLASSIC}. "
            "On Connect, sparkonce runs the embedded log, KafkaSource or SparkKafkaSource into "
            "SQLite, PostgreSQL (two-phase too), KafkaSink (not from SparkKafkaSource), "
            "DeltaSink (a local path, s3a:// or s3://) or IcebergSink (a local warehouse), as "
            "one sink or as several outputs "
            "(stable output and dead letters too). Nothing was changed (no epoch was taken)."
        )


def _unsupported_sink(pipeline: PipelineSpec) -> str | None:
    """What of the pipeline's sink (or of one of its outputs' sinks) Connect cannot run."""
    outputs = pipeline.output_set
    sinks = (
        [(f" (output {n!r})", s) for n, s in outputs.outputs.items()]
        if outputs is not None and not outputs.single
        else [("", pipeline.sink if outputs is None else outputs.outputs[SINGLE_OUTPUT])]
    )
    # IcebergSink needs the iceberg extra: when its module is not loaded, no sink is one.
    iceberg = sys.modules.get("sparkonce.sinks.iceberg")
    for which, sink in sinks:
        if iceberg is not None and type(sink) is iceberg.IcebergSink:
            continue
        if type(sink) not in CONNECT_SINKS:
            return f"the sink {sink.describe()}{which}"
        if isinstance(sink, KafkaSink) and not pipeline.source.stable_task_numbers:
            # KafkaSink names a replay's tasks by their input; without the JVM plan to find
            # it, only a source with stable task numbers will do (spark/kafka_lineage.py).
            return (
                f"the source {pipeline.source.describe()} into KafkaSink{which} (Spark's "
                "Kafka connector can number a replay's tasks differently, and a Connect "
                "session has no plan to tell; KafkaSource, whose numbers are stable, works)"
            )
    return None


class ConnectBatch:
    """The ``foreachBatch`` function on a Spark Connect session: pickled by the client, it
    runs in the server's Python worker. It captures no session, lock or open connection;
    its sink (and the store connection) is opened where it runs, at the first batch, and
    kept for the next ones. A failure raises, which fails the query: the user's process
    sees it as the query's exception."""

    def __init__(
        self,
        pipeline: str,
        epoch: int,
        sink: Sink,
        source: Source,
        checkpoint: str,
        stateful: bool | None,
        faults: FaultPlan = NO_FAULTS,
        files: ArrowSettings | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.epoch = epoch
        self.sink = sink  # pickles unopened (Sink.__reduce__)
        self.source = source
        self.checkpoint_location = checkpoint
        self.stateful = stateful
        # The run's crash, pause and connection-drop points: they fire where the commit
        # runs, in the server's Python worker (a crash there SIGKILLs that worker).
        self.faults = faults
        # How the worker reaches a checkpoint that is not a local path (pyarrow; no
        # secrets: a Connect server hands out none, the worker's AWS chain supplies them).
        self.files = files
        self._sink: Sink | None = None
        self._checkpoint: Checkpoint | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_sink"] = None  # opened again where the function runs
        state["_checkpoint"] = None
        return state

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        if self._sink is None:
            self._sink = self.sink
            self._sink.use_stable_task_numbers(self.source.stable_task_numbers)
            self._sink.use_faults(self.faults)
            if isinstance(self._sink, OutputSet):
                self._sink.files = self.files  # a late output reads the offset log
            self._sink.open()
        if self._checkpoint is None:
            self._checkpoint = Checkpoint.open(self.checkpoint_location, settings=self.files)
        checkpoint = self._checkpoint
        current = checkpoint.source_offset(batch_id, self.source)
        if current is None:
            raise CheckpointError(
                f"pipeline {self.pipeline!r}: Spark's offset log has no entry for batch "
                f"{batch_id} in {checkpoint.path}, where the Spark server's Python worker reads "
                "it. On a Spark Connect session the checkpoint must be a path that the client "
                "and the server see alike (the same machine, or a shared mount)."
            )
        previous = checkpoint.previous_offset(batch_id, self.source)
        ranges = self.source.batch_ranges(previous, current)
        stateful = self.stateful if self.stateful is not None else checkpoint.has_state()
        ctx = BatchContext(
            self.pipeline, self.epoch, ranges, batch_id, checkpoint.query_id(), stateful
        )
        try:
            result = self._sink.commit(ctx, df)
        except SparkOnceError as exc:
            if len(exc.args) == 1 and isinstance(exc.args[0], str):
                exc.args = (
                    f"{exc.args[0]} (pipeline {self.pipeline!r}, batch {batch_id} [{ranges}])",
                )
            raise
        finally:
            _release_on_server_only(df)
        log.info(
            "pipeline %s batch %d: %s %d rows in %.2f s [%s]",
            self.pipeline,
            batch_id,
            "skipped" if result.skipped else "committed",
            result.row_count,
            time.monotonic() - started,
            ranges,
        )


def _release_on_server_only(df: DataFrame) -> None:
    """Leave the release of the batch's DataFrame to the Spark server.

    The server caches each batch's DataFrame for the Python worker and drops it itself once
    the function returns (Spark 4.2's ``StreamingForeachBatchHelper``, on success and on
    failure alike). PySpark's client also asks for that release, from the finalizer of the
    DataFrame's ``CachedRemoteRelation``, with a blocking call that has no deadline (fixed
    upstream by SPARK-58846, not in PySpark 4.2). Seen here: a batch the ledger skipped,
    whose DataFrame was never read, was the worker's first ``ExecutePlan``; that call never
    returned, the worker never answered the server, and the query stopped planning batches
    (2 runs of 3 hung). Clearing the relation's id makes the finalizer skip its call."""
    plan: Any = getattr(df, "_plan", None)
    if type(plan).__name__ == "CachedRemoteRelation" and hasattr(plan, "_relation_id"):
        plan._relation_id = None


class LedgerFeed:
    """The user's process's view of a run on a Spark Connect session, from the ledger.

    The batches commit in the server's Python worker, so the client learns of each from
    the sink's ledger: :meth:`poll` (every second while the query runs, when someone
    listens: run observers or ``on_batch``) turns each new entry of this run's epoch into a
    :class:`BatchReport`, adds it to the run report, and hands it to the source's
    ``committed`` hook, the observers and ``on_batch``, in ledger order. :meth:`finish`
    reads the rest once the query has ended and counts the batches it did not commit.

    With several outputs, each store keeps its own ledger and the run holds an epoch in
    each; the stores commit a batch one after the other, in declaration order. A batch is
    reported once the last store's ledger has it under this run's epoch there (every
    store has it then), with the rows of every store that committed it in this run, as a
    classic session's report counts them; its ``seq`` is the first of those stores'."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        report: RunReport,
        hooks: Sequence[Callable[[BatchReport], None]] = (),
    ) -> None:
        self.pipeline = pipeline
        self.report = report
        self.hooks = tuple(hooks)
        self._seen: set[int] = set()  # the seqs already reported (the last store's)

    def _epochs(self) -> list[tuple[Sink, int]]:
        """Each store's ledger holder and this run's epoch there, in commit order."""
        outputs = self.pipeline.output_set
        if outputs is None:
            return [(self.pipeline.sink, self.report.epoch)]
        return [
            (g.sinks[0], self.report.epoch if g.epoch is None else g.epoch) for g in outputs.groups
        ]

    def poll(self) -> tuple[list[LedgerEntry], int]:
        """Report the batches this run committed since the last call; returns the last
        store's whole ledger as it read it, and this run's epoch there."""
        p, report = self.pipeline, self.report
        stores = [(sink.ledger(p.name), epoch) for sink, epoch in self._epochs()]
        ledger, last_epoch = stores[-1]
        for e in ledger:
            if e.epoch != last_epoch or e.seq in self._seen:
                continue
            self._seen.add(e.seq)
            # This batch's entries of this run in every store (one, for a single sink).
            mine = [
                x
                for entries, epoch in stores
                for x in entries
                if x.epoch == epoch
                and x.spark_batch_id == e.spark_batch_id
                and x.checkpoint_id == e.checkpoint_id
            ]
            rows = sum(x.row_count for x in mine)
            batch = BatchReport(
                e.spark_batch_id or 0,
                e.ranges,
                CommitResult(False, rows, mine[0].seq),
                sum(x.commit_seconds or 0.0 for x in mine),
            )
            report.batches.append(batch)
            report.batches_committed += 1
            report.rows_committed += rows
            report.rows_written += rows
            try:
                p.source.committed(p.name, e.ranges)
            except Exception as exc:  # monitoring only: the ledger holds the truth
                log.warning("pipeline %s: could not report progress to the source: %s", p.name, exc)
            for hook in self.hooks:
                hook(batch)
        return ledger, last_epoch

    def finish(self, query: StreamingQuery, checkpoint_id: str | None) -> None:
        """Once the query has ended: the entries not yet reported, then the batches of the
        query's progress that this epoch did not commit. Such a batch was skipped if an
        earlier epoch's entry holds it (the same Spark batch of the same checkpoint: a
        replay; with several stores, in the last one, which commits a batch last), else it
        was empty. Input rows cannot tell: a skipped batch is never read, so Spark counts 0
        rows for it."""
        ledger, epoch = self.poll()
        ids = {b.spark_batch_id for b in self.report.batches}
        earlier = {
            e.spark_batch_id
            for e in ledger
            if e.epoch != epoch and e.checkpoint_id == checkpoint_id
        }
        try:
            progress = list(query.recentProgress)
        except Exception as exc:  # monitoring only
            log.debug(
                "pipeline %s: could not read the query's progress: %s", self.pipeline.name, exc
            )
            progress = []
        for bid in sorted({int(p.batchId) for p in progress} - ids):
            if bid in earlier:
                self.report.batches_skipped += 1
            else:
                self.report.batches_empty += 1


def server_gone(pipeline: PipelineSpec, exc: BaseException) -> None:
    """Raise :class:`SparkServerUnavailableError` if ``exc`` says the Spark Connect server
    stopped answering (gRPC's ``UNAVAILABLE`` once the client's retries ran out); return
    otherwise. The query ran in that server, so it is gone too: the message says what the
    ledger holds and what to do."""
    code = getattr(exc, "code", None)
    status = code() if callable(code) else None
    text = f"{status} {exc}"
    if "UNAVAILABLE" not in text and "failed to connect to all addresses" not in text:
        return
    raise SparkServerUnavailableError(
        f"pipeline {pipeline.name!r}: the Spark Connect server stopped answering "
        f"({short_error(exc)}). "
        "The streaming query ran in that server and ended with it; every batch it committed "
        "is in the sink's ledger. Run the pipeline again once the server is back: it resumes "
        "from the ledger."
    ) from exc
