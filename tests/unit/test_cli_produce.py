"""`sparkonce log produce` streams stdin: bounded memory, every line once, clean stops.

The memory test runs the real console script in a subprocess and reads its peak RSS.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from sparkonce.cli import main
from sparkonce.cli.common import EXIT_USAGE
from sparkonce.log import Topic

if TYPE_CHECKING:
    from tests.services.kafka import KafkaBroker

CHUNK = 10_000  # PRODUCE_CHUNK_LINES in sparkonce.cli.records


def _all_values(log_dir: Path, topic: str) -> list[bytes]:
    with Topic(log_dir, topic) as t:
        ends = t.end_offsets()
        values: list[bytes] = []
        for p, end in ends.items():
            values += [v for v in t.read_columns(p, 0, end)["value"] if isinstance(v, bytes)]
            assert len(values) == sum(e for q, e in ends.items() if q <= p)
    return values


# A wrapper process that runs one command and reports its peak RSS. RUSAGE_CHILDREN of the
# wrapper covers that command alone, whatever else this test process ran before.
_PEAK_RSS = textwrap.dedent(
    """
    import json, resource, subprocess, sys
    with open(sys.argv[1], "rb") as stdin:
        done = subprocess.run(sys.argv[2:], stdin=stdin, capture_output=True, text=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"code": done.returncode, "out": done.stdout, "err": done.stderr,
                      "peak_mib": peak_kib / 1024}))
    """
)


def _produce_measured(log_dir: Path, topic: str, input_file: Path) -> dict[str, object]:
    cli = str(Path(sys.executable).with_name("sparkonce"))
    argv = [cli, "log", "produce", str(log_dir), topic, "--producer-id", topic]
    done = subprocess.run(
        [sys.executable, "-c", _PEAK_RSS, str(input_file), *argv],
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_stdin_is_streamed_in_bounded_memory_and_every_line_lands_once(tmp_path: Path) -> None:
    """300,000 lines of 100 bytes (30 MB): the peak RSS grows by far less than the input,
    where reading all of stdin first held more than twice the input in memory."""
    log_dir = tmp_path / "log"
    assert main(["log", "create", str(log_dir), "big", "--partitions", "3"]) == 0
    assert main(["log", "create", str(log_dir), "small", "--partitions", "3"]) == 0
    n, pad = 300_000, "x" * 93
    big, small = tmp_path / "big.txt", tmp_path / "small.txt"
    big.write_text("".join(f"{i:06d}{pad}\n" for i in range(n)))
    small.write_text("".join(f"{i:06d}{pad}\n" for i in range(100)))
    input_mib = big.stat().st_size / 2**20
    assert input_mib > 28

    baseline = _produce_measured(log_dir, "small", small)
    measured = _produce_measured(log_dir, "big", big)
    assert baseline["code"] == 0 and measured["code"] == 0, (baseline, measured)
    assert f"appended {n} records" in str(measured["out"])
    growth = float(str(measured["peak_mib"])) - float(str(baseline["peak_mib"]))
    assert growth < input_mib / 2, (
        f"peak RSS grew {growth:.1f} MiB for {input_mib:.1f} MiB of input "
        f"({baseline['peak_mib']:.0f} -> {measured['peak_mib']:.0f} MiB)"
    )

    values = _all_values(log_dir, "big")
    assert len(values) == n
    assert sorted(values) == [f"{i:06d}{pad}".encode() for i in range(n)]


def test_a_malformed_line_stops_with_its_number_and_the_count_already_appended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = tmp_path / "log"
    assert main(["log", "create", str(log_dir), "t", "--partitions", "2"]) == 0
    bad = 2 * CHUNK + 3457  # in the third chunk
    lines = [f"k{i % 7}=v{i}" for i in range(1, 3 * CHUNK)]
    lines[bad - 1] = "no separator here"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    capsys.readouterr()
    assert main(["log", "produce", str(log_dir), "t", "--separator", "="]) == EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith(f"sparkonce: bad input: line {bad}: 'no separator here' has no ")
    sent = 2 * CHUNK
    assert f"the {sent} records of lines 1..{sent} were already appended" in err
    assert f"send only lines {sent + 1} onwards" in err
    # Exactly the lines of the chunks before the bad line's, each once.
    assert sorted(_all_values(log_dir, "t")) == sorted(f"v{i}".encode() for i in range(1, sent + 1))


def test_a_malformed_line_in_the_first_chunk_appends_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log_dir = tmp_path / "log"
    assert main(["log", "create", str(log_dir), "t", "--partitions", "1"]) == 0
    monkeypatch.setattr("sys.stdin", io.StringIO("a=1\nb=2\nbad\nc=3\n"))
    capsys.readouterr()
    assert main(["log", "produce", str(log_dir), "t", "--separator", "="]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "line 3: 'bad' has no separator '='" in err and "Nothing was appended." in err
    with Topic(log_dir, "t") as t:
        assert t.end_offsets() == {0: 0}


def test_the_help_text_states_the_chunked_semantics(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["log", "produce", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"chunks of {CHUNK} lines" in text
    assert "already appended" in text and "appends them again" in text


def test_kafka_produce_streams_stdin_and_stops_at_a_malformed_line(
    kafka_topic: Callable[..., str],
    kafka_broker: KafkaBroker,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`sparkonce kafka produce` shares the chunked reading (needs the test Kafka broker)."""
    from sparkonce.kafka import KafkaConnection
    from sparkonce.kafka.topic import tail

    topic = kafka_topic("cli-stream", partitions=2)
    bad = CHUNK + 123
    lines = [f"k{i % 5}=v{i}" for i in range(1, 2 * CHUNK)]
    lines[bad - 1] = "no separator"
    monkeypatch.setattr("sys.stdin", io.StringIO("\n".join(lines) + "\n"))
    argv = ["kafka", "produce", kafka_broker.bootstrap, topic, "--separator", "="]
    assert main(argv) == EXIT_USAGE
    # The last line is the error (client warnings, e.g. a coordinator still loading, may
    # come before it).
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"sparkonce: bad input: line {bad}: 'no separator' has no "), err
    assert f"the {CHUNK} records of lines 1..{CHUNK} were already delivered" in err
    got = list(tail(KafkaConnection(kafka_broker.bootstrap), topic, 3 * CHUNK))
    assert Counter(r.value for r in got) == Counter(f"v{i}".encode() for i in range(1, CHUNK + 1))
