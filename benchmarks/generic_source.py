"""The generic source over Spark's Kafka connector against ``SparkKafkaSource``, side by side.

Run from the repository root (``make bench-generic-source`` does)::

    .venv/bin/python benchmarks/generic_source.py --records 1000000

Issue 47 lets a user hand sparkonce their own ``spark.readStream.format("kafka")...`` chain
(:class:`~sparkonce.SparkSource`). This measures what that route costs against the source
sparkonce builds itself (:class:`~sparkonce.SparkKafkaSource`), which reads through the same
connector: the difference is sparkonce finding the read in the plan and parsing the offset
log line as a generic relation, not a different reader. Both variants read one topic of a
throwaway broker (``tests/services/kafka.py``, the pinned jars) produced once, with the same
``maxOffsetsPerTrigger`` (``--batch-records``), into a fresh :class:`~sparkonce.SQLiteSink`
table and checkpoint per run, on one SparkSession, in ``--repeat`` rounds that alternate
which variant goes first, after one untimed warm-up run of each (JVM classes, Python workers).

Reported per variant: records/s pooled over the rounds (every record over every second) and
each round's, per-batch p50/p99 (the runner's time per batch, read and commit), and the
ratio generic/SparkKafkaSource of each round and pooled. Each run's table is checked with
``sqlite3`` (not sparkonce): row count, distinct ``(partition, offset)`` pairs and a checksum
over them and the values' lengths must equal what was produced. Writes
``benchmarks/results/generic-source.json``.

Size: 11 batches per run (the connector spreads the limit over the partitions in proportion,
so a remainder batch follows ten full ones), enough for a per-batch p50, and a run of at
least 20 s, so the fixed costs of a query's start are a small part of either variant's
time. The default, 1,000,000 records at 100,000 a batch, ran 15 to 21 s at 50,000 to 69,000
records/s on the shared 2-core machine under load 17 to 20; the results file's figures are
from ``--records 2000000 --batch-records 200000`` (20 to 25 s a run).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct, pool_runs, write_results  # noqa: E402
from benchmarks.kafka_source import produce  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "generic-source.json"
GENERIC = "generic SparkSource(readStream kafka)"
BUILTIN = "SparkKafkaSource"
VARIANTS = (GENERIC, BUILTIN)


def transform(df: Any) -> Any:
    """The same rows from both reads: where each record sits, and its value as text."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("partition"), F.col("offset"), F.col("value").cast("string").alias("body")
    )


def make_source(name: str, bootstrap: str, topic: str, batch_records: int) -> Any:
    """The variant's source. The generic read sets what ``SparkKafkaSource`` sets for its own
    read (read_committed, failOnDataLoss, the trigger's limit), so the two read the same."""
    from sparkonce import SparkKafkaSource, SparkSource

    if name == BUILTIN:
        return SparkKafkaSource(bootstrap, topic, max_records_per_batch=batch_records)

    def query(spark: Any) -> Any:
        return (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic)
            .option("kafka.isolation.level", "read_committed")
            .option("failOnDataLoss", "true")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(batch_records))
            .load()
        )

    return SparkSource(query, reads="kafka")


def checksum(db: Path, table: str) -> dict[str, int]:
    """The table's rows as counted by sqlite3 itself."""
    with sqlite3.connect(db) as conn:
        row = conn.execute(
            f"SELECT count(*), count(DISTINCT partition || ':' || offset), "
            f"sum(partition * 1000000000 + offset), sum(length(body)) FROM {table}"
        ).fetchone()
    return dict(zip(("rows", "distinct", "position_sum", "body_bytes"), map(int, row), strict=True))


def expected(records: int, partitions: int, value_bytes: int) -> dict[str, int]:
    """What ``produce`` wrote: record i at partition i % partitions, offsets from 0."""
    position_sum = 0
    for p in range(partitions):
        n = len(range(p, records, partitions))
        position_sum += n * p * 1_000_000_000 + n * (n - 1) // 2
    return {
        "rows": records,
        "distinct": records,
        "position_sum": position_sum,
        "body_bytes": records * max(value_bytes, 10),
    }


