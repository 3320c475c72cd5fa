"""Replayable Kafka source, usable without Spark (the embedded runtime) and by ``twophase.sinks.kafka_spark``.

- :class:`KafkaSourceOptions`: the options of Spark's Kafka source that apply (subscribe or assign,
  startingOffsets, maxOffsetsPerTrigger, includeHeaders, kafka.*), validated in one place;
  ``kafka.isolation.level`` defaults to ``read_committed``.
- :class:`KafkaOffsetReader` (driver): partitions, initial offset, the next end offset.
- :class:`KafkaSplitReader` (executor): the records of one :class:`~twophase.sources._kafka_offsets.KafkaSplit`
  as Arrow record batches with the schema of Spark's Kafka source.

Invariants (``test_kafka_source_invN_*``):

1. The end offset of a batch is at most the last stable offset (read_committed) or the high
   watermark (read_uncommitted), so every record in ``[start, end)`` is decided when it is read.
2. :meth:`KafkaSplitReader.read` yields exactly the data records with offsets in ``[start, end)``,
   skipping control records and aborted transactions, the same records on every replay.
3. A range that cannot be read whole (records deleted by retention, a timeout) raises an error;
   it is never silently shortened. (The tests read past the end of a partition, and read a range
   whose first records the broker deleted after it was planned, as retention or DeleteRecords does.)
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

import pyarrow as pa

from twophase._kafka import kafka_python_config, librdkafka_config
from twophase.runtime.sources import Source
from twophase.sources._kafka_offsets import (KafkaSplit, Offsets, flatten, next_end, normalize, parse_starting_offsets,
                                    plan_splits, resolve_start)
from twophase._logging import get_logger
from twophase._redact import is_secret_name, redact_text, redact_values, safe_repr
from twophase.errors import ConfigurationError, DataLossError, MissingDependencyError, TransientSinkError
from twophase.options import Option, parse_bool, parse_positive_int, parse_options

_log = get_logger(__name__)

SOURCE = "twophase-kafka"

SOURCE_OPTIONS: tuple[Option[Any], ...] = (
    Option("subscribe", str, help="comma-separated topics to read"),
    Option("assign", str, help='JSON of topic -> partitions, e.g. {"t": [0, 1]}'),
    Option("startingOffsets", str, "latest", help="earliest, latest, or JSON {topic: {partition: offset}}"),
    Option("maxOffsetsPerTrigger", parse_positive_int, help="at most this many offsets per micro-batch"),
    Option("includeHeaders", parse_bool, False, help="add the headers column (array<struct<key, value>>)"),
    Option("pollTimeoutMs", parse_positive_int, 120_000, help="give up reading a range after this long"),
    Option("kafkaClient", lambda v: _parse_client(v), "librdkafka",
           help="the executors' consumer: 'librdkafka' (confluent-kafka, the default; ~11x faster into Arrow) "
                "or 'kafka-python'"),
)

#: option kafkaClient: the library the executors read with (the driver's offset queries use kafka-python)
CLIENTS = ("librdkafka", "kafka-python")


def _parse_client(value: str) -> str:
    v = str(value).strip().lower()
    if v not in CLIENTS:
        raise ValueError(f"expected one of {', '.join(CLIENTS)}")
    return v

_RESERVED = {
    "group.id": "the source tracks offsets itself (in Spark's checkpoint); no consumer group is used",
    "enable.auto.commit": "the source tracks offsets itself; no consumer group is used",
    "auto.offset.reset": "use option 'startingOffsets'",
    "key.deserializer": "key and value are returned as binary; cast them in Spark",
    "value.deserializer": "key and value are returned as binary; cast them in Spark",
}

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
])
HEADERS_FIELD = pa.field("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))

SPARK_SCHEMA_DDL = ("key binary, value binary, topic string, partition int, offset bigint, timestamp timestamp, "
                    "timestampType int")
HEADERS_DDL = "headers array<struct<key: string, value: binary>>"


def arrow_schema(include_headers: bool) -> pa.Schema:
    return ARROW_SCHEMA.append(HEADERS_FIELD) if include_headers else ARROW_SCHEMA


@safe_repr
@dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated options of the Kafka source; its repr masks secrets in ``consumer_config`` (:mod:`twophase._redact`)."""

    consumer_config: Mapping[str, Any]
    subscribe: tuple[str, ...] = ()
    assign: Optional[Mapping[str, tuple[int, ...]]] = None
    starting_offsets: Any = "latest"
    max_offsets_per_trigger: Optional[int] = None
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    #: the executors' consumer library (option kafkaClient): "librdkafka" or "kafka-python"
    client: str = "librdkafka"

    @classmethod
    def from_options(cls, raw: Mapping[str, Any]) -> "KafkaSourceOptions":
        from twophase._versions import require
        require("kafka-python", what=SOURCE)
        try:
            from kafka import KafkaConsumer
        except ImportError as e:  # pragma: no cover
            raise MissingDependencyError("twophase-kafka needs kafka-python: pip install 'twophase[kafka]'") from e
        sink_only = {"topic", "transactionalidprefix", "transactionalidattempts", "triggerinterval",
                     "prefixregistry", "commitparallelism", "guarantee", "sink.id", "log.location", "log.retain"}
        given = {str(k).lower() for k in raw}
        if given & sink_only:
            raise ConfigurationError(f"{SOURCE}: option(s) {sorted(given & sink_only)} are for writeStream; "
                                     "readStream takes subscribe or assign")
        o = parse_options(raw, SOURCE_OPTIONS, sink=SOURCE, prefixes=("kafka.",))
        for common in ("sink.id", "guarantee", "log.location", "log.retain"):
            o.pop(common, None)
        kraw = {k: v for k, v in o.items() if k.startswith("kafka.")}
        if not str(kraw.get("kafka.bootstrap.servers") or "").strip():
            raise ConfigurationError(f"{SOURCE}: option 'kafka.bootstrap.servers' is required, e.g. "
                                     ".option('kafka.bootstrap.servers', 'host1:9092')")
        cfg = kafka_python_config(kraw, KafkaConsumer.DEFAULT_CONFIG, what=SOURCE, reserved=_RESERVED)
        cfg.setdefault("isolation_level", "read_committed")
        if cfg["isolation_level"] not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(f"{SOURCE}: kafka.isolation.level must be read_committed or read_uncommitted")
        if o["kafkaClient"] == "librdkafka":
            librdkafka_config(cfg, what=SOURCE, consumer=True)  # every setting must have a librdkafka counterpart
        if bool(o["subscribe"]) == bool(o["assign"]):
            raise ConfigurationError(f"{SOURCE}: give exactly one of options 'subscribe' (topics) or 'assign' "
                                     "(JSON topic -> partitions)")
        assign = None
        if o["assign"]:
            try:
                parsed = json.loads(o["assign"])
                assign = {str(t): tuple(sorted(int(p) for p in ps)) for t, ps in parsed.items()}
            except (ValueError, TypeError, AttributeError):
                raise ConfigurationError(f"{SOURCE}: option 'assign' must be JSON like {{\"topic\": [0, 1]}}") from None
        subscribe = tuple(t.strip() for t in (o["subscribe"] or "").split(",") if t.strip())
        return cls(consumer_config=cfg, subscribe=subscribe, assign=assign,
                   starting_offsets=parse_starting_offsets(o["startingOffsets"]),
                   max_offsets_per_trigger=o["maxOffsetsPerTrigger"], include_headers=o["includeHeaders"],
                   poll_timeout_ms=o["pollTimeoutMs"], client=o["kafkaClient"])

    def connection_config(self) -> dict[str, Any]:
        cfg = dict(self.consumer_config)
        cfg.update(enable_auto_commit=False, group_id=None)
        cfg.setdefault("bootstrap_timeout_ms", 15_000)
        return cfg


