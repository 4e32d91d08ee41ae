"""Unit and property tests of sparkonce.offsets (pure functions, no Spark)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkonce.errors import ConfigError, LedgerError
from sparkonce.offsets import (
    BatchRanges,
    Coverage,
    OffsetRange,
    ReadLimits,
    TopicPartition,
    advance,
    batch_from_offsets,
    check_chain,
    classify,
    plan_batch,
    proportional_shares,
)

# -- strategies ---------------------------------------------------------------

TPS = st.tuples(st.sampled_from(("a", "b", "t.x")), st.integers(0, 3))
LIMIT = st.none() | st.integers(1, 25)


@st.composite
def start_latest(
    draw: st.DrawFn,
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """Start and latest maps with latest >= start; some partitions only in one of them."""
    start: dict[TopicPartition, int] = {}
    latest: dict[TopicPartition, int] = {}
    for tp in draw(st.sets(TPS, max_size=7)):
        kind = draw(st.sampled_from(("both", "both", "latest-only", "start-only")))
        s = draw(st.integers(0, 60))
        extra = draw(st.integers(0, 60))
        if kind == "both":
            start[tp], latest[tp] = s, s + extra
        elif kind == "latest-only":
            latest[tp] = extra
        else:
            start[tp] = s
    return start, latest


def _top(tp: TopicPartition, start: dict, latest: dict) -> int:
    s = start.get(tp, 0)
    return latest.get(tp, s)


def _avail(tp: TopicPartition, start: dict, latest: dict) -> int:
    return _top(tp, start, latest) - start.get(tp, 0)


@st.composite
def batch_ranges(draw: st.DrawFn) -> BatchRanges:
    tps = draw(
        st.lists(
            st.tuples(st.text(max_size=6), st.integers(0, 2**31 - 1)),
            max_size=8,
            unique=True,
        )
    )
    ranges = []
    for topic, part in tps:
        start = draw(st.integers(0, 2**53))
        count = draw(st.integers(0, 1000))
        ranges.append(OffsetRange(topic, part, start, start + count))
    return BatchRanges(tuple(draw(st.permutations(ranges))))


# -- plan_batch ---------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(start_latest(), LIMIT, LIMIT)
def test_plan_batch_respects_start_latest_and_limits(
    maps: tuple[dict, dict], max_pp: int | None, max_total: int | None
) -> None:
    start, latest = maps
    batch = plan_batch(start, latest, max_per_partition=max_pp, max_total=max_total)
    tps = set(start) | set(latest)
    assert {r.tp for r in batch.ranges} == tps
    assert list(batch.ranges) == sorted(batch.ranges)
    for r in batch.ranges:
        assert r.start == start.get(r.tp, 0)  # exactly at start, 0 for new partitions
        assert r.end <= _top(r.tp, start, latest)
        if max_pp is not None:
            assert r.count <= max_pp
    capped = {tp: min(_avail(tp, start, latest), max_pp or 10**9) for tp in tps}
    if max_total is not None:
        assert batch.count <= max_total
        # the budget is used up whenever there is enough data: no needless small batches
        assert batch.count == min(max_total, sum(capped.values()))
        # round-robin: a busy partition does not starve the others
        with_data = [tp for tp in tps if capped[tp] > 0]
        if max_total >= len(with_data):
            assert all(batch.ends()[tp] > start.get(tp, 0) for tp in with_data)
    else:
        assert {r.tp: r.count for r in batch.ranges} == capped
    if sum(capped.values()) > 0:
        assert batch.count >= 1  # progress


@settings(max_examples=200, deadline=None)
@given(start_latest(), LIMIT, LIMIT)
def test_proportional_planning_reads_the_same_fraction_of_every_backlog(
    maps: tuple[dict, dict], max_pp: int | None, max_total: int | None
) -> None:
    """A query with an event-time watermark: the limits cap the batch as a whole, and each
    partition reads at least the fraction budget / backlog of its own backlog."""
    start, latest = maps
    batch = plan_batch(
        start, latest, max_per_partition=max_pp, max_total=max_total, proportional=True
    )
    tps = set(start) | set(latest)
    backlog = {tp: _avail(tp, start, latest) for tp in tps}
    total = sum(backlog.values())
    limits = [m for m in (max_total, None if max_pp is None else max_pp * len(tps)) if m]
    budget = min(limits) if limits else total
    assert {r.tp for r in batch.ranges} == tps
    for r in batch.ranges:
        assert r.start == start.get(r.tp, 0) and r.end <= _top(r.tp, start, latest)
        if backlog[r.tp]:
            assert r.count >= 1  # nobody waits
            assert r.count * total >= min(budget, total) * backlog[r.tp]  # the same fraction
    if total <= budget:
        assert batch.count == total
    else:
        assert budget <= batch.count < budget + len(tps)


def test_proportional_planning_of_a_skewed_topic() -> None:
    """The example of issue 40: a cap per partition drains the small partitions first; shared
    out by backlog, every partition reads the same fraction."""
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    latest = {("t", 0): 1800, ("t", 1): 300, ("t", 2): 300}
    capped = plan_batch(start, latest, max_per_partition=100)
    assert [r.count for r in capped.ranges] == [100, 100, 100]  # p1, p2 a third done, p0 1/18
    shared = plan_batch(start, latest, max_per_partition=100, proportional=True)
    assert [r.count for r in shared.ranges] == [225, 38, 38]  # 1/8 of each (38 = ceil 37.5)
    assert plan_batch(start, latest, max_total=60, proportional=True).count == 45 + 8 + 8
    assert proportional_shares({("t", 0): 5, ("t", 1): 0}, 10) == {("t", 0): 5, ("t", 1): 0}


@pytest.mark.parametrize("budget", [0, -3])
def test_proportional_shares_refuse_a_budget_below_one(budget: int) -> None:
    # a batch limit of 0 would plan empty batches for ever: the error names the value
    with pytest.raises(ConfigError, match=rf"^budget must be >= 1, got {budget}$"):
        proportional_shares({("t", 0): 5}, budget)


@settings(max_examples=150, deadline=None)
@given(start_latest(), LIMIT, LIMIT)
def test_repeated_planning_consumes_everything_without_gaps(
    maps: tuple[dict, dict], max_pp: int | None, max_total: int | None
) -> None:
    start, latest = maps
    total = sum(_avail(tp, start, latest) for tp in set(start) | set(latest))
    positions = dict(start)
    batches: list[BatchRanges] = []
    for _ in range(total + 2):  # each non-empty batch takes >= 1 record, so this bounds it
        batch = plan_batch(positions, latest, max_per_partition=max_pp, max_total=max_total)
        if batch.empty:
            break
        batches.append(batch)
        positions = batch.ends()
    else:
        pytest.fail("planning did not terminate")
    assert check_chain(batches) == []
    assert sum(b.count for b in batches) == total
    for tp in set(start) | set(latest):
        assert positions.get(tp, start.get(tp, 0)) == _top(tp, start, latest)
        covered = [(r.start, r.end) for b in batches for r in b.ranges if r.tp == tp and r.count]
        expected_start = start.get(tp, 0)
        for lo, hi in covered:
            assert lo == expected_start
            expected_start = hi
        assert expected_start == _top(tp, start, latest)


@settings(max_examples=100, deadline=None)
@given(start_latest(), LIMIT, LIMIT)
def test_classify_a_planned_chain(
    maps: tuple[dict, dict], max_pp: int | None, max_total: int | None
) -> None:
    """Each planned batch is NEW against the ledger before it, and a replay after it."""
    start, latest = maps
    committed: dict[TopicPartition, int] = dict(start)
    done: list[BatchRanges] = []
    for _ in range(200):
        batch = plan_batch(committed, latest, max_per_partition=max_pp, max_total=max_total)
        if batch.empty:
            assert classify(batch, committed) is Coverage.NO_DATA
            break
        assert classify(batch, committed) is Coverage.NEW
        committed = advance(committed, batch)
        done.append(batch)
        for old in done:
            assert classify(old, committed) is Coverage.COMMITTED


@settings(max_examples=100, deadline=None)
@given(start_latest(), LIMIT, st.lists(st.booleans(), min_size=1, max_size=30))
def test_no_data_batches_in_an_offset_log_are_never_replays(
    maps: tuple[dict, dict], max_pp: int | None, no_data_after: list[bool]
) -> None:
    """Spark's offset log repeats a source offset for a no-data batch (watermark moved).

    Read through ``batch_from_offsets``, such a batch covers empty ranges at the ledger's
    end (NO_DATA), never the previous batch's ranges (which would classify as a replay,
    and its rows, the windows that just closed, would be dropped).
    """
    start, latest = maps
    committed: dict[TopicPartition, int] = dict(start)
    offset_log: list[BatchRanges] = []  # what Spark writes into offsets/<batchId>
    for no_data in no_data_after:
        batch = plan_batch(committed, latest, max_per_partition=max_pp)
        if batch.empty:
            break
        offset_log.append(batch)
        committed = advance(committed, batch)
        if no_data:
            offset_log.append(batch)  # the same offset again: a no-data batch
    previous = None
    ledger: dict[TopicPartition, int] = dict(start)
    for i, offset in enumerate(offset_log):
        ranges = batch_from_offsets(previous, offset)
        repeated = i > 0 and offset_log[i - 1] == offset
        if repeated:
            assert ranges.empty and ranges.ends() == offset.ends()
            assert classify(ranges, ledger) is Coverage.NO_DATA
        else:
            assert ranges == offset
            assert classify(ranges, ledger) is Coverage.NEW
        ledger = advance(ledger, ranges)
        previous = offset


def test_batch_from_offsets_examples() -> None:
    a = _b(("t", 0, 0, 5), ("t", 1, 0, 0))
    b = _b(("t", 0, 5, 9), ("t", 1, 0, 2))
    assert batch_from_offsets(None, a) == a
    assert batch_from_offsets(a, b) == b
    assert batch_from_offsets(b, b) == _b(("t", 0, 9, 9), ("t", 1, 2, 2))


def test_plan_batch_raises_when_log_is_behind_start() -> None:
    with pytest.raises(LedgerError, match=r"t\[1\].*offset 3.*resume offset 5") as info:
        plan_batch({("t", 0): 0, ("t", 1): 5}, {("t", 0): 9, ("t", 1): 3})
    assert str(info.value).endswith(  # what to check
        "already committed; check that the source is the one this pipeline was started on."
    )


@pytest.mark.parametrize("kw", [{"max_per_partition": 0}, {"max_total": 0}, {"max_total": -2}])
def test_plan_batch_rejects_limits_below_one(kw: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match=rf"^{next(iter(kw))} must be >= 1, got -?\d+$"):
        plan_batch(
            {},
            {("t", 0): 5},
            max_per_partition=kw.get("max_per_partition"),
            max_total=kw.get("max_total"),
        )


def test_plan_batch_examples() -> None:
    b = plan_batch({("t", 0): 2}, {("t", 0): 10, ("t", 1): 4}, max_total=5)
    assert b.ranges == (OffsetRange("t", 0, 2, 5), OffsetRange("t", 1, 0, 2))
    assert plan_batch({}, {}).ranges == ()
    b = plan_batch({("t", 0): 7}, {})  # a partition only in start: an empty range at start
    assert b.ranges == (OffsetRange("t", 0, 7, 7),)


def test_the_round_robin_hands_out_the_last_records_in_turn() -> None:
    # max_total 5 over three busy partitions: one each per round, then the last two to the
    # next partitions in turn (2, 2, 1), never twice to the first one (3, 1, 1).
    b = plan_batch({}, {("t", p): 10 for p in range(3)}, max_total=5)
    assert [r.count for r in b.ranges] == [2, 2, 1]


def test_a_read_limit_of_one_record_is_accepted() -> None:
    limits = ReadLimits(max_records_per_partition=1, max_records_per_batch=1)
    assert limits.by_argument() == {"max_records_per_partition": 1, "max_records_per_batch": 1}


# -- classify -----------------------------------------------------------------


def _b(*ranges: tuple[str, int, int, int]) -> BatchRanges:
    return BatchRanges(tuple(OffsetRange(*r) for r in ranges))


def test_classify_new() -> None:
    assert classify(_b(("t", 0, 0, 5)), {}) is Coverage.NEW
    assert classify(_b(("t", 0, 5, 9), ("t", 1, 3, 3)), {("t", 0): 5, ("t", 1): 3}) is (
        Coverage.NEW
    )
    # a partition the ledger never saw is new
    assert classify(_b(("t", 0, 5, 9), ("t", 1, 0, 2)), {("t", 0): 5}) is Coverage.NEW


def test_classify_committed() -> None:
    ends = {("t", 0): 10, ("t", 1): 4}
    assert classify(_b(("t", 0, 5, 10), ("t", 1, 0, 4)), ends) is Coverage.COMMITTED
    assert classify(_b(("t", 0, 0, 3)), ends) is Coverage.COMMITTED  # an older batch
    assert classify(_b(("t", 0, 5, 10), ("t", 1, 4, 4)), ends) is Coverage.COMMITTED


def test_classify_no_data() -> None:
    assert classify(BatchRanges(()), {}) is Coverage.NO_DATA
    assert classify(_b(("t", 0, 4, 4)), {}) is Coverage.NO_DATA
    assert classify(_b(("t", 0, 10, 10), ("t", 1, 4, 4)), {("t", 0): 10, ("t", 1): 4}) is (
        Coverage.NO_DATA
    )
    # An empty range behind the ledger's end belongs to an older batch: a replay.
    assert classify(_b(("t", 0, 10, 10), ("t", 1, 2, 2)), {("t", 0): 10, ("t", 1): 4}) is (
        Coverage.COMMITTED
    )


def test_an_empty_range_behind_the_ledger_is_old_and_never_moves_the_resume_point_back() -> None:
    """Found by the protocol simulation (a checkpoint restored from an old backup): a batch
    with a new range in one partition and an empty range *behind* the ledger's end in
    another was NEW, and its ledger entry moved that partition's resume point back, so the
    next run committed those offsets again."""
    committed = {("t", 0): 10, ("t", 1): 20}
    with pytest.raises(LedgerError, match="mixes ranges already committed") as info:
        classify(_b(("t", 0, 10, 15), ("t", 1, 12, 12)), committed)
    assert str(info.value).endswith(
        "nothing was committed. Check that the checkpoint belongs to this pipeline and sink."
    )
    # On its own it belongs to a replayed batch; at the end it tells nothing.
    assert classify(_b(("t", 0, 5, 10), ("t", 1, 12, 12)), committed) is Coverage.COMMITTED
    assert classify(_b(("t", 0, 10, 15), ("t", 1, 20, 20)), committed) is Coverage.NEW
    assert classify(_b(("t", 0, 10, 10), ("t", 1, 20, 20)), committed) is Coverage.NO_DATA
    assert classify(_b(("t", 0, 4, 4)), committed) is Coverage.COMMITTED


def test_classify_gap_raises() -> None:
    with pytest.raises(LedgerError, match=r"records 5\.\.7 would be skipped"):
        classify(_b(("t", 0, 7, 9)), {("t", 0): 5})
    with pytest.raises(LedgerError, match=r"end offset 5 for t\[0\]: records 5\.\.7 would"):
        classify(_b(("t", 0, 7, 7)), {("t", 0): 5})  # an empty range past the end is a gap too


def test_the_gap_error_says_nothing_was_committed_and_what_to_do() -> None:
    with pytest.raises(LedgerError) as info:
        classify(_b(("t", 0, 7, 9)), {("t", 0): 5})
    msg = str(info.value)
    assert "Nothing was committed." in msg
    assert "Start the query from the ledger (delete the checkpoint of a stateless pipeline)" in msg
    assert "or check the source's starting offsets." in msg


def test_classify_partial_overlap_raises() -> None:
    with pytest.raises(LedgerError, match="only in part") as info:
        classify(_b(("t", 0, 3, 9)), {("t", 0): 5})
    assert str(info.value).endswith(  # what to do about it
        "nothing was committed. Check that the checkpoint belongs to this pipeline and sink."
    )


def test_the_ledger_text_of_a_batch_is_canonical() -> None:
    # The SQL ledger finds a batch by comparing this text with the stored one: the same
    # batch must always give the same text (keys sorted as text, so "10" before "2").
    batch = _b(("t", 2, 0, 5), ("t", 10, 0, 5), ("a", 0, 1, 2))
    assert batch.to_json() == '{"a":{"0":[1,2]},"t":{"10":[0,5],"2":[0,5]}}'


def test_offset_ranges_that_are_not_an_object_are_refused_with_what_was_given() -> None:
    with pytest.raises(ConfigError, match=r"^offset ranges must be a JSON object, got \[1, 2\]$"):
        BatchRanges.from_json("[1, 2]")


def test_classify_mixed_new_and_old_raises() -> None:
    with pytest.raises(LedgerError, match="mixes"):
        classify(_b(("t", 0, 0, 5), ("t", 1, 4, 6)), {("t", 0): 5, ("t", 1): 4})
    with pytest.raises(LedgerError) as info:  # each side listed, ranges comma-separated
        classify(_b(("t", 0, 0, 5), ("t", 1, 4, 6), ("t", 2, 0, 1)), {("t", 0): 5, ("t", 1): 4})
    assert "already committed (t[0]:0..5) with new ones (t[1]:4..6, t[2]:0..1);" in str(info.value)
    with pytest.raises(LedgerError) as info:  # several old ranges: comma-separated too
        classify(_b(("t", 0, 0, 5), ("t", 1, 0, 4), ("t", 2, 0, 1)), {("t", 0): 5, ("t", 1): 4})
    assert "already committed (t[0]:0..5, t[1]:0..4) with new ones (t[2]:0..1);" in str(info.value)


def test_advance_never_moves_an_end_back() -> None:
    # A replayed batch lies behind the ledger's end: advancing by it must keep the end,
    # or the next batch would start behind it and re-deliver committed records.
    assert advance({("t", 0): 10}, _b(("t", 0, 3, 5))) == {("t", 0): 10}


def test_advance_starts_a_new_partition_at_its_range_end() -> None:
    # A partition the ledger has never seen, at rest at offset 0: its end is 0, not past
    # it (an end of 1 would skip record 0 when it arrives).
    assert advance({}, _b(("t", 0, 0, 0))) == {("t", 0): 0}
    assert advance({}, _b(("t", 0, 0, 3))) == {("t", 0): 3}


def test_advance_keeps_partitions_absent_from_the_batch() -> None:
    ends = advance({("t", 0): 5, ("t", 1): 2}, _b(("t", 0, 5, 8), ("u", 0, 0, 1)))
    assert ends == {("t", 0): 8, ("t", 1): 2, ("u", 0): 1}


# -- check_chain ----------------------------------------------------------------


def test_check_chain_ok_and_independent_partitions() -> None:
    chain = [_b(("t", 0, 0, 3)), _b(("t", 1, 0, 2)), _b(("t", 0, 3, 3), ("t", 1, 2, 9))]
    assert check_chain(chain) == []
    assert check_chain([]) == []


def test_check_chain_detects_gap_and_overlap() -> None:
    problems = check_chain([_b(("t", 0, 0, 5), ("t", 1, 0, 5)), _b(("t", 0, 6, 8), ("t", 1, 4, 6))])
    assert len(problems) == 2
    assert "entry 1: gap at t[0]:6..8 (previous end 5)" in problems[0]
    assert "entry 1: overlap at t[1]:4..6 (previous end 5)" in problems[1]


# -- BatchRanges and OffsetRange --------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(batch_ranges())
def test_batch_ranges_json_round_trip(batch: BatchRanges) -> None:
    text = batch.to_json()
    assert BatchRanges.from_json(text) == batch
    assert BatchRanges.from_json_obj(json.loads(text)) == batch
    assert BatchRanges.from_json_obj(batch.to_json_obj()) == batch
    assert list(batch.ranges) == sorted(batch.ranges)
    assert batch.count == sum(r.end - r.start for r in batch.ranges)
    assert batch.ends() == {r.tp: r.end for r in batch.ranges}


def test_batch_ranges_wire_form_and_helpers() -> None:
    b = _b(("t", 1, 2, 4), ("t", 0, 0, 3))
    assert b.to_json() == '{"t":{"0":[0,3],"1":[2,4]}}'
    assert str(b) == "t[0]:0..3 t[1]:2..4"
    assert b.count == 5 and not b.empty
    assert b.starts() == {("t", 0): 0, ("t", 1): 2}
    at = BatchRanges.at({("t", 0): 3, ("t", 1): 4})
    assert at.empty and at.count == 0 and at.ends() == {("t", 0): 3, ("t", 1): 4}


def test_batch_ranges_rejects_a_partition_twice() -> None:
    with pytest.raises(ConfigError, match=r"t\[1\] twice"):
        _b(("t", 1, 0, 1), ("t", 1, 1, 2))
    with pytest.raises(ConfigError, match="twice"):
        BatchRanges.from_json('{"t":{"1":[0,1],"01":[1,2]}}')


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[1, 2]",
        '{"t": [0, 1]}',
        '{"t": {"0": [1]}}',
        '{"t": {"0": [1, 2, 3]}}',
        '{"t": {"0": null}}',
        '{"t": {"x": [0, 1]}}',
        '{"t": {"0": [5, 2]}}',
        '{"t": {"-1": [0, 1]}}',
    ],
)
def test_batch_ranges_from_bad_json(text: str) -> None:
    with pytest.raises(ConfigError):
        BatchRanges.from_json(text)


def test_the_errors_of_bad_offset_ranges_name_the_part_that_is_wrong() -> None:
    with pytest.raises(ConfigError, match=r"^offset ranges are not valid JSON: 'not json'$"):
        BatchRanges.from_json("not json")
    with pytest.raises(ConfigError, match=r"^offset ranges of topic 't' must be an object$"):
        BatchRanges.from_json('{"t": [0, 1]}')
    with pytest.raises(
        ConfigError, match=r"^offset range t\[0\]: expected \[start, end\], got \[1\]$"
    ):
        BatchRanges.from_json('{"t": {"0": [1]}}')


def test_bad_offset_ranges_text_is_shown_cut_at_200_characters() -> None:
    with pytest.raises(ConfigError) as info:
        BatchRanges.from_json("x" * 300)
    assert str(info.value) == f"offset ranges are not valid JSON: {'x' * 200!r}"


def test_batch_ranges_rejects_string_bounds() -> None:
    with pytest.raises(ConfigError):
        BatchRanges.from_json('{"t": {"0": "12"}}')


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("t", -1, 0, 0), "partition must be >= 0"),
        (("t", 0, -1, 3), "start=-1 end=3"),
        (("t", 0, 4, 3), "start=4 end=3"),
    ],
)
def test_offset_range_validation(args: tuple[str, int, int, int], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OffsetRange(*args)


def test_offset_range_properties() -> None:
    r = OffsetRange("t", 2, 3, 7)
    assert (r.tp, r.count, r.empty) == (("t", 2), 4, False)
    assert OffsetRange("t", 0, 5, 5).empty


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "10"])
@pytest.mark.parametrize("name", ["max_records_per_partition", "max_records_per_batch"])
def test_read_limits_refuse_anything_but_a_positive_integer(name: str, value: object) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be a positive integer"):
        ReadLimits(**{name: value})  # type: ignore[arg-type]


def test_read_limits_are_shared_out_by_backlog_only_when_one_is_set() -> None:
    assert ReadLimits().by_argument() == {}
    assert ReadLimits().aligned() is None
    limits = ReadLimits(max_records_per_batch=40)
    assert limits.by_argument() == {"max_records_per_batch": 40}
    aligned = limits.aligned()
    assert aligned == ReadLimits(None, 40, proportional=True)
    assert aligned is not None and aligned.aligned() is None  # already shared out
    # Both limits are kept when shared out (offsets.ReadLimits.aligned mutant 3 dropped the
    # per-partition one).
    both = ReadLimits(max_records_per_partition=7, max_records_per_batch=40).aligned()
    assert both == ReadLimits(7, 40, proportional=True)
