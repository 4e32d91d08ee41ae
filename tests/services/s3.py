"""A throwaway S3-compatible server for the tests and for local use: moto's standalone server.

``start(DIR)`` runs ``python -m moto.server`` (the ``moto[server]`` package pinned in the dev
extras) in its own process group on 127.0.0.1 and a free port, and waits until it answers an
S3 ``ListBuckets`` request. ``stop(DIR)`` stops it: SIGTERM, then SIGKILL to the process group
after 10 s. Files in DIR::

    DIR/moto.log   the server's stdout and stderr (one line per request)
    DIR/moto.pid   pid of the running server (also its process group)
    DIR/moto.port  its port, so that a second ``start(DIR)`` finds the running one

moto keeps every bucket and object in the server's memory: a restart loses them, which is
what a test server should do. It accepts any access key and secret (it checks signatures'
form, not their keys), so :data:`ACCESS_KEY` and :data:`SECRET_KEY` are made up. Bucket names
follow S3's rules (3 to 63 characters: lower-case letters, digits, dots and hyphens).

Spark reaches it through Hadoop's S3A filesystem (``s3a://bucket/path``; the jars come from
:func:`sparkonce.spark.jars.s3_jars`). :func:`s3a_settings` gives the ``spark.hadoop.*``
settings for a new session, and :func:`apply_s3a_settings` sets the same on a running one (the
tests share one SparkSession, built before any test asks for this server).

Command line (from the repository root)::

    python -m tests.services.s3 start DIR [--port N]   # prints the endpoint URL
    python -m tests.services.s3 stop DIR

If ``SPARKONCE_TEST_S3_ENDPOINT`` is set (``http://host:port``), :func:`session_server` uses that
server instead of starting one, with the keys in ``SPARKONCE_TEST_S3_ACCESS_KEY`` and
``SPARKONCE_TEST_S3_SECRET_KEY`` (default: the made-up ones, which suit another moto server).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tests.services.process import (
    HOST,
    ProcFacts,
    ServiceProcesses,
    command_line,
    free_port,
    log_tail,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "S3Server",
    "apply_s3a_settings",
    "s3a_settings",
    "session_server",
    "start",
    "stop",
]

ACCESS_KEY = "sparkonce-test-access-key"
SECRET_KEY = "sparkonce-test-secret-key"
# moto keeps buckets per region; S3A signs every request for this one (fs.s3a.endpoint.region).
REGION = "us-east-1"
ENV_ENDPOINT = "SPARKONCE_TEST_S3_ENDPOINT"
ENV_ACCESS_KEY = "SPARKONCE_TEST_S3_ACCESS_KEY"
ENV_SECRET_KEY = "SPARKONCE_TEST_S3_SECRET_KEY"
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 2.0

LOG_NAME = "moto.log"
PID_NAME = "moto.pid"
PORT_NAME = "moto.port"
SERVER_MODULE = "moto.server"
_ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")

# Where S3A finds its keys: the two settings below and nothing else (no environment variables,
# no ~/.aws profile, no instance metadata service, which would make a test hang on a machine
# with AWS credentials or slow down on one without).
SIMPLE_CREDENTIALS_PROVIDER = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"


def _is_server_of(facts: ProcFacts, workdir: pathlib.Path) -> bool:
    return SERVER_MODULE.encode() in facts.cmdline and facts.cwd == workdir.resolve()


# The servers: the ones this Python process started are kept so that they can be reaped (a
# zombie still answers kill(pid, 0)).
_servers = ServiceProcesses(PID_NAME, _is_server_of)


@dataclasses.dataclass
class S3Server:
    """A running S3-compatible server. ``workdir`` and ``pid`` are None for an external one."""

    endpoint: str
    workdir: pathlib.Path | None
    pid: int | None
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY
    region: str = REGION

    @property
    def port(self) -> int:
        return int(self.endpoint.rsplit(":", 1)[1].rstrip("/"))

    def client(self) -> Any:
        """A boto3 S3 client for this server (path-style addressing, as S3A uses)."""
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def create_bucket(self, name: str) -> str:
        """Create bucket ``name`` (an existing one of ours is fine); return its name."""
        client = self.client()
        with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
            client.create_bucket(Bucket=name)
        return name

    def list_keys(self, bucket: str, prefix: str = "") -> list[str]:
        """Every key in ``bucket`` that starts with ``prefix``, sorted, read straight from the
        server (not through Spark or Hadoop)."""
        paginator = self.client().get_paginator("list_objects_v2")
        keys: list[str] = []
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return sorted(keys)

    def spark_conf(self) -> dict[str, str]:
        """:func:`s3a_settings` for this server."""
        return s3a_settings(self)

    def stop(self) -> None:
        """Stop the server (SIGTERM; SIGKILL after 10 s). Its buckets are gone."""
        if self.workdir is None:
            raise RuntimeError(f"cannot stop the external S3 server at {self.endpoint}")
        stop(self.workdir)
        self.pid = None


# --- Spark / Hadoop settings -------------------------------------------------------------------


def _hadoop_settings(server: S3Server) -> dict[str, str]:
    """S3A settings (Hadoop names, without ``spark.hadoop.``) for ``server``.

    Each one is there because S3A's default is made for AWS itself:

    - ``fs.s3a.endpoint``: the server's URL instead of AWS's regional endpoint.
    - ``fs.s3a.endpoint.region``: the region to sign for. Without it, S3A asks AWS's
      region discovery (or reads ``AWS_REGION``), which a local server cannot answer.
    - ``fs.s3a.path.style.access``: ``http://127.0.0.1:PORT/bucket/key`` rather than
      ``http://bucket.127.0.0.1:PORT/key``, a host name that does not resolve.
    - ``fs.s3a.connection.ssl.enabled``: plain HTTP; moto serves no TLS here.
    - ``fs.s3a.aws.credentials.provider`` and the two keys: fixed keys only (see
      :data:`SIMPLE_CREDENTIALS_PROVIDER`).
    - ``fs.s3a.connection.establish.timeout``, ``fs.s3a.connection.timeout``,
      ``fs.s3a.attempts.maximum``, ``fs.s3a.retry.limit``: a dead local server should fail
      a test soon, not after S3A's minutes of retries meant for a busy AWS. (15 s is the
      lowest connect timeout S3A accepts; it raises a lower one to that, with a warning.)
    """
    return {
        "fs.s3a.endpoint": server.endpoint,
        "fs.s3a.endpoint.region": server.region,
        "fs.s3a.path.style.access": "true",
        "fs.s3a.connection.ssl.enabled": "false",
        "fs.s3a.aws.credentials.provider": SIMPLE_CREDENTIALS_PROVIDER,
        "fs.s3a.access.key": server.access_key,
        "fs.s3a.secret.key": server.secret_key,
        "fs.s3a.connection.establish.timeout": "15s",
        "fs.s3a.connection.timeout": "30s",
        "fs.s3a.attempts.maximum": "2",
        "fs.s3a.retry.limit": "2",
    }


def s3a_settings(server: S3Server) -> dict[str, str]:
    """Spark settings that point ``s3a://`` paths at ``server``, for a session not yet built
    (``SparkSession.builder.config(...)``, or ``conf=`` of :func:`sparkonce.build_session`).

    They are the Hadoop settings of :func:`_hadoop_settings` with the ``spark.hadoop.``
    prefix, which Spark copies into every Hadoop configuration it makes. The s3a jars
    (:func:`sparkonce.spark.jars.s3_jars`) must be on ``spark.jars`` as well.
    """
    return {f"spark.hadoop.{key}": value for key, value in _hadoop_settings(server).items()}


def apply_s3a_settings(spark: SparkSession, server: S3Server) -> None:
    """Point ``s3a://`` paths of the running session ``spark`` at ``server``.

    Sets the Hadoop settings on the SparkContext's Hadoop configuration, the one Spark copies
    for every read, write and streaming checkpoint it plans from now on. Hadoop caches one
    filesystem object per scheme and bucket, made with the settings of its first use, so this
    must come before the session first touches an ``s3a://`` path of that bucket (a bucket
    used earlier keeps its old settings until ``FileSystem.closeAll``). The session must have
    been built with the s3a jars.
    """
    jsc: Any = spark.sparkContext._jsc
    conf = jsc.hadoopConfiguration()
    for key, value in _hadoop_settings(server).items():
        conf.set(key, value)


# --- processes ---------------------------------------------------------------------------------


def _log_tail(log: pathlib.Path, since: int = 0) -> str:
    # werkzeug colours its request lines even in a file
    text = _ANSI_COLOUR.sub("", log_tail(log, since, missing="(no server log)"))
    return text or "(empty server log)"


def _answers(endpoint: str) -> bool:
    """Whether an S3 server answers ``ListBuckets`` at ``endpoint`` (moto does not check the
    signature of this call, so an unsigned GET is enough)."""
    try:
        with urllib.request.urlopen(endpoint + "/", timeout=PROBE_TIMEOUT_S) as response:
            return response.status == 200 and b"ListAllMyBucketsResult" in response.read()
    except (urllib.error.URLError, OSError):
        return False


class _StartupFailed(RuntimeError):
    pass


def _wait_ready(
    server: S3Server, proc: subprocess.Popen[bytes] | None, log: pathlib.Path, since: int
) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise _StartupFailed(
                f"the moto S3 server exited with code {proc.returncode} during startup; "
                f"tail of {log}:\n{_log_tail(log, since)}"
            )
        if _answers(server.endpoint):
            return
        time.sleep(0.1)
    raise RuntimeError(
        f"the moto S3 server at {server.endpoint} did not answer within "
        f"{STARTUP_TIMEOUT_S:.0f} s; tail of {log}:\n{_log_tail(log, since)}"
    )


def _launch(workdir: pathlib.Path, port: int) -> subprocess.Popen[bytes]:
    # The interpreter running the tests, so the server comes from the same virtualenv.
    cmd = [sys.executable, "-m", SERVER_MODULE, "--host", HOST, "--port", str(port)]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with (workdir / LOG_NAME).open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: stop() signals the whole group
        )
    _servers.children[proc.pid] = proc
    (workdir / PID_NAME).write_text(f"{proc.pid}\n")
    (workdir / PORT_NAME).write_text(f"{port}\n")
    return proc


def start(workdir: pathlib.Path, port: int | None = None) -> S3Server:
    """Start a moto S3 server with its log in ``workdir``; reuse one already running there.

    ``port`` defaults to a free one. Raises RuntimeError, with the tail of the server's log,
    if it does not answer within 30 s.
    """
    workdir = pathlib.Path(workdir).absolute()
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / LOG_NAME

    pid = _servers.running_pid(workdir)
    if pid is not None:
        running = int((workdir / PORT_NAME).read_text().strip())
        if port is not None and port != running:
            raise RuntimeError(f"an S3 server (pid {pid}) already runs in {workdir} on {running}")
        server = S3Server(f"http://{HOST}:{running}", workdir, pid)
        _wait_ready(server, None, log, 0)
        return server

    # A free port can be taken before the server binds it: retry with fresh ones, unless the
    # port was given.
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        chosen = port if port is not None else free_port()
        since = log.stat().st_size if log.exists() else 0
        proc = _launch(workdir, chosen)
        server = S3Server(f"http://{HOST}:{chosen}", workdir, proc.pid)
        try:
            _wait_ready(server, proc, log, since)
        except _StartupFailed:
            stop(workdir, timeout=0.0)
            if attempt + 1 < attempts and "Address already in use" in _log_tail(log, since):
                continue
            raise
        except BaseException:
            stop(workdir, timeout=0.0)
            raise
        return server
    raise AssertionError("unreachable")


def stop(workdir: pathlib.Path, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop the server in ``workdir``: SIGTERM, then after ``timeout`` s SIGKILL its process
    group. ``timeout=0`` kills at once. Does nothing if no server runs there."""
    _servers.stop(pathlib.Path(workdir).absolute(), timeout, files=(PORT_NAME,))


def session_server(tmp_root: pathlib.Path) -> Iterator[S3Server]:
    """Generator for a session fixture: a server with its log in ``tmp_root/s3``.

    With ``SPARKONCE_TEST_S3_ENDPOINT`` set, yields that server and starts/stops nothing.
    """
    external = os.environ.get(ENV_ENDPOINT)
    if external:
        yield S3Server(
            external.rstrip("/"),
            None,
            None,
            access_key=os.environ.get(ENV_ACCESS_KEY, ACCESS_KEY),
            secret_key=os.environ.get(ENV_SECRET_KEY, SECRET_KEY),
        )
        return
    workdir = pathlib.Path(tmp_root) / "s3"
    try:
        yield start(workdir)
    finally:
        stop(workdir)


# --- command line ------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    return command_line(
        argv,
        module="tests.services.s3",
        description="Start or stop a throwaway S3 server (moto) for the sparkonce tests.",
        noun="server",
        start=lambda workdir, port: start(workdir, port=port).endpoint,
        stop=stop,
    )


if __name__ == "__main__":
    sys.exit(main())
