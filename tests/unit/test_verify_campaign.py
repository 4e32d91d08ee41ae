"""The verifier's pure parts: row comparison, fault specs, deterministic plans, reports."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path
from typing import Any

import pytest

from sparkonce.errors import ConfigError
from sparkonce.verify.model import (
    Fault,
    Oracle,
    TrialOutcome,
    compare_rows,
    parse_fault_kinds,
    plan_fault,
)
from sparkonce.verify.parallel import run_trials
from sparkonce.verify.report import Recorded, load_report, write_json
from sparkonce.verify.summary import summarize

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


# -- the reference comparison (sparkonce.verify.compare / .reference) -----------------------


def test_diff_as_multisets_counts_missing_and_extra_with_duplicates() -> None:
    from sparkonce.verify import diff_rows

    want = [{"v": 1}, {"v": 1}, {"v": 2}]
    assert diff_rows(want, [{"v": 2}, {"v": 1}, {"v": 1}]).matched
    d = diff_rows(want, [{"v": 1}, {"v": 2}, {"v": 2}])
    assert (d.missing, d.extra, d.mismatched) == (1, 1, 0)
    assert d.missing_examples == ({"v": 1},) and d.extra_examples == ({"v": 2},)
    assert d.counts() == "1 rows missing, 1 extra"


def test_diff_treats_null_as_equal_to_null_only() -> None:
    from sparkonce.verify import diff_rows

    want: list[dict[str, Any]] = [{"k": None, "v": None}, {"k": "a", "v": 1}]
    assert diff_rows(want, [{"k": "a", "v": 1}, {"v": None, "k": None}]).matched
    d = diff_rows(want, [{"k": None, "v": 0}, {"k": "a", "v": 1}])
    assert (d.missing, d.extra) == (1, 1)
    d = diff_rows(want, [{"k": None, "v": 0}, {"k": "a", "v": 1}], ["k"])
    assert (d.missing, d.extra, d.mismatched) == (0, 0, 1)
    assert d.mismatched_examples == (({"k": None, "v": None}, {"k": None, "v": 0}),)


def test_diff_compares_floats_to_12_significant_digits() -> None:
    from sparkonce.verify import diff_rows

    assert diff_rows([{"x": 0.3}], [{"x": 0.1 + 0.2}]).matched
    assert diff_rows([{"x": 1e20 + 1e5}], [{"x": 1e20 + 1e5 + 1e-3}]).matched
    assert diff_rows([{"x": float("nan")}], [{"x": float("nan")}]).matched
    assert diff_rows([{"x": 3}], [{"x": 3.0}]).matched  # SQLite REAL of an integral value
    assert not diff_rows([{"x": 1.0}], [{"x": 1.000001}]).matched
    assert not diff_rows([{"x": 12345.0}], [{"x": 12346.0}]).matched


def test_diff_sees_one_value_across_store_representations() -> None:
    """What SQLite stores (ISO text, decimal text, 0/1) equals what Spark's Arrow gives."""
    from datetime import UTC, date, datetime, timedelta, timezone
    from decimal import Decimal

    from sparkonce.verify import diff_rows

    spark_row = {
        "ts": datetime(2024, 1, 1, 12, 0, tzinfo=UTC),
        "d": date(2024, 1, 2),
        "amount": Decimal("12.50"),
        "ok": True,
        "payload": b"caf\xc3\xa9",
        "blob": b"\xff\x00",
        "tags": ["a", "b"],
    }
    sqlite_row = {
        "ts": "2024-01-01T12:00:00+00:00",
        "d": "2024-01-02",
        "amount": "12.50",
        "ok": 1,
        "payload": "café",
        "blob": b"\xff\x00",
        "tags": ("a", "b"),
    }
    assert diff_rows([spark_row], [sqlite_row]).matched
    # PostgreSQL's timestamptz in another session time zone: the same instant.
    plus_one = timezone(timedelta(hours=1))
    other_zone = dict(spark_row, ts=datetime(2024, 1, 1, 13, 0, tzinfo=plus_one))
    assert diff_rows([spark_row], [other_zone]).matched
    assert not diff_rows([spark_row], [dict(sqlite_row, amount="12.5")]).matched


