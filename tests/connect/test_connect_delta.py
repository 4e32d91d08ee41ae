"""DeltaSink on a real Spark Connect session: the batch function commits in the server's
Python worker, with no JVM on either side of sparkonce (the table's log read with pyarrow,
writes through Spark's writer and MERGE). The table is read back from its ``_delta_log``
JSON commits and Parquet files with pyarrow, not with sparkonce or Spark."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline
from sparkonce.ledger.delta import app_id, unpack
from tests.connect.test_connect_pipeline import forget_last_commit
from tests.delta.test_delta_log import delta_rows

# In the CI rotation, as the other Connect tests.
pytestmark = pytest.mark.campaign_lane


def values(df: DataFrame) -> DataFrame:
    return df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def by_last_digit(df: DataFrame) -> DataFrame:
    """Key = the value's last digit: unique within a batch of 10 consecutive values."""
    v = values(df)
    return v.select((F.col("value") % 10).cast("string").alias("key"), "value")


def commits(table: Path, pipeline: str) -> list[dict[str, Any]]:
    """Each commit carrying a ``txn`` of ``pipeline``: its operation, its ``(epoch,
    entries)`` and its userMetadata (JSON), read from ``_delta_log/*.json``."""
    out = []
    for path in sorted((table / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        txns = [a["txn"] for a in actions if "txn" in a and a["txn"]["appId"] == app_id(pipeline)]
        if txns:
            info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
            out.append(
                {
                    "op": info["operation"],
                    "txn": unpack(int(txns[0]["version"])),
                    "meta": json.loads(info.get("userMetadata") or "{}"),
                    "rows": info.get("operationMetrics", {}),
                }
            )
    return out


def test_append_on_connect_is_exact_and_a_replay_after_a_restart_is_skipped(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(90, partitions=3)
    table = tmp_path / "t"
    p = Pipeline(
        name="d1",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=10),
        sink=DeltaSink(table),
        checkpoint=tmp_path / "chk",
        transform=values,
    )
    report = p.run(connect_spark)
    assert sorted(r["value"] for r in delta_rows(table)) == list(range(1, 91))
    batches = [c for c in commits(table, "d1") if c["meta"].get("sparkonce") == "batch"]
    assert report.batches_committed == len(batches) >= 2, report
    assert [c["txn"] for c in batches] == [(1, n) for n in range(1, len(batches) + 1)]
    assert report.rows_committed == 90
    assert sum(int(c["rows"]["numOutputRows"]) for c in batches) == 90

    # A restart replays the batch Spark forgot; new records follow it.
    replayed = forget_last_commit(tmp_path / "chk")
    make_log(30, partitions=3, start=91)
    again = p.run(connect_spark)
    assert again.epoch == 2
    assert again.batches_skipped == 1, again
    counts = Counter(r["value"] for r in delta_rows(table))
    assert sorted(counts) == list(range(1, 121))
    assert set(counts.values()) == {1}, {v: n for v, n in counts.items() if n > 1}
    batches = [c for c in commits(table, "d1") if c["meta"].get("sparkonce") == "batch"]
    assert [c["meta"]["spark_batch_id"] for c in batches].count(replayed) == 1
    assert [c["txn"][1] for c in batches] == list(range(1, len(batches) + 1))
    ledger = p.sink.ledger("d1")  # the user's process reads the ledger without a JVM
    assert [(e.seq, e.epoch, e.row_count) for e in ledger] == [
        (c["meta"]["seq"], c["txn"][0], int(c["rows"]["numOutputRows"])) for c in batches
    ]


def test_upsert_on_connect_merges_by_key_and_a_replay_merges_nothing_twice(
    connect_spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(60, partitions=1)
    table = tmp_path / "t"
    p = Pipeline(
        name="d2",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=10),
        sink=DeltaSink(table, mode="upsert", keys=["key"]),
        checkpoint=tmp_path / "chk",
        transform=by_last_digit,
    )
    report = p.run(connect_spark)
    assert report.batches_committed == 6, report
    assert {r["key"]: r["value"] for r in delta_rows(table)} == {
        str(d): 50 + (d or 10) for d in range(10)
    }
    merges = [c for c in commits(table, "d2") if c["op"] == "MERGE"]
    assert [c["txn"] for c in merges] == [(1, n) for n in range(1, 7)]

    forget_last_commit(tmp_path / "chk")
    make_log(10, partitions=1, start=61)
    again = p.run(connect_spark)
    assert again.batches_skipped == 1 and again.batches_committed == 1, again
    merges = [c for c in commits(table, "d2") if c["op"] == "MERGE"]
    assert [c["txn"] for c in merges] == [(1, n) for n in range(1, 7)] + [(2, 7)]
    assert {r["key"]: r["value"] for r in delta_rows(table)} == {
        str(d): 60 + (d or 10) for d in range(10)
    }


_S3_DELTA_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline

pipeline = Pipeline(
    name="d3",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=10),
    sink=DeltaSink({table!r}),
    checkpoint={checkpoint!r},
    transform=lambda df: df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    ),
)
"""


def test_a_table_on_s3_on_connect_is_exact_across_a_replay(
    tmp_path: Path, make_log: Callable[..., Path], s3: Any, s3_bucket: str
) -> None:
    """A Delta table at an ``s3a://`` URL (moto): the server writes it through S3A, the
    client and the server's Python worker read its log through pyarrow with the keys from
    the AWS environment. A replay after Spark forgot its last batch is skipped; the table,
    copied down with boto3 and read with pyarrow, holds every value once."""
    import subprocess
    import sys

    from tests.connect.conftest import s3_connect_server
    from tests.connect.test_connect_pipeline import client_env

    checkpoint = tmp_path / "chk"
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _S3_DELTA_PIPELINE.format(
            log=str(make_log(60, partitions=2)),
            table=f"s3a://{s3_bucket}/tables/t",
            checkpoint=str(checkpoint),
        )
    )
    server, keys = s3_connect_server(tmp_path, s3)
    run = [sys.executable, "-m", "sparkonce", "run", str(pipeline_file), "--remote", server.url]
    env = {**client_env(), **keys}
    try:
        first = subprocess.run(run, capture_output=True, text=True, env=env, timeout=600)
        assert first.returncode == 0, first.stderr[-3000:]
        forget_last_commit(checkpoint)
        make_log(20, partitions=2, start=61)
        again = subprocess.run(run, capture_output=True, text=True, env=env, timeout=600)
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        server.stop()
    assert "skipped 1 replayed batch" in again.stdout, (again.stdout + again.stderr)[-3000:]
    copy = tmp_path / "copy"
    client = s3.client()
    for key in s3.list_keys(s3_bucket, "tables/t/"):
        target = copy / key[len("tables/t/") :]
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(s3_bucket, key, str(target))
    counts = Counter(r["value"] for r in delta_rows(copy))
    assert sorted(counts) == list(range(1, 81)) and set(counts.values()) == {1}
    batches = [c for c in commits(copy, "d3") if c["meta"].get("sparkonce") == "batch"]
    assert [c["txn"] for c in batches][-1][0] == 2  # the second run's epoch committed last
