"""What the side-by-side benchmarks share: the machine line, memory and CPU readings of a
process, percentiles, how several runs of one variant become one result, and how a results
file is written (:func:`write_results`, which keeps the file's dated ``notes``).

Each benchmark puts the repository root on ``sys.path`` and imports this module as
``benchmarks._common``.
"""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

_TICK = os.sysconf("SC_CLK_TCK")


def machine() -> str:
    """``2 cores, 24 GiB, x86_64, Spark local[2]``: the line every report carries."""
    cpu = platform.processor() or platform.machine()
    return f"{os.cpu_count()} cores, {mem_gib():.0f} GiB, {cpu}, Spark local[2]"


def mem_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return 0.0


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory (``VmHWM``), in MB; NaN once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def cpu_seconds(pid: int, *, children: bool = True) -> float:
    """User plus system CPU seconds of ``pid`` (and of its waited-for children)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # After the command: state is fields[0], so utime/stime/cutime/cstime are 11..14.
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICK


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and of every live descendant (with their reaped children)."""
    parent: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        pid = frontier.pop()
        for child, ppid in parent.items():
            if ppid == pid and child not in tree:
                tree.add(child)
                frontier.append(child)
    return sum(cpu_seconds(p) for p in tree)


def pct(values: list[float], q: int) -> float | None:
    """The ``q``-th percentile by nearest rank (None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[k]


# What ``pool_runs`` keeps of every run, beside the pooled result: enough to see where the
# runs differ (CPU by process, Spark's and sparkonce's split of a batch).
RUN_FIELDS = (
    "records_per_s",
    "seconds",
    "commit_p50_s",
    "driver_tree_cpu_s",
    "broker_cpu_s",
    "postgres_cpu_s",
    "spark_phases_p50_ms",
    "commit_split_p50_s",
)


def pool_runs(runs: list[dict]) -> dict:
    """One variant's runs as one result.

    The run with the median records/s (the lower middle one of an even count) gives the
    memory, commit times and splits. With several runs, records/s is pooled over all of
    them, every record over every second (the runs have the same input, so this is the
    harmonic mean of their rates), and each run's rate and ``RUN_FIELDS`` are kept beside it.
    """
    ordered = sorted(runs, key=lambda r: r["records_per_s"])
    median = dict(ordered[(len(ordered) - 1) // 2])
    if len(runs) > 1:
        median["runs_records_per_s"] = [r["records_per_s"] for r in runs]
        median["runs"] = [{k: r[k] for k in RUN_FIELDS if k in r} for r in runs]
        median["records"] = sum(r["records"] for r in runs)
        median["seconds"] = sum(r["seconds"] for r in runs)
        median["records_per_s"] = median["records"] / median["seconds"]
    return median


def warm_coordinators(bootstrap: str, topic: str) -> float:
    """Start the broker's transaction and group coordinators before anything is measured.

    A new broker creates its internal topics (``__transaction_state``, ``__consumer_offsets``,
    50 partitions each) on their first use: here the first ``init_transactions`` took 1.1 s
    against 0.02 s after it, and the first group commit 0.23 s against 0.07 s. Any cluster
    that has ever run a transactional producer or a consumer group has them, so no variant
    is charged for it: without this, the first variant with a transactional producer
    (``KafkaSink``) or a group commit (sparkonce's sources report monitoring offsets) paid
    it, and the at-least-once baselines, which use neither, did not.
    """
    import time

    from confluent_kafka import Consumer, Producer
    from confluent_kafka import TopicPartition as KafkaTopicPartition

    started = time.perf_counter()
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"bench-warm-{os.getpid()}"}
    )
    producer.init_transactions(60)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-warm-{os.getpid()}"})
    try:
        consumer.commit(offsets=[KafkaTopicPartition(topic, 0, 0)], asynchronous=False)
    finally:
        consumer.close()
    return time.perf_counter() - started


def write_results(path: Path, report: dict[str, Any], *, indent: int = 2) -> None:
    """Write ``report`` to the results file ``path``, keeping the ``notes`` the file holds.

    A results file's ``notes`` (``{"date", "commit", "text"}`` each) are the dated findings
    of its earlier runs, shown under its table on the docs' performance page; a new run
    replaces every measurement but keeps them, before any notes of its own.
    """
    old: list[Any] = []
    if path.exists():
        try:
            previous = json.loads(path.read_text())
        except ValueError:
            previous = None
        if isinstance(previous, dict) and isinstance(previous.get("notes"), list):
            old = previous["notes"]
    new = report.get("notes") or []
    if old or new:
        report = {**report, "notes": old + [n for n in new if n not in old]}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=indent) + "\n")
