"""The wiring every transactional sink shares (sinks/base.py TransactionalSink), on SQLite
and without Spark: the run's fault plan reaches the committer whether it is given before
or after the sink opens, and taking an epoch checks the pipeline name, then says which
epoch was taken where."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa
import pytest
from pyspark.sql import types as T

from sparkonce.config import StoreURL
from sparkonce.errors import ConfigError
from sparkonce.faults import FaultPlan
from sparkonce.ledger.base import BatchContext, CommitResult, LedgerEntry, Owner
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.protocol import CrashPoint
from sparkonce.sinks import KafkaSink, Sink, SQLiteSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

SCHEMA = T.StructType([T.StructField("id", T.LongType())])
BATCH = BatchRanges((OffsetRange("t", 0, 0, 2),))


@pytest.fixture
def sink(store_url: StoreURL) -> Iterator[SQLiteSink]:
    s = SQLiteSink(store_url, "out")
    yield s
    s.close()


def _retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "sparkonce.commit.committer"
        and "retrying on a new connection" in r.getMessage()
    ]


@pytest.mark.parametrize("when", ["before open", "after open"])
def test_the_runs_fault_plan_reaches_the_committer(
    sink: SQLiteSink, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A dropped connection inside the commit is the fault a test can see and survive: the
    # committer retries it on a new connection, and says so.
    plan = FaultPlan(drop_connection=(CrashPoint.AFTER_ROWS, 1))
    if when == "before open":
        sink.use_faults(plan)
    epoch = sink.acquire("p").epoch  # opens the sink: builds its committer
    if when == "after open":
        sink.use_faults(plan)
    with caplog.at_level("WARNING"):
        result = sink.commit_rows(BatchContext("p", epoch, BATCH, 0, "cp"), SCHEMA, ["id"], [(1,)])
    assert (result.skipped, result.seq) == (False, 0)
    assert len(_retries(caplog)) == 1
    # The injected fault says itself what it did, so a run's log tells faults from failures.
    assert [r.getMessage() for r in caplog.records if r.name == "sparkonce.ledger.sql"] == [
        f"fault injection: dropping the connection to {sink.store.describe()} mid-commit"
    ]
    assert len(sink.ledger("p")) == 1


def test_taking_an_epoch_says_which_pipeline_epoch_and_sink(
    sink: SQLiteSink, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("INFO", logger="sparkonce.sinks.base"):
        sink.acquire("p")
        sink.acquire("p")
    said = [r.getMessage() for r in caplog.records if r.name == "sparkonce.sinks.base"]
    assert said == [f"pipeline 'p' took epoch {n} in {sink.describe()}" for n in (1, 2)]


def test_a_bad_pipeline_name_is_refused_by_name_before_the_store_is_reached() -> None:
    # KafkaSink checks the name (its topics' transactional ids carry it) before it connects:
    # no broker listens on port 1, and none is needed to refuse the name.
    sink = KafkaSink("127.0.0.1:1", "out")
    with pytest.raises(ConfigError, match=r"^pipeline name 'bad name' is invalid"):
        sink.acquire("bad name")


class _Frame:
    """What the SQL stager reads of a batch's DataFrame (toArrow, schema): a real Arrow
    table, so the sink's commit runs without a Spark driver."""

    def __init__(self, table: pa.Table, schema: T.StructType) -> None:
        self.table = table
        self.schema = schema

    def toArrow(self) -> pa.Table:  # Spark DataFrame method name
        return self.table


def test_a_batch_commits_through_the_sinks_committer(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    frame = cast("DataFrame", _Frame(pa.table({"id": [1, 2]}), SCHEMA))
    result = sink.commit(BatchContext("p", epoch, BATCH, 0, "cp"), frame)
    assert result.timings is not None
    assert (result.skipped, result.row_count, result.seq) == (False, 2, 0)
    [entry] = sink.ledger("p")
    assert (entry.ranges, entry.row_count) == (BATCH, 2)


class OwnSink(Sink):
    """A sink that commits by itself, not through sparkonce's committer."""

    def __init__(self, entries: list[LedgerEntry]) -> None:
        self.entries = entries

    def open(self) -> None:
        return None

    def close(self) -> None:
        return None

    def acquire(self, pipeline: str, source: str | None = None) -> Owner:
        raise AssertionError("not used")

    def end_offsets(self, pipeline: str) -> dict[Any, int]:
        return {}

    def validate(self, schema: T.StructType, output_mode: Any = "append") -> None:
        return None

    def commit(self, ctx: BatchContext, df: DataFrame) -> CommitResult:
        raise AssertionError("not used")

    def owner(self, pipeline: str) -> Owner | None:
        return None

    def ledger(self, pipeline: str) -> list[LedgerEntry]:
        return [e for e in self.entries if e.pipeline == pipeline]

    def describe(self) -> str:
        return "OwnSink()"


def test_a_sink_outside_the_committer_gets_the_base_defaults(sink: SQLiteSink) -> None:
    epoch = sink.acquire("p").epoch
    sink.commit_rows(BatchContext("p", epoch, BATCH, 0, "cp"), SCHEMA, ["id"], [(1,)])
    entries = sink.ledger("p")
    assert OwnSink(entries).last_entry("p") == entries[-1]
    assert OwnSink([]).last_entry("p") is None
    with pytest.raises(NotImplementedError, match=r"^OwnSink cannot list its store's pipelines$"):
        OwnSink([]).pipelines()
    with pytest.raises(ConfigError) as err:
        OwnSink([]).committer_parts()
    assert str(err.value) == (
        "OwnSink does not commit through sparkonce's committer, so it cannot be one of a "
        "pipeline's outputs; use it as the pipeline's only sink"
    )
