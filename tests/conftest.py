"""Shared fixtures: one local[2] SparkSession per test run, and real servers.

The PostgreSQL server is a throwaway cluster on 127.0.0.1 started by
``tests/services/postgres.py`` (installed by ``scripts/ensure-postgres.sh``), the Kafka
broker comes from ``tests/services/kafka.py`` and the S3-compatible server (moto) from
``tests/services/s3.py``; tests never skip because one is missing or fails to start:
they fail.

Test lanes: ``make test`` runs ``-m "not crash_lane and not campaign_lane"``, ``make
test-crash`` runs ``-m crash_lane`` and ``make test-campaign`` ``-m campaign_lane``, so
every test is in exactly one lane (a test marked with both is refused). CI runs the first
and one shard of the other two (below). A crash test that stays in ``make test`` names
each (sink family, fault kind) pair it stands for with ``@pytest.mark.covers(family,
kind)``; :func:`pytest_collection_modifyitems` refuses a pair outside :data:`FAULT_MATRIX`
and a ``covers`` test in another lane.
``tests/unit/test_lanes.py`` checks, on the whole suite, that each pair has exactly one
such test.

Capability markers follow fixtures: a test that uses a fixture of :data:`SERVICE_FIXTURES`
(directly or through other fixtures) is marked ``postgres``, ``kafka``, ``s3`` or ``spark``
at collection, so ``-m "not kafka"`` leaves out every test that starts the Kafka broker.

Rotation: every crash_lane and campaign_lane test is also in one shard of
``tests/shards.py``'s map; ``--shard K`` runs shard K (``make test-shard K=<k>``), one of
which CI runs per commit. Each lane prints its wall time against its budget at its end
(``--lane-name``, ``--lane-budget``; a shard's budget is the shard box); nothing fails on
time.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

import pytest

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# Driver processes the tests start (`sparkonce run`, which inherits this environment) use
# --quick-start, as `sparkonce verify`'s trial drivers do: Spark's JVM with the C1 JIT only
# and the serial collector, about a quarter less CPU per short run. Timing only, never results.
os.environ.setdefault("SPARKONCE_QUICK_START", "1")
# The JVM class-data archive (sparkonce.spark.classdata) in the checkout's git-ignored
# cache, built before the first test that starts a JVM: every driver then starts in about
# 7 s less here (a session in 5 s instead of 9.5 s, its first job in 2 s instead of 4.5 s).
os.environ.setdefault(
    "SPARKONCE_CACHE_DIR", str(Path(__file__).parents[1] / ".cache" / "sparkonce")
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.services.kafka import KafkaBroker
    from tests.services.postgres import PostgresServer
    from tests.services.s3 import S3Server

_db_counter = itertools.count()


# -- test lanes ------------------------------------------------------------------------------------

LANE_MARK = "crash_lane"
CAMPAIGN_MARK = "campaign_lane"
SINK_FAMILIES = ("sqlite", "postgres", "postgres-2pc", "kafka", "delta", "iceberg")
# Fault kind -> the sink families it applies to. A Kafka sink has no store connection to
# drop; nor has an Iceberg table (PyIceberg's SQL catalog takes one per call).
FAULT_MATRIX: dict[str, tuple[str, ...]] = {
    "crash-point": SINK_FAMILIES,  # SIGKILL at a named protocol step, then recovery
    "zombie": SINK_FAMILIES,  # a paused (SIGSTOP) run resumes after a newer one: fenced
    # The store connection drops mid-commit (Delta's and Iceberg's commits hold none).
    "db-drop": ("sqlite", "postgres", "postgres-2pc"),
    "task-failure": SINK_FAMILIES,  # Spark tasks fail once and are retried
}


# Parametrizations of tests/spark: a scenario whose statements are the same on SQLite and
# PostgreSQL runs on SQLite in make test, and its PostgreSQL repeat in make test-campaign. Tests of
# PostgreSQL's own statements (upsert, complete mode, latest_by) and of the other sink
# families stay in make test.
SQL_STORES = ["sqlite", pytest.param("postgres", marks=pytest.mark.campaign_lane)]
FAMILY_SINKS = [
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.campaign_lane),
    "postgres-2pc",
    "kafka",
]


# -- capability markers ---------------------------------------------------------------------------

# Fixture -> the marker of the service it starts. Fixtures built on these (pg_url, kafka_topic,
# s3_bucket, s3_spark, crash's oracle...) need no entry: a test's fixture names include the
# fixtures its fixtures use.
SERVICE_FIXTURES: dict[str, str] = {
    "pg_server": "postgres",
    "kafka_broker": "kafka",
    "kafka_cluster": "kafka",  # tests/kafka/test_cluster.py: three KRaft nodes
    "s3": "s3",
    "spark": "spark",  # the shared local[2] session
    # Spark drivers in processes of their own:
    "drivers": "spark",  # tests/crash: the `sparkonce run` drivers a test starts
    "spark_cluster": "spark",  # tests/cluster: a standalone master and two workers
    "live_run": "spark",  # tests/ui/test_browser.py: the run the page shows
    "observed": "spark",  # tests/observe/test_run_observed.py: runs with metrics
}
# Parameters that choose a test's store; the test or its fixture then fetches the server with
# request.getfixturevalue, which collection cannot see. A value naming a service ("postgres",
# "postgres-2pc", "kafka-to-postgres", "delta-s3") adds that service's marker.
STORE_PARAMS = frozenset(
    {"store_url", "url", "new_store", "family_sink", "family", "store", "store_kind", "kind"}
)
PARAM_SERVICES = {"postgres": "postgres", "kafka": "kafka", "s3": "s3"}


def service_marks(item: pytest.Item) -> set[str]:
    """The capability markers the fixtures and store parameters of a test call for."""
    names = set(getattr(item, "fixturenames", ()))
    marks = {mark for fixture, mark in SERVICE_FIXTURES.items() if fixture in names}
    callspec = getattr(item, "callspec", None)
    for name, value in callspec.params.items() if callspec is not None else ():
        if name in STORE_PARAMS and isinstance(value, str):
            marks |= {PARAM_SERVICES[w] for w in re.split(r"[-_]", value) if w in PARAM_SERVICES}
    return marks


def lane_of(item: pytest.Item) -> str:
    """``"crash"`` for a test marked ``crash_lane`` (``make test-crash``), ``"campaign"`` for
    one marked ``campaign_lane`` (``make test-campaign``), else ``"test"``."""
    if item.get_closest_marker(CAMPAIGN_MARK) is not None:
        return "campaign"
    return "crash" if item.get_closest_marker(LANE_MARK) is not None else "test"


def covered_pairs(item: pytest.Item) -> list[tuple[str, str]]:
    """The (sink family, fault kind) pairs a test's ``covers`` markers name."""
    pairs = []
    for mark in item.iter_markers("covers"):
        if len(mark.args) != 2 or mark.kwargs:
            raise pytest.UsageError(
                f"{item.nodeid}: write @pytest.mark.covers(family, kind), not {mark}"
            )
        pairs.append((str(mark.args[0]), str(mark.args[1])))
    return pairs


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--lanes-report",
        metavar="PATH",
        help="write each collected test's lane, covered pairs, markers, fixtures and whether "
        "-m/-k selected it to PATH (JSON)",
    )
    parser.addoption(
        "--shard",
        type=int,
        metavar="K",
        help="run only shard K of the crash and campaign lanes (python -m tests.shards --list)",
    )
    parser.addoption("--lane-name", help="the lane's name in its end-of-run time line")
    parser.addoption(
        "--lane-budget", type=float, metavar="MINUTES", help="the lane's time budget, shown only"
    )
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write the passing crash/campaign tests' times into tests/shard-durations.json",
    )


