"""``sparkonce status``: a pipeline's owner epoch, committed offsets, lag and rows, read
from its sink's ledger."""

from __future__ import annotations

import argparse
import statistics
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    EXIT_FAIL,
    add_pipeline_and_sink,
)
from sparkonce.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers


def cmd_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from sparkonce.pipeline.status import holder_alive, open_status_sink, pipeline_status

    if not args.pipeline:
        raise ConfigError("--pipeline is required (or set SPARKONCE_PIPELINE)")
    if not args.sink:
        raise ConfigError("--sink is required (or set SPARKONCE_SINK)")
    sink, label = open_status_sink(args.sink)
    try:
        st = pipeline_status(sink, args.pipeline)
    finally:
        sink.close()
    console = Console()
    if st.owner is None:
        console.print(f"pipeline {args.pipeline!r} has never run against {label}")
        return EXIT_FAIL
    console.print(f"[bold]pipeline[/] {st.pipeline}   [bold]sink[/] {label}")
    alive = holder_alive(st.owner.holder)
    running = {True: ", running on this host", False: ", no longer running", None: ""}[alive]
    console.print(
        f"owner epoch {st.owner.epoch} (taken {st.owner.acquired_at:%Y-%m-%d %H:%M:%S %Z} by "
        f"{st.owner.holder}{running})"
    )
    if st.source:
        console.print(f"source: {st.source}", markup=False)
    last = f"{st.last_commit_at:%Y-%m-%d %H:%M:%S %Z}" if st.last_commit_at else "never"
    console.print(
        f"ledger: {st.batches} batches, {st.rows_committed} rows committed, last commit {last}"
    )
    if st.commit_seconds:
        took = sorted(st.commit_seconds)
        console.print(
            f"commit time: last {st.commit_seconds[-1]:.3f} s; over the last {len(took)} "
            f"commits median {statistics.median(took):.3f} s, max {took[-1]:.3f} s"
        )
    table = Table(title="committed offsets and lag")
    for col in ("topic", "partition", "committed", "latest", "lag"):
        table.add_column(col, justify="right" if col != "topic" else "left")
    for p in st.partitions:
        table.add_row(
            p.topic,
            str(p.partition),
            str(p.committed),
            "?" if p.latest is None else str(p.latest),
            "?" if p.lag is None else str(p.lag),
        )
    console.print(table)
    if st.source_note:
        console.print(f"[yellow]{st.source_note}[/]")
    for problem in st.ledger_problems:
        console.print(f"[red]ledger problem:[/] {problem}")
    return EXIT_FAIL if st.ledger_problems else 0


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser("status", help="owner epoch, committed offsets, lag, rows committed")
    add_pipeline_and_sink(p)
    p.set_defaults(func=cmd_status)
