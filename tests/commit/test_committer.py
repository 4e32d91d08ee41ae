"""The committer's protocol, once, against every real ledger store (SQLite, PostgreSQL, Kafka).

The stager here only records what the committer asks of it, so each test sees the order of
the hooks and what reached the store's ledger. The sinks' own stagers are tested with their
sinks (tests/unit/test_sinks_sql.py, tests/kafka/test_sink.py, tests/spark/test_twophase.py).
"""

from __future__ import annotations

import contextlib
import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from sparkonce.commit import Committer, Staged, Stager
from sparkonce.config import StoreURL
from sparkonce.db import dialect_for
from sparkonce.errors import FencedError, LedgerError, SinkError, SinkUnavailableError
from sparkonce.faults import FaultPlan
from sparkonce.kafka.client import KafkaConnection
from sparkonce.ledger.base import BatchContext, LedgerStore
from sparkonce.ledger.kafka_topic import KafkaLedgerStore
from sparkonce.ledger.sql import SqlLedgerStore
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.protocol import CrashPoint

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

P = "committer-test"
# The batch's frame: the recording stager never reads it.
NO_FRAME = cast("DataFrame", None)
_names = itertools.count()


def ranges(start: int, end: int, partitions: int = 2) -> BatchRanges:
    return BatchRanges(tuple(OffsetRange("events", p, start, end) for p in range(partitions)))


class Crash(BaseException):
    """A simulated crash (a real one SIGKILLs the process): no ``except Exception`` sees it."""


def _crash() -> None:
    raise Crash


class RecordingStager(Stager):
    """Stages ``rows`` rows; records every hook the committer calls."""

    def __init__(self, rows: int = 3, *, fail_publish: Exception | None = None) -> None:
        self.rows = rows
        self.fail_publish = fail_publish
        self.calls: list[str] = []

    def prepare(self, ctx: BatchContext, df: Any, seq: int) -> Staged:
        self.calls.append(f"prepare:{seq}")
        return Staged(self.rows)

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        self.calls.append("publish")
        if self.fail_publish is not None:
            raise self.fail_publish

    def abort(self, ctx: BatchContext, staged: Staged | None) -> None:
        self.calls.append("abort")

    def after_commit(self, ctx: BatchContext) -> None:
        self.calls.append("after_commit")


@pytest.fixture(params=["sqlite", "postgres", "kafka"])
def new_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """``new_store()``: a new store object (its own connection) on one fresh ledger."""
    made: list[Any] = []
    if request.param == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        topic = request.getfixturevalue("kafka_topic")("committer", partitions=1)

        def make() -> Any:
            store = KafkaLedgerStore(
                KafkaConnection(broker.bootstrap, {}), f"{topic}.sparkonce-ledger", topic=topic
            )
            store.open()
            made.append(store)
            return store

    else:
        if request.param == "sqlite":
            url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")
        else:
            url = StoreURL.parse(request.getfixturevalue("pg_url"))

        def make() -> Any:
            store = SqlLedgerStore(url, dialect_for(url))
            made.append(store)
            return store

    yield make
    for store in made:
        with contextlib.suppress(Exception):  # teardown only
            store.close()


@pytest.fixture
def pipeline() -> str:
    # PostgreSQL is shared by the whole test run: every test takes its own pipeline name.
    return f"{P}-{next(_names)}"


def ctx(pipeline: str, epoch: int, batch: BatchRanges, spark_batch_id: int = 0) -> BatchContext:
    return BatchContext(pipeline, epoch, batch, spark_batch_id, checkpoint_id="q1")


def seqs(store: LedgerStore, pipeline: str) -> list[tuple[int, str, int]]:
    return [(e.seq, str(e.ranges), e.epoch) for e in store.entries(pipeline)]


