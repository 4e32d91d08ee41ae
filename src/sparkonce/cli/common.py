"""What every command shares: exit codes, option defaults read from the environment,
argparse types, and the mapping of an error to its one line and exit code."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, TypeVar

from sparkonce.errors import (
    ConfigError,
    FencedError,
    PipelineRunningError,
    RunStopped,
    SparkOnceError,
    StoreUnavailableError,
    TopicNotFoundError,
)

if TYPE_CHECKING:  # pragma: no cover
    # What ``add_subparsers()`` returns; each command module adds its parsers to it.
    SubParsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]

EXIT_FAIL, EXIT_USAGE, EXIT_FENCED, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 1, 2, 3, 4, 130
EXIT_RUNNING = 5  # sparkonce reset: a live run holds the pipeline

_T = TypeVar("_T")


# -- option defaults from the environment -----------------------------------------------
# Every option with an environment fallback takes its default from _env() or
# _env_default(), and says what a good value is through its ``type=`` (_add_env_number,
# _env_checked, _add_env_switch). argparse applies ``type=`` to a string default when,
# and only when, the option is not on the command line of the command being run. So a
# bad value in the environment is argparse's usage error (exit 2) naming the variable,
# the value and what is expected; ``--help`` never reads it; and a command without the
# option ignores it. A value given on the command line is converted as before and
# checked where it is used. An empty or blank variable counts as unset.


class _EnvDefault(str):
    """An option's default, read from the environment variable ``env``."""

    env: str


