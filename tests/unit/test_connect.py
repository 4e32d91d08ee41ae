"""What runs a pipeline on a Spark Connect session, without a server: the batch function
pickles with plain values only, the run report's skipped and empty batches come from the
ledger, the client's release of a batch's DataFrame is left to the server, and the command
line's ``--remote``. The real server's tests are in tests/connect."""

from __future__ import annotations

import argparse
import gc
import pickle
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url
from sparkonce.cli.common import _check_remote, add_spark_options, spark_target
from sparkonce.errors import ConfigError
from sparkonce.ledger.base import LedgerEntry
from sparkonce.observe.report import RunReport
from sparkonce.offsets import BatchRanges
from sparkonce.pipeline.connect import (
    ConnectBatch,
    LedgerFeed,
    _release_on_server_only,
)


def _pipeline(tmp_path: Path) -> Pipeline:
    return Pipeline(
        name="c1",
        source=EmbeddedLogSource(tmp_path / "log", "events"),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'sink.db'}", "out"),
        checkpoint=tmp_path / "chk",
    )


def test_the_batch_function_pickles_and_opens_nothing_until_it_runs(tmp_path: Path) -> None:
    p = _pipeline(tmp_path)
    p.sink.open()  # the user's sink is open on the client: its copy must not be
    try:
        fn = ConnectBatch("c1", 7, p.sink, p.source, str(tmp_path / "chk"), None)
        back = pickle.loads(pickle.dumps(fn))
    finally:
        p.sink.close()
    assert (back.pipeline, back.epoch, back.checkpoint_location) == ("c1", 7, str(tmp_path / "chk"))
    assert back._sink is None and back._checkpoint is None
    sink = back.sink
    assert sink is not p.sink
    assert (type(sink), sink.table, sink.mode) == (type(p.sink), "out", "append")
    assert not sink.store.connected  # built again, not opened


def _every_sink(tmp_path: Path) -> list[Any]:
    from sparkonce import DeltaSink, KafkaSink, PostgresTwoPhaseSink
    from sparkonce.outputs.output_set import OutputSet

    pg = "postgresql://u:s3cret@127.0.0.1:9/db"
    return [
        sink_from_url(f"sqlite:///{tmp_path / 'a.db'}", "out", mode="upsert", keys=["k"]),
        sink_from_url(pg, "out", latest_by=["ts"], mode="upsert", keys=["k"]),
        PostgresTwoPhaseSink(pg, "out"),
        KafkaSink("127.0.0.1:9", "out", client_config={"sasl.password": "s3cret"}),
        DeltaSink(str(tmp_path / "delta"), mode="upsert", keys=["k"]),
        OutputSet(
            {
                "a": sink_from_url(f"sqlite:///{tmp_path / 'a.db'}", "a"),
                "b": sink_from_url(f"sqlite:///{tmp_path / 'a.db'}", "b"),
            },
            stable=False,
        ),
    ]


def test_every_sink_pickles_as_the_call_that_built_it(tmp_path: Path) -> None:
    """What a Connect batch function carries to the server: a new, unopened sink of the same
    class and settings, with no lock or connection (KafkaSink holds a lock, which does not
    pickle by itself)."""
    for sink in _every_sink(tmp_path):
        back = pickle.loads(pickle.dumps(sink))
        assert type(back) is type(sink)
        assert back is not sink
        assert back.describe() == sink.describe()
        assert repr(back) == repr(sink)
        assert "s3cret" not in repr(back)


def _entry(seq: int, epoch: int, batch: int, checkpoint: str = "q1") -> LedgerEntry:
    return LedgerEntry(
        "c1",
        seq,
        BatchRanges(()),
        epoch,
        10,
        datetime.now(UTC),
        spark_batch_id=batch,
        checkpoint_id=checkpoint,
    )


