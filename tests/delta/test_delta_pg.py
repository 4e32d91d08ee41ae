"""Delta to PostgreSQL: a DeltaSource pipeline into PostgresSink on the shared session and the
test PostgreSQL server, in append mode and in upsert mode.

The oracle is the upstream table itself: what its commits appended, read without Spark
(pyarrow on the files its log names, :func:`tests.delta.test_source.delta_ids`), and checked
against the ids this test wrote. The output is read with psycopg. Each step of a run's life
is covered: a first run split over batches, a replay of a committed batch (skipped), an
upstream ``OPTIMIZE`` between runs (no row read twice), more appends, and a lost checkpoint
resumed from the ledger's end (Delta's ``startingVersion``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from sparkonce import DeltaSource, Pipeline, sink_from_url
from tests.delta.test_source import FILES, ROWS, append_versions, delta_ids, keep
from tests.spark.test_pipeline import forget_commit


def pg_pipeline(
    pg_url: str, table: Path, checkpoint: Path, *, name: str = "d2pg", **sink: Any
) -> Pipeline:
    return Pipeline(
        name=name,
        source=DeltaSource(table, max_files_per_batch=FILES),
        sink=sink_from_url(pg_url, name.replace("-", "_"), **sink),
        checkpoint=checkpoint,
        transform=keep,
    )


def pg_rows(pg_url: str, table: str) -> list[tuple[int, int]]:
    """The output table's (id, k) rows, sorted, read with psycopg (duplicates kept)."""
    import psycopg

    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(f"SELECT id, k FROM {table}").fetchall()
    return sorted((int(i), int(k)) for i, k in rows)


def appended(upstream: Path, written: list[int]) -> list[tuple[int, int]]:
    """The append oracle: every row the upstream table holds, each once, as (id, k). The
    table read without Spark must hold exactly the ids this test wrote (OPTIMIZE rewrote
    files, not rows)."""
    ids = delta_ids(upstream)
    assert ids == sorted(written), "the upstream table does not hold what the test appended"
    return [(i, i % 7) for i in ids]


@pytest.mark.campaign_lane  # four pipeline runs on a real Delta table into PostgreSQL (40-90 s)
def test_delta_to_postgres_append_replay_optimize_and_lost_checkpoint(
    spark: SparkSession, tmp_path: Path, pg_url: str
) -> None:
    upstream = tmp_path / "bronze"
    written = append_versions(spark, upstream, range(3))
    p = pg_pipeline(pg_url, upstream, tmp_path / "chk")
    first = p.run(spark, timeout=300)
    # The snapshot of version 2: 9 files, 3 a batch.
    assert first.rows_committed == 3 * ROWS and first.batches_committed == 3, first
    assert pg_rows(pg_url, "d2pg") == appended(upstream, written)

    # A replay: Spark forgot the last batch's commit, the ledger has it; skipped, 0 rows.
    ledger = p.sink.ledger("d2pg")
    forget_commit(tmp_path / "chk", max(e.spark_batch_id or 0 for e in ledger))
    replay = p.run(spark, timeout=300)
    assert replay.batches_skipped == 1 and replay.rows_committed == 0, replay
    assert pg_rows(pg_url, "d2pg") == appended(upstream, written)

    # OPTIMIZE upstream (version 3, dataChange=false), then two appends: only those are new.
    spark.sql(f"OPTIMIZE delta.`{upstream}`").collect()
    written += append_versions(spark, upstream, range(4, 6))
    third = p.run(spark, timeout=300)
    assert third.rows_committed == 2 * ROWS, third
    assert pg_rows(pg_url, "d2pg") == appended(upstream, written)

    # The checkpoint is lost: a new one resumes at the ledger's end (startingVersion 6).
    written += append_versions(spark, upstream, range(6, 7))
    fresh = pg_pipeline(pg_url, upstream, tmp_path / "chk-new")
    fourth = fresh.run(spark, timeout=300)
    assert fourth.resumed_from == "ledger" and fourth.rows_committed == ROWS, fourth
    assert pg_rows(pg_url, "d2pg") == appended(upstream, written)
    entries = fresh.sink.ledger("d2pg")
    assert sum(e.row_count for e in entries) == len(written)
    assert entries[-1].end_offsets == {(entries[-1].ranges.ranges[0].topic, 0): 7 * 2**32}


def test_delta_to_postgres_upsert_by_key_across_optimize_and_lost_checkpoint(
    spark: SparkSession, tmp_path: Path, pg_url: str
) -> None:
    """Upsert by ``k`` (id % 7), the greatest id of a batch winning (``latest_by``): the
    table ends with one row per key, its newest id, through OPTIMIZE and a new checkpoint.
    In ``make test``: two small runs, 8 s measured (load 3)."""
    upstream = tmp_path / "bronze"
    written = append_versions(spark, upstream, range(2))

    def make(checkpoint: str) -> Pipeline:
        return pg_pipeline(
            pg_url,
            upstream,
            tmp_path / checkpoint,
            name="d2pg-up",
            mode="upsert",
            keys=["k"],
            latest_by=["id"],
        )

    def newest(ids: list[int]) -> list[tuple[int, int]]:
        last: dict[int, int] = {}
        for i in sorted(ids):
            last[i % 7] = i
        return sorted((i, k) for k, i in last.items())

    assert make("chk").run(spark, timeout=300).rows_committed > 0
    assert pg_rows(pg_url, "d2pg_up") == newest(appended_ids(upstream, written))
    spark.sql(f"OPTIMIZE delta.`{upstream}`").collect()
    written += append_versions(spark, upstream, range(3, 4))
    fresh = make("chk-new").run(spark, timeout=300)
    # Version 3's 12 rows only (7 keys), not the table again from its start.
    assert fresh.resumed_from == "ledger" and fresh.batches_committed == 1, fresh
    assert fresh.rows_committed == ROWS, fresh
    assert pg_rows(pg_url, "d2pg_up") == newest(appended_ids(upstream, written))


def appended_ids(upstream: Path, written: list[int]) -> list[int]:
    return [i for i, _ in appended(upstream, written)]
