"""Spark's own Kafka connector vs the sparkonce_kafka Python Data Source, measured side by side.

Run from the repository root::

    .venv/bin/python benchmarks/kafka_source.py --records 500000

It starts a throwaway broker (``tests/services/kafka.py``) unless ``--bootstrap`` is given,
produces ``--records`` records (``--value-bytes`` byte values, ``--partitions`` partitions) with a
plain confluent-kafka producer, then, on one SparkSession built with the connector jars from
``scripts/fetch-jars.sh``, times both readers computing ``count(*)`` and ``sum(length(value))``
over the whole topic (read_committed for both). Each reader runs once to warm up (JVM classes,
Python workers), then ``--repeat`` timed runs, alternating. Prints a table and writes
``benchmarks/results/kafka-source.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import write_results  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "kafka-source.json"


def produce(bootstrap: str, topic: str, records: int, value_bytes: int, partitions: int) -> float:
    """Write ``records`` records round-robin over the partitions; returns seconds taken."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": True,
        }
    )
    pad = b"x" * max(0, value_bytes - 10)
    failures: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.monotonic()
    for i in range(records):
        value = b"%010d" % i + pad
        while True:
            try:
                producer.produce(
                    topic, value, b"k%d" % (i % 100), partition=i % partitions, on_delivery=report
                )
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining or failures:
        raise SystemExit(f"producing failed: {remaining} undelivered, errors: {failures[:3]}")
    return time.monotonic() - started


def connector_query(spark: Any, bootstrap: str, topic: str) -> Callable[[], tuple[int, int]]:
    from pyspark.sql import functions as F

    def run() -> tuple[int, int]:
        df = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("kafka.isolation.level", "read_committed")
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .load()
        )
        row = df.agg(F.count("*"), F.sum(F.length("value"))).collect()[0]
        return int(row[0]), int(row[1] or 0)

    return run


def sparkonce_query(spark: Any, bootstrap: str, topic: str) -> Callable[[], tuple[int, int]]:
    from pyspark.sql import functions as F

    from sparkonce.sources.kafka import KafkaSource

    source = KafkaSource(bootstrap, topic)

    def run() -> tuple[int, int]:
        df = source.read_all(spark)
        row = df.agg(F.count("*"), F.sum(F.length("value"))).collect()[0]
        return int(row[0]), int(row[1] or 0)

    return run


def measure(
    name: str, run: Callable[[], tuple[int, int]], expect: tuple[int, int]
) -> dict[str, Any]:
    started = time.monotonic()
    got = run()
    seconds = time.monotonic() - started
    if got != expect:
        raise RuntimeError(f"{name}: read (count, bytes) = {got}, expected {expect}")
    return {"seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs per reader")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.table import Table
    from tests.services import kafka as broker_service

    console = Console(width=150)
    workdir: Path | None = None
    if args.bootstrap:
        bootstrap = args.bootstrap
    else:
        workdir = Path(tempfile.mkdtemp(prefix="sparkonce-bench-kafka-"))
        console.print(f"starting a Kafka broker in {workdir} ...")
        bootstrap = broker_service.start(workdir).bootstrap
    try:
        return _run(args, bootstrap, console, Table, broker_service)
    finally:
        if workdir is not None:
            broker_service.stop(workdir)


def _run(args: Any, bootstrap: str, console: Any, table_cls: Any, broker_service: Any) -> int:
    import confluent_kafka
    import pyspark

    from sparkonce.kafka import KafkaConnection
    from sparkonce.spark.session import build_session

    topic = f"bench-{os.getpid()}-{int(time.time())}"
    KafkaConnection(bootstrap).ensure_topic(topic, args.partitions)
    console.print(
        f"producing {args.records:,} records of {args.value_bytes} bytes to {topic} "
        f"({args.partitions} partitions) at {bootstrap} ..."
    )
    produce_s = produce(bootstrap, topic, args.records, args.value_bytes, args.partitions)
    console.print(f"produced in {produce_s:.1f} s ({args.records / produce_s:,.0f} records/s)")

    jar_dir = broker_service.jar_dir("spark-kafka")
    jars = sorted(str(p) for p in jar_dir.glob("*.jar"))
    spark = build_session(
        master=args.master, app_name="sparkonce-bench-kafka", shuffle_partitions=2, jars=jars
    )
    expect = (args.records, args.records * max(args.value_bytes, 10))
    readers = {
        "spark-sql-kafka connector": connector_query(spark, bootstrap, topic),
        "sparkonce_kafka (Python Data Source)": sparkonce_query(spark, bootstrap, topic),
    }
    results: dict[str, dict[str, Any]] = {name: {"runs_s": []} for name in readers}
    try:
        for name, run in readers.items():  # warm-up: not timed
            try:
                results[name]["warmup_s"] = measure(name, run, expect)["seconds"]
            except Exception as exc:
                results[name]["error"] = f"{type(exc).__name__}: {exc}"
                results[name]["traceback"] = traceback.format_exc()
                console.print(f"[red]{name} failed:[/red] {results[name]['error'][:2000]}")
        for _ in range(args.repeat):
            for name, run in readers.items():
                if "error" not in results[name]:
                    results[name]["runs_s"].append(measure(name, run, expect)["seconds"])
    finally:
        spark.stop()

    for r in results.values():
        if r["runs_s"]:
            r["best_s"] = min(r["runs_s"])
            r["median_s"] = statistics.median(r["runs_s"])
            r["records_per_s_median"] = args.records / r["median_s"]
            r["records_per_s_best"] = args.records / r["best_s"]
    connector, ours = (results[n] for n in readers)
    ratio = None
    if "median_s" in connector and "median_s" in ours:
        ratio = ours["median_s"] / connector["median_s"]

    table = table_cls(title=f"Reading {args.records:,} Kafka records ({args.master})")
    table.add_column("reader")
    table.add_column("warm-up s", justify="right")
    table.add_column("median s", justify="right")
    table.add_column("best s", justify="right")
    table.add_column("records/s (median)", justify="right")
    table.add_column("time vs connector", justify="right")
    for name, r in results.items():
        if "error" in r:
            table.add_row(name, "-", "-", "-", "failed: " + r["error"][:60], "-")
            continue
        rel = r["median_s"] / connector["median_s"] if "median_s" in connector else None
        table.add_row(
            name,
            f"{r['warmup_s']:.2f}",
            f"{r['median_s']:.2f}",
            f"{r['best_s']:.2f}",
            f"{r['records_per_s_median']:,.0f}",
            f"{rel:.2f}x" if rel is not None else "-",
        )
    console.print(table)
    if ratio is not None:
        console.print(
            f"sparkonce_kafka takes {ratio:.2f}x the connector's time "
            f"({1 / ratio:.2f}x its throughput)"
        )

    report = {
        "benchmark": "kafka-source",
        "records": args.records,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
        "master": args.master,
        "query": "count(*), sum(length(value)) over the whole topic, read_committed",
        "produce_s": produce_s,
        "readers": results,
        "time_ratio_sparkonce_over_connector": ratio,
        "environment": {
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "confluent_kafka": confluent_kafka.__version__,
            "librdkafka": confluent_kafka.libversion()[0],
            "connector_jars": [Path(j).name for j in jars],
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    write_results(args.output, report)
    console.print(f"wrote {args.output}")
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