def test_the_report_counts_replays_from_the_ledger_not_from_input_rows() -> None:
    """Batch 1 replayed (an earlier epoch's entry of the same checkpoint: skipped, though
    Spark counted 0 input rows for it), batch 2 committed by this epoch, batch 3 empty,
    and batch 4, whose entry of an earlier epoch came from another checkpoint: empty."""
    ledger = [
        _entry(0, 1, 0),
        _entry(1, 1, 1),
        _entry(2, 2, 2),
        _entry(3, 1, 4, checkpoint="q0"),
    ]
    source = SimpleNamespace(committed=lambda _name, _ranges: None)
    pipeline: Any = SimpleNamespace(
        name="c1", sink=SimpleNamespace(ledger=lambda _n: ledger), source=source, output_set=None
    )
    progress = [SimpleNamespace(batchId=b, numInputRows=0) for b in (1, 2, 3, 4)]
    query: Any = SimpleNamespace(recentProgress=progress)
    report = RunReport("c1", 2, "checkpoint")
    LedgerFeed(pipeline, report).finish(query, "q1")
    assert report.batches_committed == 1 and report.rows_committed == 10
    assert [b.spark_batch_id for b in report.batches] == [2]
    assert (report.batches_skipped, report.batches_empty) == (1, 2)


def test_the_feed_hands_each_new_entry_of_the_epoch_to_the_hooks_once_in_ledger_order() -> None:
    ledger = [_entry(0, 1, 0), _entry(1, 2, 1)]
    told: list[Any] = []
    source = SimpleNamespace(committed=lambda name, ranges: told.append(("source", name)))
    pipeline: Any = SimpleNamespace(
        name="c1", sink=SimpleNamespace(ledger=lambda _n: ledger), source=source, output_set=None
    )
    report = RunReport("c1", 2, "checkpoint")
    feed = LedgerFeed(pipeline, report, [lambda b: told.append(("hook", b.spark_batch_id))])
    feed.poll()
    ledger.append(_entry(2, 2, 2))
    feed.poll()
    feed.poll()
    assert told == [("source", "c1"), ("hook", 1), ("source", "c1"), ("hook", 2)]
    assert [b.result.seq for b in report.batches] == [1, 2] and report.batches_committed == 2


class _Client:
    """Records the release call that PySpark's finalizer makes."""

    is_closed = False
    _user_id = None

    def __init__(self) -> None:
        self.calls = 0

    def _execute_plan_request_with_metadata(self) -> Any:
        self.calls += 1
        raise RuntimeError("no server here")  # the finalizer logs it and goes on


def _batch_df(client: _Client) -> Any:
    from pyspark.sql.connect.plan import CachedRemoteRelation

    session: Any = SimpleNamespace(client=client)
    return SimpleNamespace(_plan=CachedRemoteRelation("df-1", session))


def test_the_release_of_a_batchs_dataframe_is_left_to_the_server() -> None:
    client = _Client()
    df = _batch_df(client)
    _release_on_server_only(df)
    del df
    gc.collect()
    assert client.calls == 0
    # Without it, PySpark's finalizer calls the server (the call that could hang).
    client = _Client()
    df = _batch_df(client)
    del df
    gc.collect()
    assert client.calls == 1


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_spark_options(p, "log")
    return p.parse_args(list(argv))


@pytest.mark.parametrize(
    "url",
    ["sc://localhost:15002", "sc://spark.example.com", "sc://h:1/;token=x;use_ssl=true", "local"],
)
def test_remote_urls_spark_connect_takes(url: str) -> None:
    _check_remote(url)
    assert spark_target(_parse("--remote", url)) == ("local[2]", url)  # the default master


@pytest.mark.parametrize("url", ["http://localhost:15002", "sc://", "localhost:15002", "local[0]"])
def test_other_remote_urls_are_refused(url: str) -> None:
    with pytest.raises(ValueError):
        _check_remote(url)


def test_a_bad_spark_remote_in_the_environment_is_a_usage_error_naming_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARK_REMOTE", "localhost:15002")
    with pytest.raises(SystemExit) as exit_:
        _parse()
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "SPARK_REMOTE" in err and "sc://HOST:PORT" in err


def test_master_and_remote_together_are_refused() -> None:
    with pytest.raises(ConfigError, match="exclude each other"):
        spark_target(_parse("--master", "local[1]", "--remote", "sc://h:1"))
    assert spark_target(_parse()) == ("local[2]", None)


class _ConnectFrame:
    """Stands for a Spark Connect DataFrame: no ``_jdf``, a class of pyspark.sql.connect."""


