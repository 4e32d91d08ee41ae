"""ArrowFiles' settings and choices without Spark or a server: the S3A settings a session
gives, read as S3A reads them, secrets out of every repr and message, pickled for the Spark
server's Python worker, the files a location gets on a Connect session, and the clear
errors for what pyarrow cannot reach. Their reads and writes on a real S3 server are in
tests/s3/test_files_s3.py."""

from __future__ import annotations

import pickle
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkonce.errors import ConfigError
from sparkonce.files import (
    ArrowFiles,
    ArrowSettings,
    HadoopFiles,
    LocalFiles,
    arrow_error,
    files_for,
)
from sparkonce.spark.checkpoint import Checkpoint

SECRET = "s3cr3t-value-never-shown"
TOKEN = "t0ken-value-never-shown"
MOTO_LIKE = {
    "fs.s3a.endpoint": "http://127.0.0.1:9000",
    "fs.s3a.endpoint.region": "us-east-1",
    "fs.s3a.path.style.access": "true",
    "fs.s3a.access.key": "AKIAEXAMPLE",
    "fs.s3a.secret.key": SECRET,
    "fs.s3a.session.token": TOKEN,
    "fs.s3a.connection.establish.timeout": "15s",
    "fs.s3a.connection.timeout": "200000",
    "fs.s3a.attempts.maximum": "2",
}


def test_settings_read_the_s3a_names_as_s3a_does() -> None:
    s = ArrowSettings.from_hadoop(MOTO_LIKE)
    assert (s.endpoint, s.scheme, s.region, s.path_style) == (
        "127.0.0.1:9000",
        "http",
        "us-east-1",
        True,
    )
    assert (s.access_key, s.secret_key, s.session_token) == ("AKIAEXAMPLE", SECRET, TOKEN)
    # "15s" and a bare number, which S3A reads as milliseconds.
    assert (s.connect_timeout_s, s.request_timeout_s, s.max_attempts) == (15.0, 200.0, 2)
    options = s.s3_options()
    assert options["endpoint_override"] == "127.0.0.1:9000" and options["scheme"] == "http"
    assert options["force_virtual_addressing"] is False  # path style, as S3A was told
    assert options["session_token"] == TOKEN and options["retry_strategy"] is not None

    # An endpoint without a scheme: TLS unless fs.s3a.connection.ssl.enabled says otherwise;
    # the bucket in the host name unless path style is asked for.
    s = ArrowSettings.from_hadoop(
        {"fs.s3a.endpoint": "minio.local:9000", "fs.s3a.connection.ssl.enabled": "FALSE"}
    )
    assert (s.endpoint, s.scheme) == ("minio.local:9000", "http")
    assert s.s3_options()["force_virtual_addressing"] is True
    # Nothing set, or S3A's own default endpoint: AWS, with the default credential chain.
    for conf in ({}, {"fs.s3a.endpoint": "s3.amazonaws.com", "fs.s3a.endpoint.region": " "}):
        s = ArrowSettings.from_hadoop(conf)
        assert s == ArrowSettings() and s.credentials == "default AWS chain"
        assert "endpoint_override" not in s.s3_options()
        assert "access_key" not in s.s3_options()
    provider = "org.apache.hadoop.fs.s3a.AnonymousAWSCredentialsProvider"
    anonymous = ArrowSettings.from_hadoop({"fs.s3a.aws.credentials.provider": provider})
    assert anonymous.anonymous and anonymous.s3_options()["anonymous"] is True


@pytest.mark.parametrize(
    ("conf", "says"),
    [
        ({"fs.s3a.secret.key": SECRET}, "secret.key is set without spark.hadoop.fs.s3a.access"),
        ({"fs.s3a.access.key": "AKIA"}, "access.key is set without spark.hadoop.fs.s3a.secret"),
        ({"fs.s3a.attempts.maximum": "0"}, "give a whole number of attempts"),
        ({"fs.s3a.connection.timeout": "soon"}, "not a duration"),
    ],
)
def test_settings_s3a_would_refuse_are_refused_by_name(conf: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match=says) as err:
        ArrowSettings.from_hadoop(conf)
    assert SECRET not in str(err.value)


def test_the_secrets_are_in_no_repr_str_or_message() -> None:
    s = ArrowSettings.from_hadoop(MOTO_LIKE)
    files = ArrowFiles(s)
    shown = [repr(s), str(s), f"{s}", repr(files), repr(Checkpoint("s3a://b/ck", files))]
    shown.append(str(arrow_error("s3a://b/ck", OSError("AWS Error ACCESS_DENIED"), s)))
    for text in shown:
        assert SECRET not in text and TOKEN not in text and "AKIAEXAMPLE" not in text, text
    assert "credentials='session keys'" in repr(s) and "127.0.0.1:9000" in repr(s)
    assert "(session keys)" in shown[-1] and "ACCESS_DENIED" in shown[-1]