def test_a_new_batch_commits_once_and_its_replay_stages_nothing(new_store, pipeline) -> None:
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager(rows=4)
    committer = Committer(store, stager, faults=FaultPlan())

    result = committer.commit(ctx(pipeline, epoch, ranges(0, 10)), NO_FRAME)
    assert (result.skipped, result.row_count, result.seq) == (False, 4, 0)
    assert stager.calls == ["prepare:0", "publish", "after_commit"]
    entry = new_store().entries(pipeline)[0]
    assert (entry.seq, entry.ranges, entry.epoch, entry.row_count) == (
        0,
        ranges(0, 10),
        epoch,
        4,
    )

    # The same batch again (a crash after step 5, before Spark's commit log): a no-op.
    stager.calls.clear()
    again = committer.commit(ctx(pipeline, epoch, ranges(0, 10), spark_batch_id=7), NO_FRAME)
    assert again.skipped and again.seq == 0
    assert (again.row_count, again.reason) == (0, "offsets already in the ledger (replay)")
    assert stager.calls == []  # nothing staged, no task would have run
    # The next batch follows; a batch planned differently (a lost checkpoint) is refused.
    assert committer.commit(ctx(pipeline, epoch, ranges(10, 15), 1), NO_FRAME).seq == 1
    with pytest.raises(LedgerError, match="only in part"):
        committer.commit(ctx(pipeline, epoch, ranges(12, 20), 2), NO_FRAME)
    with pytest.raises(LedgerError):
        committer.commit(ctx(pipeline, epoch, ranges(16, 20), 2), NO_FRAME)  # a gap
    assert [s for s, _, _ in seqs(new_store(), pipeline)] == [0, 1]


class SlowStager(RecordingStager):
    def prepare(self, ctx: BatchContext, df: Any, seq: int) -> Staged:
        time.sleep(0.3)
        return super().prepare(ctx, df, seq)


def test_each_entry_records_how_long_its_commit_took(new_store, pipeline) -> None:
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    committer = Committer(store, SlowStager(), faults=FaultPlan())
    began = time.monotonic()
    committer.commit(ctx(pipeline, epoch, ranges(0, 10)), NO_FRAME)
    took = time.monotonic() - began
    [entry] = new_store().entries(pipeline)  # read back from the store, by a new reader
    assert entry.commit_seconds is not None
    assert 0.3 <= entry.commit_seconds <= took


def test_a_fenced_run_stages_nothing_and_commits_nothing(new_store, pipeline) -> None:
    old, new = new_store(), new_store()
    old_epoch = old.acquire(pipeline).epoch
    new_epoch = new.acquire(pipeline).epoch
    stager = RecordingStager()
    with pytest.raises(FencedError) as info:
        Committer(old, stager, faults=FaultPlan()).commit(
            ctx(pipeline, old_epoch, ranges(0, 5)), NO_FRAME
        )
    assert info.value.owner_epoch == new_epoch
    assert stager.calls == []  # step 0: fenced before any task would start
    # The newer run commits as usual.
    Committer(new, RecordingStager(), faults=FaultPlan()).commit(
        ctx(pipeline, new_epoch, ranges(0, 5)), NO_FRAME
    )
    assert [e for _, _, e in seqs(new_store(), pipeline)] == [new_epoch]


def test_a_run_fenced_while_staging_is_refused_at_step_1(new_store, pipeline) -> None:
    old, new = new_store(), new_store()
    old_epoch = old.acquire(pipeline).epoch
    committer = Committer(old, RecordingStager(), faults=FaultPlan())

    def stage_then_lose_ownership(seq: int) -> Staged:
        new.acquire(pipeline)  # a newer run starts while this one's tasks run
        return Staged(3)

    with pytest.raises(FencedError):
        committer.commit_with(ctx(pipeline, old_epoch, ranges(0, 5)), stage_then_lose_ownership)
    assert committer.stager.calls == ["abort"]  # type: ignore[attr-defined]
    assert new_store().entries(pipeline) == []


