"""Kafka source offsets, in one place and without Spark: parsing, rate limiting, splitting.

An offset is the per-topic-partition map Spark's Kafka source uses: ``{"topic": {"0": 42, "1": 7}}``
(next offset to read per partition; JSON-friendly, partition keys are strings). A micro-batch reads
``[start, end)`` of every partition.

Invariants (``test_kafka_offsets_invN_*``):

1. Offsets only move forward: :func:`next_end` never returns an offset below ``start`` for any partition.
2. :func:`next_end` with a limit of N returns ranges totalling at most max(N, partitions with data):
   the limit is split across partitions in proportion to their backlog, and every partition with a
   backlog advances by at least one so a small limit cannot stall a partition forever.
3. :func:`plan_splits` is a pure function of ``(start, end)``: a replay plans the same splits, one per
   topic-partition with ``start < end``, in a stable order; a partition absent from ``start`` starts at 0
   (the earliest record still in the log).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from twophase.errors import ConfigurationError

Offsets = dict[str, dict[str, int]]
"""``{topic: {partition (as str): offset}}``"""

EARLIEST = -2
LATEST = -1


@dataclass(frozen=True, order=True)
class KafkaSplit:
    """One topic-partition's range ``[start, end)``: one input partition of a micro-batch."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        return {"topic": self.topic, "partition": self.partition, "start": self.start, "end": self.end}


def normalize(offsets: Mapping[str, Mapping[Any, Any]]) -> Offsets:
    """Offsets with string partition keys and int values, topics and partitions sorted."""
    return {t: {str(p): int(o) for p, o in sorted(parts.items(), key=lambda kv: int(kv[0]))}
            for t, parts in sorted(offsets.items())}


def flatten(offsets: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], int]:
    return {(t, int(p)): int(o) for t, parts in offsets.items() for p, o in parts.items()}


def unflatten(flat: Mapping[tuple[str, int], int]) -> Offsets:
    out: dict[str, dict[str, int]] = {}
    for (t, p), o in sorted(flat.items()):
        out.setdefault(t, {})[str(p)] = int(o)
    return out


def parse_starting_offsets(value: Optional[str], *, option: str = "startingOffsets") -> Any:
    """'earliest', 'latest' or a JSON map ``{"t": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest)."""
    if value is None:
        return "latest"
    s = str(value).strip()
    if s.lower() in ("earliest", "latest"):
        return s.lower()
    try:
        parsed = json.loads(s)
    except ValueError:
        raise ConfigurationError(f"twophase-kafka: option {option!r}={value!r} must be 'earliest', 'latest' or JSON "
                                 'such as {"topic": {"0": 23, "1": -2}}') from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ConfigurationError(f"twophase-kafka: option {option!r} JSON must map topic -> {{partition: offset}}")
    try:
        return normalize(parsed)
    except (TypeError, ValueError):
        raise ConfigurationError(f"twophase-kafka: option {option!r} has a non-integer partition or offset") from None


def resolve_start(spec: Any, partitions: list[tuple[str, int]], earliest: Mapping[tuple[str, int], int],
                  latest: Mapping[tuple[str, int], int]) -> Offsets:
    """The initial offset for ``partitions`` from a parsed ``startingOffsets``."""
    flat: dict[tuple[str, int], int] = {}
    for tp in partitions:
        if spec == "earliest":
            flat[tp] = earliest[tp]
        elif spec == "latest":
            flat[tp] = latest[tp]
        else:
            given = spec.get(tp[0], {}).get(str(tp[1]), LATEST if tp[0] in spec else EARLIEST)
            flat[tp] = earliest[tp] if given == EARLIEST else latest[tp] if given == LATEST else int(given)
    if isinstance(spec, dict):
        unknown = [f"{t}-{p}" for t, parts in spec.items() for p in parts if (t, int(p)) not in set(partitions)]
        if unknown:
            raise ConfigurationError(f"twophase-kafka: option 'startingOffsets' names partitions that are not "
                                     f"subscribed or do not exist: {unknown}")
    return unflatten(flat)


def next_end(start: Mapping[str, Mapping[str, int]], available: Mapping[str, Mapping[str, int]],
             limit: Optional[int] = None) -> Offsets:
    """The end offset of the next micro-batch: ``available`` capped by ``limit`` records (invariants 1, 2)."""
    s, a = flatten(start), flatten(available)
    backlog = {tp: max(0, a[tp] - s.get(tp, 0)) for tp in a}
    out = {tp: max(s.get(tp, 0), a[tp]) if backlog[tp] else s.get(tp, a[tp]) for tp in a}
    for tp, off in s.items():  # a partition no longer reported keeps its offset (never moves back)
        out.setdefault(tp, off)
    total = sum(backlog.values())
    if limit is not None and total > limit:
        for tp, size in backlog.items():
            if size:
                share = max(1, int(limit * size / total))
                out[tp] = s.get(tp, 0) + min(size, share)
    return unflatten(out)


def plan_splits(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> list[KafkaSplit]:
    """One split per topic-partition with ``start < end``, sorted (invariant 3)."""
    s, e = flatten(start), flatten(end)
    splits = []
    for (t, p), stop in sorted(e.items()):
        begin = s.get((t, p), 0)
        if begin < stop:
            splits.append(KafkaSplit(t, p, begin, stop))
    return splits
