"""The ``resend`` fault's pure parts, and its producer as a real process (no Spark).

The producer's copy loop is checked against what a crash at the k-th acknowledgement
must leave (the window between the last progress write and the kill, sent twice, and
nothing lost), the real producer process against the trial log it writes, and the
campaign's side (fault kinds, plans, reports, the hint) without running a trial.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from sparkonce.errors import ConfigError, VerificationError
from sparkonce.verify.model import (
    FAULT_KINDS,
    Fault,
    Oracle,
    TrialOutcome,
    parse_fault_kinds,
    plan_fault,
)
from sparkonce.verify.report import load_report, write_json
from sparkonce.verify.resend import Progress, Record, copy
from sparkonce.verify.summary import failure_hint


class _Killed(Exception):
    """Where the campaign's SIGKILL lands in the copy loop."""


class _ListWriter:
    """Acknowledges every record at once and remembers the ids it sent, in order."""

    def __init__(self) -> None:
        self.sent: list[str | None] = []

    def send(self, record: Record) -> None:
        self.sent.append(record.record_id)

    def close(self) -> None:
        pass


def _records(n: int) -> list[Record]:
    return [Record(i % 3, b"k", str(i).encode(), 1_000 + i, f"r{i}") for i in range(n)]


def _kill(acked: int, persisted: int) -> None:
    raise _Killed(acked, persisted)


# -- the copy loop ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "every", "k"),
    [
        (100, 10, 37),  # inside a window
        (100, 10, 40),  # on a progress write: the kill comes first, so a whole window
        (100, 10, 3),  # before the first write: everything so far
        (100, 7, 100),  # after the last record, before the final write
        (50, 1, 20),  # progress after every record: a window of one
        (30, 40, 25),  # M beyond the input
    ],
)
def test_a_restart_resends_exactly_the_window_since_the_last_progress_write(
    tmp_path: Path, n: int, every: int, k: int
) -> None:
    records = _records(n)
    ids = [r.record_id for r in records]
    progress = Progress(tmp_path / "progress")
    first = _ListWriter()
    with pytest.raises(_Killed) as killed:
        copy(records, first, progress, every=every, pause_after=k, on_pause=_kill)
    acked, persisted = killed.value.args
    assert acked == k and first.sent == ids[:k]  # acknowledged in order, none beyond k
    assert progress.read() == persisted  # what a restart finds on disk
    assert persisted % every == 0 and k - every <= persisted < k

    second = _ListWriter()
    run = copy(records, second, progress, every=every)
    assert (run.resumed_from, run.sent, run.records) == (persisted, n - persisted, n)
    assert second.sent == ids[persisted:]  # the window, then the rest
    assert progress.read() == n
    log = Counter(first.sent + second.sent)
    assert set(log) == set(ids), "no record lost"
    assert Counter(i for i, c in log.items() if c == 2) == Counter(ids[persisted:k])
    assert max(log.values()) == 2 and len(first.sent + second.sent) == n + (k - persisted)


def test_progress_is_written_only_every_m_records_and_at_the_end(tmp_path: Path) -> None:
    writes: list[int] = []

    class Spy(Progress):
        def write(self, count: int) -> None:
            writes.append(count)
            super().write(count)

    run = copy(_records(23), _ListWriter(), Spy(tmp_path / "p"), every=5)
    assert writes == [5, 10, 15, 20, 23]
    assert json.loads((tmp_path / "p").read_text()) == {"sent": 23}
    assert not list(tmp_path.glob("*.tmp"))
    writes.clear()
    again = copy(_records(23), _ListWriter(), Spy(tmp_path / "p"), every=5)
    assert (again.resumed_from, again.sent, writes) == (23, 0, []), run


def test_a_kill_after_the_input_ends_never_comes(tmp_path: Path) -> None:
    writer = _ListWriter()
    progress = Progress(tmp_path / "p")
    run = copy(_records(9), writer, progress, every=4, pause_after=10, on_pause=_kill)
    assert run.sent == 9 and len(writer.sent) == 9


@pytest.mark.parametrize("text", ["{", '{"sent": -1}', '{"sent": "3"}', "[]"])
def test_an_unreadable_progress_file_stops_the_copy(tmp_path: Path, text: str) -> None:
    (tmp_path / "p").write_text(text)
    with pytest.raises(VerificationError, match="resend progress file"):
        copy(_records(3), _ListWriter(), Progress(tmp_path / "p"), every=2)


def test_the_interval_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="progress interval"):
        copy(_records(3), _ListWriter(), Progress(tmp_path / "p"), every=0)


# -- the producer process on the embedded log ---------------------------------------------------