_ConnectFrame.__module__ = "pyspark.sql.connect.dataframe"


def test_kafka_task_keys_of_a_connect_frame_need_a_source_with_stable_numbers() -> None:
    """No JVM plan to walk: partition numbers key the tasks only when the source keeps them
    stable; otherwise the batch is refused, never keyed by numbers a replay may change."""
    from sparkonce.errors import SinkError
    from sparkonce.sources import EmbeddedLogSource, KafkaSource, SparkKafkaSource
    from sparkonce.spark.kafka_lineage import task_keys

    frame: Any = _ConnectFrame()
    with pytest.raises(SinkError, match="cannot name this batch's tasks on a Spark Connect"):
        task_keys(frame)
    assert task_keys(frame, numbers_stable=True) is None
    assert EmbeddedLogSource.stable_task_numbers and KafkaSource.stable_task_numbers
    assert not SparkKafkaSource.stable_task_numbers


# Modules that still reach py4j themselves (none: each has its Connect route).
_BRIDGE_USERS_LEFT: set[str] = set()


def test_only_the_jvm_module_reaches_into_py4j() -> None:
    """The Connect issue's rule: PySpark's py4j handles are read in sparkonce.jvm alone, so
    that every other module gets None on a Connect session and must handle it."""
    import re

    import sparkonce

    root = Path(sparkonce.__file__).parent
    handle = re.compile(r"\._(jvm|jdf|jsc|jsparkSession)\b|\.sparkContext\b|\b_(jvm|jdf|jsc)\b")
    users = {
        str(path.relative_to(root))
        for path in root.rglob("*.py")
        if path.name != "jvm.py" and handle.search(path.read_text())
    }
    assert users == _BRIDGE_USERS_LEFT


def test_the_jvm_module_answers_none_for_a_session_without_a_jvm() -> None:
    from sparkonce import jvm

    connect_like: Any = SimpleNamespace(conf=None)
    for read in (
        jvm.jvm,
        jvm.java_session,
        jvm.hadoop_conf,
        jvm.spark_context,
        jvm.spark_jars,
        jvm.accumulator_server,
    ):
        assert read(connect_like) is None, read
    assert jvm.java_frame(connect_like) is None and jvm.analyzed_plan(connect_like) is None
    assert jvm.set_log_level(connect_like, "ERROR") is False


def test_a_server_that_stopped_answering_is_named_and_other_errors_pass_through() -> None:
    from sparkonce.errors import SparkServerUnavailableError, StoreUnavailableError
    from sparkonce.pipeline.connect import server_gone

    class Unavailable(Exception):
        def code(self) -> str:
            return "StatusCode.UNAVAILABLE"

    p: Any = SimpleNamespace(name="c1")
    with pytest.raises(SparkServerUnavailableError, match="Run the pipeline again") as caught:
        server_gone(p, Unavailable("<_InactiveRpcError: failed to connect to all addresses>"))
    assert isinstance(caught.value, StoreUnavailableError)  # the CLI's exit 4
    server_gone(p, RuntimeError("a batch failed: division by zero"))  # not the server's


def test_the_fault_plan_pickles_with_the_batch_function_without_its_hits(tmp_path: Path) -> None:
    from sparkonce.faults import FaultPlan
    from sparkonce.protocol import CrashPoint

    plan = FaultPlan.from_env(
        {"SPARKONCE_CRASH_AT": "after-rows@2", "SPARKONCE_FAULT_EVENTS": str(tmp_path / "e")}
    )
    assert plan.crash_point(CrashPoint.AFTER_ROWS) is False  # hit 1 of 2 here
    p = _pipeline(tmp_path)
    fn = ConnectBatch("c1", 7, p.sink, p.source, str(tmp_path / "chk"), None, plan)
    back = pickle.loads(pickle.dumps(fn)).faults
    assert (back.crash, back.events) == (plan.crash, plan.events)
    assert back._hits == {} and plan._hits  # the worker counts its own hits