def _env(name: str, default: str | None = None) -> str | None:
    """The value of ``name``, marked with its name (an empty or blank value counts as
    unset), else ``default``."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    value = _EnvDefault(raw)
    value.env = name
    return value


def _env_default(name: str, default: str) -> str:
    """The value of ``name`` (an empty value counts as unset), else ``default``."""
    return _env(name) or default


def _help(text: str, env: str) -> str:
    return f"{text} (env: {env})"


def _bad_env_value(
    value: _EnvDefault, flag: str, expected: str, problem: str = "", shown: str | None = None
) -> str:
    """The message for a bad ``value`` of ``flag`` from its variable; ``shown`` is the
    value as it may be printed (a URL with its password masked)."""
    text = f"invalid value {shown if shown is not None else str(value)!r} for {flag} "
    text += f"from {value.env}: expected {expected}"
    return f"{text} ({problem})" if problem else text


def _typed(
    convert: Callable[[str], _T],
    flag: str,
    expected: str,
    check: Callable[[_T], bool] | None = None,
) -> Callable[[str], _T]:
    """``convert`` as an argparse ``type=``; a bad value from the environment is named.

    The value must also pass ``check``, if given (``expected`` says what passes), whether
    it comes from the command line or from the environment.
    """

    def parse(text: str) -> _T:
        try:
            value = convert(text)
        except ValueError:
            if isinstance(text, _EnvDefault):
                raise argparse.ArgumentTypeError(_bad_env_value(text, flag, expected)) from None
            raise
        if check is not None and not check(value):
            if isinstance(text, _EnvDefault):
                raise argparse.ArgumentTypeError(_bad_env_value(text, flag, expected))
            raise argparse.ArgumentTypeError(f"invalid value {text!r}: expected {expected}")
        return value

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse: "invalid int value"
    return parse


def _add_env_number(
    p: argparse.ArgumentParser,
    flag: str,
    *,
    env: str,
    default: int | float,
    help: str,
    minimum: int | None = None,
    maximum: int | None = None,
) -> None:
    """An int or float option whose default comes from ``env``, converted by argparse.

    A value from ``env`` must lie in ``minimum..maximum`` (either end may be open).
    """
    convert: Callable[[str], int | float] = int if isinstance(default, int) else float
    expected = "an integer" if convert is int else "a number"
    if minimum is not None and maximum is not None:
        expected += f" in {minimum}..{maximum}"
    elif minimum is not None:
        expected += f" >= {minimum}"
    elif maximum is not None:
        expected += f" <= {maximum}"

    def in_range(value: float) -> bool:
        return (minimum is None or value >= minimum) and (maximum is None or value <= maximum)

    p.add_argument(
        flag,
        type=_typed(convert, flag, expected, in_range),
        default=_env_default(env, str(default)),
        help=_help(help, env),
    )


def _env_checked(
    flag: str,
    expected: str | Callable[[], str],
    check: Callable[[str], object] | None = None,
    *,
    secret: bool = False,
) -> Callable[[str], str]:
    """An argparse ``type=`` for a text option whose default may come from the environment.

    A value from the environment must pass ``check``, which raises (a ``ConfigError`` or
    ``ValueError`` whose message says what is wrong); else the usage error names the
    variable, the value (a URL's password masked if ``secret``) and what is ``expected``
    (a text, or a function that writes it, called only then). Either way the option's
    value is a plain ``str``; a command-line value passes unchanged.
    """

    def parse(text: str) -> str:
        if isinstance(text, _EnvDefault) and check is not None:
            problem = _problem(check, str(text))
            if problem is not None:
                raise argparse.ArgumentTypeError(
                    _env_message(text, flag, expected, problem, secret)
                )
        return str(text)

    parse.__name__ = "text"
    return parse


def _problem(check: Callable[[str], object], text: str) -> str | None:
    """What ``check`` finds wrong with ``text``, or None if it passes. Whatever it raises
    counts: a check that fails must never surface as a traceback of argparse."""
    try:
        check(text)
    except Exception as exc:
        return str(exc)  # "": nothing to add to what is expected
    return None


def _env_message(
    value: _EnvDefault,
    flag: str,
    expected: str | Callable[[], str],
    problem: str,
    secret: bool = False,
) -> str:
    from sparkonce.config import mask_url

    if secret:  # the check's message may quote the value, or a part of it
        problem = mask_url(problem.replace(str(value), mask_url(str(value))))
    return _bad_env_value(
        value,
        flag,
        expected if isinstance(expected, str) else expected(),
        problem,
        shown=mask_url(str(value)) if secret else None,
    )


def _check_env(
    value: str | None,
    flag: str,
    expected: str | Callable[[], str],
    check: Callable[[str], object],
    *,
    secret: bool = False,
) -> None:
    """Check ``value`` as :func:`_env_checked` does, for a default that argparse does not
    convert (one that fills a list, say): a bad value from the environment raises a
    ConfigError (exit 2) with the same message."""
    if isinstance(value, _EnvDefault):
        problem = _problem(check, str(value))
        if problem is not None:
            raise ConfigError(_env_message(value, flag, expected, problem, secret))


class _EnvSwitch(argparse.Action):
    """A flag whose default comes from the environment: ``1`` (on) or ``0`` (off).

    Like ``store_true`` on the command line; its string default goes through ``type=``
    (see :func:`_switch`), so argparse refuses any other value of the variable.
    """

    def __init__(
        self,
        option_strings: list[str],
        dest: str,
        default: object = None,
        type: Callable[[str], object] | None = None,
        help: str | None = None,
    ) -> None:
        super().__init__(option_strings, dest, nargs=0, default=default, type=type, help=help)

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, True)


def _switch(flag: str) -> Callable[[str], bool]:
    """The ``type=`` of an :class:`_EnvSwitch`: only its default ever comes through it."""

    def parse(text: str) -> bool:
        if text.strip() in ("0", "1"):
            return text.strip() == "1"
        expected = "1 (on) or 0 (off)"
        if isinstance(text, _EnvDefault):
            raise argparse.ArgumentTypeError(_bad_env_value(text, flag, expected))
        raise argparse.ArgumentTypeError(f"invalid value {text!r} for {flag}: expected {expected}")

    parse.__name__ = "switch"
    return parse


def _add_env_switch(p: argparse.ArgumentParser, flag: str, *, env: str, help: str) -> None:
    """A flag that ``env=1`` turns on by default (``env=0``, empty or unset: off)."""
    p.add_argument(
        flag,
        action=_EnvSwitch,
        type=_switch(flag),
        default=_env_default(env, "0"),
        help=_help(help, f"{env}=1"),
    )


# What a good value of each kind of environment fallback is. Each check raises with a
# message that says what is wrong; the option's ``expected`` text says what is right.
SINK_URL_EXPECTED = (
    "a sink URL: sqlite:///PATH.db, postgresql://USER@HOST:PORT/DBNAME, "
    "kafka://HOST:PORT[,HOST:PORT]/TOPIC, delta:///PATH or "
    "iceberg+sqlite:////ABS/catalog.db?table=NS.NAME"
)  # sparkonce.sinks.registry.STORE_FORMS
SOURCE_URI_EXPECTED = (
    "a source URI of the pipeline's kind: sparkonce-log://PATH?topic=TOPIC or "
    "kafka://HOST:PORT[,HOST:PORT]/TOPIC"
)
BOOTSTRAP_EXPECTED = "Kafka bootstrap servers, host:port[,host:port...]"
DEFAULT_MASTER = "local[2]"
MASTER_EXPECTED = (
    "a Spark master URL: local, local[N], local[*], local[N,MAXFAILURES], "
    "local-cluster[N,CORES,MEMORY], yarn, or a URL such as spark://HOST:PORT"
)
REMOTE_EXPECTED = (
    "a Spark Connect URL, sc://HOST:PORT (parameters after ';' allowed), or local / local[N] "
    "for a Connect server of the installed PySpark"
)
PIPELINE_NAME_EXPECTED = (
    "a pipeline name: 1-128 letters, digits, '.', '_' and '-', starting with a letter or digit"
)
DIRECTORY_EXPECTED = "a directory path"
FILE_EXPECTED = "a file path"
MAX_PARTITIONS = 2**31 - 1  # a Kafka partition number is a 32-bit int; a log's, likewise


def _add_partitions(parser: argparse.ArgumentParser) -> None:
    """``--partitions N`` of the topic-creating commands (``SPARKONCE_PARTITIONS``)."""
    _add_env_number(
        parser,
        "--partitions",
        env="SPARKONCE_PARTITIONS",
        default=4,
        help="number of partitions, default 4",
        minimum=1,
        maximum=MAX_PARTITIONS,
    )


def _check_sink_url(text: str) -> None:
    """Only the form of the URL (:func:`sparkonce.sinks.registry.check_url`): whether the
    store answers is the command's business."""
    from sparkonce.sinks.registry import check_url

    check_url(text)


def _check_source_uri(text: str) -> None:
    """Only the form of the URI: whether it is the pipeline's kind is checked once the
    pipeline file is loaded (:meth:`~sparkonce.sources.base.Source.relocated`). The
    problems never quote the URI, which may hold a password."""
    from sparkonce.sources import source_from_uri

    if text.startswith("sparkonce-log://"):
        problem = "an embedded log URI names its directory and a valid ?topic=TOPIC"
    elif text.startswith("kafka://"):
        problem = "a Kafka source URI names its brokers (host:port[,host:port...]) and a topic"
    else:
        raise ConfigError("it is neither a sparkonce-log:// nor a kafka:// URI")
    try:
        source_from_uri(text)
    except ConfigError:
        raise ConfigError(problem) from None


def _check_bootstrap(text: str) -> None:
    from sparkonce.kafka.client import parse_bootstrap

    parse_bootstrap(text)


# Spark's own forms (SparkContext's master regexes); anything else with a scheme is left
# to the cluster manager that claims it.
_LOCAL_MASTER = re.compile(
    r"local(\[([1-9]\d*|\*)(\s*,\s*\d+)?\])?"
    r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]"
    r"|yarn"
)
_MASTER_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")


