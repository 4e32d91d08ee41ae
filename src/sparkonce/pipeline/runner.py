"""Running a pipeline: checks, epoch, resume point, the streaming query, per-batch commits.

Order at start (every check that can fail on configuration runs *before* the epoch
is taken, so a misconfigured run never fences a healthy one):

1. Checks: the checkpoint path; the transform's output (a streaming DataFrame whose
   analyzed plan reads the pipeline's own streaming source and no other); Spark's
   checks of the query for its output mode (which Spark would otherwise make only when
   the query starts); ``stateful=False`` against the plan's state operators; the
   sink's tables, topics and schema; and the checkpoint against the ledger (an empty
   checkpoint of a stateful pipeline stops with ``CheckpointLostError``; a checkpoint
   of another query, by Spark's query id, or *ahead* of the ledger stops with
   ``CheckpointError``). The checkpoint's last committed batch is listed *before* the
   ledger is read: a live run writes the ledger first and Spark's commit log after, so
   a live run's progress never looks like a checkpoint ahead of the ledger.
2. ``sink.acquire`` takes a new epoch; any older run is fenced from now on.
3. The checkpoint, then the ledger's resume point, are read again (take over by
   writing before reading); if either moved since the checks, they run again.
4. The query starts; each micro-batch's ranges come from Spark's offset log and
   ``sink.commit`` runs the commit protocol inside ``foreachBatch``. A query that
   fails after a newer run took the epoch (a paused run continued, whose Spark then
   trips over the checkpoint the newer run wrote) is reported as ``FencedError``.

A run given an observer (:mod:`sparkonce.observe`: metrics, a progress display) calls
its hooks from step 4 on, through a :class:`~sparkonce.observe.base.RunWatch`: after each
batch, on Spark's progress events, on lag read by a thread of its own, on fencing and at
the end. The runner never imports what an observer needs (prometheus_client, rich), and
nothing an observer does can fail or slow a commit beyond its own ``on_batch``.

Whether a pipeline is stateful is what Spark itself records: a query with a
stateful operator has ``state/<operator>/`` in its checkpoint from its first
batch on. Each ledger entry records it, so a lost checkpoint of a stateful
pipeline is recognised from the ledger alone.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from sparkonce.errors import (
    RUNBOOKS,
    CheckpointError,
    CheckpointLostError,
    FencedError,
    PipelineError,
    RunStopped,
    SparkOnceError,
)
from sparkonce.faults import NO_FAULTS, FaultPlan
from sparkonce.ledger.base import BatchContext, LedgerEntry
from sparkonce.observe.base import RunObserver, RunStart, RunWatch
from sparkonce.observe.report import BatchReport, RunReport
from sparkonce.offsets import BatchRanges, TopicPartition
from sparkonce.outputs.dedup import dedup_counts
from sparkonce.outputs.output_set import OutputSet
from sparkonce.pipeline.failure import Cause, find_cause, rebuild, short_error, where_suffix
from sparkonce.pipeline.query import check_query, output_query
from sparkonce.spark.checkpoint import Checkpoint

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from sparkonce.pipeline.connect import LedgerFeed
    from sparkonce.pipeline.spec import PipelineSpec

log = logging.getLogger("sparkonce.run")


class _BatchHandler:
    """The ``foreachBatch`` function: runs on the driver, in this Python process."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        epoch: int,
        checkpoint: Checkpoint,
        report: RunReport,
        on_batch: Callable[[BatchReport], None] | None,
        watch: RunWatch | None = None,
        faults: FaultPlan = NO_FAULTS,
    ) -> None:
        self.faults = faults
        self.pipeline = pipeline
        self.epoch = epoch
        self.checkpoint = checkpoint
        self.report = report
        self.on_batch = on_batch
        self.watch = watch
        self.error: BaseException | None = None
        self.current: tuple[int, BatchRanges] | None = None  # the batch being committed
        self.stopping: RunStopped | None = None
        self._lock = threading.Lock()
        # What this run read from the checkpoint and cannot change while it runs: the
        # offsets Spark logged for the last batch (the next batch starts there), the
        # query's id, and whether it keeps state (fixed by its plan). On S3 each read is a
        # round trip: without these, four per batch instead of one.
        self._offsets: dict[int, str] = {}
        self._query_id: str | None = None
        self._stateful: bool | None = pipeline.stateful

    def _source_offset(self, batch_id: int) -> str | None:
        found = self._offsets.get(batch_id)
        if found is None:
            found = self.checkpoint.source_offset(batch_id, self.pipeline.source)
            if found is not None:
                self._offsets = {batch_id: found}  # the next batch asks for this one only
        return found

    def _batch_facts(self) -> tuple[str | None, bool]:
        if self._query_id is None:
            self._query_id = self.checkpoint.query_id()
        if self._stateful is None:
            # Spark has planned this batch, so a stateful query's state/ directory exists.
            self._stateful = self.checkpoint.has_state()
        return self._query_id, self._stateful

    def stop_between_batches(self, query: StreamingQuery, why: RunStopped) -> None:
        """Stop ``query`` when no commit is in flight: wait for the current one to end.

        The lock is released before ``query.stop()``: Spark's stop waits for its batch
        thread, and a batch that starts meanwhile calls this handler, which must be able to
        take the lock (it sees ``stopping`` and raises, committing nothing). Holding the
        lock across the stop deadlocks both threads."""
        self.stopping = why  # from here on, no new commit starts
        if self._lock.acquire(timeout=STOP_WAIT_S):
            self._lock.release()
        else:
            log.warning(
                "pipeline %s: a commit still runs after %.0f s; stopping anyway (the batch "
                "is then rolled back and replayed by the next run)",
                self.pipeline.name,
                STOP_WAIT_S,
            )
        query.stop()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        with self._lock:
            if self.error is not None:
                raise self.error
            if self.stopping is not None:
                raise self.stopping  # the run is stopping: no new commit starts
            try:
                self._commit(df, batch_id)
            except BaseException as exc:
                if isinstance(exc, SparkOnceError) and self.current is not None:
                    _name_batch(exc, self.pipeline.name, *self.current)
                self.error = exc
                raise

    def _commit(self, df: DataFrame, batch_id: int) -> None:
        started = time.monotonic()
        p = self.pipeline
        previous = self._source_offset(batch_id - 1) if batch_id > 0 else None
        current = self._source_offset(batch_id)
        if current is None:
            raise CheckpointError(
                f"pipeline {p.name!r}: Spark's offset log has no entry for batch {batch_id} in "
                f"{self.checkpoint.path}; the checkpoint was changed while the query ran"
            )
        if batch_id == 0:
            previous = self.checkpoint.previous_offset(0, p.source)
        ranges = p.source.batch_ranges(previous, current)
        self.current = (batch_id, ranges)
        query_id, stateful = self._batch_facts()
        ctx = BatchContext(p.name, self.epoch, ranges, batch_id, query_id, stateful)
        result = p.sink.commit(ctx, df)
        self.current = None
        report = BatchReport(batch_id, ranges, result, time.monotonic() - started)
        r = self.report
        r.batches.append(report)
        if result.skipped:
            if result.empty:
                r.batches_empty += 1
            else:
                r.batches_skipped += 1
            log.info(
                "pipeline %s batch %d: skipped, %s [%s]", p.name, batch_id, result.reason, ranges
            )
        else:
            r.batches_committed += 1
            r.rows_committed += result.row_count
            r.rows_written += result.written
            per_output = ", ".join(f"{n} {k}" for n, k in result.per_output.items())
            split = ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items())
            if result.rows_written is not None:
                per_output = ", ".join(
                    x for x in (per_output, f"{result.rows_written} written, one per key") if x
                )
            log.info(
                "pipeline %s batch %d: committed %d rows%s as ledger entry %s in %.2f s%s [%s]",
                p.name,
                batch_id,
                result.row_count,
                f" ({per_output})" if per_output else "",
                result.seq,
                report.seconds,
                f" ({split})" if split else "",
                ranges,
            )
        if not result.skipped or result.seq is not None:
            try:
                p.source.committed(p.name, ranges)
            except Exception as exc:  # monitoring only: the ledger holds the truth
                log.warning("pipeline %s: could not report progress to the source: %s", p.name, exc)
        if self.watch is not None:
            self.watch.batch(report)  # guarded: an observer never fails the run
        if self.on_batch is not None:
            self.on_batch(report)


