"""Ledger history: start-up and per-batch commit time of every ledger store at N entries.

Run from the repository root (the heavy sizes take a while; see ``--sizes``)::

    PYSPARK_PYTHON=$PWD/.venv/bin/python .venv/bin/python benchmarks/history.py \\
        --sizes 10,1e4,1e6 --label after

For each store (``--stores``: sqlite, postgres, kafka, delta) and each size N it builds the
ledger of one pipeline holding N committed batches, fast, without running N commits:

* **sqlite**, **postgres**: the store's own code creates its tables (``SqlLedgerStore``), then
  N ledger rows go in with one bulk ``INSERT`` (SQLite) or ``COPY`` (PostgreSQL), in the
  table's real schema, plus the owner row (epoch 1).
* **kafka**: ``KafkaSink`` creates its ledger topic (whatever configuration the code under
  test gives it), then a plain idempotent confluent-kafka producer writes an owner record
  (epoch 1) and, per batch, ``--tasks`` task markers and the batch record, in the record
  format of ``sparkonce.ledger.kafka_topic`` and ``sparkonce.sinks.kafka`` (same keys, same
  fields). Not synthesized: the transaction markers. The real sink writes each record in a
  transaction of its own, so a real topic has about one control record per ledger record;
  readers skip them, so real reads cover about twice the offsets measured here.
* **delta**: an empty Delta table, then **one** Delta commit that sets the pipeline's ``txn``
  version to ``pack(1, N)`` (what N batch commits of epoch 1 leave), written the way
  ``DeltaLedgerStore.acquire`` commits it; then the entry files the store reads
  (``_sparkonce/<pipeline>/entries/<seq>/1.json`` and ``1.rows``) for the newest
  ``--delta-window`` seqs only, and ``owners/1.json``. Synthesized, so not measured: the N
  data files and the N commits a real table would have (Delta's own cost of a big table and
  a long log, which log retention, checkpoints and OPTIMIZE bound, not sparkonce), and the
  entry files older than the window (nothing reads them unless a walk through the ledger
  goes past the window; such a walk is reported as not measured, with the rate measured).

Then, with the **real** sink and store classes of the code under test (``--src``):

* **start-up**: what ``sparkonce run`` does before its first batch, as
  ``sparkonce.pipeline.runner`` does it: a new sink object, ``open()``, ``end_offsets``,
  ``last_entry``, ``acquire`` (epoch + 1) and ``end_offsets`` again. ``--starts`` times; the
  first start on a ledger is reported apart (a store may migrate or index on it).
* **per-batch commit**: ``Committer.commit_with`` on the store of the last start, with a
  trivial stager (it stages one row and publishes nothing, except on Delta, where the commit
  is a real Delta append of one row), for ``--batches`` new data batches and as many new
  no-data batches (empty ranges at the ledger's end, as Spark runs when a watermark moves or
  a timer fires), alternating. The median of each is reported.

Results go to ``benchmarks/results/history.json`` under ``--label`` (other labels already in
the file are kept, so the code before and after a change can be measured into one file) and
``benchmarks/results/history.png``. ``--markdown`` prints the README's table from the file.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
PIPELINE = "history"
TOPIC = "events"
PARTS = 4  # source partitions in every batch's ranges
STEP = 100  # records per partition per batch
CHECKPOINT = "bench-checkpoint"
STORES = ("sqlite", "postgres", "kafka", "delta")


def parse_size(text: str) -> int:
    return int(float(text))


def batch_ranges(seq: int) -> dict[str, dict[str, list[int]]]:
    return {TOPIC: {str(p): [seq * STEP, (seq + 1) * STEP] for p in range(PARTS)}}


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


def load() -> float:
    return os.getloadavg()[0]


def rss() -> float:
    """This process's resident memory now, in MB (the driver's, with every store's reads)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


# -- building a ledger of N entries ---------------------------------------------------------------


