"""Environment-variable fallbacks of the CLI: a bad value is exit 2 and one message that
names the variable, the value and what is expected; never a traceback.

Each kind of value has its test: integers (not a number, out of range), the on/off
switch, the fault kinds, sink URLs, Kafka bootstrap servers, the Spark master, the
pipeline name, and paths. The last tests check that every fallback is covered, that a
good value still works, and that the command line wins.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkonce.cli import build_parser, main
from sparkonce.cli.common import EXIT_USAGE


@pytest.fixture(autouse=True)
def _no_sparkonce_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the variables a test sets: none from the developer's shell."""
    for name in list(os.environ):
        if name.startswith("SPARKONCE_"):
            monkeypatch.delenv(name)


def refused(
    argv: list[str],
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """Run ``argv`` with ``env`` set; assert exit 2 without a traceback; return stderr."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code: object
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse's usage error
        code = exit_.code
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert "Traceback" not in err, err
    return err


def usage_error(err: str, flag: str, env: str, shown: str, expected: str) -> None:
    """``err`` is argparse's usage error for the value ``shown`` of ``flag`` from ``env``."""
    assert err.startswith("usage: sparkonce"), err
    last = err.strip().splitlines()[-1]
    assert f"invalid value {shown!r} for {flag} from {env}: expected {expected}" in last, last


# -- integers ----------------------------------------------------------------------------------
# Every int option with an environment fallback: (argv before it, flag, variable, expected).
ENV_NUMBER_OPTIONS = [
    (
        ["log", "create", "LOGDIR", "t"],
        "--partitions",
        "SPARKONCE_PARTITIONS",
        "an integer in 1..2147483647",
    ),
    (
        ["kafka", "create", "127.0.0.1:9", "t"],
        "--partitions",
        "SPARKONCE_PARTITIONS",
        "an integer in 1..2147483647",
    ),
    (["verify", "p.py"], "--trials", "SPARKONCE_VERIFY_TRIALS", "an integer >= 1"),
    (["verify", "p.py"], "--seed", "SPARKONCE_VERIFY_SEED", "an integer"),
    (["demo"], "--records", "SPARKONCE_DEMO_RECORDS", "an integer >= 1000"),
    (["run", "p.py"], "--metrics-port", "SPARKONCE_METRICS_PORT", "a port number in 1..65535"),
    (["ui"], "--port", "SPARKONCE_UI_PORT", "an integer in 0..65535"),
]


@pytest.mark.parametrize(("argv", "flag", "env", "expected"), ENV_NUMBER_OPTIONS)
@pytest.mark.parametrize("bad", ["abc", "1.5x", "4.0", "9" * 5000])
def test_a_value_that_is_no_integer_is_a_usage_error_naming_the_variable(
    argv: list[str],
    flag: str,
    env: str,
    expected: str,
    bad: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(argv, {env: bad}, monkeypatch, capsys)
    usage_error(err, flag, env, bad, expected)


OUT_OF_RANGE = [
    (["log", "create", "LOGDIR", "t"], "--partitions", "SPARKONCE_PARTITIONS", "0"),
    (["log", "create", "LOGDIR", "t"], "--partitions", "SPARKONCE_PARTITIONS", "-2"),
    # Used to reach SQLite and fail as an "unexpected OverflowError", exit 1.
    (["log", "create", "LOGDIR", "t"], "--partitions", "SPARKONCE_PARTITIONS", "9" * 30),
    (["kafka", "create", "127.0.0.1:9", "t"], "--partitions", "SPARKONCE_PARTITIONS", "2147483648"),
    (["verify", "p.py"], "--trials", "SPARKONCE_VERIFY_TRIALS", "0"),
    (["demo"], "--records", "SPARKONCE_DEMO_RECORDS", "999"),
    (["run", "p.py"], "--metrics-port", "SPARKONCE_METRICS_PORT", "0"),
    (["run", "p.py"], "--metrics-port", "SPARKONCE_METRICS_PORT", "65536"),
    (["ui"], "--port", "SPARKONCE_UI_PORT", "65536"),
    (["ui"], "--port", "SPARKONCE_UI_PORT", "-1"),
]


@pytest.mark.parametrize(("argv", "flag", "env", "bad"), OUT_OF_RANGE)
def test_an_integer_out_of_range_is_a_usage_error_naming_the_variable_and_the_range(
    argv: list[str],
    flag: str,
    env: str,
    bad: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    expected = next(e for a, f, v, e in ENV_NUMBER_OPTIONS if a == argv and f == flag)
    err = refused(argv, {env: bad}, monkeypatch, capsys)
    usage_error(err, flag, env, bad, expected)
    assert not (tmp_path / "LOGDIR").exists()  # refused before the command ran


# -- the on/off switch -------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["yes", "true", "on", "2", "-1", "1 1"])
def test_a_switch_other_than_1_or_0_is_a_usage_error(
    bad: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """It used to mean 'off', silently: SPARKONCE_QUICK_START=true started the full JIT."""
    err = refused(["run", "p.py"], {"SPARKONCE_QUICK_START": bad}, monkeypatch, capsys)
    usage_error(err, "--quick-start", "SPARKONCE_QUICK_START", bad, "1 (on) or 0 (off)")


@pytest.mark.parametrize(("value", "on"), [("1", True), ("0", False), (" 1 ", True), ("", False)])
def test_the_switch_reads_1_and_0_and_the_flag_turns_it_on(
    value: str, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPARKONCE_QUICK_START", value)
    assert build_parser().parse_args(["run", "p.py"]).quick_start is on
    assert build_parser().parse_args(["run", "p.py", "--quick-start"]).quick_start is True
    monkeypatch.delenv("SPARKONCE_QUICK_START")
    assert build_parser().parse_args(["run", "p.py"]).quick_start is False


# -- the fault kinds ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        ("bogus", "unknown: bogus"),
        ("kill,Zombie,db_drop", "unknown: Zombie, db_drop"),
        ("kill:after-rows", "unknown: kill:after-rows"),  # only crash-point names a point
        ("crash-point:nowhere", "unknown: crash-point:nowhere"),
        (",,", "it names no kind"),
    ],
)
def test_an_unknown_fault_kind_is_a_usage_error_listing_the_kinds(
    bad: str, problem: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["verify", "p.py"], {"SPARKONCE_VERIFY_FAULTS": bad}, monkeypatch, capsys)
    expected = (
        "a comma-separated list of kill, crash-point, task-failure, db-drop, zombie, resend, "
        "broker-kill; crash-point may name its point: crash-point:after-ledger-commit|after-rows|"
        "before-commit|before-ledger-commit"
    )
    usage_error(err, "--faults", "SPARKONCE_VERIFY_FAULTS", bad, expected)
    assert err.rstrip().endswith(f"({problem})"), err


# -- sink URLs ---------------------------------------------------------------------------------
SINK_URL = (
    "a sink URL: sqlite:///PATH.db, postgresql://USER@HOST:PORT/DBNAME, "
    "kafka://HOST:PORT[,HOST:PORT]/TOPIC, delta:///PATH or "
    "iceberg+sqlite:////ABS/catalog.db?table=NS.NAME"
)
# (argv, variable): the commands that take a sink URL from the environment.
SINK_VARIABLES = [
    (["status", "--pipeline", "p"], "SPARKONCE_SINK"),
    (["run", "p.py"], "SPARKONCE_RUN_SINK"),
    (["verify", "p.py"], "SPARKONCE_VERIFY_SINK"),
    (["ui"], "SPARKONCE_SINK"),
]
# The commands whose --sink is a list (given once per store): checked as they start.
SINK_LISTS = ("verify", "ui")
BAD_SINK_URLS = [
    ("out.db", "out.db", "is not a URL"),
    ("mysql://u@h/db", "mysql://u@h/db", "scheme 'mysql' is not supported"),
    ("sqlite:///", "sqlite:///", "the SQLite path is missing"),
    ("postgresql://u:s3cret@h:99999/db", "postgresql://u:***@h:99999/db", "the port"),
    ("postgresql://u:s3cret@[::1:5432/db", "postgresql://u:***@[::1:5432/db", "malformed"),
    ("kafka://broker:9092", "kafka://broker:9092", "names its brokers and its topic"),
    ("kafka://u:s3cret@h/t", "kafka://u:***@h/t", "its brokers are not host:port"),
    ("delta://host/t", "delta://host/t", "is not one of delta:///ABSOLUTE/PATH"),
]


@pytest.mark.parametrize(("argv", "env"), SINK_VARIABLES)
@pytest.mark.parametrize(("bad", "shown", "problem"), BAD_SINK_URLS)
def test_a_malformed_sink_url_is_refused_naming_the_variable_with_the_password_masked(
    argv: list[str],
    env: str,
    bad: str,
    shown: str,
    problem: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    err = refused(argv, {env: bad}, monkeypatch, capsys)
    message = f"invalid value {shown!r} for --sink from {env}: expected {SINK_URL} ("
    if argv[0] in SINK_LISTS:  # a list option: checked as the command starts
        assert err.startswith(f"sparkonce: bad input: {message}"), err
        assert not (tmp_path / "verify-out").exists()
    else:
        usage_error(err, "--sink", env, shown, SINK_URL)
    assert problem in err.strip().splitlines()[-1]
    assert "s3cret" not in err


# -- source URIs -------------------------------------------------------------------------------
SOURCE_URI = (
    "a source URI of the pipeline's kind: sparkonce-log://PATH?topic=TOPIC or "
    "kafka://HOST:PORT[,HOST:PORT]/TOPIC"
)


@pytest.mark.parametrize(
    ("bad", "shown", "problem"),
    [
        ("data/log", "data/log", "(it is neither a sparkonce-log:// nor a kafka:// URI)"),
        ("sparkonce-log:///data/log", "sparkonce-log:///data/log", "and a valid ?topic=TOPIC)"),
        ("sparkonce-log:///d?topic=a/b", "sparkonce-log:///d?topic=a/b", "valid ?topic=TOPIC)"),
        ("kafka://broker:9092", "kafka://broker:9092", "(host:port[,host:port...]) and a topic)"),
        ("kafka://u:s3cret@h:9092/t", "kafka://u:***@h:9092/t", "host:port...]) and a topic)"),
    ],
)
def test_a_malformed_source_uri_is_refused_naming_the_variable_with_the_password_masked(
    bad: str,
    shown: str,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(["run", "p.py"], {"SPARKONCE_RUN_SOURCE": bad}, monkeypatch, capsys)
    usage_error(err, "--source", "SPARKONCE_RUN_SOURCE", shown, SOURCE_URI)
    assert err.rstrip().endswith(problem), err
    assert "s3cret" not in err


# -- Kafka bootstrap servers -------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["not a host:port", "broker", "h:99999", "h:9092,,x"])
@pytest.mark.parametrize("command", ["create", "produce", "tail", "describe"])
def test_malformed_bootstrap_servers_are_a_usage_error_naming_the_variable(
    bad: str, command: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["kafka", command, "t"], {"SPARKONCE_KAFKA_BOOTSTRAP": bad}, monkeypatch, capsys)
    expected = "Kafka bootstrap servers, host:port[,host:port...]"
    usage_error(err, "BOOTSTRAP", "SPARKONCE_KAFKA_BOOTSTRAP", bad, expected)


# -- the Spark master --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "bad", ["local[two]", "local[0]", "lcoal", "local[2", "local-cluster[2,1]", "yarn-client"]
)
def test_a_master_spark_cannot_parse_is_a_usage_error(
    bad: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["run", "p.py"], {"SPARKONCE_MASTER": bad}, monkeypatch, capsys)
    expected = (
        "a Spark master URL: local, local[N], local[*], local[N,MAXFAILURES], "
        "local-cluster[N,CORES,MEMORY], yarn, or a URL such as spark://HOST:PORT"
    )
    usage_error(err, "--master", "SPARKONCE_MASTER", bad, expected)


@pytest.mark.parametrize(
    "good",
    [
        "local",
        "local[1]",
        "local[*]",
        "local[2,4]",
        "local[*, 3]",
        "local-cluster[2, 1, 1024]",
        "yarn",
        "spark://h1:7077,h2:7077",
        "k8s://https://10.0.0.1:6443",
    ],
)
def test_every_master_form_spark_accepts_passes(good: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKONCE_MASTER", good)
    assert build_parser().parse_args(["run", "p.py"]).master == good


# -- the pipeline name -------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["my pipeline", "-sums", "sums/2", "x" * 129])
def test_a_pipeline_name_no_pipeline_can_have_is_a_usage_error(
    bad: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"SPARKONCE_PIPELINE": bad, "SPARKONCE_SINK": "sqlite:///s.db"}
    err = refused(["status"], env, monkeypatch, capsys)
    expected = (
        "a pipeline name: 1-128 letters, digits, '.', '_' and '-', starting with a letter or digit"
    )
    usage_error(err, "--pipeline", "SPARKONCE_PIPELINE", bad, expected)
    assert err.rstrip().endswith(expected)  # nothing to add in parentheses


# -- paths -------------------------------------------------------------------------------------
@pytest.fixture
def a_file(tmp_path: Path) -> Iterator[str]:
    f = tmp_path / "a-file"
    f.write_text("not a directory\n")
    yield str(f)
    assert f.read_text() == "not a directory\n"  # never written over, never wiped


@pytest.mark.parametrize(
    ("argv", "flag", "env"),
    [
        (["log", "describe"], "dir", "SPARKONCE_LOG_DIR"),
        (["log", "create", "t"], "dir", "SPARKONCE_LOG_DIR"),
        (["verify", "p.py"], "--out", "SPARKONCE_VERIFY_OUT"),
        # `demo` wipes its work directory first: shutil.rmtree on a file was exit 1.
        (["demo"], "--workdir", "SPARKONCE_DEMO_DIR"),
    ],
)
def test_a_directory_option_naming_a_file_is_a_usage_error(
    argv: list[str],
    flag: str,
    env: str,
    a_file: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = refused(argv, {env: a_file}, monkeypatch, capsys)
    usage_error(err, flag, env, a_file, "a directory path (it exists and is not a directory)")


def test_a_checkpoint_that_is_a_file_or_a_url_without_host_is_a_usage_error(
    a_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = "SPARKONCE_RUN_CHECKPOINT"
    err = refused(["run", "p.py"], {env: a_file}, monkeypatch, capsys)
    usage_error(
        err, "--checkpoint", env, a_file, "a directory path or a URL (it exists and is not a dir"
    )
    err = refused(["run", "p.py"], {env: "s3a:///ckpt"}, monkeypatch, capsys)
    usage_error(err, "--checkpoint", env, "s3a:///ckpt", "a directory path or a URL (the checkp")
    assert "s3a://BUCKET-OR-HOST/path" in err


def test_a_verify_checkpoint_root_that_is_a_file_or_a_url_without_host_is_a_usage_error(
    a_file: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = "SPARKONCE_VERIFY_CHECKPOINT"
    err = refused(["verify", "p.py"], {env: a_file}, monkeypatch, capsys)
    usage_error(
        err, "--checkpoint", env, a_file, "a directory path or a URL (it exists and is not a dir"
    )
    err = refused(["verify", "p.py"], {env: "s3a:///v"}, monkeypatch, capsys)
    usage_error(err, "--checkpoint", env, "s3a:///v", "a directory path or a URL (the checkp")


def test_a_log_file_that_is_a_directory_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"SPARKONCE_LOG_FILE": str(tmp_path)}
    err = refused(["run", "p.py"], env, monkeypatch, capsys)
    usage_error(err, "--log-file", "SPARKONCE_LOG_FILE", str(tmp_path), "a file path (it is a dir")


# -- the metrics address -----------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["http://0.0.0.0", "localhost:9000", "my host", "::1/128", "[::1]"])
def test_a_metrics_host_that_is_no_address_is_a_usage_error(
    bad: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    err = refused(["run", "p.py"], {"SPARKONCE_METRICS_HOST": bad}, monkeypatch, capsys)
    expected = "a host name or an IP address to listen on, such as 127.0.0.1 or 0.0.0.0"
    usage_error(err, "--metrics-host", "SPARKONCE_METRICS_HOST", bad, expected)


@pytest.mark.parametrize("good", ["127.0.0.1", "0.0.0.0", "::1", "::", "metrics.internal"])
def test_a_metrics_host_address_passes(good: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKONCE_METRICS_HOST", good)
    monkeypatch.setenv("SPARKONCE_METRICS_PORT", "9464")
    args = build_parser().parse_args(["run", "p.py"])
    assert (args.metrics_host, args.metrics_port) == (good, 9464)


@pytest.mark.parametrize("bad", ["abc", "0", "0.1", "3601", "nan"])
def test_a_bad_ui_refresh_is_a_usage_error(
    bad: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = "SPARKONCE_UI_REFRESH"
    err = refused(["ui"], {env: bad}, monkeypatch, capsys)
    usage_error(err, "--refresh", env, bad, "a number of seconds in 0.2..3600")


def test_a_ui_verify_report_that_is_a_directory_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = "SPARKONCE_UI_VERIFY_REPORT"
    err = refused(["ui"], {env: str(tmp_path)}, monkeypatch, capsys)
    usage_error(err, "--verify-report", env, str(tmp_path), "a file path (it is a dir")


# -- every fallback is covered -----------------------------------------------------------------
COVERED = (
    {env for _, _, env, _ in ENV_NUMBER_OPTIONS}
    | {env for _, env in SINK_VARIABLES}
    | {
        "SPARKONCE_QUICK_START",
        "SPARKONCE_VERIFY_FAULTS",
        "SPARKONCE_KAFKA_BOOTSTRAP",
        "SPARKONCE_MASTER",
        "SPARKONCE_PIPELINE",
        "SPARKONCE_LOG_DIR",
        "SPARKONCE_VERIFY_OUT",
        "SPARKONCE_DEMO_DIR",
        "SPARKONCE_RUN_CHECKPOINT",
        "SPARKONCE_VERIFY_CHECKPOINT",
        "SPARKONCE_RUN_SOURCE",
        "SPARKONCE_LOG_FILE",
        "SPARKONCE_METRICS_HOST",
        "SPARKONCE_UI_REFRESH",
        "SPARKONCE_UI_VERIFY_REPORT",
    }
)
# Any text is a good value of these (an empty one counts as unset).
FREE_TEXT = {"SPARKONCE_PRODUCER_ID"}


def env_options(parser: argparse.ArgumentParser) -> Iterator[tuple[argparse.Action, str]]:
    """Every option (of every command) whose help names an environment variable."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from env_options(sub)
            continue
        env = re.search(r"\(env: (SPARKONCE_\w+)", action.help or "")
        if env:
            yield action, env.group(1)


def test_every_environment_fallback_has_a_bad_value_test() -> None:
    """A new option with a fallback must say what a good value is, and join a test above."""
    found = {env for _, env in env_options(build_parser())}
    assert found == COVERED | FREE_TEXT


def test_every_environment_fallback_declares_a_type() -> None:
    """Without ``type=``, argparse would hand the variable's text to the command unchecked
    (the --sink lists of verify and ui are the exception: their commands check them)."""
    untyped = [
        (action.dest, env)
        for action, env in env_options(build_parser())
        if action.type is None
        and not (action.dest == "sink" and isinstance(action, argparse._AppendAction))
    ]
    assert untyped == []


# -- good values, blank values, and the command line -------------------------------------------
def test_good_values_reach_the_command_as_plain_strings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {
        "SPARKONCE_MASTER": "local[3]",
        "SPARKONCE_RUN_SINK": "postgresql://u:pw@db:5432/x",
        "SPARKONCE_RUN_CHECKPOINT": str(tmp_path / "ckpt"),
        "SPARKONCE_LOG_FILE": str(tmp_path / "run.log"),
        "SPARKONCE_RUN_SOURCE": "kafka://b1:9092/orders-copy",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    args = build_parser().parse_args(["run", "p.py"])
    got = {
        "master": args.master,
        "sink": args.sink,
        "ckpt": args.checkpoint,
        "log": args.log_file,
        "source": args.source,
    }
    assert list(got.values()) == list(values.values())
    assert all(type(v) is str for v in got.values())
    monkeypatch.setenv("SPARKONCE_SINK", "kafka://b1:9092,b2:9092/orders")
    monkeypatch.setenv("SPARKONCE_PIPELINE", "orders-copy.v2")
    args = build_parser().parse_args(["status"])
    assert (args.sink, args.pipeline) == ("kafka://b1:9092,b2:9092/orders", "orders-copy.v2")
    monkeypatch.setenv("SPARKONCE_VERIFY_FAULTS", " kill , crash-point:after-rows")
    monkeypatch.setenv("SPARKONCE_VERIFY_TRIALS", "3")
    args = build_parser().parse_args(["verify", "p.py"])
    assert (args.faults, args.trials) == (" kill , crash-point:after-rows", 3)


@pytest.mark.parametrize("blank", ["", "  "])
def test_an_empty_variable_counts_as_unset(blank: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SPARKONCE_DEMO_DIR=`` used to make the demo work in (and wipe) the current
    directory; every variable now reads an empty value as unset, as the numbers did."""
    for name in (
        "SPARKONCE_DEMO_DIR",
        "SPARKONCE_DEMO_RECORDS",
        "SPARKONCE_VERIFY_OUT",
        "SPARKONCE_MASTER",
        "SPARKONCE_QUICK_START",
        "SPARKONCE_PRODUCER_ID",
        "SPARKONCE_LOG_DIR",
    ):
        monkeypatch.setenv(name, blank)
    parse = build_parser().parse_args
    assert (parse(["demo"]).workdir, parse(["demo"]).records) == (".demo", 200000)
    assert parse(["verify", "p.py"]).out == "verify-out"
    assert (parse(["run", "p.py"]).master, parse(["run", "p.py"]).quick_start) == (
        "local[2]",
        False,
    )
    assert parse(["log", "produce", "d", "t"]).producer_id == "cli"
    with pytest.raises(SystemExit):  # no directory: the positional is required again
        parse(["log", "describe"])


def test_the_command_line_wins_over_a_bad_environment_value(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPARKONCE_PARTITIONS", "abc")
    assert main(["log", "create", str(tmp_path / "log"), "t", "--partitions", "3"]) == 0
    assert "3 partitions" in capsys.readouterr().out
    monkeypatch.setenv("SPARKONCE_PARTITIONS", "2")
    assert main(["log", "create", str(tmp_path / "log"), "u"]) == 0
    assert "2 partitions" in capsys.readouterr().out
    # A bad value of another command's variable is never read.
    monkeypatch.setenv("SPARKONCE_VERIFY_TRIALS", "abc")
    assert main(["log", "describe", str(tmp_path / "log")]) == 0
    # A bad directory from the environment does not matter when the command line names one.
    monkeypatch.setenv("SPARKONCE_LOG_DIR", str(tmp_path / "log" / "t.db"))
    assert main(["log", "describe", str(tmp_path / "log")]) == 0
    monkeypatch.setenv("SPARKONCE_QUICK_START", "yes")
    monkeypatch.setenv("SPARKONCE_MASTER", "nonsense")
    args = build_parser().parse_args(["run", "p.py", "--quick-start", "--master", "local[1]"])
    assert (args.quick_start, args.master) == (True, "local[1]")


def test_a_command_line_value_is_checked_where_it_is_used_as_before(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The environment checks leave command-line values to the command: same messages."""
    assert main(["status", "--pipeline", "p", "--sink", "mysql://h/db"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("sparkonce: bad input: sink URL scheme 'mysql'")
    assert main(["verify", "p.py", "--faults", "bogus"]) == EXIT_USAGE
    assert capsys.readouterr().err.startswith("sparkonce: bad input: --faults 'bogus'")


def test_help_works_whatever_the_environment_holds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for env in COVERED | FREE_TEXT:
        monkeypatch.setenv(env, "abc")
    for argv in (
        ["--help"],
        ["run", "--help"],
        ["status", "--help"],
        ["log", "create", "--help"],
        ["log", "produce", "--help"],
        ["kafka", "create", "--help"],
        ["kafka", "tail", "--help"],
        ["verify", "--help"],
        ["demo", "--help"],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 0, argv
        assert "usage: sparkonce" in capsys.readouterr().out
