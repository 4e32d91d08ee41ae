"""``sparkonce demo``: crash a real pipeline twice and show the sums are still exact.

1. Produce records 1..N, spread over several keys, into the embedded log.
2. Write ``WORKDIR/pipeline.py``: sum of values per key, from the log into SQLite
   (upsert on the key, Spark state in RocksDB).
3. Run it as a separate driver process and SIGKILL it at the
   ``after-ledger-commit`` crash point: the sink committed a batch that Spark's
   commit log does not know about yet.
4. Restart it, and SIGKILL it again at a random moment once it made progress.
5. Restart it and let it finish.
6. Compare rows, total sum and per-key sums with the expected values.
"""

from __future__ import annotations

import random
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sparkonce.errors import ConfigError
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.offsets import BatchRanges
from sparkonce.protocol import CrashPoint
from sparkonce.verify.driver import SIGKILL_EXIT, Driver

PIPELINE_NAME = "demo-sums"
TOPIC = "events"
DRIVER_TIMEOUT_S = 600.0

_PIPELINE_FILE = '''"""The sparkonce demo pipeline: sum of values per key, embedded log -> SQLite.

Run it yourself with:  sparkonce run {pipeline_file}
Inspect it with:       sparkonce status --pipeline {name} --sink {sink_url}
"""

from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink


def sums_per_key(df):
    values = df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("value"),
    )
    return values.groupBy("key").agg(
        F.sum("value").alias("total"), F.count("*").alias("records")
    )


pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log_dir!r}, {topic!r}, max_records_per_partition={limit}),
    transform=sums_per_key,
    sink=SQLiteSink({sink_url!r}, "sums", mode="upsert", keys=["key"]),
    checkpoint={checkpoint!r},
)
'''


@dataclass
class DemoResult:
    passed: bool
    expected_rows: int
    actual_rows: int
    expected_total: int
    actual_total: int
    mismatched_keys: list[str] = field(default_factory=list)
    kills: list[str] = field(default_factory=list)


def key_of(i: int, keys: int) -> str:
    return f"key-{i % keys:02d}"


def expected_sums(records: int, keys: int) -> dict[str, tuple[int, int]]:
    """key -> (sum of values, number of records), for records 1..N."""
    out: dict[str, list[int]] = {}
    for i in range(1, records + 1):
        agg = out.setdefault(key_of(i, keys), [0, 0])
        agg[0] += i
        agg[1] += 1
    return {k: (v[0], v[1]) for k, v in out.items()}


class _LedgerWatch:
    """Reads the demo's ledger from SQLite while a driver writes it (WAL allows this)."""

    def __init__(self, db: Path) -> None:
        self.db = db

    def read(self) -> tuple[int, int]:
        """(ledger entries, records covered)."""
        if not self.db.exists():
            return 0, 0
        try:
            with sqlite3.connect(f"file:{self.db}?mode=ro", uri=True, timeout=5) as conn:
                row = conn.execute(
                    "SELECT seq, ranges FROM sparkonce_ledger WHERE pipeline = ? "
                    "ORDER BY seq DESC LIMIT 1",
                    (PIPELINE_NAME,),
                ).fetchone()
        except sqlite3.OperationalError:
            return 0, 0
        if row is None:
            return 0, 0
        return int(row[0]) + 1, sum(BatchRanges.from_json(row[1]).ends().values())


