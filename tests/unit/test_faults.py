"""The fault plan (sparkonce.faults): parsed once, passed explicitly, fired faults as events.

Crash points are exercised with a recording ``on_crash`` in this process, and with real
SIGKILLs in child processes. The events file is appended to by several processes at once,
as the driver and Spark's Python workers do.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from sparkonce import faults
from sparkonce.errors import ConfigError
from sparkonce.faults import (
    EVENTS_ENV,
    NO_FAULTS,
    FaultPlan,
    InjectedTaskFailure,
    read_events,
    worker_faults,
)
from sparkonce.protocol import (
    CRASH_ENV,
    DROP_CONNECTION_ENV,
    FAIL_TASKS_ENV,
    PAUSE_ENV,
    CrashPoint,
)


def _plan(env: dict[str, str], kills: list[str]) -> FaultPlan:
    """The plan of ``env``, with a crash that records instead of SIGKILLing."""
    parsed = FaultPlan.from_env(env)
    return FaultPlan(
        crash=parsed.crash,
        pause=parsed.pause,
        drop_connection=parsed.drop_connection,
        fail_tasks=parsed.fail_tasks,
        events=parsed.events,
        on_crash=lambda: kills.append("killed"),
    )


# -- parsing ------------------------------------------------------------------------------------


def test_from_env_parses_every_variable(tmp_path: Path) -> None:
    plan = FaultPlan.from_env(
        {
            CRASH_ENV: "after-rows@2",
            PAUSE_ENV: "before-commit",
            DROP_CONNECTION_ENV: " before-ledger-commit@3 ",
            FAIL_TASKS_ENV: "read, write",
            EVENTS_ENV: str(tmp_path / "events.jsonl"),
        }
    )
    assert plan.crash == (CrashPoint.AFTER_ROWS, 2)
    assert plan.pause == (CrashPoint.BEFORE_COMMIT, 1)
    assert plan.drop_connection == (CrashPoint.BEFORE_LEDGER_COMMIT, 3)
    assert plan.fail_tasks == {"read", "write"}
    assert plan.events == tmp_path / "events.jsonl"
    assert not plan.empty


def test_an_empty_environment_is_the_no_op_plan() -> None:
    plan = FaultPlan.from_env({CRASH_ENV: "", FAIL_TASKS_ENV: " "})
    assert plan.empty and plan.events is None
    assert plan == NO_FAULTS


@pytest.mark.parametrize(
    ("var", "value", "match"),
    [
        (CRASH_ENV, "after-rowz", "unknown crash point"),
        (PAUSE_ENV, "before-commit@0", ">= 1"),
        (DROP_CONNECTION_ENV, "after-rows@x", "must be an integer"),
        (FAIL_TASKS_ENV, "read,sideways", "unknown stage"),
        ("SPARKONCE_PAUSE_TASKS", "read", "only write"),
    ],
)
def test_a_bad_value_is_refused_naming_the_variable(var: str, value: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        FaultPlan.from_env({var: value})
    assert var in str(info.value)


# -- crash points -------------------------------------------------------------------------------


def test_the_no_op_plan_does_nothing_and_counts_nothing() -> None:
    for p in CrashPoint:
        assert NO_FAULTS.crash_point(p) is False
    assert NO_FAULTS._hits == {}
    assert not NO_FAULTS.fail_task("read", "t:0:0:10", 0)


def test_crash_point_ignores_other_points() -> None:
    kills: list[str] = []
    plan = _plan({CRASH_ENV: "after-ledger-commit"}, kills)
    for _ in range(3):
        plan.crash_point(CrashPoint.AFTER_ROWS)
        plan.crash_point(CrashPoint.BEFORE_COMMIT)
    assert kills == []
    plan.crash_point(CrashPoint.AFTER_LEDGER_COMMIT)
    assert kills == ["killed"]


def test_crash_point_fires_on_the_nth_hit_only() -> None:
    kills: list[str] = []
    plan = _plan({CRASH_ENV: "before-commit@3"}, kills)
    fired_at: list[int] = []
    for i in range(1, 6):
        plan.crash_point(CrashPoint.BEFORE_COMMIT)
        if kills and not fired_at:
            fired_at.append(i)
    assert fired_at == [3]
    assert kills == ["killed"]


def test_hits_are_counted_per_plan() -> None:
    """A new run gets a new plan: its hits start again at 1."""
    kills: list[str] = []
    first = _plan({CRASH_ENV: "after-rows@2"}, kills)
    first.crash_point(CrashPoint.AFTER_ROWS)
    second = _plan({CRASH_ENV: "after-rows@2"}, kills)
    second.crash_point(CrashPoint.AFTER_ROWS)
    assert kills == []
    second.crash_point(CrashPoint.AFTER_ROWS)
    assert kills == ["killed"]


def test_drop_connection_is_returned_to_the_caller(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    plan = FaultPlan.from_env({DROP_CONNECTION_ENV: "after-rows@2", EVENTS_ENV: str(events)})
    assert plan.crash_point(CrashPoint.AFTER_ROWS) is False
    assert plan.crash_point(CrashPoint.AFTER_ROWS) is True
    assert plan.crash_point(CrashPoint.AFTER_ROWS) is False
    [event] = read_events(events)
    assert {k: event[k] for k in ("event", "point", "hit")} == {
        "event": "drop-connection",
        "point": "after-rows",
        "hit": 2,
    }
    assert event["pid"] == os.getpid() and abs(event["at"] - time.time()) < 60


def test_a_crash_is_recorded_before_it_takes_effect(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    seen: list[list[dict[str, object]]] = []
    parsed = FaultPlan.from_env({CRASH_ENV: "before-ledger-commit", EVENTS_ENV: str(events)})
    plan = FaultPlan(
        crash=parsed.crash, events=parsed.events, on_crash=lambda: seen.append(read_events(events))
    )
    plan.crash_point(CrashPoint.BEFORE_LEDGER_COMMIT)
    assert [[e["event"] for e in s] for s in seen] == [["crash"]]


# -- task failures ------------------------------------------------------------------------------


def test_fail_task_picks_about_half_of_the_first_attempts_and_never_a_retry() -> None:
    plan = FaultPlan(fail_tasks=frozenset({"read"}))
    keys = [f"events:{p}:{s}:{s + 100}" for p in range(4) for s in range(0, 2000, 100)]
    failing = [k for k in keys if plan.fail_task("read", k, 0)]
    assert 0.25 * len(keys) < len(failing) < 0.75 * len(keys)
    assert failing == [k for k in keys if plan.fail_task("read", k, 0)]  # stable
    assert not any(plan.fail_task("read", k, 1) for k in keys)
    assert not any(plan.fail_task("write", k, 0) for k in keys)


def test_a_task_failure_is_recorded_and_returned_as_the_error(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    plan = FaultPlan(fail_tasks=frozenset({"write"}), events=events)
    err = plan.task_failure("write", "p:0:1", 0, "injected task failure after the pre-commit")
    assert isinstance(err, InjectedTaskFailure) and isinstance(err, RuntimeError)
    assert "injected task failure" in str(err)
    [event] = read_events(events, "task-failure")
    assert (event["stage"], event["task"], event["attempt"]) == ("write", "p:0:1", 0)


def test_worker_faults_parses_once_and_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(faults, "_worker_plan", None)
    monkeypatch.setenv(FAIL_TASKS_ENV, "read")
    plan = worker_faults()
    assert plan.fail_tasks == {"read"}
    monkeypatch.setenv(FAIL_TASKS_ENV, "write")
    assert worker_faults() is plan  # parsed once per process
    faults.reset_worker_faults()
    assert worker_faults().fail_tasks == {"write"}
    monkeypatch.setattr(faults, "_worker_plan", None)


# -- events -------------------------------------------------------------------------------------


def test_fenced_is_an_event(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    FaultPlan(events=events).fenced("sums", 1, 2)
    FaultPlan(events=events).fenced("sums", None, None)
    got = read_events(events, "fenced")
    assert [(e["pipeline"], e["epoch"], e["owner_epoch"]) for e in got] == [
        ("sums", 1, 2),
        ("sums", None, None),
    ]
    NO_FAULTS.fenced("sums", 1, 2)  # no events file: nothing, and no error


def test_read_events_filters_and_skips_a_torn_line(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    assert read_events(events) == []
    events.write_text(
        json.dumps({"event": "pause", "point": "before-commit", "hit": 1})
        + "\n\n"
        + json.dumps({"event": "fenced", "pipeline": "p"})
        + '\n{"event": "cra'
    )
    assert [e["event"] for e in read_events(events)] == ["pause", "fenced"]
    assert [e["event"] for e in read_events(events, "fenced")] == ["fenced"]


_APPENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sparkonce.faults import FaultPlan
    plan = FaultPlan(events=Path(sys.argv[1]))
    for i in range(200):
        plan.record("task-failure", stage="read", task="x" * 300 + str(i), attempt=0)
    """
)


