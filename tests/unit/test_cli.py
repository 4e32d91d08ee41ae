"""The CLI, run in-process through ``main()`` (no Spark needed for these commands)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparkonce.cli import main
from sparkonce.cli.common import EXIT_USAGE
from sparkonce.ledger import BatchContext
from sparkonce.log import Topic
from sparkonce.offsets import BatchRanges, OffsetRange
from sparkonce.sinks import SQLiteSink


def test_log_create_produce_tail_describe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = str(tmp_path / "log")
    assert main(["log", "create", log_dir, "orders", "--partitions", "2"]) == 0
    assert (
        main(
            [
                "log",
                "produce",
                log_dir,
                "orders",
                "--key",
                "k1",
                "--value",
                "a",
                "--value",
                "b",
                "--value",
                "c",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "appended 3 records" in out
    with Topic(Path(log_dir), "orders") as t:
        ends = t.end_offsets()
    assert sum(ends.values()) == 3 and sorted(ends.values()) == [0, 3]  # one key: one partition
    assert main(["log", "tail", log_dir, "orders", "-n", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [ln.split("\t")[-1] for ln in lines] == ["b", "c"]
    assert main(["log", "describe", log_dir]) == 0
    assert "3 records" in capsys.readouterr().out


def test_produce_with_separator_requires_it_on_every_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = str(tmp_path / "log")
    main(["log", "create", log_dir, "t", "--partitions", "1"])
    code = main(
        ["log", "produce", log_dir, "t", "--separator", "=", "--value", "a=1", "--value", "x"]
    )
    assert code == EXIT_USAGE
    assert "'x' has no separator '='" in capsys.readouterr().err
    with Topic(Path(log_dir), "t") as t:
        assert t.end_offsets() == {0: 0}  # the good line was not half-written either


def test_missing_topic_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "log").mkdir()
    code = main(["log", "tail", str(tmp_path / "log"), "nope"])
    assert code == EXIT_USAGE
    err = capsys.readouterr().err
    assert "topic 'nope' does not exist" in err and "sparkonce log create" in err


def test_status_shows_epoch_offsets_lag_and_rows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pyspark.sql.types import LongType, StructField, StructType

    from sparkonce.sources import EmbeddedLogSource

    log_dir = tmp_path / "log"
    main(["log", "create", str(log_dir), "ev", "--partitions", "1"])
    main(["log", "produce", str(log_dir), "ev", *[f"--value={i}" for i in range(1, 6)]])
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    sink = SQLiteSink(url, "out")
    with sink:
        epoch = sink.acquire("p", EmbeddedLogSource(log_dir, "ev").uri()).epoch
        sink.acquire("p", EmbeddedLogSource(log_dir, "ev").uri())
        schema = StructType([StructField("v", LongType())])
        ctx = BatchContext("p", epoch + 1, BatchRanges((OffsetRange("ev", 0, 0, 3),)), 0)
        sink.commit_rows(ctx, schema, ["v"], [(1,), (2,), (3,)])
    capsys.readouterr()
    assert main(["status", "--pipeline", "p", "--sink", url]) == 0
    out = capsys.readouterr().out
    assert "owner epoch 2" in out
    assert "1 batches, 3 rows committed" in out
    row = next(ln for ln in out.splitlines() if "│ ev" in ln)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells == ["ev", "0", "3", "5", "2"]
    with SQLiteSink(url, "out") as reader:
        [entry] = reader.ledger("p")
    assert entry.commit_seconds is not None
    took = f"{entry.commit_seconds:.3f} s"
    assert f"commit time: last {took}; over the last 1 commits median {took}, max {took}" in out


def test_status_of_unknown_pipeline_and_bad_url(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    with SQLiteSink(url, "out"):
        pass
    assert main(["status", "--pipeline", "ghost", "--sink", url]) == 1
    assert "has never run" in capsys.readouterr().out
    assert main(["status", "--pipeline", "p", "--sink", "mysql://h/db"]) == EXIT_USAGE
    assert "scheme 'mysql' is not supported" in capsys.readouterr().err
    assert main(["status", "--pipeline", "p", "--sink", "postgresql://u:pw@h:99999/db"]) == 2
    err = capsys.readouterr().err
    assert "port" in err and "pw@" not in err


def test_run_reports_a_bad_pipeline_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "p.py"
    f.write_text("x = 1\n")
    assert main(["run", str(f)]) == EXIT_USAGE
    assert "defines neither 'pipeline' nor 'build_pipeline()'" in capsys.readouterr().err
    f.write_text("pipeline = 42\n")
    assert main(["run", str(f)]) == EXIT_USAGE
    assert "not a sparkonce.Pipeline" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.py")]) == EXIT_USAGE
    assert "does not exist" in capsys.readouterr().err


def test_verify_refuses_the_same_store_twice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Parallel trials on one store would wipe each other's output: refused before any run."""
    store = f"sqlite:///{tmp_path / 'sink.db'}"
    args = ["verify", str(tmp_path / "p.py"), "--sink", store, "--sink", store]
    assert main([*args, "--out", str(tmp_path / "out")]) == EXIT_USAGE
    assert "names the same store twice" in capsys.readouterr().err
    assert not (tmp_path / "sink.db").exists()