def _name_batch(exc: SparkOnceError, pipeline: str, batch_id: int, ranges: BatchRanges) -> None:
    """Make ``exc``'s message name the batch whose commit failed on the driver and its
    ranges, as a failure in a Spark task does (its class, and so its exit code, stay)."""
    text = str(exc)
    if f"batch {batch_id} [" in text or len(exc.args) != 1 or not isinstance(exc.args[0], str):
        return
    exc.args = (f"{text} (pipeline {pipeline!r}, batch {batch_id} [{ranges}])",)


def _resume_point(
    pipeline: PipelineSpec,
    checkpoint: Checkpoint,
    ledger_end: dict[TopicPartition, int],
    last: LedgerEntry | None,
    last_done: int | None,
    *,
    new: bool | None = None,
) -> str:
    """Where the query resumes: "start", "checkpoint" or "ledger"; raises when it must not.

    ``last_done`` is the checkpoint's last committed batch, listed *before* ``ledger_end``
    was read: a live run commits a batch to the ledger before Spark records it in the
    checkpoint, so read in this order the checkpoint is never seen ahead of the ledger
    because of a live run's progress. ``new``: whether the checkpoint is new, when the
    caller knows better than its offset log (``sparkonce.foreach_batch`` is first called
    once Spark has planned batch 0); None reads the offset log."""
    sink = pipeline.sink
    if checkpoint.is_new if new is None else new:
        if isinstance(sink, OutputSet):
            sink.check_stores_agree(pipeline.name, checkpoint.path)
        if not ledger_end:
            return "start"
        stateful = pipeline.stateful
        if stateful is None:
            stateful = True if last is None or last.stateful is None else last.stateful
        if stateful:
            recorded = last is not None and last.stateful is not None
            why = (
                "The ledger records that the query kept state in Spark's checkpoint "
                "(aggregation, deduplication, join, limit or a state API)"
                if recorded
                else "The ledger was written by an older sparkonce that did not record whether "
                "the query keeps state, so it is treated as stateful"
            )
            # stateful=False is only for ledgers that do not say: a recorded stateful
            # query is refused stateful=False by its plan (see query.check_query).
            flag = (
                ""
                if recorded
                else " If the transform keeps no state (no aggregation, deduplication, join, "
                "limit or state API), pass stateful=False to the Pipeline."
            )
            raise CheckpointLostError(
                f"pipeline {pipeline.name!r}: the checkpoint {checkpoint.path} is empty, but the "
                f"ledger in {sink.describe()} already covers offsets up to "
                f"{BatchRanges.at(ledger_end)}. {why}, and that state lived in the lost "
                "checkpoint: resuming from the ledger would silently restart every aggregate. "
                "Nothing was changed (no epoch was taken). "
                "Operator action: restore the checkpoint directory; or, to recompute from "
                f"scratch, delete {_outputs_named(pipeline)} and the pipeline's progress with: "
                f"sparkonce reset --pipeline {pipeline.name} --sink <SINK_URL> --output-rows "
                f"(runbook: {RUNBOOKS}/checkpoint-lost.md).{flag}"
            )
        # A source that cannot start exactly at the ledger's end refuses here, before the epoch.
        pipeline.source.check_ledger_start(ledger_end)
        return "ledger"
    _check_identity(pipeline, checkpoint, last)
    if last_done is not None:
        raw = checkpoint.source_offset(last_done, pipeline.source)
        if raw is not None:
            done = pipeline.source.batch_ranges(None, raw).ends()
            ahead = {tp: o for tp, o in done.items() if o > ledger_end.get(tp, 0)}
            if ahead:
                raise CheckpointError(
                    f"pipeline {pipeline.name!r}: Spark's checkpoint {checkpoint.path} has "
                    f"finished batches up to {BatchRanges.at(done)}, beyond the ledger in "
                    f"{sink.describe()} ({BatchRanges.at(ledger_end) if ledger_end else 'empty'}). "
                    "Those batches never reached this sink, so resuming would lose them. "
                    "Nothing was changed (no epoch was taken). "
                    "Operator action: use the checkpoint that belongs to this pipeline and "
                    "sink. Never delete a checkpoint a run is using (the owner's holder: "
                    f"sparkonce status --pipeline {pipeline.name} --sink <SINK_URL>); only a "
                    "stateless pipeline's checkpoint that no run uses may be deleted, to "
                    f"resume from the ledger (runbook: {RUNBOOKS}/checkpoint-ahead.md)."
                )
    return "checkpoint"