def build_sql(sink: Any, n: int) -> None:
    """N ledger rows and the owner row, through the table the store itself created."""
    from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE

    conn = sink.conn  # connects; the store creates its tables (and whatever it adds to them)
    cols = (
        "pipeline, seq, ranges, epoch, row_count, committed_at, spark_batch_id, "
        "checkpoint_id, stateful, commit_seconds"
    )
    at = now_iso()
    sqlite = sink.dialect.name == "sqlite"

    def rows(lo: int, hi: int) -> Iterator[tuple[Any, ...]]:
        for seq in range(lo, hi):
            text = json.dumps(batch_ranges(seq), sort_keys=True, separators=(",", ":"))
            stateful: Any = 0 if sqlite else False
            yield (PIPELINE, seq, text, 1, STEP * PARTS, at, seq, CHECKPOINT, stateful, 0.01)

    chunk = 100_000
    if sqlite:
        conn.execute("BEGIN")
        conn.execute(
            f"INSERT INTO {OWNER_TABLE}(pipeline, epoch, acquired_at, holder, source) "
            "VALUES (?, 1, ?, 'bench', NULL)",
            (PIPELINE, at),
        )
        for lo in range(0, n, chunk):
            conn.executemany(
                f"INSERT INTO {LEDGER_TABLE}({cols}) VALUES (?,?,?,?,?,?,?,?,?,?)",
                rows(lo, min(n, lo + chunk)),
            )
        conn.execute("COMMIT")
        return
    with conn.transaction():
        conn.execute(
            f"INSERT INTO {OWNER_TABLE}(pipeline, epoch, acquired_at, holder, source) "
            "VALUES (%s, 1, now(), 'bench', NULL)",
            (PIPELINE,),
        )
        with conn.cursor().copy(f"COPY {LEDGER_TABLE}({cols}) FROM STDIN") as copy:
            for row in rows(0, n):
                copy.write_row(row)
    conn.execute(f"ANALYZE {LEDGER_TABLE}")


def build_kafka(
    bootstrap: str, ledger_topic: str, n: int, tasks: int, *, snapshots: bool = True
) -> None:
    """An owner record, then per batch ``tasks`` markers and the batch record.

    ``snapshots``: also a snapshot record of the pipeline's folded state once
    ``SNAPSHOT_EVERY`` offsets have passed since the last one, after a batch record, as the
    code under test writes them (``LedgerTopic.snapshot`` of the fold of every record below
    it). False: a topic as sparkonce wrote it before snapshots, which a first start reads
    whole, once.
    """
    from confluent_kafka import Producer

    if snapshots:
        from sparkonce.ledger.kafka_topic import (
            MEMORY_ENTRIES,
            SNAPSHOT_EVERY,
            LedgerState,
            LedgerTopic,
        )

        state = LedgerState()
    offset = 0  # a fresh topic, no transactions: the records take consecutive offsets

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "enable.idempotence": True,
            "acks": "all",
        }
    )
    failures: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    def send(key: str, value: dict[str, Any]) -> None:
        nonlocal offset
        while True:
            try:
                producer.produce(
                    ledger_topic, json.dumps(value), key, partition=0, on_delivery=report
                )
                break
            except BufferError:
                producer.poll(0.1)
        if snapshots:
            LedgerTopic.fold(state, PIPELINE, [{**value, "_offset": offset}])
        offset += 1
        if snapshots:
            state.position = offset

    def snapshot_if_due() -> None:
        if not snapshots or state.position - max(state.snapshot_at, 0) < SNAPSHOT_EVERY:
            return
        if len(state.entries) > MEMORY_ENTRIES:  # a snapshot carries the newest 100 only
            del state.entries[:-MEMORY_ENTRIES]
            state.complete = False
        record = LedgerTopic.snapshot(PIPELINE, state)
        if record is not None:
            send(f"s:{PIPELINE}", record)

    at = now_iso()
    send(
        f"o:{PIPELINE}",
        {
            "type": "owner",
            "pipeline": PIPELINE,
            "epoch": 1,
            "holder": "bench",
            "source": None,
            "at": at,
        },
    )
    for seq in range(n):
        ranges = batch_ranges(seq)
        for t in range(tasks):
            send(
                f"m:{PIPELINE}:{t}",
                {
                    "type": "marker",
                    "pipeline": PIPELINE,
                    "partition": t,
                    "seq": seq,
                    "ranges": ranges,
                    "epoch": 1,
                    "rows": STEP * PARTS // tasks,
                    "attempt": 0,
                    "spark_batch_id": seq,
                    "checkpoint_id": CHECKPOINT,
                    "at": at,
                },
            )
        send(
            f"b:{PIPELINE}",
            {
                "type": "batch",
                "pipeline": PIPELINE,
                "seq": seq,
                "ranges": ranges,
                "epoch": 1,
                "rows": STEP * PARTS,
                "tasks": tasks,
                "tasks_skipped": 0,
                "spark_batch_id": seq,
                "checkpoint_id": CHECKPOINT,
                "stateful": False,
                "commit_seconds": 0.01,
                "at": at,
            },
        )
        snapshot_if_due()
        if seq % 10_000 == 0:
            producer.poll(0)
    left = producer.flush(600)
    if left or failures:
        raise SystemExit(f"building the ledger topic failed: {left} undelivered, {failures[:3]}")


