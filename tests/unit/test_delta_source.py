"""DeltaSource's pure parts: Delta offsets as ledger positions (property tests), a batch's
range from Spark's offset log, the refusal of a new checkpoint inside a version, the options
it refuses, and the failures it names. No Spark."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sparkonce import DeltaSource
from sparkonce.errors import CheckpointError, CheckpointLostError, ConfigError, SourceError
from sparkonce.offsets import Coverage, classify
from sparkonce.sources import source_from_uri
from sparkonce.sources.delta import (
    VERSION_SPAN,
    DeltaOffset,
    delta_ranges,
    files_read,
    position,
    version_of,
)

TABLE_ID = "82f1eb12-259d-4f01-9b16-1382f61f762c"
versions = st.integers(min_value=0, max_value=2**30)
indexes = st.integers(min_value=-1, max_value=VERSION_SPAN - 2)


def offset(version: int, index: int, snapshot: bool = False, table: str = TABLE_ID) -> str:
    """An offset as Delta 4.4 writes it into Spark's offset log (seen in a run)."""
    return json.dumps(
        {
            "sourceVersion": 1,
            "reservoirId": table,
            "reservoirVersion": version,
            "index": index,
            "isStartingVersion": snapshot,
        },
        separators=(",", ":"),
    )


@given(versions, indexes, versions, indexes)
def test_positions_order_offsets_as_delta_does(v1: int, i1: int, v2: int, i2: int) -> None:
    """Delta compares offsets by (version, index); the positions compare the same way, and
    two offsets share a position only when they are the same."""
    a, b = position(v1, i1), position(v2, i2)
    assert (a < b) == ((v1, i1) < (v2, i2))
    assert (a == b) == ((v1, i1) == (v2, i2))


@given(versions, indexes)
def test_a_position_gives_back_its_version_and_files_read(v: int, i: int) -> None:
    """The version and the count of its files read come back from the number; the boundary
    (no file read) is exactly index -1, and it sorts before every file of the version and
    after every file of the version before."""
    p = position(v, i)
    assert version_of(p) == v and files_read(p) == i + 1
    assert (files_read(p) == 0) == (i == -1)
    assert position(v, -1) <= p < position(v + 1, -1)


@pytest.mark.parametrize("index", [-20, -19, -2, VERSION_SPAN - 1])
def test_indexes_outside_the_read_ones_are_refused(index: int) -> None:
    """-20/-19 (schema tracking's metadata changes) and indexes past 2**32 - 2 have no place."""
    with pytest.raises(CheckpointError, match="index must be between -1"):
        position(3, index)


def test_a_batch_range_runs_from_the_previous_offset_to_this_one() -> None:
    # Seen in a run: a snapshot of version 2 in batches of 2 files, then version 3's start.
    first = delta_ranges(json.dumps({"sparkonceStart": 0}), offset(2, 1, True))
    (r,) = first.ranges
    assert (r.topic, r.partition, r.start, r.end) == (f"delta:{TABLE_ID}", 0, 0, 2 * 2**32 + 2)
    nxt = delta_ranges(offset(2, 7, True), offset(3, -1))
    assert (nxt.ranges[0].start, nxt.ranges[0].end) == (2 * 2**32 + 8, 3 * 2**32)
    # A no-data batch (the same offset again) is empty, at the previous end.
    same = delta_ranges(offset(3, -1), offset(3, -1))
    assert same.empty and same.ends() == nxt.ends()
    # A first batch from startingVersion 1 starts at version 1's start.
    started = delta_ranges(json.dumps({"sparkonceStart": 2**32}), offset(2, 0))
    assert started.ranges[0].start == 2**32 and started.ranges[0].end == 2 * 2**32 + 1
    # A replay of a first batch after the ledger moved on: the start never passes the end.
    late = delta_ranges(json.dumps({"sparkonceStart": 9 * 2**32}), offset(2, 0))
    assert late.empty and late.ends() == started.ends()


def test_a_resumed_batch_is_new_and_a_replayed_one_committed() -> None:
    """The positions feed step 2 of the protocol as offsets do."""
    committed = delta_ranges(None, offset(3, -1)).ends()
    resumed = delta_ranges(json.dumps({"sparkonceStart": 3 * 2**32}), offset(4, 0))
    assert classify(resumed, committed) == Coverage.NEW
    replay = delta_ranges(offset(2, 7, True), offset(3, -1))
    assert classify(replay, committed) == Coverage.COMMITTED


