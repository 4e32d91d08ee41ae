"""``sparkonce ui`` in a real headless Chromium (Debian's, driven by Playwright), against a
real ``sparkonce run`` that commits into SQLite in the background.

One run is shared by the module (:func:`live_run`): a stateless pipeline from the embedded
log into SQLite with a ``processingTime=1 second`` trigger, so it keeps running and commits
whatever the test appends to the log. The oracle is the ledger read directly through the
sink API (``sink.ledger(name)``, ``sink.owner(name)``) and the log's end offsets, never the
ui's own state module.

Screenshots go to ``.cache/artifacts/`` (git-ignored): ``ui.png`` (the live run) and
``ui-errors.png`` (the page with a failing store, an empty one and a verify report, which
then turns corrupt).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from sparkonce.ledger.base import LedgerEntry, Owner
from sparkonce.log import IdempotentProducer, Topic
from sparkonce.sinks import SQLiteSink
from sparkonce.verify.driver import Driver
from tests.ui.conftest import CAMPAIGN_REPORT, REPO, SECRET, closed_port

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = REPO / ".cache" / "artifacts"
PIPELINE = "ui-demo"
PARTITIONS = 3
LIMIT = 20  # records per partition per batch
START_TIMEOUT_S = 240.0  # Spark's start on a busy 2-core machine
WAIT_S = 120.0

_PIPELINE_FILE = '''"""The pipeline the ui's browser tests watch (tests/ui/test_browser.py)."""

from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

