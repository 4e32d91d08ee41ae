"""Checks of the query's shape run before the epoch, so a refused run fences nobody.

A live run of the pipeline (processing-time trigger, in a thread of this process) keeps
committing while new versions of the same pipeline, on the same checkpoint and sink, are
started beside it with a transform sparkonce does not support: one that unions a second
streaming source, one that reads Spark's ``rate`` source, one whose output mode Spark
refuses. Each must be refused with a ``ConfigError`` and no epoch taken; the live run must
go on committing new input, never fenced.

Then a checkpoint of another pipeline (issue 40, item 6): two pipelines read the same log
to the same end, so their checkpoints' positions coincide; the one started on the other's
checkpoint must be refused before the epoch, whatever the positions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from sparkonce import CheckpointError, ConfigError, EmbeddedLogSource, Pipeline, sink_from_url
from sparkonce.errors import RunStopped
from sparkonce.sinks.inspect import inspector_for

# Each test runs queries for 30-60 s on the shared session: outside `make test`'s budget.
pytestmark = pytest.mark.crash_lane


def _values(df: DataFrame) -> DataFrame:
    return df.select("record_id", F.col("value").cast("string").alias("value"))


def _state(p: Pipeline) -> tuple[int, int, int | None]:
    """(rows in the table, ledger entries, owner epoch) of ``p``'s sink. It opens and closes
    that sink object: never pass a pipeline that a live thread runs (its sink would be
    closed under it), but a twin built the same way."""
    p.sink.open()
    try:
        owner = p.sink.owner(p.name)
        rows = len(inspector_for(p.sink).rows())
        return rows, len(p.sink.ledger(p.name)), None if owner is None else owner.epoch
    finally:
        p.sink.close()


def _wait(
    what: str,
    check: Callable[[], bool],
    live: threading.Thread,
    outcome: list[BaseException | None],
    timeout: float = 180,
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        assert live.is_alive(), f"the live run ended while waiting for {what}: {outcome}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_unsupported_shapes_are_refused_before_the_epoch_beside_a_live_run(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(300, partitions=2)
    other_log = tmp_path / "other"
    from sparkonce.log import IdempotentProducer, Topic

    topic = Topic.create(other_log, "events", 1)
    with topic, IdempotentProducer(topic, "other-producer") as producer:
        producer.send(b"1", b"k")
    sink_url = f"sqlite:///{tmp_path / 'sink.db'}"

    def pipeline(transform: Callable[[DataFrame], Any], **kw: Any) -> Pipeline:
        return Pipeline(
            name="live",
            source=EmbeddedLogSource(log_dir, "events"),
            transform=transform,
            sink=sink_from_url(sink_url, "live_out"),
            checkpoint=tmp_path / "chk",
            trigger="processingTime=1 second",
            **kw,
        )

    live = pipeline(_values)
    twin = pipeline(_values)  # the same sink, read through objects the live run does not use
    stop = threading.Event()
    outcome: list[BaseException | None] = []

    def run_live() -> None:
        try:
            live.run(spark, stop=stop)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=run_live, daemon=True)
    thread.start()
    try:
        _wait("the live run's first 300 rows", lambda: _state(twin)[0] == 300, thread, outcome)
        assert _state(twin)[2] == 1

        def second_source(df: DataFrame) -> DataFrame:
            other = EmbeddedLogSource(other_log, "events").stream(df.sparkSession, None)
            return _values(df).unionByName(_values(other))

        def rate(df: DataFrame) -> DataFrame:
            ticks = df.sparkSession.readStream.format("rate").load()
            return _values(df).unionByName(
                ticks.select(
                    F.col("value").cast("string").alias("record_id"),
                    F.col("value").cast("string").alias("value"),
                )
            )

        def counts(df: DataFrame) -> DataFrame:
            return _values(df).groupBy("value").count()

        refused = [
            (pipeline(second_source), "besides the pipeline's own.*path=" + str(other_log)),
            (pipeline(rate), "besides the pipeline's own.*format 'rate'"),
            (pipeline(counts, output_mode="append"), "output_mode='append'"),
        ]
        for p, message in refused:
            with pytest.raises(ConfigError, match=message) as err:
                p.run(spark, timeout=120)
            assert "no epoch was taken" in str(err.value)
            assert _state(twin)[2] == 1, f"a refused run took an epoch: {err.value}"

        make_log(200, partitions=2, start=301)  # new input: the live run must still commit it
        _wait(
            "the live run to commit the new input", lambda: _state(twin)[0] == 500, thread, outcome
        )
        assert thread.is_alive() and not outcome, outcome
    finally:
        stop.set()
        thread.join(timeout=120)
    assert len(outcome) == 1 and isinstance(outcome[0], RunStopped), outcome
    assert _state(twin)[2] == 1


def test_another_pipelines_checkpoint_is_refused_when_positions_coincide(
    spark: SparkSession, tmp_path: Path, make_log: Callable[..., Path]
) -> None:
    log_dir = make_log(300, partitions=2)
    sink_url = f"sqlite:///{tmp_path / 'sink.db'}"

    def copy(name: str, checkpoint: str) -> Pipeline:
        return Pipeline(
            name=name,
            source=EmbeddedLogSource(log_dir, "events"),
            transform=_values,
            sink=sink_from_url(sink_url, name),
            checkpoint=tmp_path / checkpoint,
        )

    copy("copyA", "chkA").run(spark, timeout=300)
    copy("copyB", "chkB").run(spark, timeout=300)
    before_a, before_b = _state(copy("copyA", "chkA")), _state(copy("copyB", "chkB"))
    assert before_a == before_b == (300, 1, 1)

    make_log(100, partitions=2, start=301)
    swapped = copy("copyA", "chkB")
    with pytest.raises(CheckpointError, match="belongs to another query") as err:
        swapped.run(spark, timeout=300)
    assert "no epoch was taken" in str(err.value)
    assert _state(swapped) == before_a, "the refused run wrote to copyA's sink"

    # copyB's checkpoint was not advanced: copyB goes on from it.
    report = copy("copyB", "chkB").run(spark, timeout=300)
    assert report.resumed_from == "checkpoint"
    assert _state(copy("copyB", "chkB")) == (400, 2, 2)
    # copyA with its own checkpoint goes on too.
    assert copy("copyA", "chkA").run(spark, timeout=300).batches_committed == 1
