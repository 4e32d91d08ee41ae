"""Bad metrics input to ``sparkonce run``: each is refused before Spark starts and before
the run takes its epoch, so it never fences a healthy run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sparkonce import SQLiteSink
from sparkonce.cli import main
from sparkonce.cli.common import EXIT_USAGE

PIPELINE = textwrap.dedent(
    """
    from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

    pipeline = Pipeline(
        name="healthy",
        source=EmbeddedLogSource({log!r}, "events"),
        sink=SQLiteSink({url!r}, "out"),
        checkpoint={checkpoint!r},
    )
    """
)


@pytest.fixture
def pipeline_file(tmp_path: Path, make_log: Callable[..., Path]) -> Path:
    """A pipeline whose sink a healthy run owns (epoch 1)."""
    url = f"sqlite:///{tmp_path / 'out.db'}"
    path = tmp_path / "pipeline.py"
    path.write_text(
        PIPELINE.format(log=str(make_log(3)), url=url, checkpoint=str(tmp_path / "chk"))
    )
    with SQLiteSink(url, "out") as sink:
        assert sink.acquire("healthy").epoch == 1
    return path


def owner_epoch(pipeline_file: Path) -> int:
    with SQLiteSink(f"sqlite:///{pipeline_file.parent / 'out.db'}", "out") as sink:
        owner = sink.owner("healthy")
    assert owner is not None
    return owner.epoch


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port on 127.0.0.1 that another process's socket listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_port_in_use_is_refused_before_the_epoch(
    pipeline_file: Path, busy_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    log_file = pipeline_file.parent / "run.log"
    argv = [
        "run",
        str(pipeline_file),
        "--metrics-port",
        str(busy_port),
        "--log-file",
        str(log_file),
    ]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert f"bad input: pipeline 'healthy': cannot serve metrics on 127.0.0.1:{busy_port}" in err
    assert "Address already in use" in err and "no epoch was taken" in err, err
    assert err.rstrip().endswith(f"(full log: {log_file})") and log_file.is_file(), err
    assert "Traceback" not in err
    assert owner_epoch(pipeline_file) == 1  # the healthy run was not fenced


@pytest.mark.parametrize("port", ["0", "65536", "-1", "http", "80.5"])
def test_a_port_out_of_range_is_a_usage_error(
    port: str, pipeline_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", str(pipeline_file), "--metrics-port", port])
    err = capsys.readouterr().err
    assert exit_.value.code == EXIT_USAGE, err
    assert "argument --metrics-port: invalid" in err, err
    if port.lstrip("-").isdigit():
        assert f"invalid value {port!r}: expected a port number in 1..65535" in err, err
    assert owner_epoch(pipeline_file) == 1


# prometheus_client made unimportable in a fresh interpreter: a meta path finder that
# refuses it, as if it were not installed; then the real CLI runs.
WITHOUT_PROMETHEUS = textwrap.dedent(
    """
    import sys

    class NoPrometheus:
        def find_spec(self, name, path=None, target=None):
            if name == "prometheus_client" or name.startswith("prometheus_client."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoPrometheus())
    # A run without metrics needs no prometheus_client: nothing imports it.
    import sparkonce.cli.run, sparkonce.observe.metrics, sparkonce.pipeline.runner
    assert "prometheus_client" not in sys.modules
    from sparkonce.cli import main
    sys.exit(main(sys.argv[1:]))
    """
)


def test_metrics_without_prometheus_client_name_the_extra(
    pipeline_file: Path, tmp_path: Path
) -> None:
    args = ["run", str(pipeline_file), "--metrics-port", "9"]
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PROMETHEUS, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == EXIT_USAGE, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        "sparkonce: missing dependency: metrics need prometheus_client, which is not "
        "installed: run pip install 'sparkonce[metrics]'"
    ), done.stderr
    assert "Traceback" not in done.stderr
    assert owner_epoch(pipeline_file) == 1
