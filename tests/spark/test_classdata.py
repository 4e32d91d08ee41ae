"""A driver's JVM loads Spark's classes from the class-data archive the test run built
(tests/conftest.py), and starts without it when the archive is unusable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sparkonce.spark import classdata

# A driver as `sparkonce run` starts one, logging where each loaded class came from.
DRIVER = """
import sys
from sparkonce.spark.session import build_session
spark = build_session(
    quick_start=True,
    log_file=sys.argv[2],
    conf={"spark.driver.extraJavaOptions": f"-Xlog:class+load=info:file={sys.argv[1]}"},
)
assert spark.range(100).selectExpr("sum(id)").collect()[0][0] == 4950
"""


def _spark_classes(tmp_path: Path, name: str, env: dict[str, str]) -> dict[str, int]:
    """How many Spark classes the driver's JVM loaded from each source."""
    loads = tmp_path / f"{name}.classes"
    subprocess.run(
        [sys.executable, "-c", DRIVER, str(loads), str(tmp_path / f"{name}.spark.log")],
        env={**os.environ, **env},
        check=True,
        timeout=300,
    )
    sources: dict[str, int] = {}
    for line in loads.read_text().splitlines():
        if " org.apache.spark." in line and "source: " in line:
            source = line.split("source: ", 1)[1]
            key = "archive" if source.startswith("shared objects file (top)") else "jars"
            sources[key] = sources.get(key, 0) + 1
    return sources


def test_the_driver_maps_spark_classes_from_the_archive(tmp_path: Path) -> None:
    assert classdata.java_options(), "tests/conftest.py built no class-data archive"
    sources = _spark_classes(tmp_path, "with", {})
    assert sources.get("archive", 0) > 1000, sources
    assert sources.get("archive", 0) > sources.get("jars", 0), sources  # most of them


def test_an_unusable_archive_is_ignored(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    path = classdata.archive_path()
    assert path is not None
    stale = cache / path.relative_to(classdata.cache_dir())
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"not an archive")  # a truncated or foreign file at the archive's name
    sources = _spark_classes(tmp_path, "stale", {classdata.CACHE_ENV: str(cache)})
    assert sources.get("archive", 0) == 0 and sources.get("jars", 0) > 1000, sources