def test_a_stage_that_fails_after_the_run_was_fenced_reports_the_fencing(
    new_store, pipeline
) -> None:
    """A zombie thawed after a newer run collected what it stages (a stable copy, say):
    its failed stage is reported as FencedError; an unfenced run keeps its own error."""
    old, new = new_store(), new_store()
    old_epoch = old.acquire(pipeline).epoch
    committer = Committer(old, RecordingStager(), faults=FaultPlan())

    def stage_from_a_deleted_copy(seq: int) -> Staged:
        raise FileNotFoundError("the copy is gone")

    with pytest.raises(FileNotFoundError):  # still the owner: the real error
        committer.commit_with(ctx(pipeline, old_epoch, ranges(0, 5)), stage_from_a_deleted_copy)

    def lose_ownership_then_fail(seq: int) -> Staged:
        new.acquire(pipeline)
        raise FileNotFoundError("the copy is gone")

    with pytest.raises(FencedError):
        committer.commit_with(ctx(pipeline, old_epoch, ranges(0, 5)), lose_ownership_then_fail)
    assert new_store().entries(pipeline) == []


def test_a_ledger_moved_by_another_writer_while_staging_is_refused(new_store, pipeline) -> None:
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    other = Committer(new_store(), RecordingStager(), faults=FaultPlan())
    committer = Committer(store, RecordingStager(), faults=FaultPlan())

    def stage_while_another_writer_commits(seq: int) -> Staged:
        other.commit(ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME)  # same epoch: a second writer
        return Staged(3)

    # The other writer's batch covers ours, so ours is now a replay: skipped, not doubled.
    result = committer.commit_with(
        ctx(pipeline, epoch, ranges(0, 5)), stage_while_another_writer_commits
    )
    assert result.skipped
    assert len(new_store().entries(pipeline)) == 1

    def stage_while_another_writer_commits_next(seq: int) -> Staged:
        # A no-data batch with rows (say, a window the watermark closed): a new entry that
        # leaves the ledger's end offsets where they were.
        other.commit(ctx(pipeline, epoch, ranges(5, 5), 1), NO_FRAME)
        return Staged(3)

    # Our batch is still new, but the entry this run expected to write was taken.
    with pytest.raises(LedgerError, match=r"moved.*Nothing of the batch was committed\.$"):
        committer.commit_with(
            ctx(pipeline, epoch, ranges(5, 9), 2), stage_while_another_writer_commits_next
        )
    assert [s for s, _, _ in seqs(new_store(), pipeline)] == [0, 1]


def test_no_data_batches_commit_only_with_rows_and_replay_by_spark_identity(
    new_store, pipeline
) -> None:
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    Committer(store, RecordingStager(), faults=FaultPlan()).commit(
        ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
    )
    at_end = ranges(5, 5)
    # No rows (nothing moved): nothing committed, no entry.
    empty = Committer(store, RecordingStager(rows=0), faults=FaultPlan())
    assert empty.commit(ctx(pipeline, epoch, at_end, 1), NO_FRAME).skipped
    assert len(new_store().entries(pipeline)) == 1
    # Rows (a window closed by the watermark): an entry with empty ranges.
    emitting = Committer(store, RecordingStager(rows=2), faults=FaultPlan())
    assert emitting.commit(ctx(pipeline, epoch, at_end, 2), NO_FRAME).seq == 1
    # Its replay (same query and batch id) is skipped; the next no-data batch is not.
    stager = RecordingStager(rows=1)
    replayed = Committer(store, stager, faults=FaultPlan()).commit(
        ctx(pipeline, epoch, at_end, 2), NO_FRAME
    )
    assert (replayed.skipped, replayed.row_count, replayed.seq) == (True, 0, 1)
    assert replayed.reason == "no-data batch already committed (replay)"
    assert stager.calls == []
    assert (
        Committer(store, stager, faults=FaultPlan())
        .commit(ctx(pipeline, epoch, at_end, 3), NO_FRAME)
        .seq
        == 2
    )


