"""A checkpoint read through Spark's Hadoop filesystem (the route every non-local URL takes)
reads exactly what the local route reads, on a checkpoint Spark itself wrote."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from sparkonce import ConfigError
from sparkonce.files import HadoopFiles, LocalFiles
from sparkonce.spark.checkpoint import Checkpoint


def _stateful_checkpoint(spark: SparkSession, where: Path) -> None:
    """Two batches of a real stateful query (a count per key) with its checkpoint at ``where``."""
    src = where.parent / "in"
    src.mkdir()
    for i in range(2):
        (src / f"{i}.json").write_text("\n".join(f'{{"k": "k{j % 3}"}}' for j in range(5)))
    q = (
        spark.readStream.schema("k string")
        .option("maxFilesPerTrigger", 1)
        .json(str(src))
        .groupBy("k")
        .agg(F.count(F.lit(1)).alias("n"))
        .writeStream.format("noop")
        .outputMode("update")
        .option("checkpointLocation", str(where))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()


def test_hadoop_and_local_reads_of_a_spark_checkpoint_agree(
    spark: SparkSession, tmp_path: Path
) -> None:
    where = tmp_path / "ck"
    _stateful_checkpoint(spark, where)
    local = Checkpoint(where, LocalFiles())
    hadoop = Checkpoint(f"file://{where}", HadoopFiles(spark))
    assert local.batch_ids() == hadoop.batch_ids() == [0, 1]
    assert local.batch_ids("commits") == hadoop.batch_ids("commits") == [0, 1]
    assert local.query_id() == hadoop.query_id() is not None
    assert local.has_state() and hadoop.has_state()
    for b in (0, 1):
        assert local.source_offset(b) == hadoop.source_offset(b) is not None
    assert hadoop.source_offset(9) is None and hadoop.read_text("nothing", "here") is None
    hadoop.check_usable()
    assert Checkpoint(tmp_path / "fresh", HadoopFiles(spark)).is_new


def test_hadoop_files_write_keep_and_list(spark: SparkSession, tmp_path: Path) -> None:
    files = HadoopFiles(spark)
    target = str(tmp_path / "d" / "f.txt")
    assert files.write_text(target, "first", overwrite=False)
    assert not files.write_text(target, "second", overwrite=False)
    assert files.read_text(target) == "first"
    assert files.write_text(target, "third", overwrite=True)
    assert files.read_text(target) == "third"
    assert [n for n in files.list_names(str(tmp_path / "d")) if not n.startswith(".")] == ["f.txt"]
    assert files.list_names(str(tmp_path / "none")) == []
    files.delete(str(tmp_path / "d"))
    assert not files.exists(str(tmp_path / "d"))


def test_a_scheme_spark_cannot_reach_is_a_clear_error(spark: SparkSession) -> None:
    ck = Checkpoint.open("nosuchfs://bucket/ck", spark)
    with pytest.raises(ConfigError, match=r"Spark has no Hadoop filesystem for nosuchfs://"):
        ck.check_usable()
    with pytest.raises(ConfigError, match=r"spark\.jars"):
        _ = ck.is_new


def test_a_file_where_the_checkpoint_should_be_is_refused(
    spark: SparkSession, tmp_path: Path
) -> None:
    (tmp_path / "ck").write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        Checkpoint(f"file://{tmp_path / 'ck'}", HadoopFiles(spark)).check_usable()
