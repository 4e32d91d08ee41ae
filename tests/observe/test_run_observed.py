"""``sparkonce run --metrics-port`` and the progress display, in real driver processes.

Two ``sparkonce run`` subprocesses, started together once for the whole module (module
fixture ``observed``), serve every test here:

- the *metrics run*: embedded log -> SQLite, output redirected to a file, metrics on a free
  port, trigger ``processingTime`` so the run goes on once its input is consumed. The test
  scrapes ``/metrics`` every 0.2 s until the scrape shows every record committed and lag 0
  on every partition, then sends SIGTERM (a clean stop, exit 143). What was scraped is
  compared with the SQLite ledger, read through the sink's API (``sink.ledger``,
  ``sink.owner``), never through the metrics code.
- the *terminal run*: a small log, ``availableNow``, its output on a pseudo-terminal: the
  live progress display.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.sinks import sink_from_url

RECORDS = 900
PARTITIONS = 3
LIMIT = 50  # per partition and batch: the 900 records take 6 or more batches
TTY_RECORDS = 120
NAME = "observed"
TTY_NAME = "observed-tty"
RUN_TIMEOUT_S = 300.0  # a run takes 40-90 s here (2 cores, shared); a hang fails
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

PIPELINE = textwrap.dedent(
    """
    from pyspark.sql import functions as F

    from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink


    def values(df):
        return df.select("record_id", F.col("value").cast("string").cast("long").alias("value"))


    pipeline = Pipeline(
        name={name!r},
        source=EmbeddedLogSource({log!r}, "events", max_records_per_partition={limit}),
        transform=values,
        sink=SQLiteSink({url!r}, "out"),
        checkpoint={checkpoint!r},
        trigger={trigger!r},
    )
    """
)


def write_pipeline(work: Path, name: str, records: int, limit: int, trigger: str) -> Path:
    from sparkonce.log import IdempotentProducer, Topic

    log = work / "log"
    topic = Topic.create(log, "events", PARTITIONS)
    with topic, IdempotentProducer(topic, "test-producer") as producer:
        for i in range(1, records + 1):
            producer.send(str(i).encode(), f"k{i % 5}".encode())
    path = work / "pipeline.py"
    path.write_text(
        PIPELINE.format(
            name=name,
            log=str(log),
            limit=limit,
            url=sink_url(work),
            checkpoint=str(work / "checkpoint"),
            trigger=trigger,
        )
    )
    return path


def sink_url(work: Path) -> str:
    return f"sqlite:///{work / 'out.db'}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples | None:
    """One scrape of the endpoint, parsed; None if it does not answer (yet)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted({"pipeline": NAME, **labels}.items())))]


def lags(samples: Samples) -> dict[int, float]:
    """Partition -> the lag gauge."""
    return {
        int(dict(labels)["partition"]): v
        for (name, labels), v in samples.items()
        if name == "sparkonce_lag_records"
    }


def done(samples: Samples) -> bool:
    """Every record committed and lag 0 on every partition, as scraped, and Spark's progress
    of the last batch received (its listener event arrives after the batch's commit)."""
    rows = value(samples, "sparkonce_rows_committed_total")
    seen = value(samples, "sparkonce_input_rows_total")
    lag = lags(samples)
    return rows == seen == RECORDS and len(lag) == PARTITIONS and not any(lag.values())


@dataclass
class Observed:
    metrics_code: int
    metrics_output: str
    scrapes: list[Samples]  # in order, each while the run went on
    ledger: list[LedgerEntry]
    owner: Owner | None
    tty_code: int
    tty_output: str
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def last(self) -> Samples:
        return self.scrapes[-1]


