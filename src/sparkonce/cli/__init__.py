"""The ``sparkonce`` command: a thin shell over the public API.

``main()`` is the only place that turns exceptions into messages and exit
codes; ``--debug`` re-raises instead. Each subcommand imports its
implementation lazily, so ``sparkonce --help`` does not start Spark.

Exit codes: 0 success, 1 failure (a FAIL, a failed run), 2 bad input (including a
bad command line or environment variable), 3 fenced by a newer run, 4 a store or
source unreachable, 5 ``reset`` refused while a live run holds the pipeline, 130
interrupted (Ctrl-C); ``run`` stops cleanly between commits on SIGINT and SIGTERM and
exits 130 and 143. Every failure ends with one line on stderr,
``sparkonce: ...``; ``--debug`` adds the traceback.

One module per command group, each with its ``cmd_*`` functions and an
``add_parser(sub)`` that declares its options: :mod:`.run`, :mod:`.status`, :mod:`.reset`,
:mod:`.explain`, :mod:`.embedded_log` (``log ...``), :mod:`.kafka` (``kafka ...``),
:mod:`.verify`, :mod:`.ui` (the live status page), :mod:`.demo` and :mod:`.jars` (the
JVM jars of an installed wheel). :mod:`.common`
holds the exit codes, the environment-variable defaults and argparse types, and the
error-to-exit-code mapping; :mod:`.logs` the logging setup; :mod:`.records` the
record input and output that ``log`` and ``kafka`` share.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from sparkonce.cli import (
    demo,
    embedded_log,
    explain,
    jars,
    kafka,
    reset,
    run,
    status,
    ui,
    verify,
)
from sparkonce.cli.common import (
    EXIT_FAIL,
    EXIT_FENCED,
    EXIT_INTERRUPTED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    _report,
    _silence_stdout,
)
from sparkonce.cli.logs import _setup_logging
from sparkonce.cli.verify import _write_chart

__all__ = [
    "EXIT_FAIL",
    "EXIT_FENCED",
    "EXIT_INTERRUPTED",
    "EXIT_UNAVAILABLE",
    "EXIT_USAGE",
    "_report",
    "_write_chart",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sparkonce",
        description="Effectively-once streaming pipelines on Apache Spark.",
    )
    parser.add_argument("--debug", action="store_true", help="re-raise errors with tracebacks")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in (run, status, reset, explain, ui, embedded_log, kafka, verify, demo, jars):
        group.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command in ``argv``; returns the exit code (see the module docstring).

    Every failure ends with one line on stderr: ``sparkonce: <what>: <message>``.
    ``--debug`` re-raises instead, with the traceback. A usage error (bad option, bad
    environment variable) is argparse's own message and exit code 2.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _setup_logging(args.verbose, args.debug)
        return int(args.func(args))
    except KeyboardInterrupt:
        if args.debug:
            raise
        print("sparkonce: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader of stdout went away (e.g. `sparkonce log tail ... | head`): stop
        # quietly, and keep the interpreter from complaining when it flushes stdout.
        _silence_stdout()
        return EXIT_FAIL
    except Exception as exc:
        if args.debug:
            raise
        return _report(exc)
