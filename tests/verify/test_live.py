"""``sparkonce verify`` with live readers, end to end: the planted sink whose final state is
right is caught only by the live reader (the checks themselves: tests/unit/test_verify_live.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import main

# -- the whole verify run (crash lane: two campaigns, about a minute each) -----------------------


_PIPELINE = """
import sys
sys.path.insert(0, {root!r})
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline
from tests.verify.broken_sink import VisibleBeforeCommitSink

pipeline = Pipeline(
    name="live-test",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=100),
    transform=lambda df: df.select("record_id", F.col("key").cast("string").alias("key")),
    sink=VisibleBeforeCommitSink({url!r}, "events_out"),
    checkpoint={checkpoint!r},
)
"""


@pytest.mark.crash_lane
def test_verify_fails_the_planted_sink_only_with_live_readers(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(600, partitions=2, keys=4)
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        _PIPELINE.format(
            root=str(Path(__file__).parents[2]),
            log=str(log_dir),
            url=f"sqlite:///{tmp_path / 'planted.db'}",
            checkpoint=str(tmp_path / "user-checkpoint"),
        )
    )
    common = ["verify", str(pipeline), "--trials", "1", "--seed", "2"]
    common += ["--faults", "crash-point:after-rows"]
    assert main([*common, "--out", str(tmp_path / "live")]) == 1
    report = json.loads((tmp_path / "live" / "verify.json").read_text())
    (trial,) = report["trials"]
    assert trial["fault_fired"] and not trial["passed"]
    # The final state is right: only the live reader saw it go wrong.
    assert trial["lost_rows"] == trial["duplicated_rows"] == trial["value_mismatches"] == 0
    assert trial["live_anomalies"] > 0
    (store,) = report["live"]["stores"]
    assert store["anomalies"]["torn-batch"] > 0 and store["anomalies"]["non-monotonic"] > 0
    # Without live readers the same trial passes: the final state alone cannot catch it.
    assert main([*common, "--out", str(tmp_path / "final-only"), "--no-live"]) == 0
    report = json.loads((tmp_path / "final-only" / "verify.json").read_text())
    (trial,) = report["trials"]
    assert trial["fault_fired"] and trial["passed"] and trial["live"] == []
