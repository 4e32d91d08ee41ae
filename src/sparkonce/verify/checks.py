"""What ``sparkonce verify`` checks in each output, and across outputs. Pure Python, no Spark.

A pipeline's outputs are checked one by one against the oracle's (the failure-free
run's) rows of the same output, and, where the user declared non-deterministic
columns (``--nondeterministic``), across outputs too:

Declared columns (:func:`parse_columns`, :func:`resolve_columns`)
    ``COLUMN`` declares that column in every output that has it; ``OUTPUT.COLUMN`` in
    that output only. A declaration that names no column of any output is refused
    (:class:`~sparkonce.errors.ConfigError`) once the outputs' columns are known.

Per output (:func:`compare_output`)
    (a) The deterministic columns exactly: the rows, with the output's declared columns
        left out, are compared with the oracle's as multisets, or matched on the output's
        key columns (:func:`sparkonce.verify.compare.diff_rows`). So the number of rows
        per input record is checked too. A key column that is declared is no key: the
        output is then compared as a multiset.
    (b) The declared columns by count: among the rows whose deterministic columns are
        equal (one group), a trial must hold a value (not NULL) in at least as many rows
        as the oracle did, up to the number of rows the trial has in that group. Each
        row short counts as one value mismatch (``null_values``). This assumes that
        whether a declared column is NULL depends on the other columns only (a column
        that is NULL at random, ``CASE WHEN rand() < 0.5 THEN uuid() END``, can fail it).

Across outputs (:func:`consistency_pairs`, :func:`check_consistency`)
    (c) The same values in every sink of one batch: for every pair of outputs that both
        have a declared column C and share at least one other column that neither
        declares, the rows are joined on those shared columns; for every joined value
        present in both outputs, the set of C values must be the same in both. Each
        joined value where they differ counts as one ``inconsistent``. A pair that is
        already inconsistent in the oracle (the transform computes C separately for each
        output, so the values never agree) cannot be checked and is left out, and the
        report says so (:func:`split_pairs`).

When the failure-free run differs from the reference only in some columns,
:func:`suspect_columns` names them, so the message can tell the user to declare them.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkonce.errors import ConfigError
from sparkonce.verify.compare import EXAMPLES, RowDiff, canonical_value, diff_rows

Rows = Sequence[Mapping[str, Any]]


# -- declared columns --------------------------------------------------------------------
@dataclass(frozen=True)
class ColumnSpec:
    """One declared column: ``column`` in ``output`` (None: in every output that has it)."""

    column: str
    output: str | None = None

    def __str__(self) -> str:
        return self.column if self.output is None else f"{self.output}.{self.column}"


def parse_columns(
    texts: Sequence[str], outputs: Collection[str], option: str = "--nondeterministic"
) -> tuple[ColumnSpec, ...]:
    """Parse ``COL[,COL...]`` items (each ``COLUMN`` or ``OUTPUT.COLUMN``).

    ``OUTPUT.COLUMN`` targets one output when ``OUTPUT`` is one of ``outputs``; any other
    text is a column name (which may hold a dot).
    """
    specs: list[ColumnSpec] = []
    for text in texts:
        for item in str(text).split(","):
            item = item.strip()
            if not item:
                continue
            name, dot, column = item.partition(".")
            if dot and name in outputs:
                if not column:
                    raise ConfigError(f"{option} {item!r}: name a column after {name + '.'!r}")
                spec = ColumnSpec(column, name)
            else:
                spec = ColumnSpec(item)
            if spec not in specs:
                specs.append(spec)
    if texts and not specs:
        raise ConfigError(f"{option} {list(texts)}: name at least one column")
    return tuple(specs)


def resolve_columns(
    specs: Sequence[ColumnSpec],
    columns: Mapping[str, Collection[str] | None],
    option: str = "--nondeterministic",
) -> dict[str, tuple[str, ...]]:
    """The declared columns of each output, given each output's columns (None: not known,
    as for an output without rows).

    Raises :class:`ConfigError` for a declaration that matches no known column, unless an
    output whose columns are not known might have it.
    """
    out: dict[str, list[str]] = {name: [] for name in columns}
    unknown = [name for name, cols in columns.items() if cols is None]
    for spec in specs:
        targets = [spec.output] if spec.output is not None else list(columns)
        found = False
        for name in targets:
            cols = columns[name]
            if cols is not None and spec.column in cols:
                if spec.column not in out[name]:
                    out[name].append(spec.column)
                found = True
        might = [n for n in targets if n in unknown]
        if not found and not might:
            listing = "; ".join(f"{n}: {', '.join(sorted(columns[n] or ()))}" for n in targets)
            raise ConfigError(
                f"{option} {str(spec)!r}: no output has a column {spec.column!r} "
                f"(columns: {listing})"
            )
        for name in might:  # the output showed no row: declare it there in case it has it
            if spec.column not in out[name]:
                out[name].append(spec.column)
    return {name: tuple(cols) for name, cols in out.items()}


def without(rows: Rows, columns: Collection[str]) -> list[dict[str, Any]]:
    """``rows`` without ``columns`` (the others unchanged)."""
    if not columns:
        return [dict(r) for r in rows]
    return [{k: v for k, v in r.items() if k not in columns} for r in rows]


# -- one output ----------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputDiff:
    """How one output of a trial differs from the oracle's (see the module docstring)."""

    diff: RowDiff  # the deterministic columns (a)
    null_values: int = 0  # declared columns NULL where the oracle had values (b)

    @property
    def lost(self) -> int:
        return self.diff.missing

    @property
    def duplicated(self) -> int:
        return self.diff.extra

    @property
    def mismatched(self) -> int:
        """Value mismatches: in the deterministic columns, plus declared columns left NULL."""
        return self.diff.mismatched + self.null_values

    @property
    def matched(self) -> bool:
        return self.diff.matched and self.null_values == 0

    def counts(self) -> dict[str, int]:
        return {
            "lost_rows": self.lost,
            "duplicated_rows": self.duplicated,
            "value_mismatches": self.mismatched,
            "null_values": self.null_values,
        }