def _outputs_named(pipeline: PipelineSpec) -> str:
    outputs = pipeline.output_set
    if outputs is None:
        return f"the output ({pipeline.sink.describe()})"
    named = ", ".join(f"{n}: {s.describe()}" for n, s in outputs.outputs.items())
    return f"the rows of every output ({named})"


def _check_identity(
    pipeline: PipelineSpec, checkpoint: Checkpoint, last: LedgerEntry | None
) -> None:
    """Refuse another query's checkpoint: Spark's query id (the checkpoint's ``metadata``,
    recorded in every ledger entry as ``checkpoint_id``) must be one this pipeline's ledger
    knows, whatever the positions. Passes a checkpoint started from the ledger that has
    committed no batch yet, and ledgers written before the id was recorded."""
    if last is None or last.checkpoint_id is None:
        return
    query_id = checkpoint.query_id()
    if query_id is None or query_id == last.checkpoint_id:
        return
    last_done = checkpoint.last_committed_batch()
    if last_done is None:
        return  # started from the ledger, nothing committed through it yet
    ledger = pipeline.sink.ledger(pipeline.name)
    if any(e.checkpoint_id == query_id for e in ledger):
        return  # an older checkpoint of this pipeline, restored: its batches replay
    raise CheckpointError(
        f"pipeline {pipeline.name!r}: the checkpoint {checkpoint.path} belongs to another "
        f"query (Spark query id {query_id}, with batches finished up to {last_done}), and no "
        f"entry of this pipeline's ledger in {pipeline.sink.describe()} was written through it "
        f"(its last entry came from query {last.checkpoint_id}). It is probably another "
        "pipeline's checkpoint; running on it would advance that pipeline's checkpoint past "
        "its own ledger. Nothing was changed (no epoch was taken). Operator action: pass this "
        "pipeline's own checkpoint (--checkpoint), or a new empty directory for a stateless "
        "pipeline (it then resumes from the ledger)."
    )


