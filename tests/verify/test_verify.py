"""``sparkonce verify`` end to end: real drivers, real faults, real sinks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sparkonce.cli import main
from tests.explain import explain_file, verdict

# Campaigns of 150-300 s each on a fast machine, twice that here: the one that must catch a
# planted bug runs in the crash lane, the others in make test-campaign.
pytestmark = pytest.mark.crash

HERE = Path(__file__).parent

_PIPELINE = """
import sys
sys.path.insert(0, {here!r})
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url
{extra_import}

def events(df):
    return df.select(
        "record_id",
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )

pipeline = Pipeline(
    name="verify-test",
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition=250),
    transform=events,
    sink={sink},
    checkpoint={checkpoint!r},
)
"""


def write_pipeline(tmp_path: Path, log_dir: Path, sink_expr: str, extra_import: str = "") -> Path:
    f = tmp_path / "pipeline.py"
    f.write_text(
        _PIPELINE.format(
            here=str(HERE),
            extra_import=extra_import,
            log=str(log_dir),
            sink=sink_expr,
            checkpoint=str(tmp_path / "user-checkpoint"),
        )
    )
    return f


@pytest.mark.crash_lane
def test_verify_catches_a_sink_that_commits_rows_and_ledger_separately(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(1200, partitions=3, keys=6)
    sink = f"NonTransactionalSink('sqlite:///{tmp_path / 'broken.db'}', 'events_out')"
    pipeline = write_pipeline(
        tmp_path, log_dir, sink, extra_import="from broken_sink import NonTransactionalSink"
    )
    # explain calls it at-least-once because of the sink; verify then breaks it.
    explained = explain_file(pipeline)
    assert explained["guarantee"] == "at-least-once"
    assert verdict(explained, "output") == "at-least-once"
    out = tmp_path / "out"
    args = [
        "verify",
        str(pipeline),
        "--trials",
        "2",
        "--seed",
        "3",
        "--faults",
        "crash-point:after-rows",
        "--out",
        str(out),
    ]
    assert main(args) == 1
    report = json.loads((out / "verify.json").read_text())
    fired = [t for t in report["trials"] if t["fault_fired"]]
    assert fired, "the crash point was never reached"
    assert all(t["duplicated_rows"] > 0 and not t["passed"] for t in fired)
    assert report["summary"][0]["duplicated_rows"] == sum(t["duplicated_rows"] for t in fired)
    assert report["this_run"]["trials"] == 2

    # --resume keeps failed trials, runs again a trial recorded as passed with its
    # fault not fired, and plans on the oracle time recorded, not a new one.
    report["oracle"]["seconds"] = 123.0
    report["trials"][1].update(passed=True, fault_fired=False, duplicated_rows=0)
    (out / "verify.json").write_text(json.dumps(report))
    again = [*args, "--resume"]
    assert main(again) == 1
    resumed = json.loads((out / "verify.json").read_text())
    assert resumed["oracle"]["seconds"] == 123.0
    assert resumed["trials"][0] == report["trials"][0]
    assert resumed["trials"][1]["fault_fired"] and not resumed["trials"][1]["passed"]
    assert resumed["this_run"]["trials"] == 1  # only the trial run again
    # (--retime-oracle, which only times the oracle again, is planned in
    # tests/unit/test_verify_planning.py; running it here cost a whole oracle run.)

    # --replay takes the fault recorded for the trial, not a new plan from the seed.
    report = json.loads((out / "verify.json").read_text())
    recorded = report["trials"][0]["fault"]
    assert report["oracle"]["batches"] == 2
    recorded["hit"] = 3 - recorded["hit"]  # the other of the two batches
    (out / "verify.json").write_text(json.dumps(report))
    assert main([*args, "--replay", str(report["trials"][0]["trial"])]) == 1
    replay = json.loads((out / f"replay-{report['trials'][0]['trial']}.json").read_text())
    assert replay["trials"][0]["fault"] == recorded
    assert replay["trials"][0]["fault_fired"] and replay["trials"][0]["duplicated_rows"] > 0


# No PostgresSink campaign here: it commits through the same SqlSink code as SQLiteSink (only
# the dialect differs), and its crash points and fault kinds run in tests/crash. The two-phase
# sink's commit is its own code, so it has its campaign.
@pytest.mark.campaign_lane
@pytest.mark.parametrize(("store", "trials"), [("sqlite", 5), ("postgres-2pc", 5)])
def test_real_sinks_pass_a_small_campaign(
    store: str,
    trials: int,
    tmp_path: Path,
    make_log: Callable[..., Path],
    request: pytest.FixtureRequest,
) -> None:
    """Every fault kind at least once per store; 2PC is the scale-out PostgreSQL sink.

    Each campaign runs two trials at a time, on two stores of its kind (two SQLite
    files, or two databases of the PostgreSQL server).
    """
    log_dir = make_log(1200, partitions=3, keys=6)
    url = (
        f"sqlite:///{tmp_path / 'sink.db'}"
        if store == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    two_phase = ", two_phase=True" if store == "postgres-2pc" else ""
    pipeline = write_pipeline(tmp_path, log_dir, f"sink_from_url({url!r}, 'events_out'{two_phase})")
    assert explain_file(pipeline)["guarantee"] == "effectively-once"  # and verify agrees:
    out = tmp_path / "out"
    if store == "sqlite":
        second = f"sqlite:///{tmp_path / 'sink2.db'}"
    else:
        name = f"v2_{os.getpid()}_{store.replace('-', '_')}"
        second = request.getfixturevalue("pg_server").create_database(name)
    stores = [url, second]
    sink_args = [arg for u in stores for arg in ("--sink", u)]
    code = main(
        [
            "verify",
            str(pipeline),
            "--trials",
            str(trials),
            "--seed",
            "11",
            "--out",
            str(out),
            *sink_args,
        ]
    )
    report = json.loads((out / "verify.json").read_text())
    failures = [t for t in report["trials"] if not t["passed"]]
    assert code == 0, failures
    assert [t["trial"] for t in report["trials"]] == list(range(trials))
    assert all(t["quick_start"] is True for t in report["trials"])
    assert len(report["stores"]) == 2
    assert {t["worker"] for t in report["trials"]} == {0, 1}
    kinds = {t["fault"]["kind"] for t in report["trials"]}
    assert kinds == {"kill", "crash-point", "task-failure", "db-drop", "zombie"}
    assert all(t["lost_rows"] == t["duplicated_rows"] == 0 for t in report["trials"])
    zombies = [t for t in report["trials"] if t["fault"]["kind"] == "zombie"]
    assert all(t["zombie_fenced"] in (True, None) for t in zombies)
    assert any(t["zombie_fenced"] is True for t in zombies)
    assert sum(t["fault_fired"] for t in report["trials"]) >= trials - 2
    assert (out / "recovery.png").stat().st_size > 1000
    assert report["oracle"]["rows"] == 1200
    # Each recovery is split by the recovering driver's own marks, which add up to it.
    recovered = [t for t in report["trials"] if t["recovery_s"] is not None]
    assert recovered
    for t in recovered:
        split = t["recovery_phases"]
        assert split is not None, t
        assert set(split) == {"start_s", "plan_s", "first_batch_s"} and min(split.values()) >= 0
        assert sum(split.values()) == pytest.approx(t["recovery_s"], abs=0.01), t
        assert split["start_s"] > 1 and split["plan_s"] > 0, t  # a Spark start, then a plan
    goal = report["recovery_goal"]
    assert goal["recoveries"] == len(recovered) and goal["met"] == (goal["ratio"] <= 1.5)
    assert (goal["trials_at_a_time"], goal["fair"]) == (2, False)  # two stores at a time
    # The oracle's own time to its first entry, split the same way: the phases to compare.
    o = report["oracle"]["phases"]
    assert set(o) == {"start_s", "plan_s", "first_batch_s"} and o["start_s"] > 1 and o["plan_s"] > 0
    assert sum(o.values()) == pytest.approx(report["oracle"]["first_commit_s"], abs=0.05)


_KAFKA_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import KafkaSink, KafkaSource, Pipeline

def copy(df):
    return df.select(
        F.col("record_id").alias("key"),
        F.concat_ws("/", F.col("partition").cast("string"), F.col("value").cast("string"))
        .alias("value"),
    )

pipeline = Pipeline(
    name="verify-kafka",
    source=KafkaSource({bootstrap!r}, {source!r}, max_records_per_partition=150),
    transform=copy,
    sink=KafkaSink({bootstrap!r}, {sink!r}),
    checkpoint={checkpoint!r},
)
"""