@pytest.mark.parametrize("point", list(CrashPoint), ids=[p.value for p in CrashPoint])
def test_a_crash_at_each_step_then_a_new_run_gives_one_entry(new_store, pipeline, point) -> None:
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    crashing = Committer(
        store, RecordingStager(), faults=FaultPlan(crash=(point, 1), on_crash=_crash)
    )
    with pytest.raises(Crash):
        crashing.commit(ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME)
    # The crashed process's connection dies with it.
    store.reconnect() if not isinstance(store, KafkaLedgerStore) else store.close()
    landed = len(new_store().entries(pipeline))
    assert landed == (1 if point is CrashPoint.AFTER_LEDGER_COMMIT else 0)

    # The restarted run replays the batch: committed now, or skipped if it had landed.
    fresh = new_store()
    new_epoch = fresh.acquire(pipeline).epoch
    stager = RecordingStager()
    result = Committer(fresh, stager, faults=FaultPlan()).commit(
        ctx(pipeline, new_epoch, ranges(0, 5), 0), NO_FRAME
    )
    assert result.skipped == (landed == 1)
    assert [(s, r) for s, r, _ in seqs(new_store(), pipeline)] == [(0, str(ranges(0, 5)))]


@pytest.mark.parametrize("store_kind", ["sqlite", "postgres"])
def test_a_connection_lost_inside_the_commit_is_retried_once_on_a_new_one(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest, pipeline: str
) -> None:
    url = StoreURL.parse(
        f"sqlite:///{tmp_path / 'out.db'}"
        if store_kind == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    store = SqlLedgerStore(url, dialect_for(url))
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager()
    plan = FaultPlan(drop_connection=(CrashPoint.AFTER_ROWS, 1))
    result = Committer(store, stager, faults=plan).commit(
        ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
    )
    assert (result.skipped, result.seq) == (False, 0)
    assert stager.calls == ["prepare:0", "publish", "publish", "after_commit"]
    assert len(SqlLedgerStore(url, dialect_for(url)).entries(pipeline)) == 1
    store.close()


class _ReplyLost(SqlLedgerStore):
    """A ledger store whose first commit goes through and then loses its reply: ``lose``
    runs on the committed transaction's connection and raises as the lost reply would."""

    lost = False
    lose: Callable[[Any], None]

    @contextmanager
    def transaction(self) -> Iterator[Any]:
        with super().transaction() as txn:
            yield txn
        if not self.lost:
            self.lost = True
            self.lose(txn)


def _reply_lost_once(url: StoreURL, lose: Callable[[Any], None]) -> _ReplyLost:
    store = _ReplyLost(url, dialect_for(url))
    store.lose = lose
    return store


def test_a_lost_commit_that_went_through_is_reported_as_committed(
    pg_url: str, pipeline: str
) -> None:
    """The COMMIT reached the server but its reply was lost: the retry finds our own entry."""
    import psycopg

    url = StoreURL.parse(pg_url)

    def lose(txn: Any) -> None:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    store = _reply_lost_once(url, lose)
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager(rows=5)
    result = Committer(store, stager, faults=FaultPlan()).commit(
        ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
    )
    assert (result.skipped, result.row_count, result.seq) == (False, 5, 0)  # ours, not a replay
    assert stager.calls == ["prepare:0", "publish", "after_commit"]  # published once
    assert len(SqlLedgerStore(url, dialect_for(url)).entries(pipeline)) == 1
    store.close()


def test_a_lost_sqlite_commit_that_went_through_is_reported_as_committed(
    tmp_path: Path, pipeline: str
) -> None:
    """As above on SQLite (the fast tests): the COMMIT went through, then the connection
    closed before the commit returned; the retry finds our own entry, not a replay."""
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")

    def lose(txn: Any) -> None:
        txn.close()
        txn.execute("SELECT 1")  # sqlite3.ProgrammingError: a closed database

    store = _reply_lost_once(url, lose)
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager(rows=5)
    result = Committer(store, stager, faults=FaultPlan()).commit(
        ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
    )
    assert store.lost
    assert (result.skipped, result.row_count, result.seq) == (False, 5, 0)  # ours, not a replay
    assert stager.calls == ["prepare:0", "publish", "after_commit"]  # published once
    assert len(SqlLedgerStore(url, dialect_for(url)).entries(pipeline)) == 1
    store.close()


def test_a_connection_lost_at_every_attempt_is_sink_unavailable(pg_url: str, pipeline: str) -> None:
    """The store's connection is cut at each try of the commit: SinkUnavailableError (exit 4,
    as when the store cannot be reached at all), naming the batch."""
    import psycopg

    from sparkonce.cli import EXIT_UNAVAILABLE, _report

    url = StoreURL.parse(pg_url)

    class AlwaysLost(SqlLedgerStore):
        @contextmanager
        def transaction(self) -> Iterator[Any]:
            with super().transaction() as txn:
                yield txn
                raise psycopg.OperationalError("server closed the connection unexpectedly")

    store = AlwaysLost(url, dialect_for(url))
    epoch = store.acquire(pipeline).epoch
    with pytest.raises(SinkUnavailableError) as info:
        Committer(store, RecordingStager(rows=5), faults=FaultPlan()).commit(
            ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
        )
    assert "events[0]:0..5" in str(info.value) and "server closed" in str(info.value)
    assert _report(info.value) == EXIT_UNAVAILABLE
    store.close()


def test_a_no_data_batch_of_another_query_with_the_same_batch_id_is_no_replay(
    new_store, pipeline
) -> None:
    # The query restarted on a new checkpoint (its batch ids start again): its no-data
    # batch 2 is not the old query's no-data batch 2, and its rows must be committed.
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    committer = Committer(store, RecordingStager(rows=2), faults=FaultPlan())
    committer.commit(ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME)
    at_end = ranges(5, 5)
    assert committer.commit(ctx(pipeline, epoch, at_end, 2), NO_FRAME).seq == 1
    other = BatchContext(pipeline, epoch, at_end, 2, checkpoint_id="q2")
    result = Committer(store, RecordingStager(rows=2), faults=FaultPlan()).commit(other, NO_FRAME)
    assert (result.skipped, result.seq) == (False, 2)


def test_the_entry_records_that_the_query_is_stateful(new_store, pipeline) -> None:
    # The stateful flag in the ledger is what refuses a lost checkpoint of a stateful query.
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    stateful = BatchContext(pipeline, epoch, ranges(0, 5), 0, checkpoint_id="q1", stateful=True)
    Committer(store, RecordingStager(), faults=FaultPlan()).commit_with(
        stateful, lambda seq: Staged(rows=3)
    )
    assert [e.stateful for e in new_store().entries(pipeline)] == [True]


def test_a_no_data_batch_before_any_entry_commits_nothing(new_store, pipeline) -> None:
    # A query whose first batch is a no-data batch (a timer fired before any input):
    # the ledger is empty, so there is no last entry to compare it with.
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager(rows=0)
    result = Committer(store, stager, faults=FaultPlan()).commit(
        ctx(pipeline, epoch, BatchRanges.at({("events", 0): 0})), NO_FRAME
    )
    assert (result.skipped, result.seq, result.row_count) == (True, None, 0)
    assert result.reason == "no new offsets and no rows"
    assert new_store().entries(pipeline) == []


def test_a_store_error_rolls_back_names_the_batch_and_says_what_is_visible(
    new_store, pipeline
) -> None:
    store = new_store()
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager(fail_publish=RuntimeError("disk full"))
    with pytest.raises(SinkError) as info:
        Committer(store, stager, faults=FaultPlan()).commit(
            ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
        )
    text = str(info.value)
    assert type(info.value) is SinkError  # exit 1: not SinkUnavailableError (a lost store)
    assert "disk full" in text and "events[0]:0..5" in text
    assert (  # the default stager's own words
        "The transaction was rolled back; nothing of the batch is visible and the ledger "
        "is unchanged." in text
    )
    assert "Fix the cause and restart the run; the batch will be replayed." in text
    assert stager.calls == ["prepare:0", "publish", "abort"]
    assert new_store().entries(pipeline) == []

    class TasksCommitFirst(RecordingStager):
        def after_failed_commit(self) -> str:
            return "Some tasks' rows are visible already."

    with pytest.raises(SinkError, match="Some tasks' rows are visible already"):
        Committer(
            store, TasksCommitFirst(fail_publish=RuntimeError("x")), faults=FaultPlan()
        ).commit(ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME)


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqlLedgerStore]:
    """One store on a fresh SQLite ledger (for what does not depend on the store)."""
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")
    store = SqlLedgerStore(url, dialect_for(url))
    yield store
    store.close()


