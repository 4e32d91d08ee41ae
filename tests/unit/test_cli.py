"""The CLI, run in-process through ``main()`` (no Spark needed for these commands)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkonce.cli import EXIT_USAGE, main
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
    with Topic(log_dir, "orders") as t:
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
    with Topic(log_dir, "t") as t:
        assert t.end_offsets() == {0: 0}  # the good line was not half-written either


def test_missing_topic_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "log").mkdir()
    code = main(["log", "tail", str(tmp_path / "log"), "nope"])
    assert code == 1
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
        sink._commit_once(ctx, schema, ["v"], [(1,), (2,), (3,)])
    capsys.readouterr()
    assert main(["status", "--pipeline", "p", "--sink", url]) == 0
    out = capsys.readouterr().out
    assert "owner epoch 2" in out
    assert "1 batches, 3 rows committed" in out
    row = next(ln for ln in out.splitlines() if "│ ev" in ln)
    cells = [c.strip() for c in row.split("│") if c.strip()]
    assert cells == ["ev", "0", "3", "5", "2"]


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
