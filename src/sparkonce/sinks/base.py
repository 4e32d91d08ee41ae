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

from abc import ABC, abstractmethod
from collections.abc import Hashable
from typing import TYPE_CHECKING, ClassVar

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


class Sink(ABC):
    """Base class of sinks. Subclasses state their guarantee in their docstring."""

    guarantee: ClassVar[Guarantee]
    # Whether SPARKONCE_DROP_CONNECTION_AT makes this sink lose its store connection
    # (the verifier's db-drop fault).
    supports_connection_drop: ClassVar[bool] = False
    # The run's fault plan (crash points of the commit); the no-op plan until use_faults().
    faults: FaultPlan = NO_FAULTS

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
