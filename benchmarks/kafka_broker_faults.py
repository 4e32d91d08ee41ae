"""Issue 44's broker-kill campaign: single Kafka brokers killed with SIGKILL under running
sparkonce pipelines, on a replicated 3-node KRaft cluster (``make bench-broker-faults``).

It starts a throwaway 3-node cluster (``tests/services/kafka.py`` ``start_cluster``: replication
factor 3 everywhere, ``min.insync.replicas=2``) and, for the PostgreSQL pipeline, a throwaway
PostgreSQL server. Then, one pipeline kind after the other:

``k2k``             KafkaSource -> KafkaSink
``k2k-driver-kill`` the same, and once mid-run the driver is SIGKILLed while a broker is down
                    (its process group: driver, JVM and Python workers), then started again
``spark2k``         SparkKafkaSource (Spark's own connector) -> KafkaSink
``k2pg``            KafkaSource -> PostgresTwoPhaseSink

Each runs as a real driver process (``sparkonce run FILE``, a ``processingTime=1 second``
trigger) while a producer feeds its input topic at ``--rate`` records a second. Once the driver
has committed, the script kills one broker at a time, by role in turn: the leader of an input
partition, of an output partition, of the ledger topic, the transaction coordinator of the
sink's driver producer, the active controller (a PostgreSQL pipeline has no output topic,
ledger topic or transactions in Kafka: only the first and the last). The killed broker starts
again ``--restart-delay`` seconds later, on the same ports with its data; the next kill waits
for the run's next commit and for every replica to be back in sync.

Per kill it records the role, the node, the time of the kill, the time of the run's next commit
after it (the ``committed ... as ledger entry`` line the driver logs when the commit has
returned, with the time it carries), so the stall is next commit - kill, and every driver exit
the script did not cause. A driver that exits is started again, so the campaign goes on, and
the exit counts against the kill in progress. At the end the producer stops, the run drains its
input, the driver is stopped with SIGTERM (a clean stop between commits), and an independent
reader compares output and input: confluent-kafka's consumer at ``isolation.level=
read_committed`` for Kafka outputs, psycopg for PostgreSQL (and no prepared transaction left).

Results: ``benchmarks/results/kafka-broker-faults.json`` (``--out`` for another file): kills,
driver exits caused by a broker kill, the exactly-once verdict per pipeline, median and p95
stall, one row per kill, machine, commit and date. A run of fewer than 30 kills is labelled
``"smoke": true``. Progress shows on the console as it goes.

    python benchmarks/kafka_broker_faults.py [--kills 30] [--pipelines k2k,k2pg] [--seed 1]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from benchmarks._common import machine, pct, write_results  # noqa: E402  (after the path)

if TYPE_CHECKING:
    from rich.console import Console
    from tests.services.kafka import KafkaCluster

    from sparkonce.verify.driver import Driver

RESULTS = REPO / "benchmarks" / "results" / "kafka-broker-faults.json"
CAMPAIGN_KILLS = 30  # issue 44's "Done when": fewer is a smoke run
PARTITIONS = 3
TABLE = "bf_out"
QUIET_S = 8.0
CLEAN_STOP = {0, 128 + signal.SIGTERM}  # `sparkonce run` stopped by SIGTERM between commits

# Roles a broker can hold for a pipeline; a kill picks the node that holds it then.
INPUT_LEADER = "input-leader"
OUTPUT_LEADER = "output-leader"
LEDGER_LEADER = "ledger-leader"
COORDINATOR = "coordinator"
CONTROLLER = "controller"
KAFKA_OUTPUT_ROLES = (INPUT_LEADER, OUTPUT_LEADER, COORDINATOR, CONTROLLER, LEDGER_LEADER)
POSTGRES_OUTPUT_ROLES = (INPUT_LEADER, CONTROLLER)


@dataclasses.dataclass(frozen=True)
class Kind:
    """One pipeline kind of the campaign."""

    source: str  # "kafka" (KafkaSource) or "spark" (SparkKafkaSource)
    sink: str  # "kafka" (KafkaSink) or "postgres" (PostgresTwoPhaseSink)
    driver_kill: bool = False
    about: str = ""

    @property
    def roles(self) -> tuple[str, ...]:
        return KAFKA_OUTPUT_ROLES if self.sink == "kafka" else POSTGRES_OUTPUT_ROLES


KINDS = {
    "k2k": Kind("kafka", "kafka", about="KafkaSource -> KafkaSink"),
    "k2k-driver-kill": Kind(
        "kafka", "kafka", True, about="KafkaSource -> KafkaSink, one driver SIGKILL mid-run"
    ),
    "spark2k": Kind("spark", "kafka", about="SparkKafkaSource -> KafkaSink"),
    "k2pg": Kind("kafka", "postgres", about="KafkaSource -> PostgresTwoPhaseSink"),
}

_PIPELINE_FILE = '''"""Written by benchmarks/kafka_broker_faults.py: {about}."""

from pyspark.sql import functions as F

from sparkonce import KafkaSink, KafkaSource, Pipeline, SparkKafkaSource, sink_from_url


def copy(df):
    return df.select(F.col("key"), F.col("value"))


pipeline = Pipeline(
    name={name!r},
    source={source},
    transform=copy,
    sink={sink},
    checkpoint={checkpoint!r},
    trigger="processingTime=1 second",
)
'''

# What `sparkonce run` logs once a batch's commit has returned (pipeline/runner.py).
_COMMITTED = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) INFO \S+: pipeline \S+ batch (\d+): committed "
)


def pipeline_file(
    kind: Kind, name: str, bootstrap: str, topics: tuple[str, str], checkpoint: Path, pg_url: str
) -> str:
    """The pipeline file of ``kind`` reading ``topics[0]`` into ``topics[1]`` (or PostgreSQL)."""
    limit = (
        "max_records_per_batch=600" if kind.source == "spark" else "max_records_per_partition=200"
    )
    cls = "SparkKafkaSource" if kind.source == "spark" else "KafkaSource"
    source = f'{cls}({bootstrap!r}, {topics[0]!r}, value_format="utf8", {limit})'
    if kind.sink == "kafka":
        sink = f"KafkaSink({bootstrap!r}, {topics[1]!r})"
    else:
        sink = f"sink_from_url({pg_url!r}, {TABLE!r}, two_phase=True)"
    return _PIPELINE_FILE.format(
        about=kind.about, name=name, source=source, sink=sink, checkpoint=str(checkpoint)
    )


# --- the input ----------------------------------------------------------------------------------


class Feeder:
    """Produces ``rate`` records a second into ``topic`` from a thread (an idempotent producer
    with acks=all, which rides out a broker's death by itself): value ``<prefix>-<n>``."""

    def __init__(self, bootstrap: str, topic: str, prefix: str, rate: int) -> None:
        from confluent_kafka import Producer

        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "log_level": 0}
        )
        self.topic, self.prefix, self.rate = topic, prefix, rate
        self.sent = self.delivered = self.failed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"feed-{topic}", daemon=True)

    def start(self) -> Feeder:
        self._thread.start()
        return self

    def _delivered(self, err: Any, _msg: Any) -> None:
        if err is None:
            self.delivered += 1
        else:
            self.failed += 1

    def _run(self) -> None:
        step = 0.1
        per_step = max(1, round(self.rate * step))
        next_at = time.monotonic()
        while not self._stop.is_set():
            for _ in range(per_step):
                self.producer.produce(
                    self.topic,
                    value=f"{self.prefix}-{self.sent}".encode(),
                    key=str(self.sent).encode(),
                    on_delivery=self._delivered,
                )
                self.sent += 1
            self.producer.poll(0)
            next_at += step
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        left = self.producer.flush(300)
        if left:
            raise RuntimeError(f"{left} records to {self.topic} not delivered within 300 s")


