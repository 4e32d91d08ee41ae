"""benchmarks/delta_to_delta.py counts a target's rows from its Delta log with pyarrow, not
through sparkonce or Spark: that count is what says the txnAppId pattern lost or duplicated
rows after a checkpoint reset, so it must follow the log's ``remove`` actions and a log
checkpoint, not just list the data files in the directory."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from benchmarks.delta_to_delta import count_rows


def _file(table: Path, name: str, ids: list[int]) -> None:
    pq.write_table(pa.table({"event_id": ids}), table / name)


def _commit(table: Path, version: int, actions: list[dict]) -> None:
    log = table / "_delta_log"
    log.mkdir(parents=True, exist_ok=True)
    lines = "\n".join(json.dumps(a) for a in actions)
    (log / f"{version:020d}.json").write_text(lines + "\n")


def test_a_removed_file_is_not_counted_and_a_checkpoint_s_adds_are(tmp_path: Path) -> None:
    table = tmp_path / "t"
    table.mkdir()
    _file(table, "a.parquet", [1, 2, 3])
    _file(table, "b.parquet", [3, 4])
    _file(table, "c.parquet", [1, 2, 3, 4])  # a rewrite of a and b (OPTIMIZE)
    _file(table, "d e.parquet", [5])  # its path in the log is URL-encoded
    _commit(table, 0, [{"add": {"path": "a.parquet"}}])
    _commit(table, 1, [{"add": {"path": "b.parquet"}}])
    assert count_rows(table) == {"rows": 5, "distinct_event_ids": 4}

    _commit(
        table,
        2,
        [
            {"remove": {"path": "a.parquet"}},
            {"remove": {"path": "b.parquet"}},
            {"add": {"path": "c.parquet"}},
        ],
    )
    assert count_rows(table) == {"rows": 4, "distinct_event_ids": 4}

    # A log checkpoint at version 2 holds the live adds; the commits before it are then
    # ignored (here: removed, as a log cleanup would), the one after it replayed.
    pq.write_table(
        pa.table({"add": [{"path": "c.parquet"}]}),
        table / "_delta_log" / f"{2:020d}.checkpoint.parquet",
    )
    for v in (0, 1, 2):
        (table / "_delta_log" / f"{v:020d}.json").unlink()
    _commit(table, 3, [{"add": {"path": "d%20e.parquet"}}])
    assert count_rows(table) == {"rows": 5, "distinct_event_ids": 5}
