"""What ``dedupe`` costs, with RocksDB's Bloom filters as Spark sets them and as tuned.

Run from the repository root (``make bench-dedup`` does, with 10 million records)::

    .venv/bin/python benchmarks/dedup.py --records 10000000

Issue 18 asks: measure dedup on at least 10 million records with 1% duplicates, with
RocksDB's own Bloom filters at their default, with them tuned, and with an explicit
per-time-bucket Bloom prefilter if one can stay correct across replays; report the
throughput of a dedup pipeline against the same pipeline without dedup (goal: at least
0.8x) and the peak state size.

The input (generated once, cached in ``.cache/bench`` under a name made of its parameters)
    ``--records`` logical records, each with its own record id, plus 1% re-sent copies, in an
    embedded log topic of 4 partitions. A record's id is UUID-shaped (a bijective 64-bit mix
    of its number, so ids are distinct by construction and arrive in random key order, as a
    collector's or client library's UUIDs do; sequential ids would let RocksDB skip files by
    key range alone and understate the lookup cost). Keys are ``k0``..``k999`` and the value
    a decimal integer. The event time (the log's producer-set ``timestamp``) advances
    steadily at ``--rate`` records per second, 2,000 by default: with ``--within`` 5 minutes,
    the dedup state holds about ``2 x within`` of ids, 1.2 million, and 1.4 million at its
    peak with one batch's lag (measured at 3 million records), about 14% of the input, so
    the state is full after the first 14% of the run and the rest measures a steady
    state. Five minutes covers a client's retries after a
    timeout and a collector's restart; 2,000 records a second is a mid-sized service.

    The copies: 1% of the records (``--records // 100``, drawn with a fixed seed) are sent a
    second time, with the same record id, key and value, between 1 and 120 seconds (of
    event time) after the original, and placed in the log among the records of that later
    time: a re-send after a timeout or a restart. Half of them carry the original's event
    time (a client re-sending a stored event), half the time of the re-send (a producer that
    stamps on send). Both are within ``within`` of the original and never behind the
    watermark, so every copy must be removed, and none may be dropped as late.

    A record's partition is its key's number mod 4 (the same for its copy). The four
    partitions then hold the same number of records and their event time advances at the
    same pace per micro-batch. With the log's CRC-32 partitioning the partitions differ by
    a few percent, and with a per-partition read limit the smaller ones run minutes ahead
    in event time over 50 batches, pushing the others' records behind the watermark.

    The generator writes what it made to ``manifest.json`` beside the log: the number of
    distinct ids and of copies. The checks below compare with those, never with what
    dedupe reports about itself.

The variants (each a real :class:`~sparkonce.Pipeline` in a fresh child process, reading
the same log with the same micro-batches, ``--batch-records`` per batch, into the embedded
default sink, :class:`~sparkonce.SQLiteSink`, append mode; ``local[2]``, two shuffle
partitions, :func:`~sparkonce.pipeline.build_session`'s session). The transform parses the
value to a long and projects ``record_id, key, value``; only the dedup step and its state
store settings differ:

1. ``no-dedup``: the baseline; the sink gets every copy.
2. ``rocksdb-default``: ``dedupe(df, "record_id", within=..., event_time="timestamp")``,
   RocksDB state store with changelog checkpointing, as the session sets it.
3. ``rocksdb-tuned``: the same with :data:`TUNED` (below); ``--tune KEY=VALUE`` adds or
   overrides settings (the key without ``spark.sql.streaming.stateStore.rocksdb.``).
4. ``hdfs-state`` (context): Spark's in-memory ``HDFSBackedStateStoreProvider``.
5. ``shuffle-only`` (context): ``no-dedup`` with the shuffle by record id that every
   dedup variant has (``repartition("record_id")``), and no dedup: the part of dedup's
   cost that any keyed dedup pays before it looks at a single id.
6. ``spark-bare`` (context): ``withWatermark(...).dropDuplicatesWithinWatermark`` without
   dedupe's path around the operator for NULL ids (a split after the shuffle by id, which
   Spark reuses for both paths, and a union); this prices that path.

What Spark 4.2.1 configures for RocksDB, read from ``RocksDB.scala`` (line numbers from the
``LineNumberTable`` of the classes in pyspark 4.2.1's ``spark-sql_2.13-4.2.1.jar``, which
match apache/spark's source at that release)
    - The Bloom filter is ``private val bloomFilter = new BloomFilter()`` (line 94), set on
      every SST file's table with ``tableFormatConfig.setFilterPolicy(bloomFilter)`` (line
      102). ``new BloomFilter()`` is RocksDB Java's default: 10 bits per key
      (``DEFAULT_BITS_PER_KEY = 10.0`` in rocksdbjni 9.8.4), a whole-key filter per SST
      file, about 1% false positives. **Nothing in Spark sets the bits per key**, nor
      partitioned filters, ``optimize_filters_for_hits``, or a Bloom filter over the
      memtable (``memtable_prefix_bloom_size_ratio``, ``memtable_whole_key_filtering``):
      these cannot be tuned without changing Spark.
    - ``spark.sql.streaming.stateStore.rocksdb.*`` options (``RocksDBConf``, lines
      2752-2836, defaults in brackets): ``blockSizeKB`` [4] and ``blockCacheSizeMB`` [8,
      per instance] (lines 100-101); ``formatVersion`` [5] (line 103; 5 is the format with
      RocksDB's faster Bloom filter, 6 changes checksums, not filters);
      ``trackTotalNumberOfRows`` [true]; ``compactOnCommit`` [false; with changelog
      checkpointing it compacts only when a snapshot is taken, every
      ``minDeltasForSnapshot`` = 10 batches]; ``writeBufferSizeMB`` and
      ``maxWriteBufferNumber`` [-1: RocksDB's 64 MB and 2]; ``boundedMemoryUsage`` [false;
      true moves index and filter blocks into the shared cache, lines 105-108];
      ``compression`` [lz4], ``maxOpenFiles`` [-1], and a few that touch neither lookups
      nor filters.
    - The lookup of an id: the dedup operator calls ``store.keyExists(key)`` for every
      record that is not late (``statefulOperators.scala`` line 1364), which is RocksDB's
      ``db.keyExists`` (``RocksDB.scala`` line 1229): the memtables (no filter), then each
      SST file whose key range holds the id, through its Bloom filter. A new id is then
      put (line 1366; ``RocksDB.put``, line 1342), and with ``trackTotalNumberOfRows`` the
      put first does a ``db.get`` of the same key to keep ``numRowsTotal`` exact
      (``handleMetricsUpdate``, lines 1286-1303, called at line 1341), and so does every
      delete. So a never-seen id costs **two** negative
      lookups by default, and one with ``trackTotalNumberOfRows=false``; ``numRowsTotal``
      is then not counted (Spark reports 0).
    - Expired ids are removed by a scan of the whole state after each batch
      (``evictDupInfoFromState``, ``statefulOperators.scala`` lines 1516-1520), so a batch
      also costs time in proportion to the state's size, whatever the batch's. Each removal
      leaves a tombstone in RocksDB until a compaction drops it, so the SST files, and the
      scan over them, grow beyond the live ids: at 3 million records (1.4 million live
      ids) the SST files reached 197 MB over the two instances.

:data:`TUNED` is therefore ``trackTotalNumberOfRows=false`` (one negative lookup per new
id instead of two, and none per expired id) and ``blockCacheSizeMB=128`` per instance (a
false positive, a duplicate's lookup and the eviction scan then find the data blocks
cached and decompressed, instead of reading and decompressing them again from files of
about 100 MB per instance). The Bloom filter's own settings cannot be tuned.
``compactOnCommit=true`` (a full compaction at each snapshot, every 10 batches) was tried
in a check at 3 million records: the SST files peaked at 134 MB instead of 197 MB, the
eviction scan was slightly faster, each snapshot's commit took about 3 s longer, and the
throughput did not change measurably. It is not in :data:`TUNED`; ``--tune
compactOnCommit=true`` measures it.

No explicit Bloom prefilter (issue 18 asks for one only if it stays correct across
replays; this is why it is not built)
    A Bloom filter answers "certainly never seen" or "maybe seen". Its use would be to let
    the certainly-new ids skip the exact lookup. But they must still enter the state, so
    that their later copies are caught, and Spark's dedup operator has no way in for
    that: it calls ``keyExists`` for every row it gets and then puts the new ones. A filter
    in front of it can only remove rows, and a Bloom filter can never prove that a row is
    a duplicate (a false positive is a new id), so it could remove none; rows routed around
    the operator would never enter the state. The filter saves work only inside an operator
    of one's own: ``transformWithStateInPandas`` with the exact ids in a ``MapState`` and
    a Bloom filter per time bucket in a ``ValueState``. That stays correct across replays
    (its state is Spark's, checkpointed and rolled back with the batch), but every record
    then crosses into a Python worker and every state access goes over Spark's state
    server socket, which costs far more per record than the JVM operator's in-process
    RocksDB lookup it would save; each batch would also rewrite its buckets' filters (about
    1.5 MB for a million ids at 10 bits each) into the changelog; and every new id still
    needs its exact put. A filter kept outside Spark's state (in an executor's memory)
    would survive a rolled-back batch, which is safe (an extra "maybe" only costs a
    lookup), but not a lost executor, after which it would call seen ids new and let their
    copies through. RocksDB already has the per-time-bucket filter: ids are written in
    event-time order, so each SST file flushed from the memtable holds a time slice of ids
    with its own Bloom filter, in the checkpoint and rolled back with it (until compaction
    merges the slices). What a prefilter could save at most is bounded by the measurement:
    ``rocksdb-tuned`` removes one of the two negative lookups per new id, so the gap
    between ``rocksdb-default`` and ``rocksdb-tuned`` is about what one lookup costs, and a
    perfect prefilter could remove at most the one that is left.

Reported per variant (medians over ``--repeat`` rounds; the variants run interleaved,
their order reversed every other round): records/s (the log's records over the run's
wall time after the session is up), its ratio to ``no-dedup`` (PASS at 0.8 or more, the
issue's goal), records/s after the first batch (each child starts a fresh JVM), records
per CPU second (the child and its descendants: the Python driver, the JVM that runs the
tasks, Spark's Python workers that read the log), peak state size (the dedup operator's
``numRowsTotal`` and ``memoryUsedBytes`` from the query's progress, RocksDB's
``rocksdbSstFileSize``, and the state directory under the checkpoint on disk, measured
after every batch; the directory keeps every batch's changelog, Spark retaining 100
versions), the duplicates removed and dropped as late (Spark's counters), and the state
operator's own time (``allUpdatesTimeMs``: lookups and puts; ``allRemovalsTimeMs``: the
eviction scan; ``commitTimeMs``). Every run checks, after it ends, that the sink holds
exactly one row per distinct record id (the generator's count; with ``no-dedup``, every
copy too) and that dedup removed exactly the generator's copies, none as late; a failed
check fails the benchmark.

Writes ``benchmarks/results/dedup.json`` and ``benchmarks/results/dedup.png`` (throughput
per variant, and the state's size over the batches).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import heapq
import json
import os
import platform
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import mem_gib as _mem_gib  # noqa: E402
from benchmarks._common import pct as _pct  # noqa: E402
from benchmarks._common import peak_rss_mb, write_results  # noqa: E402
from benchmarks.sinks import _fmt  # noqa: E402
from benchmarks.stable_output import _git_head, _median, tree_cpu_s  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
CACHE = REPO / ".cache" / "bench"
TOPIC = "events"
PARTITIONS = 4
KEYS = 1000  # a multiple of PARTITIONS: key k<n> lives in partition n % PARTITIONS
DUPLICATE_SHARE = 0.01
MAX_RESEND_S = 120  # a copy follows its original by 1..120 s of event time
SEED = 18
GENERATOR = 1  # bump when the generated log changes; part of the cache's name
START_US = 1_767_225_600_000_000  # 2026-01-01T00:00:00Z: the first record's event time
GOAL = 0.8
BASELINE = "no-dedup"

_PREFIX = "spark.sql.streaming.stateStore.rocksdb."
HDFS_PROVIDER = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"
TUNED = {"trackTotalNumberOfRows": "false", "blockCacheSizeMB": "128"}
"""The RocksDB settings of ``rocksdb-tuned`` (keys without ``spark.sql.streaming.stateStore
.rocksdb.``); see the module docstring for why these."""
VARIANTS = (
    "no-dedup",
    "shuffle-only",
    "rocksdb-default",
    "rocksdb-tuned",
    "hdfs-state",
    "spark-bare",
)
DEDUP_VARIANTS = frozenset(VARIANTS) - {BASELINE, "shuffle-only"}


# -- input ------------------------------------------------------------------------------------

_MASK = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64's finaliser: a bijection on 64-bit integers (distinct in, distinct out)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def record_id(n: int) -> str:
    """Record ``n``'s id: UUID-shaped, random-looking, and distinct for every ``n`` (its
    first 64 bits are a bijection of ``n``)."""
    hi = _mix64(n)
    h = f"{hi:016x}{_mix64(hi ^ n):016x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def log_dir(records: int, rate: int) -> Path:
    return CACHE / f"dedup-{records}-rate{rate}-dup1pct-seed{SEED}-v{GENERATOR}"


def make_log(records: int, rate: int) -> tuple[Path, dict[str, Any]]:
    """The input log and its manifest, written once per parameters (see the docstring)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from sparkonce.log import IdempotentProducer, Topic

    root = log_dir(records, rate)
    manifest_path = root / "manifest.json"
    if manifest_path.exists():  # written last: the log is whole
        return root, json.loads(manifest_path.read_text())
    shutil.rmtree(root, ignore_errors=True)
    rng = random.Random(SEED)
    copies = sorted(rng.sample(range(records), int(records * DUPLICATE_SHARE)))
    step_us = 1_000_000 / rate
    # (position in the stream of originals at which the copy is sent, original's number,
    # the copy's event time)
    pending: list[tuple[int, int, int]] = []
    at_original_time = 0
    for n in copies:
        delay_s = rng.uniform(1, MAX_RESEND_S)
        original_us = START_US + round(n * step_us)
        if rng.random() < 0.5:
            event_us = original_us  # a stored event sent again
            at_original_time += 1
        else:
            event_us = original_us + round(delay_s * 1_000_000)  # stamped on re-send
        pending.append((n + round(delay_s * rate), n, event_us))
    heapq.heapify(pending)
    topic = Topic.create(root, TOPIC, PARTITIONS)
    sent_copies = 0
    max_gap_us = 0  # the largest event-time distance between a copy and its original
    columns = [
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,}"),
        TimeRemainingColumn(),
    ]
    total = records + len(copies)
    with (
        Progress(*columns, transient=True) as progress,
        topic,
        IdempotentProducer(topic, "bench-dedup", batch_size=50_000) as producer,
    ):
        task = progress.add_task(f"writing {total:,} records to the embedded log", total=total)
        for n in range(records):
            while pending and pending[0][0] <= n:
                _, m, event_us = heapq.heappop(pending)
                _send(producer, m, event_us)
                max_gap_us = max(max_gap_us, event_us - (START_US + round(m * step_us)))
                sent_copies += 1
            _send(producer, n, START_US + round(n * step_us))
            if n % 50_000 == 0:
                progress.update(task, completed=n + sent_copies)
        while pending:  # copies due after the last original
            _, m, event_us = heapq.heappop(pending)
            _send(producer, m, event_us)
            max_gap_us = max(max_gap_us, event_us - (START_US + round(m * step_us)))
            sent_copies += 1
        progress.update(task, completed=total)
    with Topic(root, TOPIC) as t:
        ends = t.end_offsets()
    manifest = {
        "generator": GENERATOR,
        "seed": SEED,
        "distinct_ids": records,
        "copies": sent_copies,
        "copies_at_original_time": at_original_time,
        "copies_max_event_time_gap_s": max_gap_us / 1e6,
        "log_records": sum(ends.values()),
        "partition_records": [ends[p] for p in range(PARTITIONS)],
        "rate_per_event_time_s": rate,
        "event_time_span_s": (records - 1) / rate,
        "first_event_time_us": START_US,
    }
    if manifest["log_records"] != total or sent_copies != len(copies):
        raise SystemExit(f"the generated log is not what was planned: {manifest}")
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return root, manifest


