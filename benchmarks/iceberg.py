"""IcebergSink against its at-least-once counterparts, side by side in one run, and its
commit latency against the table's snapshot count. One script, three modes.

Run from the repository root (``make bench-iceberg`` runs the first and the third)::

    .venv/bin/python benchmarks/iceberg.py --mode append --records 5000000 \\
        --batch-records 500000 --rounds 2 --out benchmarks/results/iceberg.json
    .venv/bin/python benchmarks/iceberg.py --mode upsert --records 200000 \\
        --batch-records 40000 --seed-rows 800000 --out benchmarks/results/iceberg-upsert.json
    .venv/bin/python benchmarks/iceberg.py --mode snapshots --snapshots 10,100,1000,10000 \\
        --out benchmarks/results/iceberg-snapshots.json
    .venv/bin/python benchmarks/iceberg.py --mode retention --snapshots 100,1000,3000,10000 \\
        --young 100 --commits 20 --out benchmarks/results/iceberg-retention.json

**append** and **upsert** share one setup (:func:`side_by_side`): one embedded log
(``benchmarks/sinks.py``'s input: ``--records`` records over 4 partitions, cached in
``.cache/bench``) read in micro-batches of ``--batch-records`` by one ``local[2]`` session;
each round runs every variant, in alternating order, each into a fresh SQL catalog (SQLite)
and table and from Spark batch 0; after each round the variants' tables must hold the same
rows, read back by PyIceberg (a row count and a SHA-256 over the sorted rows). Reported per
variant: records/s over the run (the input's records over the run's wall time), per-batch
time p50/p99 (the batch function, Spark's read included: Spark evaluates the batch lazily
inside it), the commit's p50/p99, and ``vs_counterpart`` (records/s over the at-least-once
variant's of the same round).

* append: ``icebergsink-append`` (the sink: Spark's tasks write Parquet, the driver adds
  the files with the ledger entry in one snapshot) against ``iceberg-alo-append``, a plain
  ``foreachBatch`` doing ``catalog.load_table(t).append(batch_df.toArrow())`` (PyIceberg
  writes the Parquet on the driver and commits; no ledger). ``icebergsink-driver`` (the sink
  with the first slice's route: the batch collected as Arrow, appended by PyIceberg inside
  the ledger's commit) runs too when named in ``--variants``. The sink's commit p50/p99 is
  its catalog commit (``CommitResult.timings["commit"]``: ``add_files`` reading the
  footers' metadata, the manifest, manifest list and metadata file, the swap); the
  counterpart's is its ``append`` call, which also writes the Parquet file. The sink's
  ``split_p50_s`` is the committer's split of a batch (look, stage, commit, after).
* upsert: ``icebergsink-upsert`` against ``iceberg-alo-upsert``, ``foreachBatch`` with
  PyIceberg's own ``Table.upsert`` per batch (the batch reduced to one row per key by the
  same Spark window, collected to the driver as Arrow). Each variant starts from the same
  table: ``--seed-rows`` rows of keys ``0..seed-1`` added by PyIceberg in files of 100k
  rows. The upsert key is ``pmod(xxhash64(value), 1.25 * seed)``: keys spread over the whole
  table, so nearly every data file holds a batch key and both variants rewrite nearly the
  whole table per batch (copy-on-write: PyIceberg 0.12 writes no delete files), the worst
  case for both. ``run_snapshots`` counts, by operation, the snapshots a run's batches added.

**snapshots** (no Spark, :func:`snapshot_growth`): for each N of ``--snapshots``, a table
whose history holds N snapshots of one pipeline, each with its ledger entry in its summary
as the sink writes it, then ``--commits`` batch commits timed through the sink's own
committer, store and stager (``Committer.commit_with``: the look, a staged Parquet file of
``--batch-rows`` rows in a staging directory as Spark's tasks leave it, the catalog commit,
the orphan sweep). Writing N snapshots through PyIceberg commits costs time quadratic in N
(every commit rewrites the whole metadata file and the manifest list: 1,000 did not finish
in 10 minutes here), so the history is written directly (:func:`forge_history`): one real
commit of the sink, then N-1 more snapshots in the metadata file, copies of it with their
own ids, parents, sequence numbers and ledger entries, which share its manifest list (a
time-travel read of an old snapshot would see the first batch's rows: nothing in a commit
reads an old snapshot's manifests). Two shapes per N: ``compacted`` (the current snapshot
has one manifest, as after ``rewrite_manifests`` or with manifest merging) and ``fast``
(the current snapshot lists N manifests, as N fast appends leave a table nobody
maintains). Reported per N and shape: the commit's p50 and its split, the metadata file's
size, how long loading the table takes (read and parse the metadata file), serializing the
metadata (what the catalog's commit writes) and deep-copying it (what PyIceberg's
transaction does per state), and how long the ledger reads that walk the snapshot history
take (the sweep's ``committed_dirs``, the store's ``entries``). ``--plain-transaction``
commits through PyIceberg's own ``Transaction`` instead of the store's (the cost before
:class:`~sparkonce.ledger.iceberg.OnceTransaction`).

**retention** (no Spark, :func:`retention_run`): one pipeline runs max(``--snapshots``)
batches for real, through the same committer and a sink with ``keep_snapshots=--keep``;
at each N of ``--snapshots`` it commits ``--commits`` batches in turn with a young
pipeline (``--young`` batches, its own table), and reports the p50 of each, their ratio,
their split, and the aged table's snapshots, metadata size and manifests. Nothing is
forged: the aged table's rows are counted at the end.

Prints JSON; ``--out FILE`` also writes it (keeping the file's ``notes``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct, write_results  # noqa: E402

TABLE = "bench.out"
PIPELINE = "bench"
# Each mode's variants: the at-least-once counterpart first (the ratio's denominator).
VARIANTS = {
    "append": ("iceberg-alo-append", "icebergsink-append"),
    "upsert": ("iceberg-alo-upsert", "icebergsink-upsert"),
}
OPTIONAL = {"append": ("icebergsink-driver",), "upsert": ()}
SEED_FILE_ROWS = 100_000

# What a run returns: its report, and what its table holds (compared across variants).
RunFn = Callable[[Any, str, Path, int, Path], tuple[dict, dict]]


# -- shared setup -----------------------------------------------------------------------------
def new_catalog(work: Path) -> Any:
    from pyiceberg.catalog.sql import SqlCatalog

    return SqlCatalog("c", uri=f"sqlite:///{work}/cat.db", warehouse=f"file://{work}/wh")


def fingerprint(table: Any, columns: tuple[str, ...]) -> dict:
    """What a table holds, read by PyIceberg: its row count and a SHA-256 of its rows
    (``columns``, sorted by all of them), so two variants' tables compare without holding
    both in memory."""
    import pyarrow.compute as pc

    got = table.scan(selected_fields=columns).to_arrow()
    got = got.take(pc.sort_indices(got, sort_keys=[(c, "ascending") for c in columns]))
    digest = hashlib.sha256()
    for c in columns:
        col = got.column(c).combine_chunks()
        for buf in col.buffers()[1:]:  # offsets and values (no nulls here)
            if buf is not None:
                digest.update(buf)
    return {"rows": got.num_rows, "sha256": digest.hexdigest()[:16]}


def side_by_side(args: argparse.Namespace, variants: tuple[str, ...], run: RunFn) -> list[dict]:
    """Every round runs ``variants`` in alternating order on one session and one input;
    the first variant is the counterpart ``vs_counterpart`` divides by."""
    from benchmarks.sinks import PARTITIONS, make_log

    from sparkonce.pipeline import build_session

    log_dir = make_log(args.records)
    spark = build_session()
    per_partition = max(1, args.batch_records // PARTITIONS)
    if args.warmup_records:
        # Untimed: the session's first queries pay the JVM's warm-up (in a first try at 5M
        # records, the round's first variant took 2.3x its time of the next round).
        small = make_log(args.warmup_records)
        for variant in variants:
            with tempfile.TemporaryDirectory(prefix=f"bench-warmup-{variant}-") as work:
                run(
                    spark,
                    variant,
                    small,
                    max(1, args.warmup_records // 2 // PARTITIONS),
                    Path(work),
                )
    runs: list[dict] = []
    for r in range(args.rounds):
        order = variants if r % 2 == 0 else variants[::-1]
        tables: dict[str, dict] = {}
        for variant in order:
            with tempfile.TemporaryDirectory(prefix=f"bench-{variant}-") as work:
                report, tables[variant] = run(spark, variant, log_dir, per_partition, Path(work))
            report = {"kind": variant, "round": r, "order": order.index(variant), **report}
            report["records_per_s"] = round(args.records / report["wall_s"])
            report["table"] = tables[variant]
            runs.append(report)
            shown = {k: v for k, v in report.items() if not k.startswith("_")}
            print(json.dumps(shown), file=sys.stderr)
        differ = {v: t for v, t in tables.items() if t != tables[variants[0]]}
        assert not differ, f"round {r}: tables differ from {variants[0]}'s: {tables}"
        base = next(x for x in runs if x["round"] == r and x["kind"] == variants[0])
        for x in runs:
            if x["round"] == r:
                x["vs_counterpart"] = round(x["records_per_s"] / base["records_per_s"], 3)
    return runs


def pooled(runs: list[dict], variants: tuple[str, ...]) -> list[dict]:
    """One row per variant: records/s over all its rounds (every record over every
    second), and ``vs_counterpart`` of those pooled rates; each round's ratio beside it."""
    out: list[dict] = []
    base = None
    for v in variants:
        mine = [x for x in runs if x["kind"] == v]
        if not mine:
            continue
        rate = sum(x["records_per_s"] * x["wall_s"] for x in mine) / sum(x["wall_s"] for x in mine)
        base = rate if base is None else base
        commits = [c for x in mine for c in x.pop("_commits")]
        batches = [b for x in mine for b in x.pop("_batches")]
        out.append(
            {
                "kind": v,
                "records_per_s": round(rate),
                "vs_counterpart": round(rate / base, 3),
                "rounds_vs_counterpart": [x["vs_counterpart"] for x in mine],
                "commit_p50_s": pct(commits, 50),
                "commit_p99_s": pct(commits, 99),
                "batch_p50_s": pct(batches, 50),
                "batch_p99_s": pct(batches, 99),
                "batches": sum(x["batches"] for x in mine),
            }
        )
    return out


