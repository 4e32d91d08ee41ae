"""``sparkonce verify`` on pipelines with several outputs and a ``uuid()`` column.

The pipeline is tests/outputs/multi_pipeline.py's: ``totals`` (upsert), ``dead_letters``
and ``accepted`` in SQLite store A, ``audit`` (the same DataFrame as ``accepted``, with a
``uuid()`` ``event_id``) in SQLite store B. Its 420 records make 5 batches (35 records
per partition and batch, partitions of unequal size), so each store's commit reaches a
crash point 5 times: hits 1..10, odd ones in store A, where ``after-ledger-commit``
falls between the two stores' commits of a batch.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import main
from sparkonce.errors import ConfigError
from sparkonce.verify.campaign import Campaign
from sparkonce.verify.model import Fault, Oracle, plan_fault
from tests.explain import explain_file
from tests.outputs import multi_pipeline as mp

# All in make test-campaign (tests/unit/test_lanes.py: a test under tests/verify runs in make
# test only if ALSO_IN_MAKE_TEST lists it). The first two are fast (about 60 s and 0.1 s).
pytestmark = [pytest.mark.crash, pytest.mark.campaign_lane]

NAME = "verify-multi"
BATCHES = 5  # 420 records, 3 partitions of unequal size, 35 per partition and batch
BETWEEN_STORES = "crash-point:after-ledger-commit"


def _pipeline(tmp_path: Path, *, stable: bool | None = None) -> Path:
    log_dir = mp.write_log(tmp_path)
    path = tmp_path / "pipeline.py"
    path.write_text(
        mp.pipeline_text(
            name=NAME,
            log_dir=log_dir,
            store_a=f"sqlite:///{tmp_path / 'a.db'}",
            store_b=f"sqlite:///{tmp_path / 'b.db'}",
            checkpoint=tmp_path / "user-checkpoint",
            stable=stable,
        )
    )
    return path


def _seed(kinds: list[str], want: Callable[[list[Fault]], bool]) -> int:
    """The first seed whose trials 0..len(kinds)-1 get faults that ``want`` accepts."""
    oracle = Oracle([], 30.0, BATCHES)
    for seed in range(200):
        faults = [
            plan_fault(kind, random.Random(f"{seed}:{n}"), oracle, stores=2)
            for n, kind in enumerate(kinds)
        ]
        if want(faults):
            return seed
    raise AssertionError("no seed found")


def _between_stores(fault: Fault) -> bool:
    """A crash between the two stores' commits of one of the first three batches (full
    ones): an odd hit of after-ledger-commit (store A's commit)."""
    return fault.hit % 2 == 1 and fault.hit <= 5


def _report(out: Path) -> dict:
    return json.loads((out / "verify.json").read_text())


def test_an_undeclared_uuid_column_is_named_and_stops_the_campaign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --nondeterministic, the failure-free run differs from the reference in
    event_id only; verify says to declare it, and runs no trial. The other outputs (an
    upsert, dead letters with their pipeline and batch_seq columns) match the reference."""
    pipeline = _pipeline(tmp_path)
    out = tmp_path / "out"
    code = main(["verify", str(pipeline), "--trials", "1", "--faults", "kill", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "in outputs accepted, audit:" in err, err
    assert "--nondeterministic event_id " in err, err
    ref = _report(out)["reference"]
    assert not ref["matched"] and ref["semantics"] == "per output"
    outputs = ref["outputs"]
    assert outputs["totals"]["matched"] and outputs["totals"]["semantics"] == "upsert"
    assert outputs["totals"]["key_columns"] == ["user"]
    assert outputs["dead_letters"]["matched"] and outputs["dead_letters"]["rows"] == 60
    assert outputs["dead_letters"]["not_compared"] == ["pipeline", "batch_seq"]
    for name in ("accepted", "audit"):
        assert outputs[name]["differing_columns"] == ["event_id"], outputs[name]
        assert outputs[name]["rows"] == outputs[name]["sparkonce_rows"] == 360
    assert not (out / "work" / "trials").exists(), "no trial may run on a broken oracle"


def test_sink_and_key_options_name_the_outputs_and_stores(tmp_path: Path) -> None:
    """--sink cannot move outputs spread over two stores; --key needs OUTPUT.COLUMN."""
    pipeline = _pipeline(tmp_path)
    with pytest.raises(ConfigError, match="writes its outputs to 2 stores") as refused:
        Campaign(pipeline, workdir=tmp_path / "w", sink_url=f"sqlite:///{tmp_path / 'x.db'}")
    text = str(refused.value)
    assert f"store sqlite:///{tmp_path / 'a.db'} (totals, dead_letters, accepted)" in text
    assert f"store sqlite:///{tmp_path / 'b.db'} (audit)" in text
    with pytest.raises(ConfigError, match=r"OUTPUT\.COLUMN"):
        Campaign(pipeline, workdir=tmp_path / "w", key_columns=["record_id"])
    with pytest.raises(ConfigError, match=r"OUTPUT\.COLUMN"):
        Campaign(pipeline, workdir=tmp_path / "w", key_columns=["nope.record_id"])
    campaign = Campaign(
        pipeline,
        workdir=tmp_path / "w",
        key_columns=["accepted.record_id"],
        nondeterministic=["event_id", "audit.event_id"],
    )
    try:
        assert campaign.multi and list(campaign.sinks) == [
            "totals",
            "dead_letters",
            "accepted",
            "audit",
        ]
        assert campaign.stores == [("totals", "dead_letters", "accepted"), ("audit",)]
        assert campaign.output_keys == {
            "totals": ("user",),
            "dead_letters": (),
            "accepted": ("record_id",),
            "audit": (),
        }
        assert [str(s) for s in campaign.declared] == ["event_id", "audit.event_id"]
        assert "db-drop" in campaign.kinds  # SQLite outputs can drop their connection
    finally:
        campaign.close()


def test_a_uuid_pipeline_with_stable_output_passes_a_small_campaign(tmp_path: Path) -> None:
    """Stable output (the default for two stores): a crash between the stores' commits,
    a kill, and a zombie frozen before store B's commit (an even hit) that wakes after the
    newer run committed the batch everywhere and collected its stable copy: it must still
    end fenced. event_id is declared, so it is checked by count and across outputs."""
    pipeline = _pipeline(tmp_path)
    explained = explain_file(pipeline)
    assert explained["guarantee"] == "effectively-once"  # and verify agrees:
    assert "uuid()" in explained["nondeterministic"]
    kinds = [BETWEEN_STORES, "kill", "zombie"]
    seed = _seed(kinds, lambda f: _between_stores(f[0]) and f[2].hit % 2 == 0)
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "3", "--seed", str(seed)]
    args += ["--faults", ",".join(kinds), "--nondeterministic", "event_id", "--out", str(out)]
    code = main(args)
    report = _report(out)
    assert code == 0, [t for t in report["trials"] if not t["passed"]]
    assert report["oracle"]["batches"] == BATCHES
    assert report["reference"]["matched"]
    assert report["nondeterministic"]["columns"] == {
        "accepted": ["event_id"],
        "audit": ["event_id"],
    }
    assert report["consistency"]["checked"] == [
        "accepted.event_id = audit.event_id joined on record_id"
    ]
    assert report["outputs"]["audit"]["store"] == 1
    assert report["outputs"]["dead_letters"]["oracle_rows"] == 60
    crash = report["trials"][0]
    assert crash["fault"]["hit"] % 2 == 1 and crash["fault_fired"], crash
    for trial in report["trials"]:
        assert set(trial["outputs"]) == {"totals", "dead_letters", "accepted", "audit"}
        assert trial["inconsistent"] == 0 and trial["passed"], trial
    zombie = report["trials"][2]
    assert zombie["fault"]["hit"] % 2 == 0 and zombie["zombie_fenced"] is True, zombie


def test_without_stable_output_a_crash_between_two_stores_is_caught(tmp_path: Path) -> None:
    """stable_output=False: the batch the crash left in store A only is recomputed for
    store B, with other uuid() values. Each output alone matches the oracle (event_id is
    declared); the cross-output check fails the trial."""
    pipeline = _pipeline(tmp_path, stable=False)
    # explain calls it effectively-once per output only, naming uuid(); verify then
    # finds the stores disagree.
    explained = explain_file(pipeline)
    assert explained["guarantee"] == "effectively-once per output"
    assert "uuid()" in next(p for p in explained["parts"] if p["part"] == "outputs")["why"]
    kinds = [BETWEEN_STORES]
    seed = _seed(kinds, lambda f: _between_stores(f[0]))
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "1", "--seed", str(seed)]
    args += ["--faults", BETWEEN_STORES, "--nondeterministic", "event_id", "--out", str(out)]
    assert main(args) == 1
    report = _report(out)
    trial = report["trials"][0]
    assert trial["fault_fired"] and not trial["passed"]
    assert trial["lost_rows"] == trial["duplicated_rows"] == trial["value_mismatches"] == 0
    assert not trial["ledger_problems"] and trial["error"] is None
    # One batch (105 records, about 90 good ones) has other event ids in audit.
    assert 60 < trial["inconsistent"] <= 105, trial
    assert trial["inconsistencies"][0].startswith("accepted vs audit: "), trial
    assert "other event_id values in accepted than in audit" in trial["inconsistencies"][0]
    assert report["summary"][0]["inconsistent"] == trial["inconsistent"]
    assert report["consistency"]["inconsistent"] == trial["inconsistent"]


_LATE_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
from sparkonce.outputs.late import late_records

def transform(df):
    seconds = F.col("value").cast("string").try_cast("int")
    events = df.select("record_id", F.timestamp_seconds(seconds).alias("ts"))
    events = events.withWatermark("ts", "10 seconds")
    counts = events.groupBy(F.window("ts", "10 seconds")).count()
    totals = counts.select(F.col("window.start").alias("start"), "count")
    return {{"totals": totals, "late": late_records(events, "ts", window="10 seconds")}}

pipeline = Pipeline(
    "verify-late",
    EmbeddedLogSource({log!r}, "events", max_records_per_partition=4),
    checkpoint={checkpoint!r},
    transform=transform,
    outputs={{
        "totals": SQLiteSink({a!r}, "totals", mode="upsert", keys=["start"]),
        "late": SQLiteSink({b!r}, "late"),
    }},
)
"""


def test_a_late_output_matches_the_reference_and_survives_a_crash(tmp_path: Path) -> None:
    """A late output (late_records) is what the aggregation dropped, by the watermark in the
    checkpoint: the reference applies the same rule with its own checkpoint. Event times as
    in tests/outputs/test_pipeline_outputs.py: 95, 105 and 106 arrive late, in batch 3."""
    from sparkonce.log import IdempotentProducer, Topic

    times = [101, 102, 103, 104, 201, 202, 203, 204, 205, 206, 207, 208, 105, 106, 95, 209]
    topic = Topic.create(tmp_path / "log", "events", 1)
    with topic, IdempotentProducer(topic, "p") as producer:
        for t in times:
            producer.send(str(t).encode(), b"k")
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        _LATE_PIPELINE.format(
            log=str(tmp_path / "log"),
            checkpoint=str(tmp_path / "user-checkpoint"),
            a=f"sqlite:///{tmp_path / 'a.db'}",
            b=f"sqlite:///{tmp_path / 'b.db'}",
        )
    )
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "1", "--seed", "1", "--out", str(out)]
    assert main([*args, "--faults", "crash-point:after-ledger-commit"]) == 0
    report = _report(out)
    late = report["reference"]["outputs"]["late"]
    assert late["matched"] and late["rows"] == 3 and late["not_compared"] == []
    assert report["outputs"]["late"]["oracle_rows"] == 3
    assert report["trials"][0]["passed"] and report["trials"][0]["fault_fired"]