pipeline = Pipeline(
    name={name!r},
    source=EmbeddedLogSource({log!r}, "events", max_records_per_partition={limit}),
    transform=lambda df: df.select("partition", "offset", F.col("value").cast("string")),
    sink=SQLiteSink({url!r}, "events_out"),
    checkpoint={checkpoint!r},
    trigger="processingTime=1 second",
)
'''


@dataclass
class LiveRun:
    url: str
    log: Path
    driver: Driver
    produced: int = 0

    def produce(self, count: int) -> None:
        """Append ``count`` more records to the log (a producer of its own each time)."""
        with (
            Topic(self.log, "events") as topic,
            IdempotentProducer(topic, f"ui-test-{self.produced}") as producer,
        ):
            for i in range(self.produced, self.produced + count):
                producer.send(str(i).encode(), f"k{i % 6}".encode())
        self.produced += count

    def stop(self) -> None:
        """SIGTERM to the driver's Python process only: ``sparkonce run`` stops cleanly."""
        if self.driver.poll() is None:
            assert self.driver.proc is not None
            self.driver.proc.send_signal(signal.SIGTERM)

    def latest(self) -> dict[int, int]:
        with Topic(self.log, "events") as topic:
            return dict(topic.end_offsets())

    def read(self) -> tuple[Owner | None, list[LedgerEntry]]:
        """The oracle: the owner and the ledger, read directly through the sink API."""
        sink = SQLiteSink(self.url, "events_out")
        try:
            return sink.owner(PIPELINE), sink.ledger(PIPELINE)
        finally:
            sink.close()

    def wait_caught_up(self, timeout: float = WAIT_S) -> list[LedgerEntry]:
        """Wait until the ledger's end offsets are the log's ends; return the ledger."""
        deadline = time.monotonic() + timeout
        latest = {("events", p): o for p, o in self.latest().items()}
        while time.monotonic() < deadline:
            assert self.driver.poll() is None, self.driver.log_tail()
            _, entries = self.read()
            if entries and entries[-1].end_offsets == latest:
                return entries
            time.sleep(0.5)
        raise AssertionError(f"the run did not catch up in {timeout} s\n{self.driver.log_tail()}")


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveRun]:
    tmp = tmp_path_factory.mktemp("ui-run")
    log = tmp / "log"
    Topic.create(log, "events", PARTITIONS).close()
    url = f"sqlite:///{tmp / 'sink.db'}"
    pipeline_file = tmp / "pipeline.py"
    pipeline_file.write_text(
        _PIPELINE_FILE.format(
            name=PIPELINE, log=str(log), limit=LIMIT, url=url, checkpoint=str(tmp / "checkpoint")
        )
    )
    run = LiveRun(url, log, Driver(pipeline_file, tmp / "driver.log"))
    run.produce(120)  # 2 batches of 3 x LIMIT
    run.driver.start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not (tmp / "sink.db").exists() or run.read()[0] is None:
            assert run.driver.poll() is None, run.driver.log_tail()
            assert time.monotonic() < deadline, "the run took no epoch\n" + run.driver.log_tail()
            time.sleep(0.5)
        yield run
    finally:
        run.stop()
        try:
            run.driver.wait(60)
        except subprocess.TimeoutExpired:
            run.driver.kill()
            run.driver.wait(30)


@dataclass
class UiServer:
    proc: subprocess.Popen[str]
    url: str
    stderr: Path

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(30)
        return code, self.stderr.read_text()


def start_ui(tmp: Path, *args: str) -> UiServer:
    """``sparkonce ui ARGS --port 0 --refresh 0.5`` as a real process; waits for its URL."""
    stderr = tmp / f"ui-{time.monotonic_ns()}.err"
    proc = subprocess.Popen(
        [sys.executable, "-m", "sparkonce", "ui", *args, "--port", "0", "--refresh", "0.5"],
        stdout=subprocess.PIPE,
        stderr=stderr.open("w"),
        text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("SPARKONCE_")},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the first line, once it listens (or "" if it exited)
    found = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
    if not found:
        proc.kill()
        raise AssertionError(f"sparkonce ui did not start: {line!r} {stderr.read_text()}")
    return UiServer(proc, found.group(1), stderr)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "Chromium is missing: run scripts/ensure-chromium.sh"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


# -- reading the page ----------------------------------------------------------------------------


def _article(pipeline: str) -> str:
    return f'article[data-pipeline="{pipeline}"]'


def field(page: Any, scope: str, name: str) -> str:
    return str(page.locator(f'{scope} [data-field="{name}"]').first.inner_text())


def number(text: str) -> int:
    return int(text.replace(",", ""))


def wait_for(page: Any, condition: str, arg: Any = None, timeout: float = WAIT_S) -> None:
    page.wait_for_function(condition, arg=arg, timeout=timeout * 1000)


BATCHES_AT_LEAST = """([article, n]) => {
  const e = document.querySelector(article + ' [data-field="batches"]');
  return e !== null && Number(e.textContent.replace(/,/g, "")) >= n;
}"""

TOTAL_LAG_IS = """([article, n]) => {
  const e = document.querySelector(article + ' [data-field="total_lag"]');
  return e !== null && e.textContent.replace(/,/g, "") === String(n);
}"""


def utc_text(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def check_page_against_ledger(page: Any, run: LiveRun) -> None:
    """Every number the page shows for the pipeline equals what the sink API says."""
    owner, entries = run.read()
    assert owner is not None and entries
    latest = run.latest()
    scope = _article(PIPELINE)
    wait_for(page, BATCHES_AT_LEAST, [scope, len(entries)])
    assert number(field(page, scope, "batches")) == len(entries)
    assert field(page, scope, "epoch") == str(owner.epoch)
    assert field(page, scope, "holder") == owner.holder
    assert field(page, scope, "acquired_at") == utc_text(owner.acquired_at)
    assert number(field(page, scope, "rows_committed")) == sum(e.row_count for e in entries)
    last = entries[-1]
    assert field(page, scope, "last_seq") == str(last.seq)
    assert field(page, scope, "last_spark_batch_id") == str(last.spark_batch_id)
    assert field(page, scope, "last_committed_at") == utc_text(last.committed_at)
    ends = last.end_offsets
    total = 0
    for p in range(PARTITIONS):
        row = f'{scope} tr[data-partition="events:{p}"]'
        lag = latest[p] - ends[("events", p)]
        total += lag
        assert number(field(page, row, "committed")) == ends[("events", p)]
        assert number(field(page, row, "latest")) == latest[p]
        assert number(field(page, row, "lag")) == lag
    assert number(field(page, scope, "total_lag")) == total
    # The ledger timeline: one row per entry (up to 50), newest first.
    seqs = page.locator(f"{scope} table.ledger tbody tr").evaluate_all(
        "rows => rows.map(r => Number(r.dataset.seq))"
    )
    assert seqs == [e.seq for e in reversed(entries)][:50]
    for e in entries[-3:]:
        row = f'{scope} tr[data-seq="{e.seq}"]'
        assert number(field(page, row, "rows")) == e.row_count
        assert field(page, row, "epoch").split()[0] == str(e.epoch)
        assert field(page, row, "committed_at") == utc_text(e.committed_at)
        assert e.commit_seconds is not None  # the page shows it to the millisecond
        assert float(field(page, row, "commit_s")) == pytest.approx(e.commit_seconds, abs=6e-4)


# -- the tests -----------------------------------------------------------------------------------


def test_the_page_follows_a_running_pipeline(live_run: LiveRun, page: Any, tmp_path: Path) -> None:
    ui = start_ui(tmp_path, "--sink", live_run.url)
    try:
        page.goto(ui.url)
        wait_for(page, "() => Number(document.body.dataset.generation) >= 1")
        assert page.locator('section.store[data-status="ok"]').count() == 1

        # 1. Caught up: the page shows exactly the ledger, lag 0.
        live_run.wait_caught_up()
        check_page_against_ledger(page, live_run)
        wait_for(page, TOTAL_LAG_IS, [_article(PIPELINE), 0])
        assert page.locator(f"{_article(PIPELINE)} .js-plotly-plot").count() == 2
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui.png"), full_page=True)

        # 2. More input: the same page (never reloaded) shows the new batches.
        page.evaluate("() => { window.sameDocument = true; }")
        before = len(live_run.read()[1])
        live_run.produce(60)
        wait_for(page, BATCHES_AT_LEAST, [_article(PIPELINE), before + 1])
        live_run.wait_caught_up()
        check_page_against_ledger(page, live_run)
        assert page.evaluate("() => window.sameDocument === true"), "the page was reloaded"

        # 3. The run stops (SIGTERM: clean, exit 143) and input keeps coming: the lag grows.
        live_run.stop()
        assert live_run.driver.wait(60) == 128 + signal.SIGTERM, live_run.driver.log_tail()
        live_run.produce(90)
        wait_for(page, TOTAL_LAG_IS, [_article(PIPELINE), 90])
        check_page_against_ledger(page, live_run)
        assert page.evaluate("() => window.sameDocument === true"), "the page was reloaded"
    finally:
        code, err = ui.stop()
    assert code == 128 + signal.SIGTERM, err
    assert "Traceback" not in err, err


def test_the_page_shows_each_store_error_and_the_verify_report(
    live_run: LiveRun, page: Any, tmp_path: Path
) -> None:
    empty = f"sqlite:///{tmp_path / 'empty.db'}"
    SQLiteSink(empty, "out").open()  # ledger tables, no pipeline
    unreachable = f"postgresql://watcher:{SECRET}@127.0.0.1:{closed_port()}/nowhere"
    report = tmp_path / "verify.json"
    report.write_text(CAMPAIGN_REPORT.read_text())
    ui = start_ui(
        tmp_path,
        *("--sink", live_run.url, "--sink", empty, "--sink", unreachable),
        *("--verify-report", str(report)),
    )
    try:
        page.goto(ui.url)
        wait_for(
            page,
            "() => document.querySelectorAll('section.store:not([data-status=\"loading\"])')"
            ".length === 3",
        )
        statuses = page.locator("section.store").evaluate_all(
            "els => els.map(e => e.dataset.status)"
        )
        assert statuses == ["ok", "empty", "error"]
        assert page.locator(_article(PIPELINE)).count() == 1
        empty_box = page.locator('section.store[data-store-index="1"]')
        assert "no pipelines in this store" in empty_box.inner_text()
        error_box = page.locator('section.store[data-store-index="2"]')
        error_text = error_box.locator(".store-error").inner_text()
        assert error_text.startswith("SinkUnavailableError: cannot connect to PostgreSQL at")
        assert "watcher:***@127.0.0.1" in error_box.locator(".store-label").inner_text()

        # The verify report's summary, per fault kind, as the report says.
        import json

        summary = json.loads(CAMPAIGN_REPORT.read_text())["summary"]
        rows = page.locator("#verify-table tbody tr")
        assert rows.count() == len(summary)
        for s in summary:
            row = f'#verify-table tr[data-kind="{s["kind"]}"]'
            for key in ("trials", "passed", "lost_rows", "duplicated_rows"):
                assert number(field(page, row, key)) == s[key]
            for key in ("recovery_mean_s", "recovery_p95_s"):
                want = "-" if s[key] is None else f"{s[key]:.1f}"
                assert field(page, row, key) == want

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "ui-errors.png"), full_page=True)
        # The password is nowhere: not in the page, not in its data.
        assert SECRET not in page.content()
        assert SECRET not in page.evaluate("() => fetch('/api/state').then(r => r.text())")

        # The report, fine at start, is corrupt now: its error instead of its summary, and
        # the stores still shown.
        report.write_text("{ truncated")
        wait_for(page, "() => !document.getElementById('verify-error').hidden")
        assert "is not JSON" in page.locator("#verify-error").inner_text()
        assert page.locator("#verify-table tbody tr").count() == 0
        assert page.locator(_article(PIPELINE)).count() == 1
    finally:
        code, err = ui.stop()
    assert code == 128 + signal.SIGTERM, err
    assert SECRET not in err
    assert "Traceback" not in err, err
