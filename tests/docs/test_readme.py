"""Every ```python and ```bash block of README.md and of every docs/**/*.md page, run as
written.

Blocks are identified by their first line (:data:`RUN` and :data:`EXEMPT`), whichever page
holds them; the guard :func:`test_every_block_is_run_or_exempt` fails when a page gains a
block neither lists, so a new example cannot go untested. A block may appear on several
pages (the quick start is in README.md and on its docs page) only as identical copies, which
the guard checks, so the copy that runs is every copy. The text that runs is always the
pages' current text.

Each run uses a fresh temp directory as its working directory, with ``.venv/bin`` (the
installed ``sparkonce`` CLI) first on ``PATH`` and no ``SPARKONCE_*`` variables, so the
commands see what a user's shell would. Bash blocks run with ``bash -euo pipefail``.

Substitutions, the only ones made:

- ``broker:9092`` becomes the test broker's bootstrap address (``kafka_broker.bootstrap``);
- ``/var/lib/orders-copy/checkpoint`` becomes a directory under the test's ``tmp_path``.

The multi-output example (``examples/orders.py``, shown whole in docs/guides/outputs.md) reads its
PostgreSQL URL and data directory from ``ORDERS_PG`` and ``ORDERS_DATA``; its test sets
them to a database of the test server and the test's directory. No other block that runs
connects to PostgreSQL (the join block's sink is built, never opened).

README.md's relative links must resolve to files of the repository
(:func:`test_readme_links_resolve`); the docs pages' links are checked by ``mkdocs build
--strict`` (``make lint``).

Topics: the quick start's embedded-log topic ``events`` and the Kafka CLI block's topic
``events`` are created by the blocks themselves (``sparkonce log create``, ``sparkonce kafka
create``). The Kafka guide says the ``KafkaProducer`` block needs an existing topic and the Kafka
pipeline needs existing topics, so the test creates ``events`` (if missing), ``orders`` and
``orders-clean`` for those.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import subprocess
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparkonce.sinks.inspect import inspector_for

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from tests.services.kafka import KafkaBroker

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
VENV_BIN = REPO / ".venv" / "bin"
TIMEOUT_S = 300

# The first lines that identify the pages' blocks.
QUICK_PY = "# pipeline.py"
QUICK_SH = "sparkonce log create data/log events --partitions 4"
KAFKA_PIPELINE = "from sparkonce import KafkaSink, KafkaSource, Pipeline"
KAFKA_PRODUCER = "from sparkonce import KafkaProducer"
SPARK_KAFKA = "from sparkonce import SparkKafkaSource"
DELTA_SOURCE = "from sparkonce import DeltaSink, DeltaSource, Pipeline"
DELTA_TO_PG = "# orders_to_pg.py: a silver Delta table served from PostgreSQL"
OWN_QUERY = "# orders_query.py: an existing spark.readStream query handed to sparkonce"
OWN_WRITE = "# orders_write.py: an existing foreachBatch query, its function now sparkonce's"
JOIN = "# join.py: each order with the payments made within 20 seconds of it, or alone if none was"
KAFKA_CLI = (
    "sparkonce kafka create broker:9092 events --partitions 4     # says so if it already exists"
)
VERIFY = (
    "sparkonce verify pipeline.py --trials 20 --seed 1 "
    "[--faults kill,crash-point,task-failure,db-drop,zombie] \\"
)
UI = (
    "sparkonce ui --sink URL [--sink URL ...] [--verify-report PATH/verify.json] [--port N] "
    "[--refresh SECONDS]"
)
JARS = (
    "sparkonce jars fetch        # Delta and the Kafka connector, about 19 MB, into "
    "~/.cache/sparkonce/jars"
)
SETUP = (
    "make demo   # creates .venv, installs sparkonce, runs the crash demo "
    "(embedded log -> SQLite, no servers)"
)

ORDERS = (
    "# examples/orders.py: JSON orders -> totals and dead letters (PostgreSQL) + an audit (SQLite)"
)
DEDUP = "# dedup.py: orders that a collector re-sent after a restart count once"

# Block -> the test that runs it as written.
RUN = {
    ORDERS: "test_orders_example",
    DEDUP: "test_dedup_example",
    QUICK_PY: "test_quick_start",
    QUICK_SH: "test_quick_start",
    KAFKA_PIPELINE: "test_kafka_pipeline",
    KAFKA_PRODUCER: "test_kafka_producer",
    SPARK_KAFKA: "test_spark_kafka_source",
    DELTA_SOURCE: "test_delta_source_block",
    DELTA_TO_PG: "test_delta_to_postgres_block",
    JOIN: "test_join_block",
    OWN_QUERY: "test_own_query_block",
    OWN_WRITE: "test_own_write_block",
    KAFKA_CLI: "test_kafka_cli",
}

CONNECT = "# `pipeline` is any sparkonce Pipeline, built as for a classic session"

# Block no test runs as written -> why. Keep this minimal.
EXEMPT = {
    # A fragment: `pipeline` comes from elsewhere and the server's URL is an example's.
    # tests/connect makes the same calls on a real Spark Connect server.
    CONNECT: "a fragment (pipeline and server from elsewhere); tests/connect makes these calls",
    # A synopsis, not an example: [optional] brackets are not shell syntax. test_exempt_synopsis
    # checks it still is one; verify campaigns are covered by tests/verify.
    VERIFY: "synopsis with [optional] brackets; covered by tests/verify",
    # Likewise a synopsis; the page is tested in a browser by tests/ui.
    UI: "synopsis with [optional] brackets; covered by tests/ui",
    # `make test` runs the whole suite, this file included (it would recurse), and `make demo`
    # runs the multi-minute crash demo inside the repository (.demo/). test_setup_block_dry_run
    # checks both commands with `make -n` instead.
    SETUP: "runs the whole suite (recursive) / the full demo; dry-run only",
    # Downloads from Maven Central into the user's cache (its s3 line 690 MB). The installed
    # wheel runs `sparkonce jars fetch delta` from Maven Central in tests/packaging/
    # test_wheel.py, tests/unit/test_jar_fetch.py the rest from a file:// repository, and
    # test_jars_block_parses checks each line's command line.
    JARS: "downloads (690 MB for s3); run by tests/packaging and tests/unit/test_jar_fetch.py",
}

RUNNABLE = ("python", "bash")
NOT_RUNNABLE = ("text",)  # the Layout tree, configuration snippets, a metrics scrape


def doc_pages() -> list[Path]:
    """README.md and every Markdown page of the docs site."""
    return [README, *sorted(DOCS.rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    path: str  # the page, relative to the repository
    lang: str
    line: int  # 1-based line of the opening fence
    text: str

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0].strip() if self.text.strip() else ""

    @property
    def digest(self) -> str:
        return hashlib.sha1(self.text.encode()).hexdigest()[:8]


def page_blocks(page: Path) -> list[Block]:
    """Every fenced block of one page, in order."""
    rel = page.relative_to(REPO).as_posix()
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(2), i
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        assert i < len(lines), f"{rel}:{start + 1}: unclosed code fence"
        blocks.append(Block(rel, m.group(3).lower(), start + 1, "\n".join(body) + "\n"))
        i += 1
    return blocks


def doc_blocks() -> list[Block]:
    """Every fenced block of every page (:func:`doc_pages`), page by page, in order."""
    return [b for page in doc_pages() for b in page_blocks(page)]


def block(first_line: str) -> Block:
    """The block that starts with ``first_line``: its copies on every page are identical
    (the guard checks it), so running one runs them all."""
    found = [b for b in doc_blocks() if b.lang in RUNNABLE and b.first_line == first_line]
    assert found, f"no page has a block starting {first_line!r}"
    assert len({b.text for b in found}) == 1, (
        f"the copies of {first_line!r} differ: {[b.where for b in found]}"
    )
    return found[0]


def substitute(text: str, *, bootstrap: str, tmp: Path | None = None) -> str:
    """The documented substitutions, and nothing else."""
    out = text.replace("broker:9092", bootstrap)
    if tmp is not None:
        out = out.replace("/var/lib/orders-copy/checkpoint", str(tmp / "orders-copy-checkpoint"))
    return out


def shell_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKONCE_")}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["PYSPARK_PYTHON"] = str(VENV_BIN / "python")
    return env


def run_bash(script: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=shell_env(),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n--- script\n{script}\n--- stdout\n{proc.stdout}\n"
        f"--- stderr\n{proc.stderr}"
    )
    return proc


def exec_block(b: Block, text: str, cwd: Path) -> dict[str, object]:
    namespace: dict[str, object] = {"__name__": f"doc_block_line_{b.line}"}
    old = Path.cwd()
    os.chdir(cwd)
    try:
        exec(compile(text, f"{b.path}:{b.line + 1}", "exec"), namespace)
    finally:
        os.chdir(old)
    return namespace


# --- the guard -----------------------------------------------------------------------------


def test_every_block_is_run_or_exempt() -> None:
    """The guard, over README.md and every docs page."""
    pages = doc_pages()
    assert len(pages) > 10, f"the docs pages are missing: {pages}"
    blocks = doc_blocks()
    other = [b.where for b in blocks if b.lang not in RUNNABLE + NOT_RUNNABLE]
    assert not other, f"blocks in an unexpected language (test or tag them): {other}"
    runnable = [b for b in blocks if b.lang in RUNNABLE]
    copies: dict[str, set[str]] = {}
    for b in runnable:
        copies.setdefault(b.first_line, set()).add(b.text)
    differ = {
        first: [b.where for b in runnable if b.first_line == first]
        for first, texts in copies.items()
        if len(texts) > 1
    }
    assert not differ, f"blocks that share a first line but differ (make them one): {differ}"
    assert not set(RUN) & set(EXEMPT)
    unlisted = [
        f"{b.where} ({b.lang}, {b.digest}): {b.first_line!r}"
        for b in runnable
        if b.first_line not in RUN and b.first_line not in EXEMPT
    ]
    assert not unlisted, "blocks no test runs (add a test, or an exemption):\n" + (
        "\n".join(unlisted)
    )
    stale = (set(RUN) | set(EXEMPT)) - set(copies)
    assert not stale, f"listed blocks no longer on any page: {sorted(stale)}"
    missing = {name for name in RUN.values() if not callable(globals().get(name))}
    assert not missing, f"RUN names tests that do not exist: {missing}"


def test_readme_links_resolve() -> None:
    """Every relative link and image of README.md names a file of the repository (they
    resolve on GitHub); an anchor after it must be a heading of that Markdown page."""
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "README.md has no links into the docs"
    broken = []
    for link in links:
        if re.match(r"^[a-z]+://", link):
            continue
        target, _, anchor = link.partition("#")
        path = (REPO / target).resolve() if target else README
        if not path.is_file():
            broken.append(link)
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
            if anchor not in slugs:
                broken.append(link)
    assert not broken, f"README.md links that do not resolve: {broken}"
    docs = {link.partition("#")[0] for link in links if link.startswith("docs/")}
    assert "docs/index.md" in docs and "docs/getting-started/quick-start.md" in docs, docs


def test_readme_is_short() -> None:
    """Issue 43: the README stays a front page (at most about 150 lines); the rest is in
    docs/."""
    lines = README.read_text().splitlines()
    assert len(lines) <= 160, f"README.md has {len(lines)} lines; move detail into docs/"


def test_exempt_synopsis_is_a_synopsis() -> None:
    """The verify and ui blocks are exempt only while they are synopses (brackets), not
    examples."""
    for first_line in (VERIFY, UI):
        synopsis = block(first_line)
        assert re.search(r"\[--\w", synopsis.text), synopsis.text


def test_setup_block_dry_run() -> None:
    """``make demo`` and ``make test`` (not run: see EXEMPT) name real targets: ``make -n``."""
    b = block(SETUP)
    commands = [line.split("#", 1)[0].strip() for line in b.text.splitlines()]
    commands = [c for c in commands if c]
    assert commands == ["make demo", "make test"], commands
    expect = {"demo": "sparkonce demo", "test": "pytest"}
    for command in commands:
        target = command.split()[1]
        proc = subprocess.run(
            ["make", "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        assert expect[target] in proc.stdout, proc.stdout


# --- the examples --------------------------------------------------------------------------


@pytest.mark.campaign_lane  # in the rotation: make test's budget (39 s alone)
def test_quick_start(tmp_path: Path) -> None:
    """The quick start (README.md and its docs page): pipeline.py saved as is, then the bash
    block after it, in that directory."""
    py = block(QUICK_PY)
    sh = block(QUICK_SH)
    holders = [p for p in doc_pages() if any(b.first_line == QUICK_PY for b in page_blocks(p))]
    assert README in holders, "README.md must hold the quick start"
    for page in holders:
        firsts = [b.first_line for b in page_blocks(page)]
        at = firsts.index(QUICK_PY)
        assert firsts[at + 1 : at + 2] == [QUICK_SH], f"{page}: the bash block must follow"
    (tmp_path / "pipeline.py").write_text(py.text)

    proc = run_bash(sh.text, tmp_path)

    expected = {f"k{r}": sum(i for i in range(1, 1001) if i % 4 == r) for r in range(4)}
    assert sum(expected.values()) == 1000 * 1001 // 2
    with sqlite3.connect(tmp_path / "data" / "out.db") as db:
        rows = dict(db.execute("SELECT key, total FROM sums").fetchall())
    assert rows == expected
    assert "pipeline sums" in proc.stdout, proc.stdout  # sparkonce status
    assert "topic events (4 partitions, 1000 records)" in proc.stdout, proc.stdout  # log describe


def test_kafka_cli(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    """The Kafka CLI block: create, produce 1..1000, describe, tail."""
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.kafka.topic import partition_offsets, tail

    b = block(KAFKA_CLI)
    conn = KafkaConnection(kafka_broker.bootstrap)
    existed = "events" in kafka_broker.admin().list_topics(timeout=10).topics
    before = {p.partition: p.end for p in partition_offsets(conn, "events")} if existed else {}

    proc = run_bash(substitute(b.text, bootstrap=kafka_broker.bootstrap), tmp_path)

    after = partition_offsets(conn, "events")
    assert len(after) == 4 or existed
    new = {p.partition: p.end - before.get(p.partition, 0) for p in after}
    assert sum(new.values()) == 1000
    records = [
        r for r in tail(conn, "events", max(new.values())) if r.offset >= before.get(r.partition, 0)
    ]
    assert sorted(int(r.value or b"") for r in records) == list(range(1, 1001))
    assert all(r.key is None for r in records)
    assert "delivered 1000 records" in proc.stdout, proc.stdout
    assert "Kafka topic events (4 partitions)" in proc.stdout or existed, proc.stdout
    # tail -n 5: the last five records of each partition, one line each
    tail_lines = [line for line in proc.stdout.splitlines() if re.match(r"^\d+\t\d+\t", line)]
    assert len(tail_lines) == sum(min(5, p.end - p.start) for p in after), proc.stdout


def test_kafka_producer(tmp_path: Path, kafka_broker: KafkaBroker) -> None:
    """The KafkaProducer block against the broker; the record lands with its key and id."""
    from sparkonce.kafka.client import KafkaConnection
    from sparkonce.kafka.topic import partition_offsets, tail

    b = block(KAFKA_PRODUCER)
    kafka_broker.create_topic("events", 4, exist_ok=True)
    conn = KafkaConnection(kafka_broker.bootstrap)
    before = {p.partition: p.end for p in partition_offsets(conn, "events")}

    ns = exec_block(b, substitute(b.text, bootstrap=kafka_broker.bootstrap), tmp_path)

    assert ns["delivered"] == 1
    after = {p.partition: p.end for p in partition_offsets(conn, "events")}
    assert sum(after.values()) - sum(before.values()) == 1
    (record,) = [r for r in tail(conn, "events", 1) if r.offset >= before[r.partition]]
    assert (record.key, record.value, record.record_id) == (b"user-7", b"42", "order-1001")


def test_kafka_pipeline(tmp_path: Path, kafka_broker: KafkaBroker, spark: SparkSession) -> None:
    """The Kafka pipeline block: exec'd, then run on records the test produced into orders."""
    from sparkonce import KafkaProducer, Pipeline

    b = block(KAFKA_PIPELINE)
    for topic in ("orders", "orders-clean"):
        kafka_broker.create_topic(topic, 2, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    sent = {f"order-{i}-{tag}": f"customer-{i % 3}" for i in range(20)}
    with KafkaProducer(kafka_broker.bootstrap, "orders") as producer:
        for value, key in sent.items():
            producer.send(value, key=key)
        assert producer.flush() == len(sent)

    text = substitute(b.text, bootstrap=kafka_broker.bootstrap, tmp=tmp_path)
    ns = exec_block(b, text, tmp_path)
    pipeline = ns["pipeline"]
    assert isinstance(pipeline, Pipeline)
    report = pipeline.run(spark)

    assert report.rows_committed >= len(sent)
    rows = inspector_for(pipeline.sink, fresh=True).rows()
    ours = Counter((r["key"], r["value"]) for r in rows if str(r["value"]).endswith(tag))
    assert ours == Counter((k, v) for v, k in sent.items())


def test_delta_source_block(tmp_path: Path) -> None:
    """The DeltaSource guide's block builds the pipeline it shows (its s3a:// paths are not
    read until a run; tests/delta/test_source.py runs such pipelines on local tables)."""
    from sparkonce import DeltaSink, DeltaSource, Pipeline

    b = block(DELTA_SOURCE)
    ns = exec_block(b, b.text, tmp_path)
    pipeline = ns["pipeline"]
    assert isinstance(pipeline, Pipeline)
    assert isinstance(pipeline.source, DeltaSource) and isinstance(pipeline.sink, DeltaSink)
    assert pipeline.source.uri() == "delta:s3a://lake/bronze/orders"
    assert pipeline.source.read_limits() == {"max_files_per_batch": 500}
    assert "io.delta.sql.DeltaSparkSessionExtension" in pipeline.spark_conf().values()


def test_delta_to_postgres_block(tmp_path: Path) -> None:
    """The DeltaSource guide's Delta to PostgreSQL block builds the pipeline it shows (the
    PostgreSQL sink is built, never opened; tests/delta/test_delta_pg.py runs such pipelines
    on local tables into a real server)."""
    from sparkonce import DeltaSource, Pipeline, PostgresSink

    b = block(DELTA_TO_PG)
    pipeline = exec_block(b, b.text, tmp_path)["pipeline"]
    assert isinstance(pipeline, Pipeline)
    assert isinstance(pipeline.source, DeltaSource) and isinstance(pipeline.sink, PostgresSink)
    assert pipeline.source.uri() == "delta:s3a://lake/silver/orders"
    assert "io.delta.sql.DeltaSparkSessionExtension" in pipeline.spark_conf().values()


def test_join_block(tmp_path: Path) -> None:
    """The several-sources guide's block builds the pipeline it shows: two named Kafka
    sources as one (tests/kafka/test_source_set.py runs such a join on a broker; building
    the PostgreSQL sink connects to nothing)."""
    from sparkonce import Pipeline
    from sparkonce.sources.source_set import SourceSet

    b = block(JOIN)
    ns = exec_block(b, substitute(b.text, bootstrap="localhost:1"), tmp_path)
    pipeline = ns["pipeline"]
    assert isinstance(pipeline, Pipeline) and isinstance(pipeline.source, SourceSet)
    assert pipeline.source.names == ("orders", "payments")
    assert pipeline.source.topics_read() == {"orders", "payments"}
    assert pipeline.output_mode == "append"


def test_own_query_block(tmp_path: Path, spark: SparkSession) -> None:
    """The SparkSource guide's block builds the pipeline it shows (the PostgreSQL sink is
    built, never opened), and its function's query is the one Kafka read SparkSource takes
    (tests/sources/test_spark_source.py runs such queries on a broker)."""
    from sparkonce import Pipeline, SparkSource
    from sparkonce.sources.spark_query import Relation

    b = block(OWN_QUERY)
    ns = exec_block(b, substitute(b.text, bootstrap="localhost:1"), tmp_path)
    pipeline = ns["pipeline"]
    assert isinstance(pipeline, Pipeline) and isinstance(pipeline.source, SparkSource)
    assert any("spark-sql-kafka" in j for j in pipeline.spark_conf()["spark.jars"].split(","))
    built = SparkSource(ns["orders"](spark))  # type: ignore[operator]
    assert built.relation == Relation("kafka", "orders")
    assert built.replay_condition() is None and built.read_note() is None  # read_committed


def test_own_write_block(tmp_path: Path) -> None:
    """The foreach_batch guide's block builds the function it shows, bound to its sink and
    checkpoint (the PostgreSQL sink is built, never opened), and its query hands that function
    to foreachBatch on that checkpoint (tests/sources/test_foreach_batch.py runs such queries
    on a broker and PostgreSQL)."""
    from sparkonce import PostgresSink
    from sparkonce.pipeline.foreach_batch import ForeachBatch

    b = block(OWN_WRITE)
    ns = exec_block(b, substitute(b.text, bootstrap="localhost:1"), tmp_path)
    write = ns["write"]
    assert isinstance(write, ForeachBatch) and isinstance(write.sink, PostgresSink)
    assert (write.name, write.checkpoint_location) == (
        "orders-to-postgres",
        "/var/lib/orders/checkpoint",
    )
    assert callable(ns["start"])
    assert ".foreachBatch(write)" in b.text and '"checkpointLocation", checkpoint' in b.text


def test_spark_kafka_source(tmp_path: Path, kafka_broker: KafkaBroker, spark: SparkSession) -> None:
    """The SparkKafkaSource block: exec'd, then read into SQLite by a pipeline."""
    from sparkonce import KafkaProducer, Pipeline, SparkKafkaSource, sink_from_url

    b = block(SPARK_KAFKA)
    kafka_broker.create_topic("orders", 2, exist_ok=True)
    tag = uuid.uuid4().hex[:8]
    with KafkaProducer(kafka_broker.bootstrap, "orders") as producer:
        for i in range(12):
            producer.send(f"spark-{i}-{tag}")
        assert producer.flush() == 12

    ns = exec_block(b, substitute(b.text, bootstrap=kafka_broker.bootstrap), tmp_path)
    source = ns["source"]
    assert isinstance(source, SparkKafkaSource)
    assert source.connector_options == {"minPartitions": "8", "kafka.fetch.max.bytes": "52428800"}
    pipeline = Pipeline(
        name=f"readme-spark-kafka-{tag}",
        source=source,
        sink=sink_from_url(f"sqlite:///{tmp_path / 'out.db'}", "orders"),
        checkpoint=tmp_path / "chk",
        transform=lambda df: df.selectExpr("CAST(value AS STRING) AS value", "partition", "offset"),
    )
    pipeline.run(spark)
    rows = inspector_for(pipeline.sink, fresh=True).rows()
    assert sorted(r["value"] for r in rows if r["value"].endswith(tag)) == sorted(
        f"spark-{i}-{tag}" for i in range(12)
    )


def test_orders_example(
    tmp_path: Path, spark: SparkSession, pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The multi-output example (docs/guides/outputs.md) is examples/orders.py, and it
    writes what it says."""
    import json
    import random
    from decimal import Decimal

    import psycopg

    from sparkonce.log import IdempotentProducer, Topic

    b = block(ORDERS)
    assert b.text == (REPO / "examples" / "orders.py").read_text(), "docs and examples differ"
    monkeypatch.setenv("ORDERS_PG", pg_url)
    monkeypatch.setenv("ORDERS_DATA", str(tmp_path / "data"))

    rng = random.Random(7)
    totals: dict[str, list[Decimal]] = {}
    bad: Counter[str] = Counter()
    topic = Topic.create(tmp_path / "data" / "log", "orders", 2)
    with topic, IdempotentProducer(topic, "shop") as producer:
        for i in range(1500):
            r = rng.random()
            if r < 0.05:
                value, why = b'{"order_id": "o", "customer": "c", "amount": "abc"}', "WRONG_TYPE"
            elif r < 0.08:
                value, why = b"not json", "MALFORMED_JSON"
            elif r < 0.10:
                value, why = (
                    b'{"order_id": "o", "customer": "c", "amount": -3}',
                    "NON_POSITIVE_AMOUNT",
                )
            elif r < 0.11:
                value, why = b'{"order_id": "o", "amount": 5}', "MISSING_FIELD"
            else:
                amount = Decimal(rng.randrange(1, 10000)) / 100
                customer = f"c{i % 7}"
                totals.setdefault(customer, []).append(amount)
                value, why = (
                    json.dumps(
                        {"order_id": f"o{i}", "customer": customer, "amount": str(amount)}
                    ).encode(),
                    "",
                )
            if why:
                bad[why] += 1
            producer.send(value, f"o{i}".encode())

    namespace = exec_block(b, b.text, tmp_path)
    namespace["pipeline"].run(spark)  # type: ignore[attr-defined]

    with psycopg.connect(pg_url) as conn:
        got = {c: (t, n) for c, t, n in conn.execute("SELECT * FROM customer_totals")}
        letters: Counter[str] = Counter(
            dict(conn.execute("SELECT error_class, count(*) FROM order_dead_letters GROUP BY 1"))
        )
    assert got == {c: (sum(a), len(a)) for c, a in totals.items()}
    assert letters == bad
    with sqlite3.connect(tmp_path / "data" / "audit.db") as db:
        audit = db.execute(
            "SELECT count(*), count(DISTINCT record_id), count(DISTINCT audit_id) "
            "FROM accepted_orders"
        ).fetchone()
    good = sum(len(a) for a in totals.values())
    assert audit == (good, good, good)


def test_dedup_example(
    tmp_path: Path, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dedupe block: a collector sends 100 orders, restarts (a new producer id) and
    re-sends the last 20 under the same record ids, then sends 10 new ones: 110 count.
    The block's paths are relative: it is built and run in the test's directory."""
    from sparkonce import Pipeline
    from sparkonce.log import IdempotentProducer, Topic

    monkeypatch.chdir(tmp_path)
    b = block(DEDUP)
    topic = Topic.create(tmp_path / "data" / "log", "orders", 2)
    with topic:
        with IdempotentProducer(topic, "collector") as producer:
            for i in range(100):
                producer.send(f"amount {i}".encode(), record_id=f"order-{i}")
        with IdempotentProducer(topic, "collector-restarted") as producer:
            for i in range(80, 110):
                producer.send(f"amount {i}".encode(), record_id=f"order-{i}")
        assert sum(topic.end_offsets().values()) == 130

    ns = exec_block(b, b.text, tmp_path)
    pipeline = ns["pipeline"]
    assert isinstance(pipeline, Pipeline)
    report = pipeline.run(spark)

    with sqlite3.connect(tmp_path / "data" / "orders.db") as db:
        ids = [r for (r,) in db.execute("SELECT record_id FROM orders")]
        late = db.execute("SELECT count(*) FROM late_orders").fetchone()[0]
    assert sorted(ids) == sorted(f"order-{i}" for i in range(110))
    assert late == 0
    assert sum(c.duplicates_removed for c in report.dedup.values()) == 20


def test_jars_block_parses() -> None:
    """Each command of the exempt jars block is one the CLI takes, as written."""
    import shlex

    from sparkonce.cli import build_parser

    lines = [line.split("#", 1)[0].strip() for line in block(JARS).text.splitlines()]
    commands = [shlex.split(line) for line in lines if line]
    assert [c[:3] for c in commands] == [["sparkonce", "jars", "fetch"]] * 2 + [
        ["sparkonce", "jars", "list"]
    ]
    for argv in commands:
        args = build_parser().parse_args(argv[1:])
        assert callable(args.func), argv
