"""The public ``Pipeline``: a name, a source (or several named sources), a transform, a sink
(or several named outputs), a checkpoint, a trigger."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkonce.config import OutputMode, Trigger, check_pipeline_name
from sparkonce.errors import ConfigError
from sparkonce.files import is_remote, join, location
from sparkonce.outputs.output_set import SINGLE_OUTPUT, OutputSet
from sparkonce.sinks.base import Sink
from sparkonce.sources.base import Source
from sparkonce.sources.source_set import SourceSet

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import DataFrame, SparkSession

    from sparkonce.faults import FaultPlan
    from sparkonce.observe.base import RunObserver
    from sparkonce.observe.report import BatchReport, RunReport
    from sparkonce.pipeline.explain import Explanation


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
        A replayable source, e.g. :class:`~sparkonce.sources.EmbeddedLogSource`. Give
        either ``source`` or ``sources``.
    sink:
        An effectively-once sink, e.g. :class:`~sparkonce.sinks.SQLiteSink`, for a
        pipeline with one output. Give either ``sink`` or ``outputs``.
    checkpoint:
        Spark's checkpoint directory: a local path, or a URL on any filesystem Spark's
        Hadoop reaches (``s3a://bucket/dir``, ``hdfs://namenode/dir``, ``abfs://...``),
        which a cluster's driver and executors share.
    transform:
        ``DataFrame -> DataFrame`` applied to the source's stream (with ``sources``: it
        takes ``{name: DataFrame}``, one streaming DataFrame per source; with ``outputs``:
        ``DataFrame -> {name: DataFrame}``, one streaming DataFrame per output, all
        derived from the one input). Defaults to the identity. It may be
        non-deterministic: only one attempt of a batch ever commits into a
        transactional sink, and with several stores, stable output gives every store
        the same rows.
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
    outputs:
        Several named outputs ``{name: sink}`` (see :mod:`sparkonce.outputs.output_set`):
        outputs whose sinks share a store commit in one transaction with one ledger row;
        stores commit one after the other. Names are 1-64 letters, digits and ``_``.
    stable_output:
        Write each batch's rows once (Parquet under ``<checkpoint>/sparkonce/stable``)
        before any sink commits, and commit every sink from that copy, so a replay never
        recomputes a batch. ``None`` (default): on when the outputs live in more than one
        store. ``True`` also serves a single ``sink`` (a Kafka sink's replay then needs no
        deterministic partitioning).
    sources:
        Several named sources ``{name: source}`` read by one query (see
        :mod:`sparkonce.sources.source_set`), for a stream-stream join: a batch's identity
        is the offsets of all of them together. Their topics must differ. Names are 1-64
        letters, digits and ``_``. ``pipeline.source`` is then their
        :class:`~sparkonce.sources.source_set.SourceSet`.
    """

    name: str
    source: Source = None  # type: ignore[assignment]  # set by __post_init__ (from sources)
    sink: Sink = None  # type: ignore[assignment]  # set by __post_init__ (from outputs)
    checkpoint: str | Path = ""
    transform: Callable[[Any], Any] = field(default=_identity)
    trigger: str | Trigger = "availableNow"
    output_mode: OutputMode = "update"
    stateful: bool | None = None
    outputs: Mapping[str, Sink] | None = None
    stable_output: bool | None = None
    sources: Mapping[str, Source] | None = None

    def __post_init__(self) -> None:
        check_pipeline_name(self.name)
        self._set_sources()
        if self.stable_output not in (None, True, False):
            raise ConfigError(f"pipeline {self.name!r}: stable_output must be None, True or False")
        sink: Sink | None = self.sink
        if isinstance(sink, OutputSet):  # dataclasses.replace() of a pipeline built here
            sink = None if self.outputs is not None else sink.outputs[SINGLE_OUTPUT]
        if self.outputs is not None:
            if sink is not None:
                raise ConfigError(
                    f"pipeline {self.name!r}: give either sink=... (one output) or "
                    "outputs={name: sink, ...}, not both"
                )
            if not isinstance(self.outputs, Mapping):
                raise ConfigError(
                    f"pipeline {self.name!r}: outputs must be a mapping {{name: sink}}, got "
                    f"{type(self.outputs).__name__}"
                )
            object.__setattr__(self, "outputs", dict(self.outputs))
        elif not isinstance(sink, Sink):
            raise ConfigError(
                f"pipeline {self.name!r}: sink must be a sparkonce Sink (for example SQLiteSink), "
                f"got {type(sink).__name__}; or give outputs={{name: sink, ...}}"
            )
        if not isinstance(self.checkpoint, (str, Path)) or not str(self.checkpoint):
            raise ConfigError(
                f"pipeline {self.name!r}: checkpoint must be a directory path, "
                f"got {self.checkpoint!r}"
            )
        location(self.checkpoint, f"pipeline {self.name!r}'s checkpoint")  # raises if malformed
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
        stable_root = join(self.checkpoint_location, "sparkonce", "stable")
        if self.outputs is not None:
            sink = OutputSet(
                self.outputs,
                stable=self.stable_output,
                stable_root=stable_root,
                checkpoint=self.checkpoint_location,
            )
        elif self.stable_output:
            assert sink is not None
            sink = OutputSet(
                {SINGLE_OUTPUT: sink},
                stable=True,
                stable_root=stable_root,
                checkpoint=self.checkpoint_location,
                single=True,
            )
        if isinstance(sink, OutputSet) and sink.stable and is_remote(self.checkpoint_location):
            raise ConfigError(
                f"pipeline {self.name!r}: stable output keeps each batch's copy under the "
                "checkpoint on a local filesystem, and the checkpoint "
                f"{self.checkpoint_location} is not local. Use a local checkpoint directory, "
                "or set stable_output=False (each store then commits on its own, so a "
                "non-deterministic transform may hand the stores different rows on a replay)"
            )
        object.__setattr__(self, "sink", sink)

    def _set_sources(self) -> None:
        """``source`` from ``source=`` or ``sources=`` (exactly one of them given)."""
        source: Source | None = self.source
        if isinstance(source, SourceSet) and self.sources is not None:
            source = None  # dataclasses.replace() of a pipeline built here
        if self.sources is not None:
            if source is not None:
                raise ConfigError(
                    f"pipeline {self.name!r}: give either source=... (one source) or "
                    "sources={name: source, ...}, not both"
                )
            if not isinstance(self.sources, Mapping):
                raise ConfigError(
                    f"pipeline {self.name!r}: sources must be a mapping {{name: source}}, got "
                    f"{type(self.sources).__name__}"
                )
            try:
                source = SourceSet(self.sources)
            except ConfigError as exc:
                raise ConfigError(f"pipeline {self.name!r}: {exc}") from None
            object.__setattr__(self, "sources", dict(self.sources))
        elif isinstance(source, SourceSet):
            object.__setattr__(self, "sources", dict(source.sources))
        elif not isinstance(source, Source):
            raise ConfigError(
                f"pipeline {self.name!r}: source must be a sparkonce Source (for example "
                f"EmbeddedLogSource), got {type(source).__name__}; or give "
                "sources={name: source, ...}"
            )
        object.__setattr__(self, "source", source)

    def with_overrides(
        self,
        *,
        sink_url: str | None = None,
        checkpoint: str | Path | None = None,
        source_uri: str | None = None,
    ) -> Pipeline:
        """A copy writing to another sink store and/or checkpoint (same table, mode, keys),
        and/or reading from another location of the same kind of source.

        The sink is moved by its inspector (:func:`sparkonce.sinks.inspect.relocate`), the
        source by :meth:`~sparkonce.sources.base.Source.relocated` (every option but the
        location kept; another kind of source is a ``ConfigError``).
        """
        import dataclasses

        from sparkonce.sinks.inspect import relocate

        changes: dict[str, object] = {}
        if sink_url and self.outputs is not None:
            groups = self.output_set.groups if self.output_set else []
            if len(groups) > 1:
                raise ConfigError(
                    f"pipeline {self.name!r}: --sink moves a pipeline's outputs to another "
                    f"store, but its outputs live in {len(groups)} stores; edit the pipeline "
                    "file to move them"
                )
            changes["outputs"] = {n: relocate(s, sink_url) for n, s in self.outputs.items()}
        elif sink_url:
            base = self.sink
            if isinstance(base, OutputSet):
                base = base.outputs[SINGLE_OUTPUT]
            assert base is not None
            changes["sink"] = relocate(base, sink_url)
        if checkpoint:
            changes["checkpoint"] = checkpoint
        if source_uri:
            changes["source"] = self.source.relocated(source_uri)
        return dataclasses.replace(self, **changes) if changes else self  # type: ignore[arg-type]

    def spark_conf(self) -> dict[str, str]:
        """Settings the SparkSession needs for this pipeline's source and sinks (for example
        Spark's Kafka connector jars, or a Delta Lake sink's jars and extension);
        :func:`sparkonce.build_session` takes them as ``conf``, and ``sparkonce run``
        passes them. A checkpoint on ``s3a://`` adds the fetched ``hadoop-aws`` jars."""
        from sparkonce.spark.session import filesystem_conf, merge_spark_conf

        return merge_spark_conf(
            self.source.spark_conf(),
            self.sink.spark_conf(),
            filesystem_conf(self.checkpoint_location),
        )

    def explain(self, spark: SparkSession) -> Explanation:
        """What this pipeline guarantees as configured, part by part, with the reason for
        each and what to change for a stronger guarantee (:mod:`sparkonce.pipeline.explain`).
        Reads the pipeline and Spark's analyzed plan of its transform; runs nothing and
        touches no store."""
        from sparkonce.pipeline.explain import explain

        return explain(self, spark)

    @property
    def output_set(self) -> OutputSet | None:
        """The pipeline's outputs as one sink (None for a single sink without stable output)."""
        return self.sink if isinstance(self.sink, OutputSet) else None

    @property
    def checkpoint_location(self) -> str:
        """The checkpoint as an absolute local path or a URL (:func:`sparkonce.files.location`)."""
        return location(self.checkpoint, "checkpoint")

    @property
    def checkpoint_path(self) -> Path:
        """The checkpoint as a local :class:`~pathlib.Path` (a local checkpoint only)."""
        if is_remote(self.checkpoint_location):
            raise ConfigError(
                f"pipeline {self.name!r}: the checkpoint {self.checkpoint_location} is not a "
                "local path; read it with "
                "sparkonce.spark.checkpoint.Checkpoint.open(location, spark)"
            )
        return Path(self.checkpoint_location)

    def run(
        self,
        spark: SparkSession,
        *,
        timeout: float | None = None,
        on_batch: Callable[[BatchReport], None] | None = None,
        stop: threading.Event | None = None,
        faults: FaultPlan | None = None,
        observer: RunObserver | None = None,
    ) -> RunReport:
        """Run until the trigger completes (``availableNow``) or ``timeout`` seconds pass.

        Raises :class:`~sparkonce.errors.FencedError` if a newer run takes the
        pipeline over, :class:`~sparkonce.errors.CheckpointLostError` if a stateful
        pipeline lost its checkpoint, and other :class:`SparkOnceError` subclasses
        for bad configuration or unreachable stores. Setting ``stop`` stops the run
        cleanly between commits and raises :class:`~sparkonce.errors.RunStopped`.
        ``faults`` is the run's fault plan (:mod:`sparkonce.faults`; ``sparkonce run``
        parses it from the environment); the default injects nothing. ``observer``
        (:class:`~sparkonce.observe.RunObserver`) is called as the run goes: for
        Prometheus metrics, :class:`~sparkonce.observe.metrics.MetricsObserver`.
        """
        from sparkonce.pipeline.runner import run_pipeline

        return run_pipeline(
            self,
            spark,
            timeout=timeout,
            on_batch=on_batch,
            stop=stop,
            faults=faults,
            observer=observer,
        )