def test_verify_refuses_retime_oracle_without_resume_or_replay(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["verify", str(tmp_path / "p.py"), "--retime-oracle", "--out", str(out)]
    assert main(args) == EXIT_USAGE
    assert "--retime-oracle only changes" in capsys.readouterr().err
    assert not out.exists()


def test_verify_refuses_a_negative_replay_trial(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = ["verify", str(tmp_path / "p.py"), "--replay", "-1", "--out", str(out)]
    assert main(args) == EXIT_USAGE
    assert "--replay takes a trial number" in capsys.readouterr().err
    assert not out.exists()


# -- bad input is exit 2, with a message naming the thing -----------------------------------
def test_log_commands_on_a_missing_directory_or_topic_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no-such-log")
    assert main(["log", "produce", missing, "t", "--value", "a"]) == EXIT_USAGE
    assert f"log directory {missing!r} does not exist" in capsys.readouterr().err
    assert main(["log", "describe", missing]) == EXIT_USAGE
    assert f"log directory {missing!r} does not exist" in capsys.readouterr().err
    assert main(["log", "describe", missing, "t"]) == EXIT_USAGE
    assert f"log directory {missing!r} does not exist" in capsys.readouterr().err
    assert not Path(missing).exists()

    log_dir = str(tmp_path / "log")
    assert main(["log", "create", log_dir, "t", "--partitions", "1"]) == 0
    for argv in (["produce", log_dir, "nope", "--value", "a"], ["describe", log_dir, "nope"]):
        assert main(["log", *argv]) == EXIT_USAGE, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("sparkonce: bad input: topic 'nope' does not exist"), err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "log" / "nope.db").exists()


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("import os\nimport nope_no_such_module\n", "ModuleNotFoundError: No module named"),
        ("x = 1\nraise RuntimeError('boom')\n", "RuntimeError: boom"),
        ("def build_pipeline():\n    return {}['k']\n", "KeyError: 'k'"),
    ],
)
def test_a_pipeline_file_that_fails_to_import_is_bad_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], source: str, error: str
) -> None:
    f = tmp_path / "p.py"
    f.write_text(source)
    assert main(["run", str(f)]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"sparkonce: bad input: pipeline file {str(f)!r}"), err
    assert "(line 2)" in err and error in err
    assert "unexpected" not in err and len(err.splitlines()) == 1