def run_pipeline(
    pipeline: PipelineSpec,
    spark: SparkSession,
    *,
    timeout: float | None = None,
    on_batch: Callable[[BatchReport], None] | None = None,
    stop: threading.Event | None = None,
    faults: FaultPlan | None = None,
    observer: RunObserver | None = None,
) -> RunReport:
    """Run ``pipeline`` on ``spark``; see the module docstring for the order of steps.

    ``stop``: setting this event (from a signal handler, say) stops the run cleanly: no
    new commit starts, the one in flight finishes, the query stops, and
    :class:`~sparkonce.errors.RunStopped` is raised. ``stop.signal_number`` (an int
    attribute, if the setter adds one) names the signal in the message.

    ``faults``: the fault plan of this run (``sparkonce run`` parses it from the
    environment once); it goes to the sink, whose commit marks the crash points, and
    records a fencing. None injects nothing.

    ``observer``: hooks called as the run goes (:class:`~sparkonce.observe.RunObserver`:
    start, each batch, Spark's progress, lag, fencing, end), for metrics or a progress
    display. Whatever it raises is logged and ignored. None watches nothing.
    """
    from sparkonce.spark.session import is_connect, quiet_query_errors

    plan = NO_FAULTS if faults is None else faults
    if is_connect(spark):
        from sparkonce.pipeline.connect import refuse_on_connect

        refuse_on_connect(pipeline, faults=plan)
    watch = None if observer is None else RunWatch(observer, pipeline.name, pipeline.source)
    report: RunReport | None = None
    try:
        # The error the query ends with is raised below, as one sparkonce error: Spark's
        # console log need not print its Java stack first (a session of the user's own).
        with quiet_query_errors(spark):
            report = _run(
                pipeline,
                spark,
                timeout=timeout,
                on_batch=on_batch,
                stop=stop,
                faults=plan,
                watch=watch,
            )
        return report
    except FencedError as exc:
        plan.fenced(
            getattr(exc, "pipeline", pipeline.name),
            getattr(exc, "epoch", None),  # a FencedError rebuilt from a task's text has none
            getattr(exc, "owner_epoch", None),
        )
        if watch is not None:
            watch.fenced(exc)
        raise
    finally:
        if watch is not None:
            watch.end(report)