class _Pty:
    """A child's stdout and stderr on a pseudo-terminal of 160 x 40; everything it writes
    is collected by a reader thread."""

    def __init__(self) -> None:
        self.master, self.slave = pty.openpty()
        fcntl.ioctl(self.slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
        self.chunks: list[bytes] = []
        self.thread = threading.Thread(target=self._read, daemon=True)

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: every writer closed the terminal
                return
            if not data:
                return
            self.chunks.append(data)

    def started(self) -> None:
        os.close(self.slave)  # the child holds it now
        self.thread.start()

    def text(self) -> str:
        self.thread.join(timeout=30)
        os.close(self.master)
        return b"".join(self.chunks).decode(errors="replace")


def run_cmd(pipeline: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sparkonce",
        "run",
        str(pipeline),
        "--log-file",
        str(pipeline.with_name("spark.log")),
        *extra,
    ]


def stop_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    work = tmp_path_factory.mktemp("metrics-run")
    tty_work = tmp_path_factory.mktemp("tty-run")
    pipeline = write_pipeline(work, NAME, RECORDS, LIMIT, "processingTime=1 second")
    tty_pipeline = write_pipeline(tty_work, TTY_NAME, TTY_RECORDS, 20, "availableNow")
    port = free_port()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    started = time.monotonic()
    out = open(work / "output.txt", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        run_cmd(pipeline, "--metrics-port", str(port)),
        stdin=subprocess.DEVNULL,
        stdout=out,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    term = _Pty()
    tty_env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    tty_proc = subprocess.Popen(
        run_cmd(tty_pipeline),
        stdin=subprocess.DEVNULL,
        stdout=term.slave,
        stderr=term.slave,
        env={**tty_env, "TERM": "xterm-256color"},
        start_new_session=True,
    )
    term.started()
    try:
        scrapes: list[Samples] = []
        deadline = started + RUN_TIMEOUT_S
        while proc.poll() is None and time.monotonic() < deadline:
            samples = scrape(port)
            if samples is not None:
                scrapes.append(samples)
                if done(samples):
                    break
            time.sleep(0.2)
        running = proc.poll() is None
        if running:
            proc.send_signal(signal.SIGTERM)  # the driver alone: a clean stop
        code = proc.wait(timeout=120)
        tty_code = tty_proc.wait(timeout=max(10.0, deadline - time.monotonic()))
        seconds = time.monotonic() - started
    finally:
        for p in (proc, tty_proc):
            if p.poll() is None:
                stop_group(p)
                p.wait(timeout=30)
            stop_group(p)  # what is left of the group (Spark's JVM)
        out.close()
    sink = sink_from_url(sink_url(work), "out")
    try:
        ledger, owner = sink.ledger(NAME), sink.owner(NAME)
    finally:
        sink.close()
    output = (work / "output.txt").read_text(errors="replace")
    tty_output = term.text()
    (tty_work / "tty-output.txt").write_text(tty_output)  # to read when a test fails
    assert scrapes, f"the endpoint never answered on port {port}:\n{output[-3000:]}"
    assert done(scrapes[-1]), f"the run did not finish its input in time:\n{output[-3000:]}"
    assert running, f"the run ended before it was stopped:\n{output[-3000:]}"
    yield Observed(code, output, scrapes, ledger, owner, tty_code, tty_output, seconds)


def test_the_run_stopped_cleanly_on_sigterm(observed: Observed) -> None:
    assert observed.metrics_code == 143, observed.metrics_output[-3000:]
    assert "stopped: " in observed.metrics_output


def test_scraped_counters_equal_the_ledger(observed: Observed) -> None:
    ledger, last = observed.ledger, observed.last
    assert len(ledger) >= 6, ledger
    assert sum(e.row_count for e in ledger) == RECORDS
    assert value(last, "sparkonce_batches_committed_total") == len(ledger)
    assert value(last, "sparkonce_rows_committed_total") == sum(e.row_count for e in ledger)
    assert value(last, "sparkonce_batches_skipped_total") == 0
    assert value(last, "sparkonce_fenced_total") == 0


def test_owner_epoch_and_commit_histogram(observed: Observed) -> None:
    last = observed.last
    assert observed.owner is not None
    assert value(last, "sparkonce_owner_epoch") == observed.owner.epoch == 1
    count = value(last, "sparkonce_commit_seconds_count")
    assert count == len(observed.ledger)
    assert value(last, "sparkonce_commit_seconds_bucket", le="+Inf") == count
    assert value(last, "sparkonce_commit_seconds_sum") > 0


def test_lag_per_partition_reaches_zero(observed: Observed) -> None:
    assert lags(observed.last) == dict.fromkeys(range(PARTITIONS), 0.0)
    # Before the run caught up, some scrape saw it behind.
    assert any(sum(lags(s).values()) > 0 for s in observed.scrapes), "lag was never seen > 0"
    series = {labels for (name, labels) in observed.last if name == "sparkonce_lag_records"}
    assert {dict(labels)["topic"] for labels in series} == {"events"}


def test_counters_increase_between_scrapes_during_the_run(observed: Observed) -> None:
    seen = [value(s, "sparkonce_batches_committed_total") for s in observed.scrapes]
    rows = [value(s, "sparkonce_rows_committed_total") for s in observed.scrapes]
    assert seen == sorted(seen) and rows == sorted(rows), "a counter went down"
    middle = sorted({v for v in seen if 0 < v < len(observed.ledger)})
    assert len(middle) >= 2, f"no two scrapes in the middle of the run saw different counts: {seen}"


def test_spark_progress_from_the_listener(observed: Observed) -> None:
    last = observed.last
    assert value(last, "sparkonce_input_rows_total") == RECORDS
    assert value(last, "sparkonce_processed_rows_per_second") > 0
    assert value(last, "sparkonce_input_rows_per_second") >= 0
    assert value(last, "sparkonce_batch_duration_seconds") > 0


def test_output_not_on_a_terminal_is_plain_lines(observed: Observed) -> None:
    text = observed.metrics_output
    assert "\x1b" not in text and "\r" not in text, repr(text[:2000])
    committed = [line for line in text.splitlines() if ": committed " in line]
    assert len(committed) == len(observed.ledger), text[-3000:]
    assert all(" INFO sparkonce.run: pipeline observed batch " in line for line in committed)
    assert "metrics at http://127.0.0.1:" in text
    assert "rows/s" not in text  # no progress display


def test_a_terminal_shows_the_live_progress(observed: Observed) -> None:
    text = observed.tty_output
    assert observed.tty_code == 0, text[-3000:]
    assert "\x1b[" in text, "no terminal control sequences: no live display"
    for shown in (
        f"pipeline {TTY_NAME}",
        "rows/s",
        "lag",
        "last batch",
        "rows as ledger entry",
        "committed, 0 skipped",
    ):
        assert shown in text, f"{shown!r} not shown:\n{text[-3000:]}"
    # The display's last state (before the summary line): every record committed, and lag
    # read once more at the end.
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
    final = plain.rsplit(f"pipeline {TTY_NAME}", 2)[-2]
    assert f"{TTY_RECORDS} rows committed" in final, final
    assert re.search(r"lag\s+0 records \(3 partitions\)", final), final
    assert "ended after 0:" in final, final