# --- independent readers ------------------------------------------------------------------------


def read_committed(bootstrap: str, topic: str, timeout: float = 120.0) -> list[str]:
    """Every value of ``topic`` as confluent-kafka's consumer reads it at read_committed, up
    to the partitions' ends now (a still open transaction holds the read back: an error)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"broker-faults-reader-{os.getpid()}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 0,
        }
    )
    try:
        parts = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        ends = {tp.partition: consumer.get_watermark_offsets(tp, 30)[1] for tp in parts}
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        values: list[str] = []
        done = {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + timeout
        while len(done) < PARTITIONS:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"read_committed reader of {topic}: not at the ends {ends} within "
                    f"{timeout:.0f} s (a transaction still open?)"
                )
            for m in consumer.consume(1000, timeout=1.0):
                if m.error() is None:
                    values.append((m.value() or b"").decode())
            for tp in consumer.position(parts):
                if tp.offset >= ends[tp.partition]:
                    done.add(tp.partition)
        return values
    finally:
        consumer.close()


def read_postgres(url: str) -> tuple[list[str], int]:
    """(every value of the output table, the server's prepared transactions left)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        values = [str(r[0]) for r in conn.execute(f"SELECT value FROM {TABLE}")]
        prepared = conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()
    return values, int(prepared[0]) if prepared else 0


def verdict(inputs: list[str], outputs: list[str]) -> dict[str, Any]:
    """Output against input as multisets: lost, duplicated and extra values."""
    want, got = Counter(inputs), Counter(outputs)
    lost = sum((want - got).values())
    extra = sum(n for v, n in got.items() if v not in want)
    duplicated = sum(n - want[v] for v, n in got.items() if v in want and n > want[v])
    return {
        "input": len(inputs),
        "output": len(outputs),
        "lost": lost,
        "duplicated": duplicated,
        "extra": extra,
        "exactly_once": lost == duplicated == extra == 0,
    }


# --- the driver and its commits -----------------------------------------------------------------


class Run:
    """The driver processes of one pipeline kind (one at a time) and the commits they log."""

    def __init__(self, name: str, file: Path, workdir: Path) -> None:
        self.name, self.file, self.workdir = name, file, workdir
        self.drivers: list[Driver] = []
        self.commits: list[float] = []  # Unix times of the logged commits, in order
        self._read: dict[Path, int] = {}

    @property
    def driver(self) -> Driver:
        return self.drivers[-1]

    def start_driver(self) -> Driver:
        from sparkonce.verify.driver import Driver

        path = os.pathsep.join(
            p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH", "")) if p
        )
        driver = Driver(
            self.file,
            self.workdir / f"driver-{len(self.drivers) + 1}.log",
            env={"PYTHONPATH": path},
            extra_args=("--quick-start",),
        )
        self.drivers.append(driver.start())
        return driver

    def scan(self) -> list[float]:
        """Read the new lines of every driver log; return all commit times so far."""
        for driver in self.drivers:
            path = driver.log_path
            with contextlib.suppress(FileNotFoundError), path.open("rb") as f:
                f.seek(self._read.get(path, 0))
                chunk = f.read()
                complete = chunk[: chunk.rfind(b"\n") + 1]
                self._read[path] = self._read.get(path, 0) + len(complete)
                for line in complete.decode("utf-8", "replace").splitlines():
                    m = _COMMITTED.match(line)
                    if m:
                        at = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
                        self.commits.append(at.timestamp())
        self.commits.sort()
        return self.commits

    def next_commit(self, after: float) -> float | None:
        return next((t for t in self.scan() if t > after), None)

    def exited(self) -> int | None:
        """The exit code of the current driver if it ended by itself (not by our signal)."""
        code = self.driver.poll()
        if code is None or self.driver.killed_by_us:
            return None
        self.driver.wait()
        return code

    def error_line(self) -> str:
        """The last line of the current driver's log that names an error."""
        lines = self.driver.log_tail(60).splitlines()
        named = [x for x in lines if "rror" in x or "exit" in x]
        return (named or lines or [""])[-1][-400:]

    def stop(self, timeout: float = 180.0) -> int:
        driver = self.driver
        if driver.poll() is None:
            driver.signal_group(signal.SIGTERM)
        try:
            return driver.wait(timeout)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait(30)
            raise RuntimeError(
                f"{self.name}: the driver did not stop within {timeout:.0f} s of SIGTERM; "
                f"its log: {driver.log_path}"
            ) from None


# --- the campaign -------------------------------------------------------------------------------


@dataclasses.dataclass
class Settings:
    kills: int
    pipelines: list[str]
    seed: int
    rate: int
    restart_delay: float
    gap: tuple[float, float]
    stall_timeout: float
    workdir: Path


class Campaign:
    def __init__(
        self, settings: Settings, cluster: KafkaCluster, pg_url: str, console: Console
    ) -> None:
        self.s, self.cluster, self.pg_url, self.console = settings, cluster, pg_url, console
        self.rng = random.Random(settings.seed)
        self.rows: list[dict[str, Any]] = []
        self.exits: list[dict[str, Any]] = []
        self.restarts: list[dict[str, Any]] = []

    def node_for(self, role: str, name: str, topics: tuple[str, str]) -> tuple[int, str]:
        """(the node holding ``role`` for pipeline ``name`` now, what exactly it holds)."""
        from sparkonce.ledger.kafka_topic import transactional_id
        from sparkonce.sinks.kafka import LEDGER_SUFFIX

        c = self.cluster
        if role == INPUT_LEADER:
            p = self.rng.randrange(PARTITIONS)
            return c.leader(topics[0], p), f"{topics[0]}[{p}]"
        if role == OUTPUT_LEADER:
            p = self.rng.randrange(PARTITIONS)
            return c.leader(topics[1], p), f"{topics[1]}[{p}]"
        if role == LEDGER_LEADER:
            ledger = topics[1] + LEDGER_SUFFIX
            return c.leader(ledger, 0), f"{ledger}[0]"
        if role == COORDINATOR:
            tid = transactional_id(name, topics[1], "driver")  # the one every commit uses
            return c.coordinator(tid), tid
        if role == CONTROLLER:
            return c.controller(), "the quorum"
        raise ValueError(f"unknown role {role!r}")

    def wait_commit(self, run: Run, after: float, kill: int | None) -> float | None:
        """The time of the run's first commit after ``after``; a driver that exits meanwhile
        is recorded (against ``kill``) and started again."""
        deadline = time.monotonic() + self.s.stall_timeout
        while time.monotonic() < deadline:
            found = run.next_commit(after)
            if found is not None:
                return found
            self.check_driver(run, kill)
            time.sleep(0.2)
        return None

    def check_driver(self, run: Run, kill: int | None) -> None:
        code = run.exited()
        if code is None:
            return
        row = self.rows[-1] if kill is not None and self.rows else None
        exit_ = {
            "pipeline": run.name,
            "exit_code": code,
            "during_kill": kill,
            "role": row["role"] if row else None,
            "at": _iso(time.time()),
            "log": str(run.driver.log_path),
            "error": run.error_line(),
        }
        self.exits.append(exit_)
        if row is not None:
            row["driver_exits"].append(code)
        self.console.log(f"[red]{run.name}: driver exited with {code}[/]: {exit_['error']}")
        run.start_driver()

    def pipeline(self, name: str, kills: int, advance: Callable[[str], None]) -> dict[str, Any]:
        kind = KINDS[name]
        c = self.cluster
        work = self.s.workdir / name
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        topics = (f"{name}-in", f"{name}-out")
        c.create_topic(topics[0], PARTITIONS)
        if kind.sink == "kafka":
            c.create_topic(topics[1], PARTITIONS)
        file = work / "pipeline.py"
        file.write_text(
            pipeline_file(kind, name, c.bootstrap, topics, work / "checkpoint", self.pg_url)
        )
        feeder = Feeder(c.bootstrap, topics[0], name, self.s.rate).start()
        run = Run(name, file, work)
        run.start_driver()
        roles = list(kind.roles)
        self.rng.shuffle(roles)
        driver_kill_at = kills // 2 if kind.driver_kill else -1
        advance(f"{name}: starting the driver")
        try:
            started = time.time()
            first = self.wait_commit(run, 0.0, None)
            if first is None:
                raise RuntimeError(
                    f"{name}: no commit within {self.s.stall_timeout:.0f} s of the driver's "
                    f"start; its log: {run.driver.log_path}"
                )
            self.console.log(f"{name}: first commit {first - started:.1f} s after the start")
            for i in range(kills):
                time.sleep(self.rng.uniform(*self.s.gap))
                self.check_driver(run, None)
                self.kill_one(run, name, topics, i, roles[i % len(roles)], i == driver_kill_at)
                advance(f"{name}: kill {i + 1}/{kills} done")
            feeder.stop()
            check = self.drain_and_check(run, kind, topics, feeder)
        finally:
            with contextlib.suppress(Exception):
                feeder.stop()
            for driver in run.drivers:
                if driver.poll() is None:
                    driver.kill()
                    driver.wait(30)
        check["driver_runs"] = len(run.drivers)
        check["commits"] = len(run.scan())
        return check

    def kill_one(
        self, run: Run, name: str, topics: tuple[str, str], i: int, role: str, driver_kill: bool
    ) -> None:
        c = self.cluster
        node, holds = self.node_for(role, name, topics)
        killed_at = time.time()
        c.kill(node)
        row: dict[str, Any] = {
            "pipeline": name,
            "kill": i,
            "role": role,
            "holds": holds,
            "node": node,
            "killed_at": _iso(killed_at),
            "driver_killed": False,
            "driver_exits": [],
        }
        self.rows.append(row)
        restart_at = time.monotonic() + self.s.restart_delay
        restarted = 0.0
        if driver_kill:
            time.sleep(self.rng.uniform(0.5, min(2.0, self.s.restart_delay)))
            run.driver.kill()
            run.driver.wait(60)
            row["driver_killed"] = True
            restarted = time.time()
            run.start_driver()
            self.restarts.append({"pipeline": name, "kill": i, "started_at": _iso(restarted)})
        while time.monotonic() < restart_at:
            self.check_driver(run, i)
            time.sleep(0.2)
        c.start_node(node)
        row["down_s"] = round(time.time() - killed_at, 2)
        committed = self.wait_commit(run, killed_at, i)
        row["next_commit_at"] = None if committed is None else _iso(committed)
        row["stall_s"] = None if committed is None else round(committed - killed_at, 2)
        if driver_kill and committed is not None:
            self.restarts[-1]["first_commit_s"] = round(committed - restarted, 2)
        c.wait_in_sync(120)
        self.check_driver(run, i)
        stall = "no commit" if committed is None else f"stall {row['stall_s']:.1f} s"
        extra = " (and the driver SIGKILLed)" if driver_kill else ""
        self.console.log(
            f"{name} kill {i + 1}: {role} node {node} ({holds}){extra}: back after "
            f"{row['down_s']:.1f} s, {stall}"
        )

    def drain_and_check(
        self, run: Run, kind: Kind, topics: tuple[str, str], feeder: Feeder
    ) -> dict[str, Any]:
        """Wait until the output holds every input record (or ``stall_timeout``), stop the
        driver with SIGTERM, then compare output and input with independent readers."""
        c = self.cluster
        inputs = read_committed(c.bootstrap, topics[0])

        def output(timeout: float = 120.0) -> list[str]:
            if kind.sink == "kafka":
                return read_committed(c.bootstrap, topics[1], timeout)
            return read_postgres(self.pg_url)[0]

        # Drained: no commit for QUIET_S (Spark runs no batch without new input), and the
        # output as long as the input.
        deadline = time.monotonic() + self.s.stall_timeout
        while True:
            self.check_driver(run, None)
            commits = run.scan()
            if commits and time.time() - commits[-1] > QUIET_S:
                with contextlib.suppress(Exception):
                    if len(output(30.0)) >= len(inputs):
                        break
            if time.monotonic() > deadline:
                self.console.log(f"[red]{run.name}: output short of the input at the deadline[/]")
                break
            time.sleep(2.0)
        code = run.stop()
        if code not in CLEAN_STOP:
            self.exits.append(
                {
                    "pipeline": run.name,
                    "exit_code": code,
                    "during_kill": None,
                    "role": None,
                    "at": _iso(time.time()),
                    "log": str(run.driver.log_path),
                    "error": run.error_line(),
                }
            )
        result = verdict(inputs, output())
        if kind.sink == "postgres":
            result["prepared_transactions_left"] = read_postgres(self.pg_url)[1]
            result["exactly_once"] = (
                result["exactly_once"] and result["prepared_transactions_left"] == 0
            )
        result["reader"] = (
            "confluent-kafka consumer, isolation.level=read_committed"
            if kind.sink == "kafka"
            else "psycopg, SELECT value FROM the table; pg_prepared_xacts"
        )
        result["input_delivery_failures"] = feeder.failed
        result["final_stop_exit_code"] = code
        mark = "[green]exactly-once[/]" if result["exactly_once"] else "[red]NOT exactly-once[/]"
        self.console.log(f"{run.name}: {mark} {result}")
        return result


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat(timespec="milliseconds")


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "n": len(values),
        "median": round(statistics.median(values), 2) if values else None,
        "p95": pct(values, 95),
        "max": max(values) if values else None,
    }


