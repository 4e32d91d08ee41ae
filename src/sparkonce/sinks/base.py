"""The contract every sparkonce sink follows.

A sink owns the ledger of the pipelines that write to it (the owner epoch and
one entry per committed batch, inside the sink's own store), and commits each
micro-batch following :mod:`sparkonce.protocol`. The pipeline runner calls the
hooks below in this order::

    use_faults(plan)             driver, once per run, before open(): the run's fault plan
    open()                       driver, once per run
    validate(schema)             driver, once per run, *before* acquire: every check that
                                 can fail on configuration runs before a new epoch is taken
    acquire(pipeline)            driver, once per run: epoch + 1, fences older runs
    end_offsets(pipeline)        driver, once per run, *after* acquire (the resume point)
    commit(ctx, df)              driver, once per micro-batch, inside foreachBatch
    close()                      driver, when the run ends

``commit`` may be called again for a batch it already committed (a crash
after step 5 and before Spark's commit log); it must then do nothing and
return ``CommitResult(skipped=True, ...)``. ``owner``, ``ledger`` and
``last_entry`` read the sink's metadata (status, and the runner's checks).

The contract holds only what a run needs. Reading every row of the output,
wiping a store and moving a sink to another store are for ``sparkonce verify``,
``sparkonce run --sink`` and the tests: see :mod:`sparkonce.sinks.inspect`.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any, ClassVar, Self

from sparkonce.commit.committer import Committer
from sparkonce.config import Guarantee, OutputMode
from sparkonce.errors import ConfigError
from sparkonce.faults import NO_FAULTS, FaultPlan
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, Owner
from sparkonce.offsets import TopicPartition

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType

    from sparkonce.commit.base import Stager
    from sparkonce.ledger.base import LedgerStore

log = logging.getLogger(__name__)


class Sink(ABC):
    """Base class of sinks. Subclasses state their guarantee in their docstring."""

    guarantee: ClassVar[Guarantee]
    # Whether SPARKONCE_DROP_CONNECTION_AT makes this sink lose its store connection
    # (the verifier's db-drop fault).
    supports_connection_drop: ClassVar[bool] = False
    # The run's fault plan (crash points of the commit); the no-op plan until use_faults().
    faults: FaultPlan = NO_FAULTS
    _built_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        sink = super().__new__(cls)
        sink._built_with = (args, kwargs)
        return sink

    def __reduce__(self) -> tuple[Any, ...]:
        """A sink pickles as the call that built it: the copy is a new, unopened sink of the
        same class and arguments, with no connection, lock, producer or session of the
        original. That is what a Spark Connect batch function carries to the Spark server's
        Python worker, where it opens its own store (:mod:`sparkonce.pipeline.connect`).
        The arguments hold the store's credentials, as the sink does; like the sink, they
        are never logged."""
        args, kwargs = self._built_with
        return (_rebuild, (type(self), args, kwargs))

    def use_faults(self, faults: FaultPlan) -> None:
        """Take the run's fault plan, for the commit's crash, pause and connection-drop
        points. The runner calls this before :meth:`open`; without it nothing is injected."""
        self.faults = faults

    @abstractmethod
    def open(self) -> None:
        """Connect and create the metadata tables if missing. Called on the driver."""

    @abstractmethod
    def close(self) -> None:
        """Release connections. Safe to call twice."""

    @abstractmethod
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take a new, strictly higher epoch for ``pipeline``. Older runs are fenced.

        ``source`` is the source's URI, kept beside the epoch for status and lag.
        """

    def after_acquire(self, pipeline: str, owner: Owner) -> None:  # noqa: B027 - optional
        """Another sink of the same store took ``owner``'s epoch for both (several outputs):
        do what :meth:`acquire` does after taking it (collect older runs' leftovers)."""

    @abstractmethod
    def end_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        """The ledger's resume point for ``pipeline`` (empty when nothing is committed)."""

    @abstractmethod
    def validate(self, schema: StructType, output_mode: OutputMode = "append") -> None:
        """Check the output schema against the sink's table before the query starts."""

    @abstractmethod
    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one micro-batch in one transaction of the store (steps 1-5)."""

    @abstractmethod
    def owner(self, pipeline: str) -> Owner | None:
        """The current owner row, or None if no run ever started."""

    @abstractmethod
    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        """Every ledger entry of ``pipeline``, oldest first."""

    def pipelines(self) -> list[str]:
        """Every pipeline that has taken an epoch in this sink's store (driver, outside any
        commit; for ``sparkonce ui``). The SQL, Kafka and Delta sinks list them."""
        raise NotImplementedError(f"{type(self).__name__} cannot list its store's pipelines")

    def last_entry(self, pipeline: str) -> LedgerEntry | None:
        """The newest ledger entry of ``pipeline`` (None when nothing is committed)."""
        entries = self.ledger(pipeline)
        return entries[-1] if entries else None

    # -- one of several outputs (sparkonce.outputs.output_set) ---------------------------
    def store_key(self) -> Hashable | None:
        """The identity of the store that holds this sink's ledger, or None for its own.

        Outputs whose sinks give equal keys share one ledger and commit in one
        transaction of that store (one ledger row per batch for all of them).
        """
        return None

    def committer_parts(self) -> tuple[LedgerStore, Stager]:
        """The ledger store and stager the committer runs this sink with (driver, after
        :meth:`open`). A sink that is not built on the committer cannot be one of several
        outputs."""
        raise ConfigError(
            f"{type(self).__name__} does not commit through sparkonce's committer, so it "
            "cannot be one of a pipeline's outputs; use it as the pipeline's only sink"
        )

    def use_stable_task_numbers(self, stable: bool) -> None:  # noqa: B027 - optional
        """Say whether the batches' Spark partition numbers name the same input on a replay
        (``stable``: the source is one of sparkonce's own, which plan their partitions in
        order). Called where a batch runs with no JVM plan to walk (a Spark Connect
        session's batch function); only a sink that keys tasks by their input needs it
        (:class:`~sparkonce.sinks.kafka.KafkaSink`, which refuses a batch it cannot key)."""

    def spark_conf(self) -> dict[str, str]:
        """Settings the SparkSession needs for this sink, applied when it is created
        (:func:`sparkonce.build_session`); most sinks need none."""
        return {}

    @abstractmethod
    def describe(self) -> str:
        """A one-line description, safe for logs (no secrets)."""

    def __enter__(self) -> Sink:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rebuild(cls: type[Sink], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Sink:
    return cls(*args, **kwargs)


class TransactionalSink(Sink):
    """A sink composed of a ledger store and a stager, which the committer runs together.

    ``store`` (:class:`~sparkonce.ledger.base.LedgerStore`) keeps the owner epochs and the
    ledger inside the sink's store; ``stager`` (:class:`~sparkonce.commit.Stager`) gets each
    batch's rows ready and makes them visible. This class wires them once for every such
    sink: :meth:`open` builds the :class:`~sparkonce.commit.Committer`, :meth:`use_faults`
    hands it the run's fault plan, :meth:`commit` runs it, and the ownership and progress
    reads go to the store. A concrete sink builds its store and stager in its constructor
    and adds what is its own: how it opens and checks its store, its schema check and its
    description.
    """

    store: LedgerStore
    stager: Stager
    _committer: Committer | None = None

    # -- what a concrete sink adds ------------------------------------------------------
    def open_store(self) -> None:
        """Connect to the store (and create what it needs); called by :meth:`open`."""

    def close_store(self) -> None:
        """Release the store's connections; called by :meth:`close`."""

    def check_acquire(self, pipeline: str) -> None:
        """Refuse to take an epoch for ``pipeline`` (ConfigError), before the store is read."""

    # -- the wiring, once ------------------------------------------------------------------
    def open(self) -> None:
        self.open_store()
        if self._committer is None:
            self._committer = Committer(self.store, self.stager, faults=self.faults)

    def close(self) -> None:
        self.close_store()

    def use_faults(self, faults: FaultPlan) -> None:
        super().use_faults(faults)
        if self._committer is not None:
            self._committer.faults = faults

    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        """Commit one micro-batch: the committer runs steps 1-5 with this sink's store and
        stager (driver, inside foreachBatch)."""
        self.open()
        assert self._committer is not None
        return self._committer.commit(ctx, df)

    def committer_parts(self) -> tuple[LedgerStore, Stager]:
        self.open()
        return self.store, self.stager

    # -- ownership and progress: the store's ---------------------------------------------
    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        """Take the next epoch (fencing older runs), then :meth:`after_acquire`."""
        self.check_acquire(pipeline)
        self.open()
        owner = self.store.acquire(pipeline, source)
        log.info("pipeline %r took epoch %d in %s", pipeline, owner.epoch, self.describe())
        self.after_acquire(pipeline, owner)
        return owner

    def owner(self, pipeline: str) -> Owner | None:
        self.open()
        return self.store.owner(pipeline)

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        self.open()
        return self.store.entries(pipeline)

    def last_entry(self, pipeline: str) -> LedgerEntry | None:
        self.open()
        return self.store.last(pipeline)

    def end_offsets(self, pipeline: str) -> dict[TopicPartition, int]:
        last = self.last_entry(pipeline)
        return {} if last is None else last.end_offsets

    def pipelines(self) -> list[str]:
        self.open()
        return self.store.pipelines()