def _check_master(text: str) -> None:
    if _LOCAL_MASTER.fullmatch(text) or (
        not text.startswith("local") and _MASTER_URL.fullmatch(text)
    ):
        return
    raise ValueError("not a form Spark accepts")


_REMOTE = re.compile(r"sc://[^\s/:;]+(:[0-9]{1,5})?/?(;\S*)?|local(\[([1-9][0-9]*|\*)\])?")


def _check_remote(text: str) -> None:
    if not _REMOTE.fullmatch(text):
        raise ValueError("not a Spark Connect URL")


def spark_target(args: argparse.Namespace) -> tuple[str, str | None]:
    """``(master, remote)`` for :func:`~sparkonce.spark.session.build_session`, from
    ``--master`` and ``--remote``; both given is a ConfigError (exit 2)."""
    remote: str | None = args.remote
    if remote is not None and args.master != DEFAULT_MASTER:
        raise ConfigError(
            f"--master {args.master} and --remote {remote} exclude each other: --remote (or "
            "SPARK_REMOTE) runs the pipeline on a Spark Connect server, --master (or "
            "SPARKONCE_MASTER) starts a Spark driver here; give one of them"
        )
    return str(args.master), remote


def _check_pipeline_name(text: str) -> None:
    from sparkonce.config import check_pipeline_name

    try:
        check_pipeline_name(text)
    except ConfigError:
        raise ValueError() from None  # PIPELINE_NAME_EXPECTED says it all


