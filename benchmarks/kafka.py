"""Kafka pipelines side by side: sparkonce's sinks against their at-least-once counterparts.

Run from the repository root (``make bench-kafka`` does, with 5 million records)::

    .venv/bin/python benchmarks/kafka.py --records 5000000

It starts a throwaway single-node Kafka broker from the pinned jars (``tests/services/kafka.py``)
and a throwaway PostgreSQL server (``tests/services/postgres.py``), produces ``--records``
records into one input topic once (4 partitions, round robin; key ``k<i % 1000>``, value the
decimal integer ``i``), and then runs each variant in a fresh child process, so peak driver
memory is per variant. Every variant reads the same topic from its start, on ``local[2]``, in
micro-batches of ``--batch-records`` records (the connector's ``maxOffsetsPerTrigger``, and
``max_records_per_batch`` for sparkonce's ``KafkaSource``), with ``Trigger.AvailableNow``.

The two readers: ``kafkasource`` is sparkonce's :class:`~sparkonce.KafkaSource` (a Python Data
Source over confluent-kafka); ``connector`` is :class:`~sparkonce.SparkKafkaSource`, Spark's own
Kafka connector (``readStream.format("kafka")`` with ``read_committed`` and headers). An
at-least-once baseline reads through the same source object as its effectively-once
counterpart (``source.stream(...)``), so a ratio compares the sinks alone.

Variants (``VARIANTS``; ``COUNTERPART`` gives each effectively-once variant its baseline):

- ``read-kafkasource``, ``read-connector``: the reader alone, Spark's ``noop`` sink: the most
  any sink can reach through that reader.
- Kafka to Kafka (the transform selects ``key, value``; a fresh 4-partition output topic):
  ``k2k-alo-<reader>`` writes with Spark's own Kafka sink (``writeStream.format("kafka")``,
  at-least-once); ``k2k-kafkasink-<reader>`` is sparkonce's :class:`~sparkonce.KafkaSink`,
  each reported against ``k2k-alo-<reader>`` (the same reader), and the ``kafkasource`` one also
  against ``k2k-alo-connector`` (the pipeline that runs in Spark alone).
- Kafka to PostgreSQL, through the connector (rows ``record_id`` = ``"<partition>/<offset>"``,
  ``key``, ``value`` as a bigint): ``k2pg-alo-jdbc`` is ``foreachBatch`` with Spark's JDBC writer
  (the PostgreSQL driver with ``reWriteBatchedInserts=true``, Spark's default ``batchsize``
  1000); ``k2pg-alo-copy`` is ``foreachBatch`` with COPY from the executors (Arrow batches as CSV,
  the way ``PostgresTwoPhaseSink`` writes); ``k2pg-2pc-append`` is
  :class:`~sparkonce.PostgresTwoPhaseSink` in append mode.
- Upsert by ``record_id``: ``k2pg-alo-upsert`` is ``foreachBatch`` where each task COPYs its rows
  into a temporary table and runs ``INSERT ... ON CONFLICT (record_id) DO UPDATE`` from it, in
  one transaction per task (at-least-once); ``k2pg-2pc-upsert`` is ``PostgresTwoPhaseSink`` in
  upsert mode (its commit merges the batch with the same statement).

Reported per variant: records/s (input records over the streaming run, from after the session
is up until the query ends), the ratio to its counterpart (and to ``ALSO_AGAINST``'s baselines:
the connector into Spark's Kafka sink, and the JDBC writer), the driver's peak resident memory
(``VmHWM`` of the Python driver and of the JVM), per-batch commit latency p50/p99 (the time of
each ``foreachBatch`` call or sparkonce commit; for Spark's own sinks, Spark's ``addBatch``
time; the batch's reading is included, as Spark evaluates it lazily inside the sink), and CPU
seconds spent over the run by the driver's process tree (Python driver, JVM, Python workers),
the broker and PostgreSQL (these two only when the script started them, not with
``--bootstrap`` or ``--pg-url``).

Before the first variant, the parent starts the broker's transaction and group coordinators
(``warm_coordinators``): a new broker creates their internal topics on first use, which a
cluster in service has long done, and which only the variants with a transactional producer or
a group commit would otherwise pay for.

After each variant the parent checks its output exactly (outside Spark): every value
``0..records-1`` exactly once in the output topic (read with ``read_committed``) or table, so a
fast but wrong variant fails the run instead of winning it.

``--repeat N`` runs the chosen variants N times, interleaved (A B A B ...), each run with its
own output topic (deleted once checked), checkpoint and database. A variant's records/s is then
pooled over its runs (every record over every second), its ratios are of pooled rates, and
``ratios_per_round`` keeps each round's ratio, so the spread is in the report beside the result.

Writes ``benchmarks/results/kafka.json`` and ``benchmarks/results/kafka.png`` (``--out NAME``:
``NAME.json`` and ``NAME.png`` there; a path with a ``/`` writes next to that path instead).
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import (  # noqa: E402  (after the path)
    cpu_seconds,
    machine,
    pct,
    peak_rss_mb,
    pool_runs,
    tree_cpu_seconds,
    warm_coordinators,
    write_results,
)

RESULTS = REPO / "benchmarks" / "results"
PARTITIONS = 4
KEYS = 1000
INPUT_TOPIC = "bench-in"

# name -> (scenario, reader, sink, guarantee)
VARIANTS: dict[str, tuple[str, str, str, str]] = {
    "read-kafkasource": ("read", "kafkasource", "Spark noop sink", "-"),
    "read-connector": ("read", "connector", "Spark noop sink", "-"),
    "k2k-alo-kafkasource": ("kafka-to-kafka", "kafkasource", "Spark Kafka sink", "at-least-once"),
    "k2k-kafkasink-kafkasource": ("kafka-to-kafka", "kafkasource", "KafkaSink", "effectively-once"),
    "k2k-alo-connector": ("kafka-to-kafka", "connector", "Spark Kafka sink", "at-least-once"),
    "k2k-kafkasink-connector": ("kafka-to-kafka", "connector", "KafkaSink", "effectively-once"),
    "k2pg-alo-jdbc": (
        "kafka-to-postgres",
        "connector",
        "foreachBatch + Spark JDBC writer",
        "at-least-once",
    ),
    "k2pg-alo-copy": ("kafka-to-postgres", "connector", "foreachBatch + COPY", "at-least-once"),
    "k2pg-2pc-append": (
        "kafka-to-postgres",
        "connector",
        "PostgresTwoPhaseSink append",
        "effectively-once",
    ),
    "k2pg-alo-upsert": (
        "upsert",
        "connector",
        "foreachBatch + COPY + INSERT ON CONFLICT",
        "at-least-once",
    ),
    "k2pg-2pc-upsert": ("upsert", "connector", "PostgresTwoPhaseSink upsert", "effectively-once"),
}
# Each effectively-once variant's at-least-once counterpart: the ratio the goal is about.
COUNTERPART = {
    "k2k-kafkasink-kafkasource": "k2k-alo-kafkasource",
    "k2k-kafkasink-connector": "k2k-alo-connector",
    "k2pg-2pc-append": "k2pg-alo-copy",
    "k2pg-2pc-upsert": "k2pg-alo-upsert",
}
# Further baselines a variant is reported against (the same goal applies).
ALSO_AGAINST = {
    "k2k-kafkasink-kafkasource": ("k2k-alo-connector",),
    "k2pg-2pc-append": ("k2pg-alo-jdbc",),
}
# The least ratio to the counterpart that meets the goal (issue 21).
GOAL = {"k2pg-2pc-upsert": 0.90}
DEFAULT_GOAL = 0.95

PG_TABLES = {
    "k2pg-alo-jdbc": "out_jdbc",
    "k2pg-alo-copy": "out_copy",
    "k2pg-2pc-append": "out_2pc",  # the sink's view over out_2pc__sparkonce_data
    "k2pg-alo-upsert": "out_upsert",
    "k2pg-2pc-upsert": "out_2pc_upsert",
}


def output_topic(run_id: str, name: str) -> str:
    return f"bench-out-{run_id}-{name}"


# -- input ------------------------------------------------------------------------------------


def produce(bootstrap: str, topic: str, records: int) -> float:
    """Write ``records`` records round robin over the partitions; returns the seconds taken."""
    from confluent_kafka import Producer
    from rich.progress import Progress

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "linger.ms": 20,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "log_level": 3,  # errors only (not the broker's "coordinator load in progress")
        }
    )
    failures: list[str] = []

    def report(err: Any, _msg: Any) -> None:
        if err is not None:
            failures.append(str(err))

    started = time.perf_counter()
    with Progress(transient=True) as progress:
        task = progress.add_task(f"producing {records:,} records to {topic}", total=records)
        for i in range(records):
            while True:
                try:
                    producer.produce(
                        topic,
                        b"%d" % i,
                        b"k%d" % (i % KEYS),
                        partition=i % PARTITIONS,
                        on_delivery=report,
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            if i % 50_000 == 0:
                producer.poll(0)
                progress.update(task, completed=i)
        remaining = producer.flush(300)
        progress.update(task, completed=records)
    if remaining or failures:
        raise SystemExit(f"producing failed: {remaining} undelivered, errors: {failures[:3]}")
    return time.perf_counter() - started


# -- one variant, in a child process ------------------------------------------------------------


def k2k_transform(df: Any) -> Any:
    return df.select("key", "value")


def k2pg_transform(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.select(
        F.concat_ws("/", F.col("partition").cast("string"), F.col("offset").cast("string")).alias(
            "record_id"
        ),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )


def _phase_listener() -> Any:
    """A streaming query listener keeping every batch's ``durationMs`` (Spark's phases:
    latestOffset, getBatch, queryPlanning, walCommit, addBatch, commitOffsets,
    triggerExecution), so that a ratio that falls short can be traced to a phase."""
    from pyspark.sql.streaming import StreamingQueryListener

    class Phases(StreamingQueryListener):
        def __init__(self) -> None:
            self.batches: list[dict[str, int]] = []

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            if event.progress.numInputRows > 0:
                self.batches.append(dict(event.progress.durationMs))

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            pass

        def medians(self) -> dict[str, float]:
            rest = self.batches[1:] or self.batches  # the first batch pays the warm-up
            return _medians([{k: float(v) for k, v in b.items()} for b in rest])

    return Phases()


def _medians(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = sorted({k for r in rows for k in r})
    return {k: round(statistics.median(r.get(k, 0.0) for r in rows), 4) for k in keys}


def jdbc_url(url: str) -> str:
    """``postgresql://user[:password]@host:port/db`` as the PostgreSQL JDBC driver's URL."""
    from urllib.parse import quote, unquote, urlsplit

    parts = urlsplit(url)
    query = f"user={quote(unquote(parts.username or ''))}&reWriteBatchedInserts=true"
    if parts.password is not None:
        query += f"&password={quote(unquote(parts.password))}"
    return f"jdbc:postgresql://{parts.hostname}:{parts.port or 5432}{parts.path}?{query}"


