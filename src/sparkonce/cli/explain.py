"""``sparkonce explain``: what a pipeline file guarantees as configured, and why."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from sparkonce.cli.common import (
    FILE_EXPECTED,
    MASTER_EXPECTED,
    _check_file,
    _check_master,
    _env,
    _env_checked,
    _help,
)
from sparkonce.cli.logs import _LOGGED_TO_FILE, _default_log_file, _log_to_file

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.pipeline.explain import Explanation


def cmd_explain(args: argparse.Namespace) -> int:
    """Load the pipeline file, build its query on a Spark session (nothing runs, no store
    is touched) and print the explanation: a table, or JSON with ``--json``."""
    import logging

    from sparkonce.pipeline.loader import load_pipeline
    from sparkonce.pipeline.spark import build_session

    pipeline = load_pipeline(args.pipeline_file)
    log_file = Path(args.log_file) if args.log_file else _default_log_file(pipeline.name)
    file_handler = _log_to_file(log_file)
    from pyspark.sql import SparkSession

    ours = SparkSession.getActiveSession() is None  # a caller's session (tests) stays up
    try:
        spark = build_session(
            master=args.master,
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
    finally:
        for name in _LOGGED_TO_FILE:
            logging.getLogger(name).removeHandler(file_handler)
        file_handler.close()
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
    p.add_argument(
        "--master",
        type=_env_checked("--master", MASTER_EXPECTED, _check_master),
        default=_env("SPARKONCE_MASTER", "local[2]"),
        help=_help("Spark master URL, default local[2]", "SPARKONCE_MASTER"),
    )
    p.add_argument(
        "--log-file",
        type=_env_checked("--log-file", FILE_EXPECTED, _check_file),
        default=_env("SPARKONCE_LOG_FILE"),
        help=_help("write Spark's log here", "SPARKONCE_LOG_FILE"),
    )
    p.set_defaults(func=cmd_explain)
