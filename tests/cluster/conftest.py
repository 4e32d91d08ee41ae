"""The cluster tests: sparkonce on a real Spark standalone cluster (a master and two workers
on 127.0.0.1, tests/services/spark_cluster.py), its executors running the packed
environment that ``scripts/pack-executor-env.sh`` builds.

Every session on the cluster lives in a driver process of its own (``sparkonce run FILE
--master URL``, or tests/cluster/probe.py), never in the test process. A process holds one
SparkContext: ``getOrCreate`` in the test process would quietly hand back the tests' shared
``local[2]`` session, whatever master it was asked for, and stopping that session would
break every later test that uses it. A driver process also gets the environment the
executors' Python depends on (``PYSPARK_PYTHON``, ``SPARK_CONF_DIR``) without changing the
test process's, and it can be killed as a whole.

Drivers run in a directory where the executor environment is unpacked as ``environment``:
``PYSPARK_PYTHON=./environment/bin/python`` is relative, and Spark starts the driver side
of a Python data source (sparkonce's sources plan their batches there) with it too
(tests/services/spark_cluster.py says more).

The tests are slow (the cluster starts in about 10 s; every driver ships a 100 MB archive
to two executors): they are in ``campaign_lane`` (``make test-campaign``), so CI runs each in
its turn, in the rotation's shard that holds it (tests/shards.py; ``make test-shard-list``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import pytest

from tests.services.spark_cluster import (
    ENV_PYTHON,
    SparkCluster,
    client_settings,
    driver_environment,
    executor_env_archive,
    unpack_environment,
)

REPO = Path(__file__).resolve().parents[2]
DRIVER_TIMEOUT_S = 300.0


@pytest.fixture(scope="session")
def executor_archive() -> Path:
    """The packed executor environment (built once per change of pyproject.toml or src/)."""
    return executor_env_archive()


@pytest.fixture(scope="session")
def spark_cluster() -> Iterator[SparkCluster]:
    """A master and two workers for the whole session. Tests that kill a worker start a
    replacement, so the next test finds two again. At the end, no process of the cluster
    (daemon, executor, Python worker) may be left."""
    root = Path(tempfile.mkdtemp(prefix="sparkonce-test-cluster-"))
    cluster = SparkCluster(root).start()
    try:
        yield cluster
    finally:
        cluster.close()
        leaked = cluster.processes()
        if not leaked:
            shutil.rmtree(root, ignore_errors=True)
        assert not leaked, f"processes of the Spark cluster outlived it (logs in {root}): {leaked}"


@pytest.fixture(scope="session")
def driver_dir(executor_archive: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The drivers' working directory: the executor environment unpacked as ./environment."""
    return unpack_environment(executor_archive, tmp_path_factory.mktemp("driver"))


class ClusterDriver:
    """One driver process on the cluster, in its own process group, output to ``log``."""

    def __init__(self, args: Sequence[str], log: Path, cwd: Path, env: Mapping[str, str]):
        self.args = list(args)
        self.log = log
        self.started = time.monotonic()
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.args,
                cwd=cwd,
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait(self, timeout: float = DRIVER_TIMEOUT_S) -> int:
        """The exit code; a driver still running after ``timeout`` is killed and fails."""
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"driver did not finish within {timeout:.0f} s:\n{self.tail()}")

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


StartDriver = Callable[..., ClusterDriver]


def sparkonce_run(pipeline_file: Path, cluster: SparkCluster, spark_log: Path) -> list[str]:
    """The arguments of ``python -m sparkonce run FILE`` on ``cluster``."""
    return [
        "-m",
        "sparkonce",
        "run",
        str(pipeline_file),
        "--master",
        cluster.master_url,
        "--log-file",
        str(spark_log),
    ]


@pytest.fixture
def start_driver(
    spark_cluster: SparkCluster, executor_archive: Path, driver_dir: Path, tmp_path: Path
) -> Iterator[StartDriver]:
    """``start_driver(args, name, settings=..., env=...)`` starts ``python ARGS...`` as a
    driver on the cluster: in ``driver_dir`` (or ``cwd``), with the cluster's client
    settings (plus ``settings``) in a ``spark-defaults.conf`` of its own, ``PYSPARK_PYTHON``
    set to ``python`` (None: not set) and ``env`` added. Drivers still running at teardown
    are killed with their process group."""
    started: list[ClusterDriver] = []

    def start(
        args: Sequence[str],
        name: str = "driver",
        settings: Mapping[str, str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        python: str | None = ENV_PYTHON,
    ) -> ClusterDriver:
        conf = {**client_settings(spark_cluster, executor_archive), **(settings or {})}
        environment = driver_environment(tmp_path / f"{name}-conf", conf, python)
        # The driver runs this checkout's sparkonce, as the archive does (the virtualenv's
        # editable install may point at another checkout).
        paths = [str(REPO / "src"), *(env or {}).get("PYTHONPATH", "").split(os.pathsep)]
        environment.update(env or {})
        environment["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
        # Spark's scratch space (with the driver's copy of the unpacked archive) inside
        # tmp_path, which goes with a passing test: a killed driver cannot remove it.
        local = tmp_path / f"{name}-spark-local"
        local.mkdir(exist_ok=True)
        environment.setdefault("SPARK_LOCAL_DIRS", str(local))
        # spark-submit's copy of spark.archives goes to the JVM's temporary directory.
        opts = f'{environment.get("SPARK_SUBMIT_OPTS", "")} "-Djava.io.tmpdir={local}"'
        environment["SPARK_SUBMIT_OPTS"] = opts.strip()
        driver = ClusterDriver(
            [sys.executable, *args], tmp_path / f"{name}.log", cwd or driver_dir, environment
        )
        started.append(driver)
        return driver

    yield start
    for driver in started:
        if driver.proc.poll() is None:
            driver.kill()
