"""A Delta ledger with a long history: a new no-data batch reads a bounded number of entries.

The history is synthesized as ``benchmarks/history.py`` does: one Delta commit sets the
pipeline's ``txn`` version to that of N committed batches, and only the newest entry files
exist. A store that walked the whole ledger for a new no-data batch (as it did) would reach
a missing entry file and fail; the real walk stops at the first entry behind the batch.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from sparkonce import DeltaSink
from sparkonce.commit import Committer, Staged, Stager
from sparkonce.ledger.base import BatchContext
from sparkonce.ledger.delta import app_id, pack
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.spark.delta import DeltaTable

P = "dhist"
N = 1_000  # batches in the ledger; entry files exist for the newest two only


def ranges(seq: int) -> BatchRanges:
    return BatchRanges(tuple(OffsetRange("events", p, seq * 10, seq * 10 + 10) for p in (0, 1)))


def synthesize(spark: SparkSession, path: str) -> None:
    spark.range(0).selectExpr("id AS v").write.format("delta").save(path)
    table = DeltaTable(spark, path)
    txn = table.start_transaction()
    txn.readTxn().addOne(app_id(P))
    table._commit_set_transaction(txn, app_id(P), pack(1, N), json.dumps({"sparkonce": "x"}))
    base = Path(path) / "_sparkonce" / P
    (base / "owners").mkdir(parents=True)
    at = datetime.now(UTC).isoformat()
    (base / "owners" / "1.json").write_text(json.dumps({"epoch": 1, "holder": "t", "at": at}))
    for seq in (N - 2, N - 1):
        d = base / "entries" / str(seq)
        d.mkdir(parents=True)
        entry = {"pipeline": P, "seq": seq, "epoch": 1, "ranges": ranges(seq).to_json_obj()}
        (d / "1.json").write_text(json.dumps({**entry, "committed_at": at, "checkpoint_id": "q"}))
        (d / "1.rows").write_text("20 0.01")


class OneRow(Stager):
    def __init__(self, sink: DeltaSink, spark: SparkSession) -> None:
        self.sink = sink
        self.df = spark.range(1).selectExpr("id AS v")

    def prepare(self, ctx: BatchContext, df: Any, seq: int) -> Staged:
        return Staged(1)

    def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
        table = self.sink.table
        assert isinstance(table, DeltaTable)
        txn.publish = lambda app, version, meta: table.append(self.df._jdf, app, version, meta)
        txn.staged = staged


def test_a_new_no_data_batch_does_not_walk_the_whole_ledger(spark, tmp_path) -> None:
    path = str(tmp_path / "t")
    synthesize(spark, path)
    sink = DeltaSink(path)
    epoch = sink.acquire(P).epoch
    assert sink.end_offsets(P) == ranges(N - 1).ends()
    store, _ = sink.committer_parts()
    committer = Committer(store, OneRow(sink, spark))

    def commit(batch: BatchRanges, batch_id: int) -> Any:
        ctx = BatchContext(P, epoch, batch, batch_id, "q-new")
        return committer.commit_with(ctx, lambda seq: Staged(1))

    no_data = BatchRanges.at(ranges(N - 1).ends())
    result = commit(no_data, 5)
    assert (result.skipped, result.seq) == (False, N)
    # Its replay is found by its Spark identity.
    again = commit(no_data, 5)
    assert again.skipped and again.seq == N
    last = sink.last_entry(P)
    assert last is not None and last.seq == N
