"""Versioned on-disk records: the one rule every codec follows.

sparkonce writes three kinds of records that outlive the process that wrote them, each
with its own codec: ledger entries (:mod:`sparkonce.ledger.records`), fault events
(:class:`sparkonce.faults.FaultEvent`) and the verify report ``verify.json``
(:class:`sparkonce.verify.report.VerifyReport`). Each codec writes its format's version
under :data:`VERSION_KEY` (a SQL ledger row: a column of that name) and reads it back
with :func:`record_version`:

* no version (a record written before records carried one): version 1, the same format;
* a version up to the codec's current one: read;
* a newer version (a newer sparkonce wrote it): :class:`~sparkonce.errors.RecordVersionError`
  naming the record and what to do, never a guess at fields this version does not know.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sparkonce.errors import RecordVersionError

VERSION_KEY = "version"
FIRST_VERSION = 1  # what a record without a version is


def record_version(data: Mapping[str, Any], current: int, what: str, todo: str) -> int:
    """The format version of the decoded record ``data`` (:data:`FIRST_VERSION` when it
    has none). ``what`` names the record (its file, table or topic), ``todo`` what the
    user should do with a newer one; raises :class:`RecordVersionError` for a version
    above ``current`` or one that is not a positive integer."""
    return check_version(data.get(VERSION_KEY), current, what, todo)


def check_version(raw: Any, current: int, what: str, todo: str) -> int:
    """:func:`record_version` for a version read on its own (a SQL column; None: none)."""
    if raw is None:
        return FIRST_VERSION
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < FIRST_VERSION:
        raise RecordVersionError(
            f"{what}: format version {raw!r} is not a positive integer, so the record was "
            f"not written by sparkonce or was changed by hand; {todo}"
        )
    if raw > current:
        raise RecordVersionError(
            f"{what} has format version {raw}, but sparkonce {_installed_version()} reads "
            f"versions up to {current}: a newer sparkonce wrote it; {todo}"
        )
    return raw


def _installed_version() -> str:
    """The installed sparkonce's version (this module sits below the package's __init__,
    so it reads the distribution's metadata instead of importing ``sparkonce``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sparkonce")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree, not installed
        return "(not installed)"
