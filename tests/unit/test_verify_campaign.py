"""The verifier's pure parts: row comparison, fault specs, deterministic plans, reports."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from sparkonce.errors import ConfigError
from sparkonce.verify.campaign import (
    Fault,
    Oracle,
    Recorded,
    TrialOutcome,
    compare_rows,
    load_report,
    parse_fault_kinds,
    plan_fault,
    run_trials,
    summarize,
    write_json,
)

ORACLE = [{"id": "a", "v": 1}, {"id": "b", "v": 2}, {"id": "c", "v": 3}]


def test_identical_rows_in_any_order_match() -> None:
    assert compare_rows(ORACLE, list(reversed(ORACLE))) == (0, 0, 0)


def test_lost_and_duplicated_rows_are_counted() -> None:
    actual = [ORACLE[0], ORACLE[0], ORACLE[1]]
    assert compare_rows(ORACLE, actual) == (1, 1, 0)


def test_equal_bytes_twice_is_two_rows() -> None:
    """Two equal rows in the oracle are two logical records; one of them missing is a loss."""
    oracle = [{"v": 1}, {"v": 1}]
    assert compare_rows(oracle, [{"v": 1}]) == (1, 0, 0)


def test_with_keys_a_changed_value_is_a_mismatch_not_a_loss() -> None:
    actual = [{"id": "a", "v": 1}, {"id": "b", "v": 99}, {"id": "c", "v": 3}]
    assert compare_rows(ORACLE, actual, keys=("id",)) == (0, 0, 1)
    assert compare_rows(ORACLE, actual) == (1, 1, 0)


def test_fault_kinds_are_validated() -> None:
    assert parse_fault_kinds(None)[0] == "kill"
    assert parse_fault_kinds("kill, zombie") == ("kill", "zombie")
    assert parse_fault_kinds("crash-point:after-rows") == ("crash-point:after-rows",)
    for bad in ("explode", "crash-point:nowhere", "kill:after-rows", ","):
        with pytest.raises(ConfigError, match="--faults"):
            parse_fault_kinds(bad)


@pytest.mark.parametrize("kind", ["kill", "crash-point", "db-drop", "zombie", "task-failure"])
def test_a_trial_plan_depends_only_on_its_seed(kind: str) -> None:
    oracle = Oracle(rows=[], seconds=30.0, batches=4)
    plans = {plan_fault(kind, random.Random("7:3"), oracle) for _ in range(5)}
    assert len(plans) == 1
    fault = plans.pop()
    assert fault.kind == kind
    assert 1 <= fault.hit <= 4
    if kind == "kill":
        assert fault.delay_s is not None and 9.0 <= fault.delay_s <= 28.5


def test_pinned_crash_point_is_used() -> None:
    oracle = Oracle(rows=[], seconds=10.0, batches=2)
    for seed in range(20):
        fault = plan_fault("crash-point:after-rows", random.Random(seed), oracle)
        assert fault.point == "after-rows"


def test_summary_counts_per_kind_and_p95() -> None:
    outcomes = [
        TrialOutcome(
            i,
            f"0:{i}",
            Fault("kill"),
            passed=i != 3,
            fault_fired=True,
            recovery_s=float(i),
            lost_rows=int(i == 3),
        )
        for i in range(1, 21)
    ] + [TrialOutcome(99, "0:99", Fault("zombie"), passed=True, zombie_fenced=True)]
    summary = {s.kind: s for s in summarize(outcomes, ["kill", "zombie", "db-drop"])}
    assert set(summary) == {"kill", "zombie"}
    kill = summary["kill"]
    assert (kill.trials, kill.passed, kill.lost_rows) == (20, 19, 1)
    assert kill.recovery_mean_s == pytest.approx(10.5)
    assert kill.recovery_p95_s == 19.0
    assert summary["zombie"].recovery_mean_s is None


def test_resume_reads_back_trials_and_refuses_another_campaign(tmp_path: Path) -> None:
    path = tmp_path / "verify.json"
    trial = TrialOutcome(4, "5:4", Fault("kill", delay_s=3.5), passed=True, fault_fired=True)
    from dataclasses import asdict

    path.write_text(
        json.dumps(
            {
                "seed": 5,
                "faults": ["kill"],
                "oracle": {"rows": 6, "batches": 2, "seconds": 38.5},
                "trials": [asdict(trial)],
            }
        )
    )
    recorded = load_report(path, 5, ["kill"])
    assert recorded.outcomes == [trial]
    assert recorded.oracle_seconds == 38.5
    with pytest.raises(ConfigError, match="same --seed"):
        load_report(path, 6, ["kill"])
    assert load_report(tmp_path / "none.json", 5, ["kill"]) == Recorded()
    path.write_text(json.dumps({"seed": 5, "faults": ["kill"], "trials": [{"trial": 1}]}))
    with pytest.raises(ConfigError, match="not a verify report"):
        load_report(path, 5, ["kill"])


def test_resume_runs_again_only_passed_trials_whose_fault_did_not_fire() -> None:
    fired = TrialOutcome(0, "1:0", Fault("kill", delay_s=9.0), passed=True, fault_fired=True)
    unfired = TrialOutcome(5, "1:5", Fault("kill", delay_s=50.0), passed=True)
    no_zombie = TrialOutcome(4, "1:4", Fault("zombie", point="before-commit", hit=2), passed=True)
    failed_unfired = TrialOutcome(7, "1:7", Fault("kill", delay_s=40.0), error="boom")
    keep, again = Recorded([no_zombie, fired, unfired, failed_unfired], 38.5).split()
    assert keep == [fired, failed_unfired]  # a failure is never hidden by a re-run
    assert again == [4, 5]


def test_kill_delays_follow_the_oracle_time_they_are_planned_on() -> None:
    plans = [
        plan_fault("kill", random.Random("1:100"), Oracle([], seconds, 2)) for seconds in (38.5, 77)
    ]
    assert plans[0].delay_s is not None and plans[1].delay_s is not None
    assert 0.3 * 38.5 <= plans[0].delay_s <= 0.95 * 38.5
    assert plans[1].delay_s == pytest.approx(2 * plans[0].delay_s, abs=0.01)


class _FakeCampaign:
    """Stands in for a Campaign in the scheduler tests: records which trials it ran."""

    def __init__(self, oracle: Oracle, fail_on: int | None = None) -> None:
        self.oracle = oracle
        self.fail_on = fail_on
        self.ran: list[int] = []
        self.aborted = threading.Event()

    def plan(self, trial: int) -> Fault:
        return Fault("kill", delay_s=float(trial))

    def run_trial(self, trial: int) -> TrialOutcome:
        self.ran.append(trial)
        if trial == self.fail_on:
            raise RuntimeError(f"store broke in trial {trial}")
        # Give the other worker a chance to take trials too.
        self.aborted.wait(0.01)
        return TrialOutcome(trial, f"0:{trial}", self.plan(trial), passed=True)

    def abort(self) -> None:
        self.aborted.set()


def test_parallel_trials_run_each_trial_once_and_tag_the_store() -> None:
    oracle = Oracle(rows=[], seconds=1.0, batches=1)
    a, b = _FakeCampaign(oracle), _FakeCampaign(oracle)
    started: list[int] = []
    outcomes = list(run_trials([a, b], range(40), on_start=lambda n, _f: started.append(n)))  # type: ignore[list-item]
    assert sorted(o.trial for o in outcomes) == list(range(40))
    assert sorted(started) == list(range(40))
    assert a.ran and b.ran, "both stores should have taken trials"
    assert sorted(a.ran + b.ran) == list(range(40))
    assert {o.trial for o in outcomes if o.worker == 1} == set(b.ran)


def test_a_broken_worker_stops_the_campaign_and_aborts_the_others() -> None:
    oracle = Oracle(rows=[], seconds=1.0, batches=1)
    a, b = _FakeCampaign(oracle, fail_on=5), _FakeCampaign(oracle, fail_on=5)
    with pytest.raises(RuntimeError, match="store broke in trial 5"):
        list(run_trials([a, b], range(100)))  # type: ignore[list-item]
    assert a.aborted.is_set() and b.aborted.is_set()
    assert len(a.ran) + len(b.ran) < 100


def test_parallel_trials_need_one_shared_oracle() -> None:
    a = _FakeCampaign(Oracle(rows=[], seconds=1.0, batches=1))
    b = _FakeCampaign(Oracle(rows=[], seconds=1.0, batches=1))
    with pytest.raises(ConfigError, match="same oracle"):
        list(run_trials([a, b], range(3)))  # type: ignore[list-item]


def test_replay_takes_the_fault_recorded_for_the_trial(tmp_path: Path) -> None:
    """A kill recorded with a delay planned on another oracle time is replayed as
    recorded; trials not in the report are still planned from the seed."""
    from sparkonce.log.storage import Topic
    from sparkonce.verify.campaign import Campaign

    Topic.create(tmp_path / "log", "events", partitions=1).close()
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink\n"
        "pipeline = Pipeline(name='replay', transform=lambda df: df,\n"
        f"    source=EmbeddedLogSource({str(tmp_path / 'log')!r}, 'events'),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'out'),\n"
        f"    checkpoint={str(tmp_path / 'checkpoint')!r})\n"
    )
    campaign = Campaign(pipeline, workdir=tmp_path / "work", seed=1, kinds=["kill"])
    try:
        campaign.oracle = Oracle([], 20.0, 2)
        planned = campaign.plan(7)
        recorded = Fault("kill", delay_s=31.5)
        assert planned != recorded
        report = Recorded([TrialOutcome(7, "1:7", recorded, passed=True)], 33.3)
        assert report.fault_of(7) == recorded and report.fault_of(8) is None
        campaign.recorded_faults[7] = recorded
        assert campaign.plan(7) == recorded
        assert campaign.plan(8) == plan_fault("kill", random.Random("1:8"), campaign.oracle)
    finally:
        campaign.close()


def test_report_tells_this_runs_time_apart_from_all_trials(tmp_path: Path) -> None:
    """After --resume, the wall time belongs to the trials this run ran, not to the report."""
    from types import SimpleNamespace

    kept = [TrialOutcome(i, f"5:{i}", Fault("kill"), True, True, seconds=40.0) for i in range(3)]
    new = TrialOutcome(3, "5:3", Fault("kill"), True, True, seconds=50.0)
    campaign: Any = SimpleNamespace(
        pipeline_file=Path("p.py"),
        pipeline=SimpleNamespace(name="p", sink=SimpleNamespace(describe=lambda: "sink")),
        seed=5,
        kinds=("kill",),
        oracle=Oracle(rows=[], seconds=20.0, batches=2),
    )
    path = tmp_path / "verify.json"
    write_json(path, campaign, [*kept, new], 75.0, ran=1)
    doc = json.loads(path.read_text())
    assert doc["this_run"] == {"trials": 1, "elapsed_s": 75.0}
    assert doc["trial_seconds"] == 170.0
    assert len(doc["trials"]) == 4
    write_json(path, campaign, kept, 130.0)
    assert json.loads(path.read_text())["this_run"] == {"trials": 3, "elapsed_s": 130.0}
