"""Child process of the reference run: ``python -m sparkonce.verify.reference_run FILE ...``.

Loads the pipeline file, builds a session like ``sparkonce run`` does, and runs
:func:`sparkonce.verify.reference.record`. It never opens the pipeline's sink.
Exit status 0 when the run finished, 1 otherwise (the reason on stderr).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparkonce.verify.reference_run")
    parser.add_argument("pipeline_file")
    parser.add_argument("--out", required=True, help="JSON-lines file, one line per batch")
    parser.add_argument("--checkpoint", required=True, help="a fresh checkpoint directory")
    parser.add_argument("--master", default=os.environ.get("SPARKONCE_MASTER") or "local[2]")
    parser.add_argument("--quick-start", action="store_true")
    args = parser.parse_args(argv)

    from sparkonce.errors import SparkOnceError
    from sparkonce.pipeline.loader import load_pipeline
    from sparkonce.spark.session import build_session
    from sparkonce.verify.reference import record

    try:
        pipeline = load_pipeline(args.pipeline_file)
        spark = build_session(
            master=args.master,
            app_name=f"sparkonce-reference:{pipeline.name}",
            quick_start=args.quick_start,
            conf=pipeline.spark_conf(),
        )
        try:
            batches = record(pipeline, spark, Path(args.out), Path(args.checkpoint))
        finally:
            spark.stop()
    except SparkOnceError as exc:
        print(f"reference run: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    print(f"reference run of {pipeline.name}: {batches} micro-batches into {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
