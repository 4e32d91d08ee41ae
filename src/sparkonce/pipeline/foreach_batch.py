"""The user's own ``writeStream``: a ``foreachBatch`` function that sparkonce provides.

A team whose query already ends in ``df.writeStream.foreachBatch(my_write)`` keeps the query,
its trigger and its checkpoint, and changes only the function::

    write = sparkonce.foreach_batch(PostgresSink(url, "orders"), name="orders", checkpoint=cp)
    df.writeStream.foreachBatch(write).option("checkpointLocation", cp).start()

It is the second route of "your own query" (the first, :class:`SparkSource`, hands sparkonce
the read and lets a :class:`~sparkonce.pipeline.Pipeline` own the ``writeStream``). A
function, not a ``Pipeline``: sparkonce does not start this query, so it cannot run the
runner's checks before the query starts; it runs them when Spark first calls it, before it
takes the epoch and before anything is written.

Why ``checkpoint`` must be given although Spark knows it: the ledger and a checkpoint are a
pair (the ledger's entries record the Spark query id they were written through). Naming it
binds the function to one query: a function handed to another query (copied code, another
checkpoint) is refused with one :class:`~sparkonce.errors.CheckpointError` line instead of
adopting whatever checkpoint calls it.

How a batch is named: never by ``batch_id`` alone. Spark calls the function on its stream
thread, whose local property names the query; the driver's ``StreamExecution`` of that query
gives its analyzed plan, whose one streaming relation is classified exactly as
:class:`SparkSource` classifies a DataFrame's (the same kinds, parsing and refusals,
:meth:`SparkSource.of_running_query`); the batch's ranges come from
``<checkpoint>/offsets/<batch_id>`` and, for batch 0's start, what the source keeps
(``sources/0/0`` for Kafka), read by the runner's own ``foreachBatch`` function.

Order, per run of the query (a new Spark run id: each start or restart), as the runner's
(:mod:`sparkonce.pipeline.runner`), which it reuses:

1. Checks, at the run's first batch: a classic session; the checkpoint is the calling query's
   (its ``metadata`` id and Spark's checkpoint root) and has this batch's offsets; the read's
   kind; the sink's tables and schema (``validate``, in the query's output mode); the
   checkpoint against the ledger (the runner's ``_resume_point``: another query's
   checkpoint, one ahead of the ledger, a stateful query's lost state). A **new checkpoint**
   here is batch 0 with no ledger entry written through this query: with a ledger that is
   not empty, its batch 0 must start exactly at the ledger's end (the user started the read
   there), else :class:`~sparkonce.errors.CheckpointLostError`, with the reader option that
   would start it there in the form its kind takes. sparkonce cannot restart the user's
   read, and never re-reads or skips silently.
2. ``sink.acquire``: a new epoch; any older run is fenced from now on.
3. The checkpoint and the ledger are read again; if they moved, the checks run again.
4. Every batch: the runner's ``_BatchHandler``, the committer's protocol (a replayed batch
   is skipped, a zombie's commit fenced).

Guarantee, in DESIGN.md section 1's words: the sink's own guarantee holds for the batches
this function commits. With an effectively-once sink (:class:`PostgresSink`,
:class:`SQLiteSink`, :class:`DeltaSink`...) and a read with **replayable input** (Kafka
through the connector, Delta, ``rate-micro-batch``; files under :class:`SparkSource`'s
condition), each record a batch reads takes effect exactly once in that sink, across
crashes, replays and zombies. What the user's query does outside this function is not
covered: another write in the same ``foreachBatch`` (``write(df, i); other(df)``) runs again
on a replay, so it is at-least-once at best. ``sparkonce explain`` has no pipeline to read
here; this docstring and the guide say what it would.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlparse

from sparkonce.config import OutputMode, check_pipeline_name
from sparkonce.errors import CheckpointError, ConfigError, FencedError
from sparkonce.faults import NO_FAULTS, FaultPlan
from sparkonce.files import location
from sparkonce.jvm import jvm, running_query, streaming_query_id
from sparkonce.observe.report import RunReport
from sparkonce.pipeline.runner import _BatchHandler, _resume_point
from sparkonce.sinks.base import Sink
from sparkonce.sources.spark_query import SparkSource, relations_in
from sparkonce.spark.checkpoint import Checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame

    from sparkonce.outputs.output_set import OutputSet
    from sparkonce.sources.base import Source

log = logging.getLogger("sparkonce.run")

_MODES: dict[str, OutputMode] = {"append": "append", "update": "update", "complete": "complete"}


def foreach_batch(
    sink: Sink, *, name: str, checkpoint: str | Path, faults: FaultPlan | None = None
) -> ForeachBatch:
    """A ``foreachBatch`` function that commits each batch of the calling query into
    ``sink`` under sparkonce's protocol (see the module docstring).

    ``name``: the pipeline's name in the sink's ledger and owner table. ``checkpoint``: the
    query's own ``checkpointLocation``; any other is refused. ``faults``: a fault plan for
    crash tests (:meth:`FaultPlan.from_env`); None injects nothing.

    Guarantee: the sink's, for the batches this function commits; writes the query makes
    outside it are not covered. Call :meth:`ForeachBatch.close` once the query has ended.
    """
    return ForeachBatch(sink, name=name, checkpoint=checkpoint, faults=faults)


@dataclass(frozen=True)
class _Spec:
    """What the runner's checks and batch function read of a pipeline (a ``PipelineSpec``),
    for a query that sparkonce did not build: no transform, trigger or outputs of its own."""

    name: str
    source: Source
    sink: Sink
    output_mode: OutputMode
    stateful: bool | None
    checkpoint_location: str
    trigger: str = "the query's own"  # the runner's batch function does not read it
    output_set: OutputSet | None = None

    @staticmethod
    def transform(df: Any) -> Any:
        return df


@dataclass
class _Run:
    """One Spark run of the query (one run id): its epoch, report and batch function."""

    run_id: str
    handler: _BatchHandler


class ForeachBatch:
    """The callable ``(batch_df, batch_id) -> None`` that :func:`foreach_batch` returns."""

    def __init__(
        self, sink: Sink, *, name: str, checkpoint: str | Path, faults: FaultPlan | None = None
    ) -> None:
        check_pipeline_name(name)
        if not isinstance(sink, Sink):
            raise ConfigError(
                f"sparkonce.foreach_batch({name!r}): sink must be a sparkonce Sink (for example "
                f"PostgresSink), got {type(sink).__name__}"
            )
        if not isinstance(checkpoint, (str, Path)) or not str(checkpoint):
            raise ConfigError(
                f"sparkonce.foreach_batch({name!r}): checkpoint must be the query's "
                f"checkpointLocation, got {checkpoint!r}"
            )
        self.name = name
        self.sink = sink
        self.checkpoint_location = location(checkpoint, "checkpoint")
        self.faults = NO_FAULTS if faults is None else faults
        self._run: _Run | None = None
        self._ended: dict[str, int] = {}  # earlier runs' epochs: a call from one is fenced
        self._lock = threading.Lock()
        self.error: BaseException | None = None  # what stopped the current run, if anything

    @property
    def report(self) -> RunReport | None:
        """What the current (or last) run of the query did; None before its first batch."""
        return None if self._run is None else self._run.handler.report

    def __repr__(self) -> str:
        return (
            f"foreach_batch({self.name!r}, {self.sink.describe()}, "
            f"checkpoint={self.checkpoint_location!r})"
        )

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with self._lock:
            try:
                run = self._run_for(df, batch_id)
            except BaseException as exc:
                self.error = exc
                raise
        try:
            run.handler(df, batch_id)
        except BaseException as exc:
            self.error = exc
            raise

    def close(self) -> None:
        """Close the sink's connection (once the query has ended)."""
        with self._lock:
            self.sink.close()

    # -- a run's start --------------------------------------------------------------------
    def _run_for(self, df: DataFrame, batch_id: int) -> _Run:
        from sparkonce.spark.session import is_connect

        spark = df.sparkSession
        if is_connect(spark):
            raise ConfigError(
                f"sparkonce.foreach_batch({self.name!r}): Spark Connect is not supported (the "
                "function finds its query through the driver's JVM); run the query on a "
                "classic SparkSession, or hand sparkonce the read (Pipeline with SparkSource)"
            )
        query_id = streaming_query_id(spark)
        execution = None if query_id is None else running_query(spark, query_id)
        if query_id is None or execution is None:
            raise ConfigError(
                f"sparkonce.foreach_batch({self.name!r}) was called outside a running "
                "streaming query; hand it to writeStream.foreachBatch(...) and start the query"
            )
        run_id = str(execution.runId().toString())
        if self._run is not None and self._run.run_id == run_id:
            return self._run
        if run_id in self._ended and self._run is not None:
            raise FencedError(self.name, self._ended[run_id], self._run.handler.epoch)
        if self._run is not None:
            self._ended[self._run.run_id] = self._run.handler.epoch
            self.sink.close()
        self.error = None
        self._run = self._start(df, execution, query_id, run_id, batch_id)
        return self._run

    def _start(
        self, df: DataFrame, execution: Any, query_id: str, run_id: str, batch_id: int
    ) -> _Run:
        """Steps 1-3 of the module docstring, at the first batch of run ``run_id``."""
        spark = df.sparkSession
        checkpoint = Checkpoint.open(self.checkpoint_location, spark)
        self._check_own(checkpoint, execution, query_id, batch_id)
        source = SparkSource.of_running_query(relations_in(execution.analyzedPlan(), jvm(spark)))
        # Spark's output modes print as Append, Update and Complete.
        output_mode = _MODES.get(str(execution.outputMode().toString()).lower(), "append")
        spec = _Spec(
            self.name,
            source,
            self.sink,
            output_mode,
            checkpoint.has_state(),  # Spark planned this batch: a stateful query has state/
            checkpoint.path,
        )
        sink = self.sink
        sink.use_faults(self.faults)
        sink.open()
        try:
            sink.validate(df.schema, output_mode)
            seen_done = checkpoint.last_committed_batch()
            seen_end = sink.end_offsets(self.name)
            resumed = self._resume(spec, checkpoint, seen_end, seen_done, batch_id, query_id)
            owner = sink.acquire(self.name, source.uri())  # older runs are fenced from here
            last_done = checkpoint.last_committed_batch()
            ledger_end = sink.end_offsets(self.name)
            if ledger_end != seen_end or last_done != seen_done:  # an older run went on
                resumed = self._resume(spec, checkpoint, ledger_end, last_done, batch_id, query_id)
        except BaseException:
            sink.close()
            raise
        log.info(
            "pipeline %s: epoch %d, %s -> %s through sparkonce.foreach_batch, resuming from %s",
            self.name,
            owner.epoch,
            source.describe(),
            sink.describe(),
            resumed,
        )
        report = RunReport(self.name, owner.epoch, resumed)
        handler = _BatchHandler(spec, owner.epoch, checkpoint, report, None, faults=self.faults)
        return _Run(run_id, handler)

    def _check_own(
        self, checkpoint: Checkpoint, execution: Any, query_id: str, batch_id: int
    ) -> None:
        """Refuse a checkpoint that is not the calling query's own."""
        root = str(execution.resolvedCheckpointRoot())
        if root.startswith("file:"):
            root = unquote(urlparse(root).path)
        theirs = location(root, "checkpoint")
        own = checkpoint.query_id()
        if own != query_id or theirs != checkpoint.path:
            raise CheckpointError(
                f"sparkonce.foreach_batch({self.name!r}): the checkpoint {checkpoint.path} is "
                f"not the calling query's (Spark query {query_id} writes {theirs}; "
                f"{checkpoint.path} holds query {own or 'none'}). Nothing was written (no "
                "epoch was taken). Operator action: pass the query's own checkpointLocation "
                "as checkpoint=, and one foreach_batch function per query"
            )
        if checkpoint.read_text("offsets", str(batch_id)) is None:
            raise CheckpointError(
                f"sparkonce.foreach_batch({self.name!r}): Spark's offset log in "
                f"{checkpoint.path} has no batch {batch_id}, which the query is running; the "
                "checkpoint was changed while the query ran. Nothing was written (no epoch was "
                "taken). Operator action: restore the checkpoint directory"
            )

    def _resume(
        self,
        spec: _Spec,
        checkpoint: Checkpoint,
        ledger_end: dict[Any, int],
        last_done: int | None,
        batch_id: int,
        query_id: str,
    ) -> str:
        """The runner's resume check, with "new" as this route sees it: batch 0, and no
        ledger entry written through this query (else batch 0 is a replay of its own)."""
        sink, source = self.sink, spec.source
        last = sink.last_entry(self.name)
        new = batch_id == 0 and (
            last is None
            or (
                last.checkpoint_id != query_id
                and not any(e.checkpoint_id == query_id for e in sink.ledger(self.name))
            )
        )
        if new and isinstance(source, SparkSource):
            first = checkpoint.source_offset(0, source)
            assert first is not None  # _check_own saw it
            source.first_batch = source.batch_ranges(checkpoint.previous_offset(0, source), first)
        return _resume_point(spec, checkpoint, ledger_end, last, last_done, new=new)
