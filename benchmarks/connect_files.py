"""Checkpoint reads on S3 through Spark's JVM (HadoopFiles, S3A) and through pyarrow
(ArrowFiles), side by side in one run.

    .venv/bin/python benchmarks/connect_files.py [--batches 50] [--rounds 7]

Starts a moto S3 server (``tests/services/s3.py``) and a classic local[2] session with the
S3A jars and the server's ``spark.hadoop.fs.s3a.*`` settings, and runs a stateless
streaming query with its checkpoint in the bucket until it has planned ``--batches``
batches (one small file each): a real offset log, commit log and metadata that Spark wrote
through S3A. Then, ``--rounds`` times, each way reads that checkpoint with a new
:class:`~sparkonce.spark.checkpoint.Checkpoint` (the order of the two alternates by
round; the filesystem objects are kept, as a run keeps them):

* ``list``: the offset log's and the commit log's batch ids (two listings);
* ``offsets``: every batch's source offset (one file read each, parsed);
* ``per_batch``: what a batch function reads for one batch (its offsets, the batch
  before's, the query id and the state listing), over every batch; reported per batch
  (``one_batch_reads_ms``).

ArrowFiles gets its settings from the session (``ArrowSettings.of``), as a Connect
client would. Reported per way: median milliseconds of each step over the rounds after
the first (the first, which makes the S3 clients, is shown apart), per file, and the S3
requests a round made (lines of the server's request log). Results:
``benchmarks/results/connect-files.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, write_results  # noqa: E402

DEFAULT_OUTPUT = REPO / "benchmarks" / "results" / "connect-files.json"
BUCKET = "bench-connect-files"
WAYS = ("hadoop", "arrow")
STEPS = ("list", "offsets", "per_batch")


def commit() -> str | None:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    )
    return done.stdout.strip() or None


def write_checkpoint(spark: Any, source: Path, location: str, batches: int) -> float:
    """Run a stateless query over ``batches`` one-line files, one per batch; its seconds."""
    source.mkdir()
    for i in range(batches):
        (source / f"part-{i:04d}.txt").write_text(f"line {i}\n")
    started = time.monotonic()
    query = (
        spark.readStream.option("maxFilesPerTrigger", 1)
        .text(str(source))
        .writeStream.format("noop")
        .option("checkpointLocation", location)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination(900)
    finally:
        query.stop()
    if query.exception() is not None:
        raise SystemExit(f"the query that writes the checkpoint failed: {query.exception()}")
    return time.monotonic() - started


def one_round(files: Any, location: str, log: Path) -> dict[str, Any]:
    """Each step's milliseconds with ``files``, and the S3 requests the round made."""
    from sparkonce.spark.checkpoint import Checkpoint

    before = len(log.read_text().splitlines())
    ck = Checkpoint(location, files)
    out: dict[str, Any] = {}
    t = time.perf_counter()
    ids = ck.batch_ids("offsets")
    done = ck.batch_ids("commits")
    out["list"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    offsets = [ck.source_offset(b) for b in ids]
    out["offsets"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    for b in ids:
        assert ck.source_offset(b) is not None
        if b > 0:
            assert ck.source_offset(b - 1) is not None
        assert ck.query_id() is not None
        ck.has_state()
    out["per_batch"] = (time.perf_counter() - t) * 1000
    time.sleep(0.2)  # the server's log line of the last request
    out["requests"] = len(log.read_text().splitlines()) - before
    out["batches"], out["committed"] = len(ids), len(done)
    out["digest"] = hash((tuple(ids), tuple(done), tuple(offsets)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    args = ap.parse_args(argv)
    if args.rounds < 2 or args.batches < 2:
        ap.error("--rounds and --batches must be 2 or more")

    from tests.services import s3 as s3_service

    from sparkonce.files import ArrowFiles, ArrowSettings, HadoopFiles
    from sparkonce.spark.jars import s3_jars
    from sparkonce.spark.session import build_session

    work = Path(tempfile.mkdtemp(prefix="sparkonce-bench-connect-files-"))
    server = s3_service.start(work / "s3")
    try:
        server.create_bucket(BUCKET)
        jars = s3_jars()
        if not jars:
            raise SystemExit("the S3A jars are missing: run scripts/fetch-jars.sh (make jars)")
        spark = build_session(
            app_name="bench-connect-files",
            conf={"spark.jars": ",".join(jars), **server.spark_conf()},
        )
        spark.sparkContext.setLogLevel("ERROR")
        location = f"s3a://{BUCKET}/ck"
        write_s = write_checkpoint(spark, work / "in", location, args.batches)
        print(f"checkpoint of {args.batches} batches written in {write_s:.1f} s", flush=True)
        settings = ArrowSettings.of(spark)
        ways: dict[str, Any] = {"hadoop": HadoopFiles(spark), "arrow": ArrowFiles(settings)}
        log = work / "s3" / s3_service.LOG_NAME
        rounds: dict[str, list[dict[str, Any]]] = {w: [] for w in WAYS}
        for i in range(args.rounds):
            for way in WAYS if i % 2 == 0 else reversed(WAYS):
                r = one_round(ways[way], location, log)
                rounds[way].append(r)
                print(
                    f"round {i + 1} {way}: "
                    + ", ".join(f"{s} {r[s]:.0f} ms" for s in STEPS)
                    + f", {r['requests']} requests",
                    flush=True,
                )
        spark.stop()
    finally:
        s3_service.stop(work / "s3")
    digests = {r["digest"] for w in WAYS for r in rounds[w]}
    if len(digests) != 1:
        raise SystemExit("the two ways read different checkpoints: " + repr(rounds))

    n = args.batches
    summary: dict[str, dict[str, Any]] = {}
    for way in WAYS:
        warm = rounds[way][1:]
        median = {s: statistics.median(r[s] for r in warm) for s in STEPS}
        summary[way] = {
            "list_ms": round(median["list"], 1),
            "offsets_ms": round(median["offsets"], 1),
            "per_file_read_ms": round(median["offsets"] / n, 2),
            "one_batch_reads_ms": round(median["per_batch"] / n, 2),
            "requests_per_round": statistics.median(r["requests"] for r in warm),
            "first_round_ms": round(sum(rounds[way][0][s] for s in STEPS), 1),
        }
    speedup = {
        f"{key}_hadoop_over_arrow": round(summary["hadoop"][key] / summary["arrow"][key], 2)
        for key in ("list_ms", "offsets_ms", "one_batch_reads_ms")
    }
    report = {
        "benchmark": "connect-files",
        "what": (
            f"reads of a real {n}-batch checkpoint that Spark wrote to moto S3 through S3A: "
            "HadoopFiles (the classic session's JVM, py4j) against ArrowFiles (pyarrow.fs, "
            "settings from the session), alternating by round in one process; medians of "
            f"{args.rounds - 1} warm rounds"
        ),
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit(),
        "machine": machine(),
        "batches": n,
        "rounds": args.rounds,
        "checkpoint_write_s": round(write_s, 1),
        "load_average_end": list(os.getloadavg()),
        "summary": summary,
        "ratios": speedup,
        "rounds_ms": {
            w: [{s: round(r[s], 1) for s in (*STEPS, "requests")} for r in rounds[w]] for w in WAYS
        },
    }
    write_results(args.output, report)
    print(f"hadoop/arrow: {speedup} -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
