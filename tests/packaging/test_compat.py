"""Each end of the supported ranges, installed from the built wheel into a clean venv.

pyproject.toml declares ranges (Python, PySpark, pandas, numpy, pyarrow, rich, protobuf and
each extra). Our own runs use requirements/lock.txt; this installs the ends of the ranges
instead, each from its own lock in requirements/ (``make lock`` writes them, with uv):

- ``oldest``: Python 3.11 and the lowest version of every direct requirement
  (requirements/oldest.txt, uv's ``--resolution lowest-direct``): PySpark 4.2.0, pandas 2.2.0,
  numpy 1.23.2, pyarrow 18.0.0, ...;
- ``newest``: Python 3.13 and the newest version each range allows
  (requirements/newest-py313.txt): PySpark 4.3.0. The Delta and Kafka connector jars
  sparkonce pins are for Spark 4.2 (none for 4.3 on Maven Central yet), so this end leaves
  the Delta cases out of its slice, and checks that a Delta pipeline and SparkKafkaSource
  are refused before the epoch, naming both versions.

Each end runs in two parts, each in a venv of its own (no system site-packages, only
``sparkonce[postgres,kafka]`` from the wheel, and pytest), so that each fits a shard:

- ``crash``: ``sparkonce demo`` and its verdict, then a crash test per sink family from this
  suite, run against the installed package (every fault kind once, on SQLite, PostgreSQL,
  two-phase PostgreSQL, Delta and Kafka);
- ``pipelines``: windows closed by a no-data batch on each family, and the stateful APIs'
  lost-checkpoint check; at the oldest end also a protobuf older than the range, which a
  ``transformWithStateInPandas`` query must refuse before its epoch, naming the pip command.

The jars come from ``make jars``'s cache (``SPARKONCE_JAR_CACHE``). PyPI (or pip's cache) must
be reachable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.packaging.test_wheel import ROOT

# campaign_lane: not in make test; the rotation runs each end in its turn (tests/shards.py).
pytestmark = [pytest.mark.packaging, pytest.mark.campaign_lane]

PYENV = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
ENDS = {
    # end -> (Python major.minor, the lock it installs, the versions it must end up with)
    "oldest": ("3.11", "oldest.txt", {"pyspark": "4.2.0", "pandas": "2.2.0", "pyarrow": "18.0.0"}),
    "newest": ("3.13", "newest-py313.txt", {"pyspark": "4.3.0"}),
}
# The ends whose PySpark the pinned Delta and Kafka connector jars are not built for (Maven
# Central has none for Spark 4.3 yet): their slice leaves out the Delta cases (-k), and a
# Delta pipeline and SparkKafkaSource must instead be refused before the epoch, naming both
# versions.
JARS_REFUSED = {"newest"}
DELTA_PIPELINE = """
from sparkonce import DeltaSink, EmbeddedLogSource, Pipeline

pipeline = Pipeline(
    name="p",
    source=EmbeddedLogSource("data/log", "events"),
    transform=lambda df: df,
    sink=DeltaSink("data/tables", table="out"),
    checkpoint="data/checkpoint",
    trigger="availableNow",
)
"""
CONNECTOR_CHECK = """
from sparkonce import SparkKafkaSource
from sparkonce.errors import ConfigError
try:
    SparkKafkaSource("127.0.0.1:9", "t").spark_conf()
    print("accepted")
except ConfigError as exc:
    print(exc)
"""
# The slice, from the checkout's tests, run against the installed package; in two parts, so
# that each end's part fits a shard of the rotation (each part installs its own venv).
SLICES = {
    "crash": (  # and the demo: one crash test per sink family
        "tests/crash/test_fault_kinds.py::test_each_fault_kind_once",
        "tests/crash/test_kafka_crash.py::test_each_fault_kind_once_on_kafka",
    ),
    "pipelines": (  # and, at the oldest end, an older protobuf refused
        "tests/spark/test_no_data_batches.py::"
        "test_windows_closed_by_a_no_data_batch_reach_every_sink_family",
        "tests/spark/test_stateful_detection.py::test_every_stateful_api_refuses_a_lost_checkpoint",
    ),
}
# A transformWithStateInPandas query checked before its epoch, with a protobuf older than
# PySpark's generated state messages: refused with the pip command that fixes it, not a dead
# Python worker at the first batch.
OLD_PROTOBUF = "protobuf==6.33.0"
STATE_CHECK = """
from types import SimpleNamespace
import pandas as pd
from pyspark.sql import SparkSession
from pyspark.sql.streaming.stateful_processor import StatefulProcessor
from sparkonce.errors import ConfigError
from sparkonce.pipeline.query import check_state_messages

class Count(StatefulProcessor):
    def init(self, handle):
        self.n = handle.getValueState("n", "n long")
    def handleInputRows(self, key, rows, timerValues):
        yield pd.DataFrame({"key": [key[0]], "n": [sum(len(r) for r in rows)]})
    def close(self):
        pass

spark = SparkSession.builder.master("local[1]").getOrCreate()
rows = spark.readStream.format("rate").load().selectExpr("CAST(value % 3 AS STRING) AS key")
out = rows.groupBy("key").transformWithStateInPandas(
    Count(), "key string, n long", outputMode="Update", timeMode="None")
try:
    check_state_messages(SimpleNamespace(name="p"), out)
except ConfigError as exc:
    print(exc)
