"""A benchmark's new results file keeps the dated notes of the file it replaces
(``benchmarks._common.write_results``): the docs' performance page shows them under the
file's table, so a re-run must not drop the figures they hold."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks._common import write_results


def test_a_new_run_keeps_the_notes_and_replaces_the_measurements(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    old_note = {"date": "2026-11-21", "commit": "abc1234", "text": "0.93x before the change"}
    path.write_text(json.dumps({"date": "2026-11-21", "ratio": 0.93, "notes": [old_note]}))

    new_note = {"date": "2026-11-28", "text": "1.02x after it"}
    write_results(path, {"date": "2026-11-28", "ratio": 1.02, "notes": [new_note, old_note]})

    data = json.loads(path.read_text())
    assert data["date"] == "2026-11-28" and data["ratio"] == 1.02
    assert data["notes"] == [old_note, new_note]  # the old first, none twice


def test_a_first_run_writes_no_notes_key(tmp_path: Path) -> None:
    path = tmp_path / "results" / "bench.json"
    write_results(path, {"ratio": 1.0}, indent=1)
    assert json.loads(path.read_text()) == {"ratio": 1.0}
    assert path.read_text().endswith("\n")