def test_settings_and_files_pickle_for_the_servers_python_worker(tmp_path: Path) -> None:
    s = ArrowSettings.from_hadoop(MOTO_LIKE)
    assert pickle.loads(pickle.dumps(s)) == s
    files = ArrowFiles(s)
    files._fs[("s3a", "b")] = object()  # a made filesystem stays where it was made
    back = pickle.loads(pickle.dumps(files))
    assert back.settings == s and back._fs == {}
    # What the batch function does where it runs: no session, the settings it carried.
    ck = Checkpoint.open("s3a://bucket/ck/", settings=s)
    assert isinstance(ck.files, ArrowFiles) and ck.files.settings == s
    assert ck.location == "s3a://bucket/ck" and ck.remote
    local = Checkpoint.open(tmp_path / "ck", settings=s)
    assert isinstance(local.files, LocalFiles) and local.is_new


class _ConnectConf:
    def __init__(self, conf: dict[str, str]) -> None:
        self.getAll = conf


def _connect_session(conf: dict[str, str]) -> Any:
    """An object that is a Spark Connect session by sparkonce's rule (its class's module),
    with a ``spark.conf`` whose ``getAll`` is ``conf``; it has no ``_jvm`` or ``_jsc``."""
    cls = type("SparkSession", (), {"__module__": "pyspark.sql.connect.session"})
    session = cls()
    session.conf = _ConnectConf(conf)
    return session


def test_a_connect_session_reads_remote_locations_through_pyarrow(tmp_path: Path) -> None:
    conf = {f"spark.hadoop.{k}": v for k, v in MOTO_LIKE.items()}
    conf["spark.sql.shuffle.partitions"] = "2"
    spark = _connect_session(conf)
    files = files_for("s3a://bucket/ck", spark)
    assert isinstance(files, ArrowFiles)
    assert files.settings == ArrowSettings.from_hadoop(MOTO_LIKE)
    assert isinstance(files_for(str(tmp_path), spark), LocalFiles)
    assert ArrowSettings.of(spark) == files.settings
    # What a real Connect server gives: its secret settings are left out of getAll (seen
    # on PySpark 4.2's), so the credentials are the AWS chain's where the files are read.
    hidden = ("access.key", "secret.key", "session.token", "credentials.provider")
    given = {k: v for k, v in conf.items() if not k.endswith(hidden)}
    settings = ArrowSettings.of(_connect_session(given))
    assert settings.credentials == "default AWS chain" and settings.endpoint == "127.0.0.1:9000"
    assert "access_key" not in settings.s3_options()
    # A classic session still reads through its JVM (HadoopFiles asks for it).
    classic = SimpleNamespace(_jvm=object(), _jsc=SimpleNamespace(hadoopConfiguration=dict))
    assert isinstance(files_for("s3a://bucket/ck", classic), HadoopFiles)  # type: ignore[arg-type]


def test_a_scheme_pyarrow_does_not_reach_is_refused_with_the_ways_out() -> None:
    ck = Checkpoint.open("abfs://c@acct.dfs.core.windows.net/ck", settings=ArrowSettings())
    with pytest.raises(ConfigError) as err:
        ck.check_usable()
    message = str(err.value)
    assert "not abfs://" in message and "s3a://, s3://, hdfs://" in message
    assert "a local path" in message and "classic Spark session" in message
    with pytest.raises(ConfigError, match="not gs://"):
        _ = Checkpoint.open("gs://b/ck", settings=ArrowSettings()).is_new


def test_hdfs_without_libhdfs_names_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyarrow's HDFS client loads libjvm and libhdfs into the process; here libhdfs is
    nowhere (its directory is an empty one), so the first use fails, with the way out,
    and no name node is ever asked."""
    monkeypatch.setenv("ARROW_LIBHDFS_DIR", str(tmp_path))
    monkeypatch.delenv("HADOOP_HOME", raising=False)
    ck = Checkpoint.open("hdfs://namenode:8020/ck", settings=ArrowSettings())
    with pytest.raises(ConfigError) as err:
        ck.check_usable()
    message = str(err.value)
    assert message.startswith("hdfs://namenode:8020/ck: ") and "Unable to load lib" in message
    assert "ARROW_LIBHDFS_DIR" in message and "JAVA_HOME" in message
    assert "classic Spark session" in message and "dlopen" not in message
