"""A run whose ``s3a://`` checkpoint has no credentials fails within seconds, naming the cause.

``sparkonce run`` as a user starts it, with S3A pointed at the tests' S3 server through
``spark-defaults.conf`` and no credentials anywhere (S3A's default provider chain: the
session's keys, the environment, the EC2 instance's role).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.services.s3 import S3Server

pytestmark = pytest.mark.s3

_PIPELINE = """
from sparkonce import EmbeddedLogSource, Pipeline, sink_from_url

pipeline = Pipeline(
    name="nocreds",
    source=EmbeddedLogSource({log!r}, "events"),
    sink=sink_from_url({url!r}, "out"),
    checkpoint={checkpoint!r},
    transform=lambda df: df.select("record_id"),
)
"""


def test_an_s3_checkpoint_without_credentials_names_the_cause_within_seconds(
    tmp_path: Path, s3: S3Server, s3_bucket: str, make_log
) -> None:
    conf_dir = tmp_path / "spark-conf"
    conf_dir.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.hadoop.fs.s3a.endpoint {s3.endpoint}\n"
        f"spark.hadoop.fs.s3a.endpoint.region {s3.region}\n"
        "spark.hadoop.fs.s3a.path.style.access true\n"
        "spark.hadoop.fs.s3a.connection.ssl.enabled false\n"
    )
    pipeline_file = tmp_path / "pipeline.py"
    pipeline_file.write_text(
        _PIPELINE.format(
            log=str(make_log(10, partitions=1)),
            url=f"sqlite:///{tmp_path / 'out.db'}",
            checkpoint=f"s3a://{s3_bucket}/chk",
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        SPARK_CONF_DIR=str(conf_dir),
        PYSPARK_PYTHON=sys.executable,
        HOME=str(tmp_path),  # no ~/.aws either
    )
    log_file = tmp_path / "run.log"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "sparkonce", "run", str(pipeline_file), "--log-file", str(log_file)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    seconds = time.monotonic() - started
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stderr
    assert last.startswith("sparkonce: bad input: s3a://"), last
    assert "No AWS Credentials provided" in last, last
    assert "An error occurred while calling" not in last, last
    assert seconds < 40, f"took {seconds:.0f} s: {last}"
