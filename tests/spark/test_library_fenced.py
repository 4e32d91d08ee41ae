"""Library use: ``Pipeline.run`` on the user's own ``SparkSession`` (Spark's default log4j
profile, logging to the console), fenced at its commit, raises ``FencedError`` and prints
no Java stack before it.

A real driver in a subprocess (about 35 s here, hence the crash lane): the user's script
builds its session with ``SparkSession.builder`` and catches the error. The fencing is real:
a newer run takes the epoch just before this run's commit, so the protocol fences it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    from pyspark.sql import SparkSession

    from sparkonce import EmbeddedLogSource, FencedError, Pipeline, SQLiteSink
    from sparkonce.log import IdempotentProducer, Topic

    HERE = Path(sys.argv[1])
    topic = Topic.create(HERE / "log", "ev", 1)
    with topic, IdempotentProducer(topic, "p") as producer:
        producer.send(b"1", b"k")


    class UsurpedSink(SQLiteSink):
        # The real sink, taken over by a newer run just before this run's commit.
        def commit(self, ctx, df):
            with SQLiteSink(self.url, "out") as newer:
                newer.acquire(ctx.pipeline)
            return super().commit(ctx, df)


    spark = SparkSession.builder.master("local[1]").getOrCreate()
    pipeline = Pipeline(
        name="usurped",
        source=EmbeddedLogSource(HERE / "log", "ev"),
        transform=lambda df: df.selectExpr("CAST(value AS STRING) AS v"),
        sink=UsurpedSink(f"sqlite:///{HERE / 'out.db'}", "out"),
        checkpoint=HERE / "checkpoint",
        trigger="availableNow",
    )
    try:
        pipeline.run(spark)
    except FencedError as exc:
        print("FENCED", str(exc).splitlines()[0][:80], flush=True)
    print("AFTER", spark.range(3).count(), flush=True)  # the session still works
    spark.stop()
    """
)


@pytest.mark.crash_lane
def test_a_fenced_library_run_prints_no_spark_stack(tmp_path: Path) -> None:
    (tmp_path / "user.py").write_text(SCRIPT)
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    done = subprocess.run(
        [sys.executable, str(tmp_path / "user.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "FENCED pipeline 'usurped': this run holds epoch 1" in done.stdout, done.stdout
    assert "AFTER 3" in done.stdout
    printed = done.stdout + done.stderr
    assert "terminated with error" not in printed, done.stderr
    assert "\tat org.apache.spark" not in printed and "Traceback" not in printed, done.stderr
