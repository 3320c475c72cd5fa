"""Replayable Kafka source, usable without Spark (the embedded runtime) and by ``twophase.sinks.kafka_spark``.

- :class:`KafkaSourceOptions`: the options of Spark's Kafka source that apply (subscribe, subscribePattern
  or assign; startingOffsets, startingTimestamp, startingOffsetsByTimestamp[Strategy], endingOffsets of
  a batch read; failOnDataLoss, maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay,
  minPartitions, includeHeaders, kafkaConsumer.pollTimeoutMs, fetchOffset.*, groupIdPrefix, kafka.*),
  validated in one place; ``kafka.isolation.level`` defaults to ``read_committed``.
- :class:`KafkaOffsetReader` (driver): partitions, initial offset, the next end offset.
- :class:`KafkaSplitReader` (executor): the records of one :class:`~twophase.sources._kafka_offsets.KafkaSplit`
  as Arrow record batches with the schema of Spark's Kafka source.

Files (one concern each; every name is importable from this module as before): this module holds the
driver (:class:`KafkaOffsetReader`, :class:`KafkaSource`) and the invariants; ``_kafka_source_options`` the
options and schemas; ``_kafka_offsets`` the offset arithmetic (no client); ``_kafka_split_reader`` the
executor's reader; ``_kafka_runtime`` the embedded runtime's adapter (:func:`runtime_source`).

No consumer group is joined and no offset is ever committed: the offsets live in the job's checkpoint.
``kafka.group.id`` (or ``groupIdPrefix``) only names the consumers to the brokers (ACLs on groups).

Invariants (``test_kafka_source_invN_*``):

1. The end offset of a batch is at most the last stable offset (read_committed) or the high
   watermark (read_uncommitted), so every record in ``[start, end)`` is decided when it is read.
2. :meth:`KafkaSplitReader.read` yields exactly the data records with offsets in ``[start, end)``,
   skipping control records and aborted transactions, the same records on every replay; a range cut
   anywhere (``minPartitions``: a boundary on a control record or an aborted record) yields, split by
   split, the same records as the whole range.
3. A range that cannot be read whole (records deleted by retention, a timeout) raises an error;
   it is never silently shortened. (The tests read past the end of a partition, and read a range
   whose first records the broker deleted after it was planned, as retention or DeleteRecords does.)
   With ``failOnDataLoss=false`` a range whose records were deleted is read from the earliest record
   left, and the lost offsets are named in a WARNING ``kafka_records_lost`` (topic, partition, range):
   never silent. The driver treats a partition whose end went below the recorded start the same way
   (an error naming it, or the warning and a restart from its earliest offset).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, TypeVar

import pyarrow as pa

from twophase.sources._kafka_offsets import (LATEST, delay_batch, EndByTimestamp, flatten, KafkaSplit, next_end,
                                             normalize, Offsets, plan_splits, regressed, resolve_start,
                                             resolve_start_by_timestamp, StartByTimestamp, timestamps_to_look_up,
                                             unflatten)
# the options and schema (re-exported: their public names were this module's)
from twophase.sources._kafka_source_options import (ARROW_SCHEMA, DEFAULT_GROUP_ID_PREFIX, DEFAULT_POLL_TIMEOUT_MS,
                                                    HEADERS_DDL, HEADERS_FIELD, KafkaSourceOptions, LIBRDKAFKA_LOGGER,
                                                    RDKAFKA_CONSUMER_DEFAULTS, SOURCE, SOURCE_OPTIONS,
                                                    SPARK_SCHEMA_DDL, _topic_pattern, arrow_schema)
from twophase._logging import get_logger
from twophase._redact import redact_text
from twophase.errors import ConfigurationError, DataLossError, TransientSinkError

_log = get_logger(__name__)

T = TypeVar("T")

if TYPE_CHECKING:  # loaded on first use (see _MOVED at the end)
    from twophase.sources._kafka_runtime import KafkaRuntimeSource, runtime_source  # noqa: F401
    from twophase.sources._kafka_split_reader import KafkaSplitReader


def _consumer(cfg: Mapping[str, Any]) -> Any:
    from kafka import KafkaConsumer
    from twophase.sinks._kafka_txn import bootstrapped
    return bootstrapped(KafkaConsumer, cfg)  # a refused login / TLS handshake is named, not "check the address"


def _transient(e: BaseException) -> bool:
    """A kafka-python error worth retrying (a timeout, a lost connection, a leader moving)."""
    import kafka.errors as Errors
    kinds = tuple(k for k in (getattr(Errors, n, None) for n in ("NoBrokersAvailable", "KafkaConnectionError",
                                                                   "KafkaTimeoutError")) if k is not None)
    if isinstance(e, kinds):
        return True
    return isinstance(e, Errors.KafkaError) and bool(getattr(e, "retriable", False))


def records_lost(topic: str, partition: int, reason: str, **fields: Any) -> None:
    """The WARNING of ``failOnDataLoss=false``, never silent: records of a partition are skipped. An
    executor names the lost range (``lost_start``, ``lost_end``: ``[lost_start, lost_end)``); the driver
    a partition it restarts (``recorded_start``, ``end_now``, ``restart_at``)."""
    _log.warning("kafka_records_lost", topic=topic, partition=partition, **fields, reason=reason,
                 option="failOnDataLoss=false")


class KafkaOffsetReader:
    """Driver side: which partitions, where to start, how far the next batch goes (invariant 1).

    Every query goes through :meth:`_call`, which retries transient errors ``fetchOffset.numRetries``
    times, ``fetchOffset.retryIntervalMs`` apart.
    """

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._consumer: Any = None
        self._hw_consumer: Any = None
        #: monotonic time of the last batch with data (minOffsetsPerTrigger); None: none yet, the first is not held
        self._last_batch: Optional[float] = None
        #: topics whose READ / DESCRIBE ACLs were checked (once each: _check_acls)
        self._acls_checked: set[str] = set()

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = _consumer(self.options.connection_config())
        return self._consumer

    def close(self) -> None:
        for c in (self._consumer, self._hw_consumer):
            if c is not None:
                with contextlib.suppress(Exception):
                    c.close()
        self._consumer = self._hw_consumer = None

    def _call(self, what: str, fn: Callable[[Any], T], *, consumer: Optional[Callable[[], Any]] = None) -> T:
        """``fn(consumer)``, retried on transient errors (options fetchOffset.numRetries, fetchOffset.retryIntervalMs)."""
        attempts = self.options.fetch_offset_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return fn(consumer() if consumer is not None else self.consumer)
            except Exception as e:
                if not _transient(e):
                    raise
                error = redact_text(f"{type(e).__name__}: {e}")
                if attempt == attempts:
                    raise TransientSinkError(
                        f"{SOURCE}: {what} failed {attempts} time(s) (fetchOffset.numRetries="
                        f"{self.options.fetch_offset_retries}, fetchOffset.retryIntervalMs="
                        f"{self.options.fetch_offset_retry_interval_ms}): {error}; check the brokers, or raise "
                        "those options if they are slow to answer") from e
                _log.warning("kafka_offset_fetch_retry", what=what, attempt=attempt, attempts=attempts, error=error)
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")  # pragma: no cover

    def topic_partitions(self) -> list[tuple[str, int]]:
        """The partitions read: the assigned ones, every partition of the subscribed topics, or of the topics
        whose whole name matches subscribePattern now (internal ``__`` topics excluded; none is fine: a
        topic created later is read from its first offset by a later batch)."""
        if self.options.assign is not None:
            self._check_acls(self.options.assign)
            return [(t, p) for t, ps in sorted(self.options.assign.items()) for p in ps]
        out = []
        if self.options.subscribe_pattern is not None:
            pattern = _topic_pattern(self.options.subscribe_pattern)
            topics = self._call("listing topics", lambda c: c.topics())
            matched = sorted(t for t in topics if not t.startswith("__") and pattern.fullmatch(t))
            self._check_acls(matched)
            for topic in matched:
                parts = self._call(f"partitions of {topic}", lambda c: c.partitions_for_topic(topic))
                out.extend((topic, p) for p in sorted(parts or ()))
            return out
        self._check_acls(self.options.subscribe)
        deadline = time.monotonic() + 30
        for topic in self.options.subscribe:
            parts = self._call(f"partitions of {topic}", lambda c: c.partitions_for_topic(topic))
            while not parts and time.monotonic() < deadline:
                time.sleep(0.2)
                parts = self._call(f"partitions of {topic}", lambda c: c.partitions_for_topic(topic))
            if not parts:
                raise ConfigurationError(f"{SOURCE}: subscribed topic {topic!r} does not exist")
            out.extend((topic, p) for p in sorted(parts))
        return out

    def _check_acls(self, topics: Iterable[str]) -> None:
        """Once per topic: READ and DESCRIBE allowed (sources/_kafka_acls.py), else a ConfigurationError naming them."""
        new = set(topics) - self._acls_checked
        if not new:
            return
        from twophase.sources._kafka_acls import check_source_acls
        bootstrap = ",".join(self.options.connection_config().get("bootstrap_servers") or ())
        self._call(f"ACLs of {sorted(new)}", lambda c: check_source_acls(c, new, bootstrap))
        self._acls_checked |= new

    def _offsets(self, which: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Earliest or latest (last stable offset with read_committed) offsets of ``tps``."""
        if not tps:
            return {}
        from kafka import TopicPartition
        parts = [TopicPartition(t, p) for t, p in tps]
        got = self._call(f"{which} offsets of {len(parts)} partition(s)",
                         lambda c: c.beginning_offsets(parts) if which == "earliest" else c.end_offsets(parts))
        return {(tp.topic, tp.partition): int(o) for tp, o in got.items()}

    def _high_watermarks(self, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """The high watermarks (read_uncommitted ends) of ``tps``: past the last stable offset, the offsets
        that exist (an open transaction's records are between the two)."""
        from kafka import TopicPartition

        def hw_consumer() -> Any:
            if self._hw_consumer is None:
                self._hw_consumer = _consumer({**self.options.connection_config(),
                                               "isolation_level": "read_uncommitted"})
            return self._hw_consumer
        parts = [TopicPartition(t, p) for t, p in tps]
        got = self._call(f"high watermarks of {len(parts)} partition(s)", lambda c: c.end_offsets(parts),
                         consumer=hw_consumer)
        return {(tp.topic, tp.partition): int(o) for tp, o in got.items()}

    def available(self) -> Offsets:
        """The last stable offset (read_committed) or high watermark of every partition."""
        return unflatten(self._offsets("latest", self.topic_partitions()))

    def initial_offset(self) -> Offsets:
        tps = self.topic_partitions()
        spec = self.options.starting_offsets
        if isinstance(spec, StartByTimestamp):
            return self._start_by_timestamp(spec, tps)
        return resolve_start(spec, tps, self._offsets("earliest", tps), self._offsets("latest", tps))

    def _start_by_timestamp(self, spec: StartByTimestamp, tps: list[tuple[str, int]]) -> Offsets:
        from kafka import TopicPartition
        timestamps = timestamps_to_look_up(spec, tps)
        query = {TopicPartition(t, p): ms for (t, p), ms in timestamps.items()}
        got = self._call(f"offsets for the times of {spec.option}", lambda c: c.offsets_for_times(query)) if query else {}
        found = {(tp.topic, tp.partition): (None if ot is None else int(ot.offset)) for tp, ot in got.items()}
        latest = self._offsets("latest", tps) if spec.strategy == "latest" else {}
        return resolve_start_by_timestamp(spec, timestamps, found, latest)

    def _end_by_timestamp(self, spec: EndByTimestamp, tps: list[tuple[str, int]],
                          latest: Mapping[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Each partition's first offset at or after its timestamp (its latest offset where there is none),
        never past the latest offset (with read_committed, the last stable offset)."""
        from kafka import TopicPartition
        timestamps = timestamps_to_look_up(spec, tps)
        query = {TopicPartition(t, p): ms for (t, p), ms in timestamps.items()}
        got = self._call(f"offsets for the times of {spec.option}", lambda c: c.offsets_for_times(query)) if query else {}
        found = {(tp.topic, tp.partition): (None if ot is None else int(ot.offset)) for tp, ot in got.items()}
        return {tp: latest[tp] if found.get(tp) is None else min(int(found[tp]), latest[tp]) for tp in tps}

    def ending_offset(self, start: Mapping[str, Mapping[str, int]]) -> Offsets:
        """The end of a batch read (options endingOffsets, endingTimestamp, endingOffsetsByTimestamp): the latest
        offsets, the JSON's (-1 latest; a partition the JSON leaves out ends at its latest offset), or the
        offsets at the timestamps. An end below the start is an error."""
        tps = self.topic_partitions()
        latest = self._offsets("latest", tps)
        spec = self.options.ending_offsets
        if isinstance(spec, EndByTimestamp):
            end = self._end_by_timestamp(spec, tps, latest)
        elif spec == "latest":
            end = latest
        else:
            unknown = [f"{t}-{p}" for t, parts in spec.items() for p in parts if (t, int(p)) not in set(tps)]
            if unknown:
                raise ConfigurationError(f"{SOURCE}: option 'endingOffsets' names partitions that are not "
                                         f"subscribed or do not exist: {unknown}")
            given = flatten(spec)
            end = {tp: latest[tp] if given.get(tp, LATEST) == LATEST else given[tp] for tp in tps}
            past = [f"{t}-{p}: {o} > {latest[(t, p)]}" for (t, p), o in sorted(end.items()) if o > latest[(t, p)]]
            if past:
                raise ConfigurationError(f"{SOURCE}: option 'endingOffsets' goes past the latest offset of {past} "
                                         "(with read_committed, the last stable offset); use -1 for the latest")
        s = flatten(normalize(start))
        below = [f"{t}-{p} ends at {o} before its start {s[(t, p)]}" for (t, p), o in sorted(end.items())
                 if (t, p) in s and o < s[(t, p)]]
        if below:
            raise ConfigurationError(f"{SOURCE}: the batch read's end is before its start: {below}; check "
                                     "startingOffsets and endingOffsets (or the topic was recreated)")
        return unflatten(end)

    def latest_offset(self, start: Mapping[str, Mapping[str, int]], limit: Optional[int] = None,
                      *, cap: Optional[Mapping[str, Mapping[str, int]]] = None,
                      min_rows: Optional[int] = None) -> Offsets:
        """The end of the next batch from ``start``: everything available (up to ``cap``), at most ``limit``
        offsets; ``start`` itself while fewer than ``min_rows`` are available and maxTriggerDelay has not
        passed since the last batch (:func:`delay_batch`). A partition whose end went below its start:
        :meth:`_lost_partitions`."""
        start = normalize(start)
        available = self.available() if cap is None else normalize(cap)
        resets = self._lost_partitions(start, available, refetch=cap is None)
        for (t, p) in resets:  # no range of these partitions in this batch: their end moves to the earliest offset
            available[t][str(p)] = start[t][str(p)]
        now = time.monotonic()
        since = float("inf") if self._last_batch is None else (now - self._last_batch) * 1000
        if not resets and delay_batch(start, available, min_rows, since, self.options.max_trigger_delay_ms):
            return start
        end = next_end(start, available, limit)
        for (t, p), earliest in resets.items():
            end[t][str(p)] = earliest
        if end != start:
            self._last_batch = now
        return end

    def _lost_partitions(self, start: Offsets, available: Offsets, *, refetch: bool) -> dict[tuple[str, int], int]:
        """Partitions whose end went below the recorded start, confirmed (re-fetched fetchOffset.numRetries
        times against a stale answer, then against the high watermark, since an open transaction keeps the
        last stable offset below offsets that exist): failOnDataLoss=true raises DataLossError naming them;
        false logs ``kafka_records_lost`` and returns ``{partition: earliest offset}`` to restart them from."""
        suspect = regressed(start, available)
        for _ in range(self.options.fetch_offset_retries if (suspect and refetch) else 0):
            time.sleep(self.options.fetch_offset_retry_interval_ms / 1000)
            suspect = regressed(start, self.available())
            if not suspect:
                return {}
        if not suspect:
            return {}
        hw = self._high_watermarks(list(suspect))
        lost = {tp: (s, hw.get(tp, a)) for tp, (s, a) in suspect.items() if hw.get(tp, a) < s}
        if not lost:
            return {}
        named = ", ".join(f"{t}-{p} (recorded start {s}, end now {e})" for (t, p), (s, e) in lost.items())
        why = "the topic was deleted and recreated, or its log truncated"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{SOURCE}: partition(s) {named}: the end offset went below the offset this query "
                                f"had reached ({why}); records may have been missed. Set failOnDataLoss=false to "
                                "restart such partitions from their earliest offset instead")
        earliest = self._offsets("earliest", list(lost))
        for (t, p), (s, e) in lost.items():
            records_lost(t, p, f"the end offset went below the recorded start ({why}); the partition is read again "
                         "from its earliest offset", recorded_start=s, end_now=e, restart_at=earliest[(t, p)])
        return earliest

    @staticmethod
    def splits(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]],
               min_partitions: Optional[int] = None) -> list[KafkaSplit]:
        return plan_splits(normalize(start), normalize(end), min_partitions)


class KafkaSource:
    """The plain-Python source: offsets on the driver, split readers on the executors."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self.offsets = KafkaOffsetReader(options)

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> "KafkaSource":
        return cls(KafkaSourceOptions.from_options(raw))

    def initial_offset(self) -> Offsets:
        return self.offsets.initial_offset()

    def latest_offset(self, start: Mapping[str, Mapping[str, int]], limit: Optional[int] = None) -> Offsets:
        lim = limit if limit is not None else self.options.max_offsets_per_trigger
        return self.offsets.latest_offset(start, lim)

    def splits(self, start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> list[KafkaSplit]:
        """The splits of ``[start, end)`` (option minPartitions applies)."""
        return self.splits_of(start, end, self.options.min_partitions)

    @staticmethod
    def splits_of(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]],
                  min_partitions: Optional[int] = None) -> list[KafkaSplit]:
        """The splits of ``[start, end)`` (no connection needed; the same on every replay)."""
        return plan_splits(normalize(start), normalize(end), min_partitions)

    def reader(self) -> KafkaSplitReader:
        from twophase.sources._kafka_split_reader import KafkaSplitReader
        return KafkaSplitReader(self.options)

    def close(self) -> None:
        self.offsets.close()


# --------------------------------------------------------------------------- the embedded runtime
# in twophase.sources._kafka_runtime and _kafka_split_reader (they build on this module: loaded on first use)
_MOVED = {
    **dict.fromkeys(("KafkaRuntimeSource", "runtime_source", "_KafkaPartitionReader", "_RdKafkaPartitionReader"),
                    "twophase.sources._kafka_runtime"),
    # the executor side (reads a split)
    **dict.fromkeys(("KafkaSplitReader", "_RdKafkaPartition", "_PAST_THE_END"), "twophase.sources._kafka_split_reader"),
}


def __getattr__(name: str) -> Any:
    """``twophase.sources.kafka.<name>`` keeps working for what moved to its own module."""
    if name in _MOVED:
        import importlib
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KafkaSource", "KafkaSourceOptions", "KafkaOffsetReader", "KafkaSplitReader", "KafkaSplit",
           "arrow_schema", "SPARK_SCHEMA_DDL", "HEADERS_DDL", "flatten", "KafkaRuntimeSource", "runtime_source"]
