"""A Spark Connect server of the installed PySpark, started once per test run in a process
of its own (a classic SparkContext in this process, the shared ``spark`` fixture's, would
refuse a local one), and client sessions of it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

SERVER = Path(__file__).with_name("server.py")
# What PySpark puts in the environment of a process that built a Connect client session.
_CLIENT_MARKS = ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE")
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ConnectServer:
    """A Spark Connect server process (tests/connect/server.py) in a process group of its
    own, so a test can SIGKILL it with its JVM and Python workers at once."""

    def __init__(
        self,
        log: Path,
        port: int | None = None,
        *,
        conf: dict[str, str] | None = None,
        env_extra: dict[str, str] | None = None,
    ) -> None:
        """``conf``: more settings of the server's session; ``env_extra``: more environment
        for the server and its Python workers."""
        self.port = port or _free_port()
        self.log = log
        # Without the marks a client session of this process left in its environment
        # (PySpark sets SPARK_CONNECT_MODE_ENABLED when it builds one): the server builds a
        # classic session.
        env = {k: v for k, v in os.environ.items() if k not in _CLIENT_MARKS}
        env.update(env_extra or {}, PYSPARK_PYTHON=sys.executable)
        if conf:
            env["SPARKONCE_TEST_CONNECT_CONF"] = json.dumps(conf)
        src = str(Path(__file__).resolve().parents[2] / "src")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
        # The server's output (and its Python workers', which print per batch) goes to a
        # file: a pipe nobody reads once the server is up fills and blocks the server.
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(SERVER), str(self.port)],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the gRPC port opens with the plugin
            if self.proc.poll() is not None:
                raise AssertionError(f"the Connect server exited: {log.read_text()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"no Connect server in {START_TIMEOUT_S} s: {log.read_text()}")
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            time.sleep(0.5)

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    def kill(self) -> None:
        """SIGKILL the server's whole process group: its JVM and every Python worker."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(60)
        except (subprocess.TimeoutExpired, BrokenPipeError):
            self.kill()


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a running Spark Connect server (local[2])."""
    server = ConnectServer(tmp_path_factory.mktemp("connect") / "server.log")
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def connect_spark(connect_url: str) -> Iterator[SparkSession]:
    """A Spark Connect client session (no JVM in this process)."""
    spark = SparkSession.builder.remote(connect_url).getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()


def start_zombie(spark: SparkSession, pipeline: Any, epoch: int, checkpoint: Path) -> Any:
    """Start ``pipeline``'s query with the batch function of a run that holds ``epoch``, as
    an older run's query still alive in the server would run it (no acquire, no checks):
    the store must fence its commits. Returns the streaming query."""
    from sparkonce.pipeline.connect import ConnectBatch

    zombie = ConnectBatch(
        pipeline.name, epoch, pipeline.sink, pipeline.source, str(checkpoint), None
    )
    return (
        pipeline.transform(pipeline.source.stream(spark, None))
        .writeStream.foreachBatch(zombie)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def s3_connect_server(tmp_path: Path, s3: Any) -> tuple[ConnectServer, dict[str, str]]:
    """A Connect server that reaches the moto server ``s3`` through S3A (its settings and
    jars), and the AWS environment (keys, region) that it and its clients read S3 with: a
    Connect server hands no secret setting to a client."""
    from sparkonce.spark.jars import s3_jars
    from tests.services.s3 import s3a_settings

    keys = {
        "AWS_ACCESS_KEY_ID": s3.access_key,
        "AWS_SECRET_ACCESS_KEY": s3.secret_key,
        "AWS_REGION": s3.region,
    }
    conf = {**s3a_settings(s3), "spark.jars": ",".join(s3_jars())}
    return ConnectServer(tmp_path / "server.log", conf=conf, env_extra=keys), keys
