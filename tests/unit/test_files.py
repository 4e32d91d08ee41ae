"""Locations and local files (sparkonce.files), without Spark."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkonce import ConfigError, Pipeline, SQLiteSink
from sparkonce.files import LocalFiles, files_for, is_remote, join, location, scheme
from sparkonce.sources.embedded import EmbeddedLogSource
from sparkonce.spark.checkpoint import Checkpoint


def test_locations_keep_urls_and_resolve_local_paths(tmp_path: Path) -> None:
    assert location(tmp_path / "a" / ".." / "b") == str(tmp_path / "b")
    assert location(f"file://{tmp_path}/c") == str(tmp_path / "c")
    assert location("file://localhost/x/y") == "/x/y"
    assert location("s3a://bucket/dir/") == "s3a://bucket/dir"
    assert location("hdfs://nn:8020/ckpt") == "hdfs://nn:8020/ckpt"
    assert scheme("S3A://b/x") == "s3a" and scheme("/x") == "" and scheme("file:///x") == ""
    assert is_remote("abfs://c@acct.dfs.core.windows.net/x") and not is_remote("file:///x")
    assert join("s3a://b/ck", "offsets", "3") == "s3a://b/ck/offsets/3"


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ("", "is empty"),
        ("   ", "is empty"),
        ("file://otherhost/x", "names host 'otherhost'"),
        ("s3a:///no-bucket", "no bucket or host"),
    ],
)
def test_bad_locations_are_refused_with_the_fix(raw: str, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        location(raw, "checkpoint")


def test_local_files_round_trip_and_keep_a_first_write(tmp_path: Path) -> None:
    f = LocalFiles()
    target = str(tmp_path / "d" / "e.json")
    assert f.read_text(target) is None and f.list_names(str(tmp_path / "d")) == []
    assert f.write_text(target, "one", overwrite=False)
    assert not f.write_text(target, "two", overwrite=False)  # the first write stays
    assert f.read_text(target) == "one"
    assert f.write_text(target, "three", overwrite=True)
    assert f.read_text(target) == "three"
    assert f.list_names(str(tmp_path / "d")) == ["e.json"]  # no temporary file left
    f.delete(str(tmp_path / "d"))
    assert not f.exists(str(tmp_path / "d"))


def test_a_remote_location_without_a_session_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pyspark.sql import SparkSession

    # As in a process that never started Spark (`sparkonce status` on a local checkpoint).
    monkeypatch.setattr(SparkSession, "getActiveSession", classmethod(lambda cls: None))
    assert isinstance(files_for(str(tmp_path)), LocalFiles)
    with pytest.raises(ConfigError, match="no Spark session"):
        files_for("s3a://bucket/ckpt")


def test_a_local_checkpoint_reads_spark_files(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()
    (ck / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"a":1}\n')
    (ck / "offsets" / "1").write_text('v1\n{"batchWatermarkMs":0}\n{"a":2}\n')
    (ck / "offsets" / ".1.crc").write_text("x")
    (ck / "commits" / "0").write_text("v1\n{}\n")
    (ck / "metadata").write_text('{"id":"q-1"}\n')
    c = Checkpoint(f"file://{ck}")
    assert c.location == str(ck) and not c.remote
    assert not c.is_new and c.batch_ids() == [0, 1] and c.last_committed_batch() == 0
    assert c.source_offset(1) == '{"a":2}' and c.source_offset(7) is None
    assert c.query_id() == "q-1" and not c.has_state()
    assert Checkpoint(tmp_path / "missing").is_new


def test_a_pipeline_takes_a_url_checkpoint_but_not_with_stable_output(tmp_path: Path) -> None:
    source = EmbeddedLogSource(tmp_path / "log", "events")
    sink = SQLiteSink(f"sqlite:///{tmp_path / 'o.db'}", "t")
    p = Pipeline(name="p", source=source, sink=sink, checkpoint="s3a://bucket/ck/")
    assert p.checkpoint_location == "s3a://bucket/ck"
    with pytest.raises(ConfigError, match="not a local path"):
        _ = p.checkpoint_path
    with pytest.raises(ConfigError, match="stable output keeps each batch's copy"):
        Pipeline(
            name="p",
            source=source,
            sink=sink,
            checkpoint="s3a://bucket/ck",
            stable_output=True,
        )
    with pytest.raises(ConfigError, match="no bucket or host"):
        Pipeline(name="p", source=source, sink=sink, checkpoint="hdfs:///ck")


def test_the_jars_of_spark_defaults_are_kept_beside_the_pipelines(tmp_path: Path) -> None:
    """A session's spark.jars takes the place of spark-defaults.conf's, so build_session
    reads that file's list (the last spark.jars line, any properties separator) and puts
    it first."""
    from sparkonce.spark.session import defaults_jars

    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text(
        "# a cluster's defaults\n"
        "spark.master  spark://m:7077\n"
        "spark.jars=/old.jar\n"
        "spark.jars   file:/opt/jars/a.jar, hdfs://nn:8020/jars/b.jar\n"
        "spark.jarsx /not-this.jar\n"
    )
    assert defaults_jars({"SPARK_CONF_DIR": str(conf)}) == [
        "file:/opt/jars/a.jar",
        "hdfs://nn:8020/jars/b.jar",
    ]
    (conf / "spark-defaults.conf").write_text("spark.jars:/one.jar\n")
    assert defaults_jars({"SPARK_CONF_DIR": str(conf)}) == ["/one.jar"]
    assert defaults_jars({"SPARK_CONF_DIR": str(tmp_path / "none")}) == []
    home = tmp_path / "home"
    (home / "conf").mkdir(parents=True)
    (home / "conf" / "spark-defaults.conf").write_text("spark.jars /h.jar\n")
    assert defaults_jars({"SPARK_HOME": str(home)}) == ["/h.jar"]


def test_a_hadoop_error_names_its_innermost_java_cause() -> None:
    """A Py4JJavaError's first line names only the call (``o47.exists``); the cause is in
    the Java exception and its ``Caused by`` chain (here as text, with no JVM to ask)."""
    from sparkonce.files import filesystem_error

    text = (
        "An error occurred while calling o47.exists.\n"
        ": java.nio.file.AccessDeniedException: s3a://b/chk: getFileStatus on s3a://b/chk: "
        "org.apache.hadoop.fs.s3a.auth.NoAuthWithAWSException: No AWS Credentials provided\n"
        "\tat org.apache.hadoop.fs.s3a.S3AUtils.translateException(S3AUtils.java:215)\n"
        "Caused by: software.amazon.awssdk.core.exception.SdkClientException: Unable to load "
        "credentials from any of the providers\n"
        "\tat software.amazon.awssdk.core.X(X.java:1)\n"
    )
    message = str(filesystem_error("s3a://b/chk", RuntimeError(text)))
    assert "o47.exists" not in message
    assert "AccessDeniedException: s3a://b/chk" in message
    assert "No AWS Credentials provided" in message
    assert "caused by software.amazon.awssdk.core.exception.SdkClientException" in message
