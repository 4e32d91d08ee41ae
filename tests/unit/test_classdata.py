"""The JVM class-data archive's name and its build's failure (sparkonce.spark.classdata);
tests/spark/test_classdata.py checks that a driver's JVM really maps it."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pytest

from sparkonce.errors import ConfigError
from sparkonce.spark import classdata


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(classdata.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(classdata.DISABLE_ENV, raising=False)
    return tmp_path / "cache"


def test_the_archive_is_named_after_the_jars_it_was_built_from(cache: Path, tmp_path: Path) -> None:
    jars = tmp_path / "jars"
    jars.mkdir()
    (jars / "a.jar").write_bytes(b"one")
    first = classdata.archive_path(jars)
    assert first is not None and first.parent == cache / "spark-class-data"
    assert classdata.archive_path(jars) == first
    (jars / "a.jar").write_bytes(b"two!")  # a jar replaced in place (another size)
    assert classdata.archive_path(jars) != first
    (jars / "b.jar").write_bytes(b"")
    assert len({first, classdata.archive_path(jars)}) == 2


def test_no_options_without_an_archive_or_when_turned_off(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert classdata.java_options() == ""  # nothing built in this cache
    path = classdata.archive_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_bytes(b"x")
    assert classdata.java_options() == f"-XX:SharedArchiveFile={path} {classdata.QUIET}"
    monkeypatch.setenv(classdata.DISABLE_ENV, "1")
    assert classdata.java_options() == ""
    assert classdata.ensure_archive() is None


def test_a_failed_build_names_its_log_and_leaves_no_archive(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The build runs `<python> -m sparkonce.spark.classdata_dump TARGET`; this one exits 2
    # without writing TARGET.
    fake = cache.parent / "python"
    fake.write_text("#!/bin/sh\necho build went wrong\nexit 2\n")
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    told: list[str] = []
    with pytest.raises(ConfigError, match=r"exit code 2\); see .*build\.log.*NO_CLASS_DATA=1"):
        classdata.ensure_archive(on_build=told.append)
    assert len(told) == 1 and "class-data archive" in told[0]
    folder = cache / "spark-class-data"
    assert (folder / "build.log").read_text() == "build went wrong\n"
    # No archive, no temp file: only the log and the (empty) lock file the builds take turns on.
    assert sorted(p.name for p in folder.iterdir()) == [".build.lock", "build.log"]
    assert not os.environ.get(classdata.DISABLE_ENV)


def test_processes_building_at_once_take_turns_and_build_once(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """make test's two pytest workers both ask for the archive as they start: the one that
    waited finds it built and uses it, instead of a second minute-long build."""
    builds = cache.parent / "builds"
    # The build runs `<python> -m sparkonce.spark.classdata_dump TARGET`; this one counts its
    # runs, takes a while, then writes TARGET.
    fake = cache.parent / "python"
    fake.write_text(f'#!/bin/sh\necho x >> {builds}\nsleep 1\necho archive > "$3"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(fake))
    got: list[Path | None] = []
    threads = [
        threading.Thread(target=lambda: got.append(classdata.ensure_archive())) for _ in "ab"
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = classdata.archive_path()
    assert path is not None and got == [path, path]
    assert path.read_text() == "archive\n"
    assert builds.read_text() == "x\n", "the archive was built twice"
