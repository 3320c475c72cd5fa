"""Fast tests of the Kafka source offset logic (no broker): sources/_kafka_offsets.py invariants."""

from __future__ import annotations

import pytest

from twophase.sources._kafka_offsets import KafkaSplit, next_end, parse_starting_offsets, plan_splits, resolve_start
from twophase.errors import ConfigurationError


def test_kafka_offsets_inv1_never_move_back():
    start = {"t": {"0": 10, "1": 5}}
    # the broker reports less than start (e.g. a stale read): the offset stays
    assert next_end(start, {"t": {"0": 8, "1": 7}}) == {"t": {"0": 10, "1": 7}}
    # a partition that disappeared keeps its offset
    assert next_end(start, {"t": {"0": 12}}) == {"t": {"0": 12, "1": 5}}


@pytest.mark.parametrize("limit", [1, 2, 7, 50, 99, 100, 1000])
def test_kafka_offsets_inv2_limit_split_by_backlog(limit):
    start = {"a": {"0": 0, "1": 0}, "b": {"0": 100}}
    avail = {"a": {"0": 60, "1": 30}, "b": {"0": 110}}
    end = next_end(start, avail, limit)
    sizes = [end["a"]["0"] - 0, end["a"]["1"] - 0, end["b"]["0"] - 100]
    assert all(s >= 1 for s in sizes), "every partition with a backlog advances"
    assert sum(sizes) <= max(limit, 3)
    assert all(e <= a for e, a in zip(sizes, [60, 30, 10]))
    if limit >= 100:
        assert end == avail


def test_kafka_offsets_inv3_plan_splits_pure_and_ordered():
    start = {"b": {"0": 5}, "a": {"1": 3, "0": 0}}
    end = {"a": {"0": 4, "1": 3, "2": 2}, "b": {"0": 9}}
    splits = plan_splits(start, end)
    assert splits == [KafkaSplit("a", 0, 0, 4), KafkaSplit("a", 2, 0, 2), KafkaSplit("b", 0, 5, 9)]
    assert plan_splits(start, end) == splits  # replay plans the same


def test_kafka_offsets_parse_starting_offsets():
    assert parse_starting_offsets(None) == "latest"
    assert parse_starting_offsets("Earliest") == "earliest"
    assert parse_starting_offsets('{"t": {"1": 7, "0": -2}}') == {"t": {"0": -2, "1": 7}}
    with pytest.raises(ConfigurationError, match="startingOffsets"):
        parse_starting_offsets("yesterday")
    with pytest.raises(ConfigurationError, match="topic -> "):
        parse_starting_offsets('{"t": 3}')


def test_kafka_offsets_resolve_start_json_and_specials():
    tps = [("t", 0), ("t", 1), ("u", 0)]
    earliest = {("t", 0): 2, ("t", 1): 0, ("u", 0): 1}
    latest = {("t", 0): 9, ("t", 1): 8, ("u", 0): 4}
    assert resolve_start("earliest", tps, earliest, latest) == {"t": {"0": 2, "1": 0}, "u": {"0": 1}}
    assert resolve_start("latest", tps, earliest, latest) == {"t": {"0": 9, "1": 8}, "u": {"0": 4}}
    # JSON: -2 earliest, -1 latest; unnamed partition of a named topic -> latest; unnamed topic -> earliest
    got = resolve_start({"t": {"0": -2}}, tps, earliest, latest)
    assert got == {"t": {"0": 2, "1": 8}, "u": {"0": 1}}
    with pytest.raises(ConfigurationError, match="not subscribed"):
        resolve_start({"t": {"5": 1}}, tps, earliest, latest)


def test_kafka_offsets_inv1_regressed_partitions_are_found_not_kept_waiting():
    """A partition whose available end is below the recorded start (recreated topic): next_end alone would
    keep the start forever (a silent stall); regressed() names it for the driver to act on."""
    from twophase.sources._kafka_offsets import regressed
    start = {"t": {"0": 10, "1": 5}, "u": {"0": 3}}
    available = {"t": {"0": 4, "1": 9}, "u": {"0": 3}}
    assert next_end(start, available)["t"]["0"] == 10  # what the driver would see without the check
    assert regressed(start, available) == {("t", 0): (10, 4)}
    assert regressed(start, {"t": {"0": 10, "1": 5}}) == {}  # equal is not below; a missing partition is not


@pytest.mark.parametrize("min_partitions", [1, 2, 3, 4, 5, 7, 10, 16, 40, 1000])
def test_kafka_offsets_inv3_min_partitions_cut_ranges_contiguously_and_deterministically(min_partitions):
    start = {"a": {"0": 0, "1": 10}, "b": {"0": 100}}
    end = {"a": {"0": 9, "1": 13}, "b": {"0": 100}, "c": {"0": 2}}  # b-0 has no data; c-0 is new (from 0)
    splits = plan_splits(start, end, min_partitions)
    assert plan_splits(start, end, min_partitions) == splits  # a replay plans the same splits
    assert splits == sorted(splits)
    ranges = {("a", 0): (0, 9), ("a", 1): (10, 13), ("c", 0): (0, 2)}
    for (t, p), (lo, hi) in ranges.items():
        mine = [s for s in splits if (s.topic, s.partition) == (t, p)]
        assert mine[0].start == lo and mine[-1].end == hi, "the pieces cover the range"
        assert all(x.end == y.start for x, y in zip(mine, mine[1:])), "contiguous: no gap, no overlap"
        assert all(s.size >= 1 for s in mine)
        assert max(s.size for s in mine) - min(s.size for s in mine) <= 1
    assert len(splits) == max(3, min(min_partitions, 9 + 3 + 2))
    if min_partitions <= 3:  # at least that many partitions with data: one split each, as without the option
        assert splits == plan_splits(start, end)