class HandStager(RecordingStager):
    """Records the context and staged object each hook receives; ``fail_prepare`` raises."""

    def __init__(self, *, fail_prepare: bool = False, **kw: Any) -> None:
        super().__init__(**kw)
        self.fail_prepare = fail_prepare
        self.seen: list[tuple[str, BatchContext, Staged | None]] = []
        self.frames: list[Any] = []

    def prepare(self, ctx: BatchContext, df: Any, seq: int) -> Staged:
        self.frames.append(df)
        if self.fail_prepare:
            raise RuntimeError("the tasks failed")
        staged = super().prepare(ctx, df, seq)
        self.seen.append(("prepare", ctx, staged))
        return staged

    def abort(self, ctx: BatchContext, staged: Staged | None) -> None:
        super().abort(ctx, staged)
        self.seen.append(("abort", ctx, staged))

    def after_commit(self, ctx: BatchContext) -> None:
        super().after_commit(ctx)
        self.seen.append(("after_commit", ctx, None))


def test_the_stager_cleans_up_the_batch_it_staged(sqlite_store, pipeline) -> None:
    # abort must get the failed batch and exactly what its prepare returned (the attempts
    # to roll back), after_commit the committed batch: a stager that got another batch's
    # context or nothing would leave pre-committed rows behind.
    epoch = sqlite_store.acquire(pipeline).epoch
    ok = HandStager()
    first = ctx(pipeline, epoch, ranges(0, 5))
    frame = cast("DataFrame", object())  # stands for the batch's DataFrame: never read here
    Committer(sqlite_store, ok, faults=FaultPlan()).commit(first, frame)
    assert ok.frames == [frame]  # the batch's own rows are what gets staged
    [(_, ctx_p, staged)] = [s for s in ok.seen if s[0] == "prepare"]
    assert ok.seen == [("prepare", first, staged), ("after_commit", first, None)]
    assert ctx_p is first and ok.seen[1][1] is first

    failing = HandStager(fail_publish=RuntimeError("disk full"))
    second = ctx(pipeline, epoch, ranges(5, 9))
    with pytest.raises(SinkError):
        Committer(sqlite_store, failing, faults=FaultPlan()).commit(second, NO_FRAME)
    (_, _, staged), aborted = failing.seen
    assert aborted[0] == "abort" and aborted[1] is second and aborted[2] is staged

    unstaged = HandStager(fail_prepare=True)
    with pytest.raises(RuntimeError, match="the tasks failed"):
        Committer(sqlite_store, unstaged, faults=FaultPlan()).commit(second, NO_FRAME)
    assert unstaged.seen == [("abort", second, None)]  # nothing was staged
    assert [e.seq for e in sqlite_store.entries(pipeline)] == [0]


