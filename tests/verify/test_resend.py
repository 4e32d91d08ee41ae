"""``sparkonce verify --faults resend``: a producer crash-and-resend, end to end.

A real producer process copies the input into a fresh trial source (a new embedded log, or
a new topic on the real KRaft broker), is SIGKILLed after k acknowledged records, and is
restarted with a new identity; it re-sends the window since its last progress write under
the same record ids. The pipeline, with and without ``dedupe``, then runs on the trial
source in a real driver, and the campaign compares its output with the oracle.

What each output must hold is known from the records the test wrote (every record once;
without dedupe, the window twice), never from the code under test. The embedded log with
dedupe runs in ``make test``, through the whole command (tests/unit/test_lanes.py says
why); the others run in ``make test-campaign``.
"""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

import pytest

from sparkonce.verify import Campaign, TrialOutcome, failure_hint
from tests.explain import explain_file, verdict

if TYPE_CHECKING:
    from tests.services.kafka import KafkaBroker

pytestmark = pytest.mark.crash

RECORDS = 300

_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, KafkaSource, Pipeline, SQLiteSink
from sparkonce.outputs import dedupe

def events(df):
    rows = df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
        "timestamp",
    )
    if {dedupe}:
        # Re-sent copies keep their original timestamps: well within the bound.
        rows = dedupe(rows, "record_id", within="1 hour", event_time="timestamp")
    return rows.select("record_id", "key", "value")

pipeline = Pipeline(
    name="resend-test",
    source={source},
    transform=events,
    sink=SQLiteSink("sqlite:///{db}", "events_out"),
    checkpoint={checkpoint!r},
    output_mode="append",
)
"""


def write_pipeline(tmp_path: Path, source: str, *, dedupe: bool) -> Path:
    f = tmp_path / "pipeline.py"
    f.write_text(
        _PIPELINE.format(
            source=source,
            dedupe=dedupe,
            db=tmp_path / "sink.db",
            checkpoint=str(tmp_path / "user-checkpoint"),
        )
    )
    return f


def only_duplicates_seen_live(error: str | None) -> bool:
    """A trial without dedupe fails on its duplicates, not on an error of its own: its
    ``error`` is None, or only what the live readers saw of the same duplicates while it
    ran (the re-sent records are visible twice; nothing else may be)."""
    pattern = r"live readers saw \d+ anomalies \(duplicate\): .*"
    return error is None or re.fullmatch(pattern, error) is not None


def run_campaign(pipeline: Path, workdir: Path, trials: int, seed: int) -> list[TrialOutcome]:
    """The oracle, then ``trials`` resend trials (no reference run: the pipelines are a
    plain copy, and the reference adds nothing the trials need here)."""
    campaign = Campaign(
        pipeline, workdir=workdir, seed=seed, kinds=["resend"], reference=False, keep_logs=True
    )
    try:
        oracle = campaign.run_oracle()
        assert len(oracle.rows) == RECORDS and oracle.records == RECORDS
        return [campaign.run_trial(n) for n in range(trials)]
    finally:
        campaign.close()


def sink_rows(tmp_path: Path) -> Counter[str]:
    """Rows per record id in the sink, as the last trial left it."""
    with sqlite3.connect(tmp_path / "sink.db") as conn:
        return Counter(rid for (rid,) in conn.execute("SELECT record_id FROM events_out"))


def trial_log_ids(outcome: TrialOutcome) -> Counter[str]:
    """Records per record id in a trial's embedded log, read from its files."""
    assert outcome.resend is not None
    return log_ids(outcome.resend["source"])


def log_ids(source_uri: str) -> Counter[str]:
    """Records per record id in the embedded log a ``sparkonce-log://`` URI names."""
    from sparkonce.log import Topic

    uri = urlsplit(source_uri)
    assert uri.scheme == "sparkonce-log"
    with Topic(Path(uri.path), parse_qs(uri.query)["topic"][0]) as t:
        return Counter(r.record_id for p, end in t.end_offsets().items() for r in t.read(p, 0, end))