def test_offsets_of_another_source_or_table_are_refused() -> None:
    with pytest.raises(CheckpointError, match="not a Delta source offset"):
        DeltaOffset.parse('{"events": {"0": 12}}')
    with pytest.raises(CheckpointError, match="two Delta tables"):
        delta_ranges(offset(1, -1, table="other"), offset(2, -1))
    with pytest.raises(CheckpointError, match="went back"):
        delta_ranges(offset(3, -1), offset(2, 4))


def test_a_new_checkpoint_inside_a_version_is_refused_at_a_boundary_accepted() -> None:
    source = DeltaSource("/data/bronze")
    topic = f"delta:{TABLE_ID}"
    source.check_ledger_start({(topic, 0): 5 * 2**32})
    with pytest.raises(CheckpointLostError) as refused:
        source.check_ledger_start({(topic, 0): 5 * 2**32 + 2})
    text = str(refused.value)
    assert "DeltaSource(delta:///data/bronze)" in text and "inside version 5 " in text
    assert "first 2 data files" in text and "\n" not in text


@pytest.mark.parametrize(
    "option",
    ["startingVersion", "ignoreChanges", "ignoreDeletes", "readChangeFeed", "failOnDataLoss"],
)
def test_options_that_would_repeat_drop_or_move_rows_are_refused(option: str) -> None:
    with pytest.raises(ConfigError, match=f"may not set {option!r}"):
        DeltaSource("/t", options={option: "true"})
    assert DeltaSource("/t", options={"excludeRegex": "x"}).reader_options == {"excludeRegex": "x"}


def test_uri_round_trip_and_description() -> None:
    source = DeltaSource("/data/bronze", skip_change_commits=True)
    assert source.uri() == "delta:///data/bronze"
    assert isinstance(source_from_uri(source.uri()), DeltaSource)
    assert source_from_uri("delta:s3a://bucket/t").uri() == "delta:s3a://bucket/t"
    assert "skip_change_commits" in source.describe()


def test_failures_are_named_with_the_table_and_version() -> None:
    source = DeltaSource("/data/bronze")
    change = (
        "[STREAM_FAILED] ... [DELTA_SOURCE_TABLE_IGNORE_CHANGES] Detected a data update (for "
        "example DELETE ...) in the source table at version 3. This is currently not supported."
    )
    err = source.read_failure(change, None)
    assert isinstance(err, SourceError) and "version 3 of the table" in str(err)
    assert "skip_change_commits=True" in str(err)
    batch = delta_ranges(offset(1, -1), offset(2, 1))
    gone = (
        "[FAILED_READ_FILE.FILE_NOT_EXIST] Error while reading file "
        "file:/data/bronze/part-00000-abc.snappy.parquet. [FILE_NOT_EXIST] File does not exist"
    )
    err = source.read_failure(gone, batch)
    assert isinstance(err, SourceError)
    assert "reading table versions 1 to 2 " in str(err) and "part-00000-abc.snappy.parquet" in str(
        err
    )
    assert source.read_failure(gone.replace("/data/bronze", "/other"), batch) is None
    assert source.read_failure("[CAST_INVALID_INPUT] no", batch) is None


def test_a_delta_source_pipeline_is_refused_on_spark_connect(tmp_path: Path) -> None:
    """Classic sessions only: refused before anything is read, naming the source."""
    from sparkonce import Pipeline
    from sparkonce.faults import NO_FAULTS
    from sparkonce.pipeline.connect import refuse_on_connect
    from sparkonce.sinks import sink_from_url

    pipeline = Pipeline(
        name="p",
        source=DeltaSource(tmp_path / "t"),
        sink=sink_from_url(f"sqlite:///{tmp_path / 'o.db'}", "out"),
        checkpoint=tmp_path / "chk",
    )
    with pytest.raises(ConfigError, match=r"do not support the source DeltaSource\(delta:///"):
        refuse_on_connect(pipeline, faults=NO_FAULTS)
