"""Frozen, typed configuration, validated once at the boundary.

Bad values raise :class:`~sparkonce.errors.ConfigError` naming the field and what
is expected. Secrets (database passwords) are declared ``repr=False`` and are
masked in every string form, so they never reach logs or reprs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal
from urllib.parse import parse_qsl, unquote, urlsplit

from sparkonce.errors import ConfigError

Guarantee = Literal["effectively-once", "at-least-once"]
WriteMode = Literal["append", "upsert"]
OutputMode = Literal["append", "update", "complete"]  # Spark's output modes

_IDENT_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def is_count(value: object, least: int = 1) -> bool:
    """Whether ``value`` is a whole number of at least ``least``: an ``int`` that is not a
    ``bool`` (Python counts ``True`` as 1, which no option of sparkonce means)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def check_identifier(value: object, what: str) -> str:
    """A SQL identifier we can use unquoted in both SQLite and PostgreSQL."""
    if not isinstance(value, str) or not _IDENT_RE.fullmatch(value):
        raise ConfigError(
            f"{what} {value!r} is not a valid SQL identifier: use letters, digits and '_', "
            "starting with a letter or '_', at most 63 characters"
        )
    return value


def check_write_mode(mode: object, keys: Iterable[str]) -> tuple[WriteMode, tuple[str, ...]]:
    """A sink's ``mode`` and upsert ``keys``, checked: ``("append", ())`` or
    ``("upsert", keys)`` with distinct, valid column names."""
    if mode not in ("append", "upsert"):
        raise ConfigError(f"sink mode {mode!r} is not supported: use 'append' or 'upsert'")
    checked = tuple(check_identifier(k, "key column") for k in keys)
    if mode == "upsert" and not checked:
        raise ConfigError("sink mode 'upsert' needs keys=[...]: the columns that identify a row")
    if mode == "append" and checked:
        raise ConfigError("keys=[...] only applies to mode='upsert'; remove keys or set the mode")
    if len(set(checked)) != len(checked):
        raise ConfigError(f"keys {list(checked)} name a column twice")
    return mode, checked


