"""A Delta table without a JVM in this process: its transaction log read with pyarrow, its
writes through Spark's DataFrame writer and SQL. The adapter under the Delta sink on a Spark
Connect session (:mod:`sparkonce.sinks.delta`), in the user's process and in the Spark
server's Python worker alike, neither of which has py4j.

:class:`DeltaLogReader` reads what the ledger needs from ``_delta_log``: the newest version,
every application's ``txn`` version, the table's properties and schema, and one commit's
actions. It replays the log as Delta does: the newest complete checkpoint (a single Parquet
file or all parts of a multi-part one) and the JSON commits after it, which must follow
without a gap. What it does not read is refused with a :class:`~sparkonce.errors.LedgerError`
naming it, never guessed: a v2 checkpoint (``NNN.checkpoint.<uuid>.parquet``, or sidecar
files), and tables whose newest commits may live outside ``_delta_log`` (the
``catalogManaged`` and coordinated-commits table features). A checkpoint is parsed once; each
later read parses only the JSON commits that appeared since.

:class:`ConnectDeltaTable` has the interface of :class:`sparkonce.spark.delta.DeltaTable`
that the ledger store and the stager use, with the writes done through the session: a batch
is ``df.write.format("delta")`` with Delta's ``txnAppId``/``txnVersion``/``userMetadata``
options, and an epoch commit the same write of zero rows, which Delta 4.4.0 commits as a
``WRITE`` carrying only the ``txn`` action (seen here: no ``add`` action, ``numOutputRows``
0). Those writes return nothing, so whether Delta committed or skipped them is read back from
the log (:meth:`sparkonce.ledger.delta.DeltaLedgerStore.after_write`). It works on a classic
session too (the tests use that), but a classic session takes
:class:`~sparkonce.spark.delta.DeltaTable`, whose writes do not rebuild the table's state.

Delta's writer does rebuild it: measured on Delta 4.4.0 (Spark Connect, 400-row appends to a
small local table, load 10), each ``txnAppId`` write ran four Spark jobs, two of them a
replay of the log's state in ``spark.databricks.delta.snapshotPartitions`` partitions (50
unless set: 52 and 53 tasks), 16-25 s per write against about 2 s for the classic path's
commit. So a write here runs with that setting sized to the log it replays
(:func:`snapshot_partitions`: 2 to 50, by the number of actions the reader applied), unless
the session sets it already: the same four jobs, 4-5 tasks each, about 4 s per write.

The log and the ledger's files are read with the :class:`~sparkonce.files.Files` that reach
the table (:func:`~sparkonce.files.files_for`): a local path directly, ``s3a://`` and
``s3://`` (and ``hdfs://``) through pyarrow, with the S3A settings of the session that asks,
the user's or the Spark server's Python worker's, and the credentials of that process's AWS
chain (a Spark Connect server hands out no secret settings).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sparkonce.errors import LedgerError, SinkError, SparkOnceError
from sparkonce.files import Files, LocalFiles, files_for, is_remote
from sparkonce.spark.delta import session_conf

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

LOG_DIR = "_delta_log"
_COMMIT = re.compile(r"^(\d{20})\.json$")
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_PART = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_V2 = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(?:json|parquet)$")
# Table features under which the newest commits may not be in _delta_log yet.
_OUTSIDE_LOG = ("catalogManaged", "catalogOwned-preview", "coordinatedCommits-preview")
# Delta's setting of how many partitions a replay of the log's state takes (its default: 50).
SNAPSHOT_PARTITIONS_CONF = "spark.databricks.delta.snapshotPartitions"
# The log's actions per replay partition, and the partitions of the smallest log's replay.
ACTIONS_PER_PARTITION = 50_000
MIN_SNAPSHOT_PARTITIONS = 2
MAX_SNAPSHOT_PARTITIONS = 50  # Delta's default: a larger log gets what Delta gives it


def snapshot_partitions(actions: int) -> int:
    """The partitions for a replay of a log of ``actions`` actions (checkpoint rows and
    commit lines): one per :data:`ACTIONS_PER_PARTITION`, within 2 and Delta's 50."""
    wanted = -(-max(actions, 0) // ACTIONS_PER_PARTITION)
    return max(MIN_SNAPSHOT_PARTITIONS, min(MAX_SNAPSHOT_PARTITIONS, wanted))


@dataclass
class LogState:
    """What the ledger reads of one version of a table."""

    version: int = -1
    txns: dict[str, int] = field(default_factory=dict)
    configuration: dict[str, str] = field(default_factory=dict)
    schema: str | None = None  # the metaData's schemaString
    features: set[str] = field(default_factory=set)
    # How many actions were replayed to reach this state (checkpoint rows and commit lines):
    # the size of the replay Delta's writer does (snapshot_partitions).
    actions: int = 0

    def apply(self, actions: list[dict[str, Any]]) -> None:
        self.actions += len(actions)
        for a in actions:
            if a.get("txn"):
                self.txns[str(a["txn"]["appId"])] = int(a["txn"]["version"])
            elif a.get("metaData"):
                meta = a["metaData"]
                self.configuration = {
                    str(k): str(v) for k, v in dict(meta.get("configuration") or {}).items()
                }
                self.schema = meta.get("schemaString")
            elif a.get("protocol"):
                proto = a["protocol"]
                self.features = {
                    str(f)
                    for f in (proto.get("readerFeatures") or [])
                    + (proto.get("writerFeatures") or [])
                }


class DeltaLogReader:
    """Delta's transaction log of the table at ``path``, read through ``files``."""

    def __init__(self, path: str, files: Files) -> None:
        self.path = path.rstrip("/")
        self.log_dir = f"{self.path}/{LOG_DIR}"
        self.files = files
        self._state: LogState | None = None

    def _listing(self) -> tuple[set[int], dict[int, dict[str, Any]]]:
        """The log's commit versions, and its checkpoints by version."""
        commits: set[int] = set()
        checkpoints: dict[int, dict[str, Any]] = {}
        for name in self.files.list_names(self.log_dir):
            if m := _COMMIT.match(name):
                commits.add(int(m[1]))
            elif m := _CHECKPOINT.match(name):
                checkpoints.setdefault(int(m[1]), {})["single"] = name
            elif m := _PART.match(name):
                parts = checkpoints.setdefault(int(m[1]), {}).setdefault("parts", {})
                parts[int(m[2])] = (int(m[3]), name)
            elif m := _V2.match(name):
                checkpoints.setdefault(int(m[1]), {})["v2"] = name
        return commits, checkpoints

    def latest(self) -> int:
        """The newest version (-1: no table here)."""
        commits, checkpoints = self._listing()
        return max(commits | set(checkpoints), default=-1)

    def state(self) -> LogState:
        """The newest version's state (see the module docstring)."""
        commits, checkpoints = self._listing()
        latest = max(commits | set(checkpoints), default=-1)
        cached = self._state
        if cached is not None and cached.version == latest:
            return cached
        if (
            cached is not None
            and 0 <= cached.version < latest
            and all(v in commits for v in range(cached.version + 1, latest + 1))
        ):
            state = cached  # only the commits since
            start = cached.version + 1
        else:
            state, start = self._from_checkpoint(checkpoints, latest)
        for v in range(start, latest + 1):
            actions = self.commit_actions(v)
            if actions is None:
                raise LedgerError(
                    f"Delta table {self.path}: commit {v} is missing from {self.log_dir}, and no "
                    "checkpoint after it covers it; the log cannot be replayed. Check the "
                    "table's log (was a file removed by hand?) or read the table on a classic "
                    "Spark session."
                )
            state.apply(actions)
            state.version = v
        self._check_features(state)
        self._state = state
        return state

    def _from_checkpoint(
        self, checkpoints: dict[int, dict[str, Any]], latest: int
    ) -> tuple[LogState, int]:
        """The state of the newest complete checkpoint, and the first commit after it."""
        for version in sorted(checkpoints, reverse=True):
            found = checkpoints[version]
            names: list[str] = []
            if "single" in found:
                names = [found["single"]]
            elif "parts" in found:
                parts = found["parts"]
                total = next(iter(parts.values()))[0]
                if set(parts) == set(range(1, total + 1)):
                    names = [parts[i][1] for i in range(1, total + 1)]
            if not names:
                if "v2" in found:
                    self._refuse(f"its checkpoint {found['v2']} is a v2 checkpoint")
                continue  # an incomplete multi-part checkpoint: an older one, or the commits
            state = LogState(version=version)
            for name in names:
                self._read_checkpoint(state, name)
            return state, version + 1
        return LogState(), 0

    def _read_checkpoint(self, state: LogState, name: str) -> None:
        import pyarrow.parquet as pq

        data = self.files.read_bytes(f"{self.log_dir}/{name}")
        if data is None:
            raise LedgerError(f"Delta table {self.path}: checkpoint {name} vanished while read")
        table = pq.read_table(io.BytesIO(data))
        columns = set(table.column_names)
        for sidecar in ("sidecar", "checkpointMetadata"):
            if sidecar in columns and table.column(sidecar).null_count < table.num_rows:
                self._refuse(f"its checkpoint {name} is a v2 checkpoint ({sidecar} actions)")
        wanted = [c for c in ("protocol", "metaData", "txn") if c in columns]
        before = state.actions
        for row in table.select(wanted).to_pylist():
            state.apply([{k: v} for k, v in row.items() if v is not None])
        state.actions = before + table.num_rows  # every row (add actions too) is replayed
        # A checkpoint's map columns come back as lists of (key, value) pairs.
        conf: Any = state.configuration
        if isinstance(conf, list):
            state.configuration = {str(k): str(v) for k, v in conf}

    def _check_features(self, state: LogState) -> None:
        outside = sorted(state.features & set(_OUTSIDE_LOG))
        if outside:
            self._refuse(f"it uses the table feature(s) {outside}, whose commits may be outside")
        if "v2Checkpoint" in state.features:
            self._refuse("it uses v2 checkpoints (the v2Checkpoint table feature)")

    def _refuse(self, what: str) -> None:
        raise LedgerError(
            f"Delta table {self.path}: {what}, which sparkonce's Delta log reader (used on "
            "Spark Connect sessions, where there is no JVM to ask Delta) does not read. Run "
            "this pipeline on a classic Spark session (SparkSession.builder.master(...))."
        )

    def commit_actions(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of commit ``version`` (its JSON file), or None once it expired."""
        text = self.files.read_text(f"{self.log_dir}/{version:020d}.json")
        if text is None:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]


class ConnectDeltaTable:
    """One Delta table at ``path``, reached without py4j (see the module docstring)."""

    # The ledger store takes an epoch by a write and a look at the log (no Delta
    # transaction object to hold a read in): sparkonce.ledger.delta's acquire by write.
    transactions = False
    # No py4j here; code that clears the JVM's caches of a classic session finds None.
    jvm: Any = None

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        self.files: Files = files_for(path, spark) if is_remote(path) else LocalFiles()
        self.log = DeltaLogReader(path, self.files)

    # -- Delta's log -----------------------------------------------------------------
    def exists(self) -> bool:
        return self.log.latest() >= 0

    def version(self) -> int:
        return self.log.latest()

    def txn_version(self, app: str) -> int | None:
        return self.log.state().txns.get(app)

    def read_txn(self, app: str) -> tuple[int, int | None]:
        """The newest version and ``app``'s stored version in it, read together."""
        state = self.log.state()
        return state.version, state.txns.get(app)

    def property(self, key: str) -> str | None:
        return self.log.state().configuration.get(key)

    def commit_actions(self, version: int) -> list[dict[str, Any]] | None:
        return self.log.commit_actions(version)

    def schema(self) -> StructType:
        from pyspark.sql.types import StructType

        text = self.log.state().schema
        if text is None:
            raise LedgerError(f"Delta table {self.path} has no schema in its log")
        return StructType.fromJson(json.loads(text))

    # -- writes ------------------------------------------------------------------------
    def write(
        self, df: DataFrame, app: str, version: int, metadata: str, *, overwrite: bool = False
    ) -> None:
        """Append ``df``'s rows (``overwrite``: in place of every row) with ``txn(app,
        version)`` in one Delta commit, unless Delta skips it (stored version >= ours).

        Delta's writer replays the log's state (twice) in the partitions the session's
        ``spark.databricks.delta.snapshotPartitions`` says, 50 unless set; unless the session
        sets it, the write runs with a number sized to this log (module docstring)."""
        writer = (
            df.write.format("delta")
            .mode("overwrite" if overwrite else "append")
            .option("txnAppId", app)
            .option("txnVersion", str(version))
            .option("userMetadata", metadata)
        )
        spark = df.sparkSession
        if spark.conf.get(SNAPSHOT_PARTITIONS_CONF, None) is not None:
            writer.save(self.path)  # the session's own choice
            return
        parts = snapshot_partitions(self.log.state().actions if self.exists() else 0)
        with session_conf(spark, {SNAPSHOT_PARTITIONS_CONF: str(parts)}):
            writer.save(self.path)

    def commit_txn(self, app: str, version: int, metadata: str) -> None:
        """Commit only ``txn(app, version)``: a write of zero rows of the table's schema (a
        local relation: reading the table itself would add its files to the write's reads,
        and a concurrent append would then fail it)."""
        empty = self.spark.createDataFrame([], self.schema())
        self.write(empty, app, version, metadata)

    # -- files beside the table ----------------------------------------------------
    def read_text(self, path: str) -> str | None:
        return self.files.read_text(path)

    def write_text(self, path: str, text: str, *, overwrite: bool) -> bool:
        try:
            return self.files.write_text(path, text, overwrite=overwrite)
        except (OSError, SparkOnceError) as exc:
            raise SinkError(f"{exc} (the Delta table's filesystem)") from None

    def list_names(self, path: str) -> list[str]:
        return self.files.list_names(path)

    def delete(self, path: str) -> None:
        self.files.delete(path)
