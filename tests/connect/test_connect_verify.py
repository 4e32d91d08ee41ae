"""``sparkonce verify --remote local[2]``: a crash-test campaign whose trial drivers run on
Spark Connect sessions, each the client of a Connect server it starts (its JVM and Python
workers in the driver's process group)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import main
from sparkonce.errors import ConfigError
from sparkonce.verify.campaign import check_remote
from tests.verify.test_verify import write_pipeline


def test_a_connect_campaign_takes_a_local_server_only_and_no_task_faults() -> None:
    check_remote("local", None)
    check_remote("local[4]", None)
    for bad in ("sc://spark.example:15002", "local[0]", "yarn"):
        with pytest.raises(ConfigError, match="local or local\\[N\\]"):
            check_remote(bad, None)
    with pytest.raises(ConfigError, match="exclude each other"):
        check_remote("local[2]", "local[2]")


@pytest.mark.campaign_lane
def test_verify_on_connect_kills_crashes_and_fences_a_zombie_and_loses_nothing(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """One trial per fault kind a Connect session has: the client and its server SIGKILLed
    mid-run, the server's Python worker SIGKILLed at a crash point of the commit, and a zombie
    (its worker frozen before a commit while a newer driver, with a server of its own, runs
    the pipeline to the end). Each trial must fire and match the oracle, which matched
    Spark's plain foreachBatch run on a classic session."""
    log_dir = make_log(600, partitions=2, keys=4)
    sink = f"sqlite:///{tmp_path / 'sink.db'}"
    pipeline = write_pipeline(tmp_path, log_dir, f"sink_from_url({sink!r}, 'events_out')")
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "3", "--seed", "5", "--out", str(out)]
    code = main([*args, "--remote", "local[2]", "--faults", "kill,crash-point,zombie"])
    report = json.loads((out / "verify.json").read_text())
    assert code == 0, [t for t in report["trials"] if not t["passed"]]
    assert report["spark_session"] == {"mode": "connect", "remote": "local[2]"}
    assert report["reference"]["matched"] is True, report["reference"]
    trials = {t["fault"]["kind"]: t for t in report["trials"]}
    assert set(trials) == {"kill", "crash-point", "zombie"}
    assert all(t["fault_fired"] for t in trials.values()), trials
    assert all(t["lost_rows"] == t["duplicated_rows"] == 0 for t in trials.values())
    assert trials["zombie"]["zombie_fenced"] is True
    assert report["oracle"]["rows"] == 600
    # The drivers were Connect clients: the oracle's batches ran in its server's
    # foreachBatch worker, whose lines its log holds.
    assert "Streaming ForeachBatch worker" in (out / "work" / "oracle.log").read_text()
