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

``--sinks sqlite,delta`` adds the same runs into a Delta Lake table (``DeltaSink``, append;
the session gets Delta's jars, extension and catalog), whose rows are checked from the
table's log and Parquet files with pyarrow: on a classic session the sink commits through
Delta's JVM classes, on Connect through Spark's writer with the log read by sparkonce
(:mod:`sparkonce.spark.delta_log`). Each run records its sink; ``summary`` holds SQLite's
figures under ``classic``/``connect`` and Delta's under ``delta``.

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
SINKS = ("sqlite", "delta")


def make_log(root: Path, records: int, start: int = 1) -> Path:
    """Topic ``events`` with two partitions and values ``start..start+records-1``."""
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, "events", 2, exist_ok=True)
    with topic, IdempotentProducer(topic, "bench-producer") as producer:
        for i in range(start, start + records):
            producer.send(str(i).encode(), f"k{i % 8}".encode())
    return root


def pipeline(log: Path, db: Path, checkpoint: Path, batch_records: int, sink: str) -> Any:
    """``db``: the SQLite file, or the Delta table's directory."""
    from pyspark.sql import functions as F

    from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline, sink_from_url

    return Pipeline(
        name="bench",
        source=EmbeddedLogSource(log, "events", max_records_per_partition=batch_records // 2),
        sink=DeltaSink(db) if sink == "delta" else sink_from_url(f"sqlite:///{db}", "out"),
        checkpoint=checkpoint,
        transform=lambda df: df.select(
            "record_id", F.col("value").cast("string").cast("long").alias("value")
        ),
    )


def session(variant: str, sink: str) -> Any:
    """A classic ``local[2]`` session, or a client of PySpark's local Connect server; with
    Delta's jars, extension and catalog for the Delta sink (the server's, on Connect)."""
    from sparkonce.sinks.delta import delta_spark_conf
    from sparkonce.spark.session import build_session

    conf = delta_spark_conf() if sink == "delta" else {}
    if variant == "classic":
        return build_session(master="local[2]", app_name="bench-classic", conf=conf)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.remote("local[2]").appName("bench-connect")
    for key, value in {
        **conf,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
    }.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def delta_values(table: Path) -> list[int]:
    """The ``value`` column of a Delta table: the Parquet files its JSON commits add and do not
    remove, read with pyarrow (not with Spark or sparkonce)."""
    import pyarrow.parquet as pq

    live: dict[str, None] = {}
    for commit_file in sorted((table / "_delta_log").glob("*.json")):
        for line in commit_file.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return [v for f in live for v in pq.read_table(table / f).column("value").to_pylist()]


def child(
    variant: str, workdir: Path, records: int, batch_records: int, sink: str = "sqlite"
) -> dict[str, Any]:
    """One timed run (after a warm-up) in this process; the sink's rows checked."""
    started = time.perf_counter()
    spark = session(variant, sink)
    session_s = time.perf_counter() - started
    out = workdir / ("out" if sink == "delta" else "out.db")
    try:
        warm = pipeline(
            make_log(workdir / "warm-log", 4 * batch_records),
            workdir / ("warm" if sink == "delta" else "warm.db"),
            workdir / "warm-chk",
            batch_records,
            sink,
        )
        warm.run(spark)
        p = pipeline(make_log(workdir / "log", records), out, workdir / "chk", batch_records, sink)
        started = time.perf_counter()
        report = p.run(spark)
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    if sink == "delta":
        got = delta_values(out)
        count, total = len(got), sum(got)
    else:
        with sqlite3.connect(out) as conn:
            count, total = conn.execute("SELECT COUNT(*), SUM(value) FROM out").fetchone()
    expected = records * (records + 1) // 2
    if (count, total) != (records, expected):
        raise SystemExit(
            f"{variant} ({sink}): the sink holds {count} rows summing to {total}, not "
            f"{records} rows summing to {expected}"
        )
    return {
        "variant": variant,
        "sink": sink,
        "seconds": round(seconds, 3),
        "session_start_s": round(session_s, 3),
        "batches": report.batches_committed,
        "rows": count,
    }


def run_child(variant: str, records: int, batch_records: int, sink: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-connect-{variant}-") as tmp:
        done = subprocess.run(
            [
                sys.executable,
                __file__,
                "--child",
                variant,
                "--sink",
                sink,
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
        raise SystemExit(f"the {variant} run ({sink}) failed:\n{done.stderr[-3000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or None


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant: its median run; Connect's also against classic (its ratio, and its extra
    milliseconds per batch). SQLite's at the top level, each other sink's under its name."""
    out = _summarize([r for r in runs if r.get("sink", "sqlite") == "sqlite"])
    for sink in SINKS[1:]:
        mine = [r for r in runs if r.get("sink") == sink]
        if mine:
            out[sink] = _summarize(mine)
    return out


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if not runs:
        return out
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
    ap.add_argument(
        "--sinks",
        default="sqlite",
        help="comma-separated: sqlite, delta (default: sqlite)",
    )
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--sink", choices=SINKS, default="sqlite", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch_records < 2 or args.records < args.batch_records:
        ap.error("--batch-records must be at least 2 and at most --records")
    sinks = [s.strip() for s in args.sinks.split(",") if s.strip()]
    if not sinks or any(s not in SINKS for s in sinks):
        ap.error(f"--sinks takes a comma-separated list of {', '.join(SINKS)}")
    if args.child:
        result = child(args.child, args.workdir, args.records, args.batch_records, args.sink)
        print(json.dumps(result))
        return 0
    runs: list[dict[str, Any]] = []
    for i in range(args.repeat):
        for sink in sinks:
            for variant in VARIANTS if i % 2 == 0 else reversed(VARIANTS):
                print(f"run {i + 1}/{args.repeat}: {variant} into {sink} ...", flush=True)
                r = run_child(variant, args.records, args.batch_records, sink)
                runs.append(r)
                print(f"  {r['seconds']:.1f} s for {r['batches']} batches ({r['rows']} rows)")
    summary = summarize(runs)
    report = {
        "benchmark": "connect",
        "what": (
            f"the embedded log into {' and '.join(sinks)} (DeltaSink: append) on a Spark "
            "Connect session (PySpark's local Connect server) against a classic local[2] "
            "session, alternating child processes; Pipeline.run timed after a warm-up, the "
            "session's start not counted"
        ),
        "sinks": sinks,
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "records": args.records,
        "batch_records": args.batch_records,
        "summary": summary,
        "runs": runs,
    }
    write_results(args.output, report)
    for sink in sinks:
        mine = summary if sink == "sqlite" else summary[sink]
        print(
            f"{sink}: connect/classic {mine['connect']['ratio']}x; Connect's extra per batch: "
            f"{mine['connect']['extra_per_batch_ms']} ms"
        )
    print(f"-> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