def _copy_task(url: str, table: str, batches: Iterator[Any]) -> Iterator[Any]:
    """The at-least-once COPY baseline's executor side: one transaction per task, each Arrow
    batch COPYed as CSV (as PostgresTwoPhaseSink's pre-commit writes it)."""
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv

    n = 0
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            buf = io.BytesIO()
            pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
            with cur.copy(f"COPY {table} (record_id, key, value) FROM STDIN (FORMAT csv)") as cp:
                cp.write(buf.getbuffer())
            n += batch.num_rows
    yield pa.RecordBatch.from_pylist([{"rows": n}], schema=pa.schema([("rows", pa.int64())]))


def _upsert_task(url: str, table: str, batches: Iterator[Any]) -> Iterator[Any]:
    """The at-least-once upsert baseline's executor side: COPY the task's rows into a temporary
    table, then ``INSERT ... ON CONFLICT DO UPDATE`` from it, in one transaction."""
    import psycopg
    import pyarrow as pa
    import pyarrow.csv as pacsv

    n = 0
    with psycopg.connect(url) as conn, conn.cursor() as cur:
        cur.execute(
            "CREATE TEMP TABLE bench_upsert (record_id text, key text, value bigint) ON COMMIT DROP"
        )
        for batch in batches:
            if batch.num_rows == 0:
                continue
            buf = io.BytesIO()
            pacsv.write_csv(batch, buf, pacsv.WriteOptions(include_header=False))
            with cur.copy("COPY bench_upsert FROM STDIN (FORMAT csv)") as cp:
                cp.write(buf.getbuffer())
            n += batch.num_rows
        cur.execute(
            f"INSERT INTO {table} (record_id, key, value) "
            "SELECT record_id, key, value FROM bench_upsert ON CONFLICT (record_id) "
            "DO UPDATE SET key = excluded.key, value = excluded.value"
        )
    yield pa.RecordBatch.from_pylist([{"rows": n}], schema=pa.schema([("rows", pa.int64())]))


