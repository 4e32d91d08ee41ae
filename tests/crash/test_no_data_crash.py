"""SIGKILL the driver at each crash point *of the no-data batch*, then recover.

The pipeline counts events per minute in append mode with a 0 s watermark (tests/spark/
test_no_data_batches.py): four data batches, then a no-data batch (the same source offset
again) that emits the last closed windows. One chain of runs on one checkpoint is killed
inside that no-data batch at each crash point in turn: run 1 the 5th time it reaches
``before-commit``, runs 2 to 4 (which start with the same no-data batch) the first time they
reach the next point; run 5 finishes. The windows must equal those computed in plain Python
from the input, each once, with one ledger entry for the no-data batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import Driver
from tests.crash.conftest import kill_chain, read_sink
from tests.spark.test_no_data_batches import LIMIT, RECORDS, expected_windows, make_event_log

pytestmark = pytest.mark.crash_lane  # make test has the no-data batches in-process (tests/spark)

NO_DATA_HIT = RECORDS // LIMIT + 1  # each data batch reaches every point once

_PIPELINE = """
from tests.spark.test_no_data_batches import windows
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="crash-test",
    source=EmbeddedLogSource({log_dir!r}, "events", max_records_per_partition={limit}),
    transform=windows,
    sink=sink_from_url({url!r}, "windows"),
    checkpoint={checkpoint!r},
    output_mode="append",
)
"""


def test_crash_in_the_no_data_batch_at_every_point_then_recover(
    tmp_path: Path, drivers: list[Driver]
) -> None:
    log_dir = make_event_log(tmp_path / "log")
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _PIPELINE.format(
            log_dir=str(log_dir), limit=LIMIT, url=url, checkpoint=str(tmp_path / "chk")
        )
    )
    env = {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # tests.spark importable

    def check(run: int, point: CrashPoint) -> None:
        ledger = read_sink(url, "windows", "crash-test").ledger
        want = NO_DATA_HIT if point is CrashPoint.AFTER_LEDGER_COMMIT else 4
        assert len(ledger) == want, f"run {run} ({point}): {ledger}"

    last = kill_chain(
        pipeline_file,
        tmp_path,
        drivers,
        CrashPoint,
        # A restarted run begins with the no-data batch.
        hit=lambda run, _point: NO_DATA_HIT if run == 1 else 1,
        check=check,
        env=env,
    )
    assert "no-data batch already committed" in last.log_path.read_text(errors="replace"), (
        last.log_tail()
    )

    state = read_sink(url, "windows", "crash-test")
    got = Counter((int(r["start"]), int(r["n"])) for r in state.rows)
    assert got == expected_windows(), last.log_tail()
    assert sum(1 for e in state.ledger if e.ranges.empty) == 1
    assert [e.seq for e in state.ledger] == list(range(NO_DATA_HIT))