def compare_output(
    expected: Rows,
    actual: Rows,
    keys: Sequence[str] = (),
    nondeterministic: Collection[str] = (),
) -> OutputDiff:
    """Compare one output's ``actual`` rows with the oracle's ``expected`` ones: (a) and
    (b) of the module docstring."""
    declared = set(nondeterministic)
    match_keys = () if declared & set(keys) else tuple(keys)
    diff = diff_rows(without(expected, declared), without(actual, declared), match_keys)
    return OutputDiff(diff, null_shortfall(expected, actual, declared))


def _group(row: Mapping[str, Any], declared: Collection[str]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, canonical_value(v)) for k, v in row.items() if k not in declared))


def null_shortfall(expected: Rows, actual: Rows, declared: Collection[str]) -> int:
    """Rows of ``actual`` whose declared column is NULL where ``expected``'s rows with the
    same deterministic columns had a value, counted per group and column (see (b))."""
    if not declared:
        return 0
    columns = sorted({c for r in (*expected, *actual) for c in r if c in declared})

    def tally(rows: Rows) -> dict[Any, tuple[int, Counter[str]]]:
        out: dict[Any, tuple[int, Counter[str]]] = {}
        for r in rows:
            g = _group(r, declared)
            n, values = out.get(g, (0, Counter()))
            values.update(c for c in columns if r.get(c) is not None)
            out[g] = (n + 1, values)
        return out

    want, got = tally(expected), tally(actual)
    short = 0
    for g, (_n, values) in want.items():
        rows, have = got.get(g, (0, Counter()))
        for c in columns:
            short += max(0, min(values[c], rows) - have[c])
    return short


# -- across outputs ------------------------------------------------------------------------
@dataclass(frozen=True)
class Pair:
    """Two outputs whose declared column ``column`` must agree, joined on ``on``."""

    a: str
    b: str
    column: str
    on: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.a}.{self.column} = {self.b}.{self.column} joined on {', '.join(self.on)}"


