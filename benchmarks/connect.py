"""Each sink on a Spark Connect session against the same sink on a classic session, measured
side by side in one run.

Run from the repository root (``make bench-connect`` does, with its defaults)::

    .venv/bin/python benchmarks/connect.py --records 40000 --batch-records 2000 --repeat 3

Each timed run is a child process of its own, since a classic SparkContext and PySpark's
local Connect server do not share one Python process: ``classic`` builds a ``local[2]``
session (:func:`sparkonce.spark.session.build_session`), ``connect`` starts PySpark's own
Connect server (``SparkSession.builder.remote("local[2]")``). The child writes
``--records`` records of the embedded log (two partitions, values ``1..records``) into a
fresh sink in batches of ``--batch-records``, after a warm-up run of the same pipeline shape
into the same kind of sink on a small log, and times ``Pipeline.run`` alone (the session's
start is not counted). The variants alternate (classic first in odd rounds, Connect first in
even ones), ``--repeat`` rounds of every sink in ``--sinks``:

- ``sqlite``: ``SQLiteSink`` (append), a fresh file;
- ``delta``: ``DeltaSink`` (append), a fresh table; the session gets Delta's jars, extension
  and catalog (the server's, on Connect). On a classic session the sink commits through
  Delta's JVM classes, on Connect through Spark's writer with the log read by sparkonce
  (:mod:`sparkonce.spark.delta_log`);
- ``postgres``: ``PostgresSink`` (append; the driver inserts each batch), and
  ``postgres-2pc``: ``PostgresTwoPhaseSink`` (append; the executors pre-commit, the driver
  flips), each run in a fresh database of one throwaway PostgreSQL server
  (``tests/services/postgres.py``, started by this script; the binaries:
  ``scripts/ensure-postgres.sh``);
- ``kafka``: ``KafkaSink`` into a fresh two-partition topic of one throwaway single-node
  broker from the pinned jars (``tests/services/kafka.py``, as ``benchmarks/kafka.py``
  starts it; its transaction and group coordinators warmed before any run, so no variant
  pays for their creation).

After its run each child reads the sink back with a reader of its own, not with sparkonce
or Spark: ``sqlite3``, pyarrow over the Delta log's live Parquet files, psycopg, and
confluent-kafka's consumer at ``read_committed``; it fails (and the whole benchmark with
it) if a value is missing, repeated or foreign (:func:`check_values`). A fast but wrong run
cannot win.

``summary[sink][variant]`` holds each variant's median seconds per run, per batch, and the
median start of its session; ``summary[sink]["connect"]`` also holds Connect's ratio to
classic and its extra milliseconds per batch (the ``foreachBatch`` round trip through the
server's Python worker, which a classic session does not make). Written to
``benchmarks/results/connect.json`` (``--output``, which keeps the file's dated notes) after
every run: ``complete`` is false, and ``what`` says how many runs there are of how many,
until the last one, so a run that fails late leaves what was measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, warm_coordinators, write_results  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "connect.json"
VARIANTS = ("classic", "connect")
SINKS = ("sqlite", "delta", "postgres", "postgres-2pc", "kafka")
# What each sink is, in the report's "what".
SINK_WHAT = {
    "sqlite": "SQLiteSink append",
    "delta": "DeltaSink append",
    "postgres": "PostgresSink append",
    "postgres-2pc": "PostgresTwoPhaseSink append",
    "kafka": "KafkaSink",
}
TOPIC_PARTITIONS = 2
# Ways to spoil a finished run's sink before it is read back (``--tamper``, SQLite only):
# the smoke test's proof that the row check catches a missing and a repeated row, and a
# repeated row alone.
TAMPER = ("drop-and-repeat", "repeat")


def make_log(root: Path, records: int, start: int = 1) -> Path:
    """Topic ``events`` with two partitions and values ``start..start+records-1``."""
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(root, "events", 2, exist_ok=True)
    with topic, IdempotentProducer(topic, "bench-producer") as producer:
        for i in range(start, start + records):
            producer.send(str(i).encode(), f"k{i % 8}".encode())
    return root


def make_sink(sink: str, where: str, table: str) -> Any:
    """The sink ``sink`` at ``where``: the SQLite file or Delta table's directory, the
    database's URL, or the broker's address (the output topic is ``table``)."""
    from sparkonce import DeltaSink, KafkaSink, sink_from_url

    if sink == "delta":
        return DeltaSink(where)
    if sink == "kafka":
        return KafkaSink(where, table)
    if sink == "sqlite":
        return sink_from_url(f"sqlite:///{where}", table)
    return sink_from_url(where, table, two_phase=sink == "postgres-2pc")


def pipeline(
    name: str, log: Path, sink: Any, checkpoint: Path, batch_records: int, kafka: bool
) -> Any:
    """The benchmark's pipeline: every record's value as a number (``record_id``,
    ``value``), or as a Kafka record's key and value."""
    from pyspark.sql import functions as F

    from sparkonce import EmbeddedLogSource, Pipeline

    def transform(df: Any) -> Any:
        if kafka:
            return df.select(
                F.col("key").cast("string").alias("key"),
                F.col("value").cast("string").alias("value"),
            )
        return df.select("record_id", F.col("value").cast("string").cast("long").alias("value"))

    return Pipeline(
        name=name,
        source=EmbeddedLogSource(log, "events", max_records_per_partition=batch_records // 2),
        sink=sink,
        checkpoint=checkpoint,
        transform=transform,
    )


def session(variant: str, sink: str) -> Any:
    """A classic ``local[2]`` session, or a client of PySpark's local Connect server; with
    Delta's jars, extension and catalog for the Delta sink (the server's, on Connect)."""
    from sparkonce.sinks.delta import delta_spark_conf
    from sparkonce.spark.session import build_session

    conf = {
        **(delta_spark_conf() if sink == "delta" else {}),
        # How long a Python worker waits to connect and authenticate to its JVM (default
        # 15 s): on a 2-core machine at a load of 15 (other agents' Spark sessions), a
        # streaming source's worker timed out so, and the run failed before its first
        # batch. The JVM's own wait for a new worker is not this setting: it timed out too
        # at that load ("Timed out while waiting for the Python worker to connect back").
        "spark.python.authenticate.socketTimeout": "120s",
    }
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


# -- reading each sink back, without sparkonce or Spark --------------------------------------


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


def kafka_values(bootstrap: str, topic: str) -> list[int]:
    """Every committed record's value in ``topic``, read whole by confluent-kafka's consumer
    at ``read_committed`` (an aborted or open transaction's records are not seen). A value
    that is no integer reads as 0, which :func:`check_values` counts as foreign."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-check-{os.getpid()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    values: list[int] = []
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        parts = [TopicPartition(topic, p, 0) for p in sorted(meta.partitions)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=30)[1] for tp in parts}
        consumer.assign(parts)
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 120
        while len(done) < len(ends):
            if time.monotonic() > deadline:
                raise SystemExit(f"reading {topic}: partitions not at their end after 120 s")
            msg = consumer.poll(1)
            if msg is None:
                # A transactional partition ends with a commit marker no poll returns.
                positions = consumer.position(parts)
                done |= {tp.partition for tp in positions if tp.offset >= ends[tp.partition]}
                continue
            if msg.error() is not None:
                raise SystemExit(f"reading {topic}: {msg.error()}")
            try:
                values.append(int(msg.value() or b""))
            except ValueError:
                values.append(0)
            partition, offset = msg.partition(), msg.offset()
            if partition is not None and offset is not None and offset + 1 >= ends[partition]:
                done.add(partition)
    finally:
        consumer.close()
    return values


def read_back(sink: str, where: str, table: str) -> list[int]:
    """The values the finished run left in its sink, by the sink's own kind of client."""
    if sink == "delta":
        return delta_values(Path(where))
    if sink == "kafka":
        return kafka_values(where, table)
    if sink == "sqlite":
        with sqlite3.connect(where) as conn:
            return [v for (v,) in conn.execute(f"SELECT value FROM {table}")]
    import psycopg

    with psycopg.connect(where) as conn:
        return [int(v) for (v,) in conn.execute(f"SELECT value FROM {table}")]


def check_values(values: Iterable[int], records: int) -> dict[str, Any]:
    """Every value ``1..records`` exactly once in ``values``? The counts of rows, missing,
    repeated and foreign values; ``missing == repeated == foreign == 0`` when it is so."""
    counts = Counter(values)
    missing = [v for v in range(1, records + 1) if v not in counts]
    repeated = {v: n for v, n in counts.items() if 1 <= v <= records and n > 1}
    foreign = {v: n for v, n in counts.items() if not 1 <= v <= records}
    return {
        "rows": sum(counts.values()),
        "missing": len(missing),
        "repeated": sum(n - 1 for n in repeated.values()),
        "foreign": sum(foreign.values()),
        "first_missing": missing[:5],
        "first_repeated": sorted(repeated)[:5],
    }


def tamper(sink: str, where: str, table: str, how: str) -> None:
    """Spoil a finished run's SQLite sink: value 2's row written twice, and with
    ``drop-and-repeat`` value 1 deleted (the count of rows stays right)."""
    if sink != "sqlite":
        raise SystemExit(f"--tamper works on the sqlite sink only, not on {sink}")
    with sqlite3.connect(where) as conn:
        if how == "drop-and-repeat":
            conn.execute(f"DELETE FROM {table} WHERE value = 1")
        conn.execute(f"INSERT INTO {table} SELECT * FROM {table} WHERE value = 2")


# -- one timed run ----------------------------------------------------------------------------


def child(
    variant: str,
    workdir: Path,
    records: int,
    batch_records: int,
    sink: str = "sqlite",
    target: str | None = None,
    spoil: str | None = None,
) -> dict[str, Any]:
    """One timed run (after a warm-up) in this process; the sink's rows checked.

    ``target``: the database URL of a PostgreSQL sink (the run writes table ``out``, the
    warm-up ``warm``), or ``BOOTSTRAP/TOPIC`` of the Kafka sink (the warm-up writes
    ``TOPIC-warm``); the parent made both. The other sinks live in ``workdir``."""
    if sink in ("sqlite", "delta"):
        suffix = ".db" if sink == "sqlite" else ""
        where, warm_where = str(workdir / f"out{suffix}"), str(workdir / f"warm{suffix}")
        table, warm_table = "out", "out"
    elif sink == "kafka":
        assert target is not None, "the kafka sink needs --target BOOTSTRAP/TOPIC"
        where, table = target.split("/", 1)
        warm_where, warm_table = where, f"{table}-warm"
    else:
        assert target is not None, f"the {sink} sink needs --target URL"
        where, warm_where, table, warm_table = target, target, "out", "warm"
    started = time.perf_counter()
    spark = session(variant, sink)
    session_s = time.perf_counter() - started
    kafka = sink == "kafka"
    try:
        warm = pipeline(
            "bench-warm",
            make_log(workdir / "warm-log", 4 * batch_records),
            make_sink(sink, warm_where, warm_table),
            workdir / "warm-chk",
            batch_records,
            kafka,
        )
        warm.run(spark)
        p = pipeline(
            "bench",
            make_log(workdir / "log", records),
            make_sink(sink, where, table),
            workdir / "chk",
            batch_records,
            kafka,
        )
        started = time.perf_counter()
        report = p.run(spark)
        seconds = time.perf_counter() - started
    finally:
        spark.stop()
    if spoil:
        tamper(sink, where, table, spoil)
    check = check_values(read_back(sink, where, table), records)
    if check["missing"] or check["repeated"] or check["foreign"]:
        raise SystemExit(
            f"{variant} ({sink}): the sink holds {check['rows']} rows, not each of the "
            f"{records} values once: {check['missing']} missing (first: "
            f"{check['first_missing']}), {check['repeated']} repeated (first: "
            f"{check['first_repeated']}), {check['foreign']} foreign"
        )
    return {
        "variant": variant,
        "sink": sink,
        "seconds": round(seconds, 3),
        "session_start_s": round(session_s, 3),
        "batches": report.batches_committed,
        "rows": check["rows"],
    }


# -- the parent: services, alternating children, summary --------------------------------------


class Services:
    """The throwaway PostgreSQL server and Kafka broker the chosen sinks need, started the
    way the tests start them, and a fresh database or topic for each run."""

    def __init__(self, root: Path, sinks: list[str]) -> None:
        self.root, self.sinks = root, sinks
        self.pg: Any = None
        self.broker: Any = None
        self._n = 0

    def start(self) -> None:
        from tests.services import kafka as kafka_service
        from tests.services import postgres

        if any(s.startswith("postgres") for s in self.sinks):
            print("starting PostgreSQL ...", flush=True)
            self.pg = postgres.start(self.root / "pg")
        if "kafka" in self.sinks:
            print("starting a Kafka broker ...", flush=True)
            self.broker = kafka_service.start(self.root / "kafka")
            self.broker.create_topic("bench-warm", 1)
            warm_s = warm_coordinators(self.broker.bootstrap, "bench-warm")
            print(f"  its transaction and group coordinators are up ({warm_s:.1f} s)")

    def stop(self) -> None:
        from tests.services import kafka as kafka_service
        from tests.services import postgres

        if self.broker is not None:
            kafka_service.stop(self.root / "kafka")
        if self.pg is not None:
            postgres.stop(self.root / "pg")

    @contextlib.contextmanager
    def target(self, sink: str, variant: str) -> Iterator[str | None]:
        """A fresh database (dropped afterwards) or output topic for one run."""
        self._n += 1
        name = f"bench_{sink.replace('-', '_')}_{variant}_{self._n}"
        if sink.startswith("postgres"):
            url = self.pg.create_database(name)
            try:
                yield url
            finally:
                self.pg.drop_database(name)
        elif sink == "kafka":
            topic = name.replace("_", "-")
            for t in (topic, f"{topic}-warm"):
                self.broker.create_topic(t, TOPIC_PARTITIONS)
            yield f"{self.broker.bootstrap}/{topic}"
        else:
            yield None


def run_child(
    variant: str, records: int, batch_records: int, sink: str, target: str | None = None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"bench-connect-{variant}-") as tmp:
        cmd = [
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
        ]
        if target:
            cmd += ["--target", target]
        done = subprocess.run(
            cmd,
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
    """``{sink: {variant: its median run}}``, in the order the sinks ran; Connect's also
    against classic (its ratio, and its extra milliseconds per batch)."""
    out: dict[str, Any] = {}
    for sink in dict.fromkeys(r["sink"] for r in runs):
        mine = [r for r in runs if r["sink"] == sink]
        if {r["variant"] for r in mine} == set(VARIANTS):  # else no comparison yet
            out[sink] = _summarize(mine)
    return out


def _summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
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
            "session_start_median_s": _median_or_none([r.get("session_start_s") for r in mine]),
        }
    classic, connect = out["classic"], out["connect"]
    connect["ratio"] = round(connect["median_s"] / classic["median_s"], 3)
    connect["extra_per_batch_ms"] = round(connect["per_batch_ms"] - classic["per_batch_ms"], 1)
    return out


def _median_or_none(values: list[float | None]) -> float | None:
    """The median, rounded, or None where a run did not record the value."""
    if not values or None in values:
        return None
    return round(statistics.median(v for v in values if v is not None), 2)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=40_000)
    ap.add_argument("--batch-records", type=int, default=2_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    ap.add_argument(
        "--sinks",
        default=",".join(SINKS),
        help=f"comma-separated, from: {', '.join(SINKS)} (default: all of them)",
    )
    ap.add_argument(
        "--context",
        default="",
        help="a sentence added to the report's what (say, what else ran on the machine)",
    )
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--sink", choices=SINKS, default="sqlite", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    ap.add_argument("--tamper", choices=TAMPER, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.batch_records < 2 or args.records < args.batch_records:
        ap.error("--batch-records must be at least 2 and at most --records")
    sinks = list(dict.fromkeys(s.strip() for s in args.sinks.split(",") if s.strip()))
    if not sinks or any(s not in SINKS for s in sinks):
        ap.error(f"--sinks takes a comma-separated list of {', '.join(SINKS)}")
    if args.child:
        result = child(
            args.child,
            args.workdir,
            args.records,
            args.batch_records,
            args.sink,
            args.target,
            args.tamper,
        )
        print(json.dumps(result))
        return 0
    runs: list[dict[str, Any]] = []
    planned = args.repeat * len(sinks) * len(VARIANTS)
    root = Path(tempfile.mkdtemp(prefix="bench-connect-services-"))
    services = Services(root, sinks)
    try:
        services.start()
        for i in range(args.repeat):
            for sink in sinks:
                for variant in VARIANTS if i % 2 == 0 else reversed(VARIANTS):
                    print(f"run {i + 1}/{args.repeat}: {variant} into {sink} ...", flush=True)
                    with services.target(sink, variant) as target:
                        r = run_child(variant, args.records, args.batch_records, sink, target)
                    runs.append(r)
                    print(
                        f"  {r['seconds']:.1f} s for {r['batches']} batches ({r['rows']} rows; "
                        f"session start {r['session_start_s']:.1f} s)",
                        flush=True,
                    )
                    # After every run, so a later run that fails (on a loaded machine, a
                    # Python worker that does not connect back in time) leaves what was
                    # measured, marked incomplete.
                    write_results(args.output, report_of(args, sinks, runs, planned))
    finally:
        services.stop()
        shutil.rmtree(root, ignore_errors=True)
    summary = report_of(args, sinks, runs, planned)["summary"]
    for sink in sinks:
        c = summary[sink]
        print(
            f"{sink}: {c['classic']['per_batch_ms']} ms per batch classic, "
            f"{c['connect']['per_batch_ms']} ms on Connect ({c['connect']['ratio']}x); "
            f"Connect's extra per batch: {c['connect']['extra_per_batch_ms']} ms"
        )
    print(f"-> {args.output}")
    return 0


def report_of(
    args: argparse.Namespace, sinks: list[str], runs: list[dict[str, Any]], planned: int
) -> dict[str, Any]:
    """The results file's content after ``runs`` of the ``planned`` ones."""
    what = (
        "the embedded log into each sink ("
        + ", ".join(f"{s}: {SINK_WHAT[s]}" for s in sinks)
        + ") on a Spark Connect session (PySpark's local Connect server) against the "
        "same sink on a classic local[2] session, side by side in one run, alternating "
        "child processes; Pipeline.run timed after a warm-up, the session's start not "
        "counted; every run's rows read back by an independent reader, each value once"
    )
    if len(runs) < planned:
        what += f"; INCOMPLETE: {len(runs)} of {planned} runs (the others did not run)"
    if args.context.strip():
        what += f". {args.context.strip()}"
    return {
        "benchmark": "connect",
        "what": what,
        "sinks": sinks,
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "records": args.records,
        "batch_records": args.batch_records,
        "repeat": args.repeat,
        "complete": len(runs) == planned,
        "summary": summarize(runs),
        "runs": runs,
    }


if __name__ == "__main__":
    sys.exit(main())
