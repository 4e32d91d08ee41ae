"""ArrowFiles on the tests' real S3 server (moto): the same behaviour as LocalFiles and as
HadoopFiles through S3A, and a checkpoint Spark wrote into the bucket reads the same through
pyarrow, with the settings taken from the session, as through Spark's own Hadoop filesystem.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkonce.errors import ConfigError
from sparkonce.files import ArrowFiles, ArrowSettings, Files, HadoopFiles, LocalFiles, join
from sparkonce.spark.checkpoint import Checkpoint
from tests.s3.test_s3_service import _run_available_now
from tests.services.s3 import S3Server, s3a_settings


def moto_settings(s3: S3Server) -> ArrowSettings:
    """What a session configured for the tests' server gives (tests/services/s3.py)."""
    prefix = "spark.hadoop."
    return ArrowSettings.from_hadoop({k[len(prefix) :]: v for k, v in s3a_settings(s3).items()})


def check_files_behave(files: Files, root: str) -> None:
    """What sparkonce needs of any Files, on a root that does not exist yet."""
    d = join(root, "d")
    target = join(d, "e.json")
    assert files.read_text(target) is None and files.read_bytes(target) is None
    assert files.list_names(d) == [] and not files.exists(d) and not files.is_dir(d)
    files.check_writable_dir(root, "checkpoint")  # missing: it can become one
    assert files.write_text(target, "one", overwrite=False)
    assert not files.write_text(target, "two", overwrite=False)  # the first write stays
    assert files.read_text(target) == "one"
    assert files.write_text(target, "three, ü", overwrite=True)
    assert files.read_bytes(target) == "three, ü".encode()
    assert files.exists(target) and not files.is_dir(target)
    assert files.exists(d) and files.is_dir(d)
    assert files.list_names(d) == ["e.json"]  # no temporary file left
    with pytest.raises(ConfigError, match="is a file, not a directory"):
        files.check_writable_dir(target, "checkpoint")
    files.check_writable_dir(d, "checkpoint")
    assert files.write_text(join(d, "sub", "f"), "x", overwrite=False)
    assert sorted(files.list_names(d)) == ["e.json", "sub"]
    files.delete(join(d, "e.json"))
    assert files.list_names(d) == ["sub"] and files.read_text(target) is None
    files.delete(d)  # with what it holds
    assert not files.exists(d) and files.read_text(join(d, "sub", "f")) is None
    assert "d" not in files.list_names(root)
    files.delete(d)  # missing: nothing to do


@pytest.mark.parametrize(
    "kind", ["local", "arrow-s3", pytest.param("hadoop-s3a", marks=pytest.mark.spark)]
)
def test_every_files_behaves_alike(
    kind: str, request: pytest.FixtureRequest, s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    if kind == "local":
        check_files_behave(LocalFiles(), str(tmp_path / "root"))
        return
    if kind == "arrow-s3":
        files: Files = ArrowFiles(moto_settings(s3))
    else:
        files = HadoopFiles(request.getfixturevalue("s3_spark"))
    check_files_behave(files, f"s3a://{s3_bucket}/root")
    if kind == "arrow-s3":  # written in place: no temporary object was ever made
        assert not [k for k in s3.list_keys(s3_bucket) if ".tmp" in k]


def test_s3_and_s3a_urls_are_the_same_objects(s3: S3Server, s3_bucket: str) -> None:
    files = ArrowFiles(moto_settings(s3))
    assert files.write_text(f"s3a://{s3_bucket}/x/f", "a", overwrite=False)
    assert files.read_text(f"s3://{s3_bucket}/x/f") == "a"
    assert s3.list_keys(s3_bucket) == ["x/f"]
    with pytest.raises(ConfigError, match="whole bucket"):
        files.delete(f"s3a://{s3_bucket}")
    assert s3.list_keys(s3_bucket) == ["x/f"]


def test_an_unreachable_endpoint_is_a_clear_error_at_the_check(s3: S3Server) -> None:
    settings = ArrowSettings.from_hadoop(
        {
            "fs.s3a.endpoint": "http://127.0.0.1:9",  # the discard port: nothing listens
            "fs.s3a.access.key": "k",
            "fs.s3a.secret.key": "never-shown",
            "fs.s3a.attempts.maximum": "1",
            "fs.s3a.connection.establish.timeout": "2s",
        }
    )
    with pytest.raises(ConfigError) as err:
        Checkpoint.open("s3a://b/ck", settings=settings).check_usable()
    message = str(err.value)
    assert "s3a://b/ck cannot be reached through pyarrow's S3 client (endpoint 127.0.0.1:9)" in (
        message
    )
    assert "never-shown" not in message and "(keys)" in message


def test_a_spark_checkpoint_on_s3_reads_the_same_through_pyarrow(
    s3_spark: SparkSession, s3: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """A stateful query's checkpoint, written into the bucket by Spark through S3A, read
    through HadoopFiles and through ArrowFiles with the settings taken from the session
    (on a classic session: its Hadoop configuration, where the fixture put them)."""
    source = tmp_path / "in"
    source.mkdir()
    (source / "part-1.txt").write_text("a\nb\na\n")
    (source / "part-2.txt").write_text("b\nc\n")
    location = f"s3a://{s3_bucket}/ck"
    batches, _ = _run_available_now(s3_spark, source, location)
    assert batches == [0, 1]

    settings = ArrowSettings.of(s3_spark)
    expected = moto_settings(s3)
    assert (settings.endpoint, settings.scheme, settings.region, settings.path_style) == (
        expected.endpoint,
        "http",
        expected.region,
        True,
    )
    assert (settings.access_key, settings.secret_key) == (s3.access_key, s3.secret_key)
    hadoop = Checkpoint(location, HadoopFiles(s3_spark))
    arrow = Checkpoint.open(location, settings=settings)
    assert isinstance(arrow.files, ArrowFiles)
    assert hadoop.batch_ids() == arrow.batch_ids() == [0, 1]
    assert hadoop.batch_ids("commits") == arrow.batch_ids("commits") == [0, 1]
    assert hadoop.last_committed_batch() == arrow.last_committed_batch() == 1
    assert hadoop.query_id() == arrow.query_id() is not None
    assert hadoop.has_state() and arrow.has_state()
    for b in (0, 1):
        assert hadoop.source_offset(b) == arrow.source_offset(b) is not None
        assert hadoop.read_text("commits", str(b)) == arrow.read_text("commits", str(b))
    assert arrow.source_offset(9) is None and arrow.read_text("nothing", "here") is None
    assert arrow.clear_unplanned_debris() == []
    arrow.check_usable()
    assert not arrow.is_new and Checkpoint.open(f"{location}-fresh", settings=settings).is_new