_LANE_START = pytest.StashKey[float]()
_SESSION = pytest.StashKey[pytest.Session]()
_SHARD = pytest.StashKey[tuple[int, int]]()  # (shard, number of shards)


def _select_shard(config: pytest.Config, items: list[pytest.Item], k: int) -> None:
    """Keep only shard ``k``'s tests; the map is computed from the whole collection, so the
    run must collect the whole suite (test paths would change the map)."""
    from tests import shards

    tests_dir = Path(__file__).parent.resolve()
    if config.args_source == pytest.Config.ArgsSource.ARGS and any(
        (config.invocation_params.dir / a.split("::")[0]).resolve() != tests_dir
        for a in config.args
    ):
        raise pytest.UsageError(
            f"--shard packs the whole suite, so it takes no test paths (given: {config.args}); "
            "narrow a shard with -k instead"
        )
    plan = shards.plan({item.nodeid: lane_of(item) for item in items})
    if not 0 <= k < len(plan):
        raise pytest.UsageError(
            f"--shard {k}: there are {len(plan)} shards, 0 to {len(plan) - 1} "
            "(python -m tests.shards --list prints them)"
        )
    wanted = set(plan[k].tests)
    kept = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    items[:] = kept
    config.hook.pytest_deselected(items=dropped)
    config.stash[_SHARD] = (k, len(plan))


