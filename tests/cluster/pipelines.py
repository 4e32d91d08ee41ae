"""The pipeline the cluster tests run with ``sparkonce run FILE --master URL``, and its checks.

Embedded log -> SQLite, stateless: each record's id, partition, offset and value, and the
interpreter of the Python worker that handled it (``python``), from a UDF that runs on the
executors. The UDF can be slowed down (``row_seconds`` per row) and leaves one marker file
per task attempt in ``markers``, so a test can see which task runs where and when.

Input: :data:`RECORDS` records over :data:`PARTITIONS` partitions, read
:data:`LIMIT` per partition and batch: :data:`BATCHES` batches of :data:`ROWS_PER_BATCH`.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

from sparkonce.log import Topic
from sparkonce.sinks import sink_from_url
from sparkonce.sinks.inspect import inspector_for

RECORDS = 2400
PARTITIONS = 3
KEYS = 6
LIMIT = 200
BATCHES = 4
ROWS_PER_BATCH = RECORDS // BATCHES
TOPIC = "events"
TABLE = "events_out"
NAME = "cluster-test"

_PIPELINE_FILE = '''"""A sparkonce pipeline for the cluster tests (tests/cluster/pipelines.py)."""

import json
import os
import sys
import time
from pathlib import Path

from pyspark.sql import functions as F
from pyspark.sql import types as T

from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

MARKERS = Path({markers!r})
ROW_SECONDS = {row_seconds!r}


def handled_by(value):
    """Runs on an executor, once per row: the marker of this task attempt (written by its
    first row), a pause, and the interpreter that ran it."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    marker = MARKERS / f"{{ctx.stageId()}}-{{ctx.partitionId()}}-{{ctx.attemptNumber()}}"
    marker = marker.with_suffix(f".{{os.getpid()}}.json")
    if not marker.exists():
        facts = {{"pid": os.getpid(), "cwd": os.getcwd(), "at": time.time(),
                  "stage": ctx.stageId(), "partition": ctx.partitionId(),
                  "attempt": ctx.attemptNumber()}}
        marker.write_text(json.dumps(facts))
    time.sleep(ROW_SECONDS)
    return sys.executable


def transform(df):
    python = F.udf(handled_by, T.StringType())
    return df.select(
        F.col("record_id"),
        F.col("partition"),
        F.col("offset"),
        F.col("value").cast("string").cast("long").alias("value"),
        python(F.col("value")).alias("python"),
    )


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, {topic!r}, max_records_per_partition={limit}),
    transform=transform,
    sink=sink_from_url({sink_url!r}, {table!r}, two_phase={two_phase!r}),
    checkpoint={checkpoint!r},
)
'''


def write_pipeline(
    path: Path,
    *,
    log_dir: Path,
    sink_url: str,
    markers: Path,
    row_seconds: float = 0.0,
    two_phase: bool = False,
) -> Path:
    """Write the pipeline file to ``path`` (checkpoint beside it); return ``path``.
    ``two_phase``: a PostgreSQL URL gets ``PostgresTwoPhaseSink`` (executors pre-commit)."""
    markers.mkdir(parents=True, exist_ok=True)
    path.write_text(
        _PIPELINE_FILE.format(
            markers=str(markers),
            row_seconds=row_seconds,
            name=NAME,
            log_dir=str(log_dir),
            topic=TOPIC,
            limit=LIMIT,
            sink_url=sink_url,
            table=TABLE,
            two_phase=two_phase,
            checkpoint=str(path.with_name(path.stem + "-checkpoint")),
        )
    )
    return path


def log_events(log_dir: Path) -> Counter[tuple[str, int, int, int]]:
    """Every record of the log as (record_id, partition, offset, value): what the sink must
    hold, each once."""
    events: Counter[tuple[str, int, int, int]] = Counter()
    with Topic(log_dir, TOPIC) as topic:
        for partition, end in topic.end_offsets().items():
            for r in topic.read(partition, 0, end):
                assert r.value is not None
                events[(r.record_id, r.partition, r.offset, int(r.value))] += 1
    return events


def sink_rows(sink_url: str) -> tuple[list[dict[str, Any]], list[Any]]:
    """The table's rows and the pipeline's ledger entries."""
    sink = sink_from_url(sink_url, TABLE)
    try:
        return inspector_for(sink).rows(), sink.ledger(NAME)
    finally:
        sink.close()


def sink_events(rows: list[dict[str, Any]]) -> Counter[tuple[str, int, int, int]]:
    return Counter(
        (str(r["record_id"]), int(r["partition"]), int(r["offset"]), int(r["value"])) for r in rows
    )


def markers(directory: Path) -> list[dict[str, Any]]:
    """The task attempts the UDF recorded so far (a marker being written is skipped)."""
    out = []
    for path in sorted(directory.glob("*.json")):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return out


def running_task_after_first_batch(marker_dir: Path, deadline: float) -> dict[str, Any]:
    """The first task of a later batch than the first, as soon as its marker appears (it
    then has about 2 s to run)."""
    while time.monotonic() < deadline:
        seen = markers(marker_dir)
        stages = sorted({m["stage"] for m in seen})
        if len(stages) >= 2:
            fresh = [m for m in seen if m["stage"] == stages[-1] and m["attempt"] == 0]
            if fresh:
                return max(fresh, key=lambda m: m["at"])
        time.sleep(0.05)
    raise AssertionError("no task of a second batch started in time")


_SUMS_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

def sums(df):
    v = df.select(F.col("key").cast("string").alias("key"),
                  F.col("value").cast("string").cast("long").alias("value"))
    return v.groupBy("key").agg(F.sum("value").alias("total"), F.count("*").alias("n"))

pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition={limit!r}),
    transform=sums,
    sink=SQLiteSink("sqlite:///{sink}", "sums", mode="upsert", keys=["key"]),
    checkpoint={checkpoint!r},
)
"""


def write_sums_pipeline(
    path: Path, *, name: str, log: Path, limit: int, sink: Path, checkpoint: Path
) -> Path:
    """The stateful campaign pipeline (per-key sums of the embedded log's ``events`` into
    SQLite, upsert by key) of ``tests/cluster/test_verify.py`` and
    ``scripts/cluster-campaign.py``, written to ``path``."""
    path.write_text(
        _SUMS_PIPELINE.format(
            name=name, log=str(log), limit=limit, sink=sink, checkpoint=str(checkpoint)
        )
    )
    return path
