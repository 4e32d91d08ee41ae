"""The S3-compatible test server (moto, tests/services/s3.py) and Spark on ``s3a://`` paths.

What later work on checkpoints in shared storage stands on: the server answers a plain S3
client, the shared SparkSession reads and writes files through Hadoop's S3A filesystem, and
a stateful streaming query keeps its whole checkpoint (offset log, commit log, source log,
state store) in a bucket and resumes from it. What the bucket holds is always read with
boto3, straight from the server, never through Spark or Hadoop.
"""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce.spark.jars import (
    AWS_SDK_BUNDLE_VERSION,
    HADOOP_AWS_VERSION,
    S3_ANALYTICS_ACCELERATOR_VERSION,
    pyspark_hadoop_version,
)
from tests.services import s3 as s3_service
from tests.services.s3 import S3Server

pytestmark = pytest.mark.s3

POM = Path(__file__).resolve().parents[2] / "jars" / "pom.xml"


def test_jar_pins_match_pyspark_and_pom() -> None:
    """hadoop-aws must be the Hadoop pyspark ships, and the pom must fetch what
    ``s3_jars()`` looks for: a pyspark upgrade that moves Hadoop fails here, by name,
    rather than as a class-loading error in the middle of a Spark test."""
    pom = POM.read_text()

    def prop(name: str) -> str:
        found = re.search(rf"<{re.escape(name)}>([^<]+)</{re.escape(name)}>", pom)
        assert found, f"jars/pom.xml has no <{name}>"
        return found.group(1)

    assert pyspark_hadoop_version() == HADOOP_AWS_VERSION
    assert prop("hadoop-aws.version") == HADOOP_AWS_VERSION
    assert prop("aws-sdk-bundle.version") == AWS_SDK_BUNDLE_VERSION
    assert prop("s3-analytics-accelerator.version") == S3_ANALYTICS_ACCELERATOR_VERSION


def test_boto3_round_trip(s3: S3Server, s3_bucket: str) -> None:
    client = s3.client()
    client.put_object(Bucket=s3_bucket, Key="dir/a.txt", Body=b"alpha")
    client.put_object(Bucket=s3_bucket, Key="dir/b.txt", Body=b"beta")
    client.put_object(Bucket=s3_bucket, Key="other.txt", Body=b"gamma")

    assert client.get_object(Bucket=s3_bucket, Key="dir/a.txt")["Body"].read() == b"alpha"
    assert s3.list_keys(s3_bucket, "dir/") == ["dir/a.txt", "dir/b.txt"]
    assert s3.list_keys(s3_bucket) == ["dir/a.txt", "dir/b.txt", "other.txt"]
    assert s3.create_bucket(s3_bucket) == s3_bucket  # our own bucket again: no error