_PIPELINE = """
from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

pipeline = Pipeline(
    name="resend-unit",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=7),
    sink=SQLiteSink("sqlite:///{db}", "out"),
    checkpoint={checkpoint!r},
)
"""


def test_the_producer_process_resends_the_window_under_a_new_producer_id(
    tmp_path: Path,
) -> None:
    """The real process: stopped after k records, killed, restarted; the trial log then
    holds every original record, the window twice, each copy with the original's partition,
    key, value, timestamp and id, appended by two producer ids."""
    from sparkonce.log import IdempotentProducer, Topic
    from sparkonce.sources import EmbeddedLogSource
    from sparkonce.verify.driver import SIGKILL_EXIT, Driver
    from sparkonce.verify.injection import _wait_stopped
    from sparkonce.verify.resend import DONE_EVENT, ENTRY, PAUSE_EVENT, trial_source, window

    n, k, every = 60, 26, 8
    original = Topic.create(tmp_path / "log", "events", 3)
    with original, IdempotentProducer(original, "app") as producer:
        for i in range(n):
            producer.send(f"v{i}".encode(), f"k{i % 5}".encode(), timestamp_us=10**15 + i)
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        _PIPELINE.format(
            log=str(tmp_path / "log"), db=tmp_path / "out.db", checkpoint=str(tmp_path / "c")
        )
    )
    source = EmbeddedLogSource(tmp_path / "log", "events", max_records_per_partition=7)
    trial = trial_source(source, log_dir=tmp_path / "trial", workdir=tmp_path, trial=0)
    assert trial.uri() == f"sparkonce-log://{(tmp_path / 'trial').resolve()}?topic=events"
    args = ("--to", trial.uri(), "--progress", str(tmp_path / "progress"), "--every", str(every))

    def producer_run(name: str, *more: str) -> Driver:
        return Driver(pipeline, tmp_path / f"{name}.log", entry=ENTRY, extra_args=(*args, *more))

    first = producer_run("one", "--producer-id", "p1", "--pause-after", str(k)).start()
    try:
        assert _wait_stopped(first, 60), first.log_tail()
    finally:
        first.kill()
    assert first.wait(30) == SIGKILL_EXIT
    second = producer_run("two", "--producer-id", "p2").start()
    assert second.wait(60) == 0, second.log_tail()

    paused, done = first.events(PAUSE_EVENT), second.events(DONE_EVENT)
    assert [(e["acked"], e["persisted"]) for e in paused] == [(k, 24)]
    assert [(e["resumed_from"], e["sent"], e["records"]) for e in done] == [(24, n - 24, n)]
    assert window(paused, done) == {
        "killed_after": k,
        "resumed_from": 24,
        "resent": 2,
        "records": n,
    }
    with Topic(tmp_path / "log", "events") as t:
        before = [r for p in range(3) for r in t.read(p, 0, t.end_offsets()[p])]
    with Topic(tmp_path / "trial", "events") as t:
        assert t.partitions == 3
        after = [r for p in range(3) for r in t.read(p, 0, t.end_offsets()[p])]
        producers = {pid for pid, _p in t.producer_sequences()}
    assert producers == {"p1", "p2"}
    assert len(after) == n + 2

    def shape(r: Any) -> tuple[Any, ...]:
        return (r.record_id, r.partition, r.key, r.value, r.timestamp_us)

    copies = Counter(shape(r) for r in after)
    assert set(copies) == {shape(r) for r in before}
    twice = sorted(s[0] for s, c in copies.items() if c == 2)
    # Records go partition after partition, each in log order: the 25th and 26th are twice.
    order = [r.record_id for r in sorted(before, key=lambda r: (r.partition, r.offset))]
    assert twice == sorted(order[24:26]) and max(copies.values()) == 2
    for p in range(3):  # each partition keeps the original's order, the window repeated
        ids = [r.record_id for r in after if r.partition == p]
        assert [i for i in dict.fromkeys(ids)] == [r.record_id for r in before if r.partition == p]


# -- the campaign's side ------------------------------------------------------------------------


def test_resend_is_a_kind_only_when_named() -> None:
    assert FAULT_KINDS == ("kill", "crash-point", "task-failure", "db-drop", "zombie")
    assert parse_fault_kinds(None) == FAULT_KINDS
    assert parse_fault_kinds("") == FAULT_KINDS
    assert parse_fault_kinds("resend") == ("resend",)
    assert parse_fault_kinds("kill, resend") == ("kill", "resend")
    for bad in ("resend:after-rows", "resends", "re-send"):
        with pytest.raises(ConfigError, match="resend"):
            parse_fault_kinds(bad)