# Before pytest's own hook deselects by -m and -k, so the markers added here count, and
# the checks and the shard see every test.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    for item in items:
        for mark in sorted(service_marks(item)):
            if item.get_closest_marker(mark) is None:
                item.add_marker(mark)
        for family, kind in covered_pairs(item):
            if family not in FAULT_MATRIX.get(kind, ()):
                problems.append(
                    f"{item.nodeid}: covers({family!r}, {kind!r}) is no pair of "
                    "FAULT_MATRIX (tests/conftest.py)"
                )
            if lane_of(item) != "test":
                problems.append(
                    f"{item.nodeid}: a covers() test must run in make test, "
                    f"but it is marked {LANE_MARK} or {CAMPAIGN_MARK}"
                )
        lanes = [m for m in (LANE_MARK, CAMPAIGN_MARK) if item.get_closest_marker(m) is not None]
        if len(lanes) > 1:
            problems.append(f"{item.nodeid}: marked {' and '.join(lanes)}; a test has one lane")
    if problems:
        raise pytest.UsageError("test lanes:\n  " + "\n  ".join(problems))
    shard = config.getoption("--shard")
    if shard is not None:
        _select_shard(config, items, shard)
    # tests/unit first (a stable sort: any other order is kept). They start no JVM, so a
    # missing class-data archive builds in the background beside them (pytest_collection_finish).
    # Then tests/crash, the longest files of make test: pytest-xdist hands out files in this
    # order (with --no-loadscope-reorder; by default it orders them by their number of tests),
    # and a long file handed out last would leave one worker alone at the end.
    items.sort(
        key=lambda item: (
            not item.nodeid.startswith(UNIT_DIR),
            not item.nodeid.startswith(CRASH_DIR),
        )
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_LANE_START] = time.monotonic()
    session.config.stash[_SESSION] = session
    _measured.clear()
    _unmeasurable.clear()
    _summary.clear()


# With --record-durations: each test's setup, call and teardown time, and the tests whose time
# says nothing (failed or skipped).
_measured: dict[str, float] = {}
_unmeasurable: set[str] = set()