def test_diff_by_key_tells_changed_values_from_lost_and_extra_rows() -> None:
    from sparkonce.verify import diff_rows

    want = [{"key": "a", "n": 1}, {"key": "b", "n": 2}, {"key": "c", "n": 3}, {"key": "c", "n": 3}]
    got = [{"key": "a", "n": 1}, {"key": "b", "n": 20}, {"key": "c", "n": 3}, {"key": "d", "n": 4}]
    d = diff_rows(want, got, key_columns=("key",))
    assert (d.missing, d.extra, d.mismatched) == (1, 1, 1)
    assert d.missing_examples == ({"key": "c", "n": 3},)  # the duplicate of c is lost
    assert d.extra_examples == ({"key": "d", "n": 4},)
    assert d.mismatched_examples == (({"key": "b", "n": 2}, {"key": "b", "n": 20}),)
    assert d.counts() == "1 rows missing, 1 extra, 1 with other values for their key"
    text = d.describe("reference", "sparkonce")
    assert "rows matched by key (key)" in text
    assert '{"key": "b", "n": 2}' in text and '{"key": "b", "n": 20}' in text
    # The same rows without keys: b is one missing and one extra row.
    d = diff_rows(want, got)
    assert (d.missing, d.extra, d.mismatched) == (2, 2, 0)


def test_diff_by_key_refuses_a_column_the_rows_do_not_have() -> None:
    from sparkonce.verify import diff_rows

    with pytest.raises(ConfigError, match=r"key column\(s\) \['id'\]"):
        diff_rows([{"key": "a"}], [{"key": "a"}], key_columns=("id",))


def test_diff_keeps_only_a_few_examples_in_a_stable_order() -> None:
    from sparkonce.verify import diff_rows

    d = diff_rows([{"i": i} for i in range(100, 0, -1)], [])
    assert d.missing == 100
    assert d.missing_examples == tuple({"i": i} for i in (1, 10, 100, 11, 12))  # repr order


def test_reference_applies_the_sinks_semantics_in_batch_order() -> None:
    from sparkonce.verify import apply_semantics

    batches = {
        2: [{"key": "a", "n": 3}],
        0: [{"key": "a", "n": 1}, {"key": "b", "n": 1}],
        1: [{"key": "a", "n": 2}],
        3: [],
    }
    assert len(apply_semantics(batches, "append")) == 4
    assert apply_semantics(batches, "upsert", ["key"]) == [
        {"key": "a", "n": 3},
        {"key": "b", "n": 1},
    ]
    assert apply_semantics(batches, "complete") == []  # the last batch emitted no row
    assert apply_semantics({0: [{"n": 1}], 1: [{"n": 2}]}, "complete") == [{"n": 2}]
    assert apply_semantics({}, "complete") == []
    with pytest.raises(ConfigError):
        apply_semantics(batches, "upsert")


