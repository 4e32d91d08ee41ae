"""DeltaSink refuses a PySpark its Delta release is not built for, naming both versions."""

from __future__ import annotations

import pytest

from sparkonce.errors import ConfigError
from sparkonce.sinks.delta import DELTA_VERSION, check_delta_supports


def test_delta_accepts_spark_4_2() -> None:
    check_delta_supports("4.2.0")
    check_delta_supports("4.2.1")


@pytest.mark.parametrize("version", ["4.3.0", "4.1.1", "5.0.0"])
def test_delta_refuses_other_spark_naming_both_versions(version: str) -> None:
    with pytest.raises(ConfigError, match=rf"PySpark {version}.*Delta {DELTA_VERSION}.*4\.2"):
        check_delta_supports(version)
