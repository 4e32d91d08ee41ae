"""A fenced `sparkonce run`: one line on stderr, exit 3, no traceback before it.

This one starts Spark (a real driver in a subprocess, about 30 s), hence the ``spark``
marker; the fencing is real: a newer run takes the epoch just before the first commit.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sparkonce.cli import main
from sparkonce.cli.common import EXIT_FENCED

PIPELINE = textwrap.dedent(
    """
    from pathlib import Path

    from sparkonce import EmbeddedLogSource, Pipeline, SQLiteSink

    HERE = Path(__file__).parent


    class UsurpedSink(SQLiteSink):
        # A failure double on the real sink: a newer run takes the pipeline over just
        # before this run's commit, so the real protocol fences this run at step 1.
        def commit(self, ctx, df):
            with SQLiteSink(self.url, "out") as newer:
                newer.acquire(ctx.pipeline)
            return super().commit(ctx, df)


    pipeline = Pipeline(
        name="usurped",
        source=EmbeddedLogSource(HERE / "log", "ev"),
        transform=lambda df: df.selectExpr("CAST(value AS STRING) AS v"),
        sink=UsurpedSink(f"sqlite:///{HERE / 'out.db'}", "out"),
        checkpoint=HERE / "checkpoint",
        trigger="availableNow",
    )
    """
)


@pytest.mark.spark
def test_a_fenced_run_prints_one_line_and_exits_3(tmp_path: Path) -> None:
    assert main(["log", "create", str(tmp_path / "log"), "ev", "--partitions", "1"]) == 0
    assert main(["log", "produce", str(tmp_path / "log"), "ev", "--value", "1"]) == 0
    (tmp_path / "p.py").write_text(PIPELINE)
    cli = Path(sys.executable).with_name("sparkonce")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [str(cli), "run", "--quick-start", str(tmp_path / "p.py")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == EXIT_FENCED, done.stderr
    lines = done.stderr.splitlines()
    fenced = [ln for ln in lines if ln.startswith("sparkonce: fenced:")]
    assert len(fenced) == 1 and fenced == lines[-1:], done.stderr
    assert lines[-1].startswith("sparkonce: fenced: pipeline 'usurped': this run holds epoch 1")
    assert "Traceback" not in done.stderr and "ERROR" not in done.stderr, done.stderr
    with sqlite3.connect(tmp_path / "out.db") as conn:  # the fenced batch wrote nothing
        assert conn.execute("SELECT COUNT(*) FROM sparkonce_ledger").fetchone() == (0,)