@pytest.mark.kafka
@pytest.mark.campaign_lane
def test_kafka_to_kafka_passes_a_small_campaign(
    tmp_path: Path, kafka_broker, kafka_topic: Callable[..., str]
) -> None:
    """Kafka source -> transactional Kafka sink; db-drop does not apply and is left out.

    Two trials at a time, on two sink topics (each with its own ledger topic).
    """
    from confluent_kafka import Producer

    source, sink = kafka_topic("vin", partitions=3), kafka_topic("vout", partitions=2)
    stores = [f"kafka://{kafka_broker.bootstrap}/{t}" for t in (sink, kafka_topic("vout2", 2))]
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap, "enable.idempotence": True})
    for i in range(1, 901):
        producer.produce(source, value=str(i).encode(), key=f"k{i % 6}".encode())
    assert producer.flush(30) == 0
    pipeline = tmp_path / "pipeline.py"
    pipeline.write_text(
        _KAFKA_PIPELINE.format(
            bootstrap=kafka_broker.bootstrap,
            source=source,
            sink=sink,
            checkpoint=str(tmp_path / "user-checkpoint"),
        )
    )
    explained = explain_file(pipeline)  # verify reads the sink topic at read_committed
    assert explained["guarantee"] == "effectively-once for read_committed consumers"
    out = tmp_path / "out"
    sink_args = [arg for u in stores for arg in ("--sink", u)]
    code = main(
        ["verify", str(pipeline), "--trials", "4", "--seed", "5", "--out", str(out), *sink_args]
    )
    report = json.loads((out / "verify.json").read_text())
    failures = [t for t in report["trials"] if not t["passed"]]
    assert code == 0, failures
    assert {t["fault"]["kind"] for t in report["trials"]} == {
        "kill",
        "crash-point",
        "task-failure",
        "zombie",
    }
    assert all(t["lost_rows"] == t["duplicated_rows"] == 0 for t in report["trials"])
    assert sum(t["fault_fired"] for t in report["trials"]) >= 3
    assert {t["worker"] for t in report["trials"]} == {0, 1}
    assert report["oracle"]["rows"] == 900


