"""What a checkpoint on S3 costs per batch, on a Spark standalone cluster.

    .venv/bin/python benchmarks/cluster_checkpoint.py [--repeat 2] [--batches 12]

Starts a moto S3 server and a cluster (a master and two workers on 127.0.0.1, the
executors running the packed environment; ``tests/services/spark_cluster.py``), then runs
the same pipeline as drivers on the cluster with its checkpoint on the local disk and in
the bucket (``s3a://``), interleaved, ``--repeat`` times each:

* ``stateless``: embedded log -> SQLite, append; the driver writes Spark's offset and
  commit logs, and sparkonce reads the offset log once per batch;
* ``stateful``: per-key sums -> SQLite, upsert; the executors write the state store's
  files to the checkpoint too.

Each batch's times come from Spark's own progress (``durationMs``: ``walCommit`` is the
offset-log write, ``commitOffsets`` the commit-log write, ``triggerExecution`` the whole
batch) and from sparkonce's commit (``BatchReport.seconds``: the checkpoint reads, the
ledger and the sink's transaction). The ledger is in SQLite on the driver's disk in both
runs, so the difference is the checkpoint's. Reported: medians per batch (the first batch,
which pays the query's start, left out) and the S3 run's extra milliseconds per batch.
Results: ``benchmarks/results/cluster-checkpoint.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
BUCKET = "bench"
PARTITIONS = 3
PER_PARTITION = 100  # records per partition and batch
PY = sys.executable
PHASES = ("triggerExecution", "walCommit", "commitOffsets", "addBatch", "latestOffset")


def child(args: argparse.Namespace) -> None:
    """One driver on the cluster: run the pipeline, print its batches as JSON."""
    from pyspark.sql import functions as F
    from pyspark.sql.streaming import StreamingQueryListener

    from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
    from sparkonce.pipeline import build_session

    stateful = args.kind == "stateful"

    def transform(df: Any) -> Any:
        v = df.select(
            F.col("key").cast("string").alias("key"),
            F.col("value").cast("string").cast("long").alias("value"),
        )
        if not stateful:
            return v
        return v.groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))

    sink = (
        SQLiteSink(f"sqlite:///{args.db}", "sums", mode="upsert", keys=["key"])
        if stateful
        else SQLiteSink(f"sqlite:///{args.db}", "rows")
    )
    pipeline = Pipeline(
        name=f"bench-{args.kind}",
        source=EmbeddedLogSource(args.log, "events", max_records_per_partition=PER_PARTITION),
        transform=transform,
        sink=sink,
        checkpoint=args.checkpoint,
        output_mode="update" if stateful else "append",
    )
    spark = build_session(
        master=args.master,
        app_name=f"bench-{args.kind}",
        quick_start=True,
        conf=pipeline.spark_conf(),
    )
    progress: dict[int, dict[str, float]] = {}

    class Listener(StreamingQueryListener):
        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            p = event.progress
            if p.numInputRows:
                progress[p.batchId] = {k: float(v) for k, v in p.durationMs.items()}

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

    spark.streams.addListener(Listener())
    report = pipeline.run(spark)
    time.sleep(1.0)  # the listener bus delivers the last progress event asynchronously
    batches = [
        {
            "batch": b.spark_batch_id,
            "commit_ms": b.seconds * 1000,
            **progress.get(b.spark_batch_id, {}),
        }
        for b in report.batches
    ]
    print("RESULT " + json.dumps({"rows": report.rows_committed, "batches": batches}), flush=True)
    spark.stop()


def make_log(work: Path, batches: int) -> Path:
    from sparkonce.log import IdempotentProducer, Topic

    log = work / "log"
    topic = Topic.create(log, "events", PARTITIONS)
    producer = IdempotentProducer(topic, "bench")
    for i in range(batches * PARTITIONS * PER_PARTITION):
        producer.send(str(i).encode(), f"k{i % 6}".encode(), partition=i % PARTITIONS)
    producer.close()
    topic.close()
    return log


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per (kind, checkpoint) over every batch but each run's first."""
    out: dict[str, Any] = {}
    for kind in ("stateless", "stateful"):
        for where in ("local", "s3a"):
            batches = [
                b
                for r in runs
                if r["kind"] == kind and r["where"] == where
                for b in r["batches"][1:]
            ]
            if not batches:
                continue
            med = {
                key: statistics.median(b[key] for b in batches if key in b)
                for key in ("commit_ms", *PHASES)
                if any(key in b for b in batches)
            }
            out[f"{kind}/{where}"] = {"batches": len(batches), "median_ms": med}
        local, s3 = out.get(f"{kind}/local"), out.get(f"{kind}/s3a")
        if local and s3:
            out[f"{kind}/s3a extra"] = {
                key: s3["median_ms"][key] - local["median_ms"][key]
                for key in s3["median_ms"]
                if key in local["median_ms"]
            }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2, help="runs of each pair, interleaved")
    ap.add_argument("--batches", type=int, default=12, help="batches per run")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    for hidden in ("--kind", "--checkpoint", "--log", "--db", "--master"):
        ap.add_argument(hidden, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    if args.repeat < 1 or args.batches < 2:
        raise SystemExit("--repeat must be 1 or more and --batches 2 or more")
    sys.path.insert(0, str(REPO))
    from rich.console import Console
    from tests.services.spark_cluster import cluster_with_s3

    console = Console()
    work = Path(tempfile.mkdtemp(prefix="sparkonce-cluster-bench-"))
    log = make_log(work, args.batches)
    runs: list[dict[str, Any]] = []
    with cluster_with_s3(work, buckets=[BUCKET]) as cl:
        for rep in range(args.repeat):
            for kind in ("stateless", "stateful"):
                for where in ("local", "s3a"):
                    name = f"{kind}-{where}-{rep}"
                    checkpoint = (
                        str(work / "checkpoints" / name)
                        if where == "local"
                        else f"s3a://{BUCKET}/{name}"
                    )
                    console.print(f"[bold]{kind}[/], checkpoint {checkpoint} ...")
                    cmd = [
                        PY, __file__, "--child", "--kind", kind, "--checkpoint", checkpoint,
                        "--log", str(log), "--db", str(work / f"{name}.db"),
                        "--master", cl.cluster.master_url,
                    ]  # fmt: skip
                    started = time.monotonic()
                    proc = subprocess.run(
                        cmd, cwd=cl.driver_dir, env=cl.env, capture_output=True, text=True,
                        check=False, timeout=900,
                    )  # fmt: skip
                    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                    if proc.returncode != 0 or not line:
                        console.print(proc.stdout[-3000:], proc.stderr[-3000:])
                        raise SystemExit(f"{name} failed (exit {proc.returncode})")
                    result = json.loads(line[-1][len("RESULT ") :])
                    runs.append({"kind": kind, "where": where, "rep": rep, **result})
                    console.print(
                        f"  {len(result['batches'])} batches, {result['rows']} rows, "
                        f"{time.monotonic() - started:.0f} s"
                    )
    summary = summarize(runs)
    report = {
        "benchmark": "cluster-checkpoint",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {platform.machine()}, standalone cluster: 2 "
        "workers x 1 core on 127.0.0.1, moto S3 on 127.0.0.1",
        "load_average_end": os.getloadavg(),
        "batches_per_run": args.batches,
        "repeat": args.repeat,
        "summary": summary,
        "runs": runs,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    from benchmarks._common import write_results  # the repository root is on the path (above)

    write_results(RESULTS / "cluster-checkpoint.json", report)
    for key, value in summary.items():
        console.print(key, json.dumps(value.get("median_ms", value)))
    console.print("wrote benchmarks/results/cluster-checkpoint.json")


if __name__ == "__main__":
    main()
