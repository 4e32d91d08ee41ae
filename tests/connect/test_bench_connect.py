"""benchmarks/connect.py at a tiny size: both variants run end to end in their own
processes (a classic session; PySpark's local Connect server), each sink holds every
record once (the script reads it back with its own client and fails otherwise), and the
report holds what docs/performance.md says it reports, per sink and variant. Timing is not
checked here. The row check itself is proven by a run whose sink is spoiled before it is
read back (``--tamper``): the script must fail and name what is wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "connect.py"


def _env() -> dict[str, str]:
    return {**os.environ, "PYSPARK_PYTHON": sys.executable}


@pytest.mark.campaign_lane  # a benchmark's smoke run: two Spark sessions, one a server
def test_both_variants_run_and_the_report_compares_them_per_sink(tmp_path: Path) -> None:
    out = tmp_path / "connect.json"
    args = ["--records", "400", "--batch-records", "100", "--repeat", "1", "--sinks", "sqlite"]
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--output", str(out), "--context", "A smoke run."],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "connect" and report["records"] == 400
    assert report["sinks"] == ["sqlite"] and report["what"].endswith("A smoke run.")
    assert sorted(r["variant"] for r in report["runs"]) == ["classic", "connect"]
    assert all(r["rows"] == 400 and r["batches"] >= 4 for r in report["runs"]), report["runs"]
    summary = report["summary"]
    assert list(summary) == ["sqlite"] and set(summary["sqlite"]) == {"classic", "connect"}
    classic, connect = summary["sqlite"]["classic"], summary["sqlite"]["connect"]
    assert connect["ratio"] == pytest.approx(connect["median_s"] / classic["median_s"], 0.01)
    assert connect["extra_per_batch_ms"] == pytest.approx(
        connect["per_batch_ms"] - classic["per_batch_ms"], abs=0.2
    )


@pytest.mark.campaign_lane  # one classic Spark session each
@pytest.mark.parametrize(
    ("how", "rows", "says"),
    [
        ("drop-and-repeat", 200, "1 missing (first: [1]), 1 repeated (first: [2])"),
        ("repeat", 201, "0 missing (first: []), 1 repeated (first: [2])"),
    ],
    ids=["drop-and-repeat", "repeat"],
)
def test_a_run_whose_sink_lost_or_repeated_a_row_fails(
    tmp_path: Path, how: str, rows: int, says: str
) -> None:
    """The child's sink is spoiled after its run (value 2 written twice; with
    ``drop-and-repeat`` value 1 deleted too, so the count of rows is right), then read
    back: the run fails, naming what is wrong."""
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *("--child", "classic", "--sink", "sqlite", "--workdir", str(tmp_path)),
            *("--records", "200", "--batch-records", "100", "--tamper", how),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=_env(),
    )
    assert done.returncode != 0, done.stdout[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert f"classic (sqlite): the sink holds {rows} rows" in last, done.stderr[-3000:]
    assert says in last, last


def test_a_bad_batch_size_or_sink_is_refused_before_anything_runs() -> None:
    for args, says in [
        (["--records", "10", "--batch-records", "100"], "--batch-records must be"),
        (["--sinks", "sqlite,mysql"], "--sinks takes a comma-separated list of"),
    ]:
        done = subprocess.run(
            [sys.executable, str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2 and says in done.stderr, done.stderr