def test_a_resend_plan_depends_only_on_its_seed_and_lies_inside_the_input() -> None:
    oracle = Oracle(rows=[], seconds=30.0, batches=4, records=300)
    plans = {plan_fault("resend", random.Random(f"7:{t}"), oracle) for t in range(200)}
    assert len(plans) > 20
    assert plan_fault("resend", random.Random("7:3"), oracle) == plan_fault(
        "resend", random.Random("7:3"), oracle
    )
    for fault in plans:
        assert fault.kind == "resend" and fault.delay_s is None and fault.point is None
        assert fault.kill_after is not None and 30 <= fault.kill_after <= 270
        assert fault.progress_every is not None and 3 <= fault.progress_every <= 40
    assert "killed after" in next(iter(plans)).describe()


def test_a_resend_trial_round_trips_through_the_report_and_others_keep_their_shape(
    tmp_path: Path,
) -> None:
    from types import SimpleNamespace

    fault = Fault("resend", kill_after=120, progress_every=9)
    resend = TrialOutcome(
        1,
        "5:1",
        fault,
        fault_fired=True,
        duplicated_rows=4,
        resend={"source": "sparkonce-log:///x?topic=events", "resent": 4, "killed_after": 120},
    )
    kill = TrialOutcome(0, "5:0", Fault("kill", delay_s=3.0), passed=True, fault_fired=True)
    campaign: Any = SimpleNamespace(
        pipeline_file=Path("p.py"),
        pipeline=SimpleNamespace(name="p", sink=SimpleNamespace(describe=lambda: "sink")),
        seed=5,
        kinds=("kill", "resend"),
        oracle=Oracle(rows=[], seconds=20.0, batches=2, records=300),
    )
    path = tmp_path / "verify.json"
    write_json(path, campaign, [kill, resend], 10.0)
    doc = json.loads(path.read_text())
    plain, resent = doc["trials"]
    # A trial of another kind has the keys it had before resend existed.
    before = asdict(TrialOutcome(0, "5:0", Fault("kill")))
    del before["resend"]
    del before["fault"]["kill_after"], before["fault"]["progress_every"]
    del before["fault"]["after_entries"]  # a kill planned on progress has it; this one not
    del before["fault"]["node"]  # broker-kill trials only
    # Written only when a trial has them: extra readers' counts, orphaned staging files.
    del before["readers"], before["leftovers"]
    assert set(plain) == set(before) and set(plain["fault"]) == set(before["fault"])
    assert resent["fault"]["kill_after"] == 120 and resent["fault"]["progress_every"] == 9
    assert resent["resend"]["resent"] == 4
    assert load_report(path, 5, ["kill", "resend"]).outcomes == [kill, resend]


def test_the_hint_names_dedupe_for_resend_trials_that_counted_copies_again() -> None:
    resend = Fault("resend", kill_after=5, progress_every=3)
    dup = TrialOutcome(3, "0:3", resend, duplicated_rows=2)
    agg = TrialOutcome(4, "0:4", resend, value_mismatches=1)
    broken = TrialOutcome(5, "0:5", resend, error="boom")
    kill = TrialOutcome(6, "0:6", Fault("kill", delay_s=1.0), duplicated_rows=3)
    hint = failure_hint([dup, agg, broken, kill])
    assert hint is not None and hint.startswith("resend trials [3, 4]: ")
    assert "sparkonce.outputs.dedupe" in hint
    assert 'docs/guides/dedupe.md: "Removing duplicates a producer re-sent"' in hint
    assert failure_hint([broken, kill]) is None


def test_a_source_that_cannot_be_copied_is_refused_before_any_trial(tmp_path: Path) -> None:
    from sparkonce.verify.campaign import Campaign

    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from sparkonce import Pipeline, SQLiteSink\n"
        "from sparkonce.sources.base import Source\n"
        "class Numbers(Source):\n"
        "    def stream(self, spark, start): raise AssertionError('never read')\n"
        "    def latest_offsets(self): return {}\n"
        "    def uri(self): return 'numbers://'\n"
        "    def describe(self): return 'Numbers()'\n"
        "pipeline = Pipeline(name='numbers', source=Numbers(),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'out'),\n"
        f"    checkpoint={str(tmp_path / 'checkpoint')!r})\n"
    )
    with pytest.raises(ConfigError) as err:
        Campaign(pipeline, workdir=tmp_path / "work", kinds=["kill", "resend"])
    text = str(err.value)
    assert "--faults resend" in text and "'numbers'" in text and "Numbers()" in text
    assert "EmbeddedLogSource or a KafkaSource" in text
    Campaign(pipeline, workdir=tmp_path / "work", kinds=["kill"]).close()  # without it: fine
