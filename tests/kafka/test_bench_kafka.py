"""benchmarks/kafka.py (``make bench-kafka``) at a tiny size, on the session's broker and
PostgreSQL server: the script runs end to end, its JSON holds what the README says it
reports, and its output checks catch a variant that loses or repeats records.

Timing is not checked here (a few thousand records say nothing about speed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import psycopg
import pytest
from confluent_kafka import Producer

if TYPE_CHECKING:
    from tests.services.kafka import KafkaBroker
    from tests.services.postgres import PostgresServer

pytestmark = [pytest.mark.kafka, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks" / "kafka.py"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_kafka", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.campaign_lane  # a benchmark's smoke run
def test_two_variants_end_to_end(
    kafka_broker: KafkaBroker, pg_server: PostgresServer, tmp_path: Path
) -> None:
    records, batch = 2000, 1000
    variants = ["k2pg-alo-copy", "k2pg-2pc-append"]
    proc = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--records",
            str(records),
            "--batch-records",
            str(batch),
            "--variants",
            ",".join(variants),
            "--bootstrap",
            kafka_broker.bootstrap,
            "--pg-url",
            pg_server.url,
            "--quick-start",
            "--out",
            str(tmp_path / "kafka"),
        ],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((tmp_path / "kafka.json").read_text())
    assert (tmp_path / "kafka.png").stat().st_size > 0
    assert report["records"] == records and report["batch_records"] == batch
    assert list(report["results"]) == variants
    for name, r in report["results"].items():
        assert r["check"]["complete"], (name, r["check"])
        assert r["check"]["records"] == records and r["records"] == records
        assert r["batches"] == records // batch, name
        assert r["records_per_s"] > 0 and r["python_driver_peak_mb"] > 0
        assert r["jvm_driver_peak_mb"] > 0
        assert r["commit_p50_s"] is not None and r["commit_p99_s"] >= r["commit_p50_s"]
        phases = r["spark_phases_p50_ms"]  # Spark's own split of a batch, from a listener
        assert phases["addBatch"] > 0 and phases["triggerExecution"] >= phases["addBatch"]
    split = report["results"]["k2pg-2pc-append"]["commit_split_p50_s"]  # the committer's own
    assert set(split) == {"look", "stage", "commit", "after"} and split["stage"] > 0
    assert report["results"]["k2pg-alo-copy"]["commit_split_p50_s"] == {}
    eo = report["results"]["k2pg-2pc-append"]
    assert eo["counterpart"] == "k2pg-alo-copy" and eo["goal"] == 0.95
    ratio = eo["records_per_s"] / report["results"]["k2pg-alo-copy"]["records_per_s"]
    assert eo["vs_counterpart"] == pytest.approx(ratio)
    assert eo["goal_met"] == (ratio >= 0.95)
    # Each checked variant's database was dropped, so the next variant ran on a quiet server.
    with psycopg.connect(pg_server.url, autocommit=True) as conn:
        left = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname IN ('bench_k2pg_alo_copy', "
            "'bench_k2pg_2pc_append')"
        ).fetchone()
    assert left == (0,)


def test_topic_check_counts_losses_and_repeats(kafka_broker: KafkaBroker) -> None:
    topic = f"bench-check-{os.getpid()}"
    kafka_broker.create_topic(topic, 2)
    producer = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for value in [*range(8), 3, 3, 42, "x"]:  # 8 and 9 lost, 3 thrice, two foreign values
        producer.produce(topic, str(value).encode(), partition=1 if value == 3 else 0)
    assert producer.flush(30) == 0
    check = bench().check_topic(kafka_broker.bootstrap, topic, 10)
    assert check["records"] == 12
    assert (check["missing"], check["duplicates"], check["foreign"]) == (2, 2, 2)
    assert not check["complete"]


def test_table_check_counts_losses_and_repeats(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE t (record_id text, key text, value bigint)")
        rows = [(f"0/{i}", "k", i) for i in range(8)] + [("1/0", "k", 3), ("1/1", "k", 42)]
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO t VALUES (%s, %s, %s)", rows)
    check = bench().check_table(pg_url, "t", 10)
    assert check["records"] == 10 and check["distinct_record_ids"] == 10
    assert (check["missing"], check["duplicates"], check["foreign"]) == (2, 1, 1)
    assert not check["complete"]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DELETE FROM t WHERE record_id IN ('1/0', '1/1')")
    assert bench().check_table(pg_url, "t", 8)["complete"]


def test_repeated_runs_pool_and_keep_each_rounds_ratio() -> None:
    """``--repeat``: a variant's rate is every record over every second of its runs, its
    ratio is of pooled rates, and each round's ratio pairs the runs of that round."""
    import argparse

    module = bench()
    runs = {
        "k2k-alo-kafkasource": [
            {"records": 100, "seconds": 1.0, "records_per_s": 100.0, "commit_p50_s": 0.5},
            {"records": 100, "seconds": 4.0, "records_per_s": 25.0, "commit_p50_s": 0.7},
        ],
        "k2k-kafkasink-kafkasource": [
            {"records": 100, "seconds": 2.0, "records_per_s": 50.0, "commit_p50_s": 0.6},
            {"records": 100, "seconds": 2.0, "records_per_s": 50.0, "commit_p50_s": 0.6},
        ],
    }
    results = {name: module.pool_runs(rs) for name, rs in runs.items()}
    alo, eo = results["k2k-alo-kafkasource"], results["k2k-kafkasink-kafkasource"]
    assert alo["records_per_s"] == pytest.approx(200 / 5.0)  # not the mean of 100 and 25
    assert alo["runs_records_per_s"] == [100.0, 25.0]
    assert [r["seconds"] for r in alo["runs"]] == [1.0, 4.0]  # each run kept, in order
    assert alo["commit_p50_s"] == 0.7  # the lower middle run's: of two, the slower (25/s)
    args = argparse.Namespace(records=100, batch_records=50, quick_start=False, repeat=2)
    report = module.summarize(results, args, 1.0, runs)
    assert report["repeat"] == 2
    assert eo["vs_counterpart"] == pytest.approx(50 / 40)
    assert eo["ratios_per_round"]["k2k-alo-kafkasource"] == pytest.approx([0.5, 2.0])
    assert eo["goal_met"] is True
    one = module.summarize({n: module.pool_runs(rs[:1]) for n, rs in runs.items()}, args, 1.0)
    assert "ratios_per_round" not in one["results"]["k2k-kafkasink-kafkasource"]
    assert one["results"]["k2k-kafkasink-kafkasource"]["vs_counterpart"] == pytest.approx(0.5)


def test_coordinators_are_warmed_and_checked_topics_deleted(kafka_broker: KafkaBroker) -> None:
    module = bench()
    topic = f"bench-warm-{os.getpid()}"
    kafka_broker.create_topic(topic, 1)
    assert module.warm_coordinators(kafka_broker.bootstrap, topic) > 0
    topics = kafka_broker.admin().list_topics(timeout=30).topics
    assert "__transaction_state" in topics and "__consumer_offsets" in topics
    kafka_broker.create_topic(topic + ".sparkonce-ledger", 1)
    module._delete_topics(kafka_broker.bootstrap, topic)
    left = set(kafka_broker.admin().list_topics(timeout=30).topics)
    assert not {topic, topic + ".sparkonce-ledger"} & left