def check_pipeline_name(value: object) -> str:
    if not isinstance(value, str) or not _NAME_RE.fullmatch(value):
        raise ConfigError(
            f"pipeline name {value!r} is invalid: use 1-128 characters from letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    return value


@dataclass(frozen=True)
class StoreURL:
    """A parsed sink store URL.

    Accepted forms::

        sqlite:///relative/or/absolute/path.db    (sqlite:////abs/path.db also works)
        postgresql://user[:password]@host[:port]/dbname[?sslmode=...&connect_timeout=...]

    ``postgres://`` is accepted as an alias. The password may also come from
    the ``PGPASSWORD`` environment variable or a ``~/.pgpass`` file.
    """

    scheme: Literal["sqlite", "postgresql"]
    path: Path | None = None
    host: str | None = None
    port: int | None = None
    user: str | None = None
    dbname: str | None = None
    params: tuple[tuple[str, str], ...] = ()
    password: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def parse(cls, url: str) -> StoreURL:
        if not isinstance(url, str) or "://" not in url:
            raise ConfigError(
                f"sink URL {_mask_raw(url)!r} is not a URL: use sqlite:///PATH.db or "
                "postgresql://USER@HOST:PORT/DBNAME"
            )
        try:
            parts = urlsplit(url)
        except ValueError as exc:  # e.g. "Invalid IPv6 URL" for an unclosed '['
            raise ConfigError(
                f"sink URL {_mask_raw(url)!r} is malformed ({exc}); an IPv6 host goes in "
                "brackets, e.g. postgresql://USER@[::1]:5432/DBNAME"
            ) from None
        scheme = parts.scheme.lower()
        if scheme == "sqlite":
            raw = url.split("://", 1)[1]
            if raw.startswith("/"):
                raw = raw[1:]  # sqlite:///rel.db -> rel.db ; sqlite:////abs.db -> /abs.db
            if not raw or raw.endswith("/"):
                raise ConfigError(
                    f"sink URL {url!r}: the SQLite path is missing; use sqlite:///PATH.db"
                )
            return cls(scheme="sqlite", path=Path(raw))
        if scheme in ("postgresql", "postgres"):
            try:
                port = parts.port
            except ValueError:
                raise ConfigError(
                    f"sink URL {_mask_raw(url)!r}: the port is not a number in 1..65535"
                ) from None
            if port == 0:
                raise ConfigError(
                    f"sink URL {_mask_raw(url)!r}: the port is not a number in 1..65535"
                )
            host = parts.hostname
            if not host:
                raise ConfigError(f"sink URL {_mask_raw(url)!r}: the host is missing")
            dbname = unquote(parts.path.lstrip("/"))
            if not dbname:
                raise ConfigError(
                    f"sink URL {_mask_raw(url)!r}: the database name is missing; "
                    "use postgresql://USER@HOST:PORT/DBNAME"
                )
            params = tuple(parse_qsl(parts.query, keep_blank_values=True))
            allowed = {"sslmode", "connect_timeout", "application_name", "options"}
            for key, _ in params:
                if key not in allowed:
                    raise ConfigError(
                        f"sink URL parameter {key!r} is not supported; use one of "
                        f"{', '.join(sorted(allowed))}"
                    )
            return cls(
                scheme="postgresql",
                host=host,
                port=port or 5432,
                user=unquote(parts.username) if parts.username else None,
                dbname=dbname,
                params=params,
                password=unquote(parts.password) if parts.password else None,
            )
        raise ConfigError(
            f"sink URL scheme {parts.scheme!r} is not supported: use sqlite:///PATH.db or "
            "postgresql://USER@HOST:PORT/DBNAME"
        )

    def __str__(self) -> str:
        """The URL with any password masked: safe for logs and messages."""
        if self.scheme == "sqlite":
            return f"sqlite:///{self.path}"
        auth = ""
        if self.user:
            auth = self.user + (":***" if self.password else "") + "@"
        query = "&".join(f"{k}={v}" for k, v in self.params)
        return f"postgresql://{auth}{self.address}/{self.dbname}" + (f"?{query}" if query else "")

    @property
    def address(self) -> str:
        """Where the store lives, for error messages: ``host:port`` or the file path.

        An IPv6 host is bracketed (``[::1]:5432``), as in the URL it came from.
        """
        if self.scheme == "sqlite":
            return str(self.path)
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"{host}:{self.port}"


def mask_url(url: object) -> str:
    """``url`` (or any text holding URLs) as given, with its secrets replaced by ``***``.

    Masked: the password of a ``scheme://user:password@host`` (one holding ``@``, ``:``
    or ``/`` too: the host starts after the authority's last ``@``), of a ``user:password@``
    without a scheme, and the value of a ``password=``-like parameter (a libpq URL's query,
    or a ``key=value`` connection string).
    """
    return _mask_raw(url)


# A password in a URL's authority: up to the last "@" before the host (which holds none).
_URL_PASSWORD = re.compile(
    r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@'\"]*):[^\s'\"?#]*@(?=[^@\s'\"/?#]*(?:[/?#\s'\",;)]|$))"
)
_USERINFO_PASSWORD = re.compile(r"([^:/@\s'\"]+):([^@/\s'\"]*)@")
_SECRET_PARAMETER = re.compile(
    r"(?i)(?<![A-Za-z0-9_.])((?:ssl)?password|passwd|pwd|secret|token|sasl[._]password)"
    r"=('[^']*'|[^&\s'\"]*)"
)


def _mask_raw(url: object) -> str:
    if not isinstance(url, str):
        return repr(url)
    text = _URL_PASSWORD.sub(r"\1:***@", url)
    text = _USERINFO_PASSWORD.sub(r"\1:***@", text)
    return _SECRET_PARAMETER.sub(r"\1=***", text)


TriggerKind = Literal["availableNow", "processingTime"]


@dataclass(frozen=True)
class Trigger:
    """When micro-batches run.

    ``"availableNow"`` processes what the source holds when the run starts (in
    batches that respect the read limits) and then stops. ``"processingTime=5
    seconds"`` runs a batch every interval until stopped.
    """

    kind: TriggerKind
    interval: str | None = None

    @classmethod
    def parse(cls, spec: str | Trigger) -> Trigger:
        if isinstance(spec, Trigger):
            return spec
        if not isinstance(spec, str):
            raise ConfigError(f"trigger must be a string, got {spec!r}")
        text = spec.strip()
        if text in ("availableNow", "available-now"):
            return cls("availableNow")
        kind, sep, interval = text.partition("=")
        if kind.strip() == "processingTime" and sep:
            interval = interval.strip()
            if not re.match(
                r"^\d+(\.\d+)?\s*(milliseconds?|ms|seconds?|s|minutes?|min)$", interval
            ):
                raise ConfigError(
                    f"trigger {spec!r}: the interval must look like '500 milliseconds', "
                    "'5 seconds' or '1 minute'"
                )
            return cls("processingTime", interval)
        raise ConfigError(
            f"trigger {spec!r} is not supported: use 'availableNow' or "
            "'processingTime=<interval>' (for example 'processingTime=5 seconds')"
        )

    def __str__(self) -> str:
        return self.kind if self.interval is None else f"{self.kind}={self.interval}"