def split_kills(kills: int, pipelines: list[str]) -> dict[str, int]:
    """``kills`` over the pipelines, in turn (the first ones get the remainder)."""
    return {
        p: kills // len(pipelines) + (i < kills % len(pipelines)) for i, p in enumerate(pipelines)
    }


def summary(
    rows: list[dict[str, Any]], exits: list[dict[str, Any]], checks: dict[str, Any]
) -> list[dict[str, Any]]:
    """One row per pipeline kind and one for all (the docs' table of this file): kills,
    driver exits a broker kill caused, the verdict, stalls (driver kills left out), counts."""

    def row(kind: str, mine: list[str]) -> dict[str, Any]:
        kills = [r for r in rows if r["pipeline"] in mine]
        stalls = [
            r["stall_s"] for r in kills if r["stall_s"] is not None and not r["driver_killed"]
        ]
        stats = _stats(stalls)
        c = [checks[p] for p in mine if p in checks]
        return {
            "kind": kind,
            "kills": len(kills),
            "driver_exits": sum(
                1 for e in exits if e["pipeline"] in mine and e["during_kill"] is not None
            ),
            "exactly_once": bool(c) and all(x["exactly_once"] for x in c),
            "stall_median_s": stats["median"],
            "stall_p95_s": stats["p95"],
            "stall_max_s": stats["max"],
            "input": sum(x["input"] for x in c),
            "output": sum(x["output"] for x in c),
            "lost": sum(x["lost"] for x in c),
            "duplicated": sum(x["duplicated"] for x in c),
        }

    names = list(checks)
    return [row(p, [p]) for p in names] + ([row("all", names)] if len(names) > 1 else [])


