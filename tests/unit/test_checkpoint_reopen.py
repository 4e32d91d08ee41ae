"""Checkpoint.reopen_for_watermark on checkpoint directories laid out as Spark writes them
(``offsets/N`` and ``commits/N``: a version line, then one JSON line), no Spark needed.
The Spark test that it releases a no-data batch's rows is in
tests/spark/test_no_data_batches.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sparkonce.spark.checkpoint import Checkpoint


def layout(
    root: Path,
    *,
    planned: int = 3,
    committed: int = 3,
    ran_with: int = 1000,
    next_mark: int = 5000,
    state: bool = True,
) -> Checkpoint:
    for n in range(planned + 1):
        meta = {"batchWatermarkMs": ran_with if n == planned else 0, "batchTimestampMs": 1}
        (root / "offsets").mkdir(parents=True, exist_ok=True)
        (root / "offsets" / str(n)).write_text(f'v1\n{json.dumps(meta)}\n{{"t":{{"0":{n}}}}}\n')
    for n in range(committed + 1):
        (root / "commits").mkdir(parents=True, exist_ok=True)
        mark = next_mark if n == committed else 0
        (root / "commits" / str(n)).write_text(f'v1\n{{"nextBatchWatermarkMs":{mark}}}\n')
        (root / "commits" / f".{n}.crc").write_bytes(b"crc")
    if state:
        (root / "state" / "0").mkdir(parents=True)
    return Checkpoint(root)


def test_a_last_batch_that_moved_the_watermark_is_reopened(tmp_path: Path) -> None:
    chk = layout(tmp_path)
    assert chk.reopen_for_watermark() == 3
    assert chk.batch_ids("commits") == [0, 1, 2]
    assert not (tmp_path / "commits" / ".3.crc").exists()
    assert (tmp_path / "commits" / ".2.crc").exists()
    assert chk.batch_ids("offsets") == [0, 1, 2, 3]  # Spark runs batch 3 from its offsets
    assert chk.reopen_for_watermark() is None  # batch 3 is now planned, not committed


@pytest.mark.parametrize(
    "case",
    [
        {"state": False},  # a stateless query: nothing waits in state
        {"planned": 4},  # Spark planned the next batch: it runs it on its own
        {"next_mark": 1000},  # the watermark did not move (a no-data batch, or no watermark)
        {"next_mark": 0, "ran_with": 0},  # no watermark at all
    ],
)
def test_nothing_changes_unless_the_last_committed_batch_left_expired_state(
    tmp_path: Path, case: dict[str, int]
) -> None:
    chk = layout(tmp_path, **case)  # type: ignore[arg-type]
    before = sorted(p.name for p in (tmp_path / "commits").iterdir())
    assert chk.reopen_for_watermark() is None
    assert sorted(p.name for p in (tmp_path / "commits").iterdir()) == before


def test_an_empty_or_unreadable_checkpoint_is_left_alone(tmp_path: Path) -> None:
    assert Checkpoint(tmp_path / "new").reopen_for_watermark() is None
    chk = layout(tmp_path / "odd")
    (tmp_path / "odd" / "commits" / "3").write_text("v1\nnot json\n")
    assert chk.reopen_for_watermark() is None
    assert (tmp_path / "odd" / "commits" / "3").exists()
