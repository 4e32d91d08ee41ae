"""A Spark Connect server of the installed PySpark, started once per test run in a process
of its own (a classic SparkContext in this process, the shared ``spark`` fixture's, would
refuse a local one), and client sessions of it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

SERVER = Path(__file__).with_name("server.py")
START_TIMEOUT_S = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def connect_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``sc://127.0.0.1:PORT`` of a running Spark Connect server (local[2])."""
    port = _free_port()
    log = tmp_path_factory.mktemp("connect") / "server.log"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    # The server's output (and its Python workers', which print per batch) goes to a file:
    # a pipe nobody reads once the server is up fills and blocks the server.
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(SERVER), str(port)],
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the gRPC port opens with the plugin
            assert proc.poll() is None, f"the Connect server exited: {log.read_text()}"
            assert time.monotonic() < deadline, f"no Connect server: {log.read_text()}"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def connect_spark(connect_url: str) -> Iterator[SparkSession]:
    """A Spark Connect client session (no JVM in this process)."""
    spark = SparkSession.builder.remote(connect_url).getOrCreate()
    try:
        yield spark
    finally:
        spark.stop()