def test_a_kafka_source_pickles_without_its_monitoring_consumer() -> None:
    """The client's source has reported progress (its monitoring consumer is open) before
    the next run's batch function carries it to the server."""
    import threading

    from sparkonce.sources import KafkaSource, SparkKafkaSource

    for kind in (KafkaSource, SparkKafkaSource):
        source = kind("127.0.0.1:9", "in")
        source._committer, source._committer_group = threading.Lock(), "g"  # unpicklable
        back = pickle.loads(pickle.dumps(source))
        assert back._committer is None and back._committer_group is None
        assert back.describe() == source.describe() and source._committer is not None


def test_resetting_a_delta_table_on_connect_needs_no_jvm(tmp_path: Path) -> None:
    """sparkonce verify's reset between trials deletes the table; Delta's log cache is
    cleared only where there is one (the classic adapter's JVM; the Connect adapter's
    ``jvm`` is None)."""
    from sparkonce.sinks.inspect import DeltaInspector

    deleted: list[str] = []
    table = SimpleNamespace(jvm=None, delete=deleted.append)
    forgotten: list[bool] = []
    sink: Any = SimpleNamespace(
        path=str(tmp_path / "t"), table=table, forget_table=lambda: forgotten.append(True)
    )
    DeltaInspector(sink).reset("p1")
    assert deleted == [str(tmp_path / "t")] and forgotten == [True]


def _outputs(tmp_path: Path) -> Any:
    """Two outputs in one SQLite file and one in another: two stores, stable output on."""
    from sparkonce import PostgresSink, SQLiteSink

    return {
        "a": SQLiteSink(f"sqlite:///{tmp_path / 'a.db'}", "a"),
        "dead": SQLiteSink(f"sqlite:///{tmp_path / 'a.db'}", "dead"),
        "b": PostgresSink("postgresql://u:s3cret@127.0.0.1:9/db", "b"),
    }


def test_an_output_set_pickles_with_its_layout_aliases_and_each_stores_epoch(
    tmp_path: Path,
) -> None:
    """What the worker needs of several outputs: the transform's layout and aliases, and
    the epoch each store gave the run (the stores' epochs differ); nothing opened."""
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkonce.outputs.combine import OutputLayout
    from sparkonce.outputs.quality import DEAD_LETTER_SCHEMA

    p = Pipeline(
        name="c1",
        source=EmbeddedLogSource(tmp_path / "log", "events"),
        outputs=_outputs(tmp_path),
        checkpoint=tmp_path / "chk",
    )
    outputs = p.output_set
    assert outputs is not None and outputs.stable and len(outputs.groups) == 2
    schema = StructType([StructField("n", LongType())])
    layout = OutputLayout(("a", "dead"), {"a": schema, "dead": DEAD_LETTER_SCHEMA})
    outputs.use_layout(layout, {"b": "a"})
    outputs.groups[0].epoch, outputs.groups[1].epoch = 3, 7
    fn = ConnectBatch("c1", 3, p.sink, p.source, str(tmp_path / "chk"), None)
    back = pickle.loads(pickle.dumps(fn)).sink
    assert back is not outputs and back.describe() == outputs.describe()
    assert back.layout == layout and back.aliases == {"b": "a"}
    assert [g.epoch for g in back.groups] == [3, 7]
    assert [g.committer for g in back.groups] == [None, None] and back._stable is None
    assert back.stable_root == outputs.stable_root and back.checkpoint == outputs.checkpoint
    assert "s3cret" not in repr(back)


