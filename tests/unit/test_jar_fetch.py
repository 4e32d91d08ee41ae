"""``sparkonce jars fetch``: the pinned jars, downloaded, checked, and found by sessions.

The repository here is a real Maven-layout directory (``file://``) made of the jars
``make jars`` fetched with Maven; tests/packaging/test_wheel.py fetches from Maven Central
itself, from the installed wheel.
"""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from sparkonce.cli import main
from sparkonce.errors import JarFetchError
from sparkonce.spark.jars import JAR_SETS, Artifact, fetch_jars, find_jars, user_jar_cache

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "jars"
# jars/pom.xml's property for each pinned artifact's version.
POM_PROPERTY = {
    "spark-sql-kafka-0-10_2.13": "spark-kafka.version",
    "spark-token-provider-kafka-0-10_2.13": "spark-token-provider.version",
    "kafka-clients": "spark-kafka-clients.version",
    "commons-pool2": "commons-pool2.version",
    "delta-spark_4.2_2.13": "delta.version",
    "delta-storage": "delta.version",
    "hadoop-aws": "hadoop-aws.version",
    "bundle": "aws-sdk-bundle.version",
    "analyticsaccelerator-s3": "s3-analytics-accelerator.version",
}


def _pom_properties() -> dict[str, str]:
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    props = ET.parse(ROOT / "jars" / "pom.xml").getroot().find("m:properties", ns)
    assert props is not None
    return {child.tag.split("}", 1)[1]: (child.text or "").strip() for child in props}


def _repository(tmp_path: Path, kinds: tuple[str, ...] = ("delta", "spark-kafka")) -> Path:
    """A Maven-layout repository of ``kinds`` made of ``make jars``'s copies."""
    repo = tmp_path / "repo"
    for kind in kinds:
        for a in JAR_SETS[kind]:
            url = a.url(repo.as_uri())
            target = Path(url[len("file://") :])
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(CACHE / kind / a.file_name)
    return repo


def test_the_pins_are_the_poms_and_the_jars_maven_fetched() -> None:
    props = _pom_properties()
    for kind, artifacts in JAR_SETS.items():
        for a in artifacts:
            assert a.version == props[POM_PROPERTY[a.name]], a.coordinate
            if kind == "s3":
                continue  # 690 MB: its size is checked, its digest by fetch_jars when fetched
            jar = CACHE / kind / a.file_name
            assert jar.stat().st_size == a.size, a.coordinate
            from sparkonce.spark.jars import _sha256

            assert _sha256(jar) == a.sha256, a.coordinate
    for a in JAR_SETS["s3"]:
        assert (CACHE / "s3" / a.file_name).stat().st_size == a.size, a.coordinate


def test_fetched_jars_are_the_pinned_ones_and_sessions_find_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = _repository(tmp_path)
    dest = tmp_path / "jars"
    seen: list[tuple[str, int]] = []
    fetched = fetch_jars(
        ["delta", "spark-kafka"],
        dest,
        repository=repo.as_uri(),
        progress=lambda a, n: seen.append((a.name, n)),
    )
    for kind in ("delta", "spark-kafka"):
        assert sorted(p.name for p in fetched[kind]) == sorted(a.file_name for a in JAR_SETS[kind])
        for a in JAR_SETS[kind]:
            got = dest / kind / a.file_name
            assert got.read_bytes() == (CACHE / kind / a.file_name).read_bytes()
            assert got.stat().st_mode & 0o044, "not readable by others"
            assert sum(n for name, n in seen if name == a.name) == a.size
        assert sorted(p.name for p in (dest / kind).iterdir()) == sorted(
            a.file_name for a in JAR_SETS[kind]
        ), "a temporary file was left"

    monkeypatch.setenv("SPARKONCE_JAR_CACHE", str(dest))
    assert find_jars("delta") == [str(dest / "delta" / a.file_name) for a in JAR_SETS["delta"]]
    assert set(find_jars("spark-kafka")) == {str(p) for p in fetched["spark-kafka"]}

    # Fetched again: kept as they are, nothing downloaded.
    before = {p: p.stat().st_mtime_ns for p in fetched["delta"]}
    shutil.rmtree(repo)
    assert fetch_jars(["delta"], dest, repository=repo.as_uri())["delta"] == fetched["delta"]
    assert {p: p.stat().st_mtime_ns for p in fetched["delta"]} == before


def test_the_user_cache_is_found_without_a_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SPARKONCE_JAR_CACHE", raising=False)
    monkeypatch.delenv("SPARKONCE_DELTA_JARS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_jar_cache() == tmp_path / "xdg" / "sparkonce" / "jars"
    fetch_jars(["delta"], repository=_repository(tmp_path, ("delta",)).as_uri())
    # Before the checkout's .cache/jars, which this test's own checkout has.
    assert find_jars("delta") == [
        str(user_jar_cache() / "delta" / a.file_name) for a in JAR_SETS["delta"]
    ]


def test_a_download_that_is_not_the_pinned_jar_is_refused_and_not_kept(tmp_path: Path) -> None:
    repo = _repository(tmp_path, ("delta",))
    storage: Artifact = JAR_SETS["delta"][1]
    planted = Path(storage.url(repo.as_uri())[len("file://") :])
    planted.unlink()
    data = bytearray((CACHE / "delta" / storage.file_name).read_bytes())
    data[1000] ^= 0xFF  # same size, one byte changed
    planted.write_bytes(bytes(data))
    dest = tmp_path / "jars"
    with pytest.raises(JarFetchError) as caught:
        fetch_jars(["delta"], dest, repository=repo.as_uri())
    message = str(caught.value)
    assert storage.coordinate in message and storage.sha256 in message
    assert "nothing was kept" in message
    assert not (dest / "delta" / storage.file_name).exists()
    assert [p.name for p in (dest / "delta").iterdir()] == [JAR_SETS["delta"][0].file_name]


def test_a_missing_jar_names_its_url(tmp_path: Path) -> None:
    repo = _repository(tmp_path, ("delta",))
    gone = JAR_SETS["delta"][0]
    Path(gone.url(repo.as_uri())[len("file://") :]).unlink()
    with pytest.raises(JarFetchError) as caught:
        fetch_jars(["delta"], tmp_path / "jars", repository=repo.as_uri())
    assert gone.url(repo.as_uri()) in str(caught.value)
    assert list((tmp_path / "jars" / "delta").iterdir()) == []


def test_the_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    repo = _repository(tmp_path, ("delta",))
    dest = tmp_path / "jars"
    argv = ["jars", "fetch", "delta", "--dir", str(dest), "--repository", repo.as_uri()]
    assert main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"delta: 2 jars in {dest / 'delta'}",
        f"sessions find them with SPARKONCE_JAR_CACHE={dest}",
    ]
    assert main(["jars", "fetch", "delta", "iceberg", "--dir", str(dest)]) == 2
    err = capsys.readouterr().err
    assert "unknown jar kind 'iceberg'" in err and "spark-kafka, delta, s3" in err
    assert main(["jars", "list"]) == 0
    assert "io.delta:delta-spark_4.2_2.13:4.4.0" in capsys.readouterr().out
