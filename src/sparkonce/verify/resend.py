"""The producer of a ``resend`` trial: killed, restarted, and re-sending under the same ids.

``python -m sparkonce.verify.resend PIPELINE_FILE --to URI --progress FILE --every M
--producer-id ID [--pause-after K]``

A ``resend`` trial of ``sparkonce verify`` (:mod:`.campaign`) plays a producer that
crashes and re-sends, the fault an idempotent producer cannot absorb (DESIGN.md
section 3b): its protection ends with its session, so records sent again by a new
session are new records to the log. The campaign makes a fresh **trial source** of the
pipeline's kind (:func:`trial_source`: a new log directory with the same topic name and
partition count, or a new Kafka topic with the same partition count), then runs this
module as a real process in its own process group (a
:class:`~sparkonce.verify.driver.Driver`). It copies every record of the pipeline file's
source into the trial source, partition after partition in log order, keeping
partition, key, value, timestamp and record id (a Kafka record without the
``sparkonce-record-id`` header is copied without one), with sparkonce's own producers:
:class:`~sparkonce.log.IdempotentProducer` for the embedded log, under ``--producer-id``,
and :class:`~sparkonce.kafka.KafkaProducer` for Kafka, a new idempotent session per
process.

Like a collector, it keeps its position in a **progress file**: the count of records
sent and acknowledged. Each record is acknowledged (durable in the log) before the next
is sent, and only every ``M`` records (``--every``) is that count written to the file
(a temporary file, fsync, rename). With ``--pause-after K`` the process stops itself
(SIGSTOP) right after the K-th acknowledgement, before any progress write that follows
it, and the campaign SIGKILLs it there. Started again with a new producer identity, it
reads the progress file and copies from there, so it re-sends the records acknowledged
after the last write, ``[persisted, acknowledged)``, under their ids: a window of 1 to
``M`` records that the trial source now holds twice. Nothing is lost: the restart sends
everything from a position at or before the last acknowledged record.

Each run records what it did in the events file of its driver (``SPARKONCE_FAULT_EVENTS``,
:mod:`sparkonce.faults`), never in log text only:

``resend-pause``
    ``acked`` records acknowledged (by every run so far), ``persisted`` the count in the
    progress file; written before the process stops itself.
``resend-done``
    ``resumed_from`` the progress the run started from, ``sent`` the records it sent,
    ``records`` the records of the source.

Exit status 0 when the copy is complete, 1 on an error (the reason on stderr), 2 for
bad arguments.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from sparkonce.errors import ConfigError, SparkOnceError, VerificationError
from sparkonce.sources.base import Source
from sparkonce.sources.embedded import URI_SCHEME as LOG_SCHEME
from sparkonce.sources.embedded import EmbeddedLogSource
from sparkonce.sources.kafka import URI_SCHEME as KAFKA_SCHEME
from sparkonce.sources.kafka import KafkaSource

ENTRY = ("sparkonce.verify.resend",)  # what follows ``python -m`` (see Driver)
PAUSE_EVENT = "resend-pause"
DONE_EVENT = "resend-done"
_MAX_TOPIC = 249  # Kafka's limit on a topic name's length


@dataclass(frozen=True)
class Record:
    """One record to copy, as the source holds it (``timestamp_us``: None if it has none)."""

    partition: int
    key: bytes | None
    value: bytes | None
    timestamp_us: int | None
    record_id: str | None


class Writer(Protocol):
    """Where a copy goes: :meth:`send` returns once the record is acknowledged."""

    def send(self, record: Record) -> None: ...

    def close(self) -> None: ...


# -- the sources it copies between ------------------------------------------------------------


def check_source(source: Source, pipeline: str) -> None:
    """Refuse a source the ``resend`` fault cannot copy (before any trial runs)."""
    if not isinstance(source, (EmbeddedLogSource, KafkaSource)):
        raise _unsupported(source, f"pipeline {pipeline!r}")


def _unsupported(source: Source, who: str = "the pipeline") -> ConfigError:
    return ConfigError(
        f"--faults resend: {who} reads {source.describe()}, but a resend trial copies the "
        "input into a fresh source of the same kind, which it can only do for an "
        "EmbeddedLogSource or a KafkaSource; leave resend out of --faults"
    )


def trial_topic(topic: str, workdir: Path, trial: int) -> str:
    """The Kafka topic of one resend trial: the original's name, the campaign's work
    directory (a digest, so that campaigns sharing a cluster never meet) and the trial."""
    digest = hashlib.sha256(str(Path(workdir).resolve()).encode()).hexdigest()[:10]
    tail = f".verify-{digest}-{trial}"
    return topic[: _MAX_TOPIC - len(tail)] + tail


def trial_source(source: Source, *, log_dir: Path, workdir: Path, trial: int) -> Source:
    """A fresh, empty source of ``source``'s kind with its partition count: topic
    ``source.topic`` of a new log in ``log_dir``, or the Kafka topic :func:`trial_topic`
    names (a leftover of a stopped campaign is deleted first). Every other option of
    ``source`` is kept."""
    if isinstance(source, EmbeddedLogSource):
        from sparkonce.log.storage import Topic

        with Topic(source.path, source.topic) as original:
            partitions = original.partitions
        Topic.create(log_dir, source.topic, partitions).close()
        return source.relocated(f"{LOG_SCHEME}://{Path(log_dir).resolve()}?topic={source.topic}")
    if isinstance(source, KafkaSource):
        conn = source.connection
        topic = trial_topic(source.topic, workdir, trial)
        partitions = conn.partitions(source.topic, timeout=source.timeout)
        conn.delete_topic(topic)
        if not conn.ensure_topic(topic, partitions):
            raise VerificationError(
                f"the resend trial topic {topic!r} at {conn.bootstrap} still exists after it "
                "was deleted; delete it by hand and run the trial again"
            )
        return source.relocated(f"{KAFKA_SCHEME}://{conn.bootstrap}/{topic}")
    raise _unsupported(source)


def drop_trial_source(source: Source) -> None:
    """Delete a Kafka trial topic. An embedded trial log lives in the trial's directory,
    which the campaign keeps (a failed trial) or removes with everything else in it."""
    if isinstance(source, KafkaSource):
        source.connection.delete_topic(source.topic)


def read_records(source: Source) -> Iterator[Record]:
    """Every record of ``source``, partition after partition, each in log order (a Kafka
    topic from its log start to its last stable offset, read_committed)."""
    if isinstance(source, EmbeddedLogSource):
        yield from _log_records(source)
    elif isinstance(source, KafkaSource):
        yield from _kafka_records(source)
    else:
        raise _unsupported(source)


def _log_records(source: EmbeddedLogSource, chunk: int = 10_000) -> Iterator[Record]:
    from sparkonce.log.storage import Topic

    with Topic(source.path, source.topic) as t:
        for p, end in sorted(t.end_offsets().items()):
            for lo in range(0, end, chunk):
                for r in t.read(p, lo, min(end, lo + chunk)):
                    yield Record(p, r.key, r.value, r.timestamp_us, r.record_id)


def _kafka_records(source: KafkaSource) -> Iterator[Record]:
    from sparkonce.kafka.consumer import KafkaReader
    from sparkonce.kafka.producer import RECORD_ID_HEADER, require_confluent_kafka
    from sparkonce.kafka.topic import partition_offsets

    ck = require_confluent_kafka()
    conn = source.connection
    with KafkaReader(conn, timeout=source.timeout) as reader:
        for po in partition_offsets(conn, source.topic, source.timeout):
            for m in reader.read(source.topic, po.partition, po.start, po.end):
                rid = next((v for k, v in m.headers() or [] if k == RECORD_ID_HEADER), None)
                kind, ms = m.timestamp()
                yield Record(
                    po.partition,
                    m.key(),
                    m.value(),
                    None if kind == ck.TIMESTAMP_NOT_AVAILABLE else ms * 1000,
                    None if rid is None else rid.decode("utf-8", "backslashreplace"),
                )


class LogWriter:
    """Appends to a topic of the embedded log, one durable append per record."""

    def __init__(self, source: EmbeddedLogSource, producer_id: str) -> None:
        from sparkonce.log.producer import IdempotentProducer
        from sparkonce.log.storage import Topic

        self.topic = Topic(source.path, source.topic)
        # batch_size=1: each send is appended (and acknowledged) before it returns.
        self.producer = IdempotentProducer(self.topic, producer_id, batch_size=1)

    def send(self, record: Record) -> None:
        self.producer.send(
            record.value,
            record.key,
            partition=record.partition,
            record_id=record.record_id,
            timestamp_us=record.timestamp_us,
        )

    def close(self) -> None:
        self.producer.close()
        self.topic.close()


class KafkaWriter:
    """Sends to a Kafka topic with a new idempotent producer session, waiting for each
    record's acknowledgement."""

    def __init__(self, source: KafkaSource) -> None:
        from sparkonce.kafka.producer import KafkaProducer

        self.producer = KafkaProducer(
            source.bootstrap_servers,
            source.topic,
            client_config=source.connection.config,
            timeout=source.timeout,
        )

    def send(self, record: Record) -> None:
        if record.value is None:
            raise ConfigError(
                f"a record of partition {record.partition} (record id {record.record_id!r}) "
                "has no value (a tombstone); KafkaProducer sends values only, so the resend "
                "fault cannot copy this topic"
            )
        self.producer.send(
            record.value,
            record.key,
            record_id=record.record_id,
            partition=record.partition,
            timestamp_ms=None if record.timestamp_us is None else record.timestamp_us // 1000,
        )
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()


