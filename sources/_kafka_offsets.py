"""Kafka source offsets, in one place and without Spark: parsing, rate limiting, splitting.

An offset is the per-topic-partition map Spark's Kafka source uses: ``{"topic": {"0": 42, "1": 7}}``
(next offset to read per partition; JSON-friendly, partition keys are strings). A micro-batch reads
``[start, end)`` of every partition.

Invariants (``test_kafka_offsets_invN_*``):

1. Offsets only move forward: :func:`next_end` never returns an offset below ``start`` for any partition.
   A partition whose available end went below its recorded start (the topic was deleted and recreated,
   or its log truncated) is found by :func:`regressed` and never left waiting silently: the driver
   (``sources/kafka.py``) raises :class:`~twophase.errors.DataLossError` with ``failOnDataLoss=true``,
   or with ``false`` logs it and sets that partition's end to its earliest offset (no split in that
   batch; the next batch reads the partition from there). That is the only way an offset moves back.
2. :func:`next_end` with a limit of N returns ranges totalling at most max(N, partitions with data):
   the limit is split across partitions in proportion to their backlog, and every partition with a
   backlog advances by at least one so a small limit cannot stall a partition forever.
3. :func:`plan_splits` is a pure function of ``(start, end, min_partitions)``: a replay plans the same
   splits, in a stable order. Without ``min_partitions``, or when at least that many topic-partitions
   have data, one split per topic-partition with ``start < end``; otherwise the batch is cut into
   ``min(min_partitions, offsets in the batch)`` contiguous splits, each range into a number of pieces
   in proportion to its size (at least one), the pieces of a range differing in size by at most one
   offset. The splits of a range cover it exactly (no gap, no overlap). A partition absent from
   ``start`` starts at 0, the first offset of a new partition (a topic created after the query started);
   where retention already deleted records of it, the reader reports the loss (``failOnDataLoss``)
   and begins at the earliest record still in the log.
4. :func:`delay_batch` (``minOffsetsPerTrigger``) holds a batch back only while fewer than ``min_rows``
   new offsets are available and less than ``maxTriggerDelay`` has passed since the last batch; it
   never holds back a batch once the delay has passed, whatever the backlog.
"""

from __future__ import annotations

import heapq
import json
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from twophase.errors import ConfigurationError

Offsets = dict[str, dict[str, int]]
"""``{topic: {partition (as str): offset}}``"""

EARLIEST = -2
LATEST = -1

#: option startingOffsetsByTimestampStrategy: what a partition with no record at or after the timestamp starts at
TIMESTAMP_STRATEGIES = ("error", "latest")


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


@dataclass(frozen=True)
class StartByTimestamp:
    """A start given as timestamps (options ``startingTimestamp`` or ``startingOffsetsByTimestamp``).

    Each partition starts at the earliest offset whose record timestamp is at or after its timestamp
    (Kafka's ListOffsets by time); ``strategy`` says what a partition with no such record does:
    ``error`` (a :class:`ConfigurationError` naming it) or ``latest`` (its latest offset).
    """

    #: ``startingTimestamp``: one timestamp (ms since the epoch) for every partition
    all_partitions: Optional[int] = None
    #: ``startingOffsetsByTimestamp``: ``{topic: {partition: ms}}``
    per_partition: Optional[Mapping[str, Mapping[str, int]]] = None
    strategy: str = "error"

    @property
    def option(self) -> str:
        return "startingTimestamp" if self.all_partitions is not None else "startingOffsetsByTimestamp"


@dataclass(frozen=True)
class EndByTimestamp:
    """The end of a batch read given as timestamps (options ``endingTimestamp`` or
    ``endingOffsetsByTimestamp``): each partition ends before its earliest record at or after its
    timestamp (Kafka's ListOffsets by time), or at its latest offset where there is none (as Spark)."""

    all_partitions: Optional[int] = None
    per_partition: Optional[Mapping[str, Mapping[str, int]]] = None

    @property
    def option(self) -> str:
        return "endingTimestamp" if self.all_partitions is not None else "endingOffsetsByTimestamp"


StartSpec = Union[str, Offsets, StartByTimestamp]
"""A parsed start: ``"earliest"``, ``"latest"``, offsets (-2 earliest, -1 latest), or timestamps."""


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


def _parse_offsets_json(value: Any, option: str, what: str, example: str) -> Offsets:
    try:
        parsed = json.loads(str(value))
    except ValueError:
        raise ConfigurationError(f"twophase-kafka: option {option!r}={value!r} must be {what}, e.g. {example}") from None
    if not isinstance(parsed, dict) or not all(isinstance(v, dict) for v in parsed.values()):
        raise ConfigurationError(f"twophase-kafka: option {option!r} JSON must map topic -> {{partition: offset}}, "
                                 f"e.g. {example}")
    try:
        return normalize(parsed)
    except (TypeError, ValueError):
        raise ConfigurationError(f"twophase-kafka: option {option!r} has a non-integer partition or value; "
                                 f"e.g. {example}") from None