def _send(producer: Any, n: int, event_us: int) -> None:
    key = n % KEYS
    producer.send(
        str(n % 100_000).encode(),
        f"k{key}".encode(),
        partition=key % PARTITIONS,
        record_id=record_id(n),
        timestamp_us=event_us,
    )


# -- one variant, in a child process ------------------------------------------------------------


def parse(df: Any) -> Any:
    """The value parsed to a long; the columns the sink gets, and the event time."""
    from pyspark.sql import functions as F

    return df.select(
        F.col("record_id"),
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
        F.col("timestamp"),
    )


def transform_for(name: str, within: str) -> Any:
    from sparkonce.outputs import dedupe

    def transform(df: Any) -> Any:
        parsed = parse(df)
        if name == BASELINE:
            out = parsed
        elif name == "shuffle-only":
            out = parsed.repartition("record_id")
        elif name == "spark-bare":
            out = parsed.withWatermark("timestamp", within).dropDuplicatesWithinWatermark(
                ["record_id"]
            )
        else:
            out = dedupe(parsed, "record_id", within=within, event_time="timestamp")
        return out.drop("timestamp")

    return transform


def settings_for(name: str, tune: dict[str, str]) -> dict[str, str]:
    """The Spark settings a variant sets on top of the session's."""
    if name == "rocksdb-tuned":
        return {_PREFIX + k: v for k, v in {**TUNED, **tune}.items()}
    if name == "hdfs-state":
        return {"spark.sql.streaming.stateStore.providerClass": HDFS_PROVIDER}
    return {}


