"""A pipeline on a Spark Connect session against the same pipeline on a classic session,
measured side by side in one run.

Run from the repository root::

    .venv/bin/python benchmarks/connect.py --records 40000 --batch-records 2000 --repeat 3

Each timed run is a child process of its own, since a classic SparkContext and PySpark's
local Connect server do not share one Python process: ``classic`` builds a ``local[2]``
session (:func:`sparkonce.spark.session.build_session`), ``connect`` starts PySpark's own
Connect server (``SparkSession.builder.remote("local[2]")``). The child writes
``--records`` records of the embedded log (two partitions) into a fresh SQLite sink in
batches of ``--batch-records``, after a warm-up run of the same pipeline shape on a
small log, and times ``Pipeline.run`` alone (the session's start is not counted). It
checks the sink's rows with Python's sqlite3 (count and sum of the values) and fails if
one is missing or repeated. The variants alternate, ``--repeat`` runs each.

Reports each variant's median seconds per run and per batch, Connect's ratio to classic,
and Connect's extra seconds per batch (the foreachBatch round trip through the server's
Python worker) in ``benchmarks/results/connect.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, write_results  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "connect.json"
VARIANTS = ("classic", "connect")


def make_log(root: Path, records: int, start: int = 1) -> Path:
    """Topic ``events`` with two partitions and values ``start..start+records-1``."""
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, "events", 2, exist_ok=True)
    with topic, IdempotentProducer(topic, "bench-producer") as producer:
        for i in range(start, start + records):
            producer.send(str(i).encode(), f"k{i % 8}".encode())
    return root


def pipeline(log: Path, db: Path, checkpoint: Path, batch_records: int) -> Any:
    from pyspark.sql import functions as F

    from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

    return Pipeline(
        name="bench",
        source=EmbeddedLogSource(log, "events", max_records_per_partition=batch_records // 2),
        sink=sink_from_url(f"sqlite:///{db}", "out"),
        checkpoint=checkpoint,
        transform=lambda df: df.select(
            "record_id", F.col("value").cast("string").cast("long").alias("value")
        ),
    )


def child(variant: str, workdir: Path, records: int, batch_records: int) -> dict[str, Any]:
    """One timed run (after a warm-up) in this process; the sink's rows checked."""
    from sparkonce.spark.session import build_session

    started = time.perf_counter()
    if variant == "connect":
        spark = build_session(remote="local[2]", app_name="bench-connect")
    else:
        spark = build_session(master="local[2]", app_name="bench-classic")
    session_s = time.perf_counter() - started
    try:
        warm = pipeline(
            make_log(workdir / "warm-log", 4 * batch_records),
            workdir / "warm.db",
            workdir / "warm-chk",
            batch_records,
        )
        warm.run(spark)
        p = pipeline(
            make_log(workdir / "log", records), workdir / "out.db", workdir / "chk", batch_records
        )
        started = time.perf_counter()
        report = p.run(spark)
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    with sqlite3.connect(workdir / "out.db") as conn:
        count, total = conn.execute("SELECT COUNT(*), SUM(value) FROM out").fetchone()
    expected = records * (records + 1) // 2
    if (count, total) != (records, expected):
        raise SystemExit(
            f"{variant}: the sink holds {count} rows summing to {total}, not "
            f"{records} rows summing to {expected}"
        )
    return {
        "variant": variant,
        "seconds": round(seconds, 3),
        "session_start_s": round(session_s, 3),
        "batches": report.batches_committed,
        "rows": count,
    }


def run_child(variant: str, records: int, batch_records: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-connect-{variant}-") as tmp:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--workdir",
                tmp,
                "--records",
                str(records),
                "--batch-records",
                str(batch_records),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    if done.returncode != 0:
        raise SystemExit(f"the {variant} run failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: its median run; Connect's also against classic (its ratio, and its extra
    milliseconds per batch)."""
    out: dict[str, Any] = {}
    for v in VARIANTS:
        mine = [r for r in runs if r["variant"] == v]
        seconds = statistics.median(r["seconds"] for r in mine)
        batches = mine[0]["batches"]
        out[v] = {
            "runs": len(mine),
            "median_s": round(seconds, 3),
            "per_batch_ms": round(1000 * seconds / batches, 1),
            "batches": batches,
            "session_start_median_s": round(
                statistics.median(r["session_start_s"] for r in mine), 2
            ),
        }
    classic, connect = out["classic"], out["connect"]
    connect["ratio"] = round(connect["median_s"] / classic["median_s"], 3)
    connect["extra_per_batch_ms"] = round(connect["per_batch_ms"] - classic["per_batch_ms"], 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--batch-records", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch_records < 2 or args.records < args.batch_records:
        ap.error("--batch-records must be at least 2 and at most --records")
    if args.child:
        result = child(args.child, args.workdir, args.records, args.batch_records)
        print(json.dumps(result))
        return 0
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for variant in VARIANTS if i % 2 == 0 else reversed(VARIANTS):
            print(f"run {i + 1}/{args.repeat}: {variant} ...", flush=True)
            r = run_child(variant, args.records, args.batch_records)
            runs.append(r)
            print(f"  {r['seconds']:.1f} s for {r['batches']} batches ({r['rows']} rows)")
    summary = summarize(runs)
    report = {
        "benchmark": "connect",
        "what": (
            "the embedded log into SQLite on a Spark Connect session (PySpark's local Connect "
            "server) against a classic local[2] session, alternating child processes; "
            "Pipeline.run timed after a warm-up, the session's start not counted"
        ),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "records": args.records,
        "batch_records": args.batch_records,
        "summary": summary,
        "runs": runs,
    }
    write_results(args.output, report)
    print(
        f"connect/classic: {summary['connect']['ratio']}x; Connect's extra per batch: "
        f"{summary['connect']['extra_per_batch_ms']} ms -> {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
