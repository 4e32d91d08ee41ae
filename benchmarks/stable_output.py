"""Stable batch output across two stores: its cost, against the same two sinks without it.

Run from the repository root (``make bench-outputs`` does, with 2 million records)::

    .venv/bin/python benchmarks/stable_output.py --records 2000000 --repeat 3

A pipeline with outputs in two stores writes each batch's rows once under its checkpoint
before any store commits, and every store commits from that copy
(``Pipeline(stable_output=True)``, the default across stores; see
:mod:`sparkonce.outputs.stable`). This measures what that costs. The issue's goal: stable
output reaches at least 0.8x the records/s of the same sinks without it.

It writes ``--records`` records (keys ``k0``..``k999``) into an embedded log once (cached in
``.cache/bench``, shared with ``benchmarks/sinks.py``), starts a throwaway PostgreSQL server,
and runs each measurement in a fresh child process, so peak driver memory is measured per
variant. Every variant reads the same log with the same micro-batches (``--batch-records``
per batch, ``local[2]``) and the same transform: the log's value parsed to a long, and two
different projections of it (the realistic case: two DataFrames, so two branches of the
one query; the same DataFrame object for both would be computed once)::

    events = record_id, key, value        audit = record_id, value

1. ``two-stores-stable``: ``events`` into PostgreSQL (:class:`~sparkonce.PostgresSink`,
   table ``events``), ``audit`` into a SQLite file (:class:`~sparkonce.SQLiteSink`, table
   ``audit``), ``stable_output=True``: each batch's outputs are collected once and written
   as Arrow IPC files under the checkpoint, both stores commit from that copy. SQLite
   is the second store by default because two *kinds* of store (a
   database server and the embedded default) is what stable output is for, and it shares
   no server, WAL or fsync with the first; ``--second-store postgres`` puts ``audit`` in a
   second database of the same PostgreSQL server instead.
2. ``two-stores-direct``: the same with ``stable_output=False``: the batch is persisted in
   Spark's cache (memory and disk) and both stores commit from it; a replay would
   recompute it.
3. ``one-store`` (context): both outputs in the same PostgreSQL database: one transaction
   and one ledger row per batch, no stable output (the default for one store).
4. ``single-sink`` (context): today's one-sink pipeline writing only ``events`` to
   PostgreSQL.

(1) and (2) run interleaved, as a pair, in every round (their order swapped each round),
then (3) and (4): ``--repeat`` rounds in all, since the machine may be shared and its
speed drift. Reported per variant, as the median over the rounds: records/s (input
records over the run's wall time, after the session is up: both outputs' rows come from
each record), the driver's peak resident memory (the Python driver and the JVM, from
``VmHWM``), and per-batch commit latency p50/p99 (``BatchReport.seconds``, the whole
``foreachBatch``: computing the batch, the copy, every store's commit). The ratio
stable/direct is the median of (1) over the median of (2), PASS at 0.8 or more; each
round's own ratio is listed too. Two more ratios help read it on a busy machine:
``steady`` records/s counts from the end of the first batch (each variant runs in a fresh
JVM, whose first batch loads and compiles the code it runs), and records per CPU second
(``cpu_s``: the child process
and its descendants, by role: the Python driver, the JVM, which runs the tasks in
``local[2]``, and Spark's Python workers, which run the source's reads; the JVM's share is
split by thread: tasks, JIT compiler, GC, other), which other runs on the same cores
disturb far less than wall time.

Where the time goes (the ``split``, seconds per batch): the child wraps a few library
functions with timers, no source change. ``copy.write`` is writing the copy: here both
stores' sinks collect their rows on the driver, so it is :meth:`StableOutput.put_tables`
(the batch computed and persisted once, each output collected with ``toArrow``, written
as Arrow IPC files, fsynced, manifest, rename; :meth:`StableOutput.put`, Spark's Parquet
writer, when a sink stages in Spark tasks), with ``copy.collect_rows`` (persist and the
``toArrow`` calls) and ``copy.fsync`` (the data files and directories) inside it, plus
the library's own "written: N rows in S s" log lines (``copy_log_s``);
``select.<output>`` is one output's table taken for its sink (stable only; the
dead-letter columns added); ``stage.<table>`` is a sink collecting its output's rows from
a DataFrame
(``two-stores-direct`` and the single-store variants: the read of Spark's cache, the split
filter, ``toArrow`` and Python rows; the first one also computes and caches the batch);
``rows.<table>`` is turning Arrow into Python rows (inside ``stage`` when there is one);
``publish.<table>`` is the rows' insert inside the store's transaction; ``txn.other`` the
rest of the transactions (epoch check, ledger row, commit); ``copy.collect`` deleting
committed copies; ``other`` the rest of ``foreachBatch``; ``outside`` the run's time
outside ``foreachBatch`` (starting the query, then Spark's planning and its offset and
commit logs between batches).

Writes ``benchmarks/results/stable-output.json`` and ``benchmarks/results/stable-output.png``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import platform
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import mem_gib as _mem_gib  # noqa: E402
from benchmarks._common import pct as _pct  # noqa: E402
from benchmarks._common import peak_rss_mb, write_results  # noqa: E402
from benchmarks.sinks import _fmt, _log_records, make_log  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
PARTITIONS = 4
GOAL = 0.8
STABLE, DIRECT = "two-stores-stable", "two-stores-direct"
PAIR = (STABLE, DIRECT)
VARIANTS = (STABLE, DIRECT, "one-store", "single-sink")


def transform(df: Any) -> dict[str, Any]:
    """The log's value parsed to a long; two different projections of it."""
    from pyspark.sql import functions as F

    parsed = df.select(
        F.col("record_id"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )
    return {"events": parsed, "audit": parsed.select("record_id", "value")}


def events_only(df: Any) -> Any:
    return transform(df)["events"]


# -- one variant, in a child process ------------------------------------------------------------


class Split:
    """Seconds spent in a few library functions, by label (the child's cheap profile)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, owner: Any, attr: str, label: str | Callable[..., str]) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            name = label(*args) if callable(label) else label
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        setattr(owner, attr, timed)


class StableLog(logging.Handler):
    """The library's "stable output ... written: N rows in S s" lines, as (rows, seconds)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.written: list[tuple[int, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "written:" in str(record.msg) and isinstance(record.args, tuple):
            self.written.append((int(record.args[1]), float(record.args[2])))


def instrument() -> tuple[Split, StableLog]:
    from pyspark.sql import DataFrame

    from sparkonce.commit.committer import Committer
    from sparkonce.outputs import stable
    from sparkonce.outputs.output_set import OutputSet
    from sparkonce.sinks.sql import SqlSink

    split = Split()
    split.wrap(stable.StableOutput, "put", "copy.write")
    split.wrap(stable.StableOutput, "put_tables", "copy.write")
    split.wrap(OutputSet, "collect_tables", "copy.collect_rows")
    split.wrap(stable, "_fsync_tree", "copy.fsync")
    split.wrap(stable, "_footer_rows", "copy.footers")
    split.wrap(OutputSet, "_collect", "copy.collect")
    split.wrap(OutputSet, "output_arrow", lambda _set, _table, name, *_: f"select.{name}")
    split.wrap(SqlSink, "prepare", lambda sink, *_: f"stage.{sink.table}")
    split.wrap(SqlSink, "prepare_arrow", lambda sink, *_: f"rows.{sink.table}")
    split.wrap(DataFrame, "toArrow", "toArrow")
    split.wrap(SqlSink, "publish", lambda sink, *_: f"publish.{sink.table}")
    split.wrap(Committer, "_transaction", "txn")
    handler = StableLog()
    logger = logging.getLogger("sparkonce.outputs.stable")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return split, handler


def tree_cpu_s(jvm_pid: int) -> dict[str, float]:
    """CPU seconds of this process and its descendants, by role: ``driver`` (this Python
    process), ``jvm`` (Spark's driver JVM, which runs the tasks in ``local[2]``) and
    ``python_workers`` (Spark's Python workers and planner processes: the source's reads),
    reaped children included. That is the variant's own work, which other engineers' test
    runs on the same cores slow down far less than they do wall time."""
    stats: dict[int, tuple[int, float, float]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        own = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        reaped = (int(fields[13]) + int(fields[14])) / tick  # cutime, cstime
        stats[int(entry.name)] = (int(fields[1]), own, reaped)
    me = os.getpid()
    tree, frontier = {me}, [me]
    while frontier:
        parent = frontier.pop()
        children = [pid for pid, (ppid, _, _) in stats.items() if ppid == parent]
        tree.update(children)
        frontier += children
    out = {"driver": 0.0, "jvm": 0.0, "python_workers": 0.0}
    for pid in tree & set(stats):
        _, own, reaped = stats[pid]
        if pid == me:
            out["driver"] += own + reaped
        elif pid == jvm_pid:
            out["jvm"] += own
            out["python_workers"] += reaped  # processes the JVM started and reaped
        else:
            out["python_workers"] += own + reaped
    return out


JVM_THREADS = (  # /proc comm prefixes (15 characters at most) -> what the thread does
    ("Executor task", "tasks"),
    ("C2 Compiler", "jit"),
    ("C1 Compiler", "jit"),
    ("GC Thread", "gc"),
    ("G1 ", "gc"),
)


def jvm_threads_cpu_s(jvm_pid: int) -> dict[int, tuple[str, float]]:
    """CPU seconds of each live JVM thread (tid -> (kind, seconds)), kinds from JVM_THREADS."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{jvm_pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = next((k for prefix, k in JVM_THREADS if comm.startswith(prefix)), "other")
        out[int(task.name)] = (kind, (int(fields[11]) + int(fields[12])) / tick)
    return out


def _jvm_split(before: dict, after: dict, jvm_total: float) -> dict[str, float]:
    split: dict[str, float] = defaultdict(float)
    for tid, (kind, seconds) in after.items():
        split[kind] += seconds - before.get(tid, (kind, 0.0))[1]
    split["exited threads"] = jvm_total - sum(split.values())
    return dict(split)


def run_variant(name: str, args: argparse.Namespace) -> dict:
    from sparkonce import EmbeddedLogSource, Pipeline, PostgresSink, SQLiteSink
    from sparkonce.pipeline import build_session

    split, stable_log = instrument()
    work = Path(args.work)
    log_dir = make_log(args.records)
    spark = build_session()
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    per_partition = max(1, args.batch_records // PARTITIONS)
    source = EmbeddedLogSource(log_dir, "events", max_records_per_partition=per_partition)
    events = PostgresSink(args.url, "events")
    if name in PAIR:
        audit: Any = (
            PostgresSink(args.url2, "audit")
            if args.second_store == "postgres"
            else SQLiteSink(f"sqlite:///{work / 'audit.db'}", "audit")
        )
        outputs = {"events": events, "audit": audit}
    else:
        outputs = {"events": events, "audit": PostgresSink(args.url, "audit")}
    common: dict[str, Any] = {
        "name": "bench-stable-output",
        "source": source,
        "checkpoint": work / "checkpoint",
    }
    if name == "single-sink":
        pipeline = Pipeline(sink=events, transform=events_only, **common)
    elif name == "one-store":
        pipeline = Pipeline(outputs=outputs, transform=transform, **common)
    else:
        pipeline = Pipeline(
            outputs=outputs, transform=transform, stable_output=name == STABLE, **common
        )
    stores = len(pipeline.output_set.groups) if pipeline.output_set else 1
    stable_on = bool(pipeline.output_set and pipeline.output_set.stable)
    records = _log_records(log_dir)
    latencies: list[float] = []
    ends: list[tuple[float, int]] = []  # (when each batch ended, its input records)

    def on_batch(b: Any) -> None:
        latencies.append(b.seconds)
        ends.append((time.perf_counter(), b.ranges.count))

    cpu_before, threads_before = tree_cpu_s(jvm_pid), jvm_threads_cpu_s(jvm_pid)
    started = time.perf_counter()
    report = pipeline.run(spark, on_batch=on_batch)
    seconds = time.perf_counter() - started
    # After the first batch: the JVM has loaded and compiled the batch's code paths.
    steady = (records - ends[0][1]) / (ends[-1][0] - ends[0][0]) if len(ends) > 1 else None
    cpu_split = {k: v - cpu_before[k] for k, v in tree_cpu_s(jvm_pid).items()}
    jvm_split = _jvm_split(threads_before, jvm_threads_cpu_s(jvm_pid), cpu_split["jvm"])
    cpu_s = sum(cpu_split.values())
    per_output: dict[str, int] = defaultdict(int)
    for b in report.batches:
        for out, n in b.result.per_output.items():
            per_output[out] += n
    result = {
        "records": records,
        "rows_committed": report.rows_committed,
        "rows_per_output": dict(per_output),
        "stores": stores,
        "stable_output": stable_on,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "steady_records_per_s": steady,
        "cpu_s": cpu_s,
        "cpu_split_s": cpu_split,
        "jvm_cpu_split_s": jvm_split,
        "records_per_cpu_s": records / cpu_s,
        "python_driver_peak_mb": peak_rss_mb(),
        "jvm_driver_peak_mb": peak_rss_mb(jvm_pid),
        "batches": len(latencies),
        "commit_p50_s": _pct(latencies, 50),
        "commit_p99_s": _pct(latencies, 99),
        "split_s": _split(split, latencies, seconds),
        "copy_log_s": sum(s for _, s in stable_log.written),
        "copy_log_rows": sum(n for n, _ in stable_log.written),
    }
    _check_rows(name, args, work, records)
    spark.stop()
    return result


def _split(split: Split, latencies: list[float], seconds: float) -> dict[str, float]:
    """Total seconds per part of the run (see the module docstring); they add up to the run."""
    s = dict(split.seconds)
    out: dict[str, float] = {}
    for key in ("copy.write", "copy.collect_rows", "copy.fsync", "copy.footers", "copy.collect"):
        if key in s:
            out[key] = s[key]
    stage = {k: v for k, v in s.items() if k.startswith("stage.")}
    select = {k: v for k, v in s.items() if k.startswith("select.")}
    rows = {k: v for k, v in s.items() if k.startswith("rows.")}
    publish = {k: v for k, v in s.items() if k.startswith("publish.")}
    out.update(sorted(select.items()))
    out.update(sorted(stage.items()))
    out.update(sorted(rows.items()))
    if "toArrow" in s:
        out["toArrow"] = s["toArrow"]  # inside copy.write or the stage.* times
    out.update(sorted(publish.items()))
    out["txn.other"] = s.get("txn", 0.0) - sum(publish.values())
    in_batches = sum(latencies)
    counted = sum(s.get(k, 0.0) for k in ("copy.write", "copy.collect", "txn"))
    counted += sum(stage.values()) + sum(select.values())
    if not stage:  # rows.* are inside stage.* when a sink collected from a DataFrame
        counted += sum(rows.values())
    out["other"] = in_batches - counted
    out["outside"] = seconds - in_batches
    return out


def _check_rows(name: str, args: argparse.Namespace, work: Path, records: int) -> None:
    """Every record reached every output once (a benchmark that lost rows measures nothing)."""
    import psycopg

    def count(url: str, table: str) -> int:
        with psycopg.connect(url) as conn:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    counts = {"events": count(args.url, "events")}
    if name == "one-store":
        counts["audit"] = count(args.url, "audit")
    elif name in PAIR and args.second_store == "postgres":
        counts["audit"] = count(args.url2, "audit")
    elif name in PAIR:
        with contextlib.closing(sqlite3.connect(work / "audit.db")) as db:
            counts["audit"] = int(db.execute("SELECT count(*) FROM audit").fetchone()[0])
    wrong = {k: v for k, v in counts.items() if v != records}
    if wrong:
        raise SystemExit(f"{name}: expected {records:,} rows per output, found {counts}")


# -- the parent: run everything, report ----------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000_000)
    ap.add_argument("--batch-records", type=int, default=200_000, help="records per micro-batch")
    ap.add_argument("--repeat", type=int, default=3, help="rounds (each runs every variant)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument(
        "--second-store",
        choices=("sqlite", "postgres"),
        default="sqlite",
        help="where the two-store variants put 'audit'",
    )
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--url2", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.repeat < 1 or args.records < 1 or args.batch_records < 1:
        ap.error("--records, --batch-records and --repeat must be at least 1")
    if args.variant:
        result = run_variant(args.variant, args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 120)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    make_log(args.records)  # once, before the children race to create it
    from tests.services import postgres

    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    wall = time.perf_counter()
    load_before = os.getloadavg()
    pg_dir = Path(tempfile.mkdtemp(prefix="sparkonce-bench-pg-"))
    server = postgres.start(pg_dir)
    work_root = Path(tempfile.mkdtemp(prefix="sparkonce-bench-stable-"))
    runs: dict[str, list[dict]] = {name: [] for name in wanted}
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    try:
        pg_version = _pg_version(server.url)
        for round_no in range(args.repeat):
            for name in _round_order(wanted, round_no):
                console.print(
                    f"[bold]{name}[/] (round {round_no + 1}/{args.repeat}, "
                    f"{args.records:,} records)..."
                )
                db = f"bench_{name.replace('-', '_')}_{round_no}"
                work = work_root / f"{name}-{round_no}"
                work.mkdir()
                cmd = [
                    sys.executable,
                    __file__,
                    "--variant",
                    name,
                    "--records",
                    str(args.records),
                    "--batch-records",
                    str(args.batch_records),
                    "--second-store",
                    args.second_store,
                    "--url",
                    server.create_database(db),
                    "--url2",
                    server.create_database(db + "_audit"),
                    "--work",
                    str(work),
                ]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
                line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
                if proc.returncode != 0 or not line:
                    console.print(proc.stdout[-3000:], proc.stderr[-5000:])
                    raise SystemExit(f"variant {name} failed (exit {proc.returncode})")
                r = json.loads(line[-1][len("RESULT ") :])
                r["round"] = round_no + 1
                r["load_avg_1m_after"] = os.getloadavg()[0]
                runs[name].append(r)
                shutil.rmtree(work, ignore_errors=True)
                console.print(
                    f"  {r['records']:,} records in {r['seconds']:.1f} s: "
                    f"{r['records_per_s']:,.0f} records/s, p50 {_fmt(r['commit_p50_s'])} s"
                )
    finally:
        postgres.stop(pg_dir)
        shutil.rmtree(pg_dir, ignore_errors=True)
        shutil.rmtree(work_root, ignore_errors=True)
    facts = {
        "wall_s": time.perf_counter() - wall,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "postgres": pg_version,
    }
    report = summarize(runs, args, facts)
    print_report(console, report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_results(RESULTS / "stable-output.json", report)
    chart(report, RESULTS / "stable-output.png")
    console.print(
        "wrote benchmarks/results/stable-output.json and benchmarks/results/stable-output.png "
        f"(wall time {facts['wall_s'] / 60:.1f} min)"
    )


def _round_order(wanted: list[str], round_no: int) -> list[str]:
    """The pair first, in alternating order (A B, B A, ...), then the context variants."""
    pair = [v for v in PAIR if v in wanted]
    if round_no % 2:
        pair.reverse()
    return pair + [v for v in wanted if v not in PAIR]


def _pg_version(url: str) -> str:
    import psycopg

    with psycopg.connect(url) as conn:
        return str(conn.execute("SHOW server_version").fetchone()[0])


def summarize(runs: dict[str, list[dict]], args: argparse.Namespace, facts: dict) -> dict:
    import pyspark

    results: dict[str, dict] = {}
    for name, rs in runs.items():
        med = functools.partial(_median, rs)
        keys = sorted({k for r in rs for k in r["split_s"]}, key=_split_order)
        batches = med("batches") or 1
        results[name] = {
            "records": rs[0]["records"],
            "rows_committed": rs[0]["rows_committed"],
            "rows_per_output": rs[0]["rows_per_output"],
            "stores": rs[0]["stores"],
            "stable_output": rs[0]["stable_output"],
            "records_per_s": med("records_per_s"),
            "records_per_s_runs": [round(r["records_per_s"]) for r in rs],
            "seconds": med("seconds"),
            "steady_records_per_s": med("steady_records_per_s"),
            "cpu_s": med("cpu_s"),
            "records_per_cpu_s": med("records_per_cpu_s"),
            "cpu_split_s": _median_dict(rs, "cpu_split_s"),
            "jvm_cpu_split_s": _median_dict(rs, "jvm_cpu_split_s"),
            "python_driver_peak_mb": med("python_driver_peak_mb"),
            "jvm_driver_peak_mb": med("jvm_driver_peak_mb"),
            "batches": rs[0]["batches"],
            "commit_p50_s": med("commit_p50_s"),
            "commit_p99_s": med("commit_p99_s"),
            "split_per_batch_s": {
                k: statistics.median(r["split_s"].get(k, 0.0) for r in rs) / batches for k in keys
            },
            "copy_log_s_per_batch": med("copy_log_s") / batches,
            "runs": rs,
        }
    ratios: dict[str, float | None] = {}
    per_round: list[float] = []
    if STABLE in results and DIRECT in results:
        for key in ("records_per_s", "steady_records_per_s", "records_per_cpu_s"):
            a, b = results[STABLE][key], results[DIRECT][key]
            ratios[key] = a / b if a and b else None
        per_round = [
            a["records_per_s"] / b["records_per_s"]
            for a, b in zip(runs[STABLE], runs[DIRECT], strict=True)
        ]
    ratio = ratios.get("records_per_s")
    cpu = platform.processor() or platform.machine()
    return {
        "benchmark": "stable-output",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {_mem_gib():.0f} GiB, {cpu}, Spark local[2]",
        "environment": {
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "postgres": facts["postgres"],
            "sqlite": sqlite3.sqlite_version,
            "commit": _git_head(),
            "load_avg_before": facts["load_avg_before"],
            "load_avg_after": facts["load_avg_after"],
            "shared_machine": "other test runs may share the 2 cores; variants interleave",
        },
        "command": (
            f"benchmarks/stable_output.py --records {args.records} --batch-records "
            f"{args.batch_records} --repeat {args.repeat} --second-store {args.second_store}"
        ),
        "wall_s": facts["wall_s"],
        "records": args.records,
        "batch_records": args.batch_records,
        "repeat": args.repeat,
        "second_store": args.second_store,
        "goal": GOAL,
        "ratio_stable_vs_direct": ratio,
        "ratio_per_round": per_round,
        "ratio_steady_state": ratios.get("steady_records_per_s"),
        "ratio_cpu": ratios.get("records_per_cpu_s"),
        "verdict": None if ratio is None else ("PASS" if ratio >= GOAL else "FALLS SHORT"),
        "results": results,
    }


def _median(rs: list[dict], key: str) -> float | None:
    values = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(values) if values else None


def _median_dict(rs: list[dict], key: str) -> dict[str, float]:
    keys = sorted({k for r in rs for k in r[key]})
    return {k: statistics.median(r[key].get(k, 0.0) for r in rs) for k in keys}


SPLIT_ORDER = (
    "copy.write",
    "copy.collect_rows",
    "copy.fsync",
    "copy.footers",
    "select.",
    "stage.",
    "rows.",
    "toArrow",
    "publish.",
    "txn.other",
)


def _split_order(key: str) -> tuple[int, str]:
    rank = next((i for i, p in enumerate(SPLIT_ORDER) if key.startswith(p)), len(SPLIT_ORDER))
    if key == "copy.collect":
        rank = len(SPLIT_ORDER)
    return (rank, key)


def _git_head() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def print_report(console: Any, report: dict) -> None:
    from rich.table import Table

    table = Table(
        title=f"stable output, {report['records']:,} records, {report['batch_records']:,} per "
        f"batch, median of {report['repeat']}, {report['machine']}"
    )
    cols = ("variant", "records/s", "runs", "steady rec/s", "CPU s", "driver peak MB")
    for col in (*cols, "p50 s", "p99 s"):
        table.add_column(col, justify="left" if col in ("variant", "runs") else "right")
    for name, r in report["results"].items():
        steady = r["steady_records_per_s"]
        table.add_row(
            name,
            f"{r['records_per_s']:,.0f}",
            " ".join(f"{v / 1000:.0f}k" for v in r["records_per_s_runs"]),
            "-" if steady is None else f"{steady:,.0f}",
            f"{r['cpu_s']:.1f}",
            f"{r['python_driver_peak_mb']:.0f} + {r['jvm_driver_peak_mb'] or 0:.0f}",
            _fmt(r["commit_p50_s"]),
            _fmt(r["commit_p99_s"]),
        )
    console.print(table)
    split = Table(title="where the time goes: seconds per batch (median over rounds)")
    split.add_column("part")
    names = list(report["results"])
    for name in names:
        split.add_column(name, justify="right")
    keys = sorted(
        {k for r in report["results"].values() for k in r["split_per_batch_s"]}, key=_split_order
    )
    for key in keys:
        split.add_row(
            key,
            *(
                _fmt(report["results"][n]["split_per_batch_s"].get(key))
                if key in report["results"][n]["split_per_batch_s"]
                else "-"
                for n in names
            ),
        )
    console.print(split)
    cpu = Table(title="CPU seconds of the whole run (median over rounds)")
    cpu.add_column("process / JVM threads")
    for name in names:
        cpu.add_column(name, justify="right")
    for group in ("cpu_split_s", "jvm_cpu_split_s"):
        parts = sorted({k for r in report["results"].values() for k in r[group]})
        for part in parts:
            label = part if group == "cpu_split_s" else f"  jvm: {part}"
            cpu.add_row(label, *(_fmt(report["results"][n][group].get(part)) for n in names))
    console.print(cpu)
    ratio = report["ratio_stable_vs_direct"]
    if ratio is not None:
        rounds = ", ".join(f"{x:.2f}" for x in report["ratio_per_round"])
        console.print(
            f"[bold]stable / direct: {ratio:.2f}x[/] records/s (goal {GOAL}x): "
            f"[bold]{report['verdict']}[/]; per round: {rounds}; after the first batch: "
            f"{_fmt(report['ratio_steady_state'])}x; records per CPU second: "
            f"{_fmt(report['ratio_cpu'])}x"
        )


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = list(results)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [1.1, 1]})
    rates = [results[n]["records_per_s"] / 1000 for n in names]
    ys = list(range(len(names)))[::-1]
    ax.barh(ys, rates, color=["#4c72b0" if n in PAIR else "#9aa9c2" for n in names])
    for y, n in zip(ys, names, strict=True):
        ax.plot(
            [v / 1000 for v in results[n]["records_per_s_runs"]],
            [y] * len(results[n]["records_per_s_runs"]),
            "k.",
            markersize=5,
        )
        label = f" {results[n]['records_per_s'] / 1000:,.0f}k/s"
        if n == STABLE and report["ratio_stable_vs_direct"] is not None:
            label += f"  ({report['ratio_stable_vs_direct']:.2f}x direct, {report['verdict']})"
        ax.text(max(results[n]["records_per_s_runs"]) / 1000, y, label, va="center")
    ax.set_yticks(ys, names)
    ax.set_xlabel("input records per second (thousands); dots: each round")
    ax.set_xlim(0, max(rates) * 1.7)
    title = f"{report['records']:,} records, median of {report['repeat']}"
    if report["ratio_stable_vs_direct"] is not None:
        title += (
            f"; stable/direct after the first batch {_fmt(report['ratio_steady_state'])}x, "
            f"per CPU second {_fmt(report['ratio_cpu'])}x"
        )
    ax.set_title(title, fontsize=9)

    parts = sorted(
        {
            k
            for r in results.values()
            for k in r["split_per_batch_s"]
            if k not in ("toArrow", "copy.fsync", "copy.footers")  # inside other parts
        },
        key=_split_order,
    )
    cmap = plt.get_cmap("tab20")
    left = [0.0] * len(names)
    for i, part in enumerate(parts):
        widths = [max(0.0, results[n]["split_per_batch_s"].get(part, 0.0)) for n in names]
        ax2.barh(ys, widths, left=left, color=cmap(i % 20), label=part)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax2.set_yticks(ys, [""] * len(names))
    ax2.set_xlabel("seconds per batch (median over rounds)")
    ax2.set_title("where the time goes", fontsize=10)
    ax2.legend(fontsize=7, loc="lower right", ncol=2)
    fig.suptitle(f"stable batch output, {report['date']}, {report['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
