"""A Delta Lake table read as a stream, through Delta's own streaming source.

Guarantee: a **replayable input** with deterministic batches, in the words of DESIGN.md
section 1, for the rows the table's commits *add*. Delta's source writes each batch's end
into Spark's offset log before the batch runs, as ``{"reservoirId", "reservoirVersion",
"index", "isStartingVersion"}``: the batch holds the data files after the previous offset
up to and including file ``index`` of table version ``reservoirVersion`` (``index`` -1: no
file of that version yet). A replayed batch lists the same files from the table's log and
reads them again, so it returns the same rows. Paired with an effectively-once sink, each
row a commit appends takes effect exactly once.

Batches in the ledger: one "topic" per table, ``delta:<table id>`` (Delta's ``reservoirId``,
which a table recreated at the same path does not keep), partition 0, and an integer
position that orders Delta's offsets (:func:`position`)::

    position = version * 2**32 + (index + 1)

so position ``v * 2**32`` is the start of version ``v`` (nothing of it read) and ``v * 2**32
+ n`` is "the first ``n`` data files of version ``v`` read". The initial snapshot of a new
query (``isStartingVersion`` true: the whole table at version ``v``, read in batches of
files) takes the same numbers inside version ``v``; it starts at position 0 (the table's
beginning) and ends at ``(v + 1) * 2**32``, where the changes after it begin.

Where a query starts:

- **A new query on an empty ledger** reads the table's current snapshot, then its new
  commits, or the commits from ``starting_version`` on when it is given.
- **A lost or new checkpoint** resumes from the ledger's end with Delta's
  ``startingVersion`` when that end is a version's start (every batch ended on a version
  boundary). When the end falls *inside* a version (a version's files were split over
  batches: ``max_files_per_batch``, or Delta's default of 1000 files per batch), Delta has no
  way to start there; the run is refused before the epoch with one line naming the table and
  the version, and nothing is read again.
- **A replay, a checkpoint behind the ledger, a checkpoint ahead of it**: as for every
  source, by the ledger's positions (:mod:`sparkonce.pipeline.runner`).

Upstream commits, stated plainly:

- ``OPTIMIZE``, ``ZORDER`` and other commits whose files carry ``dataChange=false`` are not
  read: compaction rewrites rows already delivered and delivers nothing again.
- An ``UPDATE``, ``DELETE``, ``MERGE`` or overwrite (a commit that removes files with
  ``dataChange=true``) **stops the run** with a :class:`~sparkonce.errors.SourceError` naming
  the version: Delta's stream cannot deliver a change to rows it delivered already.
  ``skip_change_commits=True`` (Delta's ``skipChangeCommits``) skips such commits instead:
  **their rows are not delivered**, the new versions of updated rows and the rows a MERGE
  inserts included; deletes never reach the output. Choose it only when the output may
  miss them.
- ``VACUUM`` that removed data files a batch still has to read (a replay after a crash, or a
  query far behind) stops the run with a :class:`~sparkonce.errors.SourceError` naming the
  table and the versions; no file is ever skipped silently.

Other limits: ``latest_offsets`` is empty (Delta counts versions and files, not records, so
no lag in records is shown); Spark Connect sessions are refused (classic sessions only);
Delta's ``readChangeFeed``, ``schemaTrackingLocation``, ``ignoreChanges``,
``ignoreDeletes`` and ``failOnDataLoss`` options are refused.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from sparkonce.errors import CheckpointError, CheckpointLostError, ConfigError, SourceError
from sparkonce.offsets import BatchRanges, OffsetRange, TopicPartition
from sparkonce.sources.base import Source

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.spark.checkpoint import Checkpoint

log = logging.getLogger(__name__)

URI_SCHEME = "delta"
#: Positions per table version: a version may hold up to 2**32 - 1 data files.
VERSION_SPAN = 2**32
#: Delta's index of "no file of this version read yet" in the offset log.
BASE_INDEX = -1
#: Delta's check of a ``startingVersion`` against the table's newest version accepts one
#: past it only with this setting (its name says timestamps; Delta passes it for versions
#: too). A ledger that read the whole table ends exactly there.
OUT_OF_RANGE_CONF = "spark.databricks.delta.changeDataFeed.timestampOutOfRange.enabled"
# The JSON key of the start of a query's first batch, which initial_offset writes.
_START_KEY = "sparkonceStart"

# Delta options sparkonce sets itself or refuses, and why.
_MANAGED_OPTIONS = {
    "startingversion": "pass starting_version=...; the ledger's end wins when it has one",
    "startingtimestamp": "pass starting_version=...; the ledger's end wins when it has one",
    "maxfilespertrigger": "pass max_files_per_batch=...",
    "skipchangecommits": "pass skip_change_commits=True (and read what it skips)",
    "ignorechanges": "it delivers every row of a rewritten file again (duplicates); "
    "see skip_change_commits",
    "ignoredeletes": "it drops deletes without a word; see skip_change_commits",
    "ignorefiledeletion": "it drops deletes without a word; see skip_change_commits",
    "failondataloss": "missing files must stop the run, never be skipped",
    "readchangefeed": "the change feed's offsets are not read by DeltaSource",
    "schematrackinglocation": "schema tracking's offsets (index -20/-19) are not read by "
    "DeltaSource",
    "schemalocation": "schema tracking's offsets (index -20/-19) are not read by DeltaSource",
}


# -- positions (pure) --------------------------------------------------------------------------


def position(version: int, index: int) -> int:
    """The ledger's position of Delta offset ``(version, index)``: ``version * 2**32 +
    index + 1``. Orders offsets as Delta does ((version, index) lexicographically), and
    ``index`` -1 (nothing of the version read) is the version's first position."""
    if version < 0:
        raise CheckpointError(f"Delta offset with a negative table version {version}")
    if not BASE_INDEX <= index < VERSION_SPAN - 1:
        raise CheckpointError(
            f"Delta offset (version {version}, index {index}): index must be between -1 and "
            f"{VERSION_SPAN - 2}; -20/-19 mark schema tracking's metadata changes, which "
            "DeltaSource does not read (leave schemaTrackingLocation unset)"
        )
    return version * VERSION_SPAN + index + 1


