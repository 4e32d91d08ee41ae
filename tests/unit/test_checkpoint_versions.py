"""sparkonce's checkpoint readers on checkpoints written by each supported PySpark."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sparkonce.errors import CheckpointError
from sparkonce.spark.checkpoint import Checkpoint

DATA = Path(__file__).resolve().parents[1] / "data" / "checkpoints"
VERSIONS = sorted(p.name for p in DATA.glob("spark-*"))


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("kind", ["stateless", "stateful"])
def test_reads_checkpoint_of_each_spark(version: str, kind: str) -> None:
    cp = Checkpoint(DATA / version / kind)
    assert not cp.is_new
    assert cp.batch_ids("offsets") == [0, 1, 2, 3]
    assert cp.last_committed_batch() == 3
    assert cp.query_id()
    assert cp.has_state() is (kind == "stateful")
    ends = []
    for batch in range(4):
        offset = cp.source_offset(batch)
        assert offset is not None
        ends.append(int(json.loads(offset)))  # the rate source's offset: seconds since start
    assert ends == sorted(ends) and ends[0] >= 0


def test_unknown_offset_log_version_is_refused(tmp_path: Path) -> None:
    ck = tmp_path / "ck"
    shutil.copytree(DATA / "spark-4.2" / "stateless", ck)
    f = ck / "offsets" / "3"
    f.write_text("v99\n" + f.read_text().split("\n", 1)[1])
    with pytest.raises(CheckpointError, match=r"v99.*v1.*4\.2 and 4\.3"):
        Checkpoint(ck).source_offset(3)
