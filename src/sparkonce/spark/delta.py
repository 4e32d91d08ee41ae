"""Delta Lake's internals, reached through the session's JVM (py4j): the adapter under the
Delta sink's ledger store (:mod:`sparkonce.ledger.delta`) and the sink.

:class:`DeltaTable` commits rows and a ``txn`` action in one Delta transaction, reads the
stored ``txn`` versions and the table's properties, and reads and writes the small files
beside the table (through :mod:`sparkonce.files`). The functions below classify Delta's
Java exceptions. This module holds no protocol logic: what the versions mean is the
store's business (:mod:`sparkonce.ledger.delta`). Driver only.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sparkonce.errors import SinkError, SparkOnceError
from sparkonce.files import HadoopFiles
from sparkonce.jvm import java_session, jvm

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

# Delta's SQL options for idempotent DML (MERGE, INSERT...): the writer options' twins.
TXN_APP_ID_CONF = "spark.databricks.delta.write.txnAppId"
TXN_VERSION_CONF = "spark.databricks.delta.write.txnVersion"
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


def is_concurrent_transaction(exc: BaseException) -> bool:
    """Whether ``exc`` is Delta's conflict on an application id (another commit of it)."""
    text = str(exc)
    return "ConcurrentTransactionException" in text or "DELTA_CONCURRENT_TRANSACTION" in text


def is_retryable_conflict(exc: BaseException) -> bool:
    """Delta's other write conflicts (a concurrent writer changed files this write read).

    Nothing of the losing write was committed, so it may run again.
    """
    text = str(exc)
    if is_concurrent_transaction(exc):
        return False
    return any(
        name in text
        for name in (
            "ConcurrentAppendException",
            "ConcurrentDeleteReadException",
            "ConcurrentDeleteDeleteException",
            "MetadataChangedException",
            "ProtocolChangedException",
        )
    )


