"""What every command shares: exit codes, option defaults read from the environment,
argparse types, and the mapping of an error to its one line and exit code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from sparkonce.errors import (
    ConfigError,
    FencedError,
    RunStopped,
    SinkUnavailableError,
    SparkOnceError,
)
from sparkonce.kafka.client import KafkaUnavailableError

if TYPE_CHECKING:  # pragma: no cover
    # What ``add_subparsers()`` returns; each command module adds its parsers to it.
    SubParsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_FAIL, EXIT_USAGE, EXIT_FENCED, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130

_T = TypeVar("_T")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(name, default)


def _help(text: str, env: str) -> str:
    return f"{text} (env: {env})"


class _EnvDefault(str):
    """An option's default, read from the environment variable ``env``.

    argparse converts a string default with the option's ``type=`` when, and only when,
    the option is not on the command line of the command being run. So a bad value gets
    argparse's usage error (exit 2) naming the variable, ``--help`` never reads it, and
    a command that does not have the option ignores it.
    """

    env: str


def _env_default(name: str, default: str) -> str:
    """The value of ``name`` (an empty value counts as unset), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = _EnvDefault(raw)
    value.env = name
    return value


def _typed(convert: Callable[[str], _T], flag: str, expected: str) -> Callable[[str], _T]:
    """``convert`` as an argparse ``type=``; a bad value from the environment is named."""

    def parse(text: str) -> _T:
        try:
            return convert(text)
        except ValueError:
            if isinstance(text, _EnvDefault):
                raise argparse.ArgumentTypeError(
                    f"invalid value {str(text)!r} for {flag} from {text.env}: expected {expected}"
                ) from None
            raise

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse: "invalid int value"
    return parse


def _add_env_number(
    p: argparse.ArgumentParser,
    flag: str,
    *,
    env: str,
    default: int | float,
    help: str,
) -> None:
    """An int or float option whose default comes from ``env``, converted by argparse."""
    convert: Callable[[str], int | float] = int if isinstance(default, int) else float
    expected = "an integer" if convert is int else "a number"
    p.add_argument(
        flag,
        type=_typed(convert, flag, expected),
        default=_env_default(env, str(default)),
        help=_help(help, env),
    )


def _record_count(text: str) -> int:
    """``-n`` of ``tail``: an integer >= 0 (0 prints nothing, like ``tail -n 0``)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0 prints no records), got {n}")
    return n


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a real file (e.g. captured in tests)
        pass


def _report(exc: Exception) -> int:
    """Print the one line for ``exc`` on stderr and return its exit code."""
    name = type(exc).__name__
    if isinstance(exc, RunStopped):
        signum = exc.signal_number or 2
        line, code = f"stopped: {exc}", 128 + signum
    elif isinstance(exc, FencedError):
        line, code = f"fenced: {exc}", EXIT_FENCED
    elif isinstance(exc, (SinkUnavailableError, KafkaUnavailableError)):
        line, code = f"unavailable: {exc}", EXIT_UNAVAILABLE
    elif isinstance(exc, ConfigError):
        line, code = f"bad input: {exc}", EXIT_USAGE
    elif isinstance(exc, SparkOnceError):
        line, code = f"{name}: {exc}", EXIT_FAIL
    elif isinstance(exc, ImportError) and "pip install" in str(exc):
        # An optional dependency that is not installed; the message names the extra.
        line, code = f"missing dependency: {exc}", EXIT_USAGE
    else:
        line, code = f"unexpected {name}: {exc} (run with --debug for a traceback)", EXIT_FAIL
    log_file = getattr(exc, "log_file", None)
    if log_file is not None and not isinstance(exc, RunStopped):
        line += f" (full log: {log_file})"
    print(f"sparkonce: {_one_line(line)}", file=sys.stderr)
    return code


def _one_line(text: str) -> str:
    """``text`` on one line: a multi-line message (a server's detail, say) is joined."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())