def test_start_failure_shows_the_server_log(tmp_path: Path) -> None:
    """A server that cannot start fails with the end of its own log, not a bare timeout."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind((s3_service.HOST, 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(RuntimeError, match=r"(?s)exited with code .*in use"):
            s3_service.start(tmp_path / "s3", port=port)
    assert not (tmp_path / "s3" / s3_service.PID_NAME).exists()


@pytest.mark.spark
def test_spark_parquet_round_trip(s3_spark: SparkSession, s3: S3Server, s3_bucket: str) -> None:
    path = f"s3a://{s3_bucket}/tables/numbers"
    df = s3_spark.range(100).withColumn("square", F.col("id") * F.col("id"))
    df.write.parquet(path)

    back = s3_spark.read.parquet(path)
    assert sorted(back.collect()) == sorted(df.collect())
    keys = s3.list_keys(s3_bucket, "tables/numbers/")
    assert "tables/numbers/_SUCCESS" in keys
    assert any(k.endswith(".parquet") for k in keys), keys
    # The job's staging directory is gone once the job committed.
    assert not [k for k in keys if "_temporary" in k], keys


def _count_query(spark: SparkSession, source_dir: Path) -> DataFrame:
    """Words per key over a directory of text files, one file per micro-batch."""
    lines = spark.readStream.option("maxFilesPerTrigger", 1).text(str(source_dir))
    return lines.groupBy("value").count()


def _run_available_now(
    spark: SparkSession, source_dir: Path, checkpoint: str
) -> tuple[list[int], dict[str, int]]:
    """Run the count query until the files there now are done; return the batch ids it ran
    and the last batch's counts (complete mode: every key)."""
    batches: list[int] = []
    counts: dict[str, int] = {}

    def collect(df: DataFrame, batch_id: int) -> None:
        batches.append(batch_id)
        counts.clear()
        counts.update({row["value"]: row["count"] for row in df.collect()})

    query = (
        _count_query(spark, source_dir)
        .writeStream.outputMode("complete")
        .option("checkpointLocation", checkpoint)
        .foreachBatch(collect)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(180)
    finally:
        query.stop()
    assert query.exception() is None, query.exception()
    return batches, counts


@pytest.mark.spark
def test_stateful_query_checkpoint_on_s3a_resumes(
    s3_spark: SparkSession, s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """A groupBy count with its checkpoint at ``s3a://bucket/ckpt``: the bucket holds the
    offset log, the commit log and the state store's files, and a second run from that
    checkpoint continues the batch ids and the counts.

    How Spark writes a checkpoint file on s3a, and why it says nothing about it: its default
    checkpoint file manager uses Hadoop's FileContext API, writes each log entry and state
    file to a hidden ``.<name>.<uuid>.tmp`` object and renames it to its final name. Spark
    only warns that rename may not be atomic when a filesystem has no FileContext binding
    and it falls back to the FileSystem API; S3A has one (Hadoop's own defaults register
    it), so Spark goes ahead silently. But S3 has no rename: S3A checks that the final name
    is free (a HEAD request), copies the object and deletes the temporary one (as moto's
    request log shows). The object appears whole (an S3 PUT or copy is all or nothing), yet
    the check and the copy are two steps, so two drivers writing the same batch id can both
    "succeed", the later one overwriting, where HDFS would have failed the second rename. A
    driver killed between copy and delete leaves a ``.tmp`` object behind, which Spark's
    log reader skips. One driver per checkpoint is therefore the user's job on s3a; in
    sparkonce the sinks' epoch fencing keeps a second driver from committing output. Each
    such write costs about 20 requests (existence probes, PUT, copy, DELETE).
    """
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-1.txt").write_text("a\nb\na\n")
    (source / "part-2.txt").write_text("b\nc\n")
    checkpoint = f"s3a://{s3_bucket}/ckpt"

    batches, counts = _run_available_now(s3_spark, source, checkpoint)
    assert batches == [0, 1]
    assert counts == {"a": 2, "b": 2, "c": 1}

    keys = s3.list_keys(s3_bucket, "ckpt/")
    for expected in ("ckpt/metadata", "ckpt/offsets/0", "ckpt/offsets/1"):
        assert expected in keys, keys
    assert "ckpt/commits/0" in keys and "ckpt/commits/1" in keys, keys
    assert [k for k in keys if k.startswith("ckpt/sources/0/")], keys
    state = [k for k in keys if k.startswith("ckpt/state/")]
    assert state, f"no state store files under ckpt/state/: {keys}"
    # Temporary files were all renamed into place (copied, then deleted).
    assert not [k for k in keys if k.endswith(".tmp")], keys

    (source / "part-3.txt").write_text("c\nd\n")
    batches, counts = _run_available_now(s3_spark, source, checkpoint)
    assert batches == [2], "the second run did not resume from the s3a checkpoint"
    # The counts of the first run came back from the state store in the bucket.
    assert counts == {"a": 2, "b": 2, "c": 2, "d": 1}
    keys = s3.list_keys(s3_bucket, "ckpt/")
    assert "ckpt/offsets/2" in keys and "ckpt/commits/2" in keys, keys