def run_once(spark: Any, name: str, args: Any, work: Path, tag: str) -> dict[str, Any]:
    """One pipeline run to the end of the topic, fresh table and checkpoint."""
    from sparkonce import Pipeline, SQLiteSink

    db = work / f"{tag}.db"
    source = make_source(name, args.bootstrap, args.topic, args.batch_records)
    pipeline = Pipeline(
        name=f"bench-generic-{tag}",
        source=source,
        transform=transform,
        sink=SQLiteSink(f"sqlite:///{db}", "events"),
        checkpoint=work / f"{tag}-checkpoint",
    )
    latencies: list[float] = []
    started = time.perf_counter()
    report = pipeline.run(spark, on_batch=lambda b: latencies.append(b.seconds))
    seconds = time.perf_counter() - started
    got = checksum(db, "events")
    if got != args.expect:
        raise RuntimeError(f"{name} ({tag}): table holds {got}, expected {args.expect}")
    return {
        "records": report.rows_committed,
        "seconds": seconds,
        "records_per_s": report.rows_committed / seconds,
        "batches": len(latencies),
        "batch_p50_s": pct(latencies, 50),
        "batch_p99_s": pct(latencies, 99),
        "checksum": got,
        "load_1min": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--batch-records", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=2, help="timed rounds (alternating)")
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)

    from rich.console import Console
    from tests.services import kafka as broker_service

    console = Console(width=150)
    started_broker: Path | None = None
    if not args.bootstrap:
        started_broker = Path(tempfile.mkdtemp(prefix="sparkonce-bench-generic-"))
        console.print(f"starting a Kafka broker in {started_broker} ...")
        args.bootstrap = broker_service.start(started_broker).bootstrap
    try:
        return _run(args, console)
    finally:
        if started_broker is not None:
            broker_service.stop(started_broker)


def _run(args: Any, console: Any) -> int:
    import pyspark

    from sparkonce.kafka import KafkaConnection
    from sparkonce.spark.session import build_session, merge_spark_conf

    args.topic = f"bench-generic-{os.getpid()}-{int(time.time())}"
    KafkaConnection(args.bootstrap).ensure_topic(args.topic, args.partitions)
    produce_s = produce(args.bootstrap, args.topic, args.records, args.value_bytes, args.partitions)
    console.print(f"produced {args.records:,} records to {args.topic} in {produce_s:.1f} s")
    args.expect = expected(args.records, args.partitions, args.value_bytes)

    conf = merge_spark_conf(
        *(
            make_source(n, args.bootstrap, args.topic, args.batch_records).spark_conf()
            for n in VARIANTS
        )
    )
    spark = build_session(app_name="sparkonce-bench-generic-source", conf=conf)
    work = Path(tempfile.mkdtemp(prefix="sparkonce-bench-generic-work-"))
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in VARIANTS}
    warmup: dict[str, float] = {}
    try:
        for name in VARIANTS:  # untimed: JVM classes, Python workers, the connector's pools
            warmup[name] = run_once(spark, name, args, work, f"warm-{VARIANTS.index(name)}")[
                "seconds"
            ]
        for r in range(args.repeat):
            order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
            for name in order:
                one = run_once(spark, name, args, work, f"r{r}-{VARIANTS.index(name)}")
                one["round"], one["first"] = r, name == order[0]
                runs[name].append(one)
                console.print(
                    f"round {r} {name}: {one['records_per_s']:,.0f} records/s, "
                    f"{one['batches']} batches, p50 {one['batch_p50_s']:.2f} s, "
                    f"load {one['load_1min']:.1f}"
                )
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    results = {name: pool_runs(rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        results[name]["warmup_s"] = warmup[name]
        results[name]["batch_p50_s"] = pct([x["batch_p50_s"] for x in rs], 50)
        results[name]["load_1min_runs"] = [x["load_1min"] for x in rs]
    gen, own = results[GENERIC], results[BUILTIN]
    ratio = gen["records_per_s"] / own["records_per_s"]
    gen["ratio"], own["ratio"] = ratio, 1.0
    per_round = [
        g["records_per_s"] / o["records_per_s"]
        for g, o in zip(runs[GENERIC], runs[BUILTIN], strict=True)
    ]
    console.print(
        f"generic/SparkKafkaSource records/s: {ratio:.3f} pooled, rounds "
        + ", ".join(f"{x:.3f}" for x in per_round)
    )
    report = {
        "benchmark": "generic-source",
        "records": args.records,
        "batch_records": args.batch_records,
        "partitions": args.partitions,
        "value_bytes": args.value_bytes,
        "repeat": args.repeat,
        "sink": "SQLiteSink (one fresh table and checkpoint per run)",
        "produce_s": produce_s,
        "results": results,
        "ratio_generic_over_sparkkafkasource": ratio,
        "ratio_per_round": per_round,
        "same_rows": all(x["checksum"] == args.expect for rs in runs.values() for x in rs),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": {"pyspark": pyspark.__version__, "commit": _commit()},
    }
    write_results(args.output, report)
    console.print(f"wrote {args.output}")
    return 0


def _commit() -> str | None:
    import subprocess

    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