class DeltaTable:
    """One Delta table at ``path``, reached through the session's JVM (driver only)."""

    # The ledger store takes an epoch in a Delta transaction of its own (start_transaction).
    transactions = True

    def __init__(self, spark: SparkSession, path: str) -> None:
        self.spark = spark
        self.path = path
        gateway = jvm(spark)
        assert gateway is not None, "the classic adapter needs a JVM (ConnectDeltaTable: none)"
        self.jvm = gateway
        self.files = HadoopFiles(spark)
        self._log: Any = None

    # -- Delta's log -----------------------------------------------------------------
    @property
    def delta_log(self) -> Any:
        if self._log is None:
            self._log = self.jvm.org.apache.spark.sql.delta.DeltaLog.forTable(
                java_session(self.spark),
                self.path,
            )
        return self._log

    def snapshot(self) -> Any:
        """The table's newest snapshot (reads the log's listing; state is built lazily)."""
        none = self.jvm.scala.Option.empty()
        return self.delta_log.update(False, none, none)

    def exists(self) -> bool:
        """Whether the table has a commit now. Reads the log's listing: Delta's own
        ``tableExists()`` answers from the snapshot its ``DeltaLog`` last saw, which stays
        "no table" in a session that looked before another process created it."""
        return int(self.snapshot().version()) >= 0

    def version(self) -> int:
        return int(self.snapshot().version())

    def txn_version(self, app: str) -> int | None:
        """The stored version of application ``app`` (None: never committed)."""
        return stored_version(self.snapshot(), app)

    def read_txn(self, app: str) -> tuple[int, int | None]:
        """The newest version and ``app``'s stored version in it, from one snapshot."""
        snapshot = self.snapshot()
        return int(snapshot.version()), stored_version(snapshot, app)

    def append(
        self, jdf: Any, app: str, version: int, metadata: str, *, overwrite: bool = False
    ) -> tuple[bool, int]:
        """Append ``jdf``'s rows (``overwrite``: in place of every row the table has) and
        ``txn(app, version)`` in one Delta commit, unless
        Delta's rule says the write was done (the stored version >= ``version``).

        Returns ``(True, the commit's version)`` or ``(False, the stored version)``.
        This is what ``df.write.option("txnAppId", ...)`` does, through Delta's
        ``OptimisticTransaction`` directly: that writer reads the stored version from the
        table's full state (a Spark job over the log: 4-25 s per batch on a small local
        table here, against 0.2 s for the write itself), where the version is in the
        checksum file (``.crc``) of the snapshot already (:func:`stored_version`). The read
        is registered with the transaction, so a concurrent commit of ``app`` makes this
        one fail with ``ConcurrentTransactionException``, as the writer's would.
        """
        jvm = self.jvm
        txn = self.delta_log.startTransaction()
        txn.readTxn().addOne(app)
        stored = stored_version(txn.snapshot(), app)
        if stored is not None and stored >= version:
            return False, stored
        actions = txn.writeFiles(jdf)
        if overwrite:
            existing = txn.filterFiles()
            removes = jvm.java.util.ArrayList()
            for i in range(existing.size()):
                removes.add(existing.apply(i).remove())
            actions = actions.appendedAll(
                jvm.scala.jdk.javaapi.CollectionConverters.asScala(removes).toSeq()
            )
        now = jvm.java.lang.Long.valueOf(int(datetime.now(UTC).timestamp() * 1000))
        txn.updateSetTransaction(app, version, jvm.scala.Option.apply(now))
        committed = int(txn.commit(actions, self._write_op(metadata, overwrite=overwrite)))
        return True, committed

    def property(self, key: str) -> str | None:
        conf = self.snapshot().metadata().configuration()
        return str(conf.apply(key)) if conf.contains(key) else None

    def commit_actions(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of commit ``version`` (its JSON file), or None once it expired."""
        name = f"{self.path.rstrip('/')}/_delta_log/{version:020d}.json"
        text = self.read_text(name)
        if text is None:
            return None
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def start_transaction(self) -> Any:
        return self.delta_log.startTransaction()

    def _write_op(self, metadata: str, *, overwrite: bool = False) -> Any:
        """Delta's ``WRITE`` operation (append or overwrite) for a commit's history, with
        ``metadata`` as the commit's ``userMetadata``.

        In the operation, not in the session's ``spark.databricks.delta.commitInfo.
        userMetadata``: a batch commits inside ``foreachBatch``, where Delta's transaction
        reads the conf of the streaming query's own session (a clone), not of the session
        this table was opened with; the conf set there never reached the batch commits."""
        jvm = self.jvm
        none = jvm.scala.Option.empty()
        save_mode = jvm.org.apache.spark.sql.SaveMode
        return jvm.org.apache.spark.sql.delta.DeltaOperations.Write(
            save_mode.Overwrite if overwrite else save_mode.Append,
            none,
            none,
            jvm.scala.Option.apply(metadata),
            none,
            none,
            none,
            none,
            none,
        )

    def _commit_set_transaction(self, txn: Any, app: str, version: int, metadata: str) -> bool:
        """Commit only ``txn(app, version)`` (an epoch), with no data files.

        As a ``WRITE`` (append) of nothing, not Delta's ``MANUAL UPDATE``: measured on Delta
        4.4.0, a ``MANUAL UPDATE`` commit makes Delta compute the new snapshot's state right
        after (four Spark jobs, 2-4 s on a small local table), a ``WRITE`` does not (one
        job, about 1 s). The commit's ``userMetadata`` says it is an epoch commit.
        """
        jvm = self.jvm
        now = jvm.java.lang.Long.valueOf(int(datetime.now(UTC).timestamp() * 1000))
        txn.updateSetTransaction(app, version, jvm.scala.Option.apply(now))
        no_actions = jvm.scala.jdk.javaapi.CollectionConverters.asScala(
            jvm.java.util.ArrayList()
        ).toSeq()
        txn.commit(no_actions, self._write_op(metadata))
        return True

    # -- files beside the table ----------------------------------------------------
    # Through Hadoop's FileSystem for every location, local included (sparkonce.files), so
    # the ledger files live wherever the table does.
    def read_text(self, path: str) -> str | None:
        return self.files.read_text(path)

    def write_text(self, path: str, text: str, *, overwrite: bool) -> bool:
        """Write ``text`` to ``path``. Without ``overwrite``, a file already there is kept
        (returns False). With it, the text goes to a temporary file renamed into place,
        so a crash leaves the old file or the new one, never a torn one."""
        try:
            return self.files.write_text(path, text, overwrite=overwrite)
        except SparkOnceError as exc:
            raise SinkError(f"{exc} (the Delta table's filesystem)") from None

    def list_names(self, path: str) -> list[str]:
        return self.files.list_names(path)

    def delete(self, path: str) -> None:
        self.files.delete(path)


def stored_version(snapshot: Any, app: str) -> int | None:
    """``app``'s version in ``snapshot``: from its checksum file (``.crc``, where Delta
    keeps every ``txn`` of a table with few of them), else from the snapshot's state.

    Not ``Snapshot.setTransactionsIfKnown``: measured on Delta 4.4.0, it took 3-9 s per
    new snapshot of a small local table, against ~0 ms for the checksum's own field.
    """
    checksum = snapshot.checksumOpt()
    if checksum.isDefined() and checksum.get().setTransactions().isDefined():
        txns = checksum.get().setTransactions().get()
        for i in range(txns.size()):
            t = txns.apply(i)
            if t.appId() == app:
                return int(t.version())
        return None
    state = snapshot.transactions()
    return int(state.apply(app)) if state.contains(app) else None


@contextmanager
def session_conf(spark: SparkSession, values: dict[str, str]) -> Iterator[None]:
    """Set SQL options for the duration of the block, then restore what was there."""
    before = {k: spark.conf.get(k, None) for k in values}
    for k, v in values.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, old in before.items():
            if old is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, old)


def active_or_local_session(conf: Mapping[str, str]) -> SparkSession:
    """The running SparkSession, or, in a process that has none (``sparkonce verify`` and
    ``status`` reading a table), a small local one with ``conf`` (Delta's jars, extension and
    catalog), started once."""
    from pyspark.sql import SparkSession

    spark = SparkSession.getActiveSession()
    if spark is None:
        from sparkonce.spark.session import build_session

        log.info("starting a local Spark session to read Delta tables")
        spark = build_session(
            master="local[1]",
            app_name="sparkonce-delta-reader",
            shuffle_partitions=1,
            quick_start=True,
            conf=conf,
        )
    return spark
