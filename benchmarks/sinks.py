"""Sinks side by side on one input: the COPY limit, baselines, and sparkonce's sinks.

Run from the repository root (``make bench`` does, with 5 million records)::

    .venv/bin/python benchmarks/sinks.py --records 5000000

It writes ``--records`` records (keys ``k0``..``k999``) into an embedded log once (cached in
``.cache/bench``), starts a throwaway PostgreSQL server, and then runs each measurement in a
fresh child process, so peak driver memory is measured per variant. Every variant writes the
same rows: ``record_id, key, value`` (value is the record's integer payload).

1. ``copy-limit``: raw ``COPY`` of the same rows from Python, one connection (rows prepared
   in memory before the clock starts): the physical limit of the store.
2. ``source-read``: the embedded log source through Spark, no sink (``noop`` writer), as one
   batch query; ``stream-read`` is the same as a streaming query with the same micro-batches
   as the sinks below: the most any sink can reach through this source and Spark.
3. ``alo-foreachbatch``: what a Spark user writes today: ``foreachBatch`` appending each batch
   with ``COPY`` from the executors (Arrow to CSV), no ledger: at-least-once.
4. ``driver-commit``: sparkonce's :class:`~sparkonce.PostgresSink` (rows through the driver).
5. ``2pc-append`` and ``2pc-upsert``: sparkonce's :class:`~sparkonce.PostgresTwoPhaseSink`
   (upsert keyed on ``record_id``, so every record is merged at commit).
6. ``parquet``: Spark's built-in exactly-once file sink, for reference.
7. Delta Lake tables (a local directory), each against its at-least-once counterpart:
   ``delta-alo-append`` (``foreachBatch`` appending each batch with ``df.write.format("delta")``,
   no ledger: at-least-once, the baseline), ``delta-native`` (Delta's own
   ``writeStream.format("delta")`` sink), ``deltasink-append`` (sparkonce's
   :class:`~sparkonce.DeltaSink`), ``delta-alo-merge`` (``foreachBatch`` with a ``MERGE`` by
   ``record_id``: at-least-once upsert, the baseline of) ``deltasink-upsert``.

Streaming variants read with the same per-partition limit (``--batch-records`` per batch) on
``local[2]``. Reported per variant: records/s (records over the run's wall time, after the
session is up), the ratio to (1) and to (3), the driver's peak resident memory (the Python
driver and the JVM, from ``VmHWM``), and per-batch commit latency p50/p99 (the sink's time per
batch, reading included, because Spark evaluates the batch lazily inside it). A ``copy-format``
line compares psycopg's row-by-row ``write_row`` with Arrow-to-CSV ``COPY`` on one batch.

Writes ``benchmarks/results/sinks.json`` and ``benchmarks/results/sinks.png`` (``--out NAME``:
``NAME.json`` and ``NAME.png``, for a run of some variants only).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct, peak_rss_mb, pool_runs, write_results  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
CACHE = REPO / ".cache" / "bench"
PARTITIONS = 4
KEYS = 1000
VARIANTS = (
    "copy-limit",
    "source-read",
    "stream-read",
    "alo-foreachbatch",
    "driver-commit",
    "2pc-append",
    "2pc-upsert",
    "parquet",
    "delta-alo-append",
    "delta-native",
    "deltasink-append",
    "delta-alo-merge",
    "deltasink-upsert",
)
# Each variant's at-least-once counterpart (the ratio the README reports); the rest: ALO COPY.
COUNTERPART = {
    "delta-native": "delta-alo-append",
    "deltasink-append": "delta-alo-append",
    "deltasink-upsert": "delta-alo-merge",
}


# -- input ------------------------------------------------------------------------------------


def make_log(records: int) -> Path:
    """The benchmark's input, produced once per record count (a marker file says it is whole)."""
    from rich.progress import Progress

    from sparkonce.log import IdempotentProducer, Topic

    root = CACHE / f"log-{records}"
    if (root / "COMPLETE").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    topic = Topic.create(root, "events", PARTITIONS)
    step = 50_000
    with (
        Progress(transient=True) as progress,
        topic,
        IdempotentProducer(topic, "bench", batch_size=step) as producer,
    ):
        task = progress.add_task(f"writing {records:,} records to the embedded log", total=records)
        for lo in range(0, records, step):
            hi = min(records, lo + step)
            producer.send_many((f"k{i % KEYS}".encode(), str(i).encode()) for i in range(lo, hi))
            progress.update(task, completed=hi)
    (root / "COMPLETE").write_text(str(records))
    return root


