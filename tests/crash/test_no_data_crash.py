"""SIGKILL the driver at each crash point *of the no-data batch*, then recover.

The pipeline counts events per minute in append mode with a 0 s watermark (tests/spark/
test_no_data_batches.py): four data batches, then a no-data batch (the same source offset
again) that emits the last closed windows. Run 1 is killed at the 5th time it reaches the
point, which is inside that no-data batch; run 2 finishes. The windows must equal those
computed in plain Python from the input, each once, with one ledger entry for the no-data
batch.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver
from tests.crash.conftest import read_sink, run_driver
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


@pytest.mark.parametrize("point", list(CrashPoint), ids=[p.value for p in CrashPoint])
def test_crash_in_the_no_data_batch_then_recover(
    point: CrashPoint, tmp_path: Path, drivers: list[Driver]
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

    run1 = Driver(
        pipeline_file, tmp_path / "run1.log", crash_at=point, crash_hit=NO_DATA_HIT, env=env
    )
    drivers.append(run1.start())
    code = run_driver(run1)
    assert code == SIGKILL_EXIT, f"run 1 exited with {code}, not SIGKILL:\n{run1.log_tail()}"
    before = read_sink(url, "windows", "crash-test").ledger
    assert len(before) == (NO_DATA_HIT if point is CrashPoint.AFTER_LEDGER_COMMIT else 4), before

    run2 = Driver(pipeline_file, tmp_path / "run2.log", env=env)
    drivers.append(run2.start())
    code = run_driver(run2)
    assert code == 0, f"run 2 exited with {code}:\n{run2.log_tail()}"
    log2 = run2.log_path.read_text(errors="replace")
    if point is CrashPoint.AFTER_LEDGER_COMMIT:
        assert "no-data batch already committed" in log2, run2.log_tail()

    state = read_sink(url, "windows", "crash-test")
    got = Counter((int(r["start"]), int(r["n"])) for r in state.rows)
    assert got == expected_windows(), run2.log_tail()
    assert sum(1 for e in state.ledger if e.ranges.empty) == 1
    assert [e.seq for e in state.ledger] == list(range(NO_DATA_HIT))
