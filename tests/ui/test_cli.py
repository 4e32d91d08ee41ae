"""``sparkonce ui``'s checks at start: each bad input gets one line and its exit code.

These run ``main()`` in this process: every case stops before the server starts.
Serving, and errors shown on the page, are tested in a real browser (test_browser.py).
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sparkonce.cli import EXIT_UNAVAILABLE, EXIT_USAGE, main
from sparkonce.sinks import SQLiteSink
from tests.ui.conftest import SECRET


@pytest.fixture
def empty_store(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    SQLiteSink(url, "out").open()
    return url


def _fails(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["ui", *argv])
    err = capsys.readouterr().err
    return code, err


def test_no_sink_is_bad_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARKONCE_SINK", raising=False)
    code, err = _fails([], capsys)
    assert code == EXIT_USAGE
    assert "--sink is required" in err


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("mysql://db.example/x", "scheme 'mysql' is not supported"),
        (f"postgresql://u:{SECRET}@db.example:99999/x", "the port is not a number"),
        ("kafka://broker-without-topic", "names its brokers and its topic"),
    ],
)
def test_a_bad_url_is_bad_input_with_the_password_masked(
    url: str, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _fails(["--sink", url], capsys)
    assert code == EXIT_USAGE
    assert err.startswith("sparkonce: bad input: --sink "), err
    assert problem in err
    assert SECRET not in err


def _state(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/state", timeout=10) as r:
        state: dict[str, Any] = json.loads(r.read())
    return state


def test_a_sqlite_file_that_does_not_exist_yet_is_waited_for(tmp_path: Path) -> None:
    """``ui`` started before the run that creates its SQLite file serves, says it waits
    for the file, and shows the file's pipelines once it exists."""
    db = tmp_path / "later.db"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sparkonce",
            "ui",
            "--sink",
            f"sqlite:///{db}",
            "--port",
            "0",
            "--refresh",
            "0.2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        line = proc.stdout.readline()
        match = re.search(r"serving http://127\.0\.0\.1:(\d+)/", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        port = int(match.group(1))
        deadline = time.monotonic() + 30
        store = _state(port)["stores"][0]
        while store["status"] == "loading" and time.monotonic() < deadline:
            time.sleep(0.2)
            store = _state(port)["stores"][0]
        assert store["status"] == "waiting" and store["waiting_for"] == str(db), store
        assert not db.exists()  # the page only looked: it did not create the file

        sink = SQLiteSink(f"sqlite:///{db}", "out")
        sink.acquire("later", None)
        sink.close()
        while store["status"] != "ok" and time.monotonic() < deadline:
            time.sleep(0.2)
            store = _state(port)["stores"][0]
        assert store["status"] == "ok", store
        assert [p["name"] for p in store["pipelines"]] == ["later"]
        assert store["pipelines"][0]["owner"]["epoch"] == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert f"waiting for {db}, which does not exist yet" in err


def test_no_store_answering_exits_4_without_the_password(
    unreachable_pg: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _fails(["--sink", unreachable_pg, "--port", "0"], capsys)
    assert code == EXIT_UNAVAILABLE
    assert "sparkonce: unavailable: cannot connect to PostgreSQL at 127.0.0.1:" in err
    assert SECRET not in err


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "does not exist"), ("{oops", "is not JSON"), ("{}", "is not a report")],
)
def test_a_missing_or_corrupt_verify_report_is_bad_input(
    tmp_path: Path,
    empty_store: str,
    content: str | None,
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    report = tmp_path / "verify.json"
    if content is not None:
        report.write_text(content)
    code, err = _fails(["--sink", empty_store, "--verify-report", str(report)], capsys)
    assert code == EXIT_USAGE
    assert f"verify report {str(report)!r} {problem}" in err


def test_a_port_in_use_is_bad_input(empty_store: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = _fails(["--sink", empty_store, "--port", str(port)], capsys)
    assert code == EXIT_USAGE
    assert f"cannot listen on 127.0.0.1:{port}" in err


def test_a_bad_refresh_is_a_usage_error(
    empty_store: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["ui", "--sink", empty_store, "--refresh", "0"])
    assert stop.value.code == EXIT_USAGE
    assert "a number of seconds in 0.2..3600" in capsys.readouterr().err
