"""``sparkonce reset`` on a Delta table: the pipeline's progress is a version in the table's
own Delta log, so a reset that keeps the rows is refused and ``--output-rows`` deletes the
table directory. The owner's holder is set to a run on another host (its owner file,
as another host's run writes it), so the reset also needs ``--holder-stopped``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from sparkonce.cli import main
from sparkonce.cli.common import EXIT_RUNNING, EXIT_USAGE
from sparkonce.sinks import DeltaSink


# About 15-20 s of Delta calls on this machine: kept out of `make test` (issue 43's brief).
@pytest.mark.crash_lane
def test_delta_reset_needs_output_rows_and_deletes_the_table(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = tmp_path / "tables" / "out"
    spark.range(3).write.format("delta").save(str(table))
    sink = DeltaSink(tmp_path / "tables", table="out")
    sink.open()
    try:
        epoch = sink.acquire("p").epoch
    finally:
        sink.close()
    owner_file = table / "_sparkonce" / "p" / "owners" / f"{epoch}.json"
    record = json.loads(owner_file.read_text())
    record["holder"] = "elsewhere.example pid 4242"
    owner_file.write_text(json.dumps(record))
    (owner_file.parent / f".{owner_file.name}.crc").unlink()  # Hadoop's checksum of the old
    url = f"delta://{table}"
    capsys.readouterr()

    assert main(["reset", "--pipeline", "p", "--sink", url, "--yes"]) == EXIT_RUNNING
    assert "elsewhere.example pid 4242" in capsys.readouterr().err
    args = ["reset", "--pipeline", "p", "--sink", url, "--yes", "--holder-stopped"]
    assert main(args) == EXIT_USAGE
    assert "cannot forget a pipeline while keeping the rows" in capsys.readouterr().err
    assert owner_file.exists()

    assert main([*args, "--output-rows"]) == 0
    assert "output deleted" in capsys.readouterr().out
    assert not table.exists()
