"""benchmarks/kafka_broker_faults.py (``make bench-broker-faults``), issue 44's broker-kill
campaign, at its smallest: one pipeline kind, one kill, on the script's own 3-node cluster. The
script runs end to end, its JSON holds what its docstring says it reports, and the run is
exactly-once with no driver exit. The verdict's arithmetic is checked without services.

Stall times are not checked here (one kill on a shared machine says nothing about them).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kafka_broker_faults.py"


def campaign() -> ModuleType:
    return importlib.import_module("benchmarks.kafka_broker_faults")


def test_the_verdict_counts_lost_duplicated_and_extra_values() -> None:
    verdict = campaign().verdict
    good = verdict(["a", "b", "c"], ["c", "a", "b"])
    assert good["exactly_once"] and good["input"] == good["output"] == 3
    bad = verdict(["a", "b", "c"], ["a", "a", "c", "z"])
    assert (bad["lost"], bad["duplicated"], bad["extra"]) == (1, 1, 1)
    assert not bad["exactly_once"]
    assert not verdict(["a", "a"], ["a"])["exactly_once"]  # a value sent twice, written once


def test_kills_are_split_over_the_pipelines_in_turn() -> None:
    split = campaign().split_kills
    assert split(30, ["k2k", "k2k-driver-kill", "spark2k", "k2pg"]) == {
        "k2k": 8,
        "k2k-driver-kill": 8,
        "spark2k": 7,
        "k2pg": 7,
    }
    assert split(1, ["k2k"]) == {"k2k": 1}


@pytest.mark.kafka
@pytest.mark.campaign_lane  # a benchmark's smoke run: a cluster, a driver, a kill
def test_one_kill_under_a_kafka_to_kafka_run_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "kafka-broker-faults.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--kills",
            "1",
            "--pipelines",
            "k2k",
            "--rate",
            "50",
            "--restart-delay",
            "2",
            "--stall-timeout",
            "240",
            "--out",
            str(out),
            "--workdir",
            str(tmp_path / "work"),
        ],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    assert report["benchmark"] == "kafka-broker-faults" and report["smoke"] is True
    assert report["machine"] and report["date"] and report["commit"]
    assert report["kills"] == 1 and report["kills_without_commit"] == 0
    assert report["driver_exits_caused_by_broker_kill"] == 0 and report["driver_exits"] == []
    assert report["exactly_once"] == {"k2k": True}
    check = report["checks"]["k2k"]
    assert check["input"] == check["output"] > 0 and check["final_stop_exit_code"] == 143
    (row,) = report["rows"]
    assert row["pipeline"] == "k2k" and row["node"] in (1, 2, 3)
    assert row["role"] in (
        "input-leader",
        "output-leader",
        "coordinator",
        "controller",
        "ledger-leader",
    )
    assert row["stall_s"] > 0 and row["driver_exits"] == [] and not row["driver_killed"]
    assert report["stall_s"]["n"] == 1 and report["stall_s"]["median"] == row["stall_s"]
    (line,) = report["summary"]  # the docs' table: one row per pipeline kind
    assert line["kind"] == "k2k" and line["kills"] == 1 and line["driver_exits"] == 0
    assert line["exactly_once"] and line["lost"] == line["duplicated"] == 0
    assert line["stall_median_s"] == row["stall_s"] and line["input"] == check["input"]
    assert "kill 1" in proc.stderr  # the console's progress


@pytest.mark.kafka
@pytest.mark.campaign_lane  # about 6 minutes: the rotation runs it
def test_every_role_killed_under_each_kafka_pipeline_kind_stops_no_driver(tmp_path: Path) -> None:
    """Issue 44's full schedule, in the rotation: every broker role killed once under each of
    the four pipeline kinds (KafkaSource and SparkKafkaSource into KafkaSink, KafkaSource into
    two-phase PostgreSQL), a driver SIGKILL on top of a broker kill, no driver exit, and each
    output checked against its input by an independent reader."""
    out = tmp_path / "kafka-broker-faults.json"
    args = ["--kills", "20", "--rate", "50", "--restart-delay", "3", "--stall-timeout", "240"]
    args += ["--out", str(out), "--workdir", str(tmp_path / "work")]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    report = json.loads(out.read_text())
    kinds = ("k2k", "k2k-driver-kill", "spark2k", "k2pg")
    assert report["driver_exits_caused_by_broker_kill"] == 0 and report["driver_exits"] == []
    assert report["exactly_once"] == dict.fromkeys(kinds, True)
    assert report["kills"] == 20 and report["kills_without_commit"] == 0
    kafka_roles = {"input-leader", "output-leader", "coordinator", "controller", "ledger-leader"}
    for kind in kinds:
        killed = {row["role"] for row in report["rows"] if row["pipeline"] == kind}
        assert killed == ({"input-leader", "controller"} if kind == "k2pg" else kafka_roles), kind
        check = report["checks"][kind]
        assert check["input"] == check["output"] > 0 and check["lost"] == 0, kind
    assert report["checks"]["k2pg"]["prepared_transactions_left"] == 0
    (restart,) = report["driver_restarts"]  # the SIGKILLed driver, started again, commits
    assert restart["pipeline"] == "k2k-driver-kill" and restart["first_commit_s"] > 0
