"""``Pipeline.explain`` and ``sparkonce explain`` on real pipelines and Spark's real plans.

Each expectation is written by hand from what the pipeline is (its sink classes, the
expressions its transform uses, its stateful operator), not read from the explain code.
The comparison with ``sparkonce verify`` is in tests/verify (the same pipeline files are
explained and then run under faults).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import functions as F

from sparkonce import EmbeddedLogSource, KafkaSink, Pipeline, SQLiteSink
from sparkonce.cli import main
from sparkonce.outputs import dedupe
from sparkonce.pipeline.explain import checkpoint_storage
from sparkonce.pipeline.plan import plan_facts
from tests.spark.test_stateful_detection import STATEFUL
from tests.verify.broken_sink import NonTransactionalSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def _values(df: DataFrame) -> DataFrame:
    return df.select(
        F.col("key").cast("string").alias("key"),
        F.col("value").cast("string").cast("long").alias("v"),
    )


def _pipeline(tmp_path: Path, log: Path, transform: Callable[..., Any], **kw: Any) -> Pipeline:
    if "sink" not in kw and "outputs" not in kw:
        kw["sink"] = SQLiteSink(f"sqlite:///{tmp_path / 'out.db'}", "out")
    return Pipeline(
        name="explained",
        source=EmbeddedLogSource(log, "events"),
        transform=transform,
        checkpoint=tmp_path / "ckpt",
        **kw,
    )


def _part(exp: Any, name: str) -> Any:
    return next(p for p in exp.parts if p.part == name)


def test_a_stateless_deterministic_pipeline_into_sqlite_is_effectively_once(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    exp = _pipeline(tmp_path, make_log(10), _values).explain(spark)
    assert exp.guarantee == "effectively-once"
    assert _part(exp, "transform").verdict == "deterministic"
    assert _part(exp, "state").verdict == "stateless"
    assert _part(exp, "source").verdict == "replayable input"
    assert _part(exp, "output").verdict == "effectively-once"
    assert exp.facts.nondeterministic == () and exp.facts.stateful == ()
    assert not (tmp_path / "out.db").exists(), "explain must not touch the store"
    assert not (tmp_path / "ckpt").exists(), "explain must not start a query"


def test_non_deterministic_expressions_are_named_and_one_store_stays_effectively_once(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    shout = F.udf(lambda s: s, "string").asNondeterministic()
    trusted = F.udf(lambda s: s, "string")

    def transform(df: DataFrame) -> DataFrame:
        v = _values(df)
        return v.select(
            "key",
            (F.col("v") + F.rand()).alias("noisy"),
            F.expr("uuid()").alias("id"),
            F.current_timestamp().alias("at"),
            shout("key").alias("a"),
            trusted("key").alias("b"),
            F.monotonically_increasing_id().alias("m"),
        )

    exp = _pipeline(tmp_path, make_log(10), transform).explain(spark)
    nondet = " ".join(exp.facts.nondeterministic)
    for name in ("rand", "uuid", "monotonically_increasing_id", "declared non-deterministic"):
        assert name in nondet, (name, exp.facts)
    assert exp.facts.clock == ("current_timestamp()",)
    assert any("<lambda>" in f for f in exp.facts.python_functions)  # the trusted UDF
    assert _part(exp, "transform").verdict == "non-deterministic"
    # One SQL store: only one attempt of a batch commits, so it stays effectively-once.
    assert exp.guarantee == "effectively-once"


def test_an_at_least_once_sink_makes_the_pipeline_at_least_once(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    sink = NonTransactionalSink(f"sqlite:///{tmp_path / 'b.db'}", "out")
    exp = _pipeline(tmp_path, make_log(10), _values, sink=sink).explain(spark)
    assert exp.guarantee == "at-least-once"
    out = _part(exp, "output")
    assert out.verdict == "at-least-once" and out.to_strengthen
    assert "output" in exp.why


def test_kafka_output_needs_read_committed_readers_and_stable_output_when_non_deterministic(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log = make_log(10)

    def as_records(df: DataFrame) -> DataFrame:
        v = _values(df)
        return v.select("key", F.concat_ws(":", "key", F.expr("uuid()")).alias("value"))

    def reshuffled(df: DataFrame) -> DataFrame:
        return as_records(df).repartition(4, "value")  # the uuid picks the row's partition

    sink = KafkaSink("127.0.0.1:1", "orders-out")  # never connected: explain opens nothing
    shuffled = _pipeline(tmp_path, log, reshuffled, sink=sink).explain(spark)
    assert shuffled.guarantee == "no guarantee"
    assert "rows can be lost or repeated" in _part(shuffled, "output").why
    assert "stable_output=True" in (_part(shuffled, "output").to_strengthen or "")

    # No shuffle after the uuid: a rewritten partition reads the same offset ranges, so it
    # holds the same records; only the values differ between attempts (issue 40, item 11).
    plain = _pipeline(tmp_path, log, as_records, sink=sink).explain(spark)
    assert plain.guarantee == "effectively-once for read_committed consumers"
    out = _part(plain, "output")
    assert "only the values can differ" in out.why and "lost or repeated" not in out.why
    ledger = _part(plain, "ledger")
    assert ledger.verdict == "replicated as the cluster says" and not ledger.counts
    assert "'orders-out.sparkonce-ledger'" in ledger.what

    stable = _pipeline(tmp_path, log, reshuffled, sink=sink, stable_output=True).explain(spark)
    assert stable.guarantee == "effectively-once for read_committed consumers"
    out = next(p for p in stable.parts if p.part.startswith("output"))
    assert "isolation.level=read_committed" in (out.to_strengthen or "")
    assert "orders-out" in (out.to_strengthen or "")
    assert stable.kafka_outputs


def test_dedupe_into_kafka_is_deterministic_and_its_read_limits_are_shared_by_backlog(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    """dedupe's own spark_partition_id() is not the transform's (issue 40, item 11), and a cap
    per partition meets dedupe's watermark: explain names the rule (item C)."""

    def deduped(df: DataFrame) -> DataFrame:
        rows = df.select("key", "value", "record_id", "timestamp")
        return dedupe(rows, "record_id", within="10 seconds", event_time="timestamp")

    pipeline = Pipeline(
        name="explained",
        source=EmbeddedLogSource(make_log(10), "events", max_records_per_partition=5),
        transform=deduped,
        sink=KafkaSink("127.0.0.1:1", "orders-out"),
        checkpoint=tmp_path / "ckpt",
    )
    exp = pipeline.explain(spark)
    assert exp.facts.nondeterministic == (), exp.facts
    assert _part(exp, "transform").verdict == "deterministic"
    assert exp.guarantee == "effectively-once for read_committed consumers", exp.why
    limits = _part(exp, "read limits")
    assert limits.verdict == "shared out by backlog"
    assert "max_records_per_partition=5" in limits.what and "in proportion" in limits.why


