"""A second run on the checkpoint of a live run (issue 40, item B): real driver processes.

1. Run A commits small batches one after another; run B, the same pipeline on the same
   checkpoint, starts meanwhile. B must take over and commit, A must be fenced (exit 3).
   B must not be refused because A committed between B's reads of the ledger and of the
   checkpoint, nor be told to delete the checkpoint A is using.
2. Run A, idle after its input, is stopped (SIGSTOP to its whole process group). Run B
   takes over on the same checkpoint and commits new input, then A is continued. A's
   query then fails on the checkpoint B wrote (Spark's CONCURRENT_STREAM_LOG_UPDATE,
   planning a batch B already ran); that is fencing and must be reported as such (exit 3).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import EXIT_FENCED
from sparkonce.offsets import check_chain
from sparkonce.verify.driver import Driver
from tests.crash.conftest import read_sink, run_driver
from tests.crash.test_preflight import _wait_for

pytestmark = pytest.mark.crash_lane

_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="crash-test",
    source=EmbeddedLogSource({log_dir!r}, "events", max_records_per_partition={limit}),
    transform=lambda df: df.select("record_id", F.col("value").cast("string").alias("value")),
    sink=sink_from_url({url!r}, "live_out"),
    checkpoint={checkpoint!r},
    trigger="processingTime=0 seconds",
)
"""


def _pipeline_file(tmp_path: Path, log_dir: Path, limit: int) -> tuple[Path, str]:
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    f = tmp_path / "pipeline.py"
    f.write_text(
        _PIPELINE.format(
            log_dir=str(log_dir), url=url, checkpoint=str(tmp_path / "chk"), limit=limit
        )
    )
    return f, url


def _rows(url: str) -> int:
    return len(read_sink(url, "live_out").rows)


def _exact(url: str, records: int) -> None:
    state = read_sink(url, "live_out")
    values = sorted(int(r["value"]) for r in state.rows)
    assert values == list(range(1, records + 1)), "rows lost or repeated"


def test_second_run_on_a_live_runs_checkpoint_takes_over(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    records = 3000
    pipeline_file, url = _pipeline_file(tmp_path, make_log(records, partitions=2), limit=5)
    live = Driver(pipeline_file, tmp_path / "live.log")
    drivers.append(live)
    live.start()
    _wait_for("the live run to commit", lambda: _rows(url) >= 100, live)

    second = Driver(pipeline_file, tmp_path / "second.log", extra_args=("--timeout", "60"))
    drivers.append(second)
    code = run_driver(second)
    log = second.log_path.read_text()
    assert "beyond the ledger" not in log and "delete the checkpoint" not in log, log
    assert code == 0, log
    assert run_driver(live) == EXIT_FENCED, live.log_tail(40)
    owner = read_sink(url, "live_out").owner
    assert owner is not None and owner.epoch == 2

    # Nothing repeated, and the ledger's batches follow one another without a gap.
    state = read_sink(url, "live_out")
    values = [int(r["value"]) for r in state.rows]
    assert len(values) == len(set(values)) >= 100
    assert check_chain(e.ranges for e in state.ledger) == []


def test_a_stopped_run_taken_over_on_its_checkpoint_is_fenced_when_continued(
    tmp_path: Path, make_log: Callable[..., Path], drivers: list[Driver]
) -> None:
    pipeline_file, url = _pipeline_file(tmp_path, make_log(300, partitions=2), limit=1000)
    live = Driver(pipeline_file, tmp_path / "live.log")
    drivers.append(live)
    live.start()
    _wait_for("the live run's first 300 rows", lambda: _rows(url) == 300, live)
    live.pause()

    make_log(200, partitions=2, start=301)
    second = Driver(pipeline_file, tmp_path / "second.log", extra_args=("--timeout", "45"))
    drivers.append(second)
    assert run_driver(second) == 0, second.log_tail(40)
    assert _rows(url) == 500

    live.resume()
    code = run_driver(live)
    log = live.log_path.read_text()
    assert code == EXIT_FENCED, log
    last = log.strip().splitlines()[-1]
    assert "fenced" in last and "starts again from this batch" not in last, last
    _exact(url, 500)