def test_processes_appending_at_once_never_interleave_lines(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    procs = [subprocess.Popen([sys.executable, "-c", _APPENDER, str(events)]) for _ in range(4)]
    for p in procs:
        assert p.wait(timeout=120) == 0
    lines = events.read_text().splitlines()
    assert len(lines) == 800
    got = [json.loads(line) for line in lines]  # every line whole
    assert len({e["pid"] for e in got}) == 4


# -- real SIGKILLs ------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    from sparkonce.faults import FaultPlan
    from sparkonce.protocol import CrashPoint
    plan = FaultPlan.from_env()
    for i in range(3):
        plan.crash_point(CrashPoint.AFTER_ROWS)
        print(f"survived {i + 1}", flush=True)
    """
)


def _env(spec: str, events: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env[CRASH_ENV] = spec
    if events is not None:
        env[EVENTS_ENV] = str(events)
    return env


def test_crash_point_really_sigkills_the_process(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=_env("after-rows@2", events),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert proc.stdout.splitlines() == ["survived 1"]
    [event] = read_events(events)
    assert (event["event"], event["point"], event["hit"]) == ("crash", "after-rows", 2)
    assert isinstance(event["pid"], int) and event["pid"] != os.getpid()  # the child's


def test_crash_point_other_point_lets_the_child_finish(tmp_path: Path) -> None:
    events = tmp_path / "events.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=_env("before-commit", events),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["survived 1", "survived 2", "survived 3"]
    assert read_events(events) == []


def _dead(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def test_crash_point_kills_the_whole_group_of_a_group_leader() -> None:
    child = textwrap.dedent(
        """
        import subprocess, sys
        from sparkonce.faults import FaultPlan
        from sparkonce.protocol import CrashPoint
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        print(helper.pid, flush=True)
        FaultPlan.from_env().crash_point(CrashPoint.BEFORE_COMMIT)
        print("survived", flush=True)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", child],
        env=_env("before-commit"),
        capture_output=True,
        text=True,
        timeout=60,
        start_new_session=True,  # the child leads its own process group
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 1
    helper = int(lines[0])
    deadline = time.monotonic() + 10
    while not _dead(helper) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _dead(helper), "the group member outlived the crash"


# -- who records: the runner (fenced) and the verifier's driver processes ------------------------


class _FencedOnOpen:
    """Just enough of a sink for run_pipeline to reach open(), which finds the run fenced."""

    guarantee = "effectively-once"

    def __init__(self) -> None:
        self.faults: FaultPlan | None = None

    def use_faults(self, plan: FaultPlan) -> None:
        self.faults = plan

    def open(self) -> None:
        from sparkonce.errors import FencedError

        raise FencedError("sums", 3, 4)

    def close(self) -> None:
        pass


def test_the_runner_hands_its_plan_to_the_sink_and_records_a_fencing(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from sparkonce.errors import FencedError
    from sparkonce.pipeline.runner import run_pipeline

    events = tmp_path / "events.jsonl"
    plan = FaultPlan(events=events)
    sink = _FencedOnOpen()
    pipeline = SimpleNamespace(name="sums", sink=sink)
    with pytest.raises(FencedError):
        run_pipeline(pipeline, None, faults=plan)  # type: ignore[arg-type]
    assert sink.faults is plan
    [event] = read_events(events)
    assert (event["event"], event["pipeline"], event["epoch"], event["owner_epoch"]) == (
        "fenced",
        "sums",
        3,
        4,
    )
    with pytest.raises(FencedError):
        run_pipeline(pipeline, None)  # type: ignore[arg-type]
    assert sink.faults is NO_FAULTS  # no plan given: the no-op one, never the environment


_ENTRY = textwrap.dedent(
    """
    import sys
    from sparkonce.faults import FaultPlan
    from sparkonce.protocol import CrashPoint
    plan = FaultPlan.from_env()
    key = next(k for k in (f"t:0:{s}:99" for s in range(50)) if plan.fail_task("read", k, 0))
    plan.phase("run-started")
    plan.task_failure("read", key, 0, "injected")
    plan.phase("query-started")
    plan.crash_point(CrashPoint.AFTER_ROWS)
    print("survived", flush=True)
    """
)


def test_each_driver_run_has_its_own_events_file(tmp_path: Path) -> None:
    from sparkonce.verify.driver import SIGKILL_EXIT, Driver

    (tmp_path / "fake_entry.py").write_text(_ENTRY)
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        FAIL_TASKS_ENV: "read",
    }
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text("")
    crashed = Driver(
        pipeline_file,
        tmp_path / "logs" / "fault.log",
        crash_at=CrashPoint.AFTER_ROWS,
        env=env,
        entry=("fake_entry",),
    )
    assert crashed.start().wait(60) == SIGKILL_EXIT, crashed.log_tail()
    assert crashed.events_path == tmp_path / "logs" / "fault.events.jsonl"
    assert [e["event"] for e in crashed.events("crash")] == ["crash"]
    [failed] = crashed.events("task-failure")
    assert failed["stage"] == "read" and failed["task"].startswith("t:0:")
    assert [e["event"] for e in crashed.events()] == ["task-failure", "crash"]
    # Progress marks are not faults: only asked for by name, and placed in the run's time.
    assert [e["name"] for e in crashed.events("phase")] == ["run-started", "query-started"]
    marks = crashed.phases()
    assert list(marks) == ["run-started", "query-started"]
    assert 0 < marks["run-started"] <= marks["query-started"] <= crashed.seconds

    calm = Driver(pipeline_file, tmp_path / "logs" / "calm.log", env=env, entry=("fake_entry",))
    assert calm.start().wait(60) == 0, calm.log_tail()
    assert calm.events("crash") == []  # its own file, not the crashed run's
    again = Driver(pipeline_file, tmp_path / "logs" / "fault.log", env=env, entry=("fake_entry",))
    assert again.start().wait(60) == 0, again.log_tail()
    assert again.events("crash") == []  # a new run of the same log starts a new events file


def test_a_recovery_is_split_by_the_run_s_marks_and_checked_against_its_goal() -> None:
    from sparkonce.verify.model import Fault, Oracle, TrialOutcome
    from sparkonce.verify.summary import recovery_goal, recovery_split, summarize

    marks = {"run-started": 9.0, "query-started": 13.5}
    split = recovery_split(marks, 20.25)
    assert split == {"start_s": 9.0, "plan_s": 4.5, "first_batch_s": 6.75}
    assert recovery_split({"run-started": 9.0}, 20.0) is None  # an older driver: no split
    outcomes = [
        TrialOutcome(i, "s", Fault("kill", delay_s=1.0), recovery_s=float(r), recovery_phases=p)
        for i, (r, p) in enumerate([(20, split), (30, None), (40, split)])
    ]
    [kill] = summarize(outcomes, ["kill"])
    assert kill.recovery_phases_mean_s == {"start_s": 9.0, "plan_s": 4.5, "first_batch_s": 6.75}
    oracle = Oracle([], 60.0, 4, first_commit_s=25.0)
    goal = recovery_goal(outcomes, oracle)
    assert goal is not None
    assert (goal["p95_s"], goal["limit_s"], goal["ratio"], goal["met"]) == (40.0, 37.5, 1.6, False)
    assert recovery_goal(outcomes[:2], oracle)["met"] is True  # type: ignore[index]
    assert recovery_goal(outcomes, Oracle([], 60.0, 4)) is None  # no oracle timing: no goal
    assert (goal["trials_at_a_time"], goal["fair"]) == (1, True)
    # Two trials at a time against an oracle that ran alone: the ratio is flagged unfair.
    shared = recovery_goal(outcomes, oracle, 2)
    assert shared is not None and (shared["trials_at_a_time"], shared["fair"]) == (2, False)


def test_task_fault_variables_reach_a_clusters_executors_through_spark_settings() -> None:
    """Executors on a cluster never see the driver's environment: the task hooks'
    variables go to them as ``spark.executorEnv.*``; the driver-only ones do not."""
    from sparkonce.faults import worker_fault_conf

    env = {
        "SPARKONCE_FAIL_TASKS": "read,write",
        "SPARKONCE_FAULT_EVENTS": "/tmp/events.jsonl",
        "SPARKONCE_CRASH_AT": "after-ledger-write",
        "SPARKONCE_PAUSE_AT": " ",
    }
    assert worker_fault_conf(env) == {
        "spark.executorEnv.SPARKONCE_FAIL_TASKS": "read,write",
        "spark.executorEnv.SPARKONCE_FAULT_EVENTS": "/tmp/events.jsonl",
    }
    assert worker_fault_conf({"SPARKONCE_FAIL_TASKS": ""}) == {}


def test_a_paused_task_stops_itself_on_its_first_attempt_only(tmp_path: Path) -> None:
    """SPARKONCE_PAUSE_TASKS=write: the hook SIGSTOPs the worker (here a forked child) on a
    first attempt, after recording the event; a retry, or another stage, goes on."""
    events = tmp_path / "events.jsonl"
    plan = FaultPlan.from_env({"SPARKONCE_PAUSE_TASKS": "write", EVENTS_ENV: str(events)})
    assert not plan.empty and plan.pause_tasks == {"write"}
    plan.pause_task("write", "p:0:1", attempt=1)  # a retry: not paused
    plan.pause_task("read", "p:0:1", attempt=0)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        plan.pause_task("write", "p:0:1", attempt=0)
        os._exit(7)
    try:
        _, status = os.waitpid(pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status) and os.WSTOPSIG(status) == signal.SIGSTOP
        [event] = read_events(events)
        assert (event["event"], event["task"], event["pid"]) == ("task-pause", "p:0:1", pid)
        os.kill(pid, signal.SIGCONT)
        _, status = os.waitpid(pid, 0)
        assert os.WEXITSTATUS(status) == 7
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
