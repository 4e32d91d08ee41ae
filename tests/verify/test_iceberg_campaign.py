"""``sparkonce verify`` on an IcebergSink pipeline: real drivers, real faults, a real table.

Each trial's final check reads the table twice, with the inspector's PyIceberg scan and
with DuckDB's ``iceberg_scan`` (``readers`` of each trial); these tests read it a third
time through the tests' own readers (tests/iceberg/readers.py), which share no code with
the campaign.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sparkonce.cli import main
from tests.iceberg.readers import duckdb_rows, pyiceberg_rows
from tests.verify.pipelines import PREAMBLE

pytestmark = pytest.mark.crash

HERE = Path(__file__).parent

_PIPELINE = (
    PREAMBLE
    + """
from pyiceberg.catalog.sql import SqlCatalog
from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline
from broken_iceberg import UncheckedIcebergSink

catalog = SqlCatalog("verify", uri="sqlite:///{root}/catalog.db", warehouse="file://{root}/lake")
pipeline = Pipeline(
    name="verify-iceberg",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=250),
    transform=copy,
    sink={sink}(catalog, "lake.events"),
    checkpoint="{root}/user-checkpoint",
)
"""
)


def write_pipeline(tmp_path: Path, log_dir: Path, sink: str = "IcebergSink") -> Path:
    f = tmp_path / "pipeline.py"
    f.write_text(_PIPELINE.format(here=str(HERE), root=tmp_path, log=str(log_dir), sink=sink))
    return f


def _catalog(tmp_path: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog(
        "verify", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse=f"file://{tmp_path}/lake"
    )


@pytest.mark.campaign_lane
def test_an_iceberg_pipeline_passes_a_small_campaign(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """Every fault kind that applies once: db-drop is left out (PyIceberg's SQL catalog
    holds no connection across the commit: each catalog call takes one from its pool)."""
    log_dir = make_log(1200, partitions=3, keys=6)
    pipeline = write_pipeline(tmp_path, log_dir)
    out = tmp_path / "out"
    code = main(["verify", str(pipeline), "--trials", "4", "--seed", "2", "--out", str(out)])
    report = json.loads((out / "verify.json").read_text())
    failures = [t for t in report["trials"] if not t["passed"]]
    assert code == 0, failures
    assert report["faults"] == ["kill", "crash-point", "task-failure", "zombie"]
    assert {t["fault"]["kind"] for t in report["trials"]} == set(report["faults"])
    assert report["oracle"]["rows"] == 1200 and report["oracle"]["batches"] == 2
    assert report["reference"]["matched"] is True
    for t in report["trials"]:
        assert t["lost_rows"] == t["duplicated_rows"] == t["value_mismatches"] == 0, t
        # The second reader read the table after every trial, and saw the oracle's rows.
        assert t["readers"]["duckdb"]["rows"] == 1200, t
        assert set(t["readers"]["duckdb"]) >= {"lost_rows", "duplicated_rows"}, t
        assert set(t["leftovers"]) == {"orphan_dirs", "orphan_files"}, t
    assert sum(t["fault_fired"] for t in report["trials"]) >= 3
    zombies = [t for t in report["trials"] if t["fault"]["kind"] == "zombie"]
    assert all(t["zombie_fenced"] is True for t in zombies if t["fault_fired"])
    assert report["readers"]["duckdb"]["trials"] == 4
    assert report["leftovers"]["trials"] == 4
    # The last trial's table, as the tests' own readers see it: each record once.
    for reader in (pyiceberg_rows, duckdb_rows):
        ids = [r[0] for r in reader(_catalog(tmp_path), "lake.events", ["record_id"])]
        assert len(ids) == 1200 and len(set(ids)) == 1200, reader.__name__


@pytest.mark.crash_lane
def test_verify_catches_an_iceberg_ledger_without_its_check(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """The planted bug (tests/verify/broken_iceberg.py): the ledger store checks nothing at
    the commit and trusts the newest entry it read before staging. The zombie, thawed after
    the newer run committed everything, commits its batch again: verify counts the rows
    twice through both of its readers and fails the trial, and the tests' own readers see
    them twice too."""
    log_dir = make_log(1200, partitions=3, keys=6)
    pipeline = write_pipeline(tmp_path, log_dir, sink="UncheckedIcebergSink")
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "1", "--seed", "3", "--faults", "zombie"]
    assert main([*args, "--out", str(out)]) == 1
    report = json.loads((out / "verify.json").read_text())
    [trial] = report["trials"]
    assert trial["fault_fired"] and not trial["passed"], trial
    assert trial["duplicated_rows"] > 0, trial
    assert trial["readers"]["duckdb"]["duplicated_rows"] == trial["duplicated_rows"], trial
    for reader in (pyiceberg_rows, duckdb_rows):
        ids = Counter(r[0] for r in reader(_catalog(tmp_path), "lake.events", ["record_id"]))
        twice = [i for i, n in ids.items() if n > 1]
        assert len(ids) == 1200 and len(twice) == trial["duplicated_rows"], reader.__name__