def _consumer(cfg: Mapping[str, Any]) -> Any:
    from kafka import KafkaConsumer
    import kafka.errors as Errors
    try:
        return KafkaConsumer(**cfg)
    except (Errors.KafkaTimeoutError, Errors.KafkaConnectionError) as e:
        raise ConfigurationError(f"{SOURCE}: no Kafka broker answers at kafka.bootstrap.servers="
                                 f"{cfg.get('bootstrap_servers')!r}; check the address") from e


class KafkaOffsetReader:
    """Driver side: which partitions, where to start, how far the next batch goes (invariant 1)."""

    def __init__(self, options: KafkaSourceOptions) -> None:
        self.options = options
        self._consumer: Any = None

    @property
    def consumer(self) -> Any:
        if self._consumer is None:
            self._consumer = _consumer(self.options.connection_config())
        return self._consumer

    def close(self) -> None:
        if self._consumer is not None:
            with contextlib.suppress(Exception):
                self._consumer.close()
            self._consumer = None

    def topic_partitions(self) -> list[tuple[str, int]]:
        """The partitions read: the assigned ones, or every partition of the subscribed topics."""
        if self.options.assign is not None:
            return [(t, p) for t, ps in sorted(self.options.assign.items()) for p in ps]
        out = []
        deadline = time.monotonic() + 30
        for topic in self.options.subscribe:
            parts = self.consumer.partitions_for_topic(topic)
            while not parts and time.monotonic() < deadline:
                time.sleep(0.2)
                parts = self.consumer.partitions_for_topic(topic)
            if not parts:
                raise ConfigurationError(f"{SOURCE}: subscribed topic {topic!r} does not exist")
            out.extend((topic, p) for p in sorted(parts))
        return out

    def _offsets(self, which: str, tps: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        from kafka import TopicPartition
        parts = [TopicPartition(t, p) for t, p in tps]
        got = (self.consumer.beginning_offsets(parts) if which == "earliest" else self.consumer.end_offsets(parts))
        return {(tp.topic, tp.partition): int(o) for tp, o in got.items()}

    def available(self) -> Offsets:
        """The last stable offset (read_committed) or high watermark of every partition."""
        tps = self.topic_partitions()
        from twophase.sources._kafka_offsets import unflatten
        return unflatten(self._offsets("latest", tps))

    def initial_offset(self) -> Offsets:
        tps = self.topic_partitions()
        return resolve_start(self.options.starting_offsets, tps, self._offsets("earliest", tps),
                             self._offsets("latest", tps))

    def latest_offset(self, start: Mapping[str, Mapping[str, int]], limit: Optional[int] = None,
                      *, cap: Optional[Mapping[str, Mapping[str, int]]] = None) -> Offsets:
        """The end of the next batch from ``start``: everything available (up to ``cap``), at most ``limit`` offsets."""
        available = self.available() if cap is None else normalize(cap)
        return next_end(normalize(start), available, limit)

    @staticmethod
    def splits(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> list[KafkaSplit]:
        return plan_splits(normalize(start), normalize(end))


#: librdkafka consumer defaults of the source (a ``kafka.*`` option overrides any of them)
RDKAFKA_CONSUMER_DEFAULTS: dict[str, Any] = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 8 << 20}
#: the logger librdkafka's own log lines go to (served inside consume)
LIBRDKAFKA_LOGGER = "twophase.sources.kafka.librdkafka"


class _RdKafkaPartition:
    """One topic-partition read from ``start`` by a librdkafka consumer: assigned, no group membership, no
    offset commits (the offsets live in the job's checkpoint).

    read_committed (the default) makes librdkafka drop aborted records and control records and report the
    end of the partition (``_PARTITION_EOF``) at the last stable offset. :attr:`next` is the offset after
    the last record returned, or the end-of-partition offset where that is higher (past control records and
    aborted data at the end), so reading again from :attr:`next` yields the records that follow, and a
    replay from the same start yields the same records (invariant 2). ``auto.offset.reset=error``: a start
    below the earliest retained record is a :class:`DataLossError`, never a silent jump (invariant 3).
    """

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int) -> None:
        from twophase._versions import require
        require("confluent-kafka", what=f"{SOURCE}'s default reader (or set option kafkaClient=kafka-python)")
        try:
            from confluent_kafka import Consumer, KafkaException, TopicPartition
        except ImportError as e:
            raise MissingDependencyError(f"{SOURCE}'s default reader needs confluent-kafka: pip install "
                                         "'twophase[kafka]' (or set option kafkaClient=kafka-python)") from e
        self.topic, self.partition, self.next = topic, partition, start
        cfg = {**RDKAFKA_CONSUMER_DEFAULTS, **librdkafka_config(options.consumer_config, what=SOURCE, consumer=True),
               "group.id": "twophase-source", "enable.auto.commit": False, "enable.auto.offset.store": False,
               "enable.partition.eof": True, "auto.offset.reset": "error",
               "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}
        where = f"{topic}-{partition}"
        try:
            self.consumer = Consumer(cfg)
        except Exception as e:
            raise ConfigurationError(f"{SOURCE}: cannot create a consumer for {where}: {type(e).__name__}: "
                                     f"{_shown(e, cfg)}") from e
        timeout = options.consumer_config.get("bootstrap_timeout_ms", 15_000) / 1000
        try:
            low, _high = self.consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=timeout,
                                                             cached=False)
        except KafkaException as e:
            self.close()
            raise TransientSinkError(f"{SOURCE}: no earliest offset of {where} from kafka.bootstrap.servers="
                                     f"{cfg.get('bootstrap.servers')!r} within {timeout:g} s: {_shown(e, cfg)}") from e
        if low > start:
            self.close()
            raise DataLossError(f"{SOURCE}: records {where} [{start}, {low}) were deleted (retention) before "
                                "they were read")
        self.consumer.assign([TopicPartition(topic, partition, start)])

    def poll(self, max_records: int, timeout: float) -> list[Any]:
        """Up to ``max_records`` data records (librdkafka ``Message``), in offset order; advances :attr:`next`."""
        from confluent_kafka import KafkaError
        out = []
        for m in self.consumer.consume(max_records, timeout):
            err = m.error()
            if err is None:
                out.append(m)
                continue
            code = err.code()
            if code == KafkaError._PARTITION_EOF:
                self.next = max(self.next, m.offset())
            elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                raise DataLossError(f"{SOURCE}: offset {self.next} of {self.topic}-{self.partition} is out of "
                                    f"range (records deleted by retention, or the topic recreated): {err.str()}")
            elif err.fatal() or not err.retriable():
                raise TransientSinkError(f"{SOURCE}: reading {self.topic}-{self.partition} at {self.next}: {err.str()}")
            else:
                _log.debug("kafka_read_retriable_error", topic=self.topic, partition=self.partition, error=err.str())
        if out:
            self.next = max(self.next, out[-1].offset() + 1)
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()


