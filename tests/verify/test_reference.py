"""The reference run of ``sparkonce verify``: Spark's plain foreachBatch as a second oracle.

Real drivers, real Spark, real SQLite. The failure-free sparkonce run is the
trials' oracle, so a bug that loses rows even without a fault passes every
trial; these tests check that the reference run, which shares no sparkonce
commit code, catches it, and that correct pipelines pass it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import main
from tests.verify.pipelines import PREAMBLE

pytestmark = pytest.mark.crash

HERE = Path(__file__).parent

_PIPELINE = (
    PREAMBLE
    + """
from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
from broken_sink import DropsABatchSink

def sums(df):
    return (
        df.select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").cast("double").alias("value"),
        )
        .groupBy("key")
        .agg(F.sum("value").alias("total"), F.count("*").alias("n"))
    )

def windows(df):
    events = df.select(F.timestamp_seconds(F.col("value").cast("string").cast("long")).alias("ts"))
    return (
        events.withWatermark("ts", "0 seconds")
        .groupBy(F.window("ts", "1 minute"))
        .agg(F.count("*").alias("n"))
        .select(F.col("window.start").alias("start"), F.col("window.end").alias("end"), "n")
    )

def dedup(df):
    events = df.select(
        "record_id", F.timestamp_seconds(F.col("value").cast("string").cast("long")).alias("ts")
    )
    return events.withWatermark("ts", "30 seconds").dropDuplicates(["record_id", "ts"])

pipeline = Pipeline(
    name="reference-test",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition={per_partition}),
    transform={transform},
    sink={sink},
    checkpoint={checkpoint!r},
    output_mode={mode!r},
)
"""
)


def write_pipeline(
    tmp_path: Path, log_dir: Path, *, transform: str, sink: str, mode: str, per_partition: int
) -> Path:
    f = tmp_path / "pipeline.py"
    f.write_text(
        _PIPELINE.format(
            here=str(HERE),
            log=str(log_dir),
            transform=transform,
            sink=sink,
            mode=mode,
            per_partition=per_partition,
            checkpoint=str(tmp_path / "user-checkpoint"),
        )
    )
    return f


@pytest.mark.campaign_lane
def test_reference_catches_a_sink_that_loses_a_batch_without_any_fault(
    tmp_path: Path, make_log: Callable[..., Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The sink drops batch 1 in the failure-free run too, so the trials could never see it."""
    log_dir = make_log(60, partitions=3, keys=4)  # 10 per partition per batch: 2+ batches
    sink = f"DropsABatchSink('sqlite:///{tmp_path / 'broken.db'}', 'events_out')"
    pipeline = write_pipeline(
        tmp_path, log_dir, transform="copy", sink=sink, mode="update", per_partition=10
    )
    out = tmp_path / "out"
    code = main(
        ["verify", str(pipeline), "--trials", "1", "--faults", "crash-point", "--out", str(out)]
    )
    captured = capsys.readouterr()
    err, text = captured.err, captured.out + captured.err
    assert code == 1, err
    # The rows named are the lost batch's: in the reference file, not in the sink.
    reference = out / "work" / "reference" / "rows.jsonl"
    batches = {b["batch"]: b["rows"] for b in map(json.loads, reference.read_text().splitlines())}
    assert len(batches) >= 2 and len(batches[0]) + len(batches[1]) <= 60
    lost = {r["record_id"] for r in batches[1]}
    assert (
        "failure-free sparkonce run differs from Spark's plain foreachBatch reference: "
        f"{len(lost)} rows missing, 0 extra" in err
    ), err
    assert f"missing (in reference, not in sparkonce), 5 of {len(lost)}:" in text, text
    named = [json.loads(m) for m in re.findall(r'\{"key": [^{}]*"record_id"[^{}]*\}', err)]
    assert len(named) == 5, err
    assert all(row["record_id"] in lost for row in named)
    report = out / "verify.json"
    if report.exists():  # cli.py writes the report before it re-raises (see verify's README)
        ref = json.loads(report.read_text())["reference"]
        assert not ref["matched"] and (ref["missing"], ref["extra"]) == (len(lost), 0)
    assert not (out / "work" / "trials").exists(), "no trial may run on a broken oracle"


@pytest.mark.campaign_lane
def test_a_correct_per_key_sum_passes_the_reference_check(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """A stateful per-key sum (update mode, upsert sink): the reference check passes and
    ``verify.json`` reports it; rows are matched on the sink's upsert key."""
    log_dir = make_log(90, partitions=3, keys=6)  # 10 per partition per batch: 3+ batches
    sink = f"SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'sums', mode='upsert', keys=['key'])"
    pipeline = write_pipeline(
        tmp_path, log_dir, transform="sums", sink=sink, mode="update", per_partition=10
    )
    out = tmp_path / "out"
    code = main(
        [
            "verify",
            str(pipeline),
            "--trials",
            "1",
            "--faults",
            "crash-point:after-rows",
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "verify.json").read_text())
    assert code == 0, report
    ref = report["reference"]
    assert ref["matched"] is True
    assert (ref["rows"], ref["sparkonce_rows"], ref["missing"], ref["extra"]) == (6, 6, 0, 0)
    assert ref["mismatched"] == 0 and ref["key_columns"] == ["key"]
    assert ref["semantics"] == "upsert" and ref["batches"] >= 3
    assert report["trials"][0]["passed"] and report["trials"][0]["fault_fired"]


def _produce_event_times(root: Path, seconds: list[int]) -> Path:
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, "events", 1, exist_ok=True)
    with topic, IdempotentProducer(topic, "test-producer") as producer:
        for s in seconds:
            producer.send(str(s).encode(), b"e")
    return root