def _check_directory(text: str) -> None:
    """A directory, or a path where one can be made."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise ValueError("it exists and is not a directory")


def _check_checkpoint(text: str) -> None:
    """A local directory or a URL (see :class:`~sparkonce.pipeline.Pipeline`'s checkpoint);
    whether Spark reaches a URL is checked when the run starts."""
    from sparkonce.errors import ConfigError
    from sparkonce.files import is_remote, location

    try:
        loc = location(text, "checkpoint")
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
    if not is_remote(loc):
        _check_directory(loc)


def _check_file(text: str) -> None:
    """A file, or a path where one can be made."""
    if Path(text).is_dir():
        raise ValueError("it is a directory")


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
    elif isinstance(exc, StoreUnavailableError):  # a database or a Kafka cluster
        line, code = f"unavailable: {exc}", EXIT_UNAVAILABLE
    elif isinstance(exc, PipelineRunningError):
        line, code = f"still running: {exc}", EXIT_RUNNING
    elif isinstance(exc, (ConfigError, TopicNotFoundError)):  # a topic the user named
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


def add_spark_options(p: argparse.ArgumentParser, log_file_help: str) -> None:
    """``--master`` and ``--log-file``: the options of every command that starts Spark."""
    p.add_argument(
        "--master",
        type=_env_checked("--master", MASTER_EXPECTED, _check_master),
        default=_env("SPARKONCE_MASTER", DEFAULT_MASTER),
        help=_help(f"Spark master URL, default {DEFAULT_MASTER}", "SPARKONCE_MASTER"),
    )
    p.add_argument(
        "--remote",
        type=_env_checked("--remote", REMOTE_EXPECTED, _check_remote),
        default=_env("SPARK_REMOTE"),
        help=_help(
            "run on this Spark Connect server instead (sc://HOST:PORT); see the Spark "
            "Connect guide for what runs there",
            "SPARK_REMOTE",
        ),
    )
    p.add_argument(
        "--log-file",
        type=_env_checked("--log-file", FILE_EXPECTED, _check_file),
        default=_env("SPARKONCE_LOG_FILE"),
        help=_help(log_file_help, "SPARKONCE_LOG_FILE"),
    )


def add_pipeline_and_sink(p: argparse.ArgumentParser, sink_help: str = "sink URL") -> None:
    """``--pipeline`` and ``--sink`` as ``status`` and ``reset`` take them: checked when
    parsed, from SPARKONCE_PIPELINE and SPARKONCE_SINK when not given (the URL masked)."""
    p.add_argument(
        "--pipeline",
        type=_env_checked("--pipeline", PIPELINE_NAME_EXPECTED, _check_pipeline_name),
        default=_env("SPARKONCE_PIPELINE"),
        help=_help("pipeline name", "SPARKONCE_PIPELINE"),
    )
    p.add_argument(
        "--sink",
        type=_env_checked("--sink", SINK_URL_EXPECTED, _check_sink_url, secret=True),
        default=_env("SPARKONCE_SINK"),
        help=_help(sink_help, "SPARKONCE_SINK"),
    )