def open_writer(source: Source, producer_id: str) -> Writer:
    if isinstance(source, EmbeddedLogSource):
        return LogWriter(source, producer_id)
    if isinstance(source, KafkaSource):
        return KafkaWriter(source)
    raise _unsupported(source)


# -- the copy -----------------------------------------------------------------------------------


class Progress:
    """The producer's persisted position: how many records it sent and had acknowledged.

    The file holds ``{"sent": N}``; none yet means 0. :meth:`write` replaces it atomically
    (a temporary file, fsync, rename, fsync of the directory), so a crash leaves the old
    count or the new one.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def read(self) -> int:
        try:
            doc = json.loads(self.path.read_text())
            count = doc["sent"]
        except FileNotFoundError:
            return 0
        except (ValueError, KeyError, TypeError) as exc:
            raise VerificationError(
                f"resend progress file {self.path} is unreadable: {exc}"
            ) from None
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise VerificationError(f"resend progress file {self.path} holds {count!r}")
        return count

    def write(self, count: int) -> None:
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write(json.dumps({"sent": count}))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@dataclass(frozen=True)
class CopyRun:
    """What one run of the copy did."""

    resumed_from: int  # the progress it started from
    sent: int  # records it sent (each acknowledged)
    records: int  # records of the source


def copy(
    records: Iterable[Record],
    writer: Writer,
    progress: Progress,
    *,
    every: int,
    pause_after: int | None = None,
    on_pause: Callable[[int, int], None] | None = None,
) -> CopyRun:
    """Copy ``records`` from the persisted position on (see the module docstring).

    Each record is acknowledged (``writer.send`` returned) before the next is sent; the
    count is persisted every ``every`` records and at the end. Right after the
    ``pause_after``-th acknowledgement (counted from the start of the source), before any
    progress write, ``on_pause(acknowledged, persisted)`` is called: in the real process
    it stops the process, which the campaign then kills.
    """
    if every < 1:
        raise ConfigError(f"the progress interval must be >= 1 record, got {every}")
    start = persisted = progress.read()
    position = sent = 0
    stop = on_pause if pause_after is not None else None
    for position, record in enumerate(records, 1):
        if position <= start:
            continue
        writer.send(record)
        sent += 1
        if stop is not None and pause_after is not None and position >= pause_after:
            pause, stop = stop, None  # once
            pause(position, persisted)
        if position % every == 0:
            progress.write(position)
            persisted = position
    if persisted != position:
        progress.write(position)
    return CopyRun(start, sent, position)


def _stop_here(events: Callable[..., None]) -> Callable[[int, int], None]:
    def pause(acked: int, persisted: int) -> None:
        events(PAUSE_EVENT, acked=acked, persisted=persisted)
        # This thread stops at once (a process-directed SIGSTOP may be taken by another).
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)

    return pause


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sparkonce.verify.resend",
        description="Copy the pipeline file's source into another location of its kind, "
        "keeping each record's id; persist progress every --every records.",
    )
    parser.add_argument("pipeline_file")
    parser.add_argument("--to", required=True, help="the trial source's URI")
    parser.add_argument("--progress", required=True, help="the progress file")
    parser.add_argument("--every", type=int, required=True, help="persist every N records")
    parser.add_argument("--producer-id", required=True, help="the embedded log's producer id")
    parser.add_argument("--pause-after", type=int, default=None, help="stop after N records")
    args = parser.parse_args(argv)

    from sparkonce.faults import FaultPlan
    from sparkonce.pipeline.loader import load_pipeline

    events = FaultPlan.from_env().record
    try:
        source = load_pipeline(args.pipeline_file).source
        target = source.relocated(args.to)
        writer = open_writer(target, args.producer_id)
        try:
            run = copy(
                read_records(source),
                writer,
                Progress(args.progress),
                every=args.every,
                pause_after=args.pause_after,
                on_pause=_stop_here(events),
            )
        finally:
            writer.close()
    except SparkOnceError as exc:
        print(f"resend producer: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    events(DONE_EVENT, resumed_from=run.resumed_from, sent=run.sent, records=run.records)
    print(
        f"resend producer {args.producer_id}: copied records {run.resumed_from}..{run.records} "
        f"of {source.describe()} into {target.describe()}"
    )
    return 0


def window(paused: Sequence[dict[str, Any]], done: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The resend part of a trial's record, from the killed run's ``resend-pause`` event and
    the restart's ``resend-done`` event: ``killed_after`` (records acknowledged when it was
    killed), ``resumed_from`` (the progress the restart read), ``resent`` (the window sent
    twice) and ``records``. Missing events give None."""
    acked = paused[-1].get("acked") if paused else None
    resumed = done[-1].get("resumed_from") if done else None
    resent = acked - resumed if isinstance(acked, int) and isinstance(resumed, int) else None
    return {
        "killed_after": acked,
        "resumed_from": resumed,
        "resent": resent,
        "records": done[-1].get("records") if done else None,
    }


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