def parse_starting_offsets(value: Optional[str], *, option: str = "startingOffsets", batch: bool = False,
                           default: str = "latest") -> Any:
    """'earliest', 'latest' or a JSON map ``{"t": {"0": 23, "1": -2}}`` (-2 earliest, -1 latest).

    ``batch=True`` (``spark.read``) refuses 'latest' and -1, as Spark does: a batch from the latest
    offset to the latest offset reads nothing.
    """
    if value is None:
        return default
    s = str(value).strip()
    if s.lower() in ("earliest", "latest"):
        if batch and s.lower() == "latest":
            raise ConfigurationError(f"twophase-kafka: option {option!r}='latest' is not allowed in a batch read "
                                     "(spark.read): it would read nothing; use 'earliest' or JSON offsets")
        return s.lower()
    parsed = _parse_offsets_json(value, option, "'earliest', 'latest' or JSON", '{"topic": {"0": 23, "1": -2}}')
    for t, parts in parsed.items():
        for p, o in parts.items():
            if o < EARLIEST or (batch and o == LATEST):
                raise ConfigurationError(f"twophase-kafka: option {option!r} gives {t}-{p} the offset {o}; use an "
                                         "offset >= 0 or -2 (earliest)" + ("" if batch else " or -1 (latest)"))
    return parsed


def parse_ending_offsets(value: Optional[str]) -> Any:
    """Option ``endingOffsets`` of a batch read: 'latest' (the default) or JSON ``{"t": {"0": 23, "1": -1}}``
    (-1 latest); 'earliest' and -2 are refused, as by Spark."""
    option = "endingOffsets"
    if value is None or str(value).strip().lower() == "latest":
        return "latest"
    if str(value).strip().lower() == "earliest":
        raise ConfigurationError("twophase-kafka: option 'endingOffsets'='earliest' is not allowed: the batch would "
                                 "read nothing; use 'latest' or JSON offsets (-1 = latest)")
    parsed = _parse_offsets_json(value, option, "'latest' or JSON", '{"topic": {"0": 50, "1": -1}}')
    for t, parts in parsed.items():
        for p, o in parts.items():
            if o < LATEST:
                raise ConfigurationError(f"twophase-kafka: option 'endingOffsets' gives {t}-{p} the offset {o}; use an "
                                         "offset >= 0 or -1 (latest); -2 (earliest) is not an end")
    return parsed


def parse_timestamp(value: Any, *, option: str = "startingTimestamp") -> int:
    """A timestamp in milliseconds since the epoch (>= 0)."""
    try:
        ms = int(str(value).strip())
    except ValueError:
        raise ConfigurationError(f"twophase-kafka: option {option!r}={value!r} must be a timestamp in milliseconds "
                                 "since the epoch, e.g. 1700000000000") from None
    if ms < 0:
        raise ConfigurationError(f"twophase-kafka: option {option!r}={ms} must be >= 0 (milliseconds since the epoch)")
    return ms


def parse_timestamps(value: Any, *, option: str = "startingOffsetsByTimestamp") -> Offsets:
    """JSON ``{"topic": {"0": 1700000000000}}``: a timestamp (ms) per partition."""
    parsed = _parse_offsets_json(value, option, "JSON of topic -> {partition: timestamp in ms}",
                                 '{"topic": {"0": 1700000000000, "1": 1700000000000}}')
    for t, parts in parsed.items():
        for p, ms in parts.items():
            if ms < 0:
                raise ConfigurationError(f"twophase-kafka: option {option!r} gives {t}-{p} the timestamp {ms}; "
                                         "timestamps are milliseconds since the epoch (>= 0)")
    return parsed


def choose_start(starting_offsets: Any, *, timestamp: Optional[int] = None,
                 by_timestamp: Optional[Offsets] = None, strategy: str = "error") -> StartSpec:
    """The start the options ask for, in Spark's precedence: ``startingTimestamp``, then
    ``startingOffsetsByTimestamp``, then ``startingOffsets``."""
    if timestamp is not None:
        return StartByTimestamp(all_partitions=timestamp, strategy=strategy)
    if by_timestamp is not None:
        return StartByTimestamp(per_partition=by_timestamp, strategy=strategy)
    return starting_offsets


def _unknown_partitions(spec: Mapping[str, Mapping[str, int]], partitions: list[tuple[str, int]],
                        option: str) -> None:
    known = set(partitions)
    unknown = [f"{t}-{p}" for t, parts in spec.items() for p in parts if (t, int(p)) not in known]
    if unknown:
        raise ConfigurationError(f"twophase-kafka: option {option!r} names partitions that are not "
                                 f"subscribed or do not exist: {unknown}")


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
        _unknown_partitions(spec, partitions, "startingOffsets")
    return unflatten(flat)