def test_a_corrupt_sqlite_file_as_sink_or_log_is_bad_input_naming_its_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = b"this is not a SQLite file; a new user pointed at the wrong one\n" * 64
    sink = tmp_path / "sink.db"
    sink.write_bytes(garbage)
    assert main(["status", "--pipeline", "p", "--sink", f"sqlite:///{sink}"]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert f"{str(sink)!r}" in err and "is not a SQLite database" in err, err
    assert len(err.splitlines()) == 1
    assert sink.read_bytes() == garbage  # nothing was written

    log_dir = tmp_path / "log"
    log_dir.mkdir()
    (log_dir / "t.db").write_bytes(garbage)
    topic_file = str(log_dir / "t.db")
    for argv in (
        ["tail", str(log_dir), "t"],
        ["describe", str(log_dir)],
        ["produce", str(log_dir), "t", "--value", "a"],
        ["create", str(log_dir), "t", "--exist-ok"],
    ):
        assert main(["log", *argv]) == EXIT_USAGE, argv
        err = capsys.readouterr().err.strip()
        assert f"{topic_file!r} is not a SQLite database" in err, err
        assert len(err.splitlines()) == 1
    assert (log_dir / "t.db").read_bytes() == garbage


def test_a_malformed_ipv6_url_is_bad_input_with_the_password_masked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = "postgresql://alice:s3cret-pw@[::1:5432/db"
    assert main(["status", "--pipeline", "p", "--sink", url]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert "postgresql://alice:***@[::1:5432/db" in err and "s3cret" not in err
    assert "malformed" in err and "unexpected" not in err


def test_tail_refuses_a_negative_count_and_prints_nothing_for_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = str(tmp_path / "log")
    main(["log", "create", log_dir, "t", "--partitions", "1"])
    main(["log", "produce", log_dir, "t", "--value", "a", "--value", "b"])
    capsys.readouterr()
    for argv in (["log", "tail", log_dir, "t"], ["kafka", "tail", "127.0.0.1:9", "t"]):
        with pytest.raises(SystemExit) as exit_:
            main([*argv, "-n", "-1"])
        assert exit_.value.code == EXIT_USAGE
        assert "argument -n: must be >= 0" in capsys.readouterr().err
    assert main(["log", "tail", log_dir, "t", "-n", "0"]) == 0
    assert capsys.readouterr().out == ""
    assert main(["log", "tail", log_dir, "t", "-n", "1"]) == 0
    assert capsys.readouterr().out.strip().split("\t")[-1] == "b"


# -- status names the sink the user gave ----------------------------------------------------
def test_status_names_the_sink_url_the_user_gave(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sparkonce.sources import EmbeddedLogSource

    monkeypatch.setenv("COLUMNS", "400")  # rich wraps at the terminal's width
    log_dir = tmp_path / "log"
    main(["log", "create", str(log_dir), "ev", "--partitions", "1"])
    url = f"sqlite:///{tmp_path / 'sink.db'}"
    with SQLiteSink(url, "out", mode="upsert", keys=["k"]) as sink:
        sink.acquire("p", EmbeddedLogSource(log_dir, "ev").uri())
    capsys.readouterr()
    assert main(["status", "--pipeline", "ghost", "--sink", url]) == 1
    assert f"has never run against {url}\n" in capsys.readouterr().out
    assert main(["status", "--pipeline", "p", "--sink", url]) == 0
    out = capsys.readouterr().out
    assert f"sink {url}\n" in out
    assert "sparkonce_status_probe" not in out and "table=" not in out


# -- one last line, the documented exit code, no traceback ----------------------------------
def test_spark_and_py4j_loggers_stay_at_warning_unless_verbose(tmp_path: Path) -> None:
    log_dir = str(tmp_path / "log")
    main(["log", "create", log_dir, "t", "--partitions", "1"])
    assert main(["log", "describe", log_dir]) == 0
    levels = {n: logging.getLogger(n).level for n in ("py4j", "pyspark")}
    assert levels == {"py4j": logging.WARNING, "pyspark": logging.WARNING}
    assert main(["-v", "log", "describe", log_dir]) == 0
    assert logging.getLogger("py4j").getEffectiveLevel() == logging.INFO
    assert logging.getLogger("pyspark").getEffectiveLevel() == logging.INFO
    assert main(["-vv", "log", "describe", log_dir]) == 0
    assert logging.getLogger("py4j.clientserver").getEffectiveLevel() == logging.DEBUG
    assert main(["log", "describe", log_dir]) == 0
    assert logging.getLogger("py4j.clientserver").getEffectiveLevel() == logging.WARNING


def _sparkonce(*args: str, **kwargs: object) -> subprocess.Popen[str]:
    cli = Path(sys.executable).with_name("sparkonce")
    return subprocess.Popen(
        [str(cli), *args],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,  # type: ignore[call-overload]
    )


def test_ctrl_c_is_one_line_and_exit_130(tmp_path: Path) -> None:
    log_dir = tmp_path / "log"
    assert main(["log", "create", str(log_dir), "t", "--partitions", "1"]) == 0
    # Ctrl-C's default action in the child even when this run inherited SIGINT ignored (a
    # background job of a non-interactive shell, such as a campaign script), which exec
    # would pass on: Python then installs no KeyboardInterrupt handler, and the produce
    # ends at EOF with exit 0.
    proc = _sparkonce(
        "log",
        "produce",
        str(log_dir),
        "t",
        stdin=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # Wait until it has opened the topic, i.e. is reading stdin inside main().
    deadline = time.monotonic() + 60
    fds = Path(f"/proc/{proc.pid}/fd")
    while not any(os.path.realpath(fd) == str(log_dir / "t.db") for fd in _links(fds)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # 128 + SIGINT, as shells report it
    assert err == "sparkonce: interrupted\n"


def _links(fds: Path) -> list[str]:
    try:
        return [os.readlink(fd) for fd in fds.iterdir()]
    except OSError:  # a descriptor closed while we looked
        return []


def test_a_closed_stdout_pipe_stops_quietly(tmp_path: Path) -> None:
    """`sparkonce log tail ... | head -1`: no traceback, no 'Exception ignored' noise."""
    log_dir = str(tmp_path / "log")
    main(["log", "create", log_dir, "t", "--partitions", "1"])
    main(["log", "produce", log_dir, "t", *[f"--value={'x' * 100}{i}" for i in range(3000)]])
    proc = _sparkonce("log", "tail", log_dir, "t", "-n", "3000")
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().startswith("0\t")
    proc.stdout.close()
    err = proc.stderr.read()
    proc.wait(timeout=60)
    assert err == "" and proc.returncode == 1


# -- verify's chart needs the `verify` extra -----------------------------------------------
CHART_STEP = """
import sys
from pathlib import Path
if sys.argv[2] == "hide":
    sys.modules["matplotlib"] = None  # as if the verify extra were not installed
from sparkonce.cli.verify import _write_chart
from sparkonce.verify import Fault, TrialOutcome
outcomes = [TrialOutcome(n, "s", Fault("kill", delay_s=1.0), True, True, recovery_s=2.0 + n)
            for n in range(3)]
print(_write_chart(Path(sys.argv[1]), outcomes, ["kill"]))
"""


def test_the_chart_step_without_matplotlib_warns_in_one_line(tmp_path: Path) -> None:
    png = tmp_path / "recovery.png"
    done = subprocess.run(
        [sys.executable, "-c", CHART_STEP, str(png), "hide"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False\n" and not png.exists()
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("sparkonce: warning: no chart"), lines
    assert "pip install 'sparkonce[verify]'" in lines[0]
    # With matplotlib (the dev environment has the verify extra), the chart is written.
    done = subprocess.run(
        [sys.executable, "-c", CHART_STEP, str(png), "show"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.stdout == "True\n" and done.stderr == "", done.stderr
    assert png.read_bytes().startswith(b"\x89PNG")


# -- verify plans from its report before any driver starts ----------------------------------
VERIFY_PIPELINE = """
from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

pipeline = Pipeline(
    name="planned",
    source=EmbeddedLogSource({log!r}, "ev"),
    transform=lambda df: df,
    sink=SQLiteSink({sink!r}, "out"),
    checkpoint={checkpoint!r},
)
"""


def test_verify_resume_refuses_the_report_of_another_campaign(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    f = tmp_path / "p.py"
    f.write_text(
        VERIFY_PIPELINE.format(
            log=str(tmp_path / "log"),
            sink=f"sqlite:///{tmp_path / 'sink.db'}",
            checkpoint=str(tmp_path / "checkpoint"),
        )
    )
    out = tmp_path / "out"
    out.mkdir()
    report = out / "verify.json"
    report.write_text('{"seed": 1, "faults": ["kill"], "trials": []}')
    argv = ["verify", str(f), "--seed", "2", "--faults", "kill", "--out", str(out), "--resume"]
    assert main(argv) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err == (
        f"sparkonce: bad input: {report} holds a campaign with seed 1 and faults ['kill']; "
        "--resume and --replay need the same --seed and --faults (or another --out)"
    )
    assert not (out / "work").exists()  # no oracle run: its work directory was never made


def test_run_of_a_file_with_a_module_level_udf_says_to_create_it_in_the_transform(
    tmp_path: Path,
) -> None:
    """A ``@F.udf`` at a pipeline file's top level needs a SparkContext, and sparkonce loads
    the file before it starts Spark. A fresh process (no SparkContext, as under `sparkonce
    run`) shows what a user sees."""
    f = tmp_path / "p.py"
    f.write_text(
        "from pyspark.sql import functions as F\n"
        "\n"
        "@F.udf('string')\n"
        "def shout(s):\n"
        "    return s.upper()\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sparkonce", "run", str(f)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "SESSION_OR_CONTEXT_NOT_EXISTS" in done.stderr and "(line 3)" in done.stderr
    assert "create it inside the transform" in done.stderr, done.stderr