def _shown(e: BaseException, cfg: Mapping[str, Any]) -> str:
    secrets = [v for k, v in cfg.items() if is_secret_name(k) and isinstance(v, str)]
    return redact_values(redact_text(str(e)), secrets)


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
                                  f"stopped at {at} after pollTimeoutMs={self.options.poll_timeout_ms}")

    def _read_librdkafka(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        schema = arrow_schema(self.options.include_headers)
        part = _RdKafkaPartition(self.options, split.topic, split.partition, split.start)
        try:
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            while part.next < split.end:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise self._stopped(split, part.next)
                msgs = part.poll(self.batch_rows, min(1.0, left))
                if msgs and msgs[-1].offset() >= split.end:  # past the range: it is whole
                    msgs = [m for m in msgs if m.offset() < split.end]
                if msgs:
                    yield _arrow_batch(msgs, split.topic, split.partition, schema)
        finally:
            part.close()

    def _read_kafka_python(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:
        from kafka import TopicPartition
        cfg = self.options.connection_config()
        cfg.setdefault("max_partition_fetch_bytes", 8 << 20)
        cfg.setdefault("fetch_max_bytes", 64 << 20)
        consumer = _consumer(cfg)
        tp = TopicPartition(split.topic, split.partition)
        schema = arrow_schema(self.options.include_headers)
        try:
            consumer.assign([tp])
            earliest = consumer.beginning_offsets([tp])[tp]
            if earliest > split.start:
                raise DataLossError(f"{SOURCE}: records {split.topic}-{split.partition} [{split.start}, {earliest}) "
                                    "were deleted (retention) before this batch read them")
            consumer.seek(tp, split.start)
            rows: dict[str, list[Any]] = {f.name: [] for f in schema}
            deadline = time.monotonic() + self.options.poll_timeout_ms / 1000
            while consumer.position(tp) < split.end:
                if time.monotonic() > deadline:
                    raise self._stopped(split, consumer.position(tp))
                polled = consumer.poll(timeout_ms=1000, max_records=self.batch_rows)
                for record in polled.get(tp, ()):
                    if record.offset >= split.end:
                        break
                    self._append(rows, record)
                if len(rows["offset"]) >= self.batch_rows:
                    yield pa.RecordBatch.from_pydict(rows, schema=schema)
                    rows = {f.name: [] for f in schema}
                if rows["offset"] and rows["offset"][-1] >= split.end - 1:
                    break
            if rows["offset"]:
                yield pa.RecordBatch.from_pydict(rows, schema=schema)
        finally:
            with contextlib.suppress(Exception):
                consumer.close()

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
        return self.offsets.splits(start, end)

    @staticmethod
    def splits_of(start: Mapping[str, Mapping[str, int]], end: Mapping[str, Mapping[str, int]]) -> list[KafkaSplit]:
        """The splits of ``[start, end)`` (no connection needed; the same on every replay)."""
        return plan_splits(normalize(start), normalize(end))

    def reader(self) -> KafkaSplitReader:
        return KafkaSplitReader(self.options)

    def close(self) -> None:
        self.offsets.close()


# --------------------------------------------------------------------------- the embedded runtime


class _KafkaPartitionReader:
    """A runtime split reader of one topic-partition (kafka-python, option ``kafkaClient=kafka-python``);
    its position is the next offset to read.

    read_committed by default, so aborted records and control records are skipped and reading stops at
    the last stable offset: a replay from a recorded position yields the same records (source invariant 1).
    """

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int,
                 end: Optional[int]) -> None:
        from kafka import TopicPartition
        self.tp = TopicPartition(topic, partition)
        self.end = end
        self.consumer = _consumer(self.options_config(options))
        self.consumer.assign([self.tp])
        earliest = self.consumer.beginning_offsets([self.tp])[self.tp]
        if earliest > start:
            raise DataLossError(f"{SOURCE}: records {topic}-{partition} [{start}, {earliest}) were deleted "
                                "(retention) before the job read them")
        self.consumer.seek(self.tp, start)
        self.pos = start

    @staticmethod
    def options_config(options: KafkaSourceOptions) -> dict[str, Any]:
        cfg = options.connection_config()
        cfg.setdefault("max_partition_fetch_bytes", 8 << 20)
        return cfg

    def read(self, max_records: int) -> Any:
        from twophase.runtime.sources import ReadResult
        if self.end is not None and self.pos >= self.end:
            return ReadResult([], True)
        records = self.consumer.poll(timeout_ms=100, max_records=max_records).get(self.tp, [])
        out = []
        for r in records:
            if self.end is not None and r.offset >= self.end:
                break
            out.append({"key": r.key, "value": r.value, "topic": r.topic, "partition": r.partition,
                        "offset": r.offset, "timestamp": r.timestamp, "headers": list(r.headers or [])})
        if len(out) < len(records):  # reached the bounded end
            self.pos = self.end
        else:  # past the records returned, and past aborted data and control records the consumer skipped
            self.pos = max(self.consumer.position(self.tp), out[-1]["offset"] + 1 if out else self.pos)
        if self.end is not None:
            self.pos = min(self.pos, self.end)
        return ReadResult(out, self.end is not None and self.pos >= self.end)

    def position(self) -> int:
        return self.pos

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.consumer.close()


class _RdKafkaPartitionReader:
    """The runtime split reader on librdkafka (the default): the same records and positions as
    :class:`_KafkaPartitionReader`; the position is :attr:`_RdKafkaPartition.next`, capped at the bounded end."""

    def __init__(self, options: KafkaSourceOptions, topic: str, partition: int, start: int,
                 end: Optional[int]) -> None:
        self.end = end
        self.part = _RdKafkaPartition(options, topic, partition, start)

    def read(self, max_records: int) -> Any:
        from twophase.runtime.sources import ReadResult
        if self.end is not None and self.part.next >= self.end:
            return ReadResult([], True)
        msgs = self.part.poll(max_records, 0.1)
        if self.end is not None and msgs and msgs[-1].offset() >= self.end:
            msgs = [m for m in msgs if m.offset() < self.end]
        out = [{"key": m.key(), "value": m.value(), "topic": m.topic(), "partition": m.partition(),
                "offset": m.offset(), "timestamp": m.timestamp()[1] if m.timestamp()[0] else None,
                "headers": list(m.headers() or ())} for m in msgs]
        return ReadResult(out, self.end is not None and self.position() >= self.end)

    def position(self) -> int:
        return self.part.next if self.end is None else min(self.part.next, self.end)

    def close(self) -> None:
        self.part.close()


class KafkaRuntimeSource(Source):
    """The same Kafka source for :mod:`twophase.runtime`: one split per topic-partition (``topic-partition``),
    the position is the next offset. ``bounded=True`` stops at the offsets available when the job first
    asks for its splits (like Spark's availableNow); otherwise the splits never finish."""

    def __init__(self, raw_options: Mapping[str, Any], *, bounded: bool = False) -> None:
        self.options = KafkaSourceOptions.from_options(raw_options)
        self.bounded = bounded
        self._start: Optional[Offsets] = None
        self._end: Optional[Offsets] = None

    def _plan(self) -> tuple[Offsets, Optional[Offsets]]:
        if self._start is None:
            reader = KafkaOffsetReader(self.options)
            try:
                self._start = reader.initial_offset()
                self._end = reader.available() if self.bounded else None
            finally:
                reader.close()
        return self._start, self._end

    def splits(self) -> list[str]:
        start, _ = self._plan()
        return [f"{t}-{p}" for t, ps in sorted(start.items()) for p in sorted(ps, key=int)]

    def open_reader(self, split_id: str, position: Optional[Any]) -> "_KafkaPartitionReader | _RdKafkaPartitionReader":
        start, end = self._plan()
        topic, _, part = split_id.rpartition("-")
        first = int(position) if position is not None else int(start[topic][part])
        last = int(end[topic][part]) if end is not None else None
        cls = _KafkaPartitionReader if self.options.client == "kafka-python" else _RdKafkaPartitionReader
        return cls(self.options, topic, int(part), first, last)


def runtime_source(raw_options: Mapping[str, Any], *, bounded: bool = False) -> KafkaRuntimeSource:
    """:class:`KafkaRuntimeSource` of ``raw_options`` (Spark's option names)."""
    return KafkaRuntimeSource(raw_options, bounded=bounded)


__all__ = ["KafkaSource", "KafkaSourceOptions", "KafkaOffsetReader", "KafkaSplitReader", "KafkaSplit",
           "arrow_schema", "SPARK_SCHEMA_DDL", "HEADERS_DDL", "flatten", "KafkaRuntimeSource", "runtime_source"]