def test_kafka_offsets_inv3_min_partitions_pieces_follow_the_sizes():
    splits = plan_splits({"t": {"0": 0, "1": 0}}, {"t": {"0": 900, "1": 100}}, 10)
    assert [s.size for s in splits if s.partition == 0] == [100] * 9
    assert [s.size for s in splits if s.partition == 1] == [100]
    # a tiny range keeps one piece, and never more pieces than offsets
    splits = plan_splits({"t": {"0": 0, "1": 0}}, {"t": {"0": 1000, "1": 1}}, 4)
    assert [(s.partition, s.size) for s in splits] == [(0, 334), (0, 333), (0, 333), (1, 1)]


@pytest.mark.parametrize("since_ms, backlog_rows, held", [
    (0, 0, True), (100, 4, True), (100, 5, False), (100, 50, False), (999, 4, True), (1000, 4, False),
    (1000, 0, False), (float("inf"), 1, False)])
def test_kafka_offsets_inv4_min_rows_hold_a_batch_only_until_the_delay(since_ms, backlog_rows, held):
    from twophase.sources._kafka_offsets import delay_batch
    start = {"t": {"0": 10, "1": 20}}
    available = {"t": {"0": 10 + backlog_rows // 2, "1": 20 + backlog_rows - backlog_rows // 2}}
    assert delay_batch(start, available, 5, since_ms, 1000) is held
    assert delay_batch(start, available, None, since_ms, 1000) is False  # no minOffsetsPerTrigger: never


def test_kafka_offsets_batch_start_and_end_offsets_parse_as_spark():
    from twophase.sources._kafka_offsets import parse_ending_offsets
    assert parse_starting_offsets(None, batch=True, default="earliest") == "earliest"
    with pytest.raises(ConfigurationError, match="startingOffsets.*batch read"):
        parse_starting_offsets("latest", batch=True)
    with pytest.raises(ConfigurationError, match="startingOffsets.*t-0 the offset -1"):
        parse_starting_offsets('{"t": {"0": -1}}', batch=True)
    assert parse_ending_offsets(None) == "latest" == parse_ending_offsets("LATEST")
    assert parse_ending_offsets('{"t": {"1": -1, "0": 5}}') == {"t": {"0": 5, "1": -1}}
    with pytest.raises(ConfigurationError, match="endingOffsets.*earliest"):
        parse_ending_offsets("earliest")
    with pytest.raises(ConfigurationError, match="endingOffsets.*t-0 the offset -2"):
        parse_ending_offsets('{"t": {"0": -2}}')


def test_kafka_offsets_start_by_timestamp_precedence_lookup_and_strategy():
    from twophase.sources._kafka_offsets import (StartByTimestamp, choose_start, parse_timestamp, parse_timestamps,
                                                 resolve_start_by_timestamp, timestamps_to_look_up)
    per = parse_timestamps('{"t": {"0": 1000, "1": 2000}}')
    # Spark's precedence: startingTimestamp > startingOffsetsByTimestamp > startingOffsets
    assert choose_start("earliest", timestamp=5, by_timestamp=per) == StartByTimestamp(all_partitions=5)
    assert choose_start("earliest", by_timestamp=per, strategy="latest") == StartByTimestamp(per_partition=per,
                                                                                             strategy="latest")
    assert choose_start("earliest") == "earliest"
    tps = [("t", 0), ("t", 1)]
    assert timestamps_to_look_up(StartByTimestamp(all_partitions=7), tps) == {("t", 0): 7, ("t", 1): 7}
    assert timestamps_to_look_up(StartByTimestamp(per_partition=per), tps) == {("t", 0): 1000, ("t", 1): 2000}
    with pytest.raises(ConfigurationError, match=r"every partition.*t-1"):
        timestamps_to_look_up(StartByTimestamp(per_partition={"t": {"0": 1}}), tps)
    with pytest.raises(ConfigurationError, match=r"not subscribed.*t-9"):
        timestamps_to_look_up(StartByTimestamp(per_partition={"t": {"0": 1, "1": 1, "9": 1}}), tps)
    ts = {("t", 0): 1000, ("t", 1): 2000}
    found = {("t", 0): 4, ("t", 1): None}  # no record at or after 2000 in t-1
    with pytest.raises(ConfigurationError, match=r"startingOffsetsByTimestamp.*t-1.*2000.*Strategy=latest"):
        resolve_start_by_timestamp(StartByTimestamp(per_partition=per), ts, found, {})
    got = resolve_start_by_timestamp(StartByTimestamp(per_partition=per, strategy="latest"), ts, found,
                                     {("t", 0): 9, ("t", 1): 8})
    assert got == {"t": {"0": 4, "1": 8}}
    with pytest.raises(ConfigurationError, match="startingTimestamp"):
        parse_timestamp("yesterday")
    with pytest.raises(ConfigurationError, match="startingOffsetsByTimestamp.*-5"):
        parse_timestamps('{"t": {"0": -5}}')
