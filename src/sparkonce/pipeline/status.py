"""What ``sparkonce status`` (and ``sparkonce ui``) shows: owner epoch, committed offsets,
lag, rows committed; and how both open a store from its URL."""

from __future__ import annotations

import logging
import os
import re
import socket
from dataclasses import dataclass
from datetime import datetime

from sparkonce.errors import SparkOnceError
from sparkonce.ledger.base import LedgerEntry, LedgerReader, Owner
from sparkonce.offsets import TopicPartition, check_chain

log = logging.getLogger(__name__)

RECENT_COMMITS = 50

# An owner's holder, as the ledgers write it: "HOST pid PID" (SQL, Delta, Iceberg) or
# "HOST:PID" (Kafka).
_HOLDER = re.compile(r"^(?P<host>.+?)(?: pid |:)(?P<pid>\d+)$")


def holder_alive(holder: str) -> bool | None:
    """Whether the run named by an owner's ``holder`` still runs: True or False when it ran
    on this host (its pid exists or not), None when that cannot be checked from here (another
    host, or a holder in no known form).

    A pid the system has since given to another process reads as alive: the safe side for
    ``sparkonce reset``, which refuses while the holder is alive.
    """
    m = _HOLDER.match(holder.strip())
    if m is None or m.group("host") != socket.gethostname():
        return None
    try:
        os.kill(int(m.group("pid")), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


@dataclass(frozen=True)
class PartitionStatus:
    topic: str
    partition: int
    committed: int  # the ledger's end offset: the next record to process
    latest: int | None  # the source's end offset, None if the source could not be opened

    @property
    def lag(self) -> int | None:
        return None if self.latest is None else max(0, self.latest - self.committed)


@dataclass(frozen=True)
class PipelineStatus:
    pipeline: str
    sink: str
    owner: Owner | None
    batches: int
    rows_committed: int
    last_commit_at: datetime | None
    partitions: tuple[PartitionStatus, ...]
    ledger_problems: tuple[str, ...]
    source_note: str = ""
    # The source the owner's run read, as its describe() says (several: each by name).
    source: str = ""
    # The recorded commit times of the newest RECENT_COMMITS entries, oldest first (entries
    # written by a sparkonce that did not record them are left out).
    commit_seconds: tuple[float, ...] = ()

    @property
    def total_lag(self) -> int | None:
        lags = [p.lag for p in self.partitions]
        return None if any(x is None for x in lags) else sum(x or 0 for x in lags)


def pipeline_status(
    sink: LedgerReader, pipeline: str, entries: list[LedgerEntry] | None = None
) -> PipelineStatus:
    """Read the owner and ledger of ``pipeline`` from ``sink`` (and the source's end, if known).

    ``entries``: the ledger, if the caller has just read it (``sink.ledger(pipeline)``).
    """
    from sparkonce.sources import source_from_uri

    owner = sink.owner(pipeline)
    if entries is None:
        entries = sink.ledger(pipeline)
    committed: dict[TopicPartition, int] = entries[-1].end_offsets if entries else {}
    latest: dict[TopicPartition, int] | None = None
    note = ""
    described = ""
    if owner is not None and owner.source:
        try:
            source = source_from_uri(owner.source)
            described = source.describe()
            latest = source.latest_offsets()
        except SparkOnceError as exc:
            note = f"source {described or owner.source} could not be read for lag: {exc}"
    tps = sorted(set(committed) | set(latest or {}))
    parts = tuple(
        PartitionStatus(
            t, p, committed.get((t, p), 0), None if latest is None else latest.get((t, p), 0)
        )
        for t, p in tps
    )
    return PipelineStatus(
        pipeline=pipeline,
        sink=sink.describe(),
        owner=owner,
        batches=len(entries),
        rows_committed=sum(e.row_count for e in entries),
        last_commit_at=entries[-1].committed_at if entries else None,
        partitions=parts,
        ledger_problems=tuple(check_chain(e.ranges for e in entries)),
        source_note=note,
        source=described,
        commit_seconds=tuple(
            e.commit_seconds for e in entries[-RECENT_COMMITS:] if e.commit_seconds is not None
        ),
    )


def open_status_sink(url: str) -> tuple[LedgerReader, str]:
    """The ledger ``status`` (and the ui) reads, opened from the store's URL, and how to
    name it: the URL the user gave (password masked). Only the ledger is read, from the
    ledger store itself (:func:`sparkonce.sinks.registry.open_ledger`); no output table
    is named or touched.

    ``delta:///ROOT/TABLE`` (or ``delta:URI``) names a Delta table's directory, whose
    ledger lives inside it; reading it starts a local Spark session with Delta when the
    process has none. Raises :class:`ConfigError` for a bad URL, a missing SQLite file,
    Kafka output topic or Delta table, and
    :class:`~sparkonce.errors.StoreUnavailableError` for a store that does not answer.
    """
    from sparkonce.sinks.registry import open_ledger

    ledger = open_ledger(url)
    return ledger, ledger.label