# -- append -----------------------------------------------------------------------------------
def append_transform(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(
        F.col("record_id"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
        F.col("timestamp"),
    )


def run_append(
    spark: Any, variant: str, log_dir: Path, per_partition: int, work: Path
) -> tuple[dict, dict]:
    from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline
    from sparkonce.sinks.iceberg import IcebergStager

    catalog = new_catalog(work)
    source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=per_partition)
    seconds: list[float] = []
    commits: list[float] = []
    spans: dict[str, list[float]] = {}
    started = time.perf_counter()
    if variant == "iceberg-alo-append":
        catalog.create_namespace("bench")
        q = (
            append_transform(source.stream(spark, None))
            .writeStream.option("checkpointLocation", str(work / "chk"))
            .trigger(availableNow=True)
        )

        def append(df: Any, batch_id: int) -> None:
            t0 = time.perf_counter()
            rows = df.toArrow()
            if not catalog.table_exists(TABLE):
                catalog.create_table(TABLE, schema=rows.schema)
            c0 = time.perf_counter()
            catalog.load_table(TABLE).append(rows)
            commits.append(time.perf_counter() - c0)
            spans.setdefault("collect", []).append(c0 - t0)
            seconds.append(time.perf_counter() - t0)

        q.foreachBatch(append).start().awaitTermination()
    else:
        sink = IcebergSink(catalog, TABLE)
        if variant == "icebergsink-driver":

            class DriverStager(IcebergStager):
                """The first slice's route: the batch collected on the driver as Arrow."""

                def prepare(self, ctx: Any, df: Any, seq: int) -> Any:
                    return self.prepare_arrow(ctx, df.toArrow(), df.schema, seq)

            sink.stager = DriverStager(sink.store, sink.stager.grace_seconds)
        p = Pipeline(
            name=PIPELINE,
            source=source,
            sink=sink,
            checkpoint=work / "chk",
            transform=append_transform,
        )

        def on_batch(b: Any) -> None:
            seconds.append(b.seconds)
            commits.append(b.result.timings.get("commit", 0.0))
            for k, v in b.result.timings.items():
                spans.setdefault(k, []).append(v)

        p.run(spark, on_batch=on_batch)
    wall = time.perf_counter() - started
    table = catalog.load_table(TABLE)
    return {
        **timings(wall, seconds, commits),
        "split_p50_s": {k: pct(v, 50) for k, v in spans.items()},
        "data_files": len(table.inspect.files()),
        "snapshots": len(table.snapshots()),
        "_commits": commits,
        "_batches": seconds,
    }, fingerprint(table, ("record_id", "key", "value"))


def timings(wall: float, seconds: list[float], commits: list[float]) -> dict[str, Any]:
    """A run's wall time, batch count, and per-batch and per-commit p50/p99."""
    return {
        "wall_s": round(wall, 2),
        "batches": len(seconds),
        "batch_p50_s": pct(seconds, 50),
        "batch_p99_s": pct(seconds, 99),
        "commit_p50_s": pct(commits, 50),
        "commit_p99_s": pct(commits, 99),
    }


# -- upsert -----------------------------------------------------------------------------------
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
    """What both upsert variants keep of a batch: per key, the row with the greatest value."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    w = Window.partitionBy("k").orderBy(F.col("value").desc())
    return df.withColumn("_r", F.row_number().over(w)).where("_r = 1").drop("_r")


def seeded_catalog(work: Path, seed_rows: int) -> Any:
    import pyarrow as pa

    catalog = new_catalog(work)
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


def upsert_runner(seed_rows: int) -> RunFn:
    def run(
        spark: Any, variant: str, log_dir: Path, per_partition: int, work: Path
    ) -> tuple[dict, dict]:
        from sparkonce import EmbeddedLogSource, IcebergSink, Pipeline

        catalog = seeded_catalog(work, seed_rows)
        seed_snapshots = len(catalog.load_table(TABLE).snapshots())
        source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=per_partition)
        transform = keyed(seed_rows * 5 // 4)
        seconds: list[float] = []
        commits: list[float] = []
        upserted = 0
        started = time.perf_counter()
        if variant == "icebergsink-upsert":
            sink = IcebergSink(catalog, TABLE, mode="upsert", keys=["k"], latest_by="value")
            p = Pipeline(
                name=PIPELINE,
                source=source,
                sink=sink,
                checkpoint=work / "chk",
                transform=transform,
            )
            report = p.run(spark, on_batch=lambda b: seconds.append(b.seconds))
            upserted = report.rows_committed
            commits = [
                e.commit_seconds for e in sink.ledger(PIPELINE) if e.commit_seconds is not None
            ]
        else:
            q = (
                transform(source.stream(spark, None))
                .writeStream.option("checkpointLocation", str(work / "chk"))
                .trigger(availableNow=True)
            )

            def upsert(df: Any, batch_id: int) -> None:
                nonlocal upserted
                t0 = time.perf_counter()
                rows = latest_per_key(df).toArrow()
                c0 = time.perf_counter()
                catalog.load_table(TABLE).upsert(rows, join_cols=["k"])
                commits.append(time.perf_counter() - c0)
                seconds.append(time.perf_counter() - t0)
                upserted += rows.num_rows

            q.foreachBatch(upsert).start().awaitTermination()
        wall = time.perf_counter() - started
        table = catalog.load_table(TABLE)
        got = fingerprint(table, ("k", "value"))
        keys = table.scan(selected_fields=("k",)).to_arrow().column("k")
        assert len(keys.unique()) == len(keys), f"{variant}: a key is in the table twice"
        return {
            "rows_upserted": upserted,
            # IcebergSink's commits: the ledger entry's commit_seconds (look to swap).
            **timings(wall, seconds, commits),
            "table_rows": got["rows"],
            "data_files": len(table.inspect.files()),
            "snapshots": len(table.snapshots()),
            # What the run's commits added (the seed's appends left out), by operation.
            "run_snapshots": dict(
                Counter(
                    str(s.summary.operation)
                    for s in table.snapshots()[seed_snapshots:]
                    if s.summary
                )
            ),
            "_commits": commits,
            "_batches": seconds,
        }, got

    return run


# -- snapshots --------------------------------------------------------------------------------
def snapshot_growth(args: argparse.Namespace) -> dict:
    sizes = [int(n) for n in args.snapshots.split(",")]
    if args.plain_transaction:
        # The store as it was before OnceTransaction: PyIceberg's own transaction.
        from pyiceberg.table import Transaction

        import sparkonce.ledger.iceberg as ledger

        ledger.transaction = Transaction  # type: ignore[assignment]
    results: list[dict] = []
    for n in sizes:
        for shape in ("compacted", "fast"):
            with tempfile.TemporaryDirectory(prefix=f"bench-iceberg-snap-{n}-") as work:
                row = commits_at(Path(work), n, shape, args.commits, args.batch_rows)
            results.append(row)
            print(json.dumps(row), file=sys.stderr)
    return {
        "commits_per_size": args.commits,
        "batch_rows": args.batch_rows,
        "transaction": "pyiceberg" if args.plain_transaction else "sparkonce",
        "results": results,
    }


class SnapshotBench:
    """One pipeline's sink on a fresh table, with a committer that stages a small Parquet
    file per batch into the batch's staging directory (what Spark's tasks leave)."""

    def __init__(self, work: Path, batch_rows: int, keep_snapshots: int | None = None) -> None:
        import pyarrow as pa

        from sparkonce import IcebergSink
        from sparkonce.ledger.iceberg import TABLE_PROPERTIES

        self.catalog = new_catalog(work)
        self.catalog.create_namespace("bench")
        self.schema = pa.schema([("record_id", pa.string()), ("value", pa.int64())])
        # As the sink creates a table (retention mode); the forged histories of the
        # snapshots mode are made of fast appends, as a table without merging has them.
        props = TABLE_PROPERTIES if keep_snapshots is not None else {}
        self.catalog.create_table(TABLE, schema=self.schema, properties=props)
        self.sink = IcebergSink(self.catalog, TABLE, keep_snapshots=keep_snapshots)
        from sparkonce.commit.committer import Committer

        self.committer = Committer(*self.sink.committer_parts())  # the sink's own wiring
        self.batch_rows = batch_rows
        self.epoch = self.sink.store.acquire(PIPELINE).epoch
        self.next = 0  # the next batch's first offset, per partition

    def commit(self) -> Any:
        import uuid

        import pyarrow as pa
        from pyarrow import parquet as pq

        from sparkonce.commit.base import Staged
        from sparkonce.ledger.base import BatchContext
        from sparkonce.ledger.iceberg import DataFiles
        from sparkonce.offsets import BatchRanges, OffsetRange
        from sparkonce.sinks.iceberg import staging_root

        lo, hi = self.next, self.next + self.batch_rows
        ranges = BatchRanges((OffsetRange("events", 0, lo, hi),))
        ctx = BatchContext(PIPELINE, self.epoch, ranges, spark_batch_id=lo // self.batch_rows)

        def stage(seq: int) -> Staged:
            table = self.sink.store.load()
            name = f"{self.epoch}-{seq}-{uuid.uuid4().hex}"
            d = staging_root(table, PIPELINE, "bench") / name
            d.mkdir(parents=True)
            f = d / "part-00000.parquet"
            ids = [f"events-0-{i}" for i in range(lo, hi)]
            pq.write_table(pa.table({"record_id": ids, "value": list(range(lo, hi))}), f)
            (d / "_SUCCESS").touch()
            return Staged(rows=hi - lo, payload=DataFiles((f.as_uri(),), hi - lo, name))

        result = self.committer.commit_with(ctx, stage)
        assert not result.skipped, result
        self.next = hi
        return result


def forge_history(bench: SnapshotBench, n: int, shape: str) -> None:
    """Make ``n`` snapshots of the table's history out of its one real batch snapshot
    (see the module docstring): the copies are the batches 1..n-1 of the same pipeline,
    written straight into a new metadata file that the catalog then points at."""
    import copy

    from pyiceberg.manifest import write_manifest_list
    from pyiceberg.serializers import FromInputFile

    from sparkonce.ledger.iceberg import key
    from sparkonce.ledger.records import ICEBERG_ENTRY
    from sparkonce.offsets import BatchRanges, OffsetRange

    table = bench.catalog.load_table(TABLE)
    meta = json.loads(
        FromInputFile.table_metadata(table.io.new_input(table.metadata_location)).model_dump_json(
            by_alias=True, exclude_none=True
        )
    )
    [first] = meta["snapshots"]
    entry_key, staged_key = key(PIPELINE, "entry"), key(PIPELINE, "staged")
    entry = ICEBERG_ENTRY.decode(PIPELINE, json.loads(first["summary"][entry_key]), where="")
    size = bench.batch_rows
    snaps, log_ = [first], list(meta["snapshot-log"])
    for seq in range(1, n):
        s = copy.deepcopy(first)
        s["snapshot-id"] = first["snapshot-id"] + seq
        s["parent-snapshot-id"] = snaps[-1]["snapshot-id"]
        s["sequence-number"] = first["sequence-number"] + seq
        s["timestamp-ms"] = first["timestamp-ms"] + seq
        ranges = BatchRanges((OffsetRange("events", 0, seq * size, (seq + 1) * size),))
        e = replace(entry, seq=seq, spark_batch_id=seq, ranges=ranges)
        s["summary"][entry_key] = json.dumps(ICEBERG_ENTRY.encode(e))
        s["summary"][staged_key] = f"{bench.epoch}-{seq}-{seq:032x}"
        snaps.append(s)
        log_.append({"snapshot-id": s["snapshot-id"], "timestamp-ms": s["timestamp-ms"]})
    last = snaps[-1]
    if shape == "fast":
        # The current snapshot lists n manifests, as n fast appends leave it (each the
        # first batch's manifest again: the table's rows are not what a reader would get).
        manifests = list(table.current_snapshot().manifests(table.io)) * n
        path = f"{table.location()}/metadata/forged-{n}.avro"
        with write_manifest_list(
            format_version=table.format_version,
            output_file=table.io.new_output(path),
            snapshot_id=last["snapshot-id"],
            parent_snapshot_id=last["parent-snapshot-id"],
            sequence_number=last["sequence-number"],
            avro_compression="deflate",
        ) as writer:
            writer.add_manifests(manifests)
        last["manifest-list"] = path
    meta["snapshots"] = snaps
    meta["snapshot-log"] = log_
    meta["current-snapshot-id"] = last["snapshot-id"]
    meta["refs"] = {"main": {"snapshot-id": last["snapshot-id"], "type": "branch"}}
    meta["last-sequence-number"] = last["sequence-number"]
    meta["last-updated-ms"] = last["timestamp-ms"]
    meta["properties"][key(PIPELINE, "last")] = last["summary"][entry_key]
    location = f"{table.location()}/metadata/99999-forged.metadata.json"
    Path(location.removeprefix("file://")).write_text(json.dumps(meta))
    with bench.catalog.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE iceberg_tables SET metadata_location = :m"), {"m": location})
    bench.next = n * size


def commits_at(work: Path, n: int, shape: str, commits: int, batch_rows: int) -> dict:
    from pyiceberg.serializers import FromInputFile

    from sparkonce.sinks.iceberg import committed_dirs

    bench = SnapshotBench(work, batch_rows)
    bench.commit()  # batch 0: the real snapshot the history is made of
    t0 = time.perf_counter()
    if n > 1:
        forge_history(bench, n, shape)
    forged = time.perf_counter() - t0
    took: list[float] = []
    spans: dict[str, list[float]] = {}
    for _ in range(commits):
        c0 = time.perf_counter()
        result = bench.commit()
        took.append(time.perf_counter() - c0)
        for k, v in result.timings.items():
            spans.setdefault(k, []).append(v)
    table = bench.catalog.load_table(TABLE)
    assert len(table.snapshots()) == n + commits, (len(table.snapshots()), n, commits)
    meta_file = Path(table.metadata_location.removeprefix("file://"))

    def timed(f: Callable[[], Any], times: int = 3) -> float:
        best = float("inf")
        for _ in range(times):
            s = time.perf_counter()
            f()
            best = min(best, time.perf_counter() - s)
        return round(best, 4)

    io = table.io
    return {
        "kind": f"{n}-{shape}",
        "snapshots": n,
        "shape": shape,
        "forge_s": round(forged, 2),
        "commit_p50_s": pct(took, 50),
        "commit_max_s": max(took),
        "split_p50_s": {k: pct(v, 50) for k, v in spans.items()},
        "metadata_mb": round(meta_file.stat().st_size / 1e6, 3),
        "manifests": len(table.current_snapshot().manifests(io)),
        # Reads inside a commit, each the best of 3:
        "parse_metadata_s": timed(
            lambda: FromInputFile.table_metadata(io.new_input(table.metadata_location))
        ),
        "load_table_s": timed(lambda: bench.catalog.load_table(TABLE)),
        "write_metadata_s": timed(lambda: table.metadata.model_dump_json()),
        "copy_metadata_s": timed(lambda: table.metadata.model_copy(deep=True)),
        "committed_dirs_s": timed(lambda: committed_dirs(table, PIPELINE)),
        "entries_s": timed(lambda: bench.sink.store.entries(PIPELINE)),
    }


# -- retention --------------------------------------------------------------------------------
def retention_run(
    args: argparse.Namespace, on_mark: Callable[[dict[str, Any]], None] | None = None
) -> dict:
    """Real batch commits of one pipeline through the sink's committer with
    ``keep_snapshots=--keep``, against a young pipeline's, side by side.

    The aged pipeline commits max(``--snapshots``) batches, one after the other. The young
    one is a table of its own that has committed ``--young`` batches (past the retention's
    fill, so it holds as many snapshots as the aged one will). At each N of ``--snapshots``
    the two commit in turn, ``--commits`` batches each, and the row is the aged commits'
    p50 over the young ones' (``aged_over_young``): load on the machine moves both alike.
    A ratio near 1 at every N is a commit time that does not grow with the batches."""
    marks = sorted(int(n) for n in args.snapshots.split(","))
    total, window = marks[-1], args.commits
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-iceberg-retention-") as work:
        for name in ("aged", "young"):
            (Path(work) / name).mkdir()
        aged = SnapshotBench(Path(work) / "aged", args.batch_rows, keep_snapshots=args.keep)
        young = SnapshotBench(Path(work) / "young", args.batch_rows, keep_snapshots=args.keep)
        for _ in range(args.young):
            young.commit()
        started, done = time.perf_counter(), 0
        for mark in marks:
            while done < mark - window:
                aged.commit()
                done += 1
                if done % 500 == 0:
                    print(
                        f"{done}/{total} batches, {time.perf_counter() - started:.0f} s",
                        file=sys.stderr,
                    )
            took: dict[str, list[float]] = {"aged": [], "young": []}
            split: dict[str, dict[str, list[float]]] = {"aged": {}, "young": {}}
            while done < mark:
                for name, bench in (("aged", aged), ("young", young)):
                    c0 = time.perf_counter()
                    result = bench.commit()
                    took[name].append(time.perf_counter() - c0)
                    for k, v in result.timings.items():
                        split[name].setdefault(k, []).append(v)
                done += 1
            table = aged.catalog.load_table(TABLE)
            snap = table.current_snapshot()
            meta = Path(table.metadata_location.removeprefix("file://"))
            row = {
                "batches": mark,
                "aged_p50_s": pct(took["aged"], 50),
                "young_p50_s": pct(took["young"], 50),
                "aged_over_young": round(pct(took["aged"], 50) / pct(took["young"], 50), 3),
                "aged_max_s": round(max(took["aged"]), 4),
                "aged_split_p50_s": {k: pct(v, 50) for k, v in split["aged"].items()},
                "young_split_p50_s": {k: pct(v, 50) for k, v in split["young"].items()},
                "snapshots_held": len(table.snapshots()),
                "metadata_mb": round(meta.stat().st_size / 1e6, 3),
                "manifests": len(snap.manifests(table.io)) if snap else 0,
            }
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
            if on_mark is not None:  # what is measured so far, should the run be stopped
                on_mark({"keep_snapshots": args.keep, "partial": True, "results": rows})
        table = aged.catalog.load_table(TABLE)
        counted = table.scan().to_arrow().num_rows
        assert counted == total * args.batch_rows, (counted, total)
    return {
        "keep_snapshots": args.keep,
        "batch_rows": args.batch_rows,
        "window_commits": window,
        "young_batches": args.young,
        "rows_counted": counted,
        "seconds": round(time.perf_counter() - started, 1),
        "results": rows,
    }


# -- main -------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--mode", choices=("append", "upsert", "snapshots", "retention"), default="append"
    )
    ap.add_argument("--records", type=int, default=400_000)
    ap.add_argument("--batch-records", type=int, default=40_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--variants", help="comma-separated, of: " + ", ".join(sum(VARIANTS.values(), ()))
    )
    ap.add_argument(
        "--warmup-records",
        type=int,
        default=20_000,
        help="each variant once on this many records before the timed rounds (0: none)",
    )
    ap.add_argument("--seed-rows", type=int, default=800_000, help="upsert: the seed table")
    ap.add_argument("--snapshots", default="10,100,1000,10000", help="snapshots: the sizes")
    ap.add_argument(
        "--commits",
        type=int,
        default=9,
        help="snapshots: commits per size; retention: the commits each mark reports",
    )
    ap.add_argument(
        "--batch-rows", type=int, default=1000, help="snapshots, retention: rows per commit"
    )
    ap.add_argument("--keep", type=int, default=100, help="retention: the sink's keep_snapshots")
    ap.add_argument("--young", type=int, default=150, help="retention: the young one's batches")
    ap.add_argument(
        "--plain-transaction",
        action="store_true",
        help="snapshots: commit through PyIceberg's own Transaction (before the fix)",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)

    import pyiceberg

    result: dict[str, Any] = {
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": machine(),
        "pyiceberg": pyiceberg.__version__,
        "mode": args.mode,
    }
    if args.mode == "snapshots":
        result.update(snapshot_growth(args))
    elif args.mode == "retention":

        def partial(measured: dict[str, Any]) -> None:
            if args.out:
                write_results(args.out, {**result, **measured})

        result.update(retention_run(args, partial))
    else:
        variants = VARIANTS[args.mode] + OPTIONAL[args.mode]
        if args.variants:
            chosen = args.variants.split(",")
            unknown = set(chosen) - set(variants)
            if unknown:
                ap.error(f"unknown variants {sorted(unknown)} for --mode {args.mode}")
            variants = tuple(v for v in variants if v in chosen)
        else:
            variants = VARIANTS[args.mode]
        run = run_append if args.mode == "append" else upsert_runner(args.seed_rows)
        runs = side_by_side(args, variants, run)
        result.update(
            {
                "records": args.records,
                "batch_records": args.batch_records,
                "rounds": args.rounds,
                **({"seed_rows": args.seed_rows} if args.mode == "upsert" else {}),
                "summary": pooled(runs, variants),
                "runs": runs,
            }
        )
    print(json.dumps(result, indent=2))
    if args.out:
        write_results(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