def test_the_result_times_each_step_of_the_commit(sqlite_store, pipeline) -> None:
    epoch = sqlite_store.acquire(pipeline).epoch
    committer = Committer(sqlite_store, SlowStager(), faults=FaultPlan())
    began = time.monotonic()
    result = committer.commit(ctx(pipeline, epoch, ranges(0, 10)), NO_FRAME)
    took = time.monotonic() - began
    assert list(result.timings) == ["look", "stage", "commit", "after"]
    assert all(0 <= s <= took for s in result.timings.values()), result.timings
    assert 0.3 <= result.timings["stage"] <= sum(result.timings.values()) <= took + 0.001


def test_a_stager_that_stages_in_tasks_names_itself_when_given_collected_rows() -> None:
    # Only stagers with stages_on_driver take collected (Arrow) rows; another one says
    # which stager was asked, for the caller that did not check.
    assert RecordingStager.stages_on_driver is False
    with pytest.raises(NotImplementedError, match=r"^RecordingStager stages its rows in Spark"):
        RecordingStager().prepare_arrow(ctx(P, 1, ranges(0, 1)), None, cast("Any", None), 0)


def test_a_stateful_batch_that_commits_is_not_computed_a_second_time(
    sqlite_store, pipeline
) -> None:
    # Only a stateful query's replay, which stages nothing, runs its DataFrame into the
    # no-op sink; a batch that was staged has run already (a second run would compute it
    # twice). NO_FRAME has no .write: a second run would raise here.
    epoch = sqlite_store.acquire(pipeline).epoch
    stateful = BatchContext(pipeline, epoch, ranges(0, 5), 0, checkpoint_id="q1", stateful=True)
    stager = HandStager()
    result = Committer(sqlite_store, stager, faults=FaultPlan()).commit(stateful, NO_FRAME)
    assert (result.skipped, result.seq) == (False, 0) and stager.frames == [NO_FRAME]