@pytest.mark.campaign_lane
def test_reference_catches_windows_lost_in_no_data_batches(tmp_path: Path) -> None:
    """An append-mode windowed count with a watermark emits its last closed window in
    the no-data batch Spark runs after the input ends. A runner that takes that batch
    for a replay of the one before loses the window; the reference keeps it.

    Events every 15 s over three minutes and one more at 3:00, read 5 per batch:
    the watermark (0 s delay) closes [0:00, 1:00) in batch 1, [1:00, 2:00) in batch
    2 and [2:00, 3:00) only in the no-data batch 3; [3:00, 4:00) stays open.
    """
    from datetime import UTC, datetime

    from sparkonce.verify import Campaign

    base = 1_700_000_040  # a whole minute
    log_dir = _produce_event_times(tmp_path / "log", [base + 15 * i for i in range(13)])
    sink = f"SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'windows')"
    pipeline = write_pipeline(
        tmp_path, log_dir, transform="windows", sink=sink, mode="append", per_partition=5
    )
    campaign = Campaign(pipeline, workdir=tmp_path / "work", seed=1, kinds=["crash-point"])
    try:
        campaign.run_oracle()  # raises ReferenceMismatchError naming the lost windows
    finally:
        campaign.close()
    check = campaign.reference
    assert check is not None and check.matched
    assert check.batches == 4, "three batches with data and the no-data batch that closes"
    assert check.diff.expected_rows == 3

    def at(s: int) -> str:
        return datetime.fromtimestamp(s, UTC).isoformat()

    want = {(at(base + 60 * m), at(base + 60 * (m + 1)), 4) for m in range(3)}
    assert campaign.oracle is not None
    assert {(r["start"], r["end"], r["n"]) for r in campaign.oracle.rows} == want


@pytest.mark.campaign_lane
def test_sparkonce_verify_passes_on_an_append_window_pipeline(tmp_path: Path) -> None:
    """The whole command on the pipeline whose last window only a no-data batch emits:
    the reference check passes, and so do a trial with a crash point and one with a kill."""
    base = 1_700_000_040
    log_dir = _produce_event_times(tmp_path / "log", [base + 15 * i for i in range(13)])
    sink = f"SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'windows')"
    pipeline = write_pipeline(
        tmp_path, log_dir, transform="windows", sink=sink, mode="append", per_partition=5
    )
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "2", "--faults", "crash-point,kill"]
    assert main([*args, "--seed", "3", "--out", str(out)]) == 0
    report = json.loads((out / "verify.json").read_text())
    assert report["reference"]["matched"] and report["reference"]["rows"] == 3
    assert len(report["trials"]) == 2 and all(t["passed"] for t in report["trials"])
    assert [t["fault"]["kind"] for t in report["trials"]] == ["crash-point", "kill"]
    assert all(t["fault_fired"] for t in report["trials"])


@pytest.mark.campaign_lane
def test_reference_reads_a_watermarked_query_as_the_runner_does(tmp_path: Path) -> None:
    """A watermarked dedup over two partitions of unequal backlog, 4 records a partition a
    batch: the runner reads through the source's aligned twin (the batch's 8 records shared
    out by backlog), and so must the reference, or it cuts other batches and drops other
    records as late, and the failure-free run looks wrong.

    Partition 0 holds 20 events 5 s apart, partition 1 four events 25 s apart, over the same
    100 s. With a cap per partition, batch 0 reads all of partition 1 (up to 75 s), the
    watermark goes to 45 s, and partition 0's records at 40 s and 45 s, read two batches
    later, are dropped (22 rows). Shared out by backlog (7 and 2, then 7 and 2, then the
    rest), no record is late (24 rows).
    """
    from sparkonce.log import IdempotentProducer, Topic
    from sparkonce.verify import Campaign

    base = 1_700_000_040
    root = tmp_path / "log"
    topic = Topic.create(root, "events", 2)
    with topic, IdempotentProducer(topic, "test-producer") as producer:
        for i in range(20):
            producer.send(str(base + 5 * i).encode(), b"a", partition=0)
        for i in range(4):
            producer.send(str(base + 25 * i).encode(), b"b", partition=1)
    sink = f"SQLiteSink('sqlite:///{tmp_path / 'sink.db'}', 'events_out')"
    pipeline = write_pipeline(
        tmp_path, root, transform="dedup", sink=sink, mode="append", per_partition=4
    )
    campaign = Campaign(pipeline, workdir=tmp_path / "work", seed=1, kinds=["crash-point"])
    try:
        campaign.run_oracle()  # ReferenceMismatchError when the reference cuts other batches
    finally:
        campaign.close()
    check = campaign.reference
    assert check is not None and check.matched
    assert (check.diff.expected_rows, check.diff.actual_rows) == (24, 24)
