"""Replayable Kafka source, usable without Spark (the embedded runtime) and by ``twophase.sinks.kafka_spark``.

- :class:`KafkaSourceOptions`: the options of Spark's Kafka source that apply (subscribe, subscribePattern
  or assign; startingOffsets, startingTimestamp, startingOffsetsByTimestamp[Strategy], endingOffsets of
  a batch read; failOnDataLoss, maxOffsetsPerTrigger, minOffsetsPerTrigger, maxTriggerDelay,
  minPartitions, includeHeaders, kafkaConsumer.pollTimeoutMs, fetchOffset.*, groupIdPrefix, kafka.*),
  validated in one place; ``kafka.isolation.level`` defaults to ``read_committed``.
- :class:`KafkaOffsetReader` (driver): partitions, initial offset, the next end offset.
- :class:`KafkaSplitReader` (executor): the records of one :class:`~twophase.sources._kafka_offsets.KafkaSplit`
  as Arrow record batches with the schema of Spark's Kafka source.

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
from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Optional, TypeVar

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
from twophase._redact import redact_error, redact_text
from twophase.errors import ConfigurationError, DataLossError, MissingDependencyError, TransientSinkError

_log = get_logger(__name__)

T = TypeVar("T")

if TYPE_CHECKING:  # loaded on first use (see _MOVED at the end)
    from twophase.sources._kafka_runtime import KafkaRuntimeSource, runtime_source  # noqa: F401


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
            return [(t, p) for t, ps in sorted(self.options.assign.items()) for p in ps]
        out = []
        if self.options.subscribe_pattern is not None:
            pattern = _topic_pattern(self.options.subscribe_pattern)
            topics = self._call("listing topics", lambda c: c.topics())
            for topic in sorted(t for t in topics if not t.startswith("__") and pattern.fullmatch(t)):
                parts = self._call(f"partitions of {topic}", lambda c: c.partitions_for_topic(topic))
                out.extend((topic, p) for p in sorted(parts or ()))
            return out
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


#: librdkafka consumer defaults of the source (a ``kafka.*`` option overrides any of them)


class _RdKafkaPartition:
    """One topic-partition read from ``start`` by a librdkafka consumer: assigned, no group membership, no
    offset commits (the offsets live in the job's checkpoint); its group.id is the options'
    (``kafka.group.id``, or generated).

    read_committed (the default) makes librdkafka drop aborted records and control records and report the
    end of the partition (``_PARTITION_EOF``) at the last stable offset. :attr:`next` is the offset after
    the last record returned, or the end-of-partition offset where that is higher (past control records and
    aborted data at the end), so reading again from :attr:`next` yields the records that follow, and a
    replay from the same start yields the same records (invariant 2). ``auto.offset.reset=error``: a start
    below the earliest retained record is a :class:`DataLossError`, never a silent jump (invariant 3);
    with ``failOnDataLoss=false`` the read goes on from the earliest record, with a ``kafka_records_lost``
    warning naming the skipped offsets.
    """

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int,
                 end: Optional[int] = None) -> None:
        from twophase._versions import require
        require("confluent-kafka", what=f"{SOURCE}'s default reader (or set option kafkaClient=kafka-python)")
        try:
            from confluent_kafka import Consumer, KafkaException
        except ImportError as e:
            raise MissingDependencyError(f"{SOURCE}'s default reader needs confluent-kafka: pip install "
                                         "'twophase[kafka]' (or set option kafkaClient=kafka-python)") from e
        self.options = options
        self.topic, self.partition, self.next, self.end = topic, partition, start, end
        #: the last poll reached the end of the partition's log at :attr:`next` (EOF, or an offset past the end)
        self.at_log_end = False
        cfg = options.librdkafka_consumer_config()
        where = f"{topic}-{partition}"
        try:
            self.consumer = Consumer(cfg)
        except Exception as e:
            raise ConfigurationError(f"{SOURCE}: cannot create a consumer for {where}: {type(e).__name__}: "
                                     f"{redact_error(e, cfg)}") from e
        try:
            low, _high = self.watermarks()
        except KafkaException as e:
            self.close()
            raise TransientSinkError(f"{SOURCE}: no earliest offset of {where} from kafka.bootstrap.servers="
                                     f"{cfg.get('bootstrap.servers')!r} within {self._timeout():g} s: "
                                     f"{redact_error(e, cfg)}") from e
        if low > start:
            if options.fail_on_data_loss:
                self.close()
                raise DataLossError(f"{SOURCE}: records {where} [{start}, {low}) were deleted (retention) before "
                                    "they were read (set failOnDataLoss=false to skip them with a warning)")
            self._skip_to(low, "deleted (retention, DeleteRecords) before they were read")
        self._assign(self.next)

    def _timeout(self) -> float:
        return self.options.consumer_config.get("bootstrap_timeout_ms", 15_000) / 1000

    def watermarks(self) -> tuple[int, int]:
        """(earliest offset, high watermark) of the partition, asked of the broker (not cached)."""
        from confluent_kafka import TopicPartition
        low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, self.partition),
                                                        timeout=self._timeout(), cached=False)
        return int(low), int(high)

    def _assign(self, offset: int) -> None:
        from confluent_kafka import TopicPartition
        self.consumer.assign([TopicPartition(self.topic, self.partition, offset)])

    def _skip_to(self, low: int, why: str) -> None:
        """failOnDataLoss=false: go on from ``low``, the earliest record left; the skipped offsets are named."""
        stop = low if self.end is None else min(low, self.end)
        records_lost(self.topic, self.partition, why, lost_start=self.next, lost_end=stop)
        self.next = low

    def poll(self, max_records: int, timeout: float) -> list[Any]:
        """Up to ``max_records`` data records (librdkafka ``Message``), in offset order; advances :attr:`next`."""
        from confluent_kafka import KafkaError
        out = []
        for m in self.consumer.consume(max_records, timeout):
            err = m.error()
            if err is None:
                out.append(m)
                self.at_log_end = False
                continue
            code = err.code()
            if code == KafkaError._PARTITION_EOF:  # after every record before it, in order
                self.next = max(self.next, m.offset())
                self.at_log_end = True
            elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                if self.options.fail_on_data_loss:
                    raise DataLossError(f"{SOURCE}: offset {self.next} of {self.topic}-{self.partition} is out of "
                                        f"range (records deleted by retention, or the topic recreated): {err.str()} "
                                        "(set failOnDataLoss=false to skip them with a warning)")
                self._out_of_range()
                return out
            elif err.fatal() or not err.retriable():
                raise TransientSinkError(f"{SOURCE}: reading {self.topic}-{self.partition} at {self.next}: {err.str()}")
            else:
                _log.debug("kafka_read_retriable_error", topic=self.topic, partition=self.partition, error=err.str())
        if out:
            self.next = max(self.next, out[-1].offset() + 1)
        return out

    def _out_of_range(self) -> None:
        """failOnDataLoss=false, :attr:`next` out of range: below the earliest record (deleted while reading)
        -> go on from there; past the end of the log (recreated, truncated) -> :attr:`at_log_end`."""
        low, _high = self.watermarks()
        if self.next < low:
            self._skip_to(low, "deleted (retention, DeleteRecords) while they were read")
            self._assign(self.next)
        elif self.end is None:  # an unbounded runtime split: the partition starts over
            records_lost(self.topic, self.partition, _PAST_THE_END + "; the partition is read again from its "
                         "earliest offset", recorded_start=self.next, restart_at=low)
            self.next = low
            self._assign(low)
        else:
            self.at_log_end = True

    def log_ends_before(self, end: int) -> bool:
        """At the end of the log below ``end``, and the broker's high watermark confirms offsets up to ``end``
        no longer exist (the topic was recreated, or its log truncated)."""
        return self.at_log_end and self.next < end and self.watermarks()[1] < end

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()


def _timestamp(kind: int, ts: int) -> tuple[Optional[int], int]:
    """librdkafka's (type, ms) -> Spark's (timestamp in us, timestampType: 0 CreateTime, 1 LogAppendTime)."""
    return (ts * 1000 if kind and ts >= 0 else None), (1 if kind == 2 else 0)


def _arrow_batch(msgs: list[Any], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """The source's Arrow batch of librdkafka messages: one column at a time, no per-row dicts."""
    n = len(msgs)
    ts = [_timestamp(*m.timestamp()) for m in msgs]
    cols: dict[str, Any] = {"key": [m.key() for m in msgs], "value": [m.value() for m in msgs],
                            "topic": [topic] * n, "partition": [partition] * n, "offset": [m.offset() for m in msgs],
                            "timestamp": [t for t, _k in ts], "timestampType": [k for _t, k in ts]}
    if "headers" in schema.names:
        cols["headers"] = [[{"key": k, "value": v} for k, v in (m.headers() or ())] for m in msgs]
    return pa.RecordBatch.from_pydict(cols, schema=schema)


_PAST_THE_END = "past the end of the partition's log (the topic was deleted and recreated, or its log truncated)"


class KafkaSplitReader:
    """Executor side: the records of one split as Arrow batches (invariants 2, 3), with librdkafka
    (option ``kafkaClient``, the default) or kafka-python."""

    def __init__(self, options: KafkaSourceOptions, *, batch_rows: int = 10_000) -> None:
        self.options = options
        self.batch_rows = batch_rows

    def read(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        if split.start >= split.end:
            return iter(())
        if self.options.client == "kafka-python":
            return self._read_kafka_python(split)
        return self._read_librdkafka(split)

    def _stopped(self, split: KafkaSplit, at: int) -> TransientSinkError:
        return TransientSinkError(f"{SOURCE}: reading {split.topic}-{split.partition} [{split.start}, {split.end}) "
                                  f"stopped at {at} after kafkaConsumer.pollTimeoutMs={self.options.poll_timeout_ms}")

    def _read_librdkafka(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        schema = arrow_schema(self.options.include_headers)
        part = _RdKafkaPartition(self.options, split.topic, split.partition, split.start, split.end)
        try:
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            while part.next < split.end:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._stopped(split, part.next)
                # no more records than offsets left: a short split returns once they are in, not after the timeout
                msgs = part.poll(min(self.batch_rows, split.end - part.next), min(1.0, left))
                if msgs and msgs[-1].offset() >= split.end:  # past the range: it is whole
                    msgs = [m for m in msgs if m.offset() < split.end]
                if msgs:
                    yield _arrow_batch(msgs, split.topic, split.partition, schema)
                elif not self.options.fail_on_data_loss and part.log_ends_before(split.end):
                    records_lost(split.topic, split.partition, _PAST_THE_END, lost_start=part.next,
                                 lost_end=split.end)
                    break
        finally:
            part.close()

    def _read_kafka_python(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        from kafka import TopicPartition
        import kafka.errors as Errors
        consumer = _consumer(self.options.reader_config())
        tp = TopicPartition(split.topic, split.partition)
        schema = arrow_schema(self.options.include_headers)
        where = f"{split.topic}-{split.partition}"
        try:
            consumer.assign([tp])
            start = split.start
            earliest = consumer.beginning_offsets([tp])[tp]
            if earliest > start:
                if self.options.fail_on_data_loss:
                    raise DataLossError(f"{SOURCE}: records {where} [{start}, {earliest}) were deleted (retention) "
                                        "before this batch read them (set failOnDataLoss=false to skip them with a "
                                        "warning)")
                records_lost(split.topic, split.partition, "deleted (retention, DeleteRecords) before they were read",
                             lost_start=start, lost_end=min(earliest, split.end))
                start = earliest
                if start >= split.end:
                    return
            consumer.seek(tp, start)
            rows: dict[str, list[Any]] = {f.name: [] for f in schema}
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            while consumer.position(tp) < split.end:
                if time.monotonic() > deadline:
                    raise self._stopped(split, consumer.position(tp))
                try:
                    polled = consumer.poll(timeout_ms=1000, max_records=self.batch_rows)
                except Errors.OffsetOutOfRangeError:
                    if not self._out_of_range(consumer, tp, split):
                        break
                    continue
                records = polled.get(tp, ())
                for record in records:
                    if record.offset >= split.end:
                        break
                    self._append(rows, record)
                if len(rows["offset"]) >= self.batch_rows:
                    yield pa.RecordBatch.from_pydict(rows, schema=schema)
                    rows = {f.name: [] for f in schema}
                if rows["offset"] and rows["offset"][-1] >= split.end - 1:
                    break
                if not records and not self.options.fail_on_data_loss:
                    at = consumer.position(tp)
                    log_end = consumer.end_offsets([tp])[tp]
                    if at >= log_end and log_end < split.end:
                        records_lost(split.topic, split.partition, _PAST_THE_END, lost_start=at, lost_end=split.end)
                        break
            if rows["offset"]:
                yield pa.RecordBatch.from_pydict(rows, schema=schema)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

    def _out_of_range(self, consumer: Any, tp: Any, split: KafkaSplit) -> bool:
        """The fetch position went out of range while reading: DataLossError (failOnDataLoss=true), or go on
        from the earliest record (True) / stop at the end of a log that ends before the split (False)."""
        at = consumer.position(tp)
        where = f"{split.topic}-{split.partition}"
        if self.options.fail_on_data_loss:
            raise DataLossError(f"{SOURCE}: offset {at} of {where} is out of range (records deleted by retention, or "
                                "the topic recreated) (set failOnDataLoss=false to skip them with a warning)")
        earliest = consumer.beginning_offsets([tp])[tp]
        if at < earliest:
            records_lost(split.topic, split.partition, "deleted (retention, DeleteRecords) while they were read",
                         lost_start=at, lost_end=min(earliest, split.end))
            consumer.seek(tp, earliest)
            return True
        records_lost(split.topic, split.partition, _PAST_THE_END, lost_start=at, lost_end=split.end)
        return False

    def _append(self, rows: dict[str, list[Any]], record: Any) -> None:
        rows["key"].append(record.key)
        rows["value"].append(record.value)
        rows["topic"].append(record.topic)
        rows["partition"].append(record.partition)
        rows["offset"].append(record.offset)
        rows["timestamp"].append(int(record.timestamp) * 1000 if record.timestamp is not None and record.timestamp >= 0 else None)
        rows["timestampType"].append(int(record.timestamp_type or 0))
        if "headers" in rows:
            rows["headers"].append([{"key": k, "value": v} for k, v in (record.headers or [])])


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
        return KafkaSplitReader(self.options)

    def close(self) -> None:
        self.offsets.close()


# --------------------------------------------------------------------------- the embedded runtime
# in twophase.sources._kafka_runtime (it builds on this module, so it is loaded on first use)
_MOVED = dict.fromkeys(("KafkaRuntimeSource", "runtime_source", "_KafkaPartitionReader", "_RdKafkaPartitionReader"),
                       "twophase.sources._kafka_runtime")


def __getattr__(name: str) -> Any:
    """``twophase.sources.kafka.<name>`` keeps working for what moved to its own module."""
    if name in _MOVED:
        import importlib
        return getattr(importlib.import_module(_MOVED[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["KafkaSource", "KafkaSourceOptions", "KafkaOffsetReader", "KafkaSplitReader", "KafkaSplit",
           "arrow_schema", "SPARK_SCHEMA_DDL", "HEADERS_DDL", "flatten", "KafkaRuntimeSource", "runtime_source"]
