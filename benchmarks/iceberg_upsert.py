"""IcebergSink's upsert against its at-least-once counterpart, side by side in one run:
``foreachBatch`` with PyIceberg's own ``Table.upsert`` per batch (the batch reduced to one row
per key by the same Spark window, collected to the driver as Arrow).

Run from the repository root::

    .venv/bin/python benchmarks/iceberg_upsert.py --records 200000 --batch-records 40000 \\
        --seed-rows 800000 --out benchmarks/results/iceberg-upsert.json

Each variant starts from the same table: ``--seed-rows`` rows of keys ``0..seed-1`` added by
PyIceberg in files of 100k rows, in a fresh SQL catalog (SQLite). Then ``--records`` records
of the embedded log (``benchmarks/sinks.py``'s input, 4 partitions, cached in
``.cache/bench``) are read in micro-batches of ``--batch-records`` by one ``local[2]``
session. The upsert key is ``pmod(xxhash64(value), 1.25 * seed)``: keys spread over the
whole table, so nearly every data file holds a batch key and both variants rewrite nearly
the whole table per batch (copy-on-write: PyIceberg 0.12 writes no delete files). That is
the worst case for both; keys that cluster would rewrite a few files. Each round runs both
variants, in alternating order. Reported per variant: records/s over the run, per-batch
time p50/p99, the commit's p50 (IcebergSink: the ledger entry's ``commit_seconds``), the
table's rows and data files at the end, and ``vs_counterpart`` (records/s over the
at-least-once variant's in the same round). The two tables must end with the same rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct, write_results  # noqa: E402

VARIANTS = ("iceberg-alo-upsert", "icebergsink-upsert")
TABLE = "bench.up"
SEED_FILE_ROWS = 100_000


def keyed(space: int) -> Any:
    def transform(df: Any) -> Any:
        from pyspark.sql import functions as F

        value = F.col("value").cast("string").cast("long")
        return df.select(
            F.pmod(F.xxhash64(value), F.lit(space)).alias("k"),
            value.alias("value"),
            F.col("record_id"),
        )

    return transform


def latest_per_key(df: Any) -> Any:
    """What both variants keep of a batch: per key, the row with the greatest value."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("k").orderBy(F.col("value").desc())
    return df.withColumn("_r", F.row_number().over(w)).where("_r = 1").drop("_r")


def seeded_catalog(work: Path, seed_rows: int) -> Any:
    import pyarrow as pa
    from pyiceberg.catalog.sql import SqlCatalog

    catalog = SqlCatalog("c", uri=f"sqlite:///{work}/cat.db", warehouse=f"file://{work}/wh")
    catalog.create_namespace("bench")
    schema = pa.schema([("k", pa.int64()), ("value", pa.int64()), ("record_id", pa.string())])
    table = catalog.create_table(TABLE, schema=schema)
    for lo in range(0, seed_rows, SEED_FILE_ROWS):
        n = min(SEED_FILE_ROWS, seed_rows - lo)
        ks = pa.array(range(lo, lo + n), pa.int64())
        table.append(
            pa.table({"k": ks, "value": pa.array([-1] * n, pa.int64()), "record_id": ["seed"] * n})
        )
    return catalog


def run_variant(
    spark: Any, variant: str, log_dir: Path, per_partition: int, seed_rows: int, work: Path
) -> tuple[dict, list[tuple[int, int]]]:
    from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline

    catalog = seeded_catalog(work, seed_rows)
    seed_snapshots = len(catalog.load_table(TABLE).snapshots())
    source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=per_partition)
    transform = keyed(seed_rows * 5 // 4)
    seconds: list[float] = []
    commits: list[float] = []
    records = 0
    started = time.perf_counter()
    if variant == "icebergsink-upsert":
        sink = IcebergSink(catalog, TABLE, mode="upsert", keys=["k"], latest_by="value")
        p = Pipeline(
            name="bench", source=source, sink=sink, checkpoint=work / "chk", transform=transform
        )
        report = p.run(spark, on_batch=lambda b: seconds.append(b.seconds))
        records = report.rows_committed
        commits = [e.commit_seconds for e in sink.ledger("bench") if e.commit_seconds is not None]
    else:
        q = (
            transform(source.stream(spark, None))
            .writeStream.option("checkpointLocation", str(work / "chk"))
            .trigger(availableNow=True)
        )

        def upsert(df: Any, batch_id: int) -> None:
            nonlocal records
            t0 = time.perf_counter()
            rows = latest_per_key(df).toArrow()
            c0 = time.perf_counter()
            catalog.load_table(TABLE).upsert(rows, join_cols=["k"])
            commits.append(time.perf_counter() - c0)
            seconds.append(time.perf_counter() - t0)
            records += rows.num_rows

        q.foreachBatch(upsert).start().awaitTermination()
    wall = time.perf_counter() - started
    table = catalog.load_table(TABLE)
    got = table.scan(selected_fields=("k", "value")).to_arrow()
    rows = sorted(zip(got.column("k").to_pylist(), got.column("value").to_pylist(), strict=True))
    assert len({k for k, _ in rows}) == len(rows), f"{variant}: a key is in the table twice"
    return {
        "kind": variant,
        "records_read": None,
        "rows_upserted": records,
        "batches": len(seconds),
        "records_per_s": None,
        "wall_s": round(wall, 2),
        "batch_p50_s": pct(seconds, 50),
        "batch_p99_s": pct(seconds, 99),
        "commit_p50_s": pct(commits, 50),
        "commit_p99_s": pct(commits, 99),
        "table_rows": len(rows),
        "data_files": len(table.inspect.files()),
        "snapshots": len(table.snapshots()),
        # What the run's commits added (the seed's appends left out), by operation.
        "run_snapshots": dict(
            Counter(
                str(s.summary.operation) for s in table.snapshots()[seed_snapshots:] if s.summary
            )
        ),
    }, rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--batch-records", type=int, default=40_000)
    ap.add_argument("--seed-rows", type=int, default=800_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    from benchmarks.sinks import PARTITIONS, make_log

    from sparkonce.pipeline import build_session

    log_dir = make_log(args.records)
    spark = build_session()
    per_partition = max(1, args.batch_records // PARTITIONS)
    runs: list[dict] = []
    for r in range(args.rounds):
        order = VARIANTS if r % 2 == 0 else VARIANTS[::-1]
        tables: dict[str, list[tuple[int, int]]] = {}
        for variant in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-{variant}-") as work:
                run, tables[variant] = run_variant(
                    spark, variant, log_dir, per_partition, args.seed_rows, Path(work)
                )
            run["round"] = r
            run["records_read"] = args.records
            run["records_per_s"] = round(args.records / run["wall_s"])
            runs.append(run)
            print(json.dumps(run), file=sys.stderr)
        a, b = (tables[v] for v in VARIANTS)
        assert a == b, "the two variants' tables differ"
        alo = next(x for x in runs if x["round"] == r and x["kind"] == VARIANTS[0])
        for x in runs:
            if x["round"] == r:
                x["vs_counterpart"] = round(x["records_per_s"] / alo["records_per_s"], 3)
    import pyiceberg

    result = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "pyiceberg": pyiceberg.__version__,
        "records": args.records,
        "batch_records": args.batch_records,
        "seed_rows": args.seed_rows,
        "runs": runs,
    }
    print(json.dumps(result, indent=2))
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
