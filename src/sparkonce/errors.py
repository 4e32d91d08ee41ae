"""The one error hierarchy of sparkonce.

Every error sparkonce raises derives from :class:`SparkOnceError`. Each class says
whether retrying the same call can help (``retryable``) and its message names the
ids involved (pipeline, epoch, partition, offsets, host) and ends with what to do.

This module imports nothing from the rest of the package.
"""

from __future__ import annotations

# Where the runbooks are, one per error an operator can meet (the docs site's operations
# section); messages name the one to read.
RUNBOOKS = "docs/operations"


class SparkOnceError(Exception):
    """Root of every sparkonce error.

    ``retryable`` is True when the same operation may succeed if tried again
    (a database that is restarting, say). Terminal errors need an operator.
    """

    retryable: bool = False


class ConfigError(SparkOnceError, ValueError):
    """A pipeline, source or sink was configured with a bad value.

    The message names the field, the bad value (never a secret) and what is
    expected instead. Nothing was read or written.
    """


class RecordVersionError(ConfigError):
    """A stored record carries a format version newer than this sparkonce reads.

    Ledger entries, fault events and ``verify.json`` each record the version of their
    format (:mod:`sparkonce.records`); a newer sparkonce wrote this one. The message names
    the record (its file, table or topic) and what to do: read or run it with a sparkonce
    at least as new as the one that wrote it. Nothing was changed.
    """


class SourceError(SparkOnceError):
    """A source could not be read as configured (missing topic, bad offsets)."""


class TopicNotFoundError(SourceError, LookupError):
    """The named topic does not exist in the log."""


class OffsetOutOfRangeError(SourceError):
    """A partition no longer holds (or never held) an offset that was asked for.

    Retention or ``delete_records`` removed the records, or the topic was deleted
    and created again. ``log_start`` is the partition's first offset when it could
    be read (None otherwise). Nothing was skipped: the read stopped.
    """

    def __init__(
        self, message: str, *, topic: str, partition: int, offset: int, log_start: int | None
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.log_start = log_start


class SequenceError(SourceError):
    """An idempotent producer sent a sequence number that skips ahead.

    The append was refused and nothing was written. A gap means records between
    the last acknowledged sequence and this one were never appended: resend them
    first, in order.
    """


class StoreUnavailableError(SparkOnceError, ConnectionError):
    """A store sparkonce reads or writes could not be reached in time.

    The store is a sink's database or a Kafka cluster (source, sink or ledger
    topic). The message names its address (never a secret). Retrying may help
    once the store is back; the CLI exits with code 4.
    """

    retryable = True


class KafkaUnavailableError(StoreUnavailableError):
    """The Kafka cluster did not answer in time (metadata, offsets, reads or writes).

    Raised for the Kafka source, the Kafka sink and its ledger topic, and the
    ``sparkonce kafka`` commands alike; the message names the bootstrap servers.
    ``kind`` says what happened (``sparkonce.kafka.client``: ``"no answer"``, ``"leader
    moved"``, ``"transaction open"``, ``"fatal"``); the first two are transient.
    """

    kind: str = "no answer"


class SparkServerUnavailableError(StoreUnavailableError):
    """The Spark Connect server of the run's session stopped answering (its client's retries
    ran out). The streaming query ran in that server and ended with it; what it committed
    is in the sink's ledger, so a run started once the server is back resumes from there.
    The CLI exits with code 4, as for an unreachable store."""


class SinkError(SparkOnceError):
    """A sink refused a write (schema mismatch, constraint violation, bad rows)."""


class SinkUnavailableError(SinkError, StoreUnavailableError):
    """The sink's store could not be reached after bounded retries."""

    retryable = True


class FencedError(SinkError):
    """A newer run owns the pipeline; this run's epoch is no longer current.

    Raised at step 1 of the commit protocol. The batch was not committed and the
    run must stop: continuing would let a zombie write beside its successor.
    """

    def __init__(
        self,
        pipeline: str,
        epoch: int,
        owner_epoch: int,
        inspect_hint: str = "",
        holder: str = "",
    ) -> None:
        self.pipeline = pipeline
        self.epoch = epoch
        self.owner_epoch = owner_epoch
        self.holder = holder
        hint = inspect_hint or f"sparkonce status --pipeline {pipeline} --sink <SINK_URL>"
        by = f" (taken by {holder})" if holder else ""
        super().__init__(
            f"pipeline {pipeline!r}: this run holds epoch {epoch}, but the sink's owner epoch "
            f"is now {owner_epoch}{by}, so a newer run owns the pipeline. This run was fenced "
            "and its batch was not committed. Operator action: check that the run holding "
            f"epoch {owner_epoch} is alive (its host and pid are shown by: {hint}); if it is, "
            "let it continue and stop this process; if it is not, start the pipeline again "
            f"(runbook: {RUNBOOKS}/fenced.md)."
        )


class LedgerError(SinkError):
    """The ledger contradicts the batch being committed (a broken invariant).

    Examples: the batch starts after the ledger's end offsets (a gap, so records
    would be skipped), or it overlaps them only in part. Nothing was committed.
    """


class CheckpointError(SparkOnceError):
    """Spark's checkpoint and the ledger disagree in a way sparkonce cannot repair."""


class CheckpointLostError(CheckpointError):
    """A stateful pipeline found an empty checkpoint but a non-empty ledger.

    Its aggregation state lived in the lost checkpoint, so resuming from the
    ledger alone would silently restart every aggregate from zero.
    """


class RunStopped(SparkOnceError):
    """A run was asked to stop (SIGTERM or SIGINT, or its stop event) and stopped cleanly.

    No batch was in the middle of its commit when the query stopped; committed batches
    are safe, and the next run resumes after the last one. ``signal_number`` is the
    signal that asked for the stop (None when the caller's event did).
    """

    def __init__(self, message: str, signal_number: int | None = None) -> None:
        super().__init__(message)
        self.signal_number = signal_number


class PipelineRunningError(SparkOnceError):
    """A run still holds the pipeline's epoch and is alive, so its progress cannot be reset.

    Raised by :func:`sparkonce.reset_pipeline` (``sparkonce reset``) before anything was
    deleted. The message names the holder (host and pid). Stop that run first; if it runs on
    another host, where its process cannot be checked, make sure it is stopped and say so
    (``--holder-stopped``). The CLI exits with code 5.
    """


class PipelineError(SparkOnceError):
    """A pipeline run failed for a reason other than the above (see ``__cause__``)."""


class VerificationError(SparkOnceError):
    """A verification trial found a sink whose content differs from the oracle."""


class JarFetchError(SparkOnceError):
    """A pinned jar could not be downloaded, or the download was not that jar
    (``sparkonce jars fetch``)."""