def build_delta(spark: Any, path: str, n: int, window: int) -> int:
    """The txn version of N committed batches, in one commit, and the newest entry files.

    Returns how many entry files were written (the newest ``window`` seqs)."""
    from sparkonce.ledger.delta import app_id, pack
    from sparkonce.spark.delta import DeltaTable

    spark.range(0).selectExpr("id AS v").write.format("delta").save(path)
    table = DeltaTable(spark, path)
    txn = table.start_transaction()
    txn.readTxn().addOne(app_id(PIPELINE))
    meta = json.dumps({"sparkonce": "acquire", "pipeline": PIPELINE, "epoch": 1})
    table._commit_set_transaction(txn, app_id(PIPELINE), pack(1, n), meta)
    base = Path(path) / "_sparkonce" / PIPELINE
    (base / "owners").mkdir(parents=True)
    (base / "owners" / "1.json").write_text(
        json.dumps({"epoch": 1, "holder": "bench", "source": None, "at": now_iso()})
    )
    at = now_iso()
    first = max(0, n - window)
    for seq in range(first, n):
        d = base / "entries" / str(seq)
        d.mkdir(parents=True)
        entry = {
            "pipeline": PIPELINE,
            "seq": seq,
            "epoch": 1,
            "ranges": batch_ranges(seq),
            "committed_at": at,
            "spark_batch_id": seq,
            "checkpoint_id": CHECKPOINT,
            "stateful": False,
            "commit_seconds": 0.01,
        }
        (d / "1.json").write_text(json.dumps(entry))
        (d / "1.rows").write_text(f"{STEP * PARTS} 0.01")
    return n - first


# -- what is measured -------------------------------------------------------------------------


def start_up(make_sink: Callable[[], Any]) -> tuple[Any, float]:
    """What ``sparkonce run`` does before its first batch (``runner._run``, steps 1-3)."""
    started = time.monotonic()
    sink = make_sink()
    sink.open()
    seen = sink.end_offsets(PIPELINE)
    sink.last_entry(PIPELINE)
    sink.acquire(PIPELINE, "bench://events")
    if sink.end_offsets(PIPELINE) != seen:
        raise RuntimeError("the ledger moved during start-up: nothing else writes to it")
    return sink, time.monotonic() - started


