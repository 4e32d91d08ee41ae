"""SQL ledgers with a long history: indexed look-ups, and pruning that keeps the protocol.

Against real SQLite and PostgreSQL (``store_url``), through the committer, with the
recording stager of ``test_committer.py``.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from sparkonce.commit import Committer, Staged
from sparkonce.config import StoreURL
from sparkonce.db import dialect_for
from sparkonce.errors import ConfigError, FencedError
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.sql import LEDGER_TABLE, NO_DATA_QUERY, SPARK_BATCH_INDEX, SqlLedgerStore
from sparkonce.offsets import BatchRanges, OffsetRange
from tests.commit.test_committer import RecordingStager

_names = itertools.count()


def ranges(seq: int) -> BatchRanges:
    return BatchRanges(tuple(OffsetRange("events", p, seq * 10, seq * 10 + 10) for p in (0, 1)))


def at_end(seq: int) -> BatchRanges:
    """A no-data batch sitting at the end of batch ``seq``."""
    return BatchRanges.at(ranges(seq).ends())


@pytest.fixture
def pipeline() -> str:
    return f"sqlhist-{next(_names)}"


def store_for(url: str, **kw: Any) -> SqlLedgerStore:
    u = StoreURL.parse(url)
    return SqlLedgerStore(u, dialect_for(u), **kw)


def commit(store: SqlLedgerStore, ctx: BatchContext, rows: int = 2) -> Any:
    return Committer(store, RecordingStager(rows)).commit_with(ctx, lambda seq: Staged(rows))


def test_a_no_data_batch_is_looked_up_through_an_index(store_url: str, pipeline: str) -> None:
    """Every new no-data batch asks the ledger for its Spark identity: not a table scan."""
    store = store_for(store_url)
    conn = store.conn
    if store.dialect.name == "sqlite":
        # The very statement the ledger runs, on a ledger with rows (no statistics).
        ledger = store.ledger
        epoch = store.acquire(pipeline).epoch
        for seq in range(50):
            ledger.record(
                conn,
                pipeline=pipeline,
                seq=seq,
                ranges=ranges(seq),
                epoch=epoch,
                row_count=1,
                spark_batch_id=seq,
                checkpoint_id="q",
            )
        query = store.dialect.q("EXPLAIN QUERY PLAN " + NO_DATA_QUERY)
        plan = " ".join(str(r[-1]) for r in conn.execute(query, (pipeline, "q", 7)))
        assert SPARK_BATCH_INDEX in plan, plan
    else:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = %s", (LEDGER_TABLE,)
            ).fetchall()
        ]
        assert SPARK_BATCH_INDEX in names
        cols = conn.execute(
            "SELECT pg_get_indexdef(%s::regclass)", (SPARK_BATCH_INDEX,)
        ).fetchone()[0]
        assert "(pipeline, checkpoint_id, spark_batch_id)" in cols


def test_a_pruned_ledger_skips_replays_fences_and_resumes(store_url: str, pipeline: str) -> None:
    store = store_for(store_url, keep=3)
    epoch = store.acquire(pipeline).epoch
    for seq in range(10):
        assert not commit(store, BatchContext(pipeline, epoch, ranges(seq), seq, "q")).skipped
    # Pruned in every commit's transaction: the newest 3 entries, a gap-free chain.
    assert [e.seq for e in store.entries(pipeline)] == [7, 8, 9]

    # A new run (a new store object) resumes from the newest entry...
    newer = store_for(store_url, keep=3)
    epoch2 = newer.acquire(pipeline).epoch
    last = newer.last(pipeline)
    assert last is not None and last.end_offsets == ranges(9).ends()
    # ...the old run is fenced...
    with pytest.raises(FencedError):
        commit(store, BatchContext(pipeline, epoch, ranges(10), 10, "q"))
    # ...the replay of the last batch and of a pruned one are both skipped (the pruned one
    # with no entry to name), and the next batch gets the next seq.
    last = commit(newer, BatchContext(pipeline, epoch2, ranges(9), 9, "q"))
    assert last.skipped and last.seq == 9
    pruned = commit(newer, BatchContext(pipeline, epoch2, ranges(2), 2, "q"))
    assert pruned.skipped and pruned.seq is None
    nxt = commit(newer, BatchContext(pipeline, epoch2, ranges(10), 10, "q"))
    assert (nxt.skipped, nxt.seq) == (False, 10)
    assert [e.seq for e in newer.entries(pipeline)] == [8, 9, 10]


def test_pruning_keeps_every_no_data_batch_at_the_ledger_end(store_url: str, pipeline: str) -> None:
    """A replayed no-data batch is found by its Spark identity: entries at the end stay."""
    store = store_for(store_url, keep=2)
    epoch = store.acquire(pipeline).epoch
    assert not commit(store, BatchContext(pipeline, epoch, ranges(0), 0, "q")).skipped
    for batch_id in range(1, 6):  # timers fire, no new input: five no-data batches
        ctx = BatchContext(pipeline, epoch, at_end(0), batch_id, "q")
        assert not commit(store, ctx).skipped
    # keep=2 would leave two entries; all six end at the ledger's end, so all six stay.
    assert [e.seq for e in store.entries(pipeline)] == [0, 1, 2, 3, 4, 5]
    # The replay of the oldest of them (a checkpoint restored behind the ledger) is skipped.
    again = commit(store, BatchContext(pipeline, epoch, at_end(0), 1, "q"))
    assert again.skipped and again.seq == 1
    # Once data moves the end, the entries behind it are pruned down to keep.
    assert not commit(store, BatchContext(pipeline, epoch, ranges(1), 6, "q")).skipped
    assert [e.seq for e in store.entries(pipeline)] == [5, 6]


def test_prune_needs_keep_of_at_least_one(store_url: str, pipeline: str) -> None:
    with pytest.raises(ConfigError, match=">= 1"):
        store_for(store_url, keep=0)
    store = store_for(store_url)
    epoch = store.acquire(pipeline).epoch
    for seq in range(4):
        commit(store, BatchContext(pipeline, epoch, ranges(seq), seq, "q"))
    with pytest.raises(ConfigError, match=">= 1"):
        store.ledger.prune(store.conn, pipeline, 0)
    assert store.ledger.prune(store.conn, pipeline, 1, limit=2) == 2  # bounded per call
    assert store.ledger.prune(store.conn, pipeline, 1) == 1
    assert store.ledger.prune(store.conn, pipeline, 1) == 0
    assert [e.seq for e in store.entries(pipeline)] == [3]  # never the newest