@dataclass(frozen=True)
class Inconsistency:
    """Joined values where two outputs hold other values of a declared column."""

    pair: Pair
    count: int
    examples: tuple[dict[str, Any], ...] = field(default=())

    def describe(self) -> str:
        shown = "; ".join(json.dumps(e, default=str, ensure_ascii=False) for e in self.examples)
        return (
            f"{self.count} values of ({', '.join(self.pair.on)}) have other {self.pair.column} "
            f"values in {self.pair.a} than in {self.pair.b}" + (f", e.g. {shown}" if shown else "")
        )


def consistency_pairs(
    columns: Mapping[str, Collection[str]], declared: Mapping[str, Collection[str]]
) -> list[Pair]:
    """Every pair of outputs (in the given order) that both have a declared column C and
    share another column that neither declares: one :class:`Pair` per such C."""
    names = list(columns)
    pairs: list[Pair] = []
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            da, db = set(declared.get(a, ())), set(declared.get(b, ()))
            shared = set(columns[a]) & set(columns[b])
            on = tuple(sorted(shared - da - db))
            if not on:
                continue
            for c in sorted(da & db & shared):
                pairs.append(Pair(a, b, c, on))
    return pairs


def check_consistency(
    rows: Mapping[str, Rows], pairs: Sequence[Pair], examples: int = 3
) -> list[Inconsistency]:
    """The pairs whose outputs disagree (see (c) in the module docstring)."""
    found: list[Inconsistency] = []
    for pair in pairs:
        left = _values_by(rows.get(pair.a, ()), pair.on, pair.column)
        right = _values_by(rows.get(pair.b, ()), pair.on, pair.column)
        bad = sorted((k for k in left.keys() & right.keys() if left[k] != right[k]), key=repr)
        if bad:
            shown = tuple(
                {
                    **dict(zip(pair.on, k, strict=True)),
                    pair.a: sorted(left[k], key=repr),
                    pair.b: sorted(right[k], key=repr),
                }
                for k in bad[:examples]
            )
            found.append(Inconsistency(pair, len(bad), shown))
    return found


def _values_by(rows: Rows, on: Sequence[str], column: str) -> dict[tuple[Any, ...], set[Any]]:
    out: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
    for r in rows:
        out[tuple(canonical_value(r.get(c)) for c in on)].add(canonical_value(r.get(column)))
    return out


def split_pairs(
    oracle: Mapping[str, Rows], pairs: Sequence[Pair]
) -> tuple[list[Pair], list[tuple[Pair, Inconsistency]]]:
    """(pairs to check in the trials, pairs left out because the oracle itself disagrees)."""
    bad = {i.pair: i for i in check_consistency(oracle, pairs)}
    return [p for p in pairs if p not in bad], [(p, bad[p]) for p in pairs if p in bad]


# -- hints -----------------------------------------------------------------------------------
def suspect_columns(expected: Rows, actual: Rows, keys: Sequence[str] = ()) -> tuple[str, ...]:
    """The columns that alone make ``actual`` differ from ``expected``, or ().

    Those whose values (as multisets) differ between the two sides, if leaving them out
    makes the rows match (same count, same other values), and some column is left. A
    non-deterministic column (``uuid()``, ``rand()``, a clock) looks exactly like this.
    """
    if not expected or len(expected) != len(actual):
        return ()
    columns = sorted({c for r in (*expected, *actual) for c in r})
    differ = tuple(
        c
        for c in columns
        if Counter(canonical_value(r.get(c)) for r in expected)
        != Counter(canonical_value(r.get(c)) for r in actual)
    )
    if not differ or len(differ) == len(columns):
        return ()
    rest_keys = () if set(differ) & set(keys) else tuple(keys)
    if diff_rows(without(expected, differ), without(actual, differ), rest_keys).matched:
        return differ
    return ()


__all__ = [
    "EXAMPLES",
    "ColumnSpec",
    "Inconsistency",
    "OutputDiff",
    "Pair",
    "check_consistency",
    "compare_output",
    "consistency_pairs",
    "null_shortfall",
    "parse_columns",
    "resolve_columns",
    "split_pairs",
    "suspect_columns",
    "without",
]