def timestamps_to_look_up(spec: "StartByTimestamp | EndByTimestamp",
                          partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
    """The timestamp (ms) to look up for each partition. ``startingOffsetsByTimestamp`` and
    ``endingOffsetsByTimestamp`` must name every partition read and only those (as Spark requires), else a
    :class:`ConfigurationError` lists them."""
    if spec.all_partitions is not None:
        return {tp: spec.all_partitions for tp in partitions}
    given = flatten(spec.per_partition or {})
    _unknown_partitions(spec.per_partition or {}, partitions, spec.option)
    missing = [f"{t}-{p}" for t, p in partitions if (t, p) not in given]
    if missing:
        one = spec.option.replace("OffsetsByTimestamp", "Timestamp")
        raise ConfigurationError(f"twophase-kafka: option {spec.option!r} must give a timestamp for every "
                                 f"partition read; missing: {missing} (or use {one} for all partitions)")
    return {tp: given[tp] for tp in partitions}


def resolve_start_by_timestamp(spec: StartByTimestamp, timestamps: Mapping[tuple[str, int], int],
                               found: Mapping[tuple[str, int], Optional[int]],
                               latest: Mapping[tuple[str, int], int]) -> Offsets:
    """The initial offset from timestamps: ``found`` is Kafka's answer (the earliest offset whose timestamp
    is at or after the partition's timestamp, None where there is no such record)."""
    flat: dict[tuple[str, int], int] = {}
    for tp, ms in sorted(timestamps.items()):
        off = found.get(tp)
        if off is not None:
            flat[tp] = int(off)
        elif spec.strategy == "latest":
            flat[tp] = latest[tp]
        else:
            raise ConfigurationError(
                f"twophase-kafka: option {spec.option!r}: partition {tp[0]}-{tp[1]} has no record with a timestamp at "
                f"or after {ms}; set startingOffsetsByTimestampStrategy=latest to start such partitions at their "
                "latest offset, or give an earlier timestamp")
    return unflatten(flat)


def regressed(start: Mapping[str, Mapping[str, int]],
              available: Mapping[str, Mapping[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
    """Partitions whose available end is below their recorded start: ``{(topic, partition): (start, available)}``
    (the topic was deleted and recreated, or its log truncated; invariant 1)."""
    s, a = flatten(start), flatten(available)
    return {tp: (s[tp], a[tp]) for tp in sorted(s) if tp in a and a[tp] < s[tp]}


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


def backlog(start: Mapping[str, Mapping[str, int]], available: Mapping[str, Mapping[str, int]]) -> int:
    """Offsets available beyond ``start`` over all partitions (a partition absent from ``start`` from 0)."""
    s, a = flatten(start), flatten(available)
    return sum(max(0, a[tp] - s.get(tp, 0)) for tp in a)


def delay_batch(start: Mapping[str, Mapping[str, int]], available: Mapping[str, Mapping[str, int]],
                min_rows: Optional[int], since_last_batch_ms: float, max_delay_ms: int) -> bool:
    """Whether to hold the next batch back (``minOffsetsPerTrigger``, ``maxTriggerDelay``; invariant 4)."""
    if not min_rows or since_last_batch_ms >= max_delay_ms:
        return False
    return backlog(start, available) < min_rows


def _pieces(sizes: list[int], min_partitions: int) -> list[int]:
    """How many pieces each range is cut into: ``min(min_partitions, sum(sizes))`` in all, at least one and
    at most its size per range, handed out one at a time to the range whose pieces are largest (ties: the
    earlier range), so the counts follow the sizes."""
    counts = [1] * len(sizes)
    heap = [(-n, i) for i, n in enumerate(sizes) if n > 1]
    heapq.heapify(heap)
    for _ in range(min(min_partitions, sum(sizes)) - len(sizes)):
        if not heap:
            break
        _, i = heapq.heappop(heap)
        counts[i] += 1
        if counts[i] < sizes[i]:
            heapq.heappush(heap, (-sizes[i] / counts[i], i))
    return counts


def plan_splits(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]],
                min_partitions: Optional[int] = None) -> list[KafkaSplit]:
    """The splits of ``[start, end)``, sorted: one per topic-partition with ``start < end``, or with
    ``min_partitions`` and fewer partitions with data than that, contiguous pieces of them (invariant 3)."""
    s, e = flatten(start), flatten(end)
    ranges = []
    for (t, p), stop in sorted(e.items()):
        begin = s.get((t, p), 0)
        if begin < stop:
            ranges.append(KafkaSplit(t, p, begin, stop))
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    splits = []
    for r, n in zip(ranges, _pieces([r.size for r in ranges], min_partitions)):
        base, extra = divmod(r.size, n)
        at = r.start
        for i in range(n):
            size = base + (1 if i < extra else 0)
            splits.append(KafkaSplit(r.topic, r.partition, at, at + size))
            at += size
    return splits
