"""``sparkonce explain``: what a pipeline file guarantees as configured, and why."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from sparkonce.cli.common import add_spark_options, spark_target
from sparkonce.cli.logs import spark_log_file

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.pipeline.explain import Explanation


def cmd_explain(args: argparse.Namespace) -> int:
    """Load the pipeline file, build its query on a Spark session (nothing runs, no store
    is touched) and print the explanation: a table, or JSON with ``--json``."""
    from sparkonce.pipeline.loader import load_pipeline
    from sparkonce.spark.session import build_session

    pipeline = load_pipeline(args.pipeline_file)
    from pyspark.sql import SparkSession

    ours = SparkSession.getActiveSession() is None  # a caller's session (tests) stays up
    with spark_log_file(pipeline.name, args.log_file) as log_file:
        master, remote = spark_target(args)
        spark = build_session(
            master=master,
            remote=remote,
            app_name=f"sparkonce-explain:{pipeline.name}",
            quick_start=True,
            log_file=log_file,
            conf=pipeline.spark_conf(),
        )
        try:
            exp = pipeline.explain(spark)
        finally:
            if ours:
                spark.stop()
    if args.json:
        print(json.dumps(exp.to_dict(), indent=2))
    else:
        _print(exp)
    return 0


def _print(exp: Explanation) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console()
    table = Table(title=f"pipeline {exp.pipeline}", show_lines=True)
    table.add_column("part", no_wrap=True)
    table.add_column("guarantee / status")
    table.add_column("what, why, and what to change for a stronger guarantee", ratio=1)
    for p in exp.parts:
        detail = Text(p.what, style="bold")
        detail.append(f"\n{p.why}")
        if p.to_strengthen:
            detail.append(f"\nto strengthen: {p.to_strengthen}", style="yellow")
        table.add_row(p.part, p.verdict, detail)
    console.print(table)
    console.print(f"[bold]pipeline guarantee:[/] {exp.guarantee}", highlight=False)
    console.print(f"why: {exp.why}", highlight=False, markup=False)


def add_parser(sub: SubParsers) -> None:
    p = sub.add_parser(
        "explain",
        help="what a pipeline file guarantees as configured, part by part, and why",
        description="Print the guarantee of each part of the pipeline (source, transform, "
        "state, checkpoint, each output) and of the whole pipeline, with the reason for each "
        "and what to change for a stronger one. Reads the pipeline object and Spark's "
        "analyzed plan; runs nothing and touches no store.",
    )
    p.add_argument("pipeline_file")
    p.add_argument("--json", action="store_true", help="print the same content as JSON")
    add_spark_options(p, "write Spark's log here")
    p.set_defaults(func=cmd_explain)
