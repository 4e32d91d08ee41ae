"""Tests of sparkonce.log.storage: topics, dense offsets, idempotent appends, durability."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from sparkonce.errors import ConfigError, SequenceError, SourceError, TopicNotFoundError
from sparkonce.log import NewRecord, Topic, list_topics


def _recs(*values: str) -> list[NewRecord]:
    return [NewRecord(v.encode()) for v in values]


def _count(topic: Topic) -> int:
    return sum(topic.end_offsets().values())


# -- lifecycle -------------------------------------------------------------------------


def test_create_and_reopen(log_root: Path) -> None:
    with Topic.create(log_root, "orders", 3) as t:
        assert t.partitions == 3
        assert t.name == "orders"
        assert t.end_offsets() == {0: 0, 1: 0, 2: 0}
        t.append(1, _recs("a"), producer_id="p", first_seq=0)
    assert (log_root / "orders.db").exists()
    with Topic(log_root, "orders") as t:
        assert t.partitions == 3
        assert t.end_offsets() == {0: 0, 1: 1, 2: 0}
        assert "partitions=3" in repr(t)
    assert list_topics(log_root) == ["orders"]


def test_create_existing_topic(log_root: Path) -> None:
    Topic.create(log_root, "t", 2).close()
    with pytest.raises(ConfigError, match=r"already exists.*2 partitions"):
        Topic.create(log_root, "t", 2)
    with Topic.create(log_root, "t", 2, exist_ok=True) as t:
        assert t.partitions == 2
    with pytest.raises(ConfigError, match="exists with 2 partitions, not 4"):
        Topic.create(log_root, "t", 4, exist_ok=True)
    with Topic(log_root, "t") as t:
        assert t.partitions == 2  # unchanged by the refused creates


def test_create_keeps_existing_records(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(0, _recs("a", "b"), producer_id="p", first_seq=0)
    with Topic.create(log_root, "t", 1, exist_ok=True) as t:
        assert [r.value for r in t.read(0, 0, 2)] == [b"a", b"b"]


@pytest.mark.parametrize("name", ["", "-x", ".hidden", "a/b", "a b", "x" * 201, "t\x00"])
def test_invalid_topic_names(log_root: Path, name: str) -> None:
    with pytest.raises(ConfigError, match=r"topic name .* is invalid"):
        Topic.create(log_root, name, 1)
    with pytest.raises(ConfigError, match=r"topic name .* is invalid"):
        Topic(log_root, name)
    assert not log_root.exists() or list(log_root.iterdir()) == []


def test_topic_name_with_trailing_newline_is_invalid(log_root: Path) -> None:
    with pytest.raises(ConfigError):
        Topic.create(log_root, "t\n", 1)


@pytest.mark.parametrize("partitions", [0, -1, True, 1.5, "3", None])
def test_invalid_partition_counts(log_root: Path, partitions: object) -> None:
    with pytest.raises(ConfigError, match="partitions must be an integer >= 1"):
        Topic.create(log_root, "t", partitions)  # type: ignore[arg-type]
    assert not (log_root / "t.db").exists()


def test_missing_topic_names_the_create_command(log_root: Path) -> None:
    log_root.mkdir()
    with pytest.raises(TopicNotFoundError) as info:
        Topic(log_root, "nope")
    assert isinstance(info.value, SourceError) and isinstance(info.value, LookupError)
    assert f"sparkonce log create {log_root} nope --partitions N" in str(info.value)


def test_list_topics(log_root: Path, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="does not exist"):
        list_topics(tmp_path / "missing")
    for name in ("b", "a"):
        Topic.create(log_root, name, 1).close()
    assert list_topics(log_root) == ["a", "b"]


def test_opening_a_non_topic_database_raises_source_error(log_root: Path) -> None:
    log_root.mkdir()
    (log_root / "stray.db").touch()
    with pytest.raises(SourceError, match="not a sparkonce log topic"):
        Topic(log_root, "stray")


def test_a_file_that_is_not_sqlite_is_named_not_opened_as_a_topic(log_root: Path) -> None:
    log_root.mkdir()
    garbage = b"not a database at all, just text\n" * 128
    (log_root / "junk.db").write_bytes(garbage)
    path = str(log_root / "junk.db")
    with pytest.raises(SourceError, match="is not a SQLite database") as info:
        Topic(log_root, "junk")
    assert path in str(info.value) and "not a sparkonce log topic" in str(info.value)
    with pytest.raises(ConfigError, match="is not a SQLite database"):
        Topic.create(log_root, "junk", 1, exist_ok=True)
    assert (log_root / "junk.db").read_bytes() == garbage  # left as it was


def test_tail_of_zero_records_is_empty_and_negative_is_refused(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(0, _recs("a", "b", "c"), producer_id="p", first_seq=0)
        assert list(t.tail(0, 0)) == []
        assert [r.value for r in t.tail(0, 2)] == [b"b", b"c"]
        with pytest.raises(ConfigError, match="integer >= 0, got -1"):
            list(t.tail(0, -1))


# -- append and read ---------------------------------------------------------------------


def test_append_gives_dense_offsets_per_partition(log_root: Path) -> None:
    with Topic.create(log_root, "t", 2) as t:
        r1 = t.append(0, _recs("a", "b", "c"), producer_id="p", first_seq=0)
        r2 = t.append(1, _recs("x"), producer_id="p", first_seq=0)
        r3 = t.append(0, _recs("d", "e"), producer_id="q", first_seq=0)
        assert (r1.partition, r1.first_offset, r1.count, r1.duplicate) == (0, 0, 3, False)
        assert (r2.partition, r2.first_offset, r2.count) == (1, 0, 1)
        assert (r3.first_offset, r3.count) == (3, 2)
        assert t.end_offsets() == {0: 5, 1: 1}
        recs = t.read(0, 0, 5)
        assert [r.offset for r in recs] == [0, 1, 2, 3, 4]
        assert [r.value for r in recs] == [b"a", b"b", b"c", b"d", b"e"]
        assert {r.partition for r in recs} == {0}
        assert [r.record_id for r in recs[:3]] == ["p-0-0", "p-0-1", "p-0-2"]
        assert recs[3].record_id == "q-0-0"


def test_append_keeps_key_id_and_timestamp(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(
            0,
            [NewRecord(b"v", key=b"k", record_id="rid-1", timestamp_us=123), NewRecord(None)],
            producer_id="p",
            first_seq=0,
        )
        a, b = t.read(0, 0, 2)
        assert (a.key, a.value, a.record_id, a.timestamp_us) == (b"k", b"v", "rid-1", 123)
        assert (b.key, b.value) == (None, None)
        assert b.timestamp_us > 1_600_000_000_000_000  # defaults to now, in microseconds


def test_read_returns_exactly_the_range(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(0, _recs(*(str(i) for i in range(10))), producer_id="p", first_seq=0)
        assert [r.offset for r in t.read(0, 3, 7)] == [3, 4, 5, 6]
        assert t.read(0, 4, 4) == []
        assert [r.offset for r in t.read(0, 9, 10)] == [9]
        cols = t.read_columns(0, 2, 4)
        assert cols["offset"] == [2, 3] and cols["value"] == [b"2", b"3"]
        assert [r.offset for r in t.tail(0, limit=3)] == [7, 8, 9]


@pytest.mark.parametrize(("start", "end"), [(8, 11), (10, 11), (12, 15)])
def test_read_past_the_end_raises(log_root: Path, start: int, end: int) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(0, _recs(*(str(i) for i in range(10))), producer_id="p", first_seq=0)
        with pytest.raises(SourceError, match=f"offsets {start}..{end}.*past the log's end"):
            t.read(0, start, end)


def test_bad_partition_and_empty_append(log_root: Path) -> None:
    with Topic.create(log_root, "t", 2) as t:
        with pytest.raises(ConfigError, match=r"partitions 0..1; got 2"):
            t.read(2, 0, 0)
        with pytest.raises(ConfigError, match="got -1"):
            t.append(-1, _recs("a"), producer_id="p", first_seq=0)
        with pytest.raises(ConfigError, match="at least one record"):
            t.append(0, [], producer_id="p", first_seq=0)
        with pytest.raises(ConfigError, match="first_seq must be >= 0"):
            t.append(0, _recs("a"), producer_id="p", first_seq=-1)
        assert _count(t) == 0


# -- idempotence -------------------------------------------------------------------------


def test_retried_append_is_a_no_op(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(0, _recs("a", "b"), producer_id="p", first_seq=0)
        again = t.append(0, _recs("a", "b"), producer_id="p", first_seq=0)
        assert again.duplicate is True
        assert again.first_offset is None
        assert _count(t) == 2
        t.append(0, _recs("c"), producer_id="p", first_seq=2)
        assert t.append(0, _recs("a", "b"), producer_id="p", first_seq=0).duplicate
        assert t.append(0, _recs("c"), producer_id="p", first_seq=2).duplicate
        assert [r.value for r in t.read(0, 0, 3)] == [b"a", b"b", b"c"]
        assert t.producer_sequences() == {("p", 0): 2}


def test_sequences_are_per_producer_and_partition(log_root: Path) -> None:
    with Topic.create(log_root, "t", 2) as t:
        t.append(0, _recs("a"), producer_id="p", first_seq=0)
        assert not t.append(1, _recs("b"), producer_id="p", first_seq=0).duplicate
        assert not t.append(0, _recs("c"), producer_id="q", first_seq=0).duplicate
        assert t.end_offsets() == {0: 2, 1: 1}
        assert t.producer_sequences() == {("p", 0): 0, ("p", 1): 0, ("q", 0): 0}


def test_skipping_sequence_raises_and_writes_nothing(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        with pytest.raises(SequenceError, match=r"skips ahead.*resend from sequence 0"):
            t.append(0, _recs("a"), producer_id="p", first_seq=1)
        assert _count(t) == 0
        t.append(0, _recs("a", "b"), producer_id="p", first_seq=0)
        with pytest.raises(SequenceError, match=r"sequence 3 skips ahead .* last acknowledged 1"):
            t.append(0, _recs("d"), producer_id="p", first_seq=3)
        assert _count(t) == 2
        assert t.producer_sequences() == {("p", 0): 1}
        # the connection is usable again after the refused append
        assert t.append(0, _recs("c"), producer_id="p", first_seq=2).first_offset == 2


def test_partially_overlapping_retry_raises(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        t.append(0, _recs("a", "b"), producer_id="p", first_seq=0)
        with pytest.raises(SequenceError, match="overlap the last acknowledged 1 only in part"):
            t.append(0, _recs("b", "c", "d"), producer_id="p", first_seq=1)
        assert _count(t) == 2
        assert t.producer_sequences() == {("p", 0): 1}


# -- durability ----------------------------------------------------------------------------

_DURABLE_CHILD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sparkonce.log import NewRecord, Topic
    root, n = Path(sys.argv[1]), int(sys.argv[2])
    t = Topic(root, "dur")
    for seq in range(n):
        t.append(seq % 3, [NewRecord(f"v{seq}".encode())], producer_id="child", first_seq=seq // 3)
    print("acked", flush=True)
    time.sleep(120)
    """
)


def test_acknowledged_appends_survive_sigkill(log_root: Path) -> None:
    Topic.create(log_root, "dur", 3).close()
    n = 60
    proc = subprocess.Popen(
        [sys.executable, "-c", _DURABLE_CHILD, str(log_root), str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line == "acked\n", proc.stderr.read() if proc.stderr else ""
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    with Topic(log_root, "dur") as t:
        ends = t.end_offsets()
        assert ends == {0: 20, 1: 20, 2: 20}
        values = [r.value for p, e in ends.items() for r in t.read(p, 0, e)]
        assert Counter(values) == Counter(f"v{i}".encode() for i in range(n))
        assert t.producer_sequences() == {("child", 0): 19, ("child", 1): 19, ("child", 2): 19}