def run_variant(name: str, args: argparse.Namespace) -> dict:
    from sparkonce import KafkaSink, Pipeline, PostgresTwoPhaseSink
    from sparkonce.sources.kafka import KafkaSource
    from sparkonce.sources.spark_kafka import SparkKafkaSource, spark_kafka_jars
    from sparkonce.spark.session import build_session, merge_spark_conf

    _scenario, reader, _sink, _guarantee = VARIANTS[name]
    work = Path(args.work)
    bootstrap, url, batch = args.bootstrap, args.url, args.batch_records
    source: KafkaSource
    if reader == "kafkasource":
        source = KafkaSource(bootstrap, args.input_topic, max_records_per_batch=batch)
    else:
        source = SparkKafkaSource(bootstrap, args.input_topic, max_records_per_batch=batch)
    jars: list[str] = []
    if name.startswith("k2k-alo"):  # Spark's Kafka sink is in the connector's jars
        jars += spark_kafka_jars()
    if name == "k2pg-alo-jdbc":
        from tests.services.kafka import jar_dir

        jars += sorted(str(p) for p in jar_dir("jdbc").glob("*.jar"))
    conf = merge_spark_conf(
        source.spark_conf(),
        {"spark.jars": ",".join(jars)} if jars else {},
        {"spark.sql.streaming.numRecentProgressUpdates": "10000"},
    )
    spark = build_session(app_name=f"bench-kafka-{name}", conf=conf, quick_start=args.quick_start)
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    checkpoint = str(work / f"{name}-checkpoint")
    transform = k2pg_transform if name.startswith("k2pg") else k2k_transform
    latencies: list[float] = []
    splits: list[dict[str, float]] = []  # sparkonce's own split of each commit
    records: int | None = 0

    def timed(write: Callable[[Any, int], int | None]) -> Callable[[Any, int], None]:
        def call(df: Any, batch_id: int) -> None:
            nonlocal records
            t0 = time.perf_counter()
            rows = write(df, batch_id)
            latencies.append(time.perf_counter() - t0)
            records = None if rows is None or records is None else records + rows

        return call

    def progress_latencies(q: Any) -> int:
        progress = [p for p in q.recentProgress if p["numInputRows"] > 0]
        latencies.extend(p["durationMs"].get("addBatch", 0) / 1000 for p in progress)
        return sum(int(p["numInputRows"]) for p in progress)

    phases = _phase_listener()
    spark.streams.addListener(phases)
    if name.startswith("k2pg"):
        _create_pg_table(name, url)
    cpu0 = tree_cpu_seconds(os.getpid())
    started = time.perf_counter()
    if name.startswith("read-"):
        q = (
            transform(source.stream(spark, None))
            .writeStream.format("noop")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        records = progress_latencies(q)
    elif name.startswith("k2k-alo"):
        q = (
            transform(source.stream(spark, None))
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", output_topic(args.run_id, name))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        records = progress_latencies(q)
    elif "kafkasink" in name or "2pc" in name:  # sparkonce's sinks, in a Pipeline
        sink: Any
        if "kafkasink" in name:
            sink = KafkaSink(bootstrap, output_topic(args.run_id, name))
        elif name == "k2pg-2pc-append":
            sink = PostgresTwoPhaseSink(url, PG_TABLES[name])
        else:
            sink = PostgresTwoPhaseSink(url, PG_TABLES[name], mode="upsert", keys=["record_id"])
        pipeline = Pipeline(
            name=f"bench-{name}",
            source=source,
            sink=sink,
            checkpoint=checkpoint,
            transform=transform,
        )

        def on_batch(b: Any) -> None:
            latencies.append(b.seconds)
            if b.result.timings:
                splits.append(dict(b.result.timings))

        report = pipeline.run(spark, on_batch=on_batch)
        records = report.rows_committed
    else:  # the foreachBatch baselines into PostgreSQL
        table = PG_TABLES[name]
        write: Callable[[Any, int], int | None]
        if name == "k2pg-alo-jdbc":
            jdbc, props = jdbc_url(url), {"driver": "org.postgresql.Driver"}

            def write(df: Any, _batch_id: int) -> int | None:
                df.write.jdbc(jdbc, table, mode="append", properties=props)
                return None  # Spark's JDBC writer reports no count: the parent counts rows

        else:
            task = _copy_task if name == "k2pg-alo-copy" else _upsert_task

            def write(df: Any, _batch_id: int) -> int | None:
                rows = df.mapInArrow(lambda it: task(url, table, it), "rows BIGINT").collect()
                return sum(int(r["rows"]) for r in rows)

        q = (
            transform(source.stream(spark, None))
            .writeStream.foreachBatch(timed(write))
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
    seconds = time.perf_counter() - started
    cpu = tree_cpu_seconds(os.getpid()) - cpu0
    result = {
        "records": records,
        "seconds": seconds,
        "records_per_s": args.records / seconds,
        "python_driver_peak_mb": peak_rss_mb(),
        "jvm_driver_peak_mb": peak_rss_mb(jvm_pid),
        "batches": len(latencies),
        "commit_p50_s": pct(latencies, 50),
        "commit_p99_s": pct(latencies, 99),
        "commit_s": latencies,
        "driver_tree_cpu_s": cpu,
        # Where each batch's time went, by Spark's own account (median ms over the batches
        # with input, the first left out): addBatch is the sink's write, the rest Spark's.
        "spark_phases_p50_ms": phases.medians(),
        # sparkonce's variants: the committer's split of a commit (look, stage, commit,
        # after), median seconds over the batches but the first.
        "commit_split_p50_s": _medians(splits[1:] or splits),
    }
    spark.stop()
    return result


def _create_pg_table(name: str, url: str) -> None:
    """The baselines' output tables (the two-phase sink creates its own)."""
    import psycopg

    if "2pc" in name:
        return
    key = " PRIMARY KEY" if name == "k2pg-alo-upsert" else ""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {PG_TABLES[name]} (record_id text{key}, key text, value bigint)"
        )


# -- checking each variant's output, outside Spark -----------------------------------------------


def check_topic(bootstrap: str, topic: str, records: int) -> dict:
    """Read ``topic`` whole at ``read_committed``; every value 0..records-1 exactly once?"""
    from confluent_kafka import Consumer, KafkaError, TopicPartition
    from rich.progress import Progress

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-check-{os.getpid()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    seen = bytearray(records)
    count = duplicates = foreign = 0
    try:
        meta = consumer.list_topics(topic, timeout=30).topics[topic]
        partitions = sorted(meta.partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_partitions = set(partitions)
        with Progress(transient=True) as progress:
            task = progress.add_task(f"checking {topic}", total=records)
            last_progress = time.monotonic()
            while open_partitions:
                # consume() waits for a full batch or the timeout: a short one, so the
                # topic's tail costs no long wait; a stall of 120 s fails the check.
                got = consumer.consume(10_000, timeout=0.2)
                if got:
                    last_progress = time.monotonic()
                elif time.monotonic() - last_progress > 120:
                    raise RuntimeError(
                        f"reading {topic}: no record for 120 s, and partitions "
                        f"{sorted(open_partitions)} are not at their end"
                    )
                for m in got:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            open_partitions.discard(m.partition())
                            continue
                        raise RuntimeError(f"reading {topic}: {err}")
                    count += 1
                    try:
                        i = int(m.value())  # type: ignore[arg-type]  # None: TypeError, counted
                    except (TypeError, ValueError):
                        foreign += 1
                        continue
                    if not 0 <= i < records:
                        foreign += 1
                    elif seen[i]:
                        duplicates += 1
                    else:
                        seen[i] = 1
                progress.update(task, completed=count)
    finally:
        consumer.close()
    missing = records - sum(seen)
    return {
        "where": f"topic {topic} (read_committed)",
        "records": count,
        "missing": missing,
        "duplicates": duplicates,
        "foreign": foreign,
        "complete": count == records and missing == duplicates == foreign == 0,
    }


def check_table(url: str, table: str, records: int) -> dict:
    """``table``'s rows: every value 0..records-1 exactly once, under distinct record ids?"""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT count(*), count(DISTINCT record_id), count(DISTINCT value) FILTER "
            "(WHERE value >= 0 AND value < %(n)s), count(*) FILTER (WHERE value IS NULL OR "
            f"value < 0 OR value >= %(n)s) FROM {table}",
            {"n": records},
        ).fetchone()
    assert row is not None
    count, ids, values, foreign = (int(v) for v in row)
    missing, duplicates = records - values, count - foreign - values
    return {
        "where": f"table {table}",
        "records": count,
        "distinct_record_ids": ids,
        "missing": missing,
        "duplicates": duplicates,
        "foreign": foreign,
        "complete": count == ids == records and missing == duplicates == foreign == 0,
    }


# -- the parent: services, input, every variant, report -------------------------------------------


def _run_child(name: str, args: argparse.Namespace, extra: list[str], env: dict) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--variant",
        name,
        "--records",
        str(args.records),
        "--batch-records",
        str(args.batch_records),
        *extra,
    ]
    if args.quick_start:
        cmd.append("--quick-start")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not line:
        raise RuntimeError(
            f"variant {name} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        )
    result: dict = json.loads(line[-1][len("RESULT ") :])
    return result


def _settle_postgres(server: Any, dbname: str) -> None:
    """Drop a checked variant's database and write out the server's dirty pages."""
    import psycopg

    server.drop_database(dbname)
    # A server given with --pg-url may not grant the right: then the checkpoint is skipped.
    with (
        psycopg.connect(server.url, autocommit=True) as conn,
        contextlib.suppress(psycopg.errors.InsufficientPrivilege),
    ):
        conn.execute("CHECKPOINT")


def _postmaster_pid(server: Any) -> int | None:
    if server is None or server.datadir is None:
        return None
    try:
        return int((Path(server.datadir) / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=5_000_000)
    ap.add_argument(
        "--batch-records",
        type=int,
        default=500_000,
        help="records per micro-batch, for every variant (default 500000)",
    )
    ap.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, from: {', '.join(VARIANTS)}",
    )
    ap.add_argument(
        "--out",
        default="kafka",
        help="results name: benchmarks/results/NAME.json and NAME.png (default kafka); "
        "a path with a '/' writes PATH.json and PATH.png",
    )
    ap.add_argument("--bootstrap", help="use this Kafka broker instead of starting one")
    ap.add_argument(
        "--pg-url", help="use this PostgreSQL server (a postgresql:// URL) instead of starting one"
    )
    ap.add_argument(
        "--quick-start",
        action="store_true",
        help="start Spark's JVM with the C1 JIT only (smoke tests: changes timing only)",
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run the variants this many times, interleaved (A B A B ...), and pool each "
        "one's runs (records/s over all of them; memory and commit times of its median run); "
        "every pair's ratio per round is reported too (default 1)",
    )
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--run-id", help=argparse.SUPPRESS)
    ap.add_argument("--input-topic", default=INPUT_TOPIC, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.variant:
        result = run_variant(args.variant, args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from rich.console import Console

    # Not a terminal (make's log, a CI job): wide enough for the table.
    console = Console() if sys.stdout.isatty() else Console(width=200)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown or not wanted:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    if args.records < 1 or args.batch_records < 1:
        raise SystemExit("--records and --batch-records must be positive")
    if args.repeat < 1:
        raise SystemExit(f"--repeat {args.repeat}: give 1 or more")
    out = Path(args.out).absolute() if "/" in args.out else RESULTS / args.out
    out_json, out_png = Path(f"{out}.json"), Path(f"{out}.png")
    from tests.services import kafka as kafka_service
    from tests.services import postgres

    # SIGTERM (a CI timeout, `kill`) unwinds like Ctrl-C, so the finally below stops the
    # throwaway services and subprocess.run kills the running variant.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    if any(v.startswith("k2pg-alo-jdbc") for v in wanted):
        kafka_service.jar_dir("jdbc")  # fetched once, before the children need it
    work = Path(tempfile.mkdtemp(prefix="sparkonce-bench-kafka-"))
    kafka_dir = work / "kafka"
    pg_dir = Path(tempfile.mkdtemp(prefix="sparkonce-bench-kafka-pg-"))
    run_id = f"{os.getpid()}-{int(time.time())}"
    pg_server: Any = None
    broker: Any = None
    runs: dict[str, list[dict]] = {}  # every run of each variant, in order
    failed: list[str] = []
    produce_s = 0.0
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable)
    try:
        if args.bootstrap:
            bootstrap = args.bootstrap
        else:
            with console.status("starting a Kafka broker"):
                broker = kafka_service.start(kafka_dir)
            bootstrap = broker.bootstrap
        if any(v.startswith("k2pg") for v in wanted):
            if args.pg_url:
                pg_server = postgres.PostgresServer.from_url(args.pg_url)
            else:
                with console.status("starting PostgreSQL"):
                    pg_server = postgres.start(pg_dir)
        admin = kafka_service.KafkaBroker(bootstrap, None, None)
        topic = INPUT_TOPIC if broker is not None else f"{INPUT_TOPIC}-{run_id}"
        admin.create_topic(topic, PARTITIONS)
        produce_s = produce(bootstrap, topic, args.records)
        console.print(
            f"produced {args.records:,} records to {topic} in {produce_s:.1f} s "
            f"({args.records / produce_s:,.0f} records/s)"
        )
        warm_s = warm_coordinators(bootstrap, topic)
        console.print(f"the broker's transaction and group coordinators are up ({warm_s:.1f} s)")
        postmaster = _postmaster_pid(pg_server)
        for rep, name in [(r, n) for r in range(args.repeat) for n in wanted]:
            # Each run its own output topic, checkpoint and database (dropped once checked).
            rid = run_id if rep == 0 else f"{run_id}-r{rep}"
            where = work / f"run{rep}"
            where.mkdir(exist_ok=True)
            extra = ["--bootstrap", bootstrap, "--work", str(where), "--run-id", rid]
            extra += ["--input-topic", topic]
            if name.startswith("k2k"):
                admin.create_topic(output_topic(rid, name), PARTITIONS)
            dbname = f"bench_{name.replace('-', '_')}"
            if name.startswith("k2pg"):
                extra += ["--url", pg_server.create_database(dbname)]
            broker_cpu0 = cpu_seconds(broker.pid, children=False) if broker else None
            pg_cpu0 = cpu_seconds(postmaster) if postmaster else None
            round_ = f", run {rep + 1} of {args.repeat}" if args.repeat > 1 else ""
            with console.status(f"{name}: running ({args.records:,} records{round_})"):
                try:
                    r = _run_child(name, args, extra, env)
                except RuntimeError as exc:
                    console.print(f"[red]{exc}[/]")
                    failed.append(name)
                    continue
            if broker is not None and broker_cpu0 is not None:
                r["broker_cpu_s"] = cpu_seconds(broker.pid, children=False) - broker_cpu0
            if postmaster and pg_cpu0 is not None:
                r["postgres_cpu_s"] = cpu_seconds(postmaster) - pg_cpu0
            if name.startswith("k2k"):
                r["check"] = check_topic(bootstrap, output_topic(rid, name), args.records)
                if args.repeat > 1:  # the broker's disk: millions of records a run
                    _delete_topics(bootstrap, output_topic(rid, name))
            elif name.startswith("k2pg"):
                db_url = extra[extra.index("--url") + 1]
                r["check"] = check_table(db_url, PG_TABLES[name], args.records)
                # Checked: drop it, so the next variant does not share the server with
                # autovacuum and checkpoints of this one's millions of rows.
                _settle_postgres(pg_server, dbname)
            else:
                r["check"] = {
                    "where": "Spark's progress (noop sink)",
                    "records": r["records"],
                    "complete": r["records"] == args.records,
                }
            if r["records"] is None:  # the JDBC baseline: rows as counted in the table
                r["records"] = r["check"]["records"]
            runs.setdefault(name, []).append(r)
            ok = "complete" if r["check"]["complete"] else "[red]INCOMPLETE[/]"
            console.print(
                f"[bold]{name}[/]{round_}: {args.records:,} records in {r['seconds']:.1f} s, "
                f"{r['records_per_s']:,.0f} records/s; output {ok} ({r['check']['where']})"
            )
            if not r["check"]["complete"]:
                failed.append(name)
    finally:
        if broker is not None:
            kafka_service.stop(kafka_dir)
        if pg_server is not None and not args.pg_url:
            postgres.stop(pg_dir)
        shutil.rmtree(pg_dir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    results = {name: pool_runs(rs) for name, rs in runs.items()}
    report = summarize(results, args, produce_s, runs)
    print_table(console, report)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_results(out_json, report)
    if results:
        chart(report, out_png)
    console.print(f"wrote {out_json} and {out_png}")
    if failed:
        raise SystemExit(f"failed or incomplete: {', '.join(failed)}")


def _delete_topics(bootstrap: str, topic: str) -> None:
    """Delete a checked output topic and its ledger topic (when the sink made one), and wait
    until the broker no longer lists them."""
    from sparkonce.kafka import KafkaConnection
    from sparkonce.sinks.kafka import LEDGER_SUFFIX

    conn = KafkaConnection(bootstrap)
    for name in (topic, topic + LEDGER_SUFFIX):
        conn.delete_topic(name)


def summarize(
    results: dict[str, dict],
    args: argparse.Namespace,
    produce_s: float,
    runs: dict[str, list[dict]] | None = None,
) -> dict:
    """The report. With several runs a variant's ``records_per_s`` is pooled (``pool_runs``),
    its ratios are of pooled rates, and ``ratios_per_round`` gives each round's ratio (each
    effectively-once run against its counterpart's run of the same round)."""
    runs = runs or {}
    for name, r in results.items():
        scenario, reader, sink, guarantee = VARIANTS[name]
        r.update(scenario=scenario, reader=reader, sink=sink, guarantee=guarantee)
        against = [COUNTERPART[name], *ALSO_AGAINST.get(name, ())] if name in COUNTERPART else []
        r["counterpart"] = COUNTERPART.get(name)
        r["goal"] = GOAL.get(name, DEFAULT_GOAL) if name in COUNTERPART else None
        r["ratios"] = {
            base: r["records_per_s"] / results[base]["records_per_s"]
            for base in against
            if base in results
        }
        if len(runs.get(name, ())) > 1:
            r["ratios_per_round"] = {
                base: [
                    mine["records_per_s"] / theirs["records_per_s"]
                    for mine, theirs in zip(runs[name], runs[base], strict=False)
                ]
                for base in against
                if base in runs
            }
        main_ratio = r["ratios"].get(COUNTERPART.get(name, ""))
        r["vs_counterpart"] = main_ratio
        r["goal_met"] = None if main_ratio is None else main_ratio >= r["goal"]
        r["goal_met_against"] = {b: v >= r["goal"] for b, v in r["ratios"].items()}
    return {
        "benchmark": "kafka",
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "load_average_at_end": os.getloadavg(),
        "records": args.records,
        "batch_records": args.batch_records,
        "repeat": args.repeat,
        "partitions": PARTITIONS,
        "keys": KEYS,
        "quick_start": args.quick_start,
        "produce_s": produce_s,
        "counterpart": COUNTERPART,
        "also_against": {k: list(v) for k, v in ALSO_AGAINST.items()},
        "goal": {n: GOAL.get(n, DEFAULT_GOAL) for n in COUNTERPART},
        "results": results,
        "median_commit_s": statistics.median(
            [r["commit_p50_s"] for r in results.values() if r["commit_p50_s"] is not None] or [0.0]
        ),
    }


def _fmt(v: float | None, spec: str = ".2f") -> str:
    return "-" if v is None else format(v, spec)


def print_table(console: Any, report: dict) -> None:
    from rich.table import Table

    table = Table(title=f"Kafka pipelines, {report['records']:,} records, {report['machine']}")
    for col in (
        "variant",
        "reader -> sink",
        "records/s",
        "vs counterpart",
        "driver peak MB (Py + JVM)",
        "commit p50 s",
        "commit p99 s",
        "CPU s (driver, broker, pg)",
        "output",
    ):
        table.add_column(col, justify="left" if col in ("variant", "reader -> sink") else "right")
    for name, r in report["results"].items():
        ratios = ", ".join(
            f"{v:.2f} ({'ok' if v >= r['goal'] else 'below ' + format(r['goal'], '.2f')})"
            + ("" if b == r["counterpart"] else f" vs {b}")
            for b, v in r["ratios"].items()
        )
        cpu = " / ".join(
            _fmt(r.get(k), ".0f") for k in ("driver_tree_cpu_s", "broker_cpu_s", "postgres_cpu_s")
        )
        table.add_row(
            name,
            f"{r['reader']} -> {r['sink']}",
            f"{r['records_per_s']:,.0f}",
            ratios or "-",
            f"{r['python_driver_peak_mb']:.0f} + {r['jvm_driver_peak_mb']:.0f}",
            _fmt(r["commit_p50_s"]),
            _fmt(r["commit_p99_s"]),
            cpu,
            "complete" if r["check"]["complete"] else "INCOMPLETE",
        )
    console.print(table)
    for name, r in report["results"].items():
        for base, ratios in r.get("ratios_per_round", {}).items():
            each = ", ".join(f"{v:.2f}" for v in ratios)
            console.print(
                f"{name} / {base}: {r['ratios'][base]:.3f}x pooled over {len(ratios)} runs "
                f"(goal {r['goal']}); each round: {each}"
            )


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = list(results)[::-1]
    colors = {"at-least-once": "#dd8452", "effectively-once": "#4c72b0", "-": "#8c8c8c"}
    fig, (ax, mem) = plt.subplots(
        1, 2, figsize=(13, 0.45 * len(names) + 2), gridspec_kw={"width_ratios": [3, 1.4]}
    )
    rates = [results[n]["records_per_s"] / 1000 for n in names]
    bars = ax.barh(names, rates, color=[colors[results[n]["guarantee"]] for n in names])
    for bar, n in zip(bars, names, strict=True):
        ratio = results[n].get("vs_counterpart")
        label = f"{results[n]['records_per_s']:,.0f}/s"
        if ratio is not None:
            label += f"  {ratio:.2f}x {results[n]['counterpart']}"
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, " " + label, va="center")
    ax.set_xlabel("records per second (thousands)")
    ax.set_xlim(0, max(rates) * 1.7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(
        handles,
        ["at-least-once", "effectively-once", "read only"],
        loc="lower center",
        bbox_to_anchor=(0.5, 1.0),
        ncol=3,
        frameon=False,
    )
    py = [results[n]["python_driver_peak_mb"] for n in names]
    jvm = [results[n]["jvm_driver_peak_mb"] for n in names]
    mem.barh(names, py, color="#55a868", label="Python driver")
    mem.barh(names, jvm, left=py, color="#c44e52", label="driver JVM")
    mem.set_yticks([])
    mem.set_xlabel("driver peak memory, MB (VmHWM)")
    mem.legend(loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    repeat = report.get("repeat", 1)
    fig.suptitle(
        f"Kafka pipelines: {report['records']:,} records in batches of "
        f"{report['batch_records']:,}, {report['date']}, {report['machine']}"
        + (f"; records/s pooled over {repeat} interleaved runs" if repeat > 1 else "")
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
