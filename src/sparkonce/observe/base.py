"""The hooks a run calls as it goes (:class:`RunObserver`), and the machinery that calls
them for one run (:class:`RunWatch`): the lag thread and Spark's query listener.

Watching a run never changes it: whatever an observer raises is logged (once per hook)
and ignored, the source's end offsets are read on a thread of their own and never inside
a commit, and a failure to read them is logged once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkonce.jvm import analyzed_plan
from sparkonce.offsets import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.listener import StreamingQueryListener, StreamingQueryProgress

    from sparkonce.errors import FencedError
    from sparkonce.observe.report import BatchReport, RunReport
    from sparkonce.sources.base import Source

log = logging.getLogger("sparkonce.observe")

# How often the lag thread reads the source's end offsets. Reading them opens the
# embedded log's database or asks the Kafka brokers, so not more often than this.
LAG_INTERVAL_S = 3.0


@dataclass(frozen=True)
class RunStart:
    """What a run knows once it has taken its epoch, before its query starts."""

    pipeline: str
    epoch: int  # the owner epoch this run took
    resumed_from: str  # "start", "checkpoint" or "ledger"
    end_offsets: Mapping[TopicPartition, int]  # the ledger's end: the next offset to process


class RunObserver:
    """Hooks a run calls as it goes; each does nothing unless overridden.

    Where and when each hook runs (all on the driver):

    - :meth:`on_start`: on the thread that called ``run``, once the run has taken its epoch
      and read the ledger's resume point, before the query starts.
    - :meth:`on_batch`: in Spark's ``foreachBatch`` thread, right after a batch committed
      or was skipped as a replay, and before the next batch's commit can start: keep it
      short.
    - :meth:`on_progress`: on the thread that delivers Spark's ``StreamingQueryListener``
      events, after each micro-batch of this run's query (Spark's progress: input rows,
      rows per second, durations).
    - :meth:`on_lag`: on the run's lag thread, every few seconds: per partition, the
      source's end offset minus the committed end offset (never below 0). Never inside a
      commit.
    - :meth:`on_fenced`: on the thread that called ``run``, when a newer run fenced this
      one (a :class:`~sparkonce.errors.FencedError` at start or at a commit).
    - :meth:`on_end`: on the thread that called ``run``, once, however the run ends;
      ``report`` is None when it ended with an error.

    Whatever a hook raises is logged once per observer and hook and otherwise ignored (in
    :class:`Observers`, the others are still called): an observer never stops or changes
    a run.
    """

    def on_start(self, start: RunStart) -> None:
        """The run took its epoch; its query starts next."""

    def on_batch(self, report: BatchReport) -> None:
        """A batch committed (``report.result.skipped`` False) or was skipped as a replay."""

    def on_progress(self, progress: StreamingQueryProgress) -> None:
        """Spark reported the progress of one micro-batch of this run's query."""

    def on_lag(self, lag: Mapping[TopicPartition, int]) -> None:
        """Records behind, per partition of the source."""

    def on_fenced(self, error: FencedError) -> None:
        """A newer run took the pipeline over; the run ends with ``error``."""

    def on_end(self, report: RunReport | None) -> None:
        """The run ended (``report`` None: it ended with an error)."""


class Observers(RunObserver):
    """Several observers as one: each hook calls each of them, in order."""

    def __init__(self, *observers: RunObserver) -> None:
        self.observers = observers

    def on_start(self, start: RunStart) -> None:
        for o in self.observers:
            o.on_start(start)

    def on_batch(self, report: BatchReport) -> None:
        for o in self.observers:
            o.on_batch(report)

    def on_progress(self, progress: StreamingQueryProgress) -> None:
        for o in self.observers:
            o.on_progress(progress)

    def on_lag(self, lag: Mapping[TopicPartition, int]) -> None:
        for o in self.observers:
            o.on_lag(lag)

    def on_fenced(self, error: FencedError) -> None:
        for o in self.observers:
            o.on_fenced(error)

    def on_end(self, report: RunReport | None) -> None:
        for o in self.observers:
            o.on_end(report)


