"""Tests of sparkonce.log.producer: sequences, restarts, partitioning, concurrency."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkonce.errors import ConfigError
from sparkonce.log import IdempotentProducer, Record, Topic, partition_for_key


def _value(r: Record) -> bytes:
    """A record's value: every record these tests write has one."""
    assert r.value is not None, r
    return r.value


def _all_records(t: Topic) -> list[Record]:
    return [r for p, e in t.end_offsets().items() for r in t.read(p, 0, e)]


def _assert_dense(t: Topic) -> None:
    for p, e in t.end_offsets().items():
        assert [r.offset for r in t.read(p, 0, e)] == list(range(e))


def test_flush_appends_with_consecutive_sequences(log_root: Path) -> None:
    with Topic.create(log_root, "t", 2) as t:
        prod = IdempotentProducer(t, "p")
        for i in range(5):
            prod.send(f"v{i}".encode(), partition=i % 2)
        assert t.end_offsets() == {0: 0, 1: 0}  # buffered, not yet appended
        results = prod.flush()
        assert sorted((r.partition, r.first_offset, r.count) for r in results) == [
            (0, 0, 3),
            (1, 0, 2),
        ]
        assert prod.flush() == []
        prod.send(b"v5", partition=0)
        prod.close()
        assert t.producer_sequences() == {("p", 0): 3, ("p", 1): 1}
        assert [r.record_id for r in t.read(0, 0, 4)] == ["p-0-0", "p-0-1", "p-0-2", "p-0-3"]
        assert prod.sent == 6


def test_batch_size_triggers_flush(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        prod = IdempotentProducer(t, "p", batch_size=3)
        for i in range(7):
            prod.send(str(i).encode())
        assert t.end_offsets() == {0: 6}
        prod.flush()
        assert t.end_offsets() == {0: 7}


def test_restarted_producer_continues_its_sequence(log_root: Path) -> None:
    with Topic.create(log_root, "t", 2) as t, IdempotentProducer(t, "p") as prod:
        for i in range(5):
            prod.send(str(i).encode(), partition=0)
        prod.send(b"x", partition=1)
    with Topic(log_root, "t") as t:
        prod = IdempotentProducer(t, "p")
        prod.send(b"5", partition=0)
        prod.send(b"y", partition=1)
        results = prod.flush()
        assert all(not r.duplicate for r in results)
        assert t.producer_sequences() == {("p", 0): 5, ("p", 1): 1}
        assert t.read(0, 5, 6)[0].record_id == "p-0-5"
        assert [r.value for r in t.read(0, 0, 6)] == [b"0", b"1", b"2", b"3", b"4", b"5"]
        # a different producer id starts its own sequence at 0
        other = IdempotentProducer(t, "q")
        other.send(b"z", partition=0)
        other.flush()
        assert t.producer_sequences()[("q", 0)] == 0
        assert t.end_offsets() == {0: 7, 1: 2}


def test_context_manager_does_not_flush_on_error(log_root: Path) -> None:
    with Topic.create(log_root, "t", 1) as t:
        with pytest.raises(RuntimeError), IdempotentProducer(t, "p") as prod:
            prod.send(b"a")
            raise RuntimeError("boom")
        assert t.end_offsets() == {0: 0}


def test_producer_config_errors(log_root: Path) -> None:
    with Topic.create(log_root, "t", 2) as t:
        with pytest.raises(ConfigError, match="producer_id"):
            IdempotentProducer(t, "")
        with pytest.raises(ConfigError, match="batch_size must be >= 1"):
            IdempotentProducer(t, "p", batch_size=0)
        prod = IdempotentProducer(t, "p")
        with pytest.raises(ConfigError, match=r"partition 2 is out of range .*\(0..1\)"):
            prod.send(b"a", partition=2)
        assert prod.flush() == []


# -- partitioning ---------------------------------------------------------------------------


def test_partition_for_key_is_crc32() -> None:
    assert partition_for_key(b"a", 4) == 3  # crc32(b"a") == 0xE8B7BE43
    assert partition_for_key(b"", 7) == 0
    assert partition_for_key(b"order-17", 5) == zlib.crc32(b"order-17") % 5


@settings(max_examples=100, deadline=None)
@given(st.binary(max_size=32), st.integers(1, 64))
def test_partition_for_key_is_deterministic_and_in_range(key: bytes, n: int) -> None:
    p = partition_for_key(key, n)
    assert 0 <= p < n
    assert p == partition_for_key(bytes(key), n)


def test_keyed_records_land_in_the_key_partition(log_root: Path) -> None:
    keys = [f"k{i % 13}".encode() for i in range(100)]
    with Topic.create(log_root, "t", 4) as t:
        with IdempotentProducer(t, "p", batch_size=17) as prod:
            prod.send_many((k, b"v" + k) for k in keys)
        recs = _all_records(t)
        assert len(recs) == 100
        for r in recs:
            assert r.key is not None
            assert r.partition == partition_for_key(r.key, 4)
            assert r.value == b"v" + r.key


def test_unkeyed_records_go_round_robin(log_root: Path) -> None:
    with Topic.create(log_root, "t", 3) as t:
        prod = IdempotentProducer(t, "p")
        assert [prod.send(b"x") for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
        prod.flush()
        assert t.end_offsets() == {0: 3, 1: 2, 2: 2}


# -- concurrency -----------------------------------------------------------------------------


def test_two_concurrent_producers_land_every_record_once(log_root: Path) -> None:
    Topic.create(log_root, "t", 3).close()
    n = 400
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def produce(pid: str) -> None:
        try:
            with Topic(log_root, "t") as t:
                start.wait()
                with IdempotentProducer(t, pid, batch_size=7) as prod:
                    for i in range(n):
                        prod.send(f"{pid}:{i}".encode())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=produce, args=(pid,)) for pid in ("p1", "p2")]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    with Topic(log_root, "t") as t:
        _assert_dense(t)
        recs = _all_records(t)
        values = [r.value for r in recs]
        assert len(values) == 2 * n == len(set(values))
        assert set(values) == {f"{pid}:{i}".encode() for pid in ("p1", "p2") for i in range(n)}
        assert len({r.record_id for r in recs}) == 2 * n
        # each producer's records keep their order within a partition
        for pid in ("p1", "p2"):
            for p in range(3):
                mine = [int(_value(r).split(b":")[1]) for r in recs if r.partition == p and
                        _value(r).startswith(pid.encode())]  # fmt: skip
                assert mine == sorted(mine)


