"""The read limits of the two range sources (EmbeddedLogSource, KafkaSource): checked and
handed to their reader the same way (sparkonce.offsets.ReadLimits,
sparkonce.sources.reader.limit_options); no Spark, no broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkonce import ConfigError, EmbeddedLogSource, KafkaSource
from sparkonce.sources.reader import CAP_OPTION, CAP_PROPORTIONAL


def _sources(tmp_path: Path, **limits: object) -> list[EmbeddedLogSource | KafkaSource]:
    return [
        EmbeddedLogSource(tmp_path / "log", "events", **limits),  # type: ignore[arg-type]
        KafkaSource("b1:9092", "events", **limits),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("value", [0, True, "5"])
def test_both_sources_refuse_a_read_limit_that_is_no_positive_integer(
    tmp_path: Path, value: object
) -> None:
    for make in (
        lambda: EmbeddedLogSource(tmp_path / "log", "events", max_records_per_batch=value),  # type: ignore[arg-type]
        lambda: KafkaSource("b1:9092", "events", max_records_per_batch=value),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError, match="max_records_per_batch must be a positive integer"):
            make()


def test_both_sources_pass_their_limits_on_and_share_them_out_once_aligned(
    tmp_path: Path,
) -> None:
    for source in _sources(tmp_path, max_records_per_partition=7, max_records_per_batch=30):
        assert source.read_limits() == {
            "max_records_per_partition": 7,
            "max_records_per_batch": 30,
        }
        opts = source.options()
        assert (opts["maxRecordsPerPartition"], opts["maxRecordsPerBatch"]) == ("7", "30")
        assert CAP_OPTION not in opts
        twin = source.aligned()
        assert twin is not None and type(twin) is type(source)
        assert twin.options()[CAP_OPTION] == CAP_PROPORTIONAL
        assert twin.options()["maxRecordsPerBatch"] == "30"
        assert twin.aligned() is None  # already shared out
        assert CAP_OPTION not in source.options()  # the original is unchanged
    for source in _sources(tmp_path):
        assert source.read_limits() == {}
        assert source.aligned() is None
        assert not {"maxRecordsPerPartition", "maxRecordsPerBatch", CAP_OPTION} & set(
            source.options()
        )