class RunWatch:
    """What the runner drives for one run that has an observer.

    It calls the observer's hooks (guarded: see :class:`RunObserver`), keeps the committed
    end offsets, runs the lag thread from :meth:`start` to :meth:`end`, and registers a
    Spark ``StreamingQueryListener`` for the run's query meanwhile.
    """

    def __init__(
        self,
        observer: RunObserver,
        pipeline: str,
        source: Source,
        *,
        lag_interval: float = LAG_INTERVAL_S,
    ) -> None:
        self.observer = observer
        # Each observer guarded on its own: one that fails does not starve the others.
        self._each = observer.observers if isinstance(observer, Observers) else (observer,)
        self.pipeline = pipeline
        self.source = source
        self.lag_interval = lag_interval
        self.query_id: str | None = None
        self._committed: dict[TopicPartition, int] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()
        self._done = threading.Event()
        self._lag_thread: threading.Thread | None = None
        self._spark: SparkSession | None = None
        self._listener: StreamingQueryListener | None = None
        self._ended = False
        self.source_reads = 1  # how often the query's plan reads the source (see planned)

    # -- the runner's calls -----------------------------------------------------------------

    def start(self, spark: SparkSession, start: RunStart, *, listen: bool = True) -> None:
        """On the thread that runs the pipeline, after the epoch, before the query.

        ``listen`` False: no ``StreamingQueryListener``; the runner passes each progress
        on itself (:meth:`polled`). On a Spark Connect session PySpark 4.2's client-side
        listener thread dies at the first observed-metrics message of a query that runs
        Python code (``UNKNOWN_RESPONSE``, seen here), so the runner polls there."""
        with self._lock:
            self._committed = dict(start.end_offsets)
        self._call("on_start", start)
        self._lag_thread = threading.Thread(
            target=self._lag_loop, name=f"sparkonce-lag-{self.pipeline}", daemon=True
        )
        self._lag_thread.start()
        if not listen:
            return
        try:
            self._listener = _listener(self)
            spark.streams.addListener(self._listener)
            self._spark = spark
        except Exception as exc:  # monitoring only
            self._warn_once("listener", "could not listen to Spark's query progress: %s", exc)
            self._listener = None

    def planned(self, out: DataFrame) -> None:
        """The DataFrame the query runs, before it starts: how often its plan reads the
        source. Spark's progress sums the rows of every scan of it, so a query that reads
        it twice (several outputs, each a branch over the same input; a self-join) reports
        each record twice; the progress the observers get counts each record once."""
        self.source_reads = source_reads(out)

    def query_started(self, query_id: str) -> None:
        """The run's query started (again); the listener passes on only its progress."""
        self.query_id = query_id

    def batch(self, report: BatchReport) -> None:
        """In the ``foreachBatch`` thread, after a batch's commit or skip."""
        with self._lock:
            for tp, end in report.ranges.ends().items():
                if end > self._committed.get(tp, 0):
                    self._committed[tp] = end
        self._call("on_batch", report)

    def fenced(self, error: FencedError) -> None:
        self._call("on_fenced", error)

    def end(self, report: RunReport | None) -> None:
        """Once, however the run ends: the lag thread and the listener stop. A run that
        ended well has its lag read once more (its query has stopped: no commit runs)."""
        if self._ended:
            return
        self._ended = True
        self._done.set()
        if self._lag_thread is not None:
            self._lag_thread.join(timeout=self.lag_interval + 30.0)
            if report is not None:
                lag = self.read_lag()
                if lag is not None:
                    self._call("on_lag", lag)
        if self._spark is not None and self._listener is not None:
            try:
                self._spark.streams.removeListener(self._listener)
            except Exception as exc:  # the JVM may be gone (a signal)
                log.debug("pipeline %s: could not remove the listener: %s", self.pipeline, exc)
        self._call("on_end", report)

    # -- the lag thread and the listener ------------------------------------------------------

    def committed(self) -> dict[TopicPartition, int]:
        with self._lock:
            return dict(self._committed)

    def read_lag(self) -> dict[TopicPartition, int] | None:
        """Records behind per partition, or None if the source's end could not be read
        (warned about once)."""
        try:
            latest = self.source.latest_offsets()
        except Exception as exc:
            self._warn_once(
                "lag",
                "could not read the source's end offsets for lag (%s); the run goes on, and "
                "lag is reported again once they can be read",
                exc,
            )
            return None
        committed = self.committed()
        return {tp: max(0, end - committed.get(tp, 0)) for tp, end in sorted(latest.items())}

    def _lag_loop(self) -> None:
        while True:
            lag = self.read_lag()
            if lag is not None:
                self._call("on_lag", lag)
            if self._done.wait(self.lag_interval):
                return

    def polled(self, progress: StreamingQueryProgress) -> None:
        """A progress of the run's query that the runner read from the query itself."""
        self._progress(progress)

    def _progress(self, progress: StreamingQueryProgress) -> None:
        if self.query_id is None or str(progress.id) != self.query_id:
            return  # another query of the session, or one of ours not started yet
        if self.source_reads > 1:
            progress = per_record(progress, self.source_reads)
        self._call("on_progress", progress)

    # -- guarding ------------------------------------------------------------------------------

    def _call(self, hook: str, arg: object) -> None:
        """Call ``hook`` of each observer; one that raises is logged and skipped."""
        for observer in self._each:
            try:
                getattr(observer, hook)(arg)
            except Exception as exc:
                name = type(observer).__name__
                self._warn_once(
                    f"{name}.{hook}", f"observer {name} failed in {hook} (ignored): %s", exc
                )

    def _warn_once(self, key: str, message: str, exc: BaseException) -> None:
        if key in self._warned:
            log.debug("pipeline %s: " + message, self.pipeline, exc)
            return
        self._warned.add(key)
        log.warning("pipeline %s: " + message, self.pipeline, exc)