def test_several_outputs_pass_the_connect_check_and_an_unlisted_output_sink_is_named(
    tmp_path: Path,
) -> None:
    from sparkonce import KafkaSink, SparkKafkaSource
    from sparkonce.faults import NO_FAULTS
    from sparkonce.pipeline.connect import refuse_on_connect

    def with_outputs(**more: Any) -> Pipeline:
        return Pipeline(
            name="c1",
            source=EmbeddedLogSource(tmp_path / "log", "events"),
            outputs={**_outputs(tmp_path), **more},
            checkpoint=tmp_path / "chk",
        )

    refuse_on_connect(with_outputs(), faults=NO_FAULTS)  # runs on Connect: no error
    single = Pipeline(
        name="c1",
        source=EmbeddedLogSource(tmp_path / "log", "events"),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'a.db'}", "out"),
        checkpoint=tmp_path / "chk",
        stable_output=True,
    )
    refuse_on_connect(single, faults=NO_FAULTS)

    class Unlisted(type(_outputs(tmp_path)["a"])):  # type: ignore[misc]
        """Not on Connect's list."""

    unlisted = Unlisted(f"sqlite:///{tmp_path / 'c.db'}", "c")
    with pytest.raises(ConfigError) as refused:
        refuse_on_connect(with_outputs(c=unlisted), faults=NO_FAULTS)
    text = str(refused.value)
    assert f"do not support the sink {unlisted.describe()} (output 'c') yet" in text
    assert "no epoch was taken" in text and "several outputs" in text

    into_kafka = Pipeline(
        name="c1",
        source=SparkKafkaSource("127.0.0.1:9", "in"),
        outputs={**_outputs(tmp_path), "k": KafkaSink("127.0.0.1:9", "out")},
        checkpoint=tmp_path / "chk",
    )
    with pytest.raises(ConfigError, match=r"into KafkaSink \(output 'k'\)"):
        refuse_on_connect(into_kafka, faults=NO_FAULTS)


def test_the_feed_reports_a_batch_of_several_stores_once_the_last_store_has_it() -> None:
    """Store A (epoch 1 of this run) commits before store B (epoch 3). A batch is reported
    when B's ledger has it, with both stores' rows; batch 2 is a replay A had from an
    earlier run (epoch 0), which only B committed now: its rows are B's alone."""
    a = [_entry(0, 1, 0), _entry(1, 1, 1), _entry(2, 0, 2)]
    b = [_entry(0, 3, 0)]
    groups = [
        SimpleNamespace(sinks=[SimpleNamespace(ledger=lambda _n: a)], epoch=1),
        SimpleNamespace(sinks=[SimpleNamespace(ledger=lambda _n: b)], epoch=3),
    ]
    source = SimpleNamespace(committed=lambda _name, _ranges: None)
    pipeline: Any = SimpleNamespace(
        name="c1", source=source, output_set=SimpleNamespace(groups=groups)
    )
    report = RunReport("c1", 1, "checkpoint")
    told: list[tuple[int, int, int | None]] = []
    feed = LedgerFeed(
        pipeline,
        report,
        [lambda r: told.append((r.spark_batch_id, r.result.row_count, r.result.seq))],
    )
    feed.poll()
    assert told == [(0, 20, 0)]  # batch 1 is in A only: not yet
    b.extend([_entry(1, 3, 1), _entry(2, 3, 2)])
    progress = [SimpleNamespace(batchId=i) for i in (0, 1, 2, 3)]
    feed.finish(SimpleNamespace(recentProgress=progress), "q1")  # type: ignore[arg-type]
    assert told == [(0, 20, 0), (1, 20, 1), (2, 10, 2)]
    assert (report.batches_committed, report.rows_committed) == (3, 50)
    assert (report.batches_skipped, report.batches_empty) == (0, 1)


def test_dedup_counts_read_the_observed_metrics_of_a_connect_progress() -> None:
    """A Connect client's progress holds each observed-metrics row in its JSON form, made a
    Row of ``values`` and ``schema`` (as PySpark 4.2 parsed it from a real server); the
    records without an id are counted from it as from a classic session's
    ``Row(null_ids=...)``."""
    from pyspark.sql import Row

    from sparkonce.outputs import DedupCounts, dedup_counts

    schema = {"type": "struct", "fields": [{"name": "null_ids", "type": "long"}]}
    operator = {"operatorName": "dedupeWithinWatermark", "numRowsTotal": 4}
    for row in (Row(values=[2], schema=schema), Row(null_ids=2)):
        entry = {
            "batchId": 3,
            "observedMetrics": {"sparkonce_dedup": row},
            "stateOperators": [operator],
        }
        assert dedup_counts(entry) == DedupCounts(3, 2, 0, 0, 4), row
    empty = {
        "batchId": 0,
        "observedMetrics": {"sparkonce_dedup": Row(values=[None], schema=schema)},
    }
    assert dedup_counts(empty) is None  # no rows yet: Spark's sum is NULL, no operator seen