# Lines a test hands to the end-of-run summary through its report's user properties
# (``("terminal-summary", (section, line))``, as tests/sim/conftest.py does), by section: they
# reach this process from pytest-xdist's workers too.
_summary: dict[str, list[str]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _measured[report.nodeid] = _measured.get(report.nodeid, 0.0) + report.duration
    if report.failed or report.skipped:
        _unmeasurable.add(report.nodeid)
    for name, value in report.user_properties:
        if name == "terminal-summary":
            section, line = cast("tuple[str, str]", value)
            _summary.setdefault(str(section), []).append(str(line))


@pytest.hookimpl(trylast=True)  # after --durations' list: the lane's last line
def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """The lane's wall time against its budget (never a failure: the figures are for
    people), and the measured times if --record-durations asked for them."""
    if config.getoption("collectonly") or _LANE_START not in config.stash:
        return
    from tests import shards

    for section, lines in _summary.items():
        terminalreporter.section(section)
        for text in lines:
            terminalreporter.write_line(text)

    wall = time.monotonic() - config.stash[_LANE_START]
    name, budget = config.getoption("--lane-name"), config.getoption("--lane-budget")
    if _SHARD in config.stash:
        k, count = config.stash[_SHARD]
        name = name or f"make test-shard K={k} (shard {k} of 0..{count - 1})"
        budget = budget if budget is not None else shards.BOX_MINUTES
    line = f"lane {name or 'pytest ' + ' '.join(config.invocation_params.args)}: "
    line += shards.minutes(wall)
    line += f" of a {budget:g} min budget" if budget is not None else " (no budget)"
    items = config.stash[_SESSION].items
    estimates = shards.load_durations()
    sharded = [i for i in items if lane_of(i) in shards.SHARDED_LANES]
    if sharded:
        est = sum(shards.estimate(i.nodeid, lane_of(i), estimates).seconds for i in sharded)
        line += f"; {len(sharded)} crash/campaign tests estimated at {shards.minutes(est)}"
    if budget is not None and wall > budget * 60:
        line += " -- OVER BUDGET (a figure to act on, not a failure)"
    terminalreporter.write_sep("=", line, bold=True)
    if config.getoption("--record-durations"):
        lanes = {i.nodeid: lane_of(i) for i in items}
        measured = {
            n: seconds
            for n, seconds in _measured.items()
            if lanes.get(n) in shards.SHARDED_LANES and n not in _unmeasurable
        }
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        source = f"measured: pytest --record-durations at {commit}, {time.strftime('%Y-%m-%d')}"
        written = shards.record_durations(measured, source)
        terminalreporter.write_line(f"{written} measured times written to {shards.DURATIONS_FILE}")


_DESELECTED = pytest.StashKey[list[pytest.Item]]()

# Tests that start no JVM (pytest_collection_finish relies on it).
UNIT_DIR = "tests/unit/"
CRASH_DIR = "tests/crash/"
# The class-data archive's build when it runs in the background: its thread, and what it
# raised.
_archive_build: list[tuple[threading.Thread, list[BaseException]]] = []


def _start_archive_build(say: Callable[[str], None]) -> None:
    """Build a missing class-data archive (about a minute, once per checkout) in a thread, so
    that it overlaps the unit tests, which run first; the first other test waits for it
    (pytest_runtest_setup)."""
    from sparkonce.spark.classdata import DISABLE_ENV, archive_path, ensure_archive

    if os.environ.get(DISABLE_ENV):
        return
    path = archive_path()
    if path is None or path.is_file():
        return
    say(f"building the JVM class-data archive, once, beside the unit tests: {path}")
    raised: list[BaseException] = []

    def build() -> None:
        try:
            ensure_archive()
        except BaseException as exc:  # handed to the first test that needs the archive
            raised.append(exc)

    thread = threading.Thread(target=build, name="class-data archive", daemon=True)
    thread.start()
    _archive_build.append((thread, raised))


def _wait_for_archive() -> None:
    while _archive_build:
        thread, raised = _archive_build.pop()
        thread.join()
        if raised:
            pytest.exit(f"class-data archive: {raised[0]}", returncode=1)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if not item.nodeid.startswith(UNIT_DIR):
        _wait_for_archive()


def pytest_sessionfinish(session: pytest.Session) -> None:
    # A run that ended early (-x, or only unit tests reached) lets the build finish rather
    # than leave its JVM and a half-written file behind.
    for thread, _raised in _archive_build:
        thread.join()


def pytest_deselected(items: Sequence[pytest.Item]) -> None:
    if items:
        items[0].config.stash.setdefault(_DESELECTED, []).extend(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    collect_only = session.config.getoption("collectonly")
    if not collect_only and any(not i.nodeid.startswith(UNIT_DIR) for i in session.items):
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        _start_archive_build(reporter.write_line if reporter else print)
    path = session.config.getoption("--lanes-report")
    if not path:
        return
    import json

    # Every collected test, with what -m or -k kept: the selected ones are session.items.
    deselected = session.config.stash.get(_DESELECTED, [])
    gone = {item.nodeid for item in deselected}
    report = {
        item.nodeid: {
            "lane": lane_of(item),
            "covers": covered_pairs(item),
            "selected": item.nodeid not in gone,
            "marks": sorted({m.name for m in item.iter_markers()}),
            "fixtures": sorted(getattr(item, "fixturenames", ())),
        }
        for item in [*session.items, *deselected]
    }
    Path(path).write_text(json.dumps(report, indent=1))


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    from sparkonce.errors import ConfigError
    from sparkonce.sinks.delta import delta_jars, delta_spark_conf
    from sparkonce.sources.spark_kafka import spark_kafka_jars
    from sparkonce.spark.jars import s3_jars
    from sparkonce.spark.session import build_session, merge_spark_conf

    # With Delta Lake, Spark's Kafka connector and Hadoop's S3A filesystem (their jars are
    # fetched by `make jars`), for DeltaSink, SparkKafkaSource and s3a:// paths. The s3a
    # endpoint is set later, by the `s3_spark` fixture, once the S3 server runs.
    assert delta_jars(), "the Delta jars are missing: run scripts/fetch-jars.sh (make jars)"
    kafka_jars = spark_kafka_jars()
    assert kafka_jars, "the Spark Kafka connector jars are missing: run make jars"
    try:
        delta = delta_spark_conf()
    except ConfigError:  # a PySpark the pinned Delta is not built for (test_compat's 4.3 end)
        delta = {}
    # A Spark Connect client session built earlier in this run (tests/connect) leaves marks
    # in the environment that make PySpark's builder ask for a remote URL instead.
    for mark in ("SPARK_CONNECT_MODE_ENABLED", "SPARK_REMOTE", "SPARK_LOCAL_REMOTE"):
        os.environ.pop(mark, None)
    session = build_session(
        master="local[2]",
        app_name="sparkonce-tests",
        shuffle_partitions=2,
        conf=merge_spark_conf(delta, {"spark.jars": ",".join(kafka_jars + s3_jars())}),
    )
    yield session
    session.stop()


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server.

    Its cluster lives in a temp directory of its own, not under pytest's
    ``/tmp/pytest-of-<user>``: any other pytest session starting meanwhile resets
    that directory to mode 0700, which the ``postgres`` user then cannot enter.
    """
    from tests.services.postgres import session_server

    root = Path(tempfile.mkdtemp(prefix="sparkonce-test-pg-"))
    try:
        yield from session_server(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    """The session's Kafka broker: single-node KRaft from the pinned jars (tests/services/).

    Started on first use and stopped at the end of the run; tests fail, never skip, if it
    cannot start.
    """
    from tests.services.kafka import session_broker

    root = Path(tempfile.mkdtemp(prefix="sparkonce-test-kafka-"))
    try:
        yield from session_broker(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def s3() -> Iterator[S3Server]:
    """The session's S3-compatible server: moto's standalone server (tests/services/s3.py).

    Started on first use and stopped at the end of the run; tests fail, never skip, if it
    cannot start. Buckets live in the server's memory, so each test makes its own.
    """
    from tests.services.s3 import session_server

    root = Path(tempfile.mkdtemp(prefix="sparkonce-test-s3-"))
    try:
        yield from session_server(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def s3_spark(spark: SparkSession, s3: S3Server) -> SparkSession:
    """The shared SparkSession with ``s3a://`` paths pointed at the session's S3 server."""
    from tests.services.s3 import apply_s3a_settings

    apply_s3a_settings(spark, s3)
    return spark


@pytest.fixture
def s3_bucket(s3: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server."""
    return s3.create_bucket(f"t{os.getpid()}-{next(_db_counter)}")


@pytest.fixture
def kafka_topic(kafka_broker: KafkaBroker) -> Callable[..., str]:
    """Create a fresh, uniquely named topic: ``kafka_topic("events", partitions=3)``."""

    def create(prefix: str = "t", partitions: int = 3) -> str:
        name = f"{prefix}-{os.getpid()}-{next(_db_counter)}"
        kafka_broker.create_topic(name, partitions)
        return name

    return create


@pytest.fixture
def pg_url(pg_server: PostgresServer) -> str:
    """A fresh, empty database on the shared server."""
    return pg_server.create_database(f"t{os.getpid()}_{next(_db_counter)}")


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A sink store URL: a fresh SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sink.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def make_log(tmp_path: Path) -> Callable[..., Path]:
    """Create a topic 'events' and append values ``start..start+count-1`` keyed k0..k{keys-1}."""
    from sparkonce.log import IdempotentProducer, Topic

    root = tmp_path / "log"

    def produce(count: int, *, partitions: int = 3, keys: int = 5, start: int = 1) -> Path:
        topic = Topic.create(root, "events", partitions, exist_ok=True)
        with topic, IdempotentProducer(topic, "test-producer") as producer:
            for i in range(start, start + count):
                producer.send(str(i).encode(), f"k{i % keys}".encode())
        return root

    return produce
