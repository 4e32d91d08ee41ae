"""The Spark Connect crash matrix: each sink family under each fault kind (issue 46, item 4).

A cell runs one fault on one family, on a real Spark Connect server, and ends with what a
failure-free run leaves: every value of the log once in the sink.

* ``kill-client``: SIGKILL of the client (``sparkonce run --remote``) after its second
  commit. Its query lives on in the server, still committing with epoch 1, until the next
  run takes epoch 2 (Spark stops the older query of the same checkpoint).
* ``kill-server``: SIGKILL of the server's whole process group (JVM and Python workers)
  after the run's second commit, whatever the commit was doing then. The client gives up
  within sparkonce's bound with exit 4; a run against a new server resumes.
* ``zombie``: after a run, a newer one takes the pipeline (epoch + 1); the older run's
  batch function, started again as a query still alive in the server would run it, must
  be fenced by the store and leave the sink as it was.

Every family runs the same pipeline file (the embedded log as the source, only the sink
expression and the columns differ) and is read back by an oracle that is not sparkonce:
sqlite3, psycopg, confluent-kafka at ``read_committed``, pyarrow on the Delta table's log.
Where the family's ledger can be read that way too (the SQL ledger tables, the Kafka
ledger topic's JSON records, the Delta log's ``txn`` actions), the cell also checks which
epochs committed: that epoch 2 took over after a kill, and that the zombie added nothing.

Zombies of the Kafka sink are also fenced in
``test_connect_pipeline.py::test_kafka_source_into_kafka_sink_on_connect_is_exact_skips_a_replay_and_fences_a_zombie``,
with ``KafkaSource`` (stable task keys from Kafka partitions); the cell here reads the
embedded log.

Cost: the client and zombie cells share the session's Connect server (``connect_url``);
only a server kill starts servers of its own (two).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sparkonce.pipeline.loader import load_pipeline
from tests.connect.conftest import ConnectServer, start_zombie
from tests.connect.test_connect_delta import commits
from tests.connect.test_connect_pipeline import (
    VALUE_COLUMNS,
    cli_pipeline,
    client_env,
    committed_messages,
    read_url,
    wait_for_commits,
)
from tests.delta.test_delta_log import delta_rows

# In the CI rotation, as the other Connect tests.
pytestmark = pytest.mark.campaign_lane

PIPELINE = "cli"  # the pipeline file's name (tests/connect/test_connect_pipeline.py)
FAMILIES = ("sqlite", "postgres", "postgres-2pc", "kafka", "delta")
FAULTS = ("kill-client", "kill-server", "zombie")
# The kill cells' log: 200 values in 2 partitions. At 5 records per partition per batch
# (20 for Delta, whose commits cost seconds each on Connect) a run has 20 (5) batches, so
# a kill after the second commit leaves work for the run after it.
KILL_VALUES = 200
# The zombie cells': a first run of 40 values, then 20 more that only the zombie reads.
ZOMBIE_VALUES, ZOMBIE_MORE = 40, 20


@dataclass
class Family:
    """One sink family as the cells see it: what the pipeline file writes into and how the
    sink is read back without sparkonce.

    ``values``: a Counter of the values in the sink (what readers see); ``entries``: the
    ledger's committed batches per epoch; ``owner``: the epoch that owns the pipeline;
    ``leftovers``: what a crash must not leave behind (named, with its count)."""

    name: str
    sink: str  # the pipeline file's sink expression (Python source)
    values: Callable[[], Counter[int]]
    entries: Callable[[], Counter[int]]
    owner: Callable[[], int]
    columns: str = VALUE_COLUMNS
    batch: int = 5  # records per log partition per batch
    leftovers: Callable[[], dict[str, int]] = field(default=lambda: {})

    def committed(self) -> int:
        """Committed batches in the ledger (for wait_for_commits)."""
        return sum(self.entries().values())


def sql_family(name: str, url: str, two_phase: bool = False) -> Family:
    """SQLite or PostgreSQL (``two_phase``: PostgresTwoPhaseSink), read with sqlite3 or
    psycopg: the output table (the two-phase sink's view), ``sparkonce_ledger`` and
    ``sparkonce_owner``."""
    option = ", two_phase=True" if two_phase else ""

    def leftovers() -> dict[str, int]:
        """Two-phase: no prepared transaction, no pre-committed attempt and no row outside
        the view after a run."""
        if not two_phase:
            return {}
        attempts = "SELECT COUNT(*) FROM sparkonce_attempts WHERE state <> 'committed'"
        hidden = "SELECT (SELECT COUNT(*) FROM out__sparkonce_data) - (SELECT COUNT(*) FROM out)"
        return {
            "prepared transactions": read_url(url, "SELECT COUNT(*) FROM pg_prepared_xacts")[0][0],
            "pre-committed attempts": read_url(url, attempts)[0][0],
            "rows outside the view": read_url(url, hidden)[0][0],
        }

    return Family(
        name,
        f"sink_from_url({url!r}, 'out'{option})",
        values=lambda: Counter(v for (v,) in read_url(url, "SELECT value FROM out")),
        entries=lambda: Counter(
            dict(read_url(url, "SELECT epoch, COUNT(*) FROM sparkonce_ledger GROUP BY epoch"))
        ),
        owner=lambda: int(
            read_url(url, f"SELECT epoch FROM sparkonce_owner WHERE pipeline = '{PIPELINE}'")[0][0]
        ),
        leftovers=leftovers,
    )


def kafka_family(bootstrap: str, topic: str) -> Family:
    """KafkaSink into ``topic``: its values, and its ledger topic's owner and batch records
    (JSON, one partition), read with confluent-kafka at read_committed."""

    def ledger() -> list[dict[str, Any]]:
        records = [json.loads(v or b"{}") for v in committed_messages(bootstrap, ledger_topic)]
        return [r for r in records if r.get("pipeline") == PIPELINE]

    ledger_topic = f"{topic}.sparkonce-ledger"
    return Family(
        "kafka",
        f"sink_from_url('kafka://{bootstrap}/{topic}')",
        values=lambda: Counter(int(v or b"-1") for v in committed_messages(bootstrap, topic)),
        entries=lambda: Counter(r["epoch"] for r in ledger() if r.get("type") == "batch"),
        owner=lambda: [r["epoch"] for r in ledger() if r.get("type") == "owner"][-1],
        columns='F.col("value").cast("string").alias("value")',
    )


def delta_family(table: Path) -> Family:
    """DeltaSink at ``table``: its rows from the JSON commits and Parquet files (pyarrow),
    and the ``(epoch, entries)`` of each ``txn`` of the pipeline."""

    def batches() -> list[dict[str, Any]]:
        return [c for c in commits(table, PIPELINE) if c["meta"].get("sparkonce") == "batch"]

    return Family(
        "delta",
        f"sink_from_url('delta://{table}')",
        values=lambda: Counter(r["value"] for r in delta_rows(table)),
        entries=lambda: Counter(c["txn"][0] for c in batches()),
        owner=lambda: commits(table, PIPELINE)[-1]["txn"][0],
        batch=20,
    )


def family_of(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> Family:
    """The family ``name`` with a fresh store: its database, topic or table."""
    if name == "sqlite":
        return sql_family(name, f"sqlite:///{tmp_path / 'sink.db'}")
    if name in ("postgres", "postgres-2pc"):
        url = str(request.getfixturevalue("pg_url"))
        return sql_family(name, url, two_phase=name == "postgres-2pc")
    if name == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        topic = request.getfixturevalue("kafka_topic")("out", partitions=2)
        return kafka_family(broker.bootstrap, topic)
    assert name == "delta", name
    return delta_family(tmp_path / "table")


def assert_every_value_once(family: Family, count: int) -> None:
    counts = family.values()
    assert sorted(counts) == list(range(1, count + 1)), (
        f"{family.name}: missing {sorted(set(range(1, count + 1)) - set(counts))[:20]}, "
        f"foreign {sorted(set(counts) - set(range(1, count + 1)))[:20]}"
    )
    assert set(counts.values()) == {1}, {v: n for v, n in counts.items() if n > 1}
    left = family.leftovers()
    assert not any(left.values()), f"{family.name} left behind: {left}"


def kill_client(
    family: Family, request: pytest.FixtureRequest, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """SIGKILL of the client after its second commit: its query lives on in the server, a
    zombie holding epoch 1. The next run (in this process, from the same file) takes epoch
    2, and the sink ends with every value once."""
    connect_url = request.getfixturevalue("connect_url")
    connect_spark = request.getfixturevalue("connect_spark")
    log = make_log(KILL_VALUES, partitions=2)
    pipeline_file, _ = cli_pipeline(
        tmp_path, log, family.batch, sink=family.sink, columns=family.columns
    )
    client = subprocess.Popen(
        [sys.executable, "-m", "sparkonce", "run", str(pipeline_file), "--remote", connect_url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=client_env(),
    )
    try:
        wait_for_commits(client, family.committed, 2)
        client.send_signal(signal.SIGKILL)
    finally:
        client.kill()
        client.wait()

    report = load_pipeline(pipeline_file).run(connect_spark)  # the same pipeline, file and all
    assert report.epoch == 2, report
    assert_every_value_once(family, KILL_VALUES)
    per_epoch = family.entries()
    print(f"{family.name}: ledger entries per epoch: {dict(per_epoch)}")
    assert set(per_epoch) == {1, 2} and per_epoch[1] >= 2, per_epoch


def kill_server(
    family: Family, request: pytest.FixtureRequest, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """SIGKILL of the Spark Connect server itself (its JVM and Python workers, a process
    group of its own) after the run's second commit, whatever the commit was doing then.
    The client fails; a run of the same pipeline against a new server resumes from the
    ledger and the checkpoint the dead server left, and the sink ends with every value
    once."""
    log = make_log(KILL_VALUES, partitions=2)
    pipeline_file, _ = cli_pipeline(
        tmp_path, log, family.batch, sink=family.sink, columns=family.columns
    )
    run = [sys.executable, "-m", "sparkonce", "run", str(pipeline_file), "--remote"]
    first_server = ConnectServer(tmp_path / "server1.log")
    client = subprocess.Popen(
        [*run, first_server.url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=client_env(),
    )
    try:
        wait_for_commits(client, family.committed, 2)
        first_server.kill()
        killed = time.monotonic()
        _, err = client.communicate(timeout=180)
        gave_up_s = time.monotonic() - killed
    finally:
        first_server.kill()
        client.kill()
        client.wait()
    # exit 4 (unavailable), with one line saying what happened and what to do, within about
    # sparkonce's bound on the client's retries (30 s; PySpark's own is 10 minutes)
    assert client.returncode == 4, err[-3000:]
    assert b"the Spark Connect server stopped answering" in err, err[-3000:]
    assert b"Run the pipeline again once the server is back" in err
    assert gave_up_s < 90, gave_up_s

    second_server = ConnectServer(tmp_path / "server2.log")
    try:
        again = subprocess.run(
            [*run, second_server.url], capture_output=True, text=True, env=client_env(), timeout=400
        )
    finally:
        second_server.stop()
    assert again.returncode == 0, again.stderr[-3000:]
    assert_every_value_once(family, KILL_VALUES)
    per_epoch = family.entries()
    print(
        f"{family.name}: ledger entries per epoch: {dict(per_epoch)}; "
        f"the client gave up in {gave_up_s:.0f} s"
    )
    assert set(per_epoch) == {1, 2} and per_epoch[1] >= 2, per_epoch


def zombie(
    family: Family, request: pytest.FixtureRequest, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """A run's batch function holds its epoch by value; once a newer run has taken the
    pipeline, the old function's next commit, in the server's worker, is refused by the
    store (the query fails, naming the fencing) and writes nothing."""
    connect_spark = request.getfixturevalue("connect_spark")
    log = make_log(ZOMBIE_VALUES, partitions=2)
    pipeline_file, _ = cli_pipeline(
        tmp_path, log, family.batch, sink=family.sink, columns=family.columns
    )
    p = load_pipeline(pipeline_file)
    first = p.run(connect_spark)
    assert first.epoch == 1, first
    assert_every_value_once(family, ZOMBIE_VALUES)
    before = family.entries()
    assert set(before) == {1} and sum(before.values()) == first.batches_committed, before

    make_log(ZOMBIE_MORE, partitions=2, start=ZOMBIE_VALUES + 1)
    newer = load_pipeline(pipeline_file).sink
    newer.open()
    try:
        assert newer.acquire(PIPELINE).epoch == 2
    finally:
        newer.close()
    query = start_zombie(connect_spark, p, 1, tmp_path / "chk")
    with pytest.raises(Exception, match=r"FencedError|fenced"):
        query.awaitTermination()
    assert_every_value_once(family, ZOMBIE_VALUES)
    assert family.entries() == before
    assert family.owner() == 2


CELLS = {"kill-client": kill_client, "kill-server": kill_server, "zombie": zombie}


@pytest.mark.parametrize(
    ("fault", "family"),
    [pytest.param(f, s, id=f"{f}-{s}") for f in FAULTS for s in FAMILIES],
)
def test_each_fault_on_each_sink_family_leaves_every_value_once(
    fault: str,
    family: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    make_log: Callable[..., Path],
) -> None:
    """One cell of the matrix (the module's docstring). The cells ask for the session's
    Connect server themselves: a server kill needs none but its own."""
    CELLS[fault](family_of(family, request, tmp_path), request, tmp_path, make_log)
