"""benchmarks/connect.py at a tiny size: both variants run end to end in their own
processes (a classic session; PySpark's local Connect server), each sink holds every
record once (the script checks it with sqlite3 and fails otherwise), and the report holds
what docs/guides/connect.md says it reports. Timing is not checked here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "connect.py"


@pytest.mark.campaign_lane  # a benchmark's smoke run: two Spark sessions, one a server
def test_both_variants_run_and_the_report_compares_them(tmp_path: Path) -> None:
    out = tmp_path / "connect.json"
    args = ["--records", "400", "--batch-records", "100", "--repeat", "1", "--output", str(out)]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "connect" and report["records"] == 400
    assert sorted(r["variant"] for r in report["runs"]) == ["classic", "connect"]
    assert all(r["rows"] == 400 and r["batches"] >= 4 for r in report["runs"]), report["runs"]
    summary = report["summary"]
    assert summary["connect"]["ratio"] > 0
    assert {"median_s", "per_batch_ms", "extra_per_batch_ms"} <= set(summary["connect"])


def test_a_bad_batch_size_is_refused_before_anything_runs() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--records", "10", "--batch-records", "100"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "--batch-records must be" in done.stderr
