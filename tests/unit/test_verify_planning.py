"""Planning a ``sparkonce verify`` invocation: refusals, resume, replay, oracle time, stores.

Pure: reports are written as JSON files the way a campaign writes them; no driver runs.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest

from sparkonce.errors import ConfigError
from sparkonce.verify.model import Fault, TrialOutcome
from sparkonce.verify.planning import (
    TrialPlan,
    VerifyRequest,
    check_request,
    load_plan,
    plan_trials,
    store_workdirs,
)
from sparkonce.verify.report import Recorded

KILL = Fault("kill", delay_s=4.2)
CRASH = Fault("crash-point", point="after-rows", hit=2)


def outcome(
    trial: int, *, passed: bool = True, fired: bool = True, fault: Fault = KILL
) -> TrialOutcome:
    return TrialOutcome(trial, f"7:{trial}", fault, passed=passed, fault_fired=fired)


def write_report(
    out: Path,
    trials: list[TrialOutcome],
    *,
    seed: int = 7,
    faults: tuple[str, ...] = ("kill", "crash-point"),
    oracle_seconds: float | None = 40.0,
) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "seed": seed,
        "faults": list(faults),
        "oracle": None if oracle_seconds is None else {"seconds": oracle_seconds},
        "trials": [asdict(t) for t in trials],
    }
    path = out / "verify.json"
    path.write_text(json.dumps(doc))
    return path


KINDS = ("kill", "crash-point")


# -- refusals before any work ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("request_", "message"),
    [
        (VerifyRequest(trials=0), "--trials must be >= 1, got 0"),
        (VerifyRequest(trials=-3, resume=True), "--trials must be >= 1, got -3"),
        (
            VerifyRequest(replay=-1),
            "--replay takes a trial number from verify.json (0 or more), got -1",
        ),
        (
            VerifyRequest(retime_oracle=True),
            "--retime-oracle only changes a campaign that goes on (--resume) or repeats a "
            "trial (--replay N); a new campaign always times its oracle",
        ),
    ],
)
def test_a_request_that_cannot_mean_anything_is_refused(
    request_: VerifyRequest, message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        check_request(request_)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "request_",
    [
        VerifyRequest(trials=1),
        VerifyRequest(trials=0, replay=3),  # a replay ignores --trials
        VerifyRequest(replay=0, retime_oracle=True),
        VerifyRequest(resume=True, retime_oracle=True),
    ],
)
def test_sensible_requests_pass_the_check(request_: VerifyRequest) -> None:
    check_request(request_)


def test_only_resume_and_replay_read_the_report() -> None:
    assert not VerifyRequest().reads_report
    assert VerifyRequest(resume=True).reads_report
    assert VerifyRequest(replay=0).reads_report


# -- a new campaign ----------------------------------------------------------------------------
def test_a_new_campaign_runs_every_trial_and_times_its_oracle(tmp_path: Path) -> None:
    plan = plan_trials(VerifyRequest(trials=4), None, tmp_path)
    assert plan == TrialPlan(
        trials=[0, 1, 2, 3],
        report=tmp_path / "verify.json",
        chart=tmp_path / "recovery.png",
    )
    assert plan.recorded_faults == {}


def test_without_resume_an_existing_report_is_not_read(tmp_path: Path) -> None:
    # Not even checked: a new campaign with another seed overwrites it.
    write_report(tmp_path, [outcome(0)], seed=99)
    plan = load_plan(VerifyRequest(trials=2, seed=7), tmp_path, KINDS)
    assert plan.trials == [0, 1] and plan.kept == [] and plan.oracle_seconds is None


# -- --resume ----------------------------------------------------------------------------------
def test_resume_keeps_fired_and_failed_trials_and_runs_the_rest_and_the_unfired(
    tmp_path: Path,
) -> None:
    fired, failed = outcome(0), outcome(1, passed=False, fired=False)
    unfired = outcome(2, fired=False)
    write_report(tmp_path, [fired, failed, unfired], oracle_seconds=38.5)
    plan = load_plan(VerifyRequest(trials=5, seed=7, resume=True), tmp_path, KINDS)
    assert plan.kept == [fired, failed]
    assert plan.trials == [2, 3, 4]
    assert plan.rerun == [2]
    assert plan.oracle_seconds == 38.5  # kills planned on the recorded time
    assert plan.report == tmp_path / "verify.json"  # the campaign's report goes on
    assert plan.chart == tmp_path / "recovery.png"
    assert plan.replay is None and plan.recorded_faults == {}
    assert plan.notes == [
        f"resuming: 2 trials kept from {tmp_path / 'verify.json'}",
        "running again 1 trials whose fault did not fire: [2]",
    ]


def test_resume_with_fewer_trials_keeps_every_recorded_one_and_reruns_only_those_in_range(
    tmp_path: Path,
) -> None:
    recorded = Recorded([outcome(0), outcome(3), outcome(1, fired=False), outcome(4, fired=False)])
    plan = plan_trials(VerifyRequest(trials=2, resume=True), recorded, tmp_path)
    assert [o.trial for o in plan.kept] == [0, 3]  # trial 3 stays in the report
    assert plan.trials == [1]
    assert plan.rerun == [1]  # trial 4 is beyond --trials: not run again
    assert plan.notes[-1] == "running again 1 trials whose fault did not fire: [1]"


def test_resume_of_a_complete_campaign_runs_nothing(tmp_path: Path) -> None:
    recorded = Recorded([outcome(0), outcome(1)], oracle_seconds=12.0)
    plan = plan_trials(VerifyRequest(trials=2, resume=True), recorded, tmp_path)
    assert plan.trials == [] and len(plan.kept) == 2
    assert plan.notes == [f"resuming: 2 trials kept from {tmp_path / 'verify.json'}"]


def test_resume_where_only_unfired_trials_were_recorded_still_says_it_resumes(
    tmp_path: Path,
) -> None:
    recorded = Recorded([outcome(0, fired=False)])
    plan = plan_trials(VerifyRequest(trials=1, resume=True), recorded, tmp_path)
    assert plan.kept == [] and plan.trials == [0] and plan.rerun == [0]
    assert plan.notes[0] == f"resuming: 0 trials kept from {tmp_path / 'verify.json'}"


def test_resume_without_a_report_is_a_new_campaign(tmp_path: Path) -> None:
    plan = load_plan(VerifyRequest(trials=3, resume=True), tmp_path, KINDS)
    assert plan.trials == [0, 1, 2] and plan.kept == [] and plan.notes == []
    assert plan.oracle_seconds is None


def test_retime_oracle_plans_on_a_new_measurement(tmp_path: Path) -> None:
    write_report(tmp_path, [outcome(0)], oracle_seconds=38.5)
    request = VerifyRequest(trials=2, seed=7, resume=True, retime_oracle=True)
    plan = load_plan(request, tmp_path, KINDS)
    assert plan.oracle_seconds is None
    assert [o.trial for o in plan.kept] == [0]  # recorded trials keep their faults


def test_a_report_without_an_oracle_time_leaves_the_oracle_to_time_itself(tmp_path: Path) -> None:
    write_report(tmp_path, [outcome(0)], oracle_seconds=None)
    plan = load_plan(VerifyRequest(trials=2, seed=7, resume=True), tmp_path, KINDS)
    assert plan.oracle_seconds is None


# -- --replay ----------------------------------------------------------------------------------
def test_replay_takes_the_recorded_fault_and_writes_beside_the_report(tmp_path: Path) -> None:
    write_report(tmp_path, [outcome(0), outcome(1, passed=False, fault=CRASH)], oracle_seconds=30.0)
    plan = load_plan(VerifyRequest(trials=20, seed=7, replay=1), tmp_path, KINDS)
    assert plan.trials == [1]
    assert plan.replay == 1 and plan.replay_fault == CRASH
    assert plan.recorded_faults == {1: CRASH}
    assert plan.kept == [] and plan.rerun == []
    assert plan.report == tmp_path / "replay-1.json"  # never overwrites verify.json
    assert plan.chart == tmp_path / "replay-1.png"
    assert plan.oracle_seconds == 30.0
    assert plan.notes == ["replaying trial 1 with its recorded fault: crash-point at after-rows@2"]


def test_replay_of_a_trial_not_in_the_report_plans_its_fault_from_the_seed(
    tmp_path: Path,
) -> None:
    write_report(tmp_path, [outcome(0)], oracle_seconds=30.0)
    plan = load_plan(VerifyRequest(seed=7, replay=5), tmp_path, KINDS)
    assert plan.trials == [5]
    assert plan.replay_fault is None and plan.recorded_faults == {}
    assert plan.oracle_seconds == 30.0
    assert plan.notes == [
        f"replaying trial 5 with the fault planned from seed 7 (not in {tmp_path / 'verify.json'})"
    ]
    retimed = load_plan(VerifyRequest(seed=7, replay=5, retime_oracle=True), tmp_path, KINDS)
    assert retimed.oracle_seconds is None


def test_replay_without_a_report_plans_from_the_seed(tmp_path: Path) -> None:
    plan = load_plan(VerifyRequest(seed=3, replay=0), tmp_path, KINDS)
    assert plan.trials == [0] and plan.replay_fault is None and plan.oracle_seconds is None
    assert "the fault planned from seed 3" in plan.notes[0]


# -- the report must be this campaign's --------------------------------------------------------
@pytest.mark.parametrize(
    "request_", [VerifyRequest(seed=8, resume=True), VerifyRequest(seed=8, replay=0)]
)
def test_a_report_with_another_seed_is_refused(tmp_path: Path, request_: VerifyRequest) -> None:
    path = write_report(tmp_path, [outcome(0)], seed=7)
    with pytest.raises(ConfigError) as info:
        load_plan(request_, tmp_path, KINDS)
    assert str(info.value) == (
        f"{path} holds a campaign with seed 7 and faults ['kill', 'crash-point']; --resume "
        "and --replay need the same --seed and --faults (or another --out)"
    )


def test_a_report_with_other_fault_kinds_is_refused(tmp_path: Path) -> None:
    write_report(tmp_path, [outcome(0)], faults=("kill", "crash-point"))
    for kinds in (("kill",), ("crash-point", "kill"), ("kill", "crash-point", "zombie")):
        with pytest.raises(ConfigError, match="need the same --seed and --faults"):
            load_plan(VerifyRequest(seed=7, resume=True), tmp_path, kinds)


def test_a_report_this_version_cannot_read_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "verify.json"
    path.write_text(json.dumps({"seed": 7, "faults": list(KINDS), "trials": [{"trial": 0}]}))
    with pytest.raises(ConfigError) as info:
        load_plan(VerifyRequest(seed=7, resume=True), tmp_path, KINDS)
    message = str(info.value)
    assert message.startswith(f"{path} is not a verify report this version can read (")
    assert message.endswith("move it away, or give another --out")


# -- parallel stores ---------------------------------------------------------------------------
def test_one_store_works_in_out_work_and_several_in_one_directory_each(tmp_path: Path) -> None:
    assert store_workdirs(tmp_path, [None]) == [tmp_path / "work"]
    assert store_workdirs(tmp_path, ["sqlite:///a.db"]) == [tmp_path / "work"]
    assert store_workdirs(tmp_path, ["sqlite:///a.db", "sqlite:///b.db", None]) == [
        tmp_path / "work" / "w0",
        tmp_path / "work" / "w1",
        tmp_path / "work" / "w2",
    ]


def test_a_store_named_twice_is_refused(tmp_path: Path) -> None:
    urls: list[str | None] = ["sqlite:///a.db", "sqlite:///b.db", "sqlite:///a.db"]
    with pytest.raises(ConfigError) as info:
        store_workdirs(tmp_path, urls)
    assert str(info.value) == (
        "--sink names the same store twice (['sqlite:///a.db', 'sqlite:///b.db', "
        "'sqlite:///a.db']); parallel trials each need their own store"
    )


def test_a_report_that_is_not_json_is_refused_as_unreadable(tmp_path: Path) -> None:
    path = tmp_path / "verify.json"
    path.write_text("{ this is not JSON")
    with pytest.raises(ConfigError) as info:
        load_plan(VerifyRequest(seed=7, replay=0), tmp_path, KINDS)
    assert str(info.value).startswith(f"{path} is not a verify report this version can read (")


def test_the_recorded_kill_timing_goes_with_the_oracle_time_unless_retimed(tmp_path: Path) -> None:
    path = write_report(tmp_path, [outcome(0)], oracle_seconds=38.5)
    doc = json.loads(path.read_text())
    doc["oracle"].update(first_commit_s=12.5, batch_interval_s=1.5)
    path.write_text(json.dumps(doc))
    plan = load_plan(VerifyRequest(trials=2, seed=7, resume=True), tmp_path, KINDS)
    assert (plan.oracle_seconds, plan.oracle_timing) == (38.5, (12.5, 1.5))
    replay = load_plan(VerifyRequest(seed=7, replay=0), tmp_path, KINDS)
    assert replay.oracle_timing == (12.5, 1.5)
    request = VerifyRequest(trials=2, seed=7, resume=True, retime_oracle=True)
    retimed = load_plan(request, tmp_path, KINDS)
    assert (retimed.oracle_seconds, retimed.oracle_timing) == (None, (None, None))
