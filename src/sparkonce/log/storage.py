"""The embedded durable log: topics of N partitions, stored in SQLite (WAL mode).

Layout: one SQLite database per topic, ``<root>/<topic>.db``. Each record has a
partition, an offset (dense, from 0, per partition), a key, a value (bytes), a
timestamp (UTC, epoch microseconds) and a record id. An append is durable when
it returns: the transaction commits with ``synchronous=FULL``.

Guarantee: appends through :class:`~sparkonce.log.producer.IdempotentProducer`
are **exactly-once delivery** into the log (a retried append is a no-op, by
producer id plus per-partition sequence number). Reading a range always returns
the same records, so the log is a **replayable input** (DESIGN.md section 3c).
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparkonce.errors import ConfigError, SequenceError, SourceError, TopicNotFoundError

_TOPIC_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS topic_meta (
    name TEXT PRIMARY KEY,
    partitions INTEGER NOT NULL,
    created_at_us INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS records (
    partition INTEGER NOT NULL,
    offset INTEGER NOT NULL,
    key BLOB,
    value BLOB,
    timestamp_us INTEGER NOT NULL,
    record_id TEXT NOT NULL,
    PRIMARY KEY (partition, offset)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS producer_state (
    producer_id TEXT NOT NULL,
    partition INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    last_offset INTEGER NOT NULL,
    PRIMARY KEY (producer_id, partition)
) WITHOUT ROWID;
"""


@dataclass(frozen=True)
class Record:
    """One record of the log, as stored."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_us: int
    record_id: str


@dataclass(frozen=True)
class NewRecord:
    """A record to append. ``record_id`` defaults to ``<producer>-<partition>-<seq>``."""

    value: bytes | None
    key: bytes | None = None
    record_id: str | None = None
    timestamp_us: int | None = None


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed. ``duplicate`` is True when it was a retried no-op."""

    partition: int
    first_offset: int | None  # None for a duplicate: the original append's offsets
    count: int
    duplicate: bool


