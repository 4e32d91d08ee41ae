"""``sparkonce reset``: forget a pipeline's progress in one sink, so its next run starts from
the source's beginning with epoch 1.

What a pipeline's progress is depends on the sink's family (see :func:`reset_pipeline`):

- SQLite and PostgreSQL: its rows in ``sparkonce_ledger`` and its row in ``sparkonce_owner``;
  on a two-phase PostgreSQL sink also its pre-committed attempts that never committed, and
  their rows (invisible pre-commits of batches the reset forgets);
- Kafka (``kafka://HOST:PORT/TOPIC``): the records of the ledger topic
  ``TOPIC.sparkonce-ledger``, which Kafka can only drop all together (``delete_records``),
  so the reset is refused while another pipeline's records are in it;
- Delta (``delta:///ROOT/TABLE``): a version in the table's own Delta log, which goes only
  with the table, so a Delta reset needs ``output_rows=True``;
- Iceberg (``iceberg+sqlite:////ABS/catalog.db?table=NS.NAME``): snapshot summaries and
  table properties, which likewise go only with the table (``output_rows=True``).

The user's output is kept unless ``output_rows=True`` (a two-phase sink's output is its
view or table, its data or stage table, and the pipeline's attempts of that output). The
reset is refused, before anything is deleted, while the run that holds the pipeline's
epoch is alive (:func:`~sparkonce.pipeline.status.holder_alive`). The work is done by the
store's inspector (:meth:`sparkonce.sinks.inspect.Inspector.reset`), the code
``sparkonce verify`` uses to clean its stores.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from sparkonce.errors import ConfigError, PipelineRunningError
from sparkonce.ledger.base import Owner
from sparkonce.sinks.base import Sink

RUNBOOK = "docs/operations/reset.md"


@dataclass(frozen=True)
class ResetPlan:
    """What :func:`reset_pipeline` deletes (or deleted), one line per item, as shown to the
    user before the confirmation."""

    pipeline: str
    sink: str  # as the user named it, password masked
    owner: Owner | None
    batches: int  # the pipeline's ledger entries
    progress: tuple[str, ...]  # the pipeline's progress records that go
    output: tuple[str, ...]  # the output that goes too (empty unless output_rows=True)
    done: bool = False
    precommits: int = 0  # a two-phase sink's attempts of the pipeline that never committed

    @property
    def empty(self) -> bool:
        """Nothing to delete: the pipeline never ran against this sink."""
        return self.owner is None and self.batches == 0 and not self.output and not self.precommits


# A ledger-only reset of a SQL sink names no output table, and the inspector's reset with
# output=False never touches the sink's table: this name only completes the sink object.
_LEDGER_ONLY_TABLE = "sparkonce_reset_keeps_the_output"


def _open(pipeline: str, url: str, table: str | None, output_rows: bool) -> tuple[Sink, str]:
    """The sink whose progress reset deletes, opened, and its URL with the password masked.

    Reset needs the sink (its inspector deletes the records), not only the ledger that
    ``status`` reads, so it builds one through the URL registry. A PostgreSQL store that
    holds a two-phase sink's output ``table`` (its data or stage table exists: names only
    that sink creates) or attempts of ``pipeline`` gets a two-phase sink, whose inspector
    also drops the view and the data and stage tables and deletes the attempts."""
    from sparkonce.config import StoreURL, mask_url
    from sparkonce.sinks.registry import sink_for_url, store_kind
    from sparkonce.sinks.sql import SqlSink

    kind = store_kind(url)
    if kind.name in ("kafka", "delta", "iceberg"):
        if table is not None:
            raise ConfigError(
                f"--table is for SQLite and PostgreSQL sinks; {kind.name} URLs name "
                "their topic or table themselves"
            )
        if kind.name == "delta":
            from sparkonce.sinks.delta import DeltaSink, delta_path

            path = delta_path(url).rstrip("/")
            root, _, name = path.rpartition("/")
            delta = DeltaSink(root or "/", table=name)
            if not delta.table.exists():
                raise ConfigError(
                    f"no Delta table at {path}: give the table's own directory, as in "
                    "delta:///ROOT/TABLE for DeltaSink('/ROOT', table='TABLE')"
                )
            delta.open()
            return delta, mask_url(url)
        sink = sink_for_url(url)
        sink.open()
        return sink, mask_url(url)
    if output_rows and table is None:
        raise ConfigError(
            "deleting the output rows of a SQLite or PostgreSQL sink needs the output table's "
            "name: pass --table TABLE (the sink's table, as in SQLiteSink(url, 'TABLE'))"
        )
    parsed = StoreURL.parse(url)
    if parsed.scheme == "sqlite" and parsed.path is not None and not parsed.path.exists():
        raise ConfigError(f"SQLite sink file {str(parsed.path)!r} does not exist")
    sink = sink_for_url(url, table or _LEDGER_ONLY_TABLE)
    sink.open()
    if parsed.scheme == "postgresql" and isinstance(sink, SqlSink):
        from sparkonce.sinks.twophase import PostgresTwoPhaseSink, holds_two_phase

        try:
            two_phase = holds_two_phase(sink.conn, pipeline, table)
        except BaseException:
            sink.close()
            raise
        if two_phase:
            sink.close()
            # Its mode does not matter here: the inspector drops the output by its kind
            # (view or table), and a reset never writes.
            sink = PostgresTwoPhaseSink(parsed, table or _LEDGER_ONLY_TABLE)
            sink.open()
    return sink, str(parsed)


def _check_not_running(pipeline: str, owner: Owner | None, holder_stopped: bool) -> None:
    from sparkonce.pipeline.status import holder_alive

    if owner is None:
        return
    alive = holder_alive(owner.holder)
    if alive:
        raise PipelineRunningError(
            f"pipeline {pipeline!r}: the run holding epoch {owner.epoch} ({owner.holder}) is "
            "still alive on this host. Nothing was deleted. Operator action: stop that run "
            "(SIGTERM stops it cleanly between commits), then run the reset again."
        )
    if alive is None and not holder_stopped:
        raise PipelineRunningError(
            f"pipeline {pipeline!r}: epoch {owner.epoch} is held by {owner.holder!r}, a "
            "process this host cannot check. Nothing was deleted. Operator action: make "
            "sure that run is stopped, then run the reset again with --holder-stopped."
        )


def _describe(
    sink: Sink,
    pipeline: str,
    owner: Owner | None,
    batches: int,
    output_rows: bool,
    precommits: dict[str, list[int]],
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    from sparkonce.sinks.delta import DeltaSink
    from sparkonce.sinks.kafka import KafkaSink
    from sparkonce.sinks.sql import SqlSink
    from sparkonce.sinks.twophase import (
        ATTEMPTS_TABLE,
        DATA_SUFFIX,
        STAGE_SUFFIX,
        PostgresTwoPhaseSink,
    )

    progress: tuple[str, ...]
    held = f"epoch {owner.epoch}, taken by {owner.holder}" if owner else "none"
    others = sorted(set(sink.pipelines()) - {pipeline})
    if isinstance(sink, KafkaSink):
        if others:
            raise ConfigError(
                f"pipeline {pipeline!r}: the ledger topic {sink.ledger_topic} also holds the "
                f"progress of {', '.join(others)}, and Kafka can only delete all of its records "
                "together. Nothing was deleted. Reset needs a ledger topic of one pipeline; run "
                "this pipeline under a new name instead."
            )
        progress = (
            f"every record of the ledger topic {sink.ledger_topic}: {batches} batch entries "
            f"of {pipeline!r} and its owner records ({held})",
        )
        output = (f"every record of the output topic {sink.topic}",) if output_rows else ()
        return progress, output
    if isinstance(sink, DeltaSink):
        if not output_rows:
            raise ConfigError(
                f"pipeline {pipeline!r}: a Delta table's ledger lives in the table's own Delta "
                f"log ({sink.path}), which cannot forget a pipeline while keeping the rows. "
                "Nothing was deleted. Delete the output too (--output-rows), or run the "
                "pipeline under a new name."
            )
        also = f" and the progress of {', '.join(others)}" if others else ""
        progress = (
            f"{pipeline!r}'s {batches} entry files and owner files under "
            f"{sink.path}/_sparkonce/ and its version in the table's Delta log ({held}){also}",
        )
        output = (f"the whole Delta table directory {sink.path}: every row, and its Delta log",)
        return progress, output
    # IcebergSink needs the iceberg extra: when its module is not loaded, no sink is one.
    iceberg = sys.modules.get("sparkonce.sinks.iceberg")
    if iceberg is not None and isinstance(sink, iceberg.IcebergSink):
        if not output_rows:
            raise ConfigError(
                f"pipeline {pipeline!r}: an Iceberg table's ledger lives in its snapshots' "
                f"summaries and table properties ({sink.describe()}), which cannot forget a "
                "pipeline while keeping the rows. Nothing was deleted. Delete the output too "
                "(--output-rows), or run the pipeline under a new name."
            )
        also = f" and the progress of {', '.join(others)}" if others else ""
        progress = (
            f"{pipeline!r}'s {batches} ledger entries and owner epoch in the snapshots and "
            f"properties of {sink.describe()} ({held}){also}",
        )
        output = (
            f"the whole Iceberg table {sink.table}: dropped from catalog "
            f"{sink.catalog.name!r}, and its directory (rows, metadata, staging) deleted",
        )
        return progress, output
    if isinstance(sink, SqlSink):
        from sparkonce.ledger.sql import LEDGER_TABLE, OWNER_TABLE

        progress = (
            f"{batches} rows of {pipeline!r} in {LEDGER_TABLE}",
            f"{1 if owner else 0} row of {pipeline!r} in {OWNER_TABLE} ({held})",
        )
        if not isinstance(sink, PostgresTwoPhaseSink):
            output = (f"the output table {sink.table}: dropped, every row",) if output_rows else ()
            return progress, output
        n = sum(len(ids) for ids in precommits.values())
        where = ", ".join(f"{t}{DATA_SUFFIX} or {t}{STAGE_SUFFIX}" for t in sorted(precommits))
        progress += (
            f"{n} pre-committed attempt{'' if n == 1 else 's'} of {pipeline!r} in "
            f"{ATTEMPTS_TABLE}{f', and their rows in {where}' if where else ''}: invisible "
            "pre-commits of batches the reset forgets (never committed, never shown)",
        )
        t = sink.table
        output = (
            (
                f"the two-phase output {t}: its view (or table) {t} and its tables "
                f"{t}{DATA_SUFFIX} and {t}{STAGE_SUFFIX}, dropped, every row; and the "
                f"attempts of {pipeline!r} into {t} in {ATTEMPTS_TABLE}",
            )
            if output_rows
            else ()
        )
        return progress, output
    raise ConfigError(f"{type(sink).__name__} cannot be reset by sparkonce reset")


def reset_pipeline(
    pipeline: str,
    sink_url: str,
    *,
    output_rows: bool = False,
    table: str | None = None,
    holder_stopped: bool = False,
    confirm: Callable[[ResetPlan], bool] | None = None,
) -> ResetPlan:
    """Forget ``pipeline``'s progress (owner epoch and ledger) in the sink at ``sink_url``,
    so that its next run starts from the source's beginning with epoch 1.

    ``sink_url``: as for ``sparkonce status`` (``sqlite:///PATH``, ``postgresql://...``,
    ``kafka://HOST:PORT/TOPIC``, ``delta:///ROOT/TABLE``,
    ``iceberg+sqlite:////ABS/catalog.db?table=NS.NAME``). The output (the user's rows) is
    kept unless ``output_rows`` is True; for SQLite and PostgreSQL, deleting it needs its
    ``table``. ``confirm`` is called with the plan before anything is deleted; when it
    returns False nothing is, and the plan comes back with ``done=False``.

    Raises :class:`~sparkonce.errors.PipelineRunningError` while the run holding the
    pipeline's epoch is alive, or runs on another host (unless ``holder_stopped``: the
    caller has made sure it is stopped); :class:`~sparkonce.errors.ConfigError` for a reset
    the sink cannot do (see the module docstring);
    :class:`~sparkonce.errors.StoreUnavailableError` for a store that does not answer.
    Nothing is deleted when it raises before ``confirm``.
    """
    from dataclasses import replace

    from sparkonce.sinks.inspect import inspector_for
    from sparkonce.sinks.twophase import PostgresTwoPhaseSink, precommitted

    sink, label = _open(pipeline, sink_url, table, output_rows)
    try:
        owner = sink.owner(pipeline)
        batches = len(sink.ledger(pipeline))
        _check_not_running(pipeline, owner, holder_stopped)
        pending = (
            precommitted(sink.conn, pipeline) if isinstance(sink, PostgresTwoPhaseSink) else {}
        )
        progress, output = _describe(sink, pipeline, owner, batches, output_rows, pending)
        plan = ResetPlan(
            pipeline,
            label,
            owner,
            batches,
            progress,
            output,
            precommits=sum(len(ids) for ids in pending.values()),
        )
        if plan.empty or (confirm is not None and not confirm(plan)):
            return plan
        inspector_for(sink).reset(pipeline, output=output_rows)
        return replace(plan, done=True)
    finally:
        sink.close()
