"""Pipelines whose Spark checkpoint lives on S3 (``s3a://`` on the tests' real S3 server).

The ledger is the truth whatever the checkpoint is on, so the guarantees read the same as
with a local directory: a checkpoint behind the ledger replays and skips, an empty one
resumes from the ledger, one ahead of the ledger is refused, and a stateful pipeline whose
checkpoint (its state) is lost refuses to resume. Every sink family runs here once, and
the checkpoint's objects are read and deleted through boto3, not through Spark.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import (
    CheckpointError,
    CheckpointLostError,
    DeltaSink,
    EmbeddedLogSource,
    KafkaSink,
    Pipeline,
    sink_from_url,
)
from sparkonce.offsets import check_chain
from sparkonce.sinks.inspect import inspector_for
from tests.services.s3 import S3Server

# "delta-s3": the Delta table itself in the bucket too (its log, data files and ledger files).
FAMILIES = ["sqlite", "postgres", "postgres-2pc", "kafka", "delta", "delta-s3"]


def values(df: DataFrame) -> DataFrame:
    return df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def kafka_values(df: DataFrame) -> DataFrame:
    """What a KafkaSink takes: key and value only."""
    return values(df).select("key", F.col("value").cast("string").alias("value"))


def sums(df: DataFrame) -> DataFrame:
    return values(df).groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))


def rows_of(p: Pipeline) -> list[dict[str, Any]]:
    p.sink.open()
    try:
        return inspector_for(p.sink).rows()
    finally:
        p.sink.close()


def ledger_of(p: Pipeline) -> list[Any]:
    p.sink.open()
    try:
        return p.sink.ledger(p.name)
    finally:
        p.sink.close()


def delete_prefix(s3: S3Server, bucket: str, prefix: str) -> list[str]:
    keys = s3.list_keys(bucket, prefix)
    client = s3.client()
    for k in keys:
        client.delete_object(Bucket=bucket, Key=k)
    return keys


def last_commit(s3: S3Server, bucket: str, prefix: str) -> int:
    names = [k.rsplit("/", 1)[-1] for k in s3.list_keys(bucket, f"{prefix}/commits/")]
    return max(int(n) for n in names if n.isdigit())


@pytest.fixture
def sink_of(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str, str], Any]:
    def make(family: str, table: str) -> Any:
        if family == "delta-s3":
            bucket = request.getfixturevalue("s3_bucket")
            return DeltaSink(f"s3a://{bucket}/tables", table=table)
        if family == "sqlite":
            return sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", table)
        if family == "kafka":
            broker = request.getfixturevalue("kafka_broker")
            topic = request.getfixturevalue("kafka_topic")(table, partitions=2)
            return KafkaSink(broker.bootstrap, topic)
        if family == "delta":
            return DeltaSink(tmp_path / "delta", table=table)
        url = request.getfixturevalue("pg_url")
        return sink_from_url(url, table, two_phase=family == "postgres-2pc")

    return make


# SQLite in make test; the other families in the rotation (make test's budget): the
# checkpoint's code path is the same, the sinks differ.
@pytest.mark.parametrize(
    "family",
    [f if f == "sqlite" else pytest.param(f, marks=pytest.mark.campaign_lane) for f in FAMILIES],
)
def test_each_sink_family_with_its_checkpoint_on_s3(
    family: str,
    s3_spark: SparkSession,
    s3: S3Server,
    s3_bucket: str,
    make_log: Callable[..., Path],
    sink_of: Callable[[str, str], Any],
) -> None:
    log_dir = make_log(600, partitions=3)
    p = Pipeline(
        name="s3p",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=100),
        sink=sink_of(family, "events_out"),
        checkpoint=f"s3a://{s3_bucket}/ck",
        transform=kafka_values if family == "kafka" else values,
    )
    report = p.run(s3_spark)
    n = report.batches_committed
    assert n >= 2
    rows = rows_of(p)
    assert sorted(int(r["value"]) for r in rows) == list(range(1, 601))
    # Spark wrote its checkpoint into the bucket.
    keys = set(s3.list_keys(s3_bucket, "ck/"))
    assert {"ck/metadata", "ck/offsets/0", f"ck/offsets/{n - 1}", f"ck/commits/{n - 1}"} <= keys
    if family == "delta-s3":
        table = s3.list_keys(s3_bucket, "tables/events_out/")
        assert any(k.startswith("tables/events_out/_delta_log/") for k in table)
        assert any(k.startswith("tables/events_out/_sparkonce/s3p/entries/") for k in table)

    # A checkpoint behind the ledger (a crash after the sink's commit, before Spark's
    # commit log): the batch replays, and the sink skips it.
    last = last_commit(s3, s3_bucket, "ck")
    delete_prefix(s3, s3_bucket, f"ck/commits/{last}")
    report = p.run(s3_spark)
    assert (report.batches_skipped, report.batches_committed) == (1, 0)
    assert Counter(int(r["value"]) for r in rows_of(p)) == Counter(range(1, 601))
    assert check_chain(e.ranges for e in ledger_of(p)) == []


def test_an_empty_s3_checkpoint_resumes_and_a_foreign_one_is_refused(
    s3_spark: SparkSession,
    s3: S3Server,
    s3_bucket: str,
    make_log: Callable[..., Path],
    tmp_path: Path,
) -> None:
    log_dir = make_log(600, partitions=3)
    source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=100)
    ck = f"s3a://{s3_bucket}/ck"
    p = Pipeline(
        name="s3p",
        source=source,
        sink=sink_from_url(f"sqlite:///{tmp_path / 'a.db'}", "t"),
        checkpoint=ck,
        transform=values,
    )
    p.run(s3_spark)
    # The checkpoint is gone: a stateless pipeline resumes from the ledger's end.
    assert delete_prefix(s3, s3_bucket, "ck/")
    make_log(300, partitions=3, start=601)
    report = p.run(s3_spark)
    assert report.resumed_from == "ledger"
    assert sorted(int(r["value"]) for r in rows_of(p)) == list(range(1, 901))
    assert check_chain(e.ranges for e in ledger_of(p)) == []

    # The same checkpoint with a sink whose ledger is empty: the checkpoint is ahead of
    # the ledger, so resuming from it would skip what this sink never got.
    other = Pipeline(
        name="s3p",
        source=source,
        sink=sink_from_url(f"sqlite:///{tmp_path / 'b.db'}", "t"),
        checkpoint=ck,
        transform=values,
    )
    with pytest.raises(CheckpointError, match="s3a://"):
        other.run(s3_spark)
    assert rows_of(other) == []


@pytest.mark.campaign_lane  # in the rotation: make test's budget
def test_a_stateful_pipeline_keeps_its_state_on_s3(
    s3_spark: SparkSession,
    s3: S3Server,
    s3_bucket: str,
    make_log: Callable[..., Path],
    tmp_path: Path,
) -> None:
    log_dir = make_log(500, partitions=2, keys=5)

    def pipeline() -> Pipeline:
        return Pipeline(
            name="s3sums",
            source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=100),
            sink=sink_from_url(
                f"sqlite:///{tmp_path / 'sums.db'}", "sums", mode="upsert", keys=["key"]
            ),
            checkpoint=f"s3a://{s3_bucket}/ck",
            transform=sums,
        )

    pipeline().run(s3_spark)
    assert any(k.startswith("ck/state/0/") for k in s3.list_keys(s3_bucket, "ck/state/"))
    # A second run on new records adds to the totals kept in the state on S3.
    make_log(250, partitions=2, keys=5, start=501)
    pipeline().run(s3_spark)
    got = {r["key"]: (int(r["total"]), int(r["n"])) for r in rows_of(pipeline())}
    want: dict[str, list[int]] = {}
    for i in range(1, 751):
        t = want.setdefault(f"k{i % 5}", [0, 0])
        t[0] += i
        t[1] += 1
    assert got == {k: (v[0], v[1]) for k, v in want.items()}
    # Without its checkpoint the state is gone: the pipeline refuses to resume.
    delete_prefix(s3, s3_bucket, "ck/")
    with pytest.raises(CheckpointLostError):
        pipeline().run(s3_spark)