def source_reads(out: DataFrame) -> int:
    """How many scans of a streaming source the plan of ``out`` holds (at least 1; 1 when
    the plan cannot be read). A pipeline reads one source; the transform's branches over
    it (several outputs, a self-join) each scan it again."""
    try:
        plan = analyzed_plan(out)
        if plan is None:  # Spark Connect: no JVM plan here
            return 1
        leaves = plan.collectLeaves()
        names = [leaves.apply(i).getClass().getSimpleName() for i in range(leaves.size())]
    except Exception as exc:  # monitoring only
        log.debug("could not read the query's plan: %s", exc)
        return 1
    return max(1, sum(1 for n in names if str(n).startswith("StreamingRelation")))


def per_record(progress: StreamingQueryProgress, reads: int) -> StreamingQueryProgress:
    """``progress`` with its input counts and rates divided by ``reads``, the scans of the
    source in the query's plan (Spark adds up the rows of each)."""
    from pyspark.sql.streaming.listener import SourceProgress, StreamingQueryProgress

    def once(value: Any) -> Any:
        if value is None:
            return None
        return value // reads if isinstance(value, int) else value / reads

    keys = ("numInputRows", "inputRowsPerSecond", "processedRowsPerSecond")
    sources = [
        SourceProgress(**{**dict(s), **{k: once(s[k]) for k in keys if k in s}})
        for s in progress.sources
    ]
    fields = {**dict(progress), **{k: once(progress[k]) for k in keys}, "sources": sources}
    return StreamingQueryProgress(**fields)


def _listener(watch: RunWatch) -> StreamingQueryListener:
    """A Spark listener that passes the progress of ``watch``'s query on to it."""
    from pyspark.sql.streaming.listener import StreamingQueryListener

    class _ProgressListener(StreamingQueryListener):
        def onQueryStarted(self, event: object) -> None:
            pass

        def onQueryProgress(self, event: object) -> None:
            watch._progress(event.progress)  # type: ignore[attr-defined]

        def onQueryIdle(self, event: object) -> None:
            pass

        def onQueryTerminated(self, event: object) -> None:
            pass

    return _ProgressListener()