"""
VERSIONS = """
import importlib.metadata as md, sys, sparkonce
print(sparkonce.__file__)
for name in sys.argv[1:]:
    print(name, md.version(name))
"""


def expected_version(end: str, name: str) -> str:
    return ENDS[end][2][name]


def python(minor: str) -> Path:
    """The interpreter of Python ``minor`` (pyenv's, else one on PATH)."""
    for found in sorted(PYENV.glob(f"{minor}.*/bin/python{minor}"), reverse=True):
        return found
    on_path = shutil.which(f"python{minor}")
    assert on_path, f"Python {minor} is not installed here (pyenv install {minor})"
    return Path(on_path)


def _env(venv: Path) -> dict[str, str]:
    drop = ("SPARKONCE_", "PYTHON", "VIRTUAL_ENV")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        PATH=f"{venv / 'bin'}:{env.get('PATH', '')}",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_INPUT="1",
        PYSPARK_PYTHON=str(venv / "bin" / "python"),
        SPARKONCE_JAR_CACHE=str(ROOT / ".cache" / "jars"),
    )
    return env


def _ok(argv: list[str | Path], env: dict[str, str], cwd: Path, timeout: float) -> str:
    done = subprocess.run(
        [str(a) for a in argv], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, argv))}: exit {done.returncode}\n"
        f"{done.stdout[-6000:]}\n{done.stderr[-4000:]}"
    )
    return done.stdout


def _install(end: str, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A clean venv of ``end`` with ``sparkonce[postgres,kafka]`` from a wheel of this tree,
    and pytest; checked to hold the versions of that end. Returns its python and env."""
    minor, lock, expected = ENDS[end]
    src = tmp_path / "src-tree"  # what the wheel is built from, so the build leaves no trace
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "src", src / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__")
    )
    venv = tmp_path / "venv"
    env = _env(venv)
    wheel_argv: list[str | Path] = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q"]
    _ok([*wheel_argv, "-w", tmp_path, src], env, tmp_path, 300)
    (wheel,) = tmp_path.glob("sparkonce-*.whl")
    _ok([python(minor), "-m", "venv", venv], env, tmp_path, 120)
    py = venv / "bin" / "python"
    pytest_pin = next(
        line.split()[0]
        for line in (ROOT / "requirements" / "lock.txt").read_text().splitlines()
        if line.startswith("pytest==")
    )
    constraints = ROOT / "requirements" / lock
    install: list[str | Path] = [py, "-m", "pip", "install", "-q", "-c", constraints]
    _ok([*install, f"{wheel}[postgres,kafka]", pytest_pin], env, tmp_path, 900)

    # The venv holds the ends it was meant to, and sparkonce comes from the wheel.
    out = _ok([py, "-c", VERSIONS, *expected], env, tmp_path, 60).splitlines()
    assert out[0].startswith(str(venv)), f"sparkonce imported from {out[0]}, not the venv"
    assert out[1:] == [f"{name} {version}" for name, version in expected.items()]
    return py, env


@pytest.mark.parametrize("part", sorted(SLICES))
@pytest.mark.parametrize("end", sorted(ENDS))
def test_an_end_of_the_ranges_runs_the_demo_and_the_slice(
    end: str, part: str, tmp_path: Path
) -> None:
    py, env = _install(end, tmp_path)
    if part == "crash":
        demo = tmp_path / "demo"
        demo.mkdir()
        said = _ok([py.with_name("sparkonce"), "demo"], env, demo, 600)
        assert "PASS: every record took effect exactly once" in said, said[-3000:]

    # The venv holds sparkonce[postgres,kafka], not the iceberg extra (PyIceberg is not in
    # the ends' lock files): the slice's Iceberg scenario is left out at both ends.
    pick = ["-k", "not iceberg and not delta" if end in JARS_REFUSED else "not iceberg"]
    slice_out = _ok(
        [
            py,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            ROOT,
            *pick,
            *SLICES[part],
        ],
        env,
        ROOT,
        1500,
    )
    assert " passed" in slice_out and "failed" not in slice_out, slice_out[-3000:]

    if end in JARS_REFUSED and part == "pipelines":
        version = expected_version(end, "pyspark")
        work = tmp_path / "refused"
        (work / "data" / "log").mkdir(parents=True)
        (work / "pipeline.py").write_text(DELTA_PIPELINE)
        cli = py.with_name("sparkonce")
        _ok([cli, "log", "create", "data/log", "events", "--partitions", "1"], env, work, 120)
        refused = subprocess.run(
            [str(cli), "run", "pipeline.py"],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=300,
        )
        last = refused.stderr.splitlines()[-1] if refused.stderr else ""
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert f"PySpark {version}" in last and "Delta 4.4.0" in last, last
        assert not (work / "data" / "tables").exists() and not (work / "data/checkpoint").exists()
        said = _ok([py, "-c", CONNECTOR_CHECK], env, tmp_path, 120)
        assert f"PySpark {version} is installed" in said and "is 4.2.0" in said, said

    if end == "oldest" and part == "pipelines":  # a user's older protobuf, against the range
        _ok([py, "-m", "pip", "install", "-q", "--no-deps", OLD_PROTOBUF], env, tmp_path, 300)
        said = _ok([py, "-c", STATE_CHECK], env, tmp_path, 300)
        assert 'pip install "protobuf>=6.33.5,<7"' in said and "no epoch" in said, said