def test_a_sqlite_connection_lost_at_every_attempt_is_sink_unavailable(
    tmp_path: Path, pipeline: str
) -> None:
    """SQLite's connection is closed before each try's COMMIT: every attempt is retried on
    a new one, then SinkUnavailableError (exit 4), naming the batch; nothing committed."""
    from sparkonce.cli import EXIT_UNAVAILABLE, _report

    url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")

    class AlwaysLost(SqlLedgerStore):
        tries = 0

        @contextmanager
        def transaction(self) -> Iterator[Any]:
            with super().transaction() as txn:
                yield txn
                self.tries += 1
                txn.close()  # the COMMIT then meets a closed connection

    store = AlwaysLost(url, dialect_for(url))
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager(rows=5)
    with pytest.raises(SinkUnavailableError) as info:
        Committer(store, stager, faults=FaultPlan()).commit(
            ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
        )
    assert "events[0]:0..5" in str(info.value) and "closed" in str(info.value)
    assert _report(info.value) == EXIT_UNAVAILABLE
    assert store.tries == 3 and stager.calls == ["prepare:0"] + ["publish"] * 3 + ["abort"]
    assert SqlLedgerStore(url, dialect_for(url)).entries(pipeline) == []
    store.close()


def test_a_no_data_batch_without_a_checkpoint_identity_is_never_taken_for_a_replay(
    sqlite_store, pipeline
) -> None:
    # A no-data batch is recognised only by its Spark identity (checkpoint id, batch id);
    # without a checkpoint id there is none, and the ledger's last entry must not stand
    # for one: skipping the batch would drop the rows it emits (a timer's output).
    epoch = sqlite_store.acquire(pipeline).epoch
    committer = Committer(sqlite_store, RecordingStager(rows=2), faults=FaultPlan())

    def anonymous(batch: BatchRanges, batch_id: int) -> BatchContext:
        return BatchContext(pipeline, epoch, batch, batch_id, checkpoint_id=None)

    committer.commit(anonymous(ranges(0, 5), 1), NO_FRAME)
    assert committer.commit(anonymous(ranges(5, 5), 2), NO_FRAME).seq == 1
    again = committer.commit(anonymous(ranges(5, 5), 2), NO_FRAME)
    assert (again.skipped, again.seq) == (False, 2)


