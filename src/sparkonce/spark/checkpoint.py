"""Reading Spark's streaming checkpoint: the offset log and the query id.

Spark writes ``<checkpoint>/offsets/<batchId>`` *before* it runs a batch (the
batch's source offsets, our offset ranges) and ``<checkpoint>/commits/<batchId>``
after the batch's sink finished. sparkonce reads the offset log to learn which
ranges a batch covers; it never trusts the checkpoint for progress (the ledger
is the truth). The checkpoint may be on any filesystem Spark supports: it is read
through :mod:`sparkonce.files`, the way Spark writes it on a classic session, and
through pyarrow where there is no JVM (a Spark Connect client, and the Spark server's
Python worker that runs a Connect pipeline's batches: ``s3a://``, ``s3://`` and
``hdfs://``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from sparkonce.errors import CheckpointError
from sparkonce.files import ArrowSettings, Files, files_for, is_remote, join, location

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession


#: The offset log formats sparkonce reads: PySpark 4.2 and 4.3 both write ``v1`` (checked
#: against checkpoints each wrote, tests/data/checkpoints). Any other version is refused
#: rather than guessed at.
OFFSET_LOG_VERSIONS = frozenset({"v1"})
SPARK_VERSIONS_READ = "4.2 and 4.3"


class InitialOffset(Protocol):
    """What :meth:`Checkpoint.previous_offset` needs of a source (a
    :class:`~sparkonce.sources.base.Source`, which sits above this module and imports it)."""

    def initial_offset(self, checkpoint: Checkpoint) -> str | None: ...

    def offset_from_log(self, lines: list[str], where: str) -> str: ...


def one_source_offset(lines: list[str], where: str) -> str:
    """The offset of a pipeline with one source, from the source lines of the offset log
    file ``where``: a stream-stream self-join reads the one source twice, and both sides
    plan the same ranges from the same log, so the batch is those ranges; lines that
    differ are another source (a :class:`~sparkonce.sources.source_set.SourceSet` maps
    each of its sources' lines itself)."""
    distinct = {_canonical(s) for s in lines}
    if len(distinct) != 1:
        raise CheckpointError(
            f"{where}: expected one streaming source, found {len(lines)} with different "
            "offsets. A pipeline with source=... reads one source (a self-join of it is fine "
            "while both sides plan the same ranges); give several streams as "
            "sources={name: source, ...}, or join other data as static tables."
        )
    return lines[0]


class Checkpoint:
    """A query's checkpoint location: a local directory or any URL Spark's Hadoop reaches.

    ``location`` is as :func:`sparkonce.files.location` returns it; ``files`` reads it
    (:func:`sparkonce.files.files_for`: local paths need no Spark session, other
    locations go through the session's Hadoop filesystem, as Spark's own checkpoint
    writer does, or through pyarrow on a Spark Connect session or with
    :class:`~sparkonce.files.ArrowSettings`).
    """

    def __init__(self, location: str | Path, files: Files | None = None) -> None:
        self.location = _location(location)
        self.files: Files = files if files is not None else files_for(self.location)

    @classmethod
    def open(
        cls,
        location: str | Path,
        spark: SparkSession | None = None,
        *,
        settings: ArrowSettings | None = None,
    ) -> Checkpoint:
        """The checkpoint at ``location``, read through ``spark`` when it is not local.

        With ``settings`` (:meth:`ArrowSettings.of` a session, made where there is one) a
        location that is not local is read through pyarrow with no session at all: for a
        process that has none, such as the Spark server's Python worker that runs a Spark
        Connect pipeline's batch function. A local location is read as a local path
        either way."""
        loc = _location(location)
        return cls(loc, files_for(loc, spark, settings=settings))

    @property
    def path(self) -> str:
        """The location (an absolute local path or a URL), for messages and Spark."""
        return self.location

    @property
    def spark_location(self) -> str:
        """What Spark's ``checkpointLocation`` gets: a local path as a ``file://`` URI, so a
        cluster whose default filesystem is HDFS or S3 still writes it where this process
        reads it."""
        return self.location if self.remote else "file://" + self.location

    @property
    def remote(self) -> bool:
        return is_remote(self.location)

    def _at(self, *parts: str) -> str:
        return join(self.location, *parts)

    @property
    def is_new(self) -> bool:
        """True when Spark has never planned a batch here (missing or empty offset log)."""
        return not self.batch_ids("offsets")

    def query_id(self) -> str | None:
        meta = self._at("metadata")
        text = self.files.read_text(meta)
        if text is None:
            return None
        try:
            return str(json.loads(text.splitlines()[0])["id"])
        except (ValueError, KeyError, IndexError) as exc:
            raise CheckpointError(f"{meta} is not a Spark checkpoint metadata file: {exc}") from exc

    def has_state(self) -> bool:
        """Whether the query keeps state in this checkpoint, as Spark itself records it.

        Spark writes ``state/<operator id>/`` (the operator's metadata) when it plans
        the first batch of a query with a stateful operator (aggregation, dedup,
        stream-stream join, limit, ``applyInPandasWithState``,
        ``transformWithStateInPandas``...), before the batch's sink runs. A stateless
        query never creates it.
        """
        return any(n.isdigit() for n in self.files.list_names(self._at("state")))

    def check_usable(self) -> None:
        """Raise :class:`ConfigError` if the location cannot be a checkpoint directory."""
        self.files.check_writable_dir(self.location, "checkpoint")

    def clear_unplanned_debris(self) -> list[str]:
        """Remove what a killed driver left in an offset log that has no batch yet.

        Spark writes a batch's offsets to a temporary file and renames it into place (on
        S3A a copy, not atomic, so the window is wide). A driver killed in between leaves
        the temporary file in an offset log with no batch in it, and Spark's check of a
        new checkpoint then refuses every restart of a stateful query
        (``STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY``). With no batch planned and none
        committed, nothing in ``offsets/`` is a batch, so nothing is lost. Call it only as
        the pipeline's owner (after taking the epoch): an older driver still writing there
        is fenced anyway. Returns the names removed."""
        if self.batch_ids("offsets") or self.batch_ids("commits"):
            return []
        stray = self.files.list_names(self._at("offsets"))
        for name in stray:
            self.files.delete(self._at("offsets", name))
        return stray

    def reopen_for_watermark(self) -> int | None:
        """Make Spark run its last batch again when that batch moved the watermark and no
        batch was planned after it; returns that batch's id, or None (nothing changed).

        A stateful query releases rows its watermark expires (closed windows, outer-join
        rows with no match, state timeouts) in the *next* batch, a no-data batch when no
        input follows. Spark plans that no-data batch only after a batch it ran in the same
        process: a driver stopped after Spark recorded the last data batch's commit and
        before it planned the no-data batch restarts with nothing to run, and the released
        rows wait in the state for the next input (an ``availableNow`` run over a finished
        input never emits them). Removing the last batch's commit record makes the restart
        run that batch again, which the ledger skips as a replay while Spark recomputes it
        for its state, and plans the no-data batch after it.

        It applies only when the checkpoint has state, the last planned batch is the last
        committed one, and its commit record's next watermark is ahead of the watermark the
        batch ran with. Call it as the pipeline's owner, after taking the epoch: the batch
        is in the ledger (Spark records a commit after the sink's batch function returned),
        so running it again writes nothing twice."""
        committed = self.batch_ids("commits")
        if not committed or not self.has_state():
            return None
        last = committed[-1]
        if self.batch_ids("offsets")[-1:] != [last]:
            return None  # Spark runs the planned batch on its own, and plans after it
        ran_with = _metadata(self.read_text("offsets", str(last)), "batchWatermarkMs")
        next_mark = _metadata(self.read_text("commits", str(last)), "nextBatchWatermarkMs")
        if ran_with is None or next_mark is None or next_mark <= ran_with:
            return None
        self.files.delete(self._at("commits", str(last)))
        self.files.delete(self._at("commits", f".{last}.crc"))  # Hadoop's local checksum
        return last

    def batch_ids(self, kind: str = "offsets") -> list[int]:
        return sorted(int(n) for n in self.files.list_names(self._at(kind)) if n.isdigit())

    def last_committed_batch(self) -> int | None:
        ids = self.batch_ids("commits")
        return ids[-1] if ids else None

    def read_text(self, *parts: str) -> str | None:
        """A file of the checkpoint (``parts`` below its root), None when missing."""
        return self.files.read_text(self._at(*parts))

    def read_bytes(self, *parts: str) -> bytes | None:
        return self.files.read_bytes(self._at(*parts))

    def source_offset(self, batch_id: int, source: InitialOffset | None = None) -> str | None:
        """The serialized source offset Spark planned for ``batch_id`` (None if purged).

        Spark writes one line per streaming source of the query; ``source`` (the pipeline's)
        makes its offset of them (:meth:`~sparkonce.sources.base.Source.offset_from_log`);
        without it, they must be one source's (:func:`one_source_offset`)."""
        f = self._at("offsets", str(batch_id))
        text = self.files.read_text(f)
        if text is None:
            return None
        lines = text.splitlines()
        if not lines or lines[0].strip() not in OFFSET_LOG_VERSIONS:
            raise CheckpointError(
                f"{f}: offset log format {lines[0].strip() if lines else '(empty file)'!r} is "
                f"not one sparkonce reads ({', '.join(sorted(OFFSET_LOG_VERSIONS))}, as "
                f"written by PySpark {SPARK_VERSIONS_READ}). Run the query with a PySpark "
                "sparkonce supports, or upgrade sparkonce to a release that reads this format."
            )
        sources = [ln for ln in lines[2:] if ln.strip()]
        if source is None:
            return one_source_offset(sources, f)
        return source.offset_from_log(sources, f)

    def previous_offset(self, batch_id: int, source: InitialOffset) -> str | None:
        """Where ``batch_id`` starts: the batch before's offset, or for batch 0 the
        source's initial offset (None for sources whose offsets hold whole ranges)."""
        if batch_id > 0:
            return self.source_offset(batch_id - 1, source)
        return source.initial_offset(self)

    def __repr__(self) -> str:
        return f"Checkpoint({self.location!r})"


def _location(raw: str | Path) -> str:
    return location(raw, "checkpoint")


def _metadata(text: str | None, field: str) -> int | None:
    """An integer of the JSON line after the version line of an offset or commit log file
    (``v1`` then ``{"batchWatermarkMs": ...}``), None when the file or the field is missing
    or unreadable: the caller then leaves the checkpoint alone."""
    lines = (text or "").splitlines()
    try:
        value = json.loads(lines[1]).get(field)
    except (IndexError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) else None


def _canonical(offset: str) -> str:
    try:
        return json.dumps(json.loads(offset), sort_keys=True)
    except ValueError:
        return offset
