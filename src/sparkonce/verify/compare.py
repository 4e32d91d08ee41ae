"""Comparing two sets of output rows: as multisets, or matched by key columns.

Pure Python, no Spark: the verifier compares rows that come from different
places (a sink's store, Spark's own Arrow batches, a JSON-lines file), so values
are first brought to one canonical form (:func:`canonical_value`):

- NULL is ``None`` and equals NULL (not SQL's three-valued logic);
- booleans are integers (SQLite stores them so);
- floats keep 12 significant digits (sums taken in another order differ in the
  last bits); NaN equals NaN;
- decimals, dates and times are their ISO text (SQLite stores them so); an
  aware timestamp is first moved to UTC, so a PostgreSQL ``timestamptz`` in
  another session time zone is the same instant;
- bytes are UTF-8 text when they decode (the Kafka sink shows them so), else
  ``0x<hex>``;
- arrays are tuples, structs and maps sorted ``(key, value)`` tuples.

Without key columns, rows are compared as multisets: two equal rows are two
records, and one of them missing is one missing row. With key columns, rows are
matched by key; where a key has rows on both sides with other values, each pair
counts as one value mismatch rather than one missing plus one extra row.
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

from sparkonce.errors import ConfigError

FLOAT_DIGITS = 12  # significant digits kept of a float
EXAMPLES = 5  # example rows kept per kind of difference

CanonicalRow = tuple[tuple[str, Any], ...]


def canonical_value(v: Any) -> Any:
    """A hashable value, equal for equal data whichever store it was read from.

    Idempotent: ``canonical_value(canonical_value(v)) == canonical_value(v)``, and
    a JSON round trip of a canonical value (tuples become lists) changes nothing
    once it is made canonical again.
    """
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return v
        return float(f"{v:.{FLOAT_DIGITS}g}")
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, datetime):
        if v.tzinfo is not None and v.utcoffset() is not None:
            v = v.astimezone(UTC)
        return v.isoformat()
    if isinstance(v, (date, time)):
        return v.isoformat()
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + b.hex()
    if isinstance(v, Mapping):
        items = [(canonical_value(k), canonical_value(x)) for k, x in v.items()]
        return tuple(sorted(items, key=lambda kv: repr(kv[0])))
    if isinstance(v, (list, tuple)):
        return tuple(canonical_value(x) for x in v)
    return v


def canonical_row(row: Mapping[str, Any]) -> CanonicalRow:
    """A hashable, column-order-independent form of a row."""
    return tuple(sorted((str(k), canonical_value(v)) for k, v in row.items()))


def as_dict(row: CanonicalRow) -> dict[str, Any]:
    return dict(row)


@dataclass(frozen=True)
class RowDiff:
    """How ``actual`` differs from ``expected`` (see the module docstring).

    ``missing``: rows of ``expected`` that ``actual`` lacks; ``extra``: rows of
    ``actual`` that ``expected`` lacks (duplicates included); ``mismatched``:
    with key columns, pairs of rows that share a key but not their values. The
    ``*_examples`` hold the first few of each, in a stable order.
    """

    expected_rows: int
    actual_rows: int
    key_columns: tuple[str, ...] = ()
    missing: int = 0
    extra: int = 0
    mismatched: int = 0
    missing_examples: tuple[dict[str, Any], ...] = ()
    extra_examples: tuple[dict[str, Any], ...] = ()
    mismatched_examples: tuple[tuple[dict[str, Any], dict[str, Any]], ...] = field(default=())

    @property
    def matched(self) -> bool:
        return self.missing == 0 and self.extra == 0 and self.mismatched == 0

    def counts(self) -> str:
        text = f"{self.missing} rows missing, {self.extra} extra"
        if self.key_columns:
            text += f", {self.mismatched} with other values for their key"
        return text

    def describe(self, expected: str = "expected", actual: str = "actual") -> str:
        """A few lines naming example rows of each difference (empty if matched)."""
        if self.matched:
            return ""
        how = (
            f"rows matched by key ({', '.join(self.key_columns)})"
            if self.key_columns
            else "rows compared as multisets"
        )
        lines = [
            f"{expected}: {self.expected_rows} rows, {actual}: {self.actual_rows} rows; "
            f"{self.counts()} ({how})"
        ]
        for title, count, rows in (
            (f"missing (in {expected}, not in {actual})", self.missing, self.missing_examples),
            (f"extra (in {actual}, not in {expected})", self.extra, self.extra_examples),
        ):
            if count:
                lines.append(f"  {title}, {len(rows)} of {count}:")
                lines += [f"    {_show(r)}" for r in rows]
        if self.mismatched:
            lines.append(
                f"  other values for the same key, {len(self.mismatched_examples)} of "
                f"{self.mismatched}:"
            )
            for want, got in self.mismatched_examples:
                lines.append(f"    {expected} {_show(want)}")
                lines.append(f"    {actual:>{len(expected)}} {_show(got)}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {
            "key_columns": list(self.key_columns),
            "missing": self.missing,
            "extra": self.extra,
            "mismatched": self.mismatched,
            "missing_examples": list(self.missing_examples),
            "extra_examples": list(self.extra_examples),
            "mismatched_examples": [list(p) for p in self.mismatched_examples],
        }


def _show(row: Mapping[str, Any]) -> str:
    return json.dumps(row, default=str, ensure_ascii=False)


def _first(rows: Iterable[CanonicalRow], n: int) -> tuple[dict[str, Any], ...]:
    return tuple(as_dict(r) for r in sorted(rows, key=repr)[:n])


def diff_rows(
    expected: Sequence[Mapping[str, Any]],
    actual: Sequence[Mapping[str, Any]],
    key_columns: Sequence[str] = (),
    *,
    examples: int = EXAMPLES,
) -> RowDiff:
    """Compare ``actual`` with ``expected``; see the module docstring for the rules.

    Raises :class:`ConfigError` if a key column is in neither side's rows.
    """
    keys = tuple(key_columns)
    want = Counter(canonical_row(r) for r in expected)
    got = Counter(canonical_row(r) for r in actual)
    lost = want - got
    more = got - want
    if not keys:
        return RowDiff(
            len(expected),
            len(actual),
            (),
            lost.total(),
            more.total(),
            0,
            _first(lost.elements(), examples),
            _first(more.elements(), examples),
        )
    columns = {c for r in (*expected[:1], *actual[:1]) for c in r}
    absent = [k for k in keys if columns and k not in columns]
    if absent:
        raise ConfigError(
            f"key column(s) {absent} are not columns of the output (columns: "
            f"{sorted(columns)}); name output columns with --key"
        )

    def by_key(c: Counter[CanonicalRow]) -> dict[tuple[Any, ...], list[CanonicalRow]]:
        out: dict[tuple[Any, ...], list[CanonicalRow]] = defaultdict(list)
        for row in sorted(c.elements(), key=repr):
            d = dict(row)
            out[tuple(d.get(k) for k in keys)].append(row)
        return out

    lost_by_key, more_by_key = by_key(lost), by_key(more)
    missing: list[CanonicalRow] = []
    extra: list[CanonicalRow] = []
    pairs: list[tuple[CanonicalRow, CanonicalRow]] = []
    for key in sorted(set(lost_by_key) | set(more_by_key), key=repr):
        w, g = lost_by_key.get(key, []), more_by_key.get(key, [])
        n = min(len(w), len(g))
        pairs += zip(w[:n], g[:n], strict=True)
        missing += w[n:]
        extra += g[n:]
    return RowDiff(
        len(expected),
        len(actual),
        keys,
        len(missing),
        len(extra),
        len(pairs),
        _first(missing, examples),
        _first(extra, examples),
        tuple((as_dict(a), as_dict(b)) for a, b in pairs[:examples]),
    )
