"""The Kafka sink's task marker codec (ledger/kafka_marker.py) beyond its round trip: the
defaults of fields older markers lack, the time a new marker is stamped with, the errors
that name a marker the codec cannot read, and a marker of an older batch. Pure, no broker;
tests/unit/test_kafka_marker.py has the round trip and the records older sparkonces wrote.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from sparkonce.errors import LedgerError
from sparkonce.ledger.kafka_marker import MARKER_VERSION, Marker
from sparkonce.offsets import BatchRanges, OffsetRange

RANGES = BatchRanges((OffsetRange("orders", 0, 0, 5),))
RECORD = {
    "type": "marker",
    "pipeline": "p",
    "partition": 0,
    "seq": 3,
    "ranges": {"orders": {"0": [0, 5]}},
    "epoch": 1,
}


def test_a_marker_without_rows_or_time_reads_as_0_rows_and_no_time() -> None:
    m = Marker.from_record(RECORD)
    assert (m.rows, m.at, m.attempt, m.task) == (0, "", 0, "0")


def test_a_new_marker_is_stamped_with_the_time_in_utc() -> None:
    at = Marker("p", 0, "0", 3, RANGES, 1, 5).to_record()["at"]
    offset = datetime.fromisoformat(at).utcoffset()
    assert offset == timedelta(0)


def test_a_marker_of_a_newer_version_names_its_pipeline_and_what_to_do() -> None:
    with pytest.raises(LedgerError) as err:
        Marker.from_record({**RECORD, "v": MARKER_VERSION + 1})
    assert str(err.value) == (
        f"a task marker of pipeline 'p' in the Kafka ledger topic has record version "
        f"{MARKER_VERSION + 1}, newer than this sparkonce reads (up to {MARKER_VERSION}): a "
        "newer sparkonce wrote it. Run this pipeline with that sparkonce version or a later one."
    )


def test_a_record_that_is_no_marker_is_named_with_what_is_wrong() -> None:
    with pytest.raises(LedgerError) as err:
        Marker.from_record({"type": "marker", "pipeline": "p"})
    assert str(err.value) == (
        "a task marker of pipeline 'p' in the Kafka ledger topic cannot be read (KeyError: "
        "'partition'); the ledger topic holds a record sparkonce did not write. Check what "
        "else writes to it."
    )


def test_a_marker_that_ends_before_the_batch_starts_is_not_for_it() -> None:
    # A zombie attempt's marker, behind the ledger: its ranges end at 5, the batch starts at 7.
    m = Marker.from_record(RECORD)
    assert not m.is_for(BatchRanges((OffsetRange("orders", 0, 7, 9),)), None, None)