def test_reference_file_keeps_the_last_line_of_a_batch(tmp_path: Path) -> None:
    from sparkonce.verify.reference import read_batches

    path = tmp_path / "rows.jsonl"
    lines = [
        {"batch": 0, "rows": [{"v": 1}]},
        {"batch": 1, "rows": [{"v": 2}]},
        {"batch": 1, "rows": [{"v": 2}]},  # the batch ran again after a restart
        {"batch": 2, "rows": []},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert read_batches(path) == {0: [{"v": 1}], 1: [{"v": 2}], 2: []}


def test_reference_is_compared_on_the_columns_the_sink_shows() -> None:
    """A Kafka sink shows key and value; the transform's partition column only routes."""
    from sparkonce.verify import ReferenceCheck

    reference = [{"value": "1", "partition": 0}, {"value": "2", "partition": 1}]
    shown = [{"key": None, "value": "2"}, {"key": None, "value": "1"}]
    check = ReferenceCheck.compare(reference, shown)
    assert check.matched
    lost = ReferenceCheck.compare(reference, shown[:1], batches=2, rows_file="r.jsonl")
    assert not lost.matched
    message = lost.message("p.py", "reference.log")
    assert message.startswith(
        "failure-free sparkonce run differs from Spark's plain foreachBatch reference: "
        "1 rows missing, 0 extra"
    )
    assert '{"key": null, "value": "1"}' in message
    empty = ReferenceCheck.compare(reference, [])  # nothing shown: every row is missing
    assert (empty.diff.missing, empty.diff.extra) == (2, 0)


def test_reference_names_the_first_batch_its_plan_differs_from_the_ledger(
    tmp_path: Path,
) -> None:
    """The reference's batches from its offset log (a no-data batch left out) against the
    failure-free run's ledger; when they differ, the message says so instead of blaming
    the sink."""
    from dataclasses import replace

    from sparkonce import EmbeddedLogSource
    from sparkonce.offsets import BatchRanges
    from sparkonce.verify import ReferenceCheck
    from sparkonce.verify.reference import first_batch_apart, planned_batches

    ends = [{"0": [0, 4], "1": [0, 4]}, {"0": [4, 8], "1": [4, 4]}, {"0": [8, 8], "1": [4, 4]}]
    (tmp_path / "offsets").mkdir()
    for n, end in enumerate(ends):
        line = json.dumps({"events": end})
        (tmp_path / "offsets" / str(n)).write_text(f'v1\n{{"batchWatermarkMs":0}}\n{line}\n')
    planned = planned_batches(tmp_path, EmbeddedLogSource(tmp_path, "events"))
    assert [str(b) for b in planned] == [
        "events[0]:0..4 events[1]:0..4",
        "events[0]:4..8 events[1]:4..4",
    ]
    assert first_batch_apart(planned, planned) is None
    ledger = [
        BatchRanges.from_json_obj({"events": e})
        for e in [{"0": [0, 7], "1": [0, 2]}, {"0": [7, 8], "1": [2, 4]}]
    ]
    apart = first_batch_apart(planned, ledger)
    assert apart == (
        "batch 0 with data: reference events[0]:0..4 events[1]:0..4, "
        "sparkonce events[0]:0..7 events[1]:0..2"
    )
    assert first_batch_apart(planned, ledger[:0]) == (
        "batch 0 with data: reference events[0]:0..4 events[1]:0..4, sparkonce (none)"
    )
    check = ReferenceCheck.compare([{"v": 1}, {"v": 2}], [{"v": 1}], batches=3)
    assert "a bug in the sink or in sparkonce's commit logic" in check.message("p.py", "r.log")
    message = replace(check, batches_apart=apart).message("p.py", "r.log")
    assert f"cut the input into other batches ({apart})" in message
    assert "depends on where batch boundaries fall" in message
    assert "commit logic" not in message


def test_report_has_a_reference_section(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from sparkonce.verify import ReferenceCheck

    check = ReferenceCheck.compare(
        [{"key": "a", "n": 1}, {"key": "b", "n": 2}],
        [{"key": "a", "n": 1}],
        ("key",),
        batches=3,
        seconds=12.34,
        semantics="upsert",
    )
    campaign: Any = SimpleNamespace(
        pipeline_file=Path("p.py"),
        pipeline=SimpleNamespace(name="p", sink=SimpleNamespace(describe=lambda: "sink")),
        seed=5,
        kinds=("kill",),
        oracle=Oracle(rows=[{"key": "a", "n": 1}], seconds=20.0, batches=3),
        reference=check,
    )
    path = tmp_path / "verify.json"
    write_json(path, campaign, [], 1.0)
    ref = json.loads(path.read_text())["reference"]
    assert ref["matched"] is False
    assert (ref["rows"], ref["sparkonce_rows"], ref["missing"], ref["extra"]) == (2, 1, 1, 0)
    assert ref["key_columns"] == ["key"] and ref["batches"] == 3 and ref["seconds"] == 12.3
    assert ref["missing_examples"] == [{"key": "b", "n": 2}]


def test_key_columns_replace_the_sinks_keys_and_are_checked(tmp_path: Path) -> None:
    from sparkonce.log.storage import Topic
    from sparkonce.verify.campaign import Campaign

    Topic.create(tmp_path / "log", "events", partitions=1).close()
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink\n"
        "pipeline = Pipeline(name='keys', transform=lambda df: df,\n"
        f"    source=EmbeddedLogSource({str(tmp_path / 'log')!r}, 'events'),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'out', mode='upsert',"
        " keys=['id']),\n"
        f"    checkpoint={str(tmp_path / 'checkpoint')!r})\n"
    )
    for keys, want in (((), ("id",)), (("key", "day"), ("key", "day"))):
        campaign = Campaign(pipeline, workdir=tmp_path / "work", key_columns=keys)
        assert campaign.keys == want and campaign.check_reference
        campaign.close()
    for bad in (("key", "key"), ("",)):
        with pytest.raises(ConfigError, match="--key"):
            Campaign(pipeline, workdir=tmp_path / "work", key_columns=bad)


def _entry(seq: int, at: float) -> Any:
    from datetime import UTC, datetime

    from sparkonce.ledger.base import LedgerEntry
    from sparkonce.offsets import BatchRanges

    stamp = datetime.fromtimestamp(at, UTC)
    return LedgerEntry("p", seq, BatchRanges(()), 1, 0, stamp)


def test_entry_timing_is_the_first_entry_and_the_median_gap() -> None:
    from sparkonce.verify.campaign import _entry_timing

    start = 1_800_000_000.0
    entries = [_entry(i, start + t) for i, t in enumerate([20.0, 22.0, 23.0, 30.0])]
    assert _entry_timing(entries, start) == (20.0, 2.0)  # gaps 2, 1, 7: median 2
    assert _entry_timing(entries[:1], start) == (20.0, 10.0)  # one entry: half the first
    assert _entry_timing([], start) == (None, None)


def test_kills_are_planned_on_progress_when_the_oracle_timing_is_known() -> None:
    """N among the oracle's batches; N = 0: inside the time to the first entry; N >= 1:
    every store's entry of batch N, then at most one interval between entries."""
    oracle = Oracle([], 60.0, 4, first_commit_s=20.0, batch_interval_s=2.0)
    seen = set()
    for n in range(200):
        fault = plan_fault("kill", random.Random(f"3:{n}"), oracle, stores=2)
        assert fault == plan_fault("kill", random.Random(f"3:{n}"), oracle, stores=2)
        assert fault.delay_s is not None
        if fault.after_entries is None:
            assert 0.3 * 20.0 <= fault.delay_s <= 20.0
            seen.add(0)
        else:
            assert fault.after_entries in (2, 4, 6)  # batch 1..3, in both stores
            assert 0.0 <= fault.delay_s <= 2.0
            seen.add(fault.after_entries // 2)
            assert "after ledger entry" in fault.describe()
    assert seen == {0, 1, 2, 3}


def test_the_oracle_timing_goes_into_the_report_and_back(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from sparkonce.verify.report import write_json

    split = {"start_s": 8.0, "plan_s": 2.5, "first_batch_s": 1.0}
    oracle = Oracle([], 20.0, 2, first_commit_s=11.5, batch_interval_s=1.25, phases=split)
    fault = Fault("kill", delay_s=0.5, after_entries=1)
    trial = TrialOutcome(0, "5:0", fault, True, True, seconds=30.0)
    campaign: Any = SimpleNamespace(
        pipeline_file=Path("p.py"),
        pipeline=SimpleNamespace(name="p", sink=SimpleNamespace(describe=lambda: "sink")),
        seed=5,
        kinds=("kill",),
        oracle=oracle,
    )
    path = tmp_path / "verify.json"
    write_json(path, campaign, [trial], 31.0)
    doc = json.loads(path.read_text())
    assert doc["oracle"]["first_commit_s"] == 11.5 and doc["oracle"]["batch_interval_s"] == 1.25
    assert doc["oracle"]["phases"] == split
    assert doc["trials"][0]["fault"]["after_entries"] == 1
    recorded = load_report(path, 5, ["kill"])
    assert recorded.oracle_timing == (11.5, 1.25) and recorded.outcomes == [trial]
    # A report of an older version has neither: its kills stay planned on the run time.
    del doc["oracle"]["first_commit_s"], doc["oracle"]["batch_interval_s"]
    path.write_text(json.dumps(doc))
    assert load_report(path, 5, ["kill"]).oracle_timing == (None, None)
    old = plan_fault("kill", random.Random("5:1"), Oracle([], 20.0, 2))
    assert old.after_entries is None and old.delay_s is not None and 6.0 <= old.delay_s <= 19.0


def _sqlite_pipeline(tmp_path: Path, name: str) -> Path:
    from sparkonce.log.storage import Topic

    Topic.create(tmp_path / "log", "events", partitions=1).close()
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink\n"
        f"pipeline = Pipeline(name={name!r}, transform=lambda df: df,\n"
        f"    source=EmbeddedLogSource({str(tmp_path / 'log')!r}, 'events'),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'out'),\n"
        f"    checkpoint={str(tmp_path / 'checkpoint')!r})\n"
    )
    return pipeline


def _arg(args: tuple[str, ...], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args else None


def test_a_checkpoint_root_gives_every_run_a_fresh_checkpoint_and_deletes_nothing(
    tmp_path: Path,
) -> None:
    """Under ``--checkpoint ROOT`` (an s3a:// prefix on a cluster) each run's drivers get a
    checkpoint no earlier run used, named after the pipeline and the run; without it the
    campaign's one local checkpoint is removed between runs."""
    from sparkonce.verify.campaign import Campaign

    pipeline = _sqlite_pipeline(tmp_path, "rooted")
    campaign = Campaign(
        pipeline, workdir=tmp_path / "work", kinds=["kill"], checkpoint_root="s3a://bucket/v/"
    )
    try:
        first = _arg(campaign._driver_args(), "--checkpoint")
        assert first is not None and first.startswith("s3a://bucket/v/rooted/oracle-")
        campaign.clean("trial-00003")
        second = _arg(campaign._driver_args(), "--checkpoint")
        assert second is not None and second.startswith("s3a://bucket/v/rooted/trial-00003-")
        campaign.clean("trial-00003")  # a rescaled kill starts over: again a new one
        third = _arg(campaign._driver_args(), "--checkpoint")
        assert len({first, second, third}) == 3
    finally:
        campaign.close()

    local = Campaign(_sqlite_pipeline(tmp_path / "b", "local"), workdir=tmp_path / "w2")
    try:
        where = Path(str(_arg(local._driver_args(), "--checkpoint")))
        assert where == tmp_path / "w2" / "checkpoint"
        (where / "offsets").mkdir(parents=True)
        local.clean("trial-00001")
        assert not where.exists()
        assert _arg(local._driver_args(), "--checkpoint") == str(where)
    finally:
        local.close()


@pytest.mark.parametrize(
    ("master", "trial_master", "retry_master"),
    [
        (None, None, "local[2,4]"),
        ("local[2]", "local[2]", "local[2,4]"),
        ("spark://127.0.0.1:7077", "spark://127.0.0.1:7077", "spark://127.0.0.1:7077"),
    ],
)
def test_trials_run_on_the_campaigns_master_and_retry_tasks_there(
    tmp_path: Path, master: str | None, trial_master: str | None, retry_master: str
) -> None:
    """Local runs that must survive a failed task get four attempts per task
    (``local[2,4]``); a cluster retries tasks itself, so its trials stay on it."""
    from sparkonce.verify.campaign import Campaign

    campaign = Campaign(_sqlite_pipeline(tmp_path, "m"), workdir=tmp_path / "w", master=master)
    try:
        assert _arg(campaign._driver_args(), "--master") == trial_master
        retry = campaign._retry_master()
        assert retry == retry_master
        assert _arg(campaign._driver_args(retry), "--master") == retry_master
    finally:
        campaign.close()
