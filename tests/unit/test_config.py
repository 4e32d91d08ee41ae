"""Tests of sparkonce.config: store URLs (and their secrets), triggers, names."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkonce.config import (
    StoreURL,
    Trigger,
    check_identifier,
    check_pipeline_name,
    is_count,
    mask_url,
)
from sparkonce.errors import ConfigError

SECRET = "hunter2-S3cret"

# -- StoreURL: SQLite ------------------------------------------------------------


def test_sqlite_relative_path() -> None:
    u = StoreURL.parse("sqlite:///data/out.db")
    assert u.scheme == "sqlite"
    assert u.path == Path("data/out.db")
    assert not u.path.is_absolute()
    assert str(u) == "sqlite:///data/out.db"
    assert u.address == "data/out.db"
    assert u.host is None and u.password is None


def test_sqlite_absolute_path() -> None:
    u = StoreURL.parse("sqlite:////tmp/x/out.db")
    assert u.path == Path("/tmp/x/out.db")
    assert str(u) == "sqlite:////tmp/x/out.db"
    assert StoreURL.parse(str(u)) == u  # str() parses back to the same URL


@pytest.mark.parametrize("url", ["sqlite:///", "sqlite://", "sqlite:///dir/"])
def test_sqlite_missing_path(url: str) -> None:
    with pytest.raises(ConfigError, match="SQLite path is missing"):
        StoreURL.parse(url)


# -- StoreURL: PostgreSQL --------------------------------------------------------


def test_postgresql_full() -> None:
    u = StoreURL.parse(f"postgresql://alice:{SECRET}@db.example:6543/shop?sslmode=require")
    assert (u.scheme, u.host, u.port, u.user, u.dbname) == (
        "postgresql",
        "db.example",
        6543,
        "alice",
        "shop",
    )
    assert u.password == SECRET
    assert u.params == (("sslmode", "require"),)
    assert str(u) == "postgresql://alice:***@db.example:6543/shop?sslmode=require"
    assert u.address == "db.example:6543"


def test_postgresql_without_password_or_port() -> None:
    u = StoreURL.parse("postgresql://bob@localhost/app")
    assert (u.host, u.port, u.user, u.dbname, u.password) == ("localhost", 5432, "bob", "app", None)
    assert str(u) == "postgresql://bob@localhost:5432/app"
    u = StoreURL.parse("postgresql://localhost:5999/app")
    assert (u.user, u.port) == (None, 5999)
    assert str(u) == "postgresql://localhost:5999/app"


def test_postgres_alias_and_encoded_parts() -> None:
    u = StoreURL.parse("postgres://al%40ice:p%40ss%2Fw@h:1/my%20db")
    assert u.scheme == "postgresql"
    assert (u.user, u.password, u.dbname) == ("al@ice", "p@ss/w", "my db")
    assert "p@ss" not in str(u) and "p%40ss" not in str(u)
    assert u == StoreURL.parse("postgresql://al%40ice@h:1/my%20db")  # password not compared


@pytest.mark.parametrize(
    ("url", "match"),
    [
        (f"postgresql://u:{SECRET}@host:5432", "database name is missing"),
        (f"postgresql://u:{SECRET}@host:5432/", "database name is missing"),
        (f"postgresql://u:{SECRET}@host:abc/db", "port is not a number"),
        (f"postgresql://u:{SECRET}@host:70000/db", "port is not a number"),
        (f"postgresql://u:{SECRET}@/db", "host is missing"),
        (f"postgresql://u:{SECRET}@host/db?password={SECRET}", "parameter 'password'"),
        (f"postgresql://u:{SECRET}@host/db?sslmode=require&foo=1", "parameter 'foo'"),
        (f"mysql://u:{SECRET}@host/db", "scheme 'mysql' is not supported"),
        ("just-a-path.db", "is not a URL"),
    ],
)
def test_bad_urls_name_the_bad_part_and_hide_the_password(url: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        StoreURL.parse(url)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value)


def test_password_absent_from_str_and_repr() -> None:
    u = StoreURL.parse(f"postgresql://u:{SECRET}@h:5/db?application_name=x")
    assert u.password == SECRET
    for text in (str(u), repr(u), f"{u}", f"{u!r}", u.address):
        assert SECRET not in text
    assert "***" in str(u)


def test_non_string_url_is_rejected() -> None:
    with pytest.raises(ConfigError, match="not a URL"):
        StoreURL.parse(None)  # type: ignore[arg-type]


def test_not_a_url_error_hides_the_password() -> None:
    with pytest.raises(ConfigError, match="is not a URL") as info:
        StoreURL.parse(f"postgresql:/u:{SECRET}@host/db")
    assert SECRET not in str(info.value)


def test_port_zero_is_rejected() -> None:
    with pytest.raises(ConfigError, match="port"):
        StoreURL.parse("postgresql://u@host:0/db")


@pytest.mark.parametrize(
    "url",
    [
        f"postgresql://u:{SECRET}@[::1:5432/db",  # the bracket is never closed
        f"postgresql://u:{SECRET}@[::1/db",
        f"postgres://u:{SECRET}@[fe80::1%eth0:5432/db",
    ],
)
def test_malformed_ipv6_url_is_a_config_error_naming_the_masked_url(url: str) -> None:
    with pytest.raises(ConfigError, match="is malformed") as info:
        StoreURL.parse(url)
    assert SECRET not in str(info.value)
    assert url.replace(SECRET, "***") in str(info.value)


def test_ipv6_host_is_bracketed_in_str_and_address() -> None:
    u = StoreURL.parse(f"postgresql://u:{SECRET}@[::1]:6543/db")
    assert u.host == "::1" and u.port == 6543
    assert u.address == "[::1]:6543"
    assert str(u) == "postgresql://u:***@[::1]:6543/db"
    assert StoreURL.parse(str(u).replace("***", SECRET)) == u  # str() parses back


# -- Trigger ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "kind", "interval"),
    [
        ("availableNow", "availableNow", None),
        ("available-now", "availableNow", None),
        ("  availableNow ", "availableNow", None),
        ("processingTime=5 seconds", "processingTime", "5 seconds"),
        ("processingTime = 500 milliseconds", "processingTime", "500 milliseconds"),
        ("processingTime=1 minute", "processingTime", "1 minute"),
        ("processingTime=250ms", "processingTime", "250ms"),
        ("processingTime=1.5 s", "processingTime", "1.5 s"),
    ],
)
def test_trigger_parse_valid(spec: str, kind: str, interval: str | None) -> None:
    t = Trigger.parse(spec)
    assert (t.kind, t.interval) == (kind, interval)
    assert Trigger.parse(str(t)) == t
    assert Trigger.parse(t) is t


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("processingTime=", "interval must look like"),
        ("processingTime=5", "interval must look like"),
        ("processingTime=5 hours", "interval must look like"),
        ("processingTime=-1 seconds", "interval must look like"),
        ("processingTime", "not supported"),
        ("once", "not supported"),
        ("continuous=1 second", "not supported"),
        ("", "not supported"),
    ],
)
def test_trigger_parse_invalid(spec: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        Trigger.parse(spec)


def test_trigger_parse_non_string() -> None:
    with pytest.raises(ConfigError, match="must be a string"):
        Trigger.parse(5)  # type: ignore[arg-type]


# -- identifiers and pipeline names ---------------------------------------------------


@pytest.mark.parametrize("name", ["t", "_x", "Orders_2024", "a" * 63])
def test_check_identifier_valid(name: str) -> None:
    assert check_identifier(name, "table") == name


@pytest.mark.parametrize("name", ["", "1abc", "a-b", "a b", "drop table;", "a" * 64, "é", None, 5])
def test_check_identifier_invalid(name: object) -> None:
    with pytest.raises(ConfigError, match=r"^table .* is not a valid SQL identifier") as info:
        check_identifier(name, "table")
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("name", ["p", "orders.v2", "9-lives_x", "a" * 128])
def test_check_pipeline_name_valid(name: str) -> None:
    assert check_pipeline_name(name) == name


@pytest.mark.parametrize("name", ["", "-p", ".p", "a/b", "a b", "a" * 129, None])
def test_check_pipeline_name_invalid(name: object) -> None:
    with pytest.raises(ConfigError, match=r"pipeline name .* is invalid") as info:
        check_pipeline_name(name)
    assert repr(name) in str(info.value)


@pytest.mark.parametrize("kind", ["identifier", "pipeline"])
def test_names_with_trailing_newline_are_rejected(kind: str) -> None:
    with pytest.raises(ConfigError):
        if kind == "identifier":
            check_identifier("orders\n", "table")
        else:
            check_pipeline_name("orders\n")


@pytest.mark.parametrize(
    ("text", "secret", "shown"),
    [
        ("postgresql://bob:hunter2@db:5432/x", "hunter2", "postgresql://bob:***@db:5432/x"),
        # A password holding "@", ":" or "/": the host starts after the last "@".
        ("postgresql://bob:hun@ter2@db/x", "hun@ter2", "postgresql://bob:***@db/x"),
        ("postgresql://bob:hu:nt/er2@db/x", "nt/er2", "postgresql://bob:***@db/x"),
        # A libpq URL may carry it as a parameter; so may a key=value connection string.
        ("postgresql://db/x?sslmode=require&password=hunter2", "hunter2", None),
        ("host=db password=hunter2 dbname=x", "hunter2", "host=db password=*** dbname=x"),
        ("sasl.password=hunter2", "hunter2", "sasl.password=***"),
        # Inside a longer message, quoted.
        ("could not connect to 'postgresql://bob:hunter2@db/x': refused", "hunter2", None),
    ],
)
def test_mask_url_hides_every_form_of_a_password(text: str, secret: str, shown: str | None) -> None:
    masked = mask_url(text)
    assert secret not in masked and "***" in masked
    if shown is not None:
        assert masked == shown


@pytest.mark.parametrize(
    "text",
    ["postgresql://bob@db:5432/x", "postgresql://[::1]:5432/x", "kafka://broker:9092/events"],
)
def test_mask_url_leaves_a_url_without_a_secret_alone(text: str) -> None:
    assert mask_url(text) == text


@pytest.mark.parametrize(
    ("value", "least", "ok"),
    [
        (1, 1, True),
        (7, 1, True),
        (0, 0, True),
        (0, 1, False),
        (-2, 1, False),
        (True, 1, False),
        (2.0, 1, False),
        ("3", 1, False),
        (None, 1, False),
    ],
)
def test_is_count_takes_whole_numbers_from_least_and_never_a_bool(
    value: object, least: int, ok: bool
) -> None:
    assert is_count(value, least) is ok
