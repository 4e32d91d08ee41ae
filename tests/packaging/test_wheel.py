"""The built wheel, installed into a clean venv with only what each documented extra declares.

A user installs ``sparkonce`` (or ``sparkonce[postgres]``, ``[kafka]``, ``[verify]``,
``[metrics]``, ``[ui]``), not
the dev environment. This builds a wheel of the working tree (``pip wheel --no-deps``),
installs it with ``--no-deps`` into a fresh venv (no system site-packages) together with
the runtime requirements the wheel's own metadata declares (at the versions of
requirements/lock.txt; tests/packaging/test_compat.py installs the ends of the ranges), and
checks each extra's import path: without it, a clear message naming
``pip install 'sparkonce[extra]'``; with it, the code path works. PyPI (or pip's cache) must
be reachable. A few minutes.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest

# campaign_lane (it builds a wheel and a venv per extra): not in make test; CI runs it in its
# turn, in the rotation's shard that holds it (tests/shards.py).
pytestmark = [pytest.mark.packaging, pytest.mark.campaign_lane]

ROOT = Path(__file__).resolve().parents[2]
EXTRAS = ("postgres", "kafka", "verify", "metrics", "ui")  # what a user is told to install
UNREACHABLE_PG = "postgresql://u@127.0.0.1:9/db"  # port 9 (discard): nothing listens
UNREACHABLE_KAFKA = "127.0.0.1:9"

CHART_STEP = """
import sys
from pathlib import Path
from sparkonce.cli import _write_chart
from sparkonce.verify import Fault, TrialOutcome
outcomes = [TrialOutcome(n, "s", Fault("kill", delay_s=1.0), True, True, recovery_s=2.0 + n)
            for n in range(3)]
print(_write_chart(Path(sys.argv[1]), outcomes, ["kill"]))
"""

METRICS_STEP = """
from sparkonce.observe.metrics import MetricsObserver
print(MetricsObserver("p").exposition())
"""


# The README's quick-start pipeline, with a Delta table for its sink: DeltaSink needs jars
# that the wheel does not carry.
DELTA_PIPELINE = """
from pyspark.sql import functions as F
from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline

def sums(df):
    v = df.select(F.col("key").cast("string").alias("key"),
                  F.col("value").cast("string").cast("long").alias("value"))
    return v.groupBy("key").agg(F.sum("value").alias("total"))