def version_of(pos: int) -> int:
    """The table version a position lies in."""
    return pos // VERSION_SPAN


def files_read(pos: int) -> int:
    """How many data files of its version a position has read (0: a version boundary)."""
    return pos % VERSION_SPAN


@dataclass(frozen=True)
class DeltaOffset:
    """One Delta offset from Spark's offset log."""

    table_id: str
    version: int
    index: int
    snapshot: bool  # Delta's isStartingVersion: a file of the initial snapshot

    @property
    def position(self) -> int:
        return position(self.version, self.index)

    @property
    def topic(self) -> str:
        return f"{URI_SCHEME}:{self.table_id}"

    @classmethod
    def parse(cls, text: str) -> DeltaOffset:
        try:
            data = json.loads(text)
            out = cls(
                str(data["reservoirId"]),
                int(data["reservoirVersion"]),
                int(data["index"]),
                bool(data["isStartingVersion"]),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(
                f"Spark's offset {text[:200]!r} is not a Delta source offset "
                f"({type(exc).__name__}: {exc}); the checkpoint belongs to another source. "
                "Operator action: use this pipeline's own checkpoint directory"
            ) from None
        out.position  # noqa: B018 - checks the version and index
        return out


def delta_ranges(previous: str | None, current: str) -> BatchRanges:
    """A batch's range from Spark's offset log: from the previous batch's Delta offset (or
    the ``{"sparkonceStart": N}`` start of a query's first batch, or 0 when unknown) to this
    batch's. A no-data batch (the same offset twice) is an empty range."""
    end = DeltaOffset.parse(current)
    if previous is None:
        start = 0
    elif _START_KEY in previous:
        start = min(int(json.loads(previous)[_START_KEY]), end.position)
    else:
        before = DeltaOffset.parse(previous)
        if before.table_id != end.table_id:
            raise CheckpointError(
                f"Spark's offset log holds offsets of two Delta tables ({before.table_id} then "
                f"{end.table_id}); the table was replaced under the query. Operator action: "
                "use a new checkpoint and pipeline for the new table"
            )
        start = before.position
    if start > end.position:
        raise CheckpointError(
            f"Delta's offsets went back (position {start} to {end.position}) in Spark's "
            "offset log; the checkpoint was changed by hand"
        )
    return BatchRanges((OffsetRange(end.topic, 0, start, end.position),))


# -- failures Delta reports, named for the operator -------------------------------------------

_CHANGE_COMMIT = re.compile(
    r"\[(DELTA_SOURCE_TABLE_IGNORE_CHANGES|DELTA_SOURCE_IGNORE_DELETE)\][^\n]*?"
    r"at version (\d+)"
)
_MISSING_FILE = re.compile(
    r"(?:FILE_NOT_EXIST|FileNotFoundException|DELTA_FILE_NOT_FOUND)[^\n]*?"
    r"((?:file:|[a-z][a-z0-9+.-]*://)?/[^\s'\"]+?\.parquet)"
)
_MISSING_LOG = re.compile(
    r"\[(DELTA_LOG_FILE_NOT_FOUND_FOR_STREAMING_SOURCE|DELTA_VERSIONS_NOT_CONTIGUOUS|"
    r"DELTA_LOG_FILE_NOT_FOUND)\]([^\n]*)"
)


class DeltaSource(Source):
    """Read a Delta Lake table as a stream (see the module docstring).

    Guarantee: a replayable input with deterministic batches for the rows that the table's
    commits add: each batch's end (table version and file index) is in Spark's offset log
    before the batch runs, and a replay reads the same files again. ``OPTIMIZE`` is not read
    again. An ``UPDATE``, ``DELETE`` or ``MERGE`` upstream stops the run, unless
    ``skip_change_commits=True``: then such commits are skipped and **their rows are not
    delivered**. Data files removed by ``VACUUM`` before a batch read them stop the run with a
    :class:`~sparkonce.errors.SourceError` naming the table and the versions; nothing is
    skipped silently. A lost checkpoint resumes from the ledger's end when it is a version's
    start, and is refused before the epoch when it lies inside a version.

    ``path``: the table's directory (local, or any URI Spark's Hadoop reads, such as
    ``s3a://bucket/table``). ``max_files_per_batch`` becomes Delta's ``maxFilesPerTrigger``
    (Delta's default: 1000). ``starting_version``: where a new pipeline starts (its ledger
    is empty) instead of the table's current snapshot. ``options`` are Delta's own reader
    options (``maxBytesPerTrigger``, ``excludeRegex``...); the ones sparkonce sets, and those
    that would deliver rows twice or drop them silently, are refused with the reason.
    """

    stable_task_numbers: ClassVar[bool] = False

    def __init__(
        self,
        path: str | Path,
        *,
        max_files_per_batch: int | None = None,
        starting_version: int | None = None,
        skip_change_commits: bool = False,
        options: Mapping[str, str | int | float | bool] | None = None,
    ) -> None:
        if not isinstance(path, (str, Path)) or not str(path):
            raise ConfigError(f"DeltaSource path must be a table directory, got {path!r}")
        text = str(path)
        self.path = text if "://" in text or text.startswith("file:") else str(Path(text).resolve())
        for name, value in (
            ("max_files_per_batch", max_files_per_batch),
            ("starting_version", starting_version),
        ):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"DeltaSource {name} must be an integer, got {value!r}")
        if max_files_per_batch is not None and max_files_per_batch < 1:
            raise ConfigError(
                f"DeltaSource max_files_per_batch must be >= 1, got {max_files_per_batch}"
            )
        if starting_version is not None and starting_version < 0:
            raise ConfigError(f"DeltaSource starting_version must be >= 0, got {starting_version}")
        self.max_files_per_batch = max_files_per_batch
        self.starting_version = starting_version
        self.skip_change_commits = bool(skip_change_commits)
        self.reader_options = _check_options(options)
        # Where this run's query reads its first batch from, as stream() set Delta up: Delta
        # itself reads a first batch again from the options of the run that replays it.
        self._first_start: int | None = None

    # -- naming ------------------------------------------------------------------------------
    def uri(self) -> str:
        return f"{URI_SCHEME}://{self.path}" if self.path.startswith("/") else f"delta:{self.path}"

    @classmethod
    def from_uri(cls, uri: str, **kwargs: Any) -> DeltaSource:
        """Reopen ``delta:///ABS/PATH`` or ``delta:URI``; ``kwargs`` go to the constructor."""
        if isinstance(uri, str) and uri.startswith(f"{URI_SCHEME}:///"):
            return cls(uri[len(f"{URI_SCHEME}://") :], **kwargs)
        if isinstance(uri, str) and uri.startswith(f"{URI_SCHEME}:") and "://" in uri:
            return cls(uri[len(f"{URI_SCHEME}:") :], **kwargs)
        raise ConfigError(f"{uri!r} is not a Delta source URI (delta:///ABS/PATH or delta:URI)")

    def describe(self) -> str:
        extra = " skip_change_commits" if self.skip_change_commits else ""
        if self.max_files_per_batch:
            extra += f" max_files_per_batch={self.max_files_per_batch}"
        return f"DeltaSource({self.uri()}{extra})"

    def __repr__(self) -> str:
        return self.describe()

    def read_limits(self) -> dict[str, int]:
        return {"max_files_per_batch": self.max_files_per_batch} if self.max_files_per_batch else {}

    def aligned(self) -> None:
        """None: a Delta table is one stream of versions; there are no partitions to align."""
        return None

    def spark_conf(self) -> dict[str, str]:
        from sparkonce.spark.delta_conf import delta_spark_conf

        return delta_spark_conf("DeltaSource")

    def latest_offsets(self) -> dict[TopicPartition, int]:
        """Empty: Delta counts versions and files, not records, so no lag in records."""
        return {}

    # -- reading -----------------------------------------------------------------------------
    def stream(self, spark: SparkSession, start: Mapping[TopicPartition, int] | None) -> DataFrame:
        from pyspark.errors import AnalysisException

        opts = dict(self.reader_options)
        if self.max_files_per_batch:
            opts["maxFilesPerTrigger"] = str(self.max_files_per_batch)
        if self.skip_change_commits:
            opts["skipChangeCommits"] = "true"
        opts.update(self.start_options(spark, start))
        log.info("reading %s from %s", self.describe(), opts.get("startingVersion", "its snapshot"))
        try:
            return spark.readStream.format("delta").options(**opts).load(self.path)
        except AnalysisException as exc:
            raise SourceError(f"{self.describe()}: Delta refused the stream: {exc}") from None

    def start_options(
        self, spark: SparkSession, start: Mapping[TopicPartition, int] | None
    ) -> dict[str, str]:
        """Delta's reader options that start a new query where it must (``startingVersion``
        from the ledger's end ``start``, else ``starting_version``; none: the table's current
        snapshot), and where its first batch starts (:meth:`initial_offset`). Reads the
        table's log; :class:`SourceError` when there is no table, or the ledger counted
        another table. Also used by :class:`~sparkonce.sources.spark_query.SparkSource` for
        a Delta read the user wrote."""
        from sparkonce.spark.delta import DeltaTable

        table = DeltaTable(spark, self.path)
        snapshot = table.snapshot()
        newest = int(snapshot.version())
        if newest < 0:
            raise SourceError(
                f"{self.describe()}: there is no Delta table at {self.path} (no commit in its "
                "_delta_log). Create the table first, or fix the path."
            )
        table_id = str(snapshot.metadata().id())
        resume = self._ledger_position(start, table_id)
        if resume is not None:
            version = version_of(resume)
            self._first_start = version * VERSION_SPAN
            if version > newest:
                # The ledger read every version there is: Delta must accept the next one.
                spark.conf.set(OUT_OF_RANGE_CONF, "true")
            return {"startingVersion": str(version)}
        if self.starting_version is not None:
            self._first_start = self.starting_version * VERSION_SPAN
            return {"startingVersion": str(self.starting_version)}
        self._first_start = 0  # the current snapshot: the whole table from its start
        return {}

    def _ledger_position(
        self, start: Mapping[TopicPartition, int] | None, table_id: str
    ) -> int | None:
        """The ledger's end position for this table (None: the ledger is empty)."""
        found = None
        for (topic, partition), pos in (start or {}).items():
            if not topic.startswith(f"{URI_SCHEME}:") or partition != 0:
                raise SourceError(
                    f"{self.describe()}: the ledger's offsets name {topic}[{partition}], not a "
                    "Delta table: the pipeline read another source before. Operator action: "
                    "give this source a pipeline name of its own"
                )
            if topic != f"{URI_SCHEME}:{table_id}":
                raise SourceError(
                    f"{self.describe()}: the ledger's offsets are of Delta table "
                    f"{topic.partition(':')[2]}, but the table at {self.path} is {table_id} (it "
                    "was replaced or created again). Its versions are not the ones the ledger "
                    "counted. Operator action: start a new pipeline (another name) for the new "
                    "table, or point the source back at the original table"
                )
            found = pos
        return found

    def check_ledger_start(self, start: Mapping[TopicPartition, int]) -> None:
        """Refuse a new checkpoint whose ledger ends inside a table version: Delta can only
        start a stream at a version's start, and reading that version from its start would
        deliver its first files again."""
        for (topic, _), pos in start.items():
            if files_read(pos) == 0:
                continue
            version = version_of(pos)
            raise CheckpointLostError(
                f"{self.describe()}: the checkpoint is new and the ledger ends inside version "
                f"{version} of table {topic.partition(':')[2]} (its first {files_read(pos)} data "
                "files were read: the version was split over batches by max_files_per_batch or "
                "Delta's 1000-file default). Delta can only start a stream at a version's "
                "start, which would deliver those files again. Nothing was changed (no epoch "
                "was taken). Operator action: restore the pipeline's checkpoint directory; or "
                "recompute the output from scratch (sparkonce reset --output-rows); set "
                "max_files_per_batch above the largest commit's file count so that batches end "
                "on version boundaries"
            )

    def initial_offset(self, checkpoint: Checkpoint) -> str | None:
        """The start of the query's first batch, as this run set Delta up (Delta reads a
        first batch again from the replaying run's options): ``startingVersion``'s first
        position, or 0 for the table's snapshot. None before :meth:`stream` ran."""
        if self._first_start is None:
            return None
        return json.dumps({_START_KEY: self._first_start})

    def batch_ranges(self, previous: str | None, current: str) -> BatchRanges:
        """The batch's one range, between the positions of Delta's offsets
        (:func:`delta_ranges`)."""
        return delta_ranges(previous, current)

    def read_failure(self, text: str, ranges: BatchRanges | None) -> SourceError | None:
        """A failure of Delta's stream, named for the operator: a change commit upstream, or
        data or log files that are gone (VACUUM, log retention)."""
        change = _CHANGE_COMMIT.search(text)
        if change is not None:
            what = "deletes rows" if change[1] == "DELTA_SOURCE_IGNORE_DELETE" else "changes rows"
            return SourceError(
                f"{self.describe()}: version {change[2]} of the table {what} (an UPDATE, "
                "DELETE, MERGE or overwrite: its commit removes files with dataChange=true). "
                "Delta's stream cannot deliver a change to rows it already delivered, so the "
                "run stopped; nothing was skipped. Operator action: pass "
                "skip_change_commits=True to skip such commits (their rows are then NOT "
                "delivered, new versions of updated rows included), or recompute the output "
                "from scratch (sparkonce reset --output-rows and a new checkpoint)"
            )
        gone = _MISSING_FILE.search(text)
        if gone is not None and _under(gone[1], self.path):
            versions = _versions(ranges)
            return SourceError(
                f"{self.describe()}: a batch reading table {versions} (files its commits added, "
                f"or the table's snapshot at it) needs data file {gone[1]}, which is gone from "
                "the table's directory (VACUUM removed it, or it was deleted by hand). Nothing "
                "was skipped: the run stopped. Operator "
                "action: restore the file (from a backup or the storage's versioning); if it "
                "is lost, recompute the output from scratch (sparkonce reset --output-rows and "
                "a new checkpoint). Keep VACUUM's retention longer than the longest time a "
                "pipeline may be down"
            )
        missing = _MISSING_LOG.search(text)
        if missing is not None and (self.path in text or f"file:{self.path}" in text):
            return SourceError(
                f"{self.describe()}: the table's log no longer holds a version this run needs "
                f"([{missing[1]}]{missing[2][:300]}; {_versions(ranges)}). Log retention "
                "(delta.logRetentionDuration) removed it while the pipeline was behind. "
                "Nothing was skipped: the run stopped. Operator action: recompute the output "
                "from scratch (sparkonce reset --output-rows and a new checkpoint), and keep "
                "log retention longer than the longest time a pipeline may be down"
            )
        return None


def _versions(ranges: BatchRanges | None) -> str:
    if ranges is None or not ranges.ranges:
        return "the version being read"
    r = ranges.ranges[0]
    first, last = version_of(r.start), version_of(max(r.start, r.end - 1))
    return f"version {first}" if first == last else f"versions {first} to {last}"


def _under(file: str, table: str) -> bool:
    bare = re.sub(r"^file:", "", file)
    return bare.startswith(table.rstrip("/") + "/") or file.startswith(table.rstrip("/") + "/")


def _check_options(options: Mapping[str, str | int | float | bool] | None) -> dict[str, str]:
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise ConfigError(
            f"options must be a mapping of Delta reader options, got {type(options).__name__}"
        )
    out: dict[str, str] = {}
    for key, value in options.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"options keys must be Delta reader option names, got {key!r}")
        why = _MANAGED_OPTIONS.get(key.lower())
        if why is not None:
            raise ConfigError(f"DeltaSource options may not set {key!r}: {why}")
        if not isinstance(value, (str, int, float, bool)):
            raise ConfigError(
                f"options[{key!r}] must be a string, number or boolean, got {type(value).__name__}"
            )
        out[key] = str(value).lower() if isinstance(value, bool) else str(value)
    return out