def report(settings: Settings, campaign: Campaign, checks: dict[str, Any]) -> dict[str, Any]:
    rows = campaign.rows
    broker_only = [
        r["stall_s"] for r in rows if r["stall_s"] is not None and not r["driver_killed"]
    ]
    every = [r["stall_s"] for r in rows if r["stall_s"] is not None]
    caused = [e for e in campaign.exits if e["during_kill"] is not None]
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "benchmark": "kafka-broker-faults",
        "smoke": settings.kills < CAMPAIGN_KILLS,
        "date": time.strftime("%Y-%m-%d"),
        "commit": commit or None,
        "machine": machine(),
        "load_average_at_end": os.getloadavg(),
        "cluster": "3 KRaft nodes (broker+controller each) on 127.0.0.1, replication factor 3 "
        "everywhere, min.insync.replicas=2 (tests/services/kafka.py start_cluster)",
        "settings": {
            "kills": settings.kills,
            "pipelines": {p: KINDS[p].about for p in settings.pipelines},
            "seed": settings.seed,
            "rate_records_per_s": settings.rate,
            "restart_delay_s": settings.restart_delay,
            "gap_s": list(settings.gap),
            "stall_timeout_s": settings.stall_timeout,
            "trigger": "processingTime=1 second",
        },
        "stall": "seconds from a broker's SIGKILL to the run's next commit (the time in the "
        "driver's 'committed ... as ledger entry' log line, logged once the commit returned)",
        "kills": len(rows),
        "kills_without_commit": sum(r["stall_s"] is None for r in rows),
        "driver_exits_caused_by_broker_kill": len(caused),
        "driver_exits": campaign.exits,
        "exactly_once": {p: c["exactly_once"] for p, c in checks.items()},
        "checks": checks,
        "summary": summary(rows, campaign.exits, checks),
        "stall_s": _stats(broker_only),
        "stall_s_with_driver_kills": _stats(every),
        "driver_restarts": campaign.restarts,
        "rows": rows,
    }


