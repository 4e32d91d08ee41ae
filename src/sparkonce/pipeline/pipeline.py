"""The public ``Pipeline``: a name, a source, a transform, a sink, a checkpoint, a trigger."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.config import OutputMode, Trigger, check_pipeline_name
from sparkonce.errors import ConfigError
from sparkonce.sinks.base import Sink
from sparkonce.sources.base import Source

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.faults import FaultPlan
    from sparkonce.pipeline.runner import BatchReport, RunReport


def _identity(df: DataFrame) -> DataFrame:
    return df


@dataclass(frozen=True)
class Pipeline:
    """An effectively-once streaming pipeline.

    Parameters
    ----------
    name:
        The pipeline's identity in the sink's ledger and owner table. Two runs
        with the same name and sink are the same logical pipeline: the newer
        one fences the older.
    source:
        A replayable source, e.g. :class:`~sparkonce.sources.EmbeddedLogSource`.
    sink:
        An effectively-once sink, e.g. :class:`~sparkonce.sinks.SQLiteSink`.
    checkpoint:
        Spark's checkpoint directory (a local path).
    transform:
        ``DataFrame -> DataFrame`` applied to the source's stream. Defaults to
        the identity. It may be non-deterministic: only one attempt of a batch
        ever commits into a transactional sink.
    trigger:
        ``"availableNow"`` (process what is there, then stop) or
        ``"processingTime=<interval>"``.
    output_mode:
        Spark's output mode for the transform's result (``"update"`` suits both
        stateless transforms and aggregations written with an upsert sink).
    stateful:
        Whether the transform keeps state across batches. ``None`` detects it
        from the query plan. A stateful pipeline refuses to resume from the
        ledger alone when its checkpoint (and so its state) is lost.
    """

    name: str
    source: Source
    sink: Sink
    checkpoint: str | Path
    transform: Callable[[DataFrame], DataFrame] = field(default=_identity)
    trigger: str | Trigger = "availableNow"
    output_mode: OutputMode = "update"
    stateful: bool | None = None

    def __post_init__(self) -> None:
        check_pipeline_name(self.name)
        if not isinstance(self.source, Source):
            raise ConfigError(
                f"pipeline {self.name!r}: source must be a sparkonce Source (for example "
                f"EmbeddedLogSource), got {type(self.source).__name__}"
            )
        if not isinstance(self.sink, Sink):
            raise ConfigError(
                f"pipeline {self.name!r}: sink must be a sparkonce Sink (for example SQLiteSink), "
                f"got {type(self.sink).__name__}"
            )
        if not isinstance(self.checkpoint, (str, Path)) or not str(self.checkpoint):
            raise ConfigError(
                f"pipeline {self.name!r}: checkpoint must be a directory path, "
                f"got {self.checkpoint!r}"
            )
        if "://" in str(self.checkpoint) and not str(self.checkpoint).startswith("file://"):
            raise ConfigError(
                f"pipeline {self.name!r}: checkpoint {str(self.checkpoint)!r} is not a local "
                "path; this version supports local checkpoint directories only"
            )
        if not callable(self.transform):
            raise ConfigError(f"pipeline {self.name!r}: transform must be a callable")
        object.__setattr__(self, "trigger", Trigger.parse(self.trigger))
        if self.output_mode not in ("append", "update", "complete"):
            raise ConfigError(
                f"pipeline {self.name!r}: output_mode {self.output_mode!r} must be 'append', "
                "'update' or 'complete'"
            )
        if self.stateful not in (None, True, False):
            raise ConfigError(f"pipeline {self.name!r}: stateful must be None, True or False")

    def with_overrides(
        self, *, sink_url: str | None = None, checkpoint: str | Path | None = None
    ) -> Pipeline:
        """A copy writing to another sink store and/or checkpoint (same table, mode, keys).

        The sink is moved by its inspector (:func:`sparkonce.sinks.inspect.relocate`).
        """
        import dataclasses

        from sparkonce.sinks.inspect import relocate

        changes: dict[str, object] = {}
        if sink_url:
            changes["sink"] = relocate(self.sink, sink_url)
        if checkpoint:
            changes["checkpoint"] = checkpoint
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore[arg-type]

    @property
    def checkpoint_path(self) -> Path:
        raw = str(self.checkpoint)
        return Path(raw.removeprefix("file://")).resolve()

    def run(
        self,
        spark: SparkSession,
        *,
        timeout: float | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        stop: threading.Event | None = None,
        faults: FaultPlan | None = None,
    ) -> RunReport:
        """Run until the trigger completes (``availableNow``) or ``timeout`` seconds pass.

        Raises :class:`~sparkonce.errors.FencedError` if a newer run takes the
        pipeline over, :class:`~sparkonce.errors.CheckpointLostError` if a stateful
        pipeline lost its checkpoint, and other :class:`SparkOnceError` subclasses
        for bad configuration or unreachable stores. Setting ``stop`` stops the run
        cleanly between commits and raises :class:`~sparkonce.errors.RunStopped`.
        ``faults`` is the run's fault plan (:mod:`sparkonce.faults`; ``sparkonce run``
        parses it from the environment); the default injects nothing.
        """
        from sparkonce.pipeline.runner import run_pipeline

        return run_pipeline(
            self, spark, timeout=timeout, on_batch=on_batch, stop=stop, faults=faults
        )
