"""A misconfigured run is refused before it takes an epoch, so a healthy run goes on.

Run A, a live pipeline (processing-time trigger), keeps committing. Run B, the same pipeline
started with a checkpoint path that is a regular file, must exit with code 2 without taking
the epoch: A must keep committing new input afterwards, and never be fenced.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import EXIT_USAGE
from sparkonce.verify.driver import Driver
from tests.crash.conftest import read_sink, run_driver

pytestmark = pytest.mark.crash_lane

_LIVE_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="crash-test",
    source=EmbeddedLogSource({log_dir!r}, "events"),
    transform=lambda df: df.select("record_id", F.col("value").cast("string").alias("value")),
    sink=sink_from_url({url!r}, "live_out"),
    checkpoint={checkpoint!r},
    trigger="processingTime=1 second",
)
"""


def write_live_pipeline(tmp_path: Path, log_dir: Path) -> tuple[Path, str]:
    """The live pipeline file in ``tmp_path``, and its SQLite sink URL."""
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _LIVE_PIPELINE.format(log_dir=str(log_dir), url=url, checkpoint=str(tmp_path / "chk"))
    )
    return pipeline_file, url


def _wait_for(what: str, check: Callable[[], bool], driver: Driver, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        code = driver.poll()
        assert code is None, f"live run exited ({code}) while waiting for {what}:\n" + (
            driver.log_tail(40)
        )
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n{driver.log_tail(40)}")


def test_misconfigured_second_run_does_not_fence_the_live_one(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    pipeline_file, url = write_live_pipeline(tmp_path, make_log(300, partitions=2))

    def rows() -> int:
        return len(read_sink(url, "live_out").rows)

    live = Driver(pipeline_file, tmp_path / "live.log")
    drivers.append(live)
    live.start()
    _wait_for("the live run's first 300 rows", lambda: rows() == 300, live)
    epoch = read_sink(url, "live_out").owner
    assert epoch is not None and epoch.epoch == 1

    not_a_dir = tmp_path / "checkpoint-is-a-file"
    not_a_dir.write_text("oops")
    bad = Driver(pipeline_file, tmp_path / "bad.log", extra_args=("--checkpoint", str(not_a_dir)))
    drivers.append(bad)
    code = run_driver(bad)
    log = bad.log_path.read_text()
    assert code == EXIT_USAGE, log
    assert "is a file, not a directory" in log.strip().splitlines()[-1], log
    owner = read_sink(url, "live_out").owner
    assert owner is not None and owner.epoch == 1, "the refused run took an epoch"

    make_log(200, partitions=2, start=301)  # new input: the live run must still commit it
    _wait_for("the live run to commit the new input", lambda: rows() == 500, live)
    assert live.poll() is None
    assert "fenced" not in live.log_path.read_text()
