"""A killed driver's Spark scratch space does not outlive it.

Spark removes its local directories (shuffle files, the driver's copy of
``spark.archives``) only on a clean exit. :class:`~sparkonce.verify.driver.Driver` gives
each run a directory of its own (``SPARK_LOCAL_DIRS``) and removes it once the run has
ended, so a campaign of SIGKILLed trials does not fill the disk. Here a live run is
killed while Spark is using that directory; its JVM's ``java.io.tmpdir`` (where
spark-submit copies ``spark.archives``) is in there too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.verify.driver import Driver
from tests.crash.conftest import read_sink
from tests.crash.test_preflight import _wait_for, write_live_pipeline

pytestmark = pytest.mark.crash_lane


def group_pids(pgid: int) -> list[int]:
    """The processes of process group ``pgid`` (the driver, its JVM, Python workers)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[2]) == pgid:
            pids.append(int(stat.parent.name))
    return pids


def test_a_killed_drivers_spark_scratch_space_is_removed(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    log_dir = make_log(20, partitions=2)
    pipeline_file, url = write_live_pipeline(tmp_path, log_dir)
    driver = Driver(pipeline_file, tmp_path / "live.log").start()
    drivers.append(driver)

    def spark_uses_it() -> bool:
        return any(driver.local_dir.glob("spark-*/userFiles-*"))

    _wait_for("Spark's scratch directory", spark_uses_it, driver)
    # The driver's JVM keeps its temporary files there too (spark-submit's copies).
    jvm_args = [
        Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") for pid in group_pids(driver.pid)
    ]
    assert any(f"-Djava.io.tmpdir={driver.local_dir}".encode() in args for args in jvm_args)
    _wait_for("a first commit", lambda: bool(read_sink(url, "live_out").ledger), driver)
    driver.kill()
    driver.wait(60)
    assert driver.killed_by_us
    # The directory went with the run, though Spark itself never got to clean it.
    assert not driver.local_dir.exists(), sorted(p.name for p in driver.local_dir.rglob("*"))[:20]