def _run(
    pipeline: PipelineSpec,
    spark: SparkSession,
    *,
    timeout: float | None,
    on_batch: Callable[[BatchReport], None] | None,
    stop: threading.Event | None,
    faults: FaultPlan,
    watch: RunWatch | None,
) -> RunReport:
    from pyspark.errors import StreamingQueryException

    from sparkonce.config import Trigger
    from sparkonce.spark.session import is_connect

    sink = pipeline.sink
    if sink.guarantee != "effectively-once":
        log.warning(
            "pipeline %s: sink %s is only %s; replays after a failure may write twice",
            pipeline.name,
            sink.describe(),
            sink.guarantee,
        )
    faults.phase("run-started")
    sink.use_faults(faults)
    sink.open()
    try:
        # 1. Checks, before any epoch is taken: reading the ledger changes nothing.
        # The checkpoint is read before the ledger: a live run records a batch in the
        # ledger first, in Spark's checkpoint after, so the two are read consistently.
        checkpoint = Checkpoint.open(pipeline.checkpoint_location, spark)
        checkpoint.check_usable()
        seen_done = checkpoint.last_committed_batch()
        seen_end = sink.end_offsets(pipeline.name)
        out = output_query(pipeline, spark, seen_end)
        check_query(pipeline, spark, out)
        sink.validate(out.schema, pipeline.output_mode)
        resumed = _resume_point(
            pipeline, checkpoint, seen_end, sink.last_entry(pipeline.name), seen_done
        )

        # 2-3. Take over (write before read), then read the resume point again.
        owner = sink.acquire(pipeline.name, pipeline.source.uri())
        last_done = checkpoint.last_committed_batch()
        ledger_end = sink.end_offsets(pipeline.name)
        if ledger_end != seen_end or last_done != seen_done:  # an older run went on meanwhile
            out = output_query(pipeline, spark, ledger_end)
            resumed = _resume_point(
                pipeline, checkpoint, ledger_end, sink.last_entry(pipeline.name), last_done
            )

        stray = checkpoint.clear_unplanned_debris()
        if stray:
            log.warning(
                "pipeline %s: removed %s from the offset log of %s, which holds no batch: "
                "left by a driver killed while it wrote the first batch's offsets",
                pipeline.name,
                ", ".join(stray),
                checkpoint.path,
            )
        again = checkpoint.reopen_for_watermark()
        if again is not None:
            log.info(
                "pipeline %s: batch %d moved the watermark and Spark planned no batch after "
                "it; it runs again (skipped by the ledger, recomputed for its state) so that "
                "Spark plans the no-data batch that releases the expired state",
                pipeline.name,
                again,
            )

        report = RunReport(pipeline.name, owner.epoch, resumed)
        handler = _BatchHandler(pipeline, owner.epoch, checkpoint, report, on_batch, watch, faults)
        connect = is_connect(spark)
        # On Connect the observers get Spark's progress from these notes, not a listener.
        polled = watch.polled if watch is not None and connect else None
        notes = _ProgressNotes(pipeline, report, polled)
        trigger = Trigger.parse(pipeline.trigger)
        batch_function: Callable[[DataFrame, int], None] = handler
        feed = None
        if connect:
            from sparkonce.files import ArrowSettings
            from sparkonce.pipeline.connect import LedgerFeed

            # The batches commit beside the server: this process learns of each from the
            # ledger, and passes it on to the observers and on_batch.
            hooks = [h for h in (None if watch is None else watch.batch, on_batch) if h]
            feed = LedgerFeed(pipeline, report, hooks)
            # The function is pickled and runs beside the Spark server: plain values only.
            from sparkonce.pipeline.connect import ConnectBatch

            batch_function = ConnectBatch(
                pipeline.name,
                owner.epoch,
                sink,
                pipeline.source,
                checkpoint.path,
                pipeline.stateful,
                faults,
                ArrowSettings.of(spark) if checkpoint.remote else None,
            )
        writer = (
            out.writeStream.foreachBatch(batch_function)
            .option("checkpointLocation", checkpoint.spark_location)
            .outputMode(pipeline.output_mode)
        )
        if trigger.kind == "availableNow":
            writer = writer.trigger(availableNow=True)
        else:
            writer = writer.trigger(processingTime=str(trigger.interval))
        log.info(
            "pipeline %s: epoch %d, %s -> %s, resuming from %s",
            pipeline.name,
            owner.epoch,
            pipeline.source.describe(),
            sink.describe(),
            resumed,
        )
        if watch is not None:
            watch.planned(out)  # the scans of the source, which Spark's progress adds up
            run_start = RunStart(pipeline.name, owner.epoch, resumed, dict(ledger_end))
            watch.start(spark, run_start, listen=not connect)
        deadline = None if timeout is None else time.monotonic() + timeout
        for attempt in range(1, QUERY_START_ATTEMPTS + 1):
            try:
                query = writer.start()
            except Exception as exc:
                # On Spark Connect the server starts the foreachBatch function's Python worker
                # before the query, within the same fixed 10 s; a miss fails the start itself,
                # before any batch ran, so starting again is safe.
                if worker_start_timed_out(str(exc)) and attempt < QUERY_START_ATTEMPTS:
                    log.warning(
                        "pipeline %s: the Spark server's Python worker did not start in time "
                        "(%s); starting the query again (attempt %d of %d)",
                        pipeline.name,
                        short_error(exc),
                        attempt + 1,
                        QUERY_START_ATTEMPTS,
                    )
                    # A loaded machine is what makes a worker late: give it a moment.
                    time.sleep(2**attempt)
                    continue
                raise
            faults.phase("query-started")
            if watch is not None:
                watch.query_started(str(query.id))
            try:
                # Poll, so that a stop request (a signal handler setting ``stop``) is seen
                # within a second, and handled here, in the main thread, between batches.
                while not query.awaitTermination(1):
                    notes(query)
                    if feed is not None and feed.hooks:
                        _poll(feed, query)
                    if stop is not None and stop.is_set():
                        why = _stopped(pipeline, handler, stop)
                        handler.stop_between_batches(query, why)
                        raise why
                    if deadline is not None and time.monotonic() > deadline:
                        query.stop()
                        break
                break
            except StreamingQueryException as exc:
                if handler.stopping is not None:
                    raise handler.stopping from None
                if stop is not None and stop.is_set():
                    # The signal reached Spark's JVM too (a whole process group or cgroup
                    # was signalled), and it stopped the query first.
                    raise _stopped(pipeline, handler, stop) from None
                if isinstance(handler.error, SparkOnceError):
                    raise handler.error from None
                if worker_start_timed_out(str(exc)) and attempt < QUERY_START_ATTEMPTS:
                    # Spark gives the source's Python planner process a fixed 10 s to
                    # connect back; a busy machine can miss that. A restart resumes from the
                    # checkpoint, as after a crash, so it is always safe.
                    log.warning(
                        "pipeline %s: Spark's Python worker did not start in time (%s); "
                        "starting the query again (attempt %d of %d)",
                        pipeline.name,
                        short_error(exc),
                        attempt + 1,
                        QUERY_START_ATTEMPTS,
                    )
                    continue
                raise _failure(pipeline, checkpoint, handler, exc) from exc
            except KeyboardInterrupt:
                handler.stop_between_batches(query, _stopped(pipeline, handler, None))
                raise
            except RunStopped:
                raise
            except Exception as exc:
                if stop is not None and stop.is_set():  # the JVM went away on the signal
                    raise _stopped(pipeline, handler, stop) from None
                if connect:
                    from sparkonce.pipeline.connect import server_gone

                    server_gone(pipeline, exc)  # raises SparkServerUnavailableError if so
                raise
        notes(query, everything=True)
        if isinstance(handler.error, SparkOnceError):
            raise handler.error
        if feed is not None:
            feed.finish(query, checkpoint.query_id())
        report.end_offsets = sink.end_offsets(pipeline.name)
        return report
    finally:
        sink.close()


