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
