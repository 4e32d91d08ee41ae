"""IcebergSink's two routes side by side on the same batches: rows written by Spark's
tasks as Parquet and added by PyIceberg (``executor``, the sink's route), against the
batch collected to the driver as Arrow and appended by PyIceberg (``driver``, the first
slice's route, kept for the simulation).

Run from the repository root::

    .venv/bin/python benchmarks/iceberg.py --records 400000 --batch-records 40000 --rounds 2

One embedded log (``--records`` records over 4 partitions, cached in ``.cache/bench``) is
read in micro-batches of ``--batch-records`` by one ``local[2]`` session; each round runs
both routes, in alternating order, each into a fresh SQL catalog (SQLite) and table, and
both from Spark batch 0. Reported per route: records/s over the run, and the per-batch
time p50/p99 (``BatchReport.seconds``: the batch function, Spark's read included since
Spark evaluates the batch lazily inside it) and the commit's own p50 (the ledger entry's
``commit_seconds``: from the look at the ledger to the catalog commit), and the
committer's split of a batch (look, stage, commit, after: its p50 each). Prints JSON;
``--out FILE`` also writes it.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct  # noqa: E402

ROUTES = ("executor", "driver")


def transform(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(
        F.col("record_id"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
        F.col("timestamp"),
    )


def sink_for(route: str, work: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    from sparkonce.sinks.iceberg import IcebergSink, IcebergStager

    catalog = SqlCatalog("c", uri=f"sqlite:///{work}/cat.db", warehouse=f"file://{work}/wh")
    sink = IcebergSink(catalog, "bench.out")
    if route == "driver":

        class DriverStager(IcebergStager):
            """The first slice's route: the batch collected on the driver as Arrow."""

            def prepare(self, ctx: Any, df: Any, seq: int) -> Any:
                return self.prepare_arrow(ctx, df.toArrow(), df.schema, seq)

        sink.stager = DriverStager(sink.store, sink.stager.grace_seconds)
    return sink


def run_route(spark: Any, route: str, log_dir: Path, per_partition: int, work: Path) -> dict:
    from sparkonce import EmbeddedLogSource, Pipeline

    sink = sink_for(route, work)
    p = Pipeline(
        name="bench",
        source=EmbeddedLogSource(log_dir, "events", max_records_per_partition=per_partition),
        sink=sink,
        checkpoint=work / "chk",
        transform=transform,
    )
    seconds: list[float] = []
    spans: dict[str, list[float]] = {}

    def on_batch(b: Any) -> None:
        seconds.append(b.seconds)
        for k, v in b.result.timings.items():
            spans.setdefault(k, []).append(v)

    started = time.perf_counter()
    report = p.run(spark, on_batch=on_batch)
    wall = time.perf_counter() - started
    commits = [e.commit_seconds for e in sink.ledger("bench") if e.commit_seconds is not None]
    return {
        "route": route,
        "records": report.rows_committed,
        "batches": report.batches_committed,
        "records_per_s": round(report.rows_committed / wall),
        "batch_p50_s": pct(seconds, 50),
        "batch_p99_s": pct(seconds, 99),
        "commit_p50_s": pct(commits, 50),
        # The committer's split of a batch (CommitResult.timings), p50 of each part.
        "split_p50_s": {k: pct(v, 50) for k, v in spans.items()},
        "snapshots": len(sink.store.load().snapshots()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--batch-records", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from benchmarks.sinks import PARTITIONS, make_log

    from sparkonce.pipeline import build_session

    log_dir = make_log(args.records)
    spark = build_session()
    per_partition = max(1, args.batch_records // PARTITIONS)
    runs: list[dict] = []
    for r in range(args.rounds):
        order = ROUTES if r % 2 == 0 else ROUTES[::-1]
        for route in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-iceberg-{route}-") as work:
                runs.append(
                    {"round": r, **run_route(spark, route, log_dir, per_partition, Path(work))}
                )
                print(json.dumps(runs[-1]), file=sys.stderr)
    result = {
        "machine": machine(),
        "records": args.records,
        "batch_records": args.batch_records,
        "runs": runs,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