def check_fired(outcome: TrialOutcome) -> int:
    """The trial's record of the fault; returns the window re-sent."""
    fault, record = outcome.fault, outcome.resend
    assert fault.kind == "resend" and record is not None, outcome
    assert fault.kill_after is not None and fault.progress_every is not None
    assert outcome.fault_fired, outcome
    assert record["killed_after"] == fault.kill_after
    assert record["records"] == RECORDS
    window: int = record["resent"]
    assert 1 <= window <= fault.progress_every
    assert record["resumed_from"] == fault.kill_after - window
    return window


# -- the embedded log ---------------------------------------------------------------------------


@pytest.mark.campaign_lane  # in the rotation: make test's budget (151 s under load)
def test_with_dedupe_every_resend_trial_matches_the_oracle(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """The one end-to-end `sparkonce verify` in make test: the whole command, reference
    check included, one resend trial and the report it writes. `sparkonce explain` calls
    the pipeline effectively-once with its records deduplicated, and verify agrees."""
    from sparkonce.cli import main

    log_dir = make_log(RECORDS, partitions=3, keys=6)
    source = f"EmbeddedLogSource({str(log_dir)!r}, 'events', max_records_per_partition=40)"
    pipeline = write_pipeline(tmp_path, source, dedupe=True)
    explained = explain_file(pipeline)
    assert explained["guarantee"] == "effectively-once"
    assert verdict(explained, "records") == "deduplicated"
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--faults", "resend", "--trials", "1", "--seed", "4"]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads((out / "verify.json").read_text())
    ref = report["reference"]
    assert ref["matched"] is True and (ref["rows"], ref["missing"], ref["extra"]) == (RECORDS, 0, 0)
    assert report["oracle"]["rows"] == RECORDS
    [trial] = report["trials"]
    record, fault = trial["resend"], trial["fault"]
    assert fault["kind"] == "resend" and trial["fault_fired"], trial
    assert record["killed_after"] == fault["kill_after"] and record["records"] == RECORDS
    window = record["resent"]
    assert 1 <= window <= fault["progress_every"]
    assert record["resumed_from"] == fault["kill_after"] - window
    assert trial["passed"] and trial["error"] is None, trial
    assert (trial["lost_rows"], trial["duplicated_rows"], trial["value_mismatches"]) == (0, 0, 0)
    # The copies really landed: the trial's batches, in the store's ledger, covered the
    # window twice (the trial log itself goes with a passing trial's directory).
    from sparkonce import SQLiteSink

    store = SQLiteSink(f"sqlite:///{tmp_path / 'sink.db'}", "events_out")
    store.open()
    try:
        covered = sum(e.ranges.count for e in store.ledger("resend-test"))
    finally:
        store.close()
    assert covered == RECORDS + window
    sink = sink_rows(tmp_path)
    assert sum(sink.values()) == RECORDS and max(sink.values()) == 1  # each record once


@pytest.mark.campaign_lane
def test_without_dedupe_the_resend_trial_reports_the_duplicates(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(RECORDS, partitions=3, keys=6)
    source = f"EmbeddedLogSource({str(log_dir)!r}, 'events', max_records_per_partition=40)"
    pipeline = write_pipeline(tmp_path, source, dedupe=False)
    [outcome] = run_campaign(pipeline, tmp_path / "work", trials=1, seed=4)
    window = check_fired(outcome)
    assert not outcome.passed and only_duplicates_seen_live(outcome.error), outcome
    assert (outcome.lost_rows, outcome.value_mismatches) == (0, 0)
    assert outcome.duplicated_rows == window
    twice = {rid for rid, c in trial_log_ids(outcome).items() if c == 2}
    sink = sink_rows(tmp_path)
    assert {rid for rid, c in sink.items() if c == 2} == twice and len(twice) == window
    assert len(sink) == RECORDS and max(sink.values()) == 2
    hint = failure_hint([outcome])
    assert hint is not None and "sparkonce.outputs.dedupe" in hint


# -- Kafka --------------------------------------------------------------------------------------


def produce_kafka(bootstrap: str, topic: str) -> None:
    from sparkonce import KafkaProducer

    with KafkaProducer(bootstrap, topic) as producer:
        for i in range(1, RECORDS + 1):
            producer.send(str(i), f"k{i % 6}", record_id=f"r{i}")


def kafka_source(bootstrap: str, topic: str) -> str:
    return f"KafkaSource({bootstrap!r}, {topic!r}, max_records_per_partition=40)"


def assert_trial_topic_deleted(bootstrap: str, original: str, uri: str, trial: int) -> None:
    """The trial ran on its own topic, named after the original and the trial, and the
    campaign deleted it afterwards."""
    from sparkonce.kafka import KafkaConnection

    prefix = f"kafka://{bootstrap}/{original}.verify-"
    assert uri.startswith(prefix) and uri.endswith(f"-{trial}"), uri
    topics = KafkaConnection(bootstrap).topics()
    assert original in topics and uri.rsplit("/", 1)[1] not in topics


@pytest.mark.kafka
@pytest.mark.campaign_lane
def test_kafka_with_dedupe_passes_a_resend_trial(
    tmp_path: Path, kafka_broker: KafkaBroker, kafka_topic: Callable[..., str]
) -> None:
    topic = kafka_topic("resend", partitions=3)
    produce_kafka(kafka_broker.bootstrap, topic)
    pipeline = write_pipeline(tmp_path, kafka_source(kafka_broker.bootstrap, topic), dedupe=True)
    [outcome] = run_campaign(pipeline, tmp_path / "work", trials=1, seed=2)
    check_fired(outcome)
    assert outcome.passed, outcome
    assert (outcome.lost_rows, outcome.duplicated_rows, outcome.value_mismatches) == (0, 0, 0)
    sink = sink_rows(tmp_path)
    assert set(sink) == {f"r{i}" for i in range(1, RECORDS + 1)} and max(sink.values()) == 1
    assert outcome.resend is not None
    assert_trial_topic_deleted(kafka_broker.bootstrap, topic, outcome.resend["source"], 0)


@pytest.mark.kafka
@pytest.mark.campaign_lane
def test_kafka_without_dedupe_the_command_reports_duplicates_and_points_at_dedupe(
    tmp_path: Path,
    kafka_broker: KafkaBroker,
    kafka_topic: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The whole command (reference run included): exit 1, the duplicates in verify.json
    and the table, and the line that names dedupe and the docs page."""
    from sparkonce.cli import main

    topic = kafka_topic("resend-raw", partitions=3)
    produce_kafka(kafka_broker.bootstrap, topic)
    pipeline = write_pipeline(tmp_path, kafka_source(kafka_broker.bootstrap, topic), dedupe=False)
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--faults", "resend", "--trials", "1", "--seed", "2"]
    assert main([*args, "--out", str(out)]) == 1
    printed = capsys.readouterr().out
    report = json.loads((out / "verify.json").read_text())
    assert report["faults"] == ["resend"] and report["reference"]["matched"]
    [trial] = report["trials"]
    assert (
        trial["fault_fired"] and not trial["passed"] and only_duplicates_seen_live(trial["error"])
    )
    window = trial["resend"]["resent"]
    assert 1 <= window <= trial["fault"]["progress_every"]
    assert trial["duplicated_rows"] == window and trial["lost_rows"] == 0
    assert report["summary"][0]["duplicated_rows"] == window
    sink = sink_rows(tmp_path)
    assert sum(sink.values()) == RECORDS + window and len(sink) == RECORDS
    assert "sparkonce.outputs.dedupe" in printed
    hint = 'docs/guides/dedupe.md: "Removing duplicates a producer re-sent"'
    assert hint in " ".join(printed.split())
    assert_trial_topic_deleted(kafka_broker.bootstrap, topic, trial["resend"]["source"], 0)