def run_demo(
    *,
    records: int = 200_000,
    keys: int = 16,
    partitions: int = 4,
    workdir: str | Path = ".demo",
    seed: int | None = None,
    console: Console | None = None,
) -> DemoResult:
    """Run the demo; see the module docstring. Returns the comparison."""
    if records < 1000:
        raise ConfigError(
            f"--records must be at least 1000 so the run spans batches, got {records}"
        )
    if not 1 <= keys <= 1000:
        raise ConfigError(f"--keys must be in 1..1000, got {keys}")
    if not 1 <= partitions <= 64:
        raise ConfigError(f"--partitions must be in 1..64, got {partitions}")
    console = console or Console()
    rng = random.Random(seed)
    work = Path(workdir).resolve()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    log_dir, db = work / "log", work / "sums.db"
    sink_url = f"sqlite:///{db}"
    pipeline_file = work / "pipeline.py"
    limit = max(1, records // partitions // 10)  # about 10 batches
    pipeline_file.write_text(
        _PIPELINE_FILE.format(
            name=PIPELINE_NAME,
            log_dir=str(log_dir),
            topic=TOPIC,
            limit=limit,
            sink_url=sink_url,
            checkpoint=str(work / "checkpoint"),
            pipeline_file=str(pipeline_file),
        )
    )
    console.rule("[bold]sparkonce demo")
    console.print(
        f"{records:,} records (values 1..{records:,}) over {keys} keys and {partitions} "
        f"partitions; batches of at most {limit:,} records per partition.\nWork directory: {work}"
    )

    _produce(log_dir, records, keys, partitions, console)
    expected = expected_sums(records, keys)
    watch = _LedgerWatch(db)
    kills: list[str] = []

    with Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("records committed"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("starting", total=records)

        def tick(label: str) -> tuple[int, int]:
            batches, done = watch.read()
            progress.update(task, completed=done, description=f"{label}: {batches} batches")
            return batches, done

        # Run 1: crash right after the sink commit, before Spark's commit log.
        d1 = Driver(
            pipeline_file,
            work / "run1.log",
            crash_at=CrashPoint.AFTER_LEDGER_COMMIT,
            crash_hit=3,
        ).start()
        code = _wait(d1, lambda: tick("run 1"))
        batches, _ = tick("run 1")
        spark_done = _spark_committed(work / "checkpoint")
        if code != SIGKILL_EXIT:
            _fail_run(console, d1, "run 1 should have been killed at after-ledger-commit")
        kills.append(
            f"run 1: SIGKILL at crash point after-ledger-commit. Ledger: {batches} batches; "
            f"Spark's commit log: {spark_done} batches. The next run replays the batch the "
            "sink already committed, and must skip it."
        )
        progress.console.print(f"[red]✗[/] {kills[-1]}")

        # Run 2: crash at a random moment once it made progress.
        before, _ = tick("run 2")
        d2 = Driver(pipeline_file, work / "run2.log").start()
        target = before + 2
        while d2.poll() is None:
            b, _ = tick("run 2")
            if b >= target:
                time.sleep(rng.uniform(0.0, 1.5))
                d2.kill()
                break
            if d2.seconds > DRIVER_TIMEOUT_S:
                d2.kill()
                _fail_run(console, d2, "run 2 made no progress")
            time.sleep(0.2)
        code = d2.wait(60)
        batches, _ = tick("run 2")
        if code == SIGKILL_EXIT:
            kills.append(
                f"run 2: SIGKILL at a random moment {d2.seconds:.1f} s after start; ledger: "
                f"{batches} batches."
            )
            progress.console.print(f"[red]✗[/] {kills[-1]}")
        elif code != 0:
            _fail_run(console, d2, f"run 2 failed with exit code {code}")
        for line in _grep(work / "run2.log", ": skipped")[:3]:
            message = line.split("sparkonce.run: ", 1)[-1]
            progress.console.print(f"  [yellow]run 2:[/] {message}", markup=True, highlight=False)

        # Run 3: to the end.
        d3 = Driver(pipeline_file, work / "run3.log").start()
        code = _wait(d3, lambda: tick("run 3"))
        tick("run 3")
        if code != 0:
            _fail_run(console, d3, f"run 3 failed with exit code {code}")

    result = _compare(db, expected, records)
    result.kills = kills
    _print_result(console, result, expected, db)
    return result


def _produce(log_dir: Path, records: int, keys: int, partitions: int, console: Console) -> None:
    topic = Topic.create(log_dir, TOPIC, partitions)
    with (
        topic,
        Progress(
            TextColumn("producing"), BarColumn(), MofNCompleteColumn(), console=console
        ) as progress,
        IdempotentProducer(topic, "demo-producer", batch_size=20_000) as producer,
    ):
        task = progress.add_task("produce", total=records)
        for i in range(1, records + 1):
            producer.send(str(i).encode(), key_of(i, keys).encode())
            if i % 20_000 == 0:
                progress.update(task, completed=i)
        producer.flush()
        progress.update(task, completed=records)


def _wait(driver: Driver, tick: Callable[[], object]) -> int:
    while driver.poll() is None:
        tick()
        if driver.seconds > DRIVER_TIMEOUT_S:
            driver.kill()
        time.sleep(0.25)
    return driver.wait(60)


def _spark_committed(checkpoint: Path) -> int:
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return 0
    return sum(1 for p in commits.iterdir() if p.name.isdigit())


def _grep(path: Path, word: str) -> list[str]:
    try:
        return [ln.strip() for ln in path.read_text(errors="replace").splitlines() if word in ln]
    except FileNotFoundError:
        return []


class DemoRunError(RuntimeError):
    pass


def _fail_run(console: Console, driver: Driver, what: str) -> None:
    console.print(f"[bold red]{what}[/]; last lines of {driver.log_path}:")
    console.print(driver.log_tail(40), markup=False, highlight=False)
    raise DemoRunError(what)


def _compare(db: Path, expected: dict[str, tuple[int, int]], records: int) -> DemoResult:
    with sqlite3.connect(db) as conn:
        actual = {
            str(k): (int(t), int(n))
            for k, t, n in conn.execute("SELECT key, total, records FROM sums")
        }
    mismatched = sorted(k for k in set(expected) | set(actual) if expected.get(k) != actual.get(k))
    exp_total = records * (records + 1) // 2
    act_total = sum(t for t, _ in actual.values())
    passed = not mismatched and exp_total == act_total and len(actual) == len(expected)
    return DemoResult(passed, len(expected), len(actual), exp_total, act_total, mismatched)


def _print_result(
    console: Console, result: DemoResult, expected: dict[str, tuple[int, int]], db: Path
) -> None:
    with sqlite3.connect(db) as conn:
        actual = {
            str(k): (int(t), int(n))
            for k, t, n in conn.execute("SELECT key, total, records FROM sums")
        }
    table = Table(title="expected vs actual (SQLite table 'sums')")
    table.add_column("key")
    table.add_column("expected sum", justify="right")
    table.add_column("actual sum", justify="right")
    table.add_column("expected records", justify="right")
    table.add_column("actual records", justify="right")
    table.add_column("")
    for k in sorted(set(expected) | set(actual)):
        e, a = expected.get(k), actual.get(k)
        ok = "[green]ok[/]" if e == a else "[red]MISMATCH[/]"
        table.add_row(
            k,
            f"{e[0]:,}" if e else "-",
            f"{a[0]:,}" if a else "-",
            f"{e[1]:,}" if e else "-",
            f"{a[1]:,}" if a else "-",
            ok,
        )
    console.print(table)
    console.print(f"rows:       expected {result.expected_rows:,}  actual {result.actual_rows:,}")
    console.print(f"total sum:  expected {result.expected_total:,}  actual {result.actual_total:,}")
    console.print(f"driver kills survived: {len(result.kills)}")
    if result.passed:
        console.print(
            "[bold green]PASS[/]: every record took effect exactly once despite the kills"
        )
    else:
        console.print(f"[bold red]FAIL[/]: mismatched keys {result.mismatched_keys}")


def main() -> int:  # pragma: no cover - used by `python -m sparkonce.demo`
    result = run_demo()
    return 0 if result.passed else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
