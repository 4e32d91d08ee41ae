"""Delta to Delta: sparkonce's ``DeltaSource`` into ``DeltaSink`` against Delta's own
``foreachBatch`` + ``txnAppId`` pattern, side by side in one session.

Run from the repository root (``make bench-delta-to-delta`` does)::

    .venv/bin/python benchmarks/delta_to_delta.py --versions 10 --rows 100000

The pattern Databricks documents for idempotent writes from ``foreachBatch`` is
``df.write.option("txnAppId", APP).option("txnVersion", batch_id)``: Delta records the
highest ``txnVersion`` per app id in the table's log and skips a write whose version is not
above it. That makes a replayed batch idempotent while the checkpoint lives; its batch ids
restart at 0 when the checkpoint is lost, which sparkonce's ledger is there to survive.
Two measurements, on bronze tables of ``--versions`` appends (one data file each, as
``examples/delta_to_delta.py`` makes them):

a) **Throughput.** Each variant reads the whole bronze table, one file per batch
   (``max_files_per_batch=1`` / ``maxFilesPerTrigger=1``: ``--versions`` batches), with the
   same transform, into a fresh target and checkpoint, in ``--repeat`` rounds alternating
   which goes first, after an untimed warm-up of each. Records/s is the bronze's rows over
   the run's wall time; per-batch p50 is the runner's time per batch for sparkonce and the
   ``foreachBatch`` function's time for the pattern.
b) **A checkpoint reset.** On a small bronze of ``--reset-versions`` appends: run each
   variant to the end, delete its checkpoint and run again on a new one with the bronze
   unchanged, then append ``--new-versions`` versions, delete the checkpoint again and run.
   The pattern runs twice: with the same app id after each reset, and with a new one.
   After each step the target's rows are counted from its Delta log (the add and remove
   actions, then each live data file's row count and ``event_id`` column with pyarrow: not
   through sparkonce or Spark) against the bronze's rows, counted the same way. This runs
   once per batch size in ``--reset-files-per-batch`` (``default``: Delta's 1000 files per
   batch, so a new checkpoint's first batch is the whole snapshot), since which of the
   pattern's batches are skipped after a reset depends on how the new query cuts the table
   into batches.

Writes ``benchmarks/results/delta-to-delta.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct, pool_runs, write_results  # noqa: E402
from benchmarks.generic_source import _commit  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "delta-to-delta.json"
SPARKONCE = "sparkonce DeltaSource -> DeltaSink"
TXN = "foreachBatch + txnAppId/txnVersion"
VARIANTS = (SPARKONCE, TXN)


def append_versions(spark: Any, bronze: Path, first_version: int, versions: int, rows: int) -> None:
    """Append ``versions`` versions of ``rows`` rows each, one data file per version, with
    event ids following on from the versions before (as examples/delta_to_delta.py)."""
    from pyspark.sql import functions as F

    for v in range(first_version, first_version + versions):
        first = v * rows + 1
        spark.range(first, first + rows, numPartitions=1).select(
            F.col("id").alias("event_id"),
            F.concat(F.lit("k"), (F.col("id") % 7).cast("string")).alias("key"),
            F.col("id").alias("amount"),
        ).write.format("delta").mode("append").save(str(bronze))


def silver(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select("event_id", "key", (F.col("amount") * 100).alias("amount_cents"))


# -- counting a Delta table without Spark or sparkonce ----------------------------------------


def live_files(table: Path) -> list[Path]:
    """The table's data files at its latest version: every ``add`` not later ``remove``d,
    replayed from the JSON commits in ``_delta_log`` (the bench's tables never checkpoint
    the log far enough to matter: a checkpoint's parquet is read too when there is one)."""
    from urllib.parse import unquote

    import pyarrow.parquet as pq

    log = table / "_delta_log"
    live: dict[str, bool] = {}
    start = -1
    checkpoints = sorted(log.glob("*.checkpoint.parquet"))
    if checkpoints:
        last = checkpoints[-1]
        start = int(last.name.split(".")[0])
        for row in pq.read_table(last, columns=["add"]).column("add").to_pylist():
            if row:
                live[row["path"]] = True
    for commit in sorted(log.glob("*.json")):
        if int(commit.stem) <= start:
            continue
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = True
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return [table / unquote(p) for p in live]


def count_rows(table: Path) -> dict[str, int]:
    """Rows and distinct ``event_id`` values of a Delta table, with pyarrow."""
    import pyarrow.parquet as pq

    if not (table / "_delta_log").exists():
        return {"rows": 0, "distinct_event_ids": 0}
    ids: set[int] = set()
    rows = 0
    for path in live_files(table):
        column = pq.read_table(path, columns=["event_id"]).column("event_id").to_pylist()
        rows += len(column)
        ids.update(column)
    return {"rows": rows, "distinct_event_ids": len(ids)}


# -- the two variants -------------------------------------------------------------------------


def run_sparkonce(
    spark: Any, bronze: Path, target: Path, checkpoint: Path, files: int | None, name: str
) -> dict[str, Any]:
    from sparkonce import DeltaSink, DeltaSource, Pipeline

    pipeline = Pipeline(
        name=name,
        source=DeltaSource(bronze, max_files_per_batch=files),
        transform=silver,
        sink=DeltaSink(target),
        checkpoint=checkpoint,
    )
    latencies: list[float] = []
    started = time.perf_counter()
    report = pipeline.run(spark, on_batch=lambda b: latencies.append(b.seconds))
    return {
        "seconds": time.perf_counter() - started,
        "latencies": latencies,
        "resumed_from": report.resumed_from,
        "batches_committed": report.batches_committed,
    }


def run_txn(
    spark: Any, bronze: Path, target: Path, checkpoint: Path, files: int | None, app_id: str
) -> dict[str, Any]:
    """What a Delta user writes: ``foreachBatch`` appending each batch with Delta's
    idempotent-write options, the query's ``batch_id`` as the version."""
    latencies: list[float] = []
    batch_ids: list[int] = []

    def write(batch: Any, batch_id: int) -> None:
        t0 = time.perf_counter()
        (
            batch.write.format("delta")
            .option("txnAppId", app_id)
            .option("txnVersion", batch_id)
            .mode("append")
            .save(str(target))
        )
        latencies.append(time.perf_counter() - t0)
        batch_ids.append(batch_id)

    reader = spark.readStream.format("delta")
    if files:
        reader = reader.option("maxFilesPerTrigger", str(files))
    started = time.perf_counter()
    query = (
        silver(reader.load(str(bronze)))
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return {
        "seconds": time.perf_counter() - started,
        "latencies": latencies,
        "batch_ids": batch_ids,
    }


# -- (a) throughput ---------------------------------------------------------------------------


def throughput(spark: Any, args: Any, work: Path, console: Any) -> dict[str, Any]:
    bronze = work / "bronze"
    append_versions(spark, bronze, 0, args.versions, args.rows)
    expect = count_rows(bronze)
    console.print(f"bronze: {args.versions} versions, {expect['rows']:,} rows")

    def once(name: str, tag: str) -> dict[str, Any]:
        target, checkpoint = work / f"{tag}-target", work / f"{tag}-checkpoint"
        if name == SPARKONCE:
            run = run_sparkonce(spark, bronze, target, checkpoint, 1, f"bench-d2d-{tag}")
        else:
            run = run_txn(spark, bronze, target, checkpoint, 1, f"bench-d2d-{tag}")
        got = count_rows(target)
        if got != {"rows": expect["rows"], "distinct_event_ids": expect["rows"]}:
            raise RuntimeError(f"{name} ({tag}): target holds {got}, bronze {expect}")
        shutil.rmtree(target)
        shutil.rmtree(checkpoint)
        lat = run["latencies"]
        return {
            "records": expect["rows"],
            "seconds": run["seconds"],
            "records_per_s": expect["rows"] / run["seconds"],
            "batches": len(lat),
            "batch_p50_s": pct(lat, 50),
            "batch_p99_s": pct(lat, 99),
            "load_1min": os.getloadavg()[0],
        }

    warmup = {n: once(n, f"warm-{i}")["seconds"] for i, n in enumerate(VARIANTS)}
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in VARIANTS}
    for r in range(args.repeat):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        for name in order:
            one = once(name, f"r{r}-{VARIANTS.index(name)}")
            one["round"], one["first"] = r, name == order[0]
            runs[name].append(one)
            console.print(
                f"round {r} {name}: {one['records_per_s']:,.0f} records/s, {one['batches']} "
                f"batches, p50 {one['batch_p50_s']:.2f} s, load {one['load_1min']:.1f}"
            )
    results = {n: pool_runs(rs) for n, rs in runs.items()}
    for n, rs in runs.items():
        results[n]["warmup_s"] = warmup[n]
        results[n]["batch_p50_s"] = pct([x["batch_p50_s"] for x in rs], 50)
        results[n]["load_1min_runs"] = [x["load_1min"] for x in rs]
    ratio = results[SPARKONCE]["records_per_s"] / results[TXN]["records_per_s"]
    results[SPARKONCE]["ratio"], results[TXN]["ratio"] = ratio, 1.0
    per_round = [
        s["records_per_s"] / t["records_per_s"]
        for s, t in zip(runs[SPARKONCE], runs[TXN], strict=True)
    ]
    console.print(
        f"sparkonce/txnAppId records/s: {ratio:.3f} pooled, rounds "
        + ", ".join(f"{x:.3f}" for x in per_round)
    )
    shutil.rmtree(bronze)
    return {
        "versions": args.versions,
        "rows_per_version": args.rows,
        "files_per_batch": 1,
        "results": results,
        "ratio_sparkonce_over_txnappid": ratio,
        "ratio_per_round": per_round,
    }


# -- (b) a checkpoint reset -------------------------------------------------------------------

RESET_VARIANTS = ("sparkonce", "txnAppId, same app id", "txnAppId, new app id per reset")


def reset(spark: Any, args: Any, work: Path, files: int | None, console: Any) -> list[dict]:
    """Each variant: run to the end, reset the checkpoint (bronze unchanged), run; append
    versions, reset again, run. Rows counted after every step."""
    label = "default (1000)" if files is None else str(files)
    bronze = work / f"reset-bronze-{label.split()[0]}"
    append_versions(spark, bronze, 0, args.reset_versions, args.reset_rows)
    steps = ("first run", "after a reset, bronze unchanged", "after a reset and new appends")
    rows: list[dict[str, Any]] = []
    resets = {v: 0 for v in RESET_VARIANTS}

    def run(variant: str, step: int) -> dict[str, Any]:
        slug = f"{RESET_VARIANTS.index(variant)}-{label.split()[0]}"
        target, checkpoint = work / f"reset-{slug}-target", work / f"reset-{slug}-checkpoint"
        if step > 0:  # the checkpoint is lost
            shutil.rmtree(checkpoint)
            resets[variant] += 1
        try:
            if variant == "sparkonce":
                out = run_sparkonce(spark, bronze, target, checkpoint, files, f"bench-reset-{slug}")
                detail = f"resumed from {out['resumed_from']}, {out['batches_committed']} committed"
            else:
                app = "bench-app"
                if variant.endswith("per reset"):
                    app += f"-{resets[variant]}"
                out = run_txn(spark, bronze, target, checkpoint, files, app)
                detail = f"app id {app}, batch ids {out['batch_ids']}"
        except Exception as exc:  # a refusal is a result too: its rows are still counted
            detail = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return {"detail": detail, **count_rows(target)}

    for step, what in enumerate(steps):
        if step == 2:
            append_versions(spark, bronze, args.reset_versions, args.new_versions, args.reset_rows)
        expect = count_rows(bronze)
        for variant in RESET_VARIANTS:
            got = run(variant, step)
            row = {
                "kind": f"{variant}: {what} (files per batch {label})",
                "bronze_rows": expect["rows"],
                "target_rows": got["rows"],
                "distinct_event_ids": got["distinct_event_ids"],
                "lost_rows": expect["rows"] - got["distinct_event_ids"],
                "duplicated_rows": got["rows"] - got["distinct_event_ids"],
                "exact": got["rows"] == got["distinct_event_ids"] == expect["rows"],
                "detail": got["detail"],
            }
            rows.append(row)
            console.print(
                f"{row['kind']}: bronze {row['bronze_rows']:,}, target {row['target_rows']:,} "
                f"(lost {row['lost_rows']:,}, duplicated {row['duplicated_rows']:,}); "
                f"{row['detail']}"
            )
    return rows


def _summary(a: dict[str, Any] | None) -> list[dict[str, Any]]:
    """(a)'s pooled result per variant, as rows of the summary table."""
    keep = ("records_per_s", "ratio", "batches", "batch_p50_s", "batch_p99_s")
    if a is None:
        return []
    return [
        {"kind": f"throughput: {name}", **{k: r.get(k) for k in keep}}
        for name, r in a["results"].items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--versions", type=int, default=10, help="bronze appends for (a)")
    parser.add_argument("--rows", type=int, default=100_000, help="rows per append for (a)")
    parser.add_argument("--repeat", type=int, default=2, help="timed rounds (alternating)")
    parser.add_argument("--reset-versions", type=int, default=4)
    parser.add_argument("--new-versions", type=int, default=2)
    parser.add_argument("--reset-rows", type=int, default=1000)
    parser.add_argument(
        "--reset-files-per-batch",
        default="default,1",
        help="comma-separated batch sizes for (b): a number of files, or 'default'",
    )
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = parser.parse_args(argv)

    import pyspark
    from rich.console import Console

    from sparkonce.spark.delta_conf import delta_spark_conf
    from sparkonce.spark.session import build_session

    console = Console(width=150)
    spark = build_session(app_name="sparkonce-bench-delta-to-delta", conf=delta_spark_conf())
    work = Path(tempfile.mkdtemp(prefix="sparkonce-bench-d2d-"))
    try:
        a = None if args.skip_throughput else throughput(spark, args, work, console)
        b: list[dict[str, Any]] = []
        for size in args.reset_files_per_batch.split(","):
            b += reset(spark, args, work, None if size == "default" else int(size), console)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)

    report: dict[str, Any] = {
        "benchmark": "delta-to-delta",
        "throughput": a,
        "ratio_sparkonce_over_txnappid": a and a["ratio_sparkonce_over_txnappid"],
        "reset": {
            "versions": args.reset_versions,
            "new_versions": args.new_versions,
            "rows_per_version": args.reset_rows,
        },
        # The docs' generated table shows this list: (a)'s variants, then (b)'s steps.
        "summary": _summary(a) + b,
        "sparkonce_exact_after_every_reset": all(
            r["exact"] for r in b if r["kind"].startswith("sparkonce")
        ),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "environment": {"pyspark": pyspark.__version__, "commit": _commit()},
    }
    write_results(args.output, report)
    console.print(f"wrote {args.output}")
    return 0 if report["sparkonce_exact_after_every_reset"] else 1


if __name__ == "__main__":
    sys.exit(main())
