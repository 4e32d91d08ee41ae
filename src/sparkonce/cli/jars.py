"""``sparkonce jars``: the JVM jars of Delta, Spark's Kafka connector and ``s3a://``, for an
installed wheel; a thin shell over :func:`sparkonce.spark.jars.fetch_jars`.

``jars fetch [KIND ...]`` downloads them from Maven Central (pinned versions, checked by
SHA-256) into the user's cache, where sessions find them; ``--dir DIR`` puts them in DIR
instead (then set ``SPARKONCE_JAR_CACHE=DIR``). ``jars list`` shows each kind's Maven
coordinates and where a session would take its jars from now.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from sparkonce.cli.common import SubParsers
    from sparkonce.spark.jars import Artifact


def cmd_jars_fetch(args: argparse.Namespace) -> int:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TransferSpeedColumn,
    )

    from sparkonce.spark.jars import (
        DEFAULT_KINDS,
        JAR_CACHE_ENV,
        JAR_SETS,
        fetch_jars,
        user_jar_cache,
    )

    kinds = list(dict.fromkeys(args.kinds or DEFAULT_KINDS))
    dest = Path(args.dir).resolve() if args.dir else user_jar_cache()
    total = sum(a.size for k in kinds if k in JAR_SETS for a in JAR_SETS[k])
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        transient=True,
        disable=not sys.stderr.isatty(),
    ) as bar:
        task = bar.add_task("sparkonce jars", total=total)

        def advance(artifact: Artifact, size: int) -> None:
            bar.update(task, advance=size, description=artifact.file_name)

        fetched = fetch_jars(kinds, dest, repository=args.repository, progress=advance)
    for kind, jars in fetched.items():
        print(f"{kind}: {len(jars)} jars in {dest / kind}")
    cache = os.environ.get(JAR_CACHE_ENV)
    if args.dir and (cache is None or Path(cache).resolve() != dest):
        print(f"sessions find them with {JAR_CACHE_ENV}={dest}")
    return 0


def cmd_jars_list(args: argparse.Namespace) -> int:
    from sparkonce.spark.jars import JAR_SETS, KIND_ENV, find_jars

    for kind, artifacts in JAR_SETS.items():
        found = find_jars(kind)
        where = f"found in {Path(found[0]).parent}" if found else "not found"
        print(f"{kind} ({where}; ${KIND_ENV[kind]} names a directory of its own)")
        for artifact in artifacts:
            print(f"  {artifact.coordinate}  {artifact.size} bytes  sha256 {artifact.sha256}")
    return 0


def add_parser(sub: SubParsers) -> None:
    from sparkonce.spark.jars import DEFAULT_KINDS, JAR_SETS, MAVEN_CENTRAL

    p = sub.add_parser(
        "jars",
        help="fetch the jars of Delta, Spark's Kafka connector and s3a:// (installed wheel)",
        description=(
            "The JVM jars a session needs for DeltaSink, SparkKafkaSource and s3a:// paths. "
            "An installed wheel does not carry them: `sparkonce jars fetch` downloads the "
            "pinned versions from Maven Central, checks each one's SHA-256, and puts them "
            "where sessions find them."
        ),
    )
    jars_sub = p.add_subparsers(dest="jars_command", metavar="{fetch,list}", required=True)
    fetch = jars_sub.add_parser(
        "fetch",
        help="download the pinned jars (by default those of Delta and the Kafka connector)",
        description=(
            "Download the pinned jars of each KIND into the user's cache "
            "($XDG_CACHE_HOME/sparkonce/jars, else ~/.cache/sparkonce/jars), where sessions "
            "find them with no setting; or into --dir DIR, then set SPARKONCE_JAR_CACHE=DIR. "
            "A jar already there with the pinned SHA-256 is kept; a download that is not the "
            "pinned jar fails and nothing of it is kept."
        ),
    )
    fetch.add_argument(
        "kinds",
        nargs="*",
        metavar="KIND",
        help=(
            f"{', '.join(JAR_SETS)} (default: {' '.join(DEFAULT_KINDS)}; s3 is about 690 MB, "
            "for s3a:// paths only)"
        ),
    )
    fetch.add_argument("--dir", help="put the jars in DIR/<kind>/ instead of the user's cache")
    fetch.add_argument(
        "--repository",
        default=MAVEN_CENTRAL,
        help="a Maven repository URL serving Maven Central's files (default: %(default)s)",
    )
    fetch.set_defaults(func=cmd_jars_fetch)
    listing = jars_sub.add_parser(
        "list", help="each kind's Maven coordinates, and where a session finds its jars now"
    )
    listing.set_defaults(func=cmd_jars_list)
