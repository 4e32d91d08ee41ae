"""Records on the command line: the input of ``log produce`` and ``kafka produce`` (each
--value, or stdin read in chunks), and the line ``log tail`` and ``kafka tail`` print."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any, TypeVar

from sparkonce.errors import ConfigError

# `log produce` and `kafka produce` read stdin in chunks of this many lines: memory stays
# bounded whatever the input's size, and a malformed line stops the input before any
# record of its chunk is sent.
PRODUCE_CHUNK_LINES = 10_000

_T = TypeVar("_T")


class _BadLine(ConfigError):
    """A line of input that is not a record; ``line`` counts from 1."""

    def __init__(self, where: str, line: int, problem: str) -> None:
        self.where, self.line = where, line
        super().__init__(f"{where}: {problem}")


def _add_record_options(q: argparse.ArgumentParser) -> None:
    """The options of ``log produce`` and ``kafka produce`` that :func:`_record_chunks` and
    the producers read: ``--value`` (repeatable), ``--key``, ``--separator``, ``--partition``."""
    q.add_argument(
        "--value", dest="values", action="append", default=[], help="a record (repeatable)"
    )
    q.add_argument("--key", default=None, help="key for every record")
    q.add_argument("--separator", default=None, help="split each line into KEY<sep>VALUE")
    q.add_argument("--partition", type=int, default=None, help="write to this partition")


def _record_chunks(
    args: argparse.Namespace, chunk_lines: int = PRODUCE_CHUNK_LINES
) -> Iterator[list[tuple[str | None, str]]]:
    """(key, value) of each --value, or else of each stdin line, in chunks.

    The --value records are one chunk. Stdin is read lazily, ``chunk_lines`` lines at a
    time, so memory stays bounded. A chunk is parsed whole before it is yielded: a
    malformed line raises :class:`_BadLine` before any record of its chunk is sent.
    """
    if args.values:
        yield [_parse_line(args, t, f"--value #{n}", n) for n, t in enumerate(args.values, 1)]
        return
    chunk: list[tuple[str | None, str]] = []
    for n, raw in enumerate(sys.stdin, 1):
        chunk.append(_parse_line(args, raw.rstrip("\n"), f"line {n}", n))
        if len(chunk) >= chunk_lines:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _parse_line(args: argparse.Namespace, text: str, where: str, n: int) -> tuple[str | None, str]:
    sep = args.separator
    if sep is None:
        return args.key, text
    if sep not in text:
        raise _BadLine(
            where,
            n,
            f"{text[:80]!r} has no separator {sep!r}; every line must be KEY<separator>VALUE "
            "when --separator is given.",
        )
    k, v = text.split(sep, 1)
    return k, v


def _stopped_at(bad: _BadLine, sent: int, verb: str, target: str) -> ConfigError:
    """The error for a malformed line after ``sent`` records of earlier lines went out."""
    if sent == 0:
        return ConfigError(f"{bad} Nothing was {verb}.")
    return ConfigError(
        f"{bad} Stopped there: the {sent} records of lines 1..{sent} were already {verb} "
        f"to {target} and stay there; lines {sent + 1}.. were not. Fix line {bad.line} and "
        f"send only lines {sent + 1} onwards (e.g. tail -n +{sent + 1} FILE | ...): "
        f"sending lines 1..{sent} again would add them again, as new records."
    )


def _print_record(r: Any) -> None:
    """One record as a tab-separated line: partition, offset, record id, key, value."""
    key = r.key.decode(errors="replace") if r.key is not None else ""
    value = r.value.decode(errors="replace") if r.value is not None else ""
    print(f"{r.partition}\t{r.offset}\t{r.record_id or ''}\t{key}\t{value}")


def _chain_first(first: _T, rest: Iterator[_T]) -> Iterator[_T]:
    if first:
        yield first
    yield from rest
