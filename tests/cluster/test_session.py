"""A session on the standalone cluster runs its Python tasks in the shipped environment, on
executors in JVMs of their own, on both workers.

tests/cluster/probe.py is the driver: it runs a Python UDF in 8 tasks and reports what each
task saw. The driver process itself runs the tests' virtualenv; only its Python workers and
the executors' use the archive. The second test shows two set-ups that do not ship it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import StartDriver
from tests.services.spark_cluster import ENV_NAME, ENV_PYTHON, SparkCluster, spark_home

pytestmark = pytest.mark.campaign_lane

PROBE = Path(__file__).with_name("probe.py")


def test_udf_runs_the_shipped_environment_on_both_workers(
    spark_cluster: SparkCluster, start_driver: StartDriver, tmp_path: Path
) -> None:
    out, release = tmp_path / "probe.json", tmp_path / "release"
    driver = start_driver([str(PROBE), spark_cluster.master_url, str(out), str(release)])
    deadline = time.monotonic() + 240
    while not out.exists():
        assert driver.proc.poll() is None, f"the probe exited early:\n{driver.tail()}"
        assert time.monotonic() < deadline, f"no probe result within 240 s:\n{driver.tail()}"
        time.sleep(0.2)
    result = json.loads(out.read_text())
    # The executors of the probe's application, as the cluster sees them (the probe keeps
    # its session open until released).
    executors = spark_cluster.executor_pids(result["app_id"])
    release.touch()
    assert driver.wait() == 0, driver.tail()

    # The driver is this virtualenv's Python; it hands its tasks the relative interpreter.
    assert result["driver_executable"] == sys.executable
    assert result["python_exec"] == ENV_PYTHON
    main_prefix = sys.prefix
    worker_dirs = [w.workdir for w in spark_cluster.workers]
    tasks = result["tasks"]
    assert len(tasks) == 8
    for task in tasks:
        where = json.dumps(task, indent=1)
        # Each task ran the interpreter of the environment Spark unpacked in its executor's
        # working directory (WORKDIR/APP/EXECUTOR), not the driver's virtualenv.
        env_dir = Path(task["cwd"]) / ENV_NAME
        assert Path(task["executable"]) == env_dir / "bin" / "python", where
        assert Path(task["prefix"]) == env_dir, where
        assert Path(task["cwd"]).parent.name == result["app_id"], where
        assert any(Path(task["cwd"]).is_relative_to(d) for d in worker_dirs), where
        assert not task["prefix"].startswith(main_prefix), where
        # sparkonce and its runtime dependencies come from the archive ...
        site = env_dir / "lib" / "python3.11" / "site-packages"
        for name in ("sparkonce", "confluent_kafka", "psycopg"):
            assert Path(task["modules"][name]).is_relative_to(site), (name, where)
        # ... and PySpark, which the archive does not hold, from the workers' Spark.
        pyspark_zip = spark_home() / "python" / "lib" / "pyspark.zip"
        assert task["modules"]["pyspark"].startswith(str(pyspark_zip)), where

    # Executors are JVMs of their own, one per worker, and tasks ran on both.
    task_executors = {t["executor"]["pid"] for t in tasks}
    task_workers = {t["executor"]["worker_url"] for t in tasks}
    assert task_workers == {w.url for w in spark_cluster.workers if w.alive}, tasks
    assert sorted(executors) == [w.index for w in spark_cluster.workers if w.alive], executors
    assert task_executors == {pid for pids in executors.values() for pid in pids}
    assert result["driver_jvm_pid"] not in task_executors
    assert result["driver_pid"] not in {t["pid"] for t in tasks}


def _probe(
    start_driver: StartDriver, cluster: SparkCluster, directory: Path, name: str, **options: Any
) -> dict[str, Any]:
    """Run the probe to its end (released at once); its result."""
    out, release = directory / f"{name}.json", directory / f"{name}.release"
    release.touch()
    args = [str(PROBE), cluster.master_url, str(out), str(release)]
    if "log_dir" in options:
        args.append(str(options.pop("log_dir")))
    driver = start_driver(args, name=name, **options)
    assert driver.wait() == 0, driver.tail()
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def test_settings_that_do_not_ship_the_environment(
    spark_cluster: SparkCluster,
    start_driver: StartDriver,
    make_log: Callable[..., Path],
    tmp_path: Path,
) -> None:
    """Two set-ups that look right, for a driver started from Python in client mode.

    1. ``spark.pyspark.python`` and ``spark.executorEnv.PYSPARK_PYTHON`` name the archive's
       interpreter, but the driver's environment has no ``PYSPARK_PYTHON``: Spark reads
       neither setting on this path, and the executors run the driver's own interpreter
       (:func:`sparkonce.build_session` sets ``PYSPARK_PYTHON`` to it). The archive is
       shipped and unpacked, and nothing uses it.
    2. ``PYSPARK_PYTHON=./environment/bin/python``, but the driver runs in a directory
       without ``./environment``: a UDF runs on the executors in the archive, and
       sparkonce's source fails on the driver, whose JVM starts the source's planning
       workers with that same relative path.
    """
    relative = {
        "spark.pyspark.python": ENV_PYTHON,
        "spark.executorEnv.PYSPARK_PYTHON": ENV_PYTHON,
    }
    ignored = _probe(
        start_driver, spark_cluster, tmp_path, "settings-only", settings=relative, python=None
    )
    assert ignored["python_exec"] == sys.executable
    assert {t["executable"] for t in ignored["tasks"]} == {sys.executable}, ignored["tasks"]

    elsewhere = tmp_path / "no-environment-here"
    elsewhere.mkdir()
    log_dir = make_log(30, partitions=3)
    no_env = _probe(
        start_driver, spark_cluster, tmp_path, "driver-without-env", cwd=elsewhere, log_dir=log_dir
    )
    assert all(t["executable"].endswith(f"/{ENV_NAME}/bin/python") for t in no_env["tasks"])
    assert "log_rows" not in no_env, no_env
    assert f'Cannot run program "{ENV_PYTHON}"' in no_env["log_error"], no_env["log_error"]