def capture_progress() -> list[dict[str, Any]]:
    """Every progress entry the runner reads (the runner reads each batch's once), as JSON."""
    from sparkonce.pipeline import runner

    entries: list[dict[str, Any]] = []
    original = runner._ProgressNotes._note

    @functools.wraps(original)
    def note(self: Any, progress: Any) -> None:
        raw = getattr(progress, "json", None)
        entries.append(
            json.loads(raw) if isinstance(raw, str) else json.loads(json.dumps(progress))
        )
        original(self, progress)

    runner._ProgressNotes._note = note  # type: ignore[method-assign]
    return entries


def dir_bytes(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # Spark's maintenance may delete meanwhile
                total += os.stat(os.path.join(root, f)).st_size
    return total


def run_variant(name: str, args: argparse.Namespace) -> dict:
    from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink
    from sparkonce.pipeline import build_session

    work = Path(args.work)
    root, manifest = make_log(args.records, args.rate)
    progress = capture_progress()
    spark = build_session()
    settings = settings_for(name, _tune(args.tune))
    for key, value in settings.items():
        spark.conf.set(key, value)
    jvm_pid = spark.sparkContext._gateway.proc.pid  # type: ignore[union-attr]
    checkpoint = work / "checkpoint"
    db = work / "out.db"
    pipeline = Pipeline(
        name="bench-dedup",
        source=EmbeddedLogSource(
            root, TOPIC, max_records_per_partition=max(1, args.batch_records // PARTITIONS)
        ),
        sink=SQLiteSink(f"sqlite:///{db}", "events"),
        transform=transform_for(name, args.within),
        checkpoint=checkpoint,
        output_mode="append",
    )
    ends: list[tuple[float, int]] = []  # (when each batch ended, its input records)
    state_disk: dict[int, int] = {}  # Spark batch id -> bytes under <checkpoint>/state

    def on_batch(b: Any) -> None:
        ends.append((time.perf_counter(), b.ranges.count))
        state_disk[b.spark_batch_id] = dir_bytes(checkpoint / "state")

    records = manifest["log_records"]
    cpu_before = tree_cpu_s(jvm_pid)
    started = time.perf_counter()
    report = pipeline.run(spark, on_batch=on_batch)
    seconds = time.perf_counter() - started
    cpu = {k: v - cpu_before[k] for k, v in tree_cpu_s(jvm_pid).items()}
    cpu_s = sum(cpu.values())
    steady = (records - ends[0][1]) / (ends[-1][0] - ends[0][0]) if len(ends) > 1 else None
    final_state_disk = dir_bytes(checkpoint / "state")
    jvm_peak_mb = peak_rss_mb(jvm_pid)
    spark.stop()

    batches = _batches(progress, state_disk)
    dedup = [b for b in batches if b["operator"] is not None]
    rows, distinct = _sink_counts(db)
    result: dict[str, Any] = {
        "records": records,
        "distinct_ids": manifest["distinct_ids"],
        "copies": manifest["copies"],
        "settings": settings,
        "seconds": seconds,
        "records_per_s": records / seconds,
        "steady_records_per_s": steady,
        "cpu_s": cpu_s,
        "cpu_split_s": cpu,
        "records_per_cpu_s": records / cpu_s,
        "python_driver_peak_mb": peak_rss_mb(),
        "jvm_driver_peak_mb": jvm_peak_mb,
        "batches": len(report.batches),
        "batch_p50_s": _pct([b.seconds for b in report.batches], 50),
        "batch_p99_s": _pct([b.seconds for b in report.batches], 99),
        "sink_rows": rows,
        "sink_distinct_ids": distinct,
        "state_dir_peak_bytes": max([final_state_disk, *state_disk.values()]),
        "state_dir_final_bytes": final_state_disk,
        "per_batch": batches,
    }
    if dedup:
        ops = [b["operator"] for b in dedup]
        rows_total = max(op["numRowsTotal"] for op in ops)
        rocksdb = "rocksdbGetCount" in ops[0]["custom"]
        result.update(
            {
                "provider": "rocksdb" if rocksdb else "hdfs",
                "duplicates_removed": sum(
                    op["custom"].get("numDroppedDuplicateRows", 0) for op in ops
                ),
                "late_dropped": sum(op["numRowsDroppedByWatermark"] for op in ops),
                "state_rows_peak": rows_total or None,  # 0: not tracked
                "state_memory_peak_bytes": max(op["memoryUsedBytes"] for op in ops),
                "state_sst_peak_bytes": max(op["custom"].get("rocksdbSstFileSize", 0) for op in ops)
                or None,
                "state_updates_s": sum(op["allUpdatesTimeMs"] for op in ops) / 1000,
                "state_removals_s": sum(op["allRemovalsTimeMs"] for op in ops) / 1000,
                "state_commit_s": sum(op["commitTimeMs"] for op in ops) / 1000,
                "rocksdb": None
                if not rocksdb
                else {
                    k: sum(op["custom"].get(k, 0) for op in ops)
                    for k in (
                        "rocksdbGetCount",
                        "rocksdbPutCount",
                        "rocksdbReadBlockCacheHitCount",
                        "rocksdbReadBlockCacheMissCount",
                        "rocksdbTotalBytesRead",
                        "rocksdbTotalBytesReadThroughIterator",
                        "rocksdbTotalCompactionLatencyMs",
                    )
                },
            }
        )
    _check(name, result)
    return result


def _batches(progress: list[dict[str, Any]], state_disk: dict[int, int]) -> list[dict[str, Any]]:
    """One entry per Spark batch: its input, time and the dedup operator's state."""
    seen: dict[int, dict[str, Any]] = {}
    for p in progress:
        ops = [op for op in p.get("stateOperators") or [] if op.get("operatorName")]
        dedup = [op for op in ops if op["operatorName"] == "dedupeWithinWatermark"]
        op = dedup[0] if dedup else None
        batch_id = int(p["batchId"])
        seen[batch_id] = {
            "batch": batch_id,
            "input_rows": int(p.get("numInputRows", 0)),
            "seconds": (p.get("durationMs") or {}).get("triggerExecution", 0) / 1000,
            "state_dir_bytes": state_disk.get(batch_id),
            "operator": None
            if op is None
            else {
                "numRowsTotal": int(op.get("numRowsTotal", 0)),
                "numRowsUpdated": int(op.get("numRowsUpdated", 0)),
                "numRowsRemoved": int(op.get("numRowsRemoved", 0)),
                "numRowsDroppedByWatermark": int(op.get("numRowsDroppedByWatermark", 0)),
                "memoryUsedBytes": int(op.get("memoryUsedBytes", 0)),
                "allUpdatesTimeMs": int(op.get("allUpdatesTimeMs", 0)),
                "allRemovalsTimeMs": int(op.get("allRemovalsTimeMs", 0)),
                "commitTimeMs": int(op.get("commitTimeMs", 0)),
                "custom": {k: int(v) for k, v in (op.get("customMetrics") or {}).items()},
            },
        }
    return [seen[k] for k in sorted(seen)]


def _sink_counts(db: Path) -> tuple[int, int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows, distinct = conn.execute(
            "SELECT count(*), count(DISTINCT record_id) FROM events"
        ).fetchone()
    return int(rows), int(distinct)


def _check(name: str, r: dict[str, Any]) -> None:
    """The sink holds one row per distinct id (every copy too without dedup), and dedup
    removed exactly the generator's copies, none as late. Raises SystemExit otherwise."""
    ids, copies = r["distinct_ids"], r["copies"]
    wrong = []
    if r["sink_distinct_ids"] != ids:
        wrong.append(f"{r['sink_distinct_ids']:,} distinct ids in the sink, generated {ids:,}")
    want_rows = ids if name in DEDUP_VARIANTS else ids + copies
    if r["sink_rows"] != want_rows:
        wrong.append(f"{r['sink_rows']:,} rows in the sink, expected {want_rows:,}")
    if name in DEDUP_VARIANTS:
        if r.get("duplicates_removed") != copies:
            wrong.append(
                f"dedup removed {r.get('duplicates_removed')} copies, generated {copies:,}"
            )
        if r.get("late_dropped"):
            wrong.append(f"dedup dropped {r['late_dropped']:,} records as late, expected none")
        if (
            name == "rocksdb-tuned"
            and r["settings"].get(_PREFIX + "trackTotalNumberOfRows") == "false"
            and r.get("state_rows_peak")
        ):
            wrong.append("numRowsTotal is counted although trackTotalNumberOfRows is false")
        want = "hdfs" if name == "hdfs-state" else "rocksdb"
        if r.get("provider") != want:
            wrong.append(f"the state store was {r.get('provider')}, not {want}")
    r["check"] = "ok" if not wrong else "; ".join(wrong)
    if wrong:
        raise SystemExit(f"{name}: " + "; ".join(wrong))


def _tune(items: list[str] | None) -> dict[str, str]:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--tune {item!r}: give KEY=VALUE, e.g. compactOnCommit=true")
        out[key.removeprefix(_PREFIX)] = value
    return out


# -- the parent: run everything, report ----------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000_000, help="distinct record ids")
    ap.add_argument("--batch-records", type=int, default=200_000, help="records per micro-batch")
    ap.add_argument("--repeat", type=int, default=1, help="rounds (each runs every variant)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rate", type=int, default=2000, help="records per second of event time")
    ap.add_argument("--within", default="5 minutes", help="dedupe's bound")
    ap.add_argument(
        "--tune",
        action="append",
        metavar="KEY=VALUE",
        help="a RocksDB setting for rocksdb-tuned, added to or replacing TUNED "
        f"(KEY without {_PREFIX}); repeatable",
    )
    ap.add_argument("--variant", help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.records < 100 or args.batch_records < 1 or args.repeat < 1 or args.rate < 1:
        ap.error("--records must be at least 100; --batch-records, --repeat and --rate at least 1")
    from sparkonce.outputs.late import duration_us

    within_s = duration_us(args.within, "--within") / 1e6
    if within_s <= MAX_RESEND_S:
        ap.error(f"--within must be longer than {MAX_RESEND_S} s, the copies' largest delay")
    _tune(args.tune)
    if args.variant:
        result = run_variant(args.variant, args)
        print("RESULT " + json.dumps(result), flush=True)
        return

    from rich.console import Console

    console = Console(width=None if sys.stdout.isatty() else 160)
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = sorted(set(wanted) - set(VARIANTS))
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; choose from {', '.join(VARIANTS)}")
    t0 = time.perf_counter()
    _, manifest = make_log(args.records, args.rate)  # once, before any child
    console.print(
        f"input: {manifest['log_records']:,} records ({manifest['distinct_ids']:,} ids, "
        f"{manifest['copies']:,} copies) over {manifest['event_time_span_s'] / 60:.0f} min of "
        f"event time, in {time.perf_counter() - t0:.0f} s"
    )
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    wall = time.perf_counter()
    load_before = os.getloadavg()
    work_root = Path(tempfile.mkdtemp(prefix="sparkonce-bench-dedup-"))
    runs: dict[str, list[dict]] = {name: [] for name in wanted}
    # Spark's Python workers import sparkonce too: from this checkout, like the children.
    env = dict(
        os.environ,
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")])),
    )
    try:
        for round_no in range(args.repeat):
            order = wanted if round_no % 2 == 0 else wanted[::-1]
            for name in order:
                console.print(
                    f"[bold]{name}[/] (round {round_no + 1}/{args.repeat}, "
                    f"{manifest['log_records']:,} records)..."
                )
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
                    "--rate",
                    str(args.rate),
                    "--within",
                    args.within,
                    "--work",
                    str(work),
                ]
                for item in args.tune or []:
                    cmd += ["--tune", item]
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
                    f"{r['records_per_s']:,.0f} records/s; {r['sink_rows']:,} rows in the sink; "
                    f"check {r['check']}"
                )
    finally:
        shutil.rmtree(work_root, ignore_errors=True)
    facts = {
        "wall_s": time.perf_counter() - wall,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
    }
    report = summarize(runs, args, manifest, facts)
    print_report(console, report)
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_results(RESULTS / "dedup.json", report)
    chart(report, RESULTS / "dedup.png")
    console.print(
        "wrote benchmarks/results/dedup.json and benchmarks/results/dedup.png "
        f"(wall time {facts['wall_s'] / 60:.1f} min)"
    )


MEDIANS = (
    "records_per_s",
    "steady_records_per_s",
    "seconds",
    "cpu_s",
    "records_per_cpu_s",
    "python_driver_peak_mb",
    "jvm_driver_peak_mb",
    "batch_p50_s",
    "batch_p99_s",
    "state_rows_peak",
    "state_memory_peak_bytes",
    "state_sst_peak_bytes",
    "state_dir_peak_bytes",
    "state_updates_s",
    "state_removals_s",
    "state_commit_s",
)


def summarize(
    runs: dict[str, list[dict]], args: argparse.Namespace, manifest: dict, facts: dict
) -> dict:
    import pyspark

    results: dict[str, dict] = {}
    for name, rs in runs.items():
        first = rs[0]
        results[name] = {
            **{k: _median(rs, k) for k in MEDIANS},
            "records_per_s_runs": [round(r["records_per_s"]) for r in rs],
            "settings": first["settings"],
            "batches": first["batches"],
            "sink_rows": first["sink_rows"],
            "sink_distinct_ids": first["sink_distinct_ids"],
            "duplicates_removed": first.get("duplicates_removed"),
            "late_dropped": first.get("late_dropped"),
            "rocksdb": first.get("rocksdb"),
            "check": "ok" if all(r["check"] == "ok" for r in rs) else "FAILED",
            "runs": rs,
        }
    base = results.get(BASELINE)
    for name, res in results.items():
        for key, out in (
            ("records_per_s", "ratio"),
            ("steady_records_per_s", "ratio_steady"),
            ("records_per_cpu_s", "ratio_cpu"),
        ):
            a, b = res[key], base[key] if base else None
            res[out] = a / b if a and b else None
        res["ratio_per_round"] = (
            [
                a["records_per_s"] / b["records_per_s"]
                for a, b in zip(runs[name], runs[BASELINE], strict=True)
            ]
            if base
            else []
        )
        ratio = res["ratio"]
        res["verdict"] = (
            None
            if ratio is None or name == BASELINE
            else ("PASS" if ratio >= GOAL else "FALLS SHORT")
        )
    cpu = platform.processor() or platform.machine()
    return {
        "benchmark": "dedup",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} cores, {_mem_gib():.0f} GiB, {cpu}, Spark local[2]",
        "environment": {
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "sqlite": sqlite3.sqlite_version,
            "commit": _git_head(),
            "load_avg_before": facts["load_avg_before"],
            "load_avg_after": facts["load_avg_after"],
        },
        "command": (
            f"benchmarks/dedup.py --records {args.records} --batch-records {args.batch_records} "
            f"--repeat {args.repeat} --rate {args.rate} --within '{args.within}' "
            f"--variants {','.join(runs)}" + "".join(f" --tune {t}" for t in args.tune or [])
        ),
        "wall_s": facts["wall_s"],
        "input": manifest,
        "records": manifest["log_records"],
        "batch_records": args.batch_records,
        "within": args.within,
        "repeat": args.repeat,
        "tuned": {**TUNED, **_tune(args.tune)},
        "goal": GOAL,
        "results": results,
    }


def _mb(v: float | None) -> str:
    return "-" if v is None else f"{v / 1e6:,.0f}"


def print_report(console: Any, report: dict) -> None:
    from rich.table import Table

    table = Table(
        title=f"dedup, {report['records']:,} records ({report['input']['copies']:,} copies), "
        f"{report['batch_records']:,} per batch, within {report['within']}, median of "
        f"{report['repeat']}, {report['machine']}"
    )
    cols = (
        "variant",
        "records/s",
        "vs no-dedup",
        f"goal {GOAL}x",
        "steady",
        "rec/CPU s",
        "peak ids",
        "mem MB",
        "SST MB",
        "disk MB",
        "removed",
        "check",
    )
    for col in cols:
        table.add_column(col, justify="left" if col in ("variant", "check") else "right")
    for name, r in report["results"].items():
        ratio = "-" if r["ratio"] is None else f"{r['ratio']:.2f}"
        removed = r["duplicates_removed"]
        table.add_row(
            name,
            f"{r['records_per_s']:,.0f}",
            ratio,
            r["verdict"] or "-",
            "-" if r["steady_records_per_s"] is None else f"{r['steady_records_per_s']:,.0f}",
            f"{r['records_per_cpu_s']:,.0f}",
            "-" if r["state_rows_peak"] is None else f"{r['state_rows_peak']:,.0f}",
            _mb(r["state_memory_peak_bytes"]),
            _mb(r["state_sst_peak_bytes"]),
            _mb(r["state_dir_peak_bytes"]),
            "-" if removed is None else f"{removed:,}",
            r["check"],
        )
    console.print(table)
    ops = Table(title="the dedup state operator, seconds over the run (summed over tasks)")
    for col in ("variant", "updates s", "removals s", "commit s", "gets", "cache hit/miss"):
        ops.add_column(col, justify="left" if col == "variant" else "right")
    for name, r in report["results"].items():
        if r["state_updates_s"] is None:
            continue
        rocks = r["rocksdb"] or {}
        hits = rocks.get("rocksdbReadBlockCacheHitCount")
        ops.add_row(
            name,
            _fmt(r["state_updates_s"]),
            _fmt(r["state_removals_s"]),
            _fmt(r["state_commit_s"]),
            f"{rocks['rocksdbGetCount']:,}" if rocks else "-",
            f"{hits:,}/{rocks['rocksdbReadBlockCacheMissCount']:,}" if rocks else "-",
        )
    console.print(ops)
    for name, r in report["results"].items():
        if r["verdict"]:
            rounds = ", ".join(f"{x:.2f}" for x in r["ratio_per_round"])
            console.print(
                f"[bold]{name} / {BASELINE}: {r['ratio']:.2f}x[/] records/s (goal {GOAL}x): "
                f"[bold]{r['verdict']}[/]; per round: {rounds}; after the first batch: "
                f"{_fmt(r['ratio_steady'])}x; per CPU second: {_fmt(r['ratio_cpu'])}x"
            )


def chart(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = report["results"]
    names = list(results)
    colors = dict(zip(names, plt.get_cmap("tab10").colors, strict=False))
    fig, (ax, ax_ids, ax_disk) = plt.subplots(
        1, 3, figsize=(16, 4.8), gridspec_kw={"width_ratios": [1.2, 1, 1]}
    )
    ys = list(range(len(names)))[::-1]
    rates = [results[n]["records_per_s"] / 1000 for n in names]
    ax.barh(ys, rates, color=[colors[n] for n in names])
    for y, n in zip(ys, names, strict=True):
        runs = [v / 1000 for v in results[n]["records_per_s_runs"]]
        ax.plot(runs, [y] * len(runs), "k.", markersize=5)
        label = f" {results[n]['records_per_s'] / 1000:,.0f}k/s"
        if results[n]["verdict"]:
            label += f"  {results[n]['ratio']:.2f}x ({results[n]['verdict']})"
        ax.text(max(runs), y, label, va="center", fontsize=8)
    ax.set_yticks(ys, names)
    ax.set_xlabel("input records per second (thousands); dots: each round")
    ax.set_xlim(0, max(rates) * 1.8)
    ax.set_title(
        f"{report['records']:,} records, 1% copies, median of {report['repeat']}", fontsize=9
    )

    for n in names:
        batches = results[n]["runs"][0]["per_batch"]
        xs = [b["batch"] for b in batches if b["operator"] is not None]
        ids = [b["operator"]["numRowsTotal"] / 1e6 for b in batches if b["operator"] is not None]
        if xs and any(ids):
            ax_ids.plot(xs, ids, label=n, color=colors[n])
        disk = [
            (b["batch"], b["state_dir_bytes"] / 1e6)
            for b in batches
            if b["state_dir_bytes"] is not None and b["operator"] is not None
        ]
        if disk:
            ax_disk.plot(*zip(*disk, strict=True), label=f"{n}: on disk", color=colors[n])
        mem = [
            (b["batch"], b["operator"]["memoryUsedBytes"] / 1e6)
            for b in batches
            if b["operator"] is not None
        ]
        if mem:
            ax_disk.plot(*zip(*mem, strict=True), "--", label=f"{n}: memory", color=colors[n])
    ax_ids.set_xlabel("micro-batch")
    ax_ids.set_ylabel("ids in the state (millions, numRowsTotal)")
    ax_ids.set_title("ids in the state (not counted when trackTotalNumberOfRows=false)", fontsize=9)
    ax_ids.legend(fontsize=7)
    ax_disk.set_xlabel("micro-batch")
    ax_disk.set_ylabel("MB")
    ax_disk.set_title("state under the checkpoint (solid), memoryUsedBytes (dashed)", fontsize=9)
    ax_disk.legend(fontsize=6)
    fig.suptitle(f"dedupe's cost, {report['date']}, {report['machine']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