# How long a stop request waits for a commit in flight to finish before stopping anyway.
STOP_WAIT_S = 60.0
# A query whose Python worker missed Spark's start-up deadline is started again, this often.
QUERY_START_ATTEMPTS = 5
_WORKER_START_TIMEOUT = (
    "Python worker failed to connect back",  # a task's or the source planner's worker
    "Timed out while waiting for the Python worker to connect back",  # foreachBatch's
)


def worker_start_timed_out(text: str) -> bool:
    """Whether Spark's error ``text`` says a Python worker missed Spark's fixed deadline to
    connect back after its start (a busy machine)."""
    return any(m in text for m in _WORKER_START_TIMEOUT)


def _poll(feed: LedgerFeed, query: StreamingQuery) -> None:
    """Report the batches a Connect query committed since the last poll; an ``on_batch``
    that raises stops the query (it runs in the server, which would otherwise go on) and
    fails the run, as it fails the batch on a classic session."""
    try:
        feed.poll()
    except BaseException:
        with contextlib.suppress(Exception):
            query.stop()
        raise


class _ProgressNotes:
    """Reads Spark's progress of the batches reported since the last call: what the dedup
    steps did goes to the log and ``report.dedup``. Monitoring only: a failure to read it
    is logged at debug level and changes nothing."""

    def __init__(
        self,
        pipeline: PipelineSpec,
        report: RunReport,
        on_progress: Callable[[Any], None] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.report = report
        self.on_progress = on_progress
        self.seen = -1  # the last Spark batch id whose progress was read

    def __call__(self, query: StreamingQuery, *, everything: bool = False) -> None:
        try:
            last = query.lastProgress
            if last is None or (not everything and int(last["batchId"]) <= self.seen):
                return
            if int(last["batchId"]) == self.seen + 1:
                entries = [last]
            else:  # several batches since the last call (or the query's end): up to 100
                entries = [p for p in query.recentProgress if int(p["batchId"]) > self.seen]
            for progress in entries:
                self.seen = max(self.seen, int(progress["batchId"]))
                self._note(progress)
                if self.on_progress is not None:
                    self.on_progress(progress)
        except Exception as exc:  # monitoring only; the JVM may be going away on a signal
            log.debug(
                "pipeline %s: could not read the query's progress: %s", self.pipeline.name, exc
            )

    def _note(self, progress: Mapping[str, object]) -> None:
        counts = dedup_counts(progress)
        if counts is None:
            return
        self.report.dedup[counts.spark_batch_id] = counts
        if counts.null_ids or counts.duplicates_removed or counts.late_dropped:
            log.info(
                "pipeline %s batch %d: dedup removed %d duplicates, dropped %d late records, "
                "passed %d records without an id; %d ids in the state",
                self.pipeline.name,
                counts.spark_batch_id,
                counts.duplicates_removed,
                counts.late_dropped,
                counts.null_ids,
                counts.state_ids,
            )


def _stopped(
    pipeline: PipelineSpec, handler: _BatchHandler, stop: threading.Event | None
) -> RunStopped:
    signum = getattr(stop, "signal_number", None) if stop is not None else None
    import signal as _signal

    by = _signal.Signals(signum).name if signum else "request"
    last = handler.report.batches[-1] if handler.report.batches else None
    after = (
        f"after batch {last.spark_batch_id} [{last.ranges}]"
        if last is not None
        else "before its first batch committed"
    )
    return RunStopped(
        f"pipeline {pipeline.name!r}: stopped on {by} {after}; no commit was in flight. "
        "Committed batches are safe in the sink; run again to resume.",
        signum,
    )


def _failure(
    pipeline: PipelineSpec, checkpoint: Checkpoint, handler: _BatchHandler, exc: BaseException
) -> SparkOnceError:
    """One error whose message names the cause, the batch and its offset ranges."""
    text = "\n".join(str(e) for e in (handler.error, exc) if e is not None)
    batch = _failed_batch(pipeline, checkpoint, handler)
    own = pipeline.source.read_failure(text, handler.current[1] if handler.current else None)
    if own is not None:  # the source named it (a Delta table's vacuumed files, say)
        message = str(own)
        return (
            rebuild(Cause(message, type(own)), where_suffix(message, pipeline.name, batch)) or own
        )
    cause = find_cause(text)
    rebuilt = rebuild(cause, where_suffix(cause.message, pipeline.name, batch))
    if rebuilt is not None:
        return rebuilt
    fenced = _fenced(pipeline, handler)
    if fenced is not None:
        # A newer run took the pipeline over (a paused run woke up, say): Spark then often
        # fails on the checkpoint both queries write (CONCURRENT_STREAM_LOG_UPDATE) before
        # this run's next commit would have been fenced. It is fencing all the same.
        log.info("pipeline %s: the query failed after the run was fenced: %s", pipeline.name, text)
        return fenced
    return PipelineError(
        f"pipeline {pipeline.name!r}: {batch} failed: {cause.message}. The batch's commit did "
        "not complete; committed batches are safe in the sink, and a new run starts again "
        "from this batch once the cause is fixed."
    )


def _fenced(pipeline: PipelineSpec, handler: _BatchHandler) -> FencedError | None:
    """A FencedError when the sink's owner epoch is newer than this run's, else None."""
    try:
        owner = pipeline.sink.owner(pipeline.name)
    except Exception as exc:  # the store may be down: the failure is reported as it is
        log.debug("pipeline %s: could not read the owner: %s", pipeline.name, exc)
        return None
    if owner is None or owner.epoch <= handler.epoch:
        return None
    return FencedError(pipeline.name, handler.epoch, owner.epoch, holder=owner.holder)


def _failed_batch(pipeline: PipelineSpec, checkpoint: Checkpoint, handler: _BatchHandler) -> str:
    if handler.current is not None:
        batch_id, ranges = handler.current
        return f"batch {batch_id} [{ranges}]"
    try:
        planned = checkpoint.batch_ids("offsets")
        done = checkpoint.last_committed_batch()
        if planned and planned[-1] != done:
            bid = planned[-1]
            raw = checkpoint.source_offset(bid, pipeline.source)
            prev = checkpoint.previous_offset(bid, pipeline.source)
            if raw is not None:
                return f"batch {bid} [{pipeline.source.batch_ranges(prev, raw)}]"
    except SparkOnceError:
        pass
    return "the query, before its next batch was planned,"