@contextlib.contextmanager
def services(workdir: Path, pg: bool) -> Iterator[tuple[KafkaCluster, str]]:
    from tests.services import kafka as kafka_service
    from tests.services import postgres as pg_service

    cluster = kafka_service.start_cluster(workdir / "kafka")
    try:
        if not pg:
            yield cluster, ""
            return
        server = pg_service.start(workdir / "postgres")
        try:
            yield cluster, server.url
        finally:
            pg_service.remove(workdir / "postgres")  # and its relocated cluster, if any
    finally:
        cluster.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Kill single Kafka brokers under running sparkonce pipelines (issue 44)."
    )
    parser.add_argument("--kills", type=int, default=CAMPAIGN_KILLS, help="in all (default 30)")
    parser.add_argument(
        "--pipelines",
        default=",".join(KINDS),
        help=f"comma-separated, of {', '.join(KINDS)} (default: all); kills go to each in turn",
    )
    parser.add_argument("--seed", type=int, default=1, help="picks roles, partitions and gaps")
    parser.add_argument("--rate", type=int, default=100, help="input records a second")
    parser.add_argument("--restart-delay", type=float, default=5.0, help="seconds a node is down")
    parser.add_argument(
        "--stall-timeout", type=float, default=300.0, help="give up waiting for a commit after"
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="the results file")
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temp directory")
    args = parser.parse_args(argv)
    pipelines = [p.strip() for p in args.pipelines.split(",") if p.strip()]
    unknown = [p for p in pipelines if p not in KINDS]
    if unknown or not pipelines or args.kills < 1:
        parser.error(f"--pipelines takes {', '.join(KINDS)} and --kills at least 1")
    if args.kills < len(pipelines):
        parser.error(f"--kills {args.kills} leaves a pipeline of {pipelines} without a kill")

    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True, log_path=False)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="broker-faults-"))
    settings = Settings(
        kills=args.kills,
        pipelines=pipelines,
        seed=args.seed,
        rate=args.rate,
        restart_delay=args.restart_delay,
        gap=(1.0, 3.0),
        stall_timeout=args.stall_timeout,
        workdir=workdir,
    )
    per_pipeline = split_kills(args.kills, pipelines)
    checks: dict[str, Any] = {}
    with (
        Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.completed}/{task.total} kills"),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
        services(workdir, "k2pg" in pipelines) as (cluster, pg_url),
    ):
        task = progress.add_task("starting", total=args.kills)
        campaign = Campaign(settings, cluster, pg_url, console)

        def advance(what: str) -> None:
            progress.update(task, description=what, advance=1 if what.endswith("done") else 0)

        for name in pipelines:
            checks[name] = campaign.pipeline(name, per_pipeline[name], advance)
    result = report(settings, campaign, checks)
    write_results(args.out, result)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    s = result["stall_s"]
    console.print(
        f"{result['kills']} kills, {result['driver_exits_caused_by_broker_kill']} driver exits "
        f"caused by a broker kill, exactly-once: {result['exactly_once']}, stall median "
        f"{s['median']} s, p95 {s['p95']} s -> {args.out}"
    )
    ok = all(result["exactly_once"].values()) and not result["driver_exits"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