@pytest.mark.campaign_lane
def test_a_kill_planned_on_progress_fires_after_its_ledger_entry(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """Two batches (400 records per partition, 250 per batch): the seed is chosen so that
    trial 0 is killed after the first batch's ledger entry, not at a time from the start.
    Then the same trial resumed from an older version's report, whose kill, planned on a
    recorded run time, would come after the run ends: it is planned again on that run."""
    import random

    from sparkonce.verify.model import Oracle, plan_fault

    shape = Oracle([], 60.0, 2, first_commit_s=20.0, batch_interval_s=2.0)
    seed = next(
        s for s in range(100) if plan_fault("kill", random.Random(f"{s}:0"), shape).after_entries
    )
    log_dir = make_log(1200, partitions=3, keys=6)
    pipeline = write_pipeline(
        tmp_path, log_dir, f"sink_from_url('sqlite:///{tmp_path}/p.db', 'out')"
    )
    out = tmp_path / "out"
    args = ["verify", str(pipeline), "--trials", "1", "--faults", "kill", "--seed", str(seed)]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads((out / "verify.json").read_text())
    assert report["oracle"]["batches"] == 2
    [trial] = report["trials"]
    assert trial["fault"]["after_entries"] == 1, trial
    assert trial["fault_fired"] and trial["passed"], trial
    assert trial["lost_rows"] == trial["duplicated_rows"] == 0

    # A report of an older version has no progress marks: its kills are planned on the
    # recorded run time. Here that is 400 s, as a cold first run on a busy machine could
    # measure, so the delay drawn is 120 s or more and would land after the driver ended,
    # testing nothing. The trial measures the run that finished first and kills the next
    # one at the same fraction of it: first run finished, second killed, third to the end.
    assert report["oracle"]["first_commit_s"] > 0 and report["oracle"]["batch_interval_s"] > 0
    del report["oracle"]["first_commit_s"], report["oracle"]["batch_interval_s"]
    report["oracle"]["seconds"] = 400.0
    report["trials"][0].update(fault_fired=False)
    (out / "verify.json").write_text(json.dumps(report))
    assert main([*args, "--out", str(out), "--resume"]) == 0
    trial = json.loads((out / "verify.json").read_text())["trials"][0]
    assert trial["fault_fired"] and trial["passed"], trial
    assert trial["fault"]["delay_s"] < 120.0 and trial["driver_runs"] >= 3, trial


def _processes_naming(text: str) -> list[str]:
    """The command lines of running processes that contain ``text``."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:  # gone meanwhile
            continue
        if text in cmdline:
            found.append(f"{proc.name}: {cmdline[:200]}")
    return found


@pytest.mark.crash_lane
def test_sigterm_stops_a_campaign_and_keeps_its_finished_trials(
    tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """A long campaign (scripts/live-campaign.sh) is stopped between sessions with SIGTERM:
    verify kills the running trial's driver, exits 143, and its report keeps every trial
    finished before, for --resume. SIGINT is ignored, as in a shell's background job."""
    log_dir = make_log(1200, partitions=3, keys=6)
    sink = f"sink_from_url('sqlite:///{tmp_path / 'sink.db'}', 'events_out')"
    pipeline = write_pipeline(tmp_path, log_dir, sink)
    out = tmp_path / "out"
    report_file = out / "verify.json"
    cmd = [sys.executable, "-m", "sparkonce", "verify", str(pipeline), "--trials", "4"]
    verify = subprocess.Popen(
        [*cmd, "--seed", "5", "--faults", "task-failure,kill", "--out", str(out)],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    try:
        deadline = time.monotonic() + 900
        while not (report_file.exists() and json.loads(report_file.read_text())["trials"]):
            assert verify.poll() is None, verify.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no trial finished in 900 s"
            time.sleep(0.5)
        time.sleep(3)  # the next trial's driver is running
        assert _processes_naming(str(out)), "no trial driver to stop"
        verify.send_signal(signal.SIGTERM)
        _, err = verify.communicate(timeout=120)
    finally:
        if verify.poll() is None:
            verify.kill()
    assert verify.returncode == 143, err[-3000:]
    assert "stopped: sparkonce verify stopped on SIGTERM" in err, err[-3000:]
    report = json.loads(report_file.read_text())
    assert report["trials"] and all(t["passed"] for t in report["trials"]), report["trials"]
    assert len(report["trials"]) < 4
    left = _processes_naming(str(out))
    for _ in range(20):  # a JVM may take a moment to go after its group's SIGKILL
        if not left:
            break
        time.sleep(0.5)
        left = _processes_naming(str(out))
    assert not left, left
