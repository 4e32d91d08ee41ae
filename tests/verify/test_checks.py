"""The verifier's per-output and cross-output checks (sparkonce.verify.checks): no Spark.

Small hand-made rows: an ``accepted`` and an ``audit`` output that share ``record_id``
and carry a non-deterministic ``event_id``, and a ``totals`` output without it.
"""

from __future__ import annotations

from typing import Any

import pytest

from sparkonce.errors import ConfigError
from sparkonce.verify import ReferenceCheck
from sparkonce.verify.checks import (
    ColumnSpec,
    Pair,
    check_consistency,
    compare_output,
    consistency_pairs,
    null_shortfall,
    parse_columns,
    resolve_columns,
    split_pairs,
    suspect_columns,
    without,
)

# Pure Python, a few seconds in all: in make test (tests/unit/test_lanes.py lists this file in
# ALSO_IN_MAKE_TEST).

OUTPUTS = ("totals", "accepted", "audit")


def rows(
    *pairs: tuple[str | None, Any], extra: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    return [{"record_id": r, "event_id": e, **(extra or {})} for r, e in pairs]


# -- declaring columns ---------------------------------------------------------------------
def test_declared_columns_parse_per_output_or_everywhere() -> None:
    specs = parse_columns(["event_id, audit.seen_at", "event_id", "a.b"], OUTPUTS)
    assert specs == (
        ColumnSpec("event_id"),
        ColumnSpec("seen_at", "audit"),
        ColumnSpec("a.b"),  # "a" is no output: a column name with a dot
    )
    assert [str(s) for s in specs] == ["event_id", "audit.seen_at", "a.b"]
    with pytest.raises(ConfigError, match=r"name a column after 'audit\.'"):
        parse_columns(["audit."], OUTPUTS)
    with pytest.raises(ConfigError, match="at least one column"):
        parse_columns([" , "], OUTPUTS)


def test_declared_columns_resolve_to_the_outputs_having_them() -> None:
    columns = {
        "totals": {"user", "total"},
        "accepted": {"record_id", "event_id"},
        "audit": {"record_id", "event_id", "seen_at"},
    }
    specs = parse_columns(["event_id,audit.seen_at"], OUTPUTS)
    assert resolve_columns(specs, columns) == {
        "totals": (),
        "accepted": ("event_id",),
        "audit": ("event_id", "seen_at"),
    }
    with pytest.raises(ConfigError, match="no output has a column 'evnt_id'"):
        resolve_columns(parse_columns(["evnt_id"], OUTPUTS), columns)
    with pytest.raises(ConfigError, match=r"'accepted\.seen_at'"):
        resolve_columns(parse_columns(["accepted.seen_at"], OUTPUTS), columns)
    # An output that showed no row might have the column: no error, declared there.
    unknown = {**columns, "totals": None}
    assert resolve_columns(parse_columns(["total"], OUTPUTS), unknown)["totals"] == ("total",)


# -- (a) and (b): one output against the oracle ----------------------------------------------
def test_declared_columns_are_projected_out_and_rows_still_counted() -> None:
    oracle = rows(("r1", "u1"), ("r2", "u2"), ("r3", "u3"))
    trial = rows(("r3", "x3"), ("r1", "x1"), ("r2", "x2"))
    assert without(oracle, {"event_id"}) == [{"record_id": r} for r in ("r1", "r2", "r3")]
    assert not compare_output(oracle, trial).matched  # every event_id differs
    assert compare_output(oracle, trial, nondeterministic=["event_id"]).matched
    # A record written twice (with another uuid) is a duplicate; one lost is lost.
    twice = compare_output(oracle, [*trial, *rows(("r1", "x9"))], (), ["event_id"])
    assert (twice.lost, twice.duplicated, twice.mismatched) == (0, 1, 0)
    lost = compare_output(oracle, trial[:2], (), ["event_id"])
    assert (lost.lost, lost.duplicated) == (1, 0)
    # A deterministic column still compares exactly.
    wrong = compare_output(oracle, rows(("r1", "x"), ("r2", "y"), ("r9", "z")), (), ["event_id"])
    assert (wrong.lost, wrong.duplicated) == (1, 1)


def test_a_declared_key_makes_the_output_a_multiset() -> None:
    oracle = [{"event_id": "u1", "n": 1}, {"event_id": "u2", "n": 2}]
    trial = [{"event_id": "x2", "n": 2}, {"event_id": "x1", "n": 1}]
    assert compare_output(oracle, trial, ("event_id",), ("event_id",)).matched
    wrong = [trial[0], {"event_id": "x1", "n": 3}]
    diff = compare_output(oracle, wrong, ("event_id",), ("event_id",))
    assert (diff.lost, diff.duplicated, diff.mismatched) == (1, 1, 0)


def test_declared_columns_left_null_are_counted_per_group() -> None:
    oracle = rows(("r1", "u1"), ("r2", "u2"), ("r2", None), ("r3", None))
    # r1 lost its value; r2 has one value of two rows, as in the oracle; r3 was NULL anyway.
    trial = rows(("r1", None), ("r2", None), ("r2", "x2"), ("r3", None))
    assert null_shortfall(oracle, trial, {"event_id"}) == 1
    diff = compare_output(oracle, trial, (), ["event_id"])
    assert diff.null_values == 1 and diff.mismatched == 1 and not diff.matched
    assert diff.counts() == {
        "lost_rows": 0,
        "duplicated_rows": 0,
        "value_mismatches": 1,
        "null_values": 1,
    }
    # Rows the trial lost are counted as lost, not again as NULLs.
    assert null_shortfall(oracle, trial[:1], {"event_id"}) == 1
    assert null_shortfall(oracle, [], {"event_id"}) == 0
    assert null_shortfall(oracle, trial, set()) == 0


# -- (c): across outputs ---------------------------------------------------------------------
COLUMNS = {
    "totals": {"user", "total"},
    "accepted": {"record_id", "event_id"},
    "audit": {"record_id", "event_id", "user"},
}
DECLARED = {"accepted": ("event_id",), "audit": ("event_id",)}


def test_pairs_need_the_declared_column_and_another_shared_column() -> None:
    assert consistency_pairs(COLUMNS, DECLARED) == [
        Pair("accepted", "audit", "event_id", ("record_id",))
    ]
    # Declared in one output only: nothing to compare it with.
    assert consistency_pairs(COLUMNS, {"audit": ("event_id",)}) == []
    # Nothing shared but the declared column itself: nothing to join on.
    assert consistency_pairs({"a": {"event_id"}, "b": {"event_id", "x"}}, DECLARED) == []
    # A column declared in either output is no join column.
    assert consistency_pairs(COLUMNS, {**DECLARED, "audit": ("event_id", "record_id")}) == []


def test_consistency_counts_joined_values_whose_declared_values_differ() -> None:
    pair = Pair("accepted", "audit", "event_id", ("record_id",))
    accepted = rows(("r1", "u1"), ("r2", "u2"), ("r3", "u3"))
    same = {"accepted": accepted, "audit": rows(("r3", "u3"), ("r1", "u1"), ("r2", "u2"))}
    assert check_consistency(same, [pair]) == []
    # r2 and r3 recomputed for audit (a replay without stable output); r4 only in audit.
    audit = rows(("r1", "u1"), ("r2", "x2"), ("r3", "x3"), ("r4", "x4"))
    (found,) = check_consistency({"accepted": accepted, "audit": audit}, [pair])
    assert found.count == 2
    assert found.examples[0] == {"record_id": "r2", "accepted": ["u2"], "audit": ["x2"]}
    text = found.describe()
    assert text.startswith("2 values of (record_id) have other event_id values in accepted ")
    assert '"audit": ["x2"]' in text
    # NULL joins NULL, and NULL is a value: NULL on one side only differs.
    nulls = {"accepted": rows((None, "u1")), "audit": rows((None, None))}
    assert check_consistency(nulls, [pair])[0].count == 1
    # Several rows per joined value: the sets of values must be equal.
    many = {"accepted": rows(("r1", "a"), ("r1", "b")), "audit": rows(("r1", "b"), ("r1", "a"))}
    assert check_consistency(many, [pair]) == []


def test_pairs_the_oracle_already_disagrees_on_are_left_out() -> None:
    good = Pair("accepted", "audit", "event_id", ("record_id",))
    separate = Pair("accepted", "copy", "event_id", ("record_id",))
    oracle = {
        "accepted": rows(("r1", "u1")),
        "audit": rows(("r1", "u1")),
        "copy": rows(("r1", "v1")),  # computed uuid() again: never agreed
    }
    checked, skipped = split_pairs(oracle, [good, separate])
    assert checked == [good]
    assert [(p, i.count) for p, i in skipped] == [(separate, 1)]


# -- hints -------------------------------------------------------------------------------------
def test_suspect_columns_name_what_alone_differs() -> None:
    reference = rows(("r1", "u1"), ("r2", "u2"))
    assert suspect_columns(reference, rows(("r2", "x2"), ("r1", "x1"))) == ("event_id",)
    # Another record too, or another row count: not explained by event_id alone.
    assert suspect_columns(reference, rows(("r1", "x1"), ("r3", "x3"))) == ()
    assert suspect_columns(reference, rows(("r1", "x1"))) == ()
    # Every column differs: nothing is left to agree on.
    assert suspect_columns(reference, rows(("r3", "x1"), ("r4", "x2"))) == ()


def test_reference_check_leaves_declared_columns_out_and_hints_at_undeclared_ones() -> None:
    reference = rows(("r1", "u1"), ("r2", "u2"))
    sparkonce = rows(("r1", "x1"), ("r2", "x2"))
    assert ReferenceCheck.compare(reference, sparkonce, left_out=["event_id"]).matched
    check = ReferenceCheck.compare(reference, sparkonce)
    assert not check.matched and check.suspects == {"output": ("event_id",)}
    message = check.message("p.py", "reference.log")
    assert "The rows agree on every column but event_id." in message
    assert "--nondeterministic event_id " in message
    assert check.to_json()["differing_columns"] == ["event_id"]

    outputs = ReferenceCheck.compare_outputs(
        {"accepted": reference, "dead": [{"record_id": "r9", "error": "bad"}]},
        {
            "accepted": sparkonce,
            "dead": [{"record_id": "r9", "error": "bad", "pipeline": "p", "batch_seq": 0}],
        },
        {"accepted": (), "dead": ()},
        {"accepted": "append", "dead": "append"},
        left_out={"dead": ("pipeline", "batch_seq")},
    )
    assert outputs.outputs["dead"].diff.matched
    assert not outputs.matched and outputs.suspects == {"accepted": ("event_id",)}
    message = outputs.message("p.py", "reference.log")
    assert "differs from Spark's plain foreachBatch reference in outputs accepted:" in message
    assert "(accepted: event_id)" in message and "--nondeterministic event_id " in message
    doc = outputs.to_json()
    assert doc["semantics"] == "per output" and doc["missing"] == 2 and doc["extra"] == 2
    assert doc["outputs"]["dead"]["not_compared"] == ["pipeline", "batch_seq"]