def test_plan_facts_tell_a_shuffle_after_non_determinism(stream: DataFrame) -> None:
    noisy = stream.withColumn("r", F.rand())
    assert plan_facts(noisy).nondeterministic == ("rand()",)
    assert plan_facts(noisy).before_shuffle == ()
    assert plan_facts(noisy.repartition("r")).before_shuffle == ("rand()",)
    after = stream.repartition("key").withColumn("r", F.rand())  # computed after the shuffle
    assert plan_facts(after).before_shuffle == ()
    mine = dedupe(stream, "record_id", within="10 seconds", event_time="timestamp")
    assert plan_facts(mine).nondeterministic == ()
    assert plan_facts(mine.withColumn("r", F.rand())).before_shuffle == ()


def test_outputs_in_two_stores_need_stable_output_for_non_deterministic_columns(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log = make_log(10)

    def two(df: DataFrame) -> dict[str, DataFrame]:
        v = _values(df).withColumn("id", F.expr("uuid()"))
        return {"a": v, "b": v}

    outputs = {
        "a": SQLiteSink(f"sqlite:///{tmp_path / 'a.db'}", "a"),
        "b": SQLiteSink(f"sqlite:///{tmp_path / 'b.db'}", "b"),
    }
    split = _pipeline(tmp_path, log, two, outputs=outputs, stable_output=False).explain(spark)
    assert split.guarantee == "effectively-once per output"
    assert "uuid()" in _part(split, "outputs").why
    stable = _pipeline(tmp_path, log, two, outputs=outputs).explain(spark)  # default: stable
    assert stable.guarantee == "effectively-once"
    assert _part(stable, "outputs").verdict == "effectively-once"

    def deterministic(df: DataFrame) -> dict[str, DataFrame]:
        v = _values(df)
        return {"a": v, "b": v}

    same = _pipeline(tmp_path, log, deterministic, outputs=outputs, stable_output=False)
    assert same.explain(spark).guarantee == "effectively-once"


EXPECTED_OPERATOR = {
    "group_agg": "Aggregate",
    "window_count": "Aggregate",
    "session_count": "Aggregate",
    "drop_duplicates": "Deduplicate",
    "drop_duplicates_within_watermark": "DeduplicateWithinWatermark",
    "stream_stream_join": "stream-stream Join",
    "streaming_limit": "GlobalLimit",
    "pandas_state": "FlatMapGroupsInPandasWithState",
    "transform_with_state": "TransformWithStateInPySpark",
}


@pytest.fixture(scope="module")
def stream(spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> DataFrame:
    """One streaming DataFrame over a small log, for the plan-only tests (building a
    source's stream starts Spark's Python data source workers: seconds each time)."""
    from sparkonce.log import IdempotentProducer, Topic

    root = tmp_path_factory.mktemp("explain") / "log"
    with Topic.create(root, "events", 2) as topic, IdempotentProducer(topic, "p") as producer:
        for i in range(10):
            producer.send(str(i).encode(), f"k{i % 3}".encode())
    return EmbeddedLogSource(root, "events").stream(spark, None)


@pytest.mark.parametrize(("transform", "mode"), STATEFUL, ids=[t.__name__ for t, _ in STATEFUL])
def test_every_stateful_api_is_found_in_the_plan(
    stream: DataFrame, transform: Callable[..., Any], mode: str
) -> None:
    facts = plan_facts(transform(stream))
    assert EXPECTED_OPERATOR[transform.__name__] in facts.stateful, facts
    if transform.__name__ in ("pandas_state", "transform_with_state"):
        assert facts.python_functions, "a pandas function is beyond the plan: say so"
    else:
        assert not facts.python_functions, facts


def test_a_stateful_pipeline_says_where_its_state_lives(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    transform, mode = STATEFUL[0]
    exp = _pipeline(tmp_path, make_log(10), transform, output_mode=mode).explain(spark)
    assert EXPECTED_OPERATOR[transform.__name__] in exp.facts.stateful
    state = _part(exp, "state")
    assert state.verdict == "stateful" and "RocksDB" in state.what
    assert "refuses to resume" in _part(exp, "checkpoint").why
    assert exp.guarantee == "effectively-once"


def test_dedupe_is_reported_for_the_records(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    def deduped(df: DataFrame) -> DataFrame:
        d = dedupe(df, "record_id", within="1 hour", event_time="timestamp")
        return d.select("record_id", F.col("value").cast("string").alias("v"))

    exp = _pipeline(tmp_path, make_log(10), deduped, output_mode="append").explain(spark)
    assert _part(exp, "records").verdict == "deduplicated"
    plain = _pipeline(tmp_path, make_log(10), _values).explain(spark)
    assert "dedupe(" in (_part(plain, "records").to_strengthen or "")


MOUNTS = """\
overlay / overlay rw,relatime 0 0
tmpfs /tmp tmpfs rw 0 0
server:/export /mnt/shared nfs4 rw 0 0
s3fs /mnt/bucket fuse.s3fs rw 0 0
/dev/sda1 /mnt/shared/local\\040disk ext4 rw 0 0
"""


@pytest.mark.parametrize(
    ("path", "storage", "fstype"),
    [
        ("/work/ckpt", "local", "overlay"),
        ("/tmp/ckpt", "memory", "tmpfs"),
        ("/mnt/shared/ckpt", "shared", "nfs4"),
        ("/mnt/bucket/a/b", "shared", "fuse.s3fs"),
        ("/mnt/shared/local disk/ckpt", "local", "ext4"),
        ("/mnt/sharedish/ckpt", "local", "overlay"),  # a prefix of a name is not a parent
    ],
)
def test_checkpoint_storage_is_read_from_the_mount_table(
    path: str, storage: str, fstype: str
) -> None:
    info = checkpoint_storage(Path(path), MOUNTS)
    assert (info["storage"], info["fstype"]) == (storage, fstype)


def test_cli_prints_the_table_and_the_same_content_as_json(
    spark: SparkSession,
    tmp_path: Path,
    make_log: Callable[..., Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = make_log(10)
    path = tmp_path / "p.py"
    path.write_text(
        "from pyspark.sql import functions as F\n"
        "from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink\n"
        f"pipeline = Pipeline(name='cli', source=EmbeddedLogSource({str(log)!r}, 'events'),\n"
        "    transform=lambda df: df.select('key', F.rand().alias('r')),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'o.db'}', 'out'),\n"
        f"    checkpoint={str(tmp_path / 'ck')!r})\n"
    )
    assert main(["explain", str(path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["guarantee"] == "effectively-once"
    assert data["nondeterministic"] == ["rand()"]
    assert {p["part"] for p in data["parts"]} >= {"source", "transform", "state", "output"}
    assert main(["explain", str(path)]) == 0
    text = capsys.readouterr().out
    assert "pipeline guarantee:" in text and "effectively-once" in text and "rand()" in text


def test_cli_bad_input_is_exit_2_with_a_message(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["explain", str(tmp_path / "missing.py")]) == 2
    assert "does not exist" in capsys.readouterr().err
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n")
    assert main(["explain", str(broken)]) == 2
    assert "not_a_module_anywhere" in capsys.readouterr().err
    nolog = tmp_path / "nolog.py"
    nolog.write_text(
        "from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink\n"
        f"pipeline = Pipeline(name='x', source=EmbeddedLogSource({str(tmp_path / 'no')!r}, 'e'),\n"
        f"    sink=SQLiteSink('sqlite:///{tmp_path / 'o.db'}', 'out'),\n"
        f"    checkpoint={str(tmp_path / 'ck')!r})\n"
    )
    assert main(["explain", str(nolog)]) == 2
    assert "topic 'e' does not exist" in capsys.readouterr().err