def commits(sink: Any, batches: int, spark: Any) -> dict[str, Any]:
    """``batches`` new data batches and as many new no-data batches, alternating."""
    from sparkonce.commit import Committer, Staged, Stager
    from sparkonce.ledger.base import BatchContext
    from sparkonce.offsets import BatchRanges, OffsetRange

    store, _ = sink.committer_parts()
    delta = spark is not None
    one_row = spark.range(1).selectExpr("id AS v") if delta else None

    class OneRow(Stager):
        """Stages one row; publishes nothing, or (Delta) appends it in the Delta commit."""

        def prepare(self, ctx: BatchContext, df: Any, seq: int) -> Staged:
            return Staged(1)

        def publish(self, txn: Any, ctx: BatchContext, staged: Staged) -> None:
            if delta:
                table = sink.table

                def write(app: str, version: int, metadata: str) -> tuple[bool, int]:
                    result: tuple[bool, int] = table.append(one_row._jdf, app, version, metadata)
                    return result

                txn.publish = write
                txn.staged = staged

    committer = Committer(store, OneRow())
    owner = sink.owner(PIPELINE)
    last = sink.last_entry(PIPELINE)
    ends = dict(last.end_offsets) if last is not None else {}
    batch_id = 10**9  # a query id of its own: never the synthesized entries' batch ids
    data: list[float] = []
    no_data: list[float] = []
    failed: str | None = None
    for _ in range(batches):
        ranges = BatchRanges(
            tuple(
                OffsetRange(TOPIC, p, ends.get((TOPIC, p), 0), ends.get((TOPIC, p), 0) + STEP)
                for p in range(PARTS)
            )
        )
        ctx = BatchContext(PIPELINE, owner.epoch, ranges, batch_id, "bench-run", False)
        t0 = time.monotonic()
        result = committer.commit_with(ctx, lambda seq: Staged(1))
        data.append(time.monotonic() - t0)
        assert not result.skipped, result
        ends = ranges.ends()
        batch_id += 1
        if failed is not None:
            continue
        ctx = BatchContext(
            PIPELINE, owner.epoch, BatchRanges.at(ends), batch_id, "bench-run", False
        )
        t0 = time.monotonic()
        try:
            result = committer.commit_with(ctx, lambda seq: Staged(1))
        except Exception as exc:  # a walk past the synthesized part of a Delta ledger
            failed = f"{type(exc).__name__}: {str(exc)[:300]} after {time.monotonic() - t0:.1f} s"
            continue
        no_data.append(time.monotonic() - t0)
        assert not result.skipped, result
        batch_id += 1
    out: dict[str, Any] = {
        "commit_s": statistics.median(data),
        "commit_runs_s": data,
        "nodata_commit_s": statistics.median(no_data) if no_data else None,
        "nodata_commit_runs_s": no_data,
    }
    if failed:
        out["nodata_error"] = failed
    return out