def test_a_retried_commit_says_why_and_which_attempt_in_one_warning(
    tmp_path: Path, pipeline: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The only trace of a lost connection that the retry repaired: operators count these.
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")
    store = SqlLedgerStore(url, dialect_for(url))
    epoch = store.acquire(pipeline).epoch
    plan = FaultPlan(drop_connection=(CrashPoint.AFTER_ROWS, 1))
    with caplog.at_level("WARNING", logger="sparkonce.commit.committer"):
        Committer(store, RecordingStager(), faults=plan).commit(
            ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
        )
    [retry] = [r for r in caplog.records if r.name == "sparkonce.commit.committer"]
    assert retry.levelname == "WARNING"
    assert retry.getMessage().startswith(
        f"pipeline {pipeline!r} batch {ranges(0, 5)}: connection to {store.describe()} lost "
        "during commit ("
    )
    assert retry.getMessage().endswith("); retrying on a new connection (attempt 2/3)")
    # The error that was lost, by its own words (committer _retrying mutant 29 logged None).
    why = retry.getMessage().split(" during commit (", 1)[1].rsplit("); retrying", 1)[0]
    assert isinstance(retry.args, tuple)
    assert why == str(retry.args[4]) and why not in ("", "None"), retry.getMessage()
    store.close()


def test_a_connection_lost_at_the_early_look_is_retried_and_says_so(
    tmp_path: Path, pipeline: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Step 0 (owner and last entry, before anything is staged) runs under the same retry
    # policy as the commit; its warning says the connection was lost before the commit.
    url = StoreURL.parse(f"sqlite:///{tmp_path / 'out.db'}")

    class LostAtLook(SqlLedgerStore):
        looks = 0

        def last(self, pipeline: str) -> Any:
            self.looks += 1
            if self.looks == 1:
                self.conn.close()  # the read then meets a closed connection
            return super().last(pipeline)

    store = LostAtLook(url, dialect_for(url))
    epoch = store.acquire(pipeline).epoch
    stager = RecordingStager()
    with caplog.at_level("WARNING", logger="sparkonce.commit.committer"):
        result = Committer(store, stager, faults=FaultPlan()).commit(
            ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME
        )
    assert (result.skipped, result.seq, store.looks) == (False, 0, 2)
    assert stager.calls == ["prepare:0", "publish", "after_commit"]
    [retry] = [r for r in caplog.records if r.name == "sparkonce.commit.committer"]
    assert retry.getMessage().startswith(
        f"pipeline {pipeline!r} batch {ranges(0, 5)}: connection to {store.describe()} lost "
        "before the commit ("
    )
    store.close()


def test_a_replay_of_an_older_batch_names_its_entry(sqlite_store, pipeline) -> None:
    # Not the ledger's last entry: the store looks the batch up by its ranges.
    epoch = sqlite_store.acquire(pipeline).epoch
    committer = Committer(sqlite_store, RecordingStager(), faults=FaultPlan())
    committer.commit(ctx(pipeline, epoch, ranges(0, 5), 0), NO_FRAME)
    committer.commit(ctx(pipeline, epoch, ranges(5, 9), 1), NO_FRAME)
    again = committer.commit(ctx(pipeline, epoch, ranges(0, 5), 0), NO_FRAME)
    assert (again.skipped, again.row_count, again.seq) == (True, 0, 0)


def test_a_committer_may_make_a_single_attempt_but_not_none(sqlite_store, pipeline) -> None:
    epoch = sqlite_store.acquire(pipeline).epoch
    once = Committer(sqlite_store, RecordingStager(), faults=FaultPlan(), attempts=1)
    assert once.commit(ctx(pipeline, epoch, ranges(0, 5)), NO_FRAME).seq == 0
    with pytest.raises(ValueError, match=r"^attempts must be >= 1$"):
        Committer(sqlite_store, RecordingStager(), attempts=0)