def transform(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(
        F.col("record_id"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


# -- one variant, in a child process ------------------------------------------------------------


def run_variant(name: str, log_dir: Path, url: str, batch_records: int, work: Path) -> dict:
    if name == "copy-limit":
        return copy_limit(log_dir, url)
    from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline, PostgresSink, PostgresTwoPhaseSink
    from sparkonce.pipeline import build_session
    from sparkonce.sinks.delta import delta_spark_conf

    spark = build_session(conf=delta_spark_conf() if name.startswith("delta") else None)
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    per_partition = max(1, batch_records // PARTITIONS)
    source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=per_partition)
    latencies: list[float] = []
    records = 0
    started = time.perf_counter()
    if name == "source-read":
        df = transform(source.read_all(spark))
        df.write.format("noop").mode("overwrite").save()
        records = _log_records(log_dir)
    elif name in (
        "driver-commit",
        "2pc-append",
        "2pc-upsert",
        "deltasink-append",
        "deltasink-upsert",
    ):
        sink: Any
        if name == "deltasink-append":
            sink = DeltaSink(work / "delta", table="out_sink")
        elif name == "deltasink-upsert":
            sink = DeltaSink(
                work / "delta", table="out_sink_upsert", mode="upsert", keys=["record_id"]
            )
        elif name == "driver-commit":
            sink = PostgresSink(url, "out_driver")
        elif name == "2pc-append":
            sink = PostgresTwoPhaseSink(url, "out_2pc")
        else:
            sink = PostgresTwoPhaseSink(url, "out_2pc_upsert", mode="upsert", keys=["record_id"])
        p = Pipeline(
            name=f"bench-{name}",
            source=source,
            sink=sink,
            checkpoint=work / f"{name}-checkpoint",
            transform=transform,
        )
        report = p.run(spark, on_batch=lambda b: latencies.append(b.seconds))
        records = report.rows_committed
    elif name == "alo-foreachbatch":
        from sparkonce.config import StoreURL
        from sparkonce.db import connect

        with connect(StoreURL.parse(url)) as conn:
            conn.execute("CREATE TABLE out_alo (record_id text, key text, value bigint)")
        counts: list[int] = []

        def write(batch: Any, batch_id: int) -> None:
            t0 = time.perf_counter()
            rows = batch.mapInArrow(lambda it: _copy_task(url, it), "rows BIGINT").collect()
            counts.append(sum(r["rows"] for r in rows))
            latencies.append(time.perf_counter() - t0)

        q = (
            transform(source.stream(spark, None))
            .writeStream.foreachBatch(write)
            .option("checkpointLocation", str(work / "alo-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        records = sum(counts)
    elif name in ("delta-alo-append", "delta-alo-merge"):
        path = str(work / "delta" / name)
        counts = []
        merge = name == "delta-alo-merge"

        def write_delta(batch: Any, batch_id: int) -> None:
            t0 = time.perf_counter()
            if merge and (work / "delta" / name / "_delta_log").exists():
                batch.createOrReplaceTempView("bench_batch")
                metrics = batch.sparkSession.sql(
                    f"MERGE INTO delta.`{path}` AS t USING bench_batch AS s "
                    "ON t.record_id = s.record_id "
                    "WHEN MATCHED THEN UPDATE SET * WHEN NOT MATCHED THEN INSERT *"
                ).collect()
                counts.append(int(metrics[0]["num_affected_rows"]))
            else:
                batch.write.format("delta").mode("append").save(path)
                counts.append(-1)
            latencies.append(time.perf_counter() - t0)

        q = (
            transform(source.stream(spark, None))
            .writeStream.foreachBatch(write_delta)
            .option("checkpointLocation", str(work / f"{name}-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        records = spark.read.format("delta").load(path).count()
    elif name == "delta-native":
        path = str(work / "delta" / name)
        q = (
            transform(source.stream(spark, None))
            .writeStream.format("delta")
            .option("checkpointLocation", str(work / f"{name}-checkpoint"))
            .trigger(availableNow=True)
            .start(path)
        )
        q.awaitTermination()
        latencies = [
            p["durationMs"].get("addBatch", 0) / 1000
            for p in q.recentProgress
            if p["numInputRows"] > 0
        ]
        records = spark.read.format("delta").load(path).count()
    elif name == "stream-read":
        q = (
            transform(source.stream(spark, None))
            .writeStream.format("noop")
            .option("checkpointLocation", str(work / "noop-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
        latencies = [p["durationMs"].get("addBatch", 0) / 1000 for p in progress]
        records = sum(int(p["numInputRows"]) for p in progress)
    elif name == "parquet":
        q = (
            transform(source.stream(spark, None))
            .writeStream.format("parquet")
            .option("path", str(work / "parquet-out"))
            .option("checkpointLocation", str(work / "parquet-checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        latencies = [
            p["durationMs"].get("addBatch", 0) / 1000
            for p in q.recentProgress
            if p["numInputRows"] > 0
        ]
        records = spark.read.parquet(str(work / "parquet-out")).count()
    else:
        raise SystemExit(f"unknown variant {name!r}")
    seconds = time.perf_counter() - started
    result = {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "python_driver_peak_mb": peak_rss_mb(),
        "jvm_driver_peak_mb": peak_rss_mb(jvm_pid),
        "batches": len(latencies),
        "commit_p50_s": pct(latencies, 50),
        "commit_p99_s": pct(latencies, 99),
    }
    if name in ("2pc-append", "driver-commit"):
        result["copy_format"] = copy_format(url) if name == "2pc-append" else None
    spark.stop()
    return result


def _log_records(log_dir: Path) -> int:
    from sparkonce.log import Topic

    with Topic(log_dir, "events") as t:
        return sum(t.end_offsets().values())


def _copy_task(url: str, batches: Any) -> Any:
    """The at-least-once baseline's executor side: COPY each Arrow batch as CSV."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from sparkonce.config import StoreURL
    from sparkonce.db import connect

    n = 0
    with connect(StoreURL.parse(url)) as conn:
        for batch in batches:
            buf = io.BytesIO()
            pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
            with (
                conn.cursor() as cur,
                cur.copy("COPY out_alo (record_id, key, value) FROM STDIN (FORMAT csv)") as cp,
            ):
                cp.write(buf.getbuffer())
            n += batch.num_rows
    yield pa.RecordBatch.from_pylist([{"rows": n}], schema=pa.schema([("rows", pa.int64())]))


def copy_limit(log_dir: Path, url: str) -> dict:
    import psycopg

    from sparkonce.log import Topic

    buf = io.StringIO()
    records = 0
    with Topic(log_dir, "events") as t:
        for p, end in t.end_offsets().items():
            for lo in range(0, end, 200_000):
                cols = t.read_columns(p, lo, min(end, lo + 200_000))
                for rid, key, value in zip(
                    cols["record_id"], cols["key"], cols["value"], strict=True
                ):
                    buf.write(f"{rid}\t{key.decode()}\t{value.decode()}\n")  # type: ignore[union-attr]
                    records += 1
    data = buf.getvalue().encode()
    del buf
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE out_copy (record_id text, key text, value bigint)")
        started = time.perf_counter()
        with conn.transaction(), conn.cursor() as cur, cur.copy("COPY out_copy FROM STDIN") as cp:
            view = memoryview(data)
            for i in range(0, len(view), 1 << 20):
                cp.write(view[i : i + (1 << 20)])
        seconds = time.perf_counter() - started
    return {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "python_driver_peak_mb": peak_rss_mb(),
        "jvm_driver_peak_mb": None,
        "batches": 1,
        "commit_p50_s": None,
        "commit_p99_s": None,
    }


def copy_format(url: str, rows: int = 500_000) -> dict:
    """Python serialization and COPY format, on one Arrow batch: write_row vs Arrow CSV."""
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv

    batch = pa.RecordBatch.from_pydict(
        {
            "record_id": [f"events/0/{i}" for i in range(rows)],
            "key": [f"k{i % KEYS}" for i in range(rows)],
            "value": list(range(rows)),
        }
    )
    out = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE fmt (record_id text, key text, value bigint)")
        t0 = time.perf_counter()
        with conn.cursor() as cur, cur.copy("COPY fmt FROM STDIN") as cp:
            for r in zip(*(c.to_pylist() for c in batch.columns), strict=True):
                cp.write_row(r)
        out["write_row_rows_per_s"] = rows / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        buf = io.BytesIO()
        pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
        with conn.cursor() as cur, cur.copy("COPY fmt FROM STDIN (FORMAT csv)") as cp:
            cp.write(buf.getbuffer())
        out["arrow_csv_rows_per_s"] = rows / (time.perf_counter() - t0)
        conn.execute("DROP TABLE fmt")
    return out


# -- the parent: run everything, report ----------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument("--batch-records", type=int, default=500_000, help="records per micro-batch")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--out",
        default="sinks",
        help="results name: benchmarks/results/NAME.json and NAME.png (default sinks)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the variants this many times, interleaved (A B A B ...), and report each "
        "one's median run (default 1); on a noisy machine, ratios of medians are steadier",
    )
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        result = run_variant(
            args.variant, make_log(args.records), args.url, args.batch_records, Path(args.work)
        )
        print("RESULT " + json.dumps(result), flush=True)
        return

    from rich.console import Console
    from rich.table import Table

    console = Console()
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: give 1 or more")
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    make_log(args.records)  # once, before the children race to create it
    from tests.services import postgres

    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the finally below stops the
    # throwaway server and subprocess.run kills the running variant.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    pg_dir = Path(tempfile.mkdtemp(prefix="sparkonce-bench-pg-"))
    server = postgres.start(pg_dir)
    work = Path(tempfile.mkdtemp(prefix="sparkonce-bench-"))
    runs: dict[str, list[dict]] = {name: [] for name in wanted}
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    try:
        for rep, name in [(r, n) for r in range(args.repeat) for n in wanted]:
            round_ = f", run {rep + 1} of {args.repeat}" if args.repeat > 1 else ""
            console.print(f"[bold]{name}[/]: running ({args.records:,} records{round_})...")
            suffix = f"_{rep}" if rep else ""
            db_url = server.create_database(f"bench_{name.replace('-', '_')}{suffix}")
            where = work / f"run{rep}"  # each run's own tables and checkpoints
            where.mkdir(exist_ok=True)
            proc = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--variant",
                    name,
                    "--records",
                    str(args.records),
                    "--batch-records",
                    str(args.batch_records),
                    "--url",
                    db_url,
                    "--work",
                    str(where),
                ],
                env=env,
                capture_output=True,
                text=True,
                check=False,
            )
            line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not line:
                console.print(proc.stdout[-3000:], proc.stderr[-3000:])
                raise SystemExit(f"variant {name} failed (exit {proc.returncode})")
            r = json.loads(line[-1][len("RESULT ") :])
            runs[name].append(r)
            console.print(
                f"  {r['records']:,} records in {r['seconds']:.1f} s: "
                f"{r['records_per_s']:,.0f} records/s"
            )
    finally:
        postgres.stop(pg_dir)
        shutil.rmtree(pg_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    results = {name: pool_runs(rs) for name, rs in runs.items() if rs}
    report = summarize(results, args)
    table = Table(title=f"sinks, {args.records:,} records, {report['machine']}")
    for col in ("variant", "records/s", "vs COPY", "vs ALO", "driver peak MB", "p50 s", "p99 s"):
        table.add_column(col, justify="right" if col != "variant" else "left")
    for name, r in report["results"].items():
        table.add_row(
            name,
            f"{r['records_per_s']:,.0f}",
            _fmt(r.get("vs_copy_limit")),
            _fmt(r.get("vs_at_least_once")),
            f"{r['python_driver_peak_mb']:.0f} + {r['jvm_driver_peak_mb'] or 0:.0f}",
            _fmt(r["commit_p50_s"]),
            _fmt(r["commit_p99_s"]),
        )
    console.print(table)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_results(RESULTS / f"{args.out}.json", report)
    chart(report, RESULTS / f"{args.out}.png")
    console.print(f"wrote benchmarks/results/{args.out}.json and benchmarks/results/{args.out}.png")


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def summarize(results: dict[str, dict], args: argparse.Namespace) -> dict:
    copy = results.get("copy-limit", {}).get("records_per_s")
    alo = results.get("alo-foreachbatch", {}).get("records_per_s")
    for name, r in results.items():
        r["vs_copy_limit"] = r["records_per_s"] / copy if copy else None
        if name.startswith("delta"):  # Delta rows: against the Delta at-least-once writes
            counterpart = COUNTERPART.get(name, name)
            base = results.get(counterpart, {}).get("records_per_s")
            r["at_least_once_counterpart"] = counterpart
            r["vs_at_least_once"] = r["records_per_s"] / base if base else None
        else:
            r["vs_at_least_once"] = r["records_per_s"] / alo if alo else None
    return {
        "benchmark": "sinks",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "records": args.records,
        "batch_records": args.batch_records,
        "repeat": args.repeat,
        "keys": KEYS,
        "results": results,
        "median_commit_s": statistics.median(
            [r["commit_p50_s"] for r in results.values() if r["commit_p50_s"] is not None] or [0.0]
        ),
    }


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    rates = [report["results"][n]["records_per_s"] / 1000 for n in names]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = ax.barh(names[::-1], rates[::-1], color="#4c72b0")
    for bar, n in zip(bars, names[::-1], strict=True):
        ratio = report["results"][n].get("vs_at_least_once")
        label = f"{bar.get_width():,.0f}k/s" + (f"  ({ratio:.2f}x ALO)" if ratio else "")
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center")
    ax.set_xlabel("records per second (thousands)")
    ax.set_title(f"{report['records']:,} records, {report['date']}, {report['machine']}")
    ax.set_xlim(0, max(rates) * 1.35)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