pipeline = Pipeline(
    name="sums",
    source=EmbeddedLogSource("data/log", "events", max_records_per_partition=10_000),
    transform=sums,
    sink=DeltaSink("data/tables", table="sums", mode="upsert", keys=["key"]),
    checkpoint="data/checkpoint",
    trigger="availableNow",
)
"""


def _delta_rows(table: Path) -> list[dict[str, object]]:
    """The rows of a Delta table, read from its log and Parquet files with pyarrow (not
    with Spark or sparkonce): the files added and not removed, at the last version."""
    import json

    import pyarrow.parquet as pq

    live: dict[str, None] = {}
    for entry in sorted((table / "_delta_log").glob("*.json")):
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                assert action["add"].get("deletionVector") is None, "a deletion vector"
                live[action["add"]["path"]] = None
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    rows: list[dict[str, object]] = []
    for path in live:
        rows += pq.read_table(table / path).to_pylist()
    return rows


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKONCE_", "PYTHON"))}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def _run(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, timeout=timeout, env=_env()
    )


def _ok(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    done = _run(*argv, timeout=timeout)
    assert done.returncode == 0, f"{argv}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _requirements(wheel: Path) -> dict[str | None, list[str]]:
    """Requires-Dist of the wheel, by extra (None: the core requirements)."""
    with zipfile.ZipFile(wheel) as zf:
        name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(name).decode()
    reqs: dict[str | None, list[str]] = {}
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req, _, marker = line.removeprefix("Requires-Dist:").strip().partition(";")
        extra = re.search(r"extra\s*==\s*['\"]([\w-]+)['\"]", marker)
        reqs.setdefault(extra.group(1) if extra else None, []).append(req.strip())
    return reqs


def test_the_wheel_works_with_each_documented_extra(tmp_path: Path) -> None:
    # A copy of what the wheel is built from, so the build leaves nothing in the work tree.
    src = tmp_path / "src-tree"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", *[p.name for p in ROOT.glob("LICEN[CS]E*")]):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    dist = tmp_path / "dist"
    _ok(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", dist, src)
    (wheel,) = dist.glob("sparkonce-*.whl")
    reqs = _requirements(wheel)
    assert set(EXTRAS) <= set(reqs), f"extras declared: {sorted(map(str, reqs))}"
    assert any(r.startswith("matplotlib") for r in reqs["verify"])

    venv = tmp_path / "venv"
    _ok(sys.executable, "-m", "venv", venv)  # clean: no system site-packages
    py, cli = venv / "bin" / "python", venv / "bin" / "sparkonce"
    # The versions of our own runs (the wheel's ranges would let pip take any newer one).
    pip = (py, "-m", "pip", "install", "-q", "-c", ROOT / "requirements" / "lock.txt")
    _ok(*pip, "--no-deps", wheel)
    _ok(*pip, *reqs[None], timeout=600)

    # The core install: the CLI works, and each extra's path names its pip command.
    assert "usage: sparkonce" in _ok(cli, "--help").stdout
    assert "recovery.png needs matplotlib" in " ".join(_ok(cli, "verify", "--help").stdout.split())
    assert _run(py, "-c", "import matplotlib").returncode != 0, "not a clean venv"
    done = _run(cli, "status", "--pipeline", "p", "--sink", UNREACHABLE_PG)
    assert done.returncode == 2, done.stderr
    assert "pip install 'sparkonce[postgres]'" in done.stderr.splitlines()[-1]
    done = _run(cli, "kafka", "describe", UNREACHABLE_KAFKA, "t", "--timeout", "1")
    assert done.returncode == 2, done.stderr
    assert "pip install 'sparkonce[kafka]'" in done.stderr.splitlines()[-1]
    png = tmp_path / "recovery.png"
    done = _ok(py, "-c", CHART_STEP, png)
    assert done.stdout == "False\n" and not png.exists()
    (warning,) = done.stderr.splitlines()
    assert "no chart" in warning and "pip install 'sparkonce[verify]'" in warning
    done = _run(py, "-c", METRICS_STEP)
    assert done.returncode != 0
    assert "pip install 'sparkonce[metrics]'" in done.stderr.splitlines()[-1], done.stderr
    store = tmp_path / "store.db"
    sqlite3.connect(store).close()
    done = _run(cli, "ui", "--sink", f"sqlite:///{store}", "--port", "0")
    assert done.returncode == 2, done.stderr
    assert "pip install 'sparkonce[ui]'" in done.stderr.splitlines()[-1]

    # The jars: a Delta pipeline from a directory outside the checkout, with no jar setting,
    # is refused and names `sparkonce jars fetch`; fetched from Maven Central into the
    # user's cache, the same run commits, and the table holds the sums.
    work = tmp_path / "work"
    work.mkdir()
    jar_env = {**_env(), "XDG_CACHE_HOME": str(tmp_path / "xdg")}

    def in_work(*argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            env=jar_env,
            cwd=work,
            timeout=timeout,
        )

    (work / "pipeline.py").write_text(DELTA_PIPELINE)
    assert in_work(cli, "log", "create", "data/log", "events", "--partitions", "4").returncode == 0
    records = "".join(f"k{n % 4},{n}\n" for n in range(1, 1001))
    produced = subprocess.run(
        [str(cli), "log", "produce", "data/log", "events", "--separator", ","],
        input=records,
        capture_output=True,
        text=True,
        env=jar_env,
        cwd=work,
        timeout=120,
    )
    assert produced.returncode == 0, produced.stderr
    refused = in_work(cli, "run", "pipeline.py", timeout=600)
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "sparkonce jars fetch" in refused.stderr.splitlines()[-1], refused.stderr[-3000:]
    assert not (work / "data" / "tables" / "sums" / "_delta_log").exists()
    fetched = in_work(cli, "jars", "fetch", "delta", timeout=600)
    assert fetched.returncode == 0, fetched.stderr
    cache = tmp_path / "xdg" / "sparkonce" / "jars" / "delta"
    assert fetched.stdout.splitlines() == [f"delta: 2 jars in {cache}"]
    done = in_work(cli, "run", "pipeline.py", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    totals = {str(r["key"]): r["total"] for r in _delta_rows(work / "data/tables/sums")}
    assert totals == {f"k{k}": sum(n for n in range(1, 1001) if n % 4 == k) for k in range(4)}

    # Each extra, with only what it declares: its path now gets past the import.
    _ok(*pip, *reqs["postgres"], timeout=600)
    _ok(py, "-c", "import psycopg")
    done = _run(cli, "status", "--pipeline", "p", "--sink", UNREACHABLE_PG, timeout=120)
    assert done.returncode == 4, done.stderr  # psycopg tried to connect: unavailable
    assert "cannot connect to PostgreSQL at 127.0.0.1:9" in done.stderr

    _ok(*pip, *reqs["kafka"], timeout=600)
    _ok(py, "-c", "import confluent_kafka")
    done = _run(cli, "kafka", "describe", UNREACHABLE_KAFKA, "t", "--timeout", "1", timeout=120)
    assert done.returncode == 4, done.stderr  # confluent_kafka asked the cluster: unavailable
    assert "did not answer" in done.stderr

    _ok(*pip, *reqs["verify"], timeout=600)
    done = _ok(py, "-c", CHART_STEP, png)
    assert done.stdout == "True\n" and done.stderr == "", done.stderr
    assert png.read_bytes().startswith(b"\x89PNG")

    _ok(*pip, *reqs["metrics"], timeout=600)
    exposition = _ok(py, "-c", METRICS_STEP).stdout
    assert 'sparkonce_batches_committed_total{pipeline="p"} 0.0' in exposition
    # The ui serves its page, its own JS and CSS (package data) and plotly.js from the wheel.
    _ok(*pip, *reqs["ui"], timeout=600)
    ui = subprocess.Popen(
        [str(cli), "ui", "--sink", f"sqlite:///{store}", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    try:
        assert ui.stdout is not None
        line = ui.stdout.readline()
        assert line.startswith("sparkonce ui: serving http://127.0.0.1:"), line
        base = line.split()[-1]
        for path, expect in [
            ("", b"<title>sparkonce ui</title>"),
            ("static/ui.js", b"/api/state"),
            ("static/ui.css", b"section.store"),
            ("vendor/plotly.js", b"plotly"),
            ("api/state", b'"stores"'),
        ]:
            with urllib.request.urlopen(base + path, timeout=30) as response:
                assert expect in response.read(), path
    finally:
        ui.terminate()
        assert ui.wait(30) == 128 + signal.SIGTERM, ui.stderr.read() if ui.stderr else ""