_PRODUCER_CHILD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sparkonce.log import IdempotentProducer, Topic
    root, pid, n = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    with Topic(root, "t") as t, IdempotentProducer(t, pid, batch_size=5) as prod:
        for i in range(n):
            prod.send(f"{pid}:{i}".encode(), key=str(i).encode())
    print("done", flush=True)
    """
)


def test_two_producer_processes_land_every_record_once(log_root: Path) -> None:
    Topic.create(log_root, "t", 2).close()
    n = 150
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PRODUCER_CHILD, str(log_root), pid, str(n)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in ("a", "b")
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert out == "done\n"
    with Topic(log_root, "t") as t:
        _assert_dense(t)
        values = [_value(r) for r in _all_records(t)]
        assert sorted(values) == sorted(f"{pid}:{i}".encode() for pid in "ab" for i in range(n))


_KILLED_PRODUCER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from sparkonce.log import IdempotentProducer, Topic
    root = Path(sys.argv[1])
    t = Topic(root, "t")
    prod = IdempotentProducer(t, "restartable", batch_size=10)
    for i in range(25):
        prod.send(str(i).encode(), partition=0)
    prod.flush()
    print("acked", flush=True)
    time.sleep(120)
    """
)


def test_producer_killed_after_ack_restarts_without_duplicates(log_root: Path) -> None:
    Topic.create(log_root, "t", 1).close()
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_PRODUCER, str(log_root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "acked\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    with Topic(log_root, "t") as t:
        assert t.end_offsets() == {0: 25}
        prod = IdempotentProducer(t, "restartable")
        prod.send(b"25", partition=0)
        prod.flush()
        assert [int(_value(r)) for r in t.read(0, 0, 26)] == list(range(26))
        assert t.producer_sequences() == {("restartable", 0): 25}