@contextmanager
def services(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """A throwaway PostgreSQL server and Kafka broker, as the stores need them."""
    sys.path.insert(1, str(REPO))  # tests.services
    started: list[Callable[[], None]] = []
    out: dict[str, Any] = {}
    try:
        if "postgres" in args.stores:
            from tests.services import postgres

            if args.pg_url:
                out["pg"] = postgres.PostgresServer.from_url(args.pg_url)
            else:
                pg_dir = Path(tempfile.mkdtemp(prefix="sparkonce-history-pg-"))
                out["pg"] = postgres.start(pg_dir)
                started.append(lambda: (postgres.stop(pg_dir), shutil.rmtree(pg_dir, True)))
        if "kafka" in args.stores:
            from tests.services import kafka

            if args.bootstrap:
                out["bootstrap"] = args.bootstrap
            else:
                k_dir = Path(tempfile.mkdtemp(prefix="sparkonce-history-kafka-"))
                out["bootstrap"] = kafka.start(k_dir).bootstrap
                started.append(lambda: (kafka.stop(k_dir), shutil.rmtree(k_dir, True)))
            # The first size measured must not pay for the broker's first transaction.
            from benchmarks._common import warm_coordinators

            from sparkonce.kafka import KafkaConnection

            KafkaConnection(out["bootstrap"]).ensure_topic("history-warm", 1)
            warm_coordinators(out["bootstrap"], "history-warm")
        if "delta" in args.stores:
            from sparkonce.sinks.delta import delta_spark_conf
            from sparkonce.spark.session import build_session

            out["spark"] = build_session(
                master="local[1]",
                app_name="sparkonce-bench-history",
                shuffle_partitions=1,
                conf=delta_spark_conf(),
            )
            started.append(out["spark"].stop)
        yield out
    finally:
        for stop in reversed(started):
            stop()


def measure_store(
    store: str, n: int, args: argparse.Namespace, env: dict[str, Any], work: Path
) -> dict[str, Any]:
    from sparkonce import DeltaSink, KafkaSink, PostgresSink, SQLiteSink

    spark = env.get("spark") if store == "delta" else None
    tag = f"{store}_{n}_{os.getpid()}"
    cleanup: Callable[[], None] = lambda: None  # noqa: E731
    notes = ""
    t0 = time.monotonic()
    make_sink: Callable[[], Any]
    if store == "sqlite":
        url = f"sqlite:///{work / (tag + '.db')}"

        def make_sink() -> Any:
            return SQLiteSink(url, "out")

        builder = make_sink()
        build_sql(builder, n)
        builder.close()
    elif store == "postgres":
        url = env["pg"].create_database(f"h_{tag}")

        def make_sink() -> Any:
            return PostgresSink(url, "out")

        builder = make_sink()
        build_sql(builder, n)
        builder.close()
    elif store == "kafka":
        from sparkonce.kafka import KafkaConnection

        bootstrap = env["bootstrap"]
        out_topic = f"h-{tag}".replace("_", "-")
        conn = KafkaConnection(bootstrap)
        conn.ensure_topic(out_topic, 1)

        def make_sink() -> Any:
            return KafkaSink(bootstrap, out_topic)

        builder = make_sink()
        builder.open()  # the code under test creates the ledger topic
        ledger_topic = builder.ledger_topic
        builder.close()
        snapshots = args.kafka_ledger == "current"
        build_kafka(bootstrap, ledger_topic, n, args.tasks, snapshots=snapshots)
        notes = f"{args.tasks} task markers per batch; no transaction markers; " + (
            "a snapshot record every 2,000 offsets, as sparkonce writes them"
            if snapshots
            else "no snapshot records (a topic written before snapshots)"
        )

        def cleanup() -> None:
            for t in (out_topic, ledger_topic):
                conn.delete_topic(t)

    else:
        path = str(work / tag)

        def make_sink() -> Any:
            return DeltaSink(path)

        written = build_delta(spark, path, n, args.delta_window)
        notes = f"txn version of {n} batches in one commit; entry files of the newest {written}"

        def cleanup() -> None:
            shutil.rmtree(path, ignore_errors=True)

    build_s = time.monotonic() - t0
    starts: list[float] = []
    sink = None
    load_before = load()
    try:
        for _ in range(args.starts):
            if sink is not None:
                sink.close()
                sink = None  # an old store's memory is not held through the next start
                gc.collect()
            sink, seconds = start_up(make_sink)
            starts.append(seconds)
        rss_mb = rss()
        result = {
            "build_s": build_s,
            "startup_first_s": starts[0],
            "startup_s": statistics.median(starts[1:] if len(starts) > 1 else starts),
            "startup_runs_s": starts,
            "rss_mb_after_start": rss_mb,
            **commits(sink, args.batches, spark),
            "load_1min": [load_before, load()],
            "settings": {
                k: getattr(args, k)
                for k in ("starts", "batches", "tasks", "delta_window", "kafka_ledger")
            },
            "notes": notes,
        }
    finally:
        if sink is not None:
            sink.close()
        cleanup()
        if store == "sqlite":
            for f in work.glob(tag + ".db*"):
                f.unlink()
    return result


# -- reporting --------------------------------------------------------------------------------


def fmt_s(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value * 1000:.1f} ms"


METRICS = (
    ("startup_first_s", "first start"),
    ("startup_s", "start-up"),
    ("commit_s", "commit (data batch)"),
    ("nodata_commit_s", "commit (no-data batch)"),
)


def ratio(row: dict[str, Any], key: str, sizes: list[int]) -> str:
    lo, hi = row.get(str(min(sizes)), {}).get(key), row.get(str(max(sizes)), {}).get(key)
    if not lo or hi is None:
        return "-"
    return f"{hi / lo:,.1f}x"


def print_table(report: dict[str, Any], label: str) -> None:
    from rich.console import Console
    from rich.table import Table

    run = report["runs"][label]
    sizes = run["sizes"]
    table = Table(title=f"ledger history ({label}): seconds by ledger entries")
    table.add_column("store")
    table.add_column("measure")
    for n in sizes:
        table.add_column(f"{n:,}", justify="right")
    table.add_column(f"{max(sizes):,} / {min(sizes):,}", justify="right")
    for store, row in run["stores"].items():
        for key, name in METRICS:
            cells = [fmt_s(row.get(str(n), {}).get(key)) for n in sizes]
            table.add_row(store, name, *cells, ratio(row, key, sizes))
    Console(width=150).print(table)


def markdown(report: dict[str, Any]) -> str:
    """The README's table: every label, store and measure."""
    labels = list(report["runs"])
    sizes = sorted({n for lab in labels for n in report["runs"][lab]["sizes"]})
    head = "| store | measure | code | " + " | ".join(f"{n:,}" for n in sizes)
    lines = [
        head + f" | {max(sizes):,} / {min(sizes):,} |",
        "|---|---|---|" + "---:|" * (len(sizes) + 1),
    ]
    stores = [s for s in STORES if any(s in report["runs"][lab]["stores"] for lab in labels)]
    for store in stores:
        for key, name in METRICS:
            for lab in labels:
                row = report["runs"][lab]["stores"].get(store)
                if row is None:
                    continue
                cells = []
                for n in sizes:
                    cell = row.get(str(n), {})
                    text = fmt_s(cell.get(key))
                    if key == "nodata_commit_s" and cell.get("nodata_error"):
                        text = "not measured"
                    cells.append(text)
                lines.append(
                    f"| {store} | {name} | {lab} | "
                    + " | ".join(cells)
                    + f" | {ratio(row, key, sizes)} |"
                )
    return "\n".join(lines)


def chart(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stores = [s for s in STORES if any(s in r["stores"] for r in report["runs"].values())]
    fig, axes = plt.subplots(2, len(stores), figsize=(4 * len(stores), 7), squeeze=False)
    styles = {"before": ("#c44e52", "--"), "after": ("#4c72b0", "-")}
    for col, store in enumerate(stores):
        for row, (keys, title) in enumerate(
            (
                (("startup_s",), "start-up"),
                (("commit_s", "nodata_commit_s"), "commit per batch"),
            )
        ):
            ax = axes[row][col]
            for label, run in report["runs"].items():
                data = run["stores"].get(store)
                if not data:
                    continue
                color, line = styles.get(label, ("#55a868", "-."))
                for key in keys:
                    xs = [n for n in run["sizes"] if data.get(str(n), {}).get(key)]
                    ys = [data[str(n)][key] for n in xs]
                    if not xs:
                        continue
                    marker = "o" if key != "nodata_commit_s" else "s"
                    what = "" if len(keys) == 1 else (" data" if key == "commit_s" else " no-data")
                    ax.plot(xs, ys, line, color=color, marker=marker, label=f"{label}{what}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_title(f"{store}: {title}")
            ax.set_xlabel("ledger entries")
            ax.set_ylabel("seconds")
            ax.legend(fontsize=7)
    loads = ", ".join(
        f"{label} {run.get('load_1min_at_start', 0):.1f}" for label, run in report["runs"].items()
    )
    fig.suptitle(f"sparkonce ledger history: time by ledger length (1-min load at start: {loads})")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", default="10,1000", help="ledger entries, comma-separated (1e6 works)"
    )
    parser.add_argument("--stores", default=",".join(STORES))
    parser.add_argument("--label", default="after", help="this run's name in the results file")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="sparkonce to measure")
    parser.add_argument("--starts", type=int, default=3, help="start-ups per size")
    parser.add_argument("--batches", type=int, default=5, help="data (and no-data) commits")
    parser.add_argument("--tasks", type=int, default=2, help="Kafka task markers per batch")
    parser.add_argument("--delta-window", type=int, default=10_000, help="entry files written")
    parser.add_argument(
        "--kafka-ledger",
        choices=("current", "pre-snapshot"),
        default="current",
        help="the synthesized ledger topic: with snapshot records, as the code under test "
        "writes them (default), or without, as sparkonce wrote it before snapshots (a first "
        "start then reads it whole, once)",
    )
    parser.add_argument("--bootstrap", help="use this Kafka broker instead of starting one")
    parser.add_argument("--pg-url", help="use this PostgreSQL server instead of starting one")
    parser.add_argument("--out", default="history", help="results/NAME.json and NAME.png")
    parser.add_argument(
        "--markdown", action="store_true", help="print the README table from the results file"
    )
    args = parser.parse_args(argv)
    output = RESULTS / f"{args.out}.json"
    report: dict[str, Any] = {"benchmark": "history", "runs": {}}
    if output.exists():
        report = json.loads(output.read_text())
    if args.markdown:
        print(markdown(report))
        return 0
    args.stores = [s.strip() for s in args.stores.split(",") if s.strip()]
    unknown = sorted(set(args.stores) - set(STORES))
    if unknown:
        raise SystemExit(f"unknown store(s) {unknown}; choose from {', '.join(STORES)}")
    sizes = sorted(parse_size(s) for s in args.sizes.split(",") if s.strip())
    sys.path.insert(0, str(args.src.resolve()))
    import sparkonce

    src = Path(sparkonce.__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        commit = "unknown"
    from rich.console import Console

    console = Console(width=150)
    console.print(f"measuring sparkonce from {src} (commit {commit}), label {args.label!r}")
    previous = report["runs"].get(args.label, {})
    run: dict[str, Any] = {
        "sizes": sorted(set(previous.get("sizes", [])) | set(sizes)),
        "src": str(src),
        "commit": commit,
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{os.cpu_count()} cores, {platform.platform()}",
        "load_1min_at_start": load(),
        "stores": previous.get("stores", {}),  # a run of some stores or sizes adds to it
    }
    work = Path(tempfile.mkdtemp(prefix="sparkonce-history-"))
    try:
        with services(args) as env:
            for store in args.stores:
                for n in sizes:
                    console.print(f"[bold]{store}[/] with {n:,} entries ...")
                    r = measure_store(store, n, args, env, work)
                    run["stores"].setdefault(store, {})[str(n)] = r
                    console.print(
                        f"  built in {r['build_s']:.1f} s; start-up first "
                        f"{fmt_s(r['startup_first_s'])}, then {fmt_s(r['startup_s'])}; "
                        f"commit {fmt_s(r['commit_s'])}, no-data "
                        f"{fmt_s(r['nodata_commit_s'])} {r.get('nodata_error', '')}"
                    )
                    report["runs"][args.label] = run  # saved after every size
                    output.parent.mkdir(parents=True, exist_ok=True)
                    output.write_text(json.dumps(report, indent=1) + "\n")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    run["load_1min_at_end"] = load()
    output.write_text(json.dumps(report, indent=1) + "\n")
    print_table(report, args.label)
    chart(report, output.with_suffix(".png"))
    console.print(f"wrote {output} and {output.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