def validate_topic_name(name: str) -> str:
    if not isinstance(name, str) or not _TOPIC_RE.fullmatch(name):
        raise ConfigError(
            f"topic name {name!r} is invalid: use 1-200 characters from letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return name


def _connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, timeout=60.0, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # the first read of the file
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=60000")
    except BaseException:
        conn.close()
        raise
    return conn


def _unreadable(exc: sqlite3.DatabaseError) -> bool:
    """True when the file itself is the problem: not SQLite, corrupt, or not openable."""
    return getattr(exc, "sqlite_errorcode", None) in (
        sqlite3.SQLITE_NOTADB,
        sqlite3.SQLITE_CORRUPT,
        sqlite3.SQLITE_CANTOPEN,
    )


def _not_a_topic(path: Path, exc: sqlite3.DatabaseError) -> str:
    """Why ``path`` is no topic, for an error on its first read."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        what = "is not a SQLite database"
    elif code == sqlite3.SQLITE_CANTOPEN:
        what = "cannot be opened"
    else:
        what = "has no topic tables"
    return (
        f"{str(path)!r} {what} ({exc}), so it is not a sparkonce log topic; move it out of "
        "the log directory or recreate the topic"
    )


class Topic:
    """An open topic of the embedded log. Not thread-safe; open one per thread."""

    def __init__(self, root: Path, name: str) -> None:
        self.root = Path(root)
        self.name = validate_topic_name(name)
        self.path = self.root / f"{name}.db"
        if not self.path.exists():
            raise TopicNotFoundError(
                f"topic {name!r} does not exist in log {str(self.root)!r}. Create it with: "
                f"sparkonce log create {self.root} {name} --partitions N"
            )
        try:
            self._conn = _connect(self.path)
        except sqlite3.DatabaseError as exc:
            if not _unreadable(exc):
                raise  # e.g. a locked database: not a property of the file
            raise SourceError(_not_a_topic(self.path, exc)) from exc
        try:
            row = self._conn.execute(
                "SELECT partitions FROM topic_meta WHERE name = ?", (name,)
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            self._conn.close()
            raise SourceError(_not_a_topic(self.path, exc)) from exc
        if row is None:
            self._conn.close()
            raise SourceError(f"{self.path} is not a sparkonce log topic (no topic_meta row)")
        self.partitions: int = int(row[0])

    # -- lifecycle -------------------------------------------------------
    @classmethod
    def create(
        cls, root: Path | str, name: str, partitions: int, *, exist_ok: bool = False
    ) -> Topic:
        """Create a topic with ``partitions`` partitions under directory ``root``."""
        validate_topic_name(name)
        if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
            raise ConfigError(
                f"topic {name!r}: partitions must be an integer >= 1, got {partitions!r}"
            )
        root = Path(root)
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{name}.db"
        try:
            conn = _connect(path)
        except sqlite3.DatabaseError as exc:
            if not _unreadable(exc):
                raise
            raise ConfigError(_not_a_topic(path, exc)) from exc
        with closing(conn):
            conn.executescript(_SCHEMA)
            conn.execute("BEGIN IMMEDIATE")
            row = conn.execute(
                "SELECT partitions FROM topic_meta WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                conn.execute(
                    "INSERT INTO topic_meta(name, partitions, created_at_us) VALUES (?, ?, ?)",
                    (name, partitions, _now_us()),
                )
                conn.execute("COMMIT")
            else:
                conn.execute("ROLLBACK")
                if not exist_ok:
                    raise ConfigError(
                        f"topic {name!r} already exists in {str(root)!r} with {row[0]} partitions"
                    )
                if int(row[0]) != partitions:
                    raise ConfigError(
                        f"topic {name!r} exists with {row[0]} partitions, not {partitions}"
                    )
        return cls(root, name)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Topic:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Topic(root={str(self.root)!r}, name={self.name!r}, partitions={self.partitions})"

    # -- reads -----------------------------------------------------------
    def end_offsets(self) -> dict[int, int]:
        """The next offset to be written, per partition (the log's high-water marks)."""
        # One MAX per partition: SQLite answers each from the primary key's last entry,
        # where a GROUP BY would scan every record (0.7 s at 5 million records).
        ends = {}
        for p in range(self.partitions):
            row = self._conn.execute(
                "SELECT MAX(offset) FROM records WHERE partition = ?", (p,)
            ).fetchone()
            ends[p] = 0 if row is None or row[0] is None else int(row[0]) + 1
        return ends

    def read(self, partition: int, start: int, end: int) -> list[Record]:
        """Records ``start <= offset < end`` of ``partition``; raises if any is missing."""
        return [Record(*r) for r in self._read_rows(partition, start, end)]

    def read_columns(self, partition: int, start: int, end: int) -> dict[str, list[object]]:
        """Like :meth:`read`, as columns (the Spark source's fast path: no Record objects)."""
        rows = self._read_rows(partition, start, end)
        names = ("partition", "offset", "key", "value", "timestamp_us", "record_id")
        if not rows:
            return {n: [] for n in names}
        return {n: list(col) for n, col in zip(names, zip(*rows, strict=True), strict=True)}

    def _read_rows(self, partition: int, start: int, end: int) -> list[Any]:
        self._check_partition(partition)
        rows = self._conn.execute(
            "SELECT partition, offset, key, value, timestamp_us, record_id FROM records "
            "WHERE partition = ? AND offset >= ? AND offset < ? ORDER BY offset",
            (partition, start, end),
        ).fetchall()
        if len(rows) != end - start:
            raise SourceError(
                f"topic {self.name!r} partition {partition}: asked for offsets {start}..{end} "
                f"but only {len(rows)} exist; the batch was planned past the log's end"
            )
        return rows

    def tail(self, partition: int | None = None, limit: int = 10) -> Iterator[Record]:
        """The last ``limit`` records of one or every partition, oldest first.

        ``limit=0`` gives no records (like ``tail -n 0``); a negative limit is refused.
        """
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ConfigError(f"tail: the number of records must be an integer >= 0, got {limit!r}")
        parts = [partition] if partition is not None else list(range(self.partitions))
        for p in parts:
            self._check_partition(p)
            rows = self._conn.execute(
                "SELECT partition, offset, key, value, timestamp_us, record_id FROM records "
                "WHERE partition = ? ORDER BY offset DESC LIMIT ?",
                (p, limit),
            ).fetchall()
            yield from (Record(*r) for r in reversed(rows))

    def producer_sequences(self) -> dict[tuple[str, int], int]:
        """Last acknowledged sequence number per (producer id, partition)."""
        return {
            (str(pid), int(p)): int(seq)
            for pid, p, seq in self._conn.execute(
                "SELECT producer_id, partition, last_seq FROM producer_state"
            )
        }

    # -- writes ----------------------------------------------------------
    def append(
        self, partition: int, records: Sequence[NewRecord], *, producer_id: str, first_seq: int
    ) -> AppendResult:
        """Append ``records`` atomically, with sequence numbers ``first_seq...``.

        Idempotent: if this producer already appended ``first_seq`` on this
        partition, nothing is written and the original offsets are returned with
        ``duplicate=True``. A ``first_seq`` that skips ahead raises
        :class:`SequenceError`. Durable when it returns.
        """
        self._check_partition(partition)
        if not records:
            raise ConfigError("append needs at least one record")
        if first_seq < 0:
            raise ConfigError(f"first_seq must be >= 0, got {first_seq}")
        conn = self._conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            state = conn.execute(
                "SELECT last_seq, last_offset FROM producer_state "
                "WHERE producer_id = ? AND partition = ?",
                (producer_id, partition),
            ).fetchone()
            last_seq = int(state[0]) if state else -1
            if first_seq <= last_seq:
                if first_seq + len(records) - 1 > last_seq:
                    raise SequenceError(
                        f"producer {producer_id!r} on {self.name}[{partition}]: sequences "
                        f"{first_seq}..{first_seq + len(records) - 1} overlap the last "
                        f"acknowledged {last_seq} only in part; resend the acknowledged "
                        f"batch unchanged, or start the next one at {last_seq + 1}"
                    )
                conn.execute("ROLLBACK")
                # A retry of an acknowledged batch: a no-op.
                return AppendResult(partition, None, len(records), duplicate=True)
            if first_seq != last_seq + 1:
                raise SequenceError(
                    f"producer {producer_id!r} on {self.name}[{partition}]: sequence "
                    f"{first_seq} skips ahead of the last acknowledged {last_seq}; "
                    f"resend from sequence {last_seq + 1}"
                )
            top = conn.execute(
                "SELECT MAX(offset) FROM records WHERE partition = ?", (partition,)
            ).fetchone()[0]
            first_offset = 0 if top is None else int(top) + 1
            now = _now_us()
            rows = []
            for i, rec in enumerate(records):
                rid = rec.record_id or f"{producer_id}-{partition}-{first_seq + i}"
                ts = rec.timestamp_us if rec.timestamp_us is not None else now
                rows.append((partition, first_offset + i, rec.key, rec.value, ts, rid))
            conn.executemany(
                "INSERT INTO records(partition, offset, key, value, timestamp_us, record_id) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                rows,
            )
            last = first_seq + len(records) - 1
            conn.execute(
                "INSERT INTO producer_state(producer_id, partition, last_seq, last_offset) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(producer_id, partition) DO UPDATE SET "
                "last_seq = excluded.last_seq, last_offset = excluded.last_offset",
                (producer_id, partition, last, first_offset + len(records) - 1),
            )
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return AppendResult(partition, first_offset, len(records), duplicate=False)

    def _check_partition(self, partition: int) -> None:
        if not 0 <= partition < self.partitions:
            raise ConfigError(
                f"topic {self.name!r} has partitions 0..{self.partitions - 1}; got {partition}"
            )


def list_topics(root: Path | str) -> list[str]:
    """Names of the topics under ``root`` (sorted)."""
    root = Path(root)
    if not root.is_dir():
        raise SourceError(f"log directory {str(root)!r} does not exist")
    return sorted(p.stem for p in root.glob("*.db"))


def _now_us() -> int:
    return time.time_ns() // 1000
