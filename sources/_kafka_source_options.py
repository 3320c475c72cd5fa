"""The Kafka source's options and output schema: the options of Spark's Kafka source that apply, parsed and
checked in one place into :class:`KafkaSourceOptions` (refused early, the option named; the consumers' settings for
kafka-python and librdkafka), and the Arrow / Spark schema of the rows it reads. Its one concern: what the user
asked for; no client is created here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import json
import logging
import re
from typing import Any, Mapping, Optional
import uuid

import pyarrow as pa

from twophase._kafka import CLIENTS, kafka_python_config, librdkafka_config
from twophase._kafka_client_options import split_client_options as _split
from twophase._logging import get_logger
from twophase._redact import safe_repr
from twophase.errors import ConfigurationError, MissingDependencyError
from twophase.options import Option, parse_bool, parse_choice, parse_duration_ms, parse_positive_int, parse_options
from twophase.sources._kafka_offsets import (TIMESTAMP_STRATEGIES, EndByTimestamp, choose_start, parse_ending_offsets,
                                             parse_starting_offsets, parse_timestamp, parse_timestamps)

_log = get_logger('twophase.sources.kafka')  # the public module's logger name: users' log filters keep working


SOURCE = "twophase-kafka"

DEFAULT_POLL_TIMEOUT_MS = 120_000
#: Spark's default group id prefix (librdkafka needs a group.id; kafka-python goes without one)
DEFAULT_GROUP_ID_PREFIX = "spark-kafka-source"


def _parse_non_negative_int(value: str) -> int:
    n = int(str(value).strip())
    if n < 0:
        raise ValueError("must be >= 0")
    return n


SOURCE_OPTIONS: tuple[Option[Any], ...] = (
    Option("subscribe", str, help="comma-separated topics to read"),
    Option("subscribePattern", str, help="Java regex of the topics to read (matches whole names; __internal "
                                         "topics excluded); topics created later are read by later batches"),
    Option("assign", str, help='JSON of topic -> partitions, e.g. {"t": [0, 1]}'),
    Option("startingOffsets", str, help="earliest, latest (a stream's default; a batch read's is earliest), or "
                                        "JSON {topic: {partition: offset}} (-2 earliest, -1 latest)"),
    Option("startingTimestamp", str, help="start every partition at its first record at or after this time "
                                          "(ms since the epoch); wins over the other starting options"),
    Option("startingOffsetsByTimestamp", str, help="JSON {topic: {partition: ms}}: a start time per partition; "
                                                   "wins over startingOffsets"),
    Option("startingOffsetsByTimestampStrategy", parse_choice(*TIMESTAMP_STRATEGIES), "error",
           help="a partition with no record at or after its timestamp: error, or latest (its latest offset)"),
    Option("endingOffsets", str, help="batch reads (spark.read) only: latest (default) or JSON "
                                      "{topic: {partition: offset}} (-1 latest)"),
    Option("endingTimestamp", str, help="batch reads only: end every partition before its first record at or after "
                                        "this time (ms since the epoch; its latest offset if none); wins over the "
                                        "other ending options"),
    Option("endingOffsetsByTimestamp", str, help="batch reads only: JSON {topic: {partition: ms}}, an end time per "
                                                 "partition; wins over endingOffsets"),
    Option("failOnDataLoss", parse_bool, True,
           help="true: records deleted before they were read (retention, a recreated topic) fail the query; "
                "false: skip them with a WARNING kafka_records_lost naming them"),
    Option("maxOffsetsPerTrigger", parse_positive_int, help="at most this many offsets per micro-batch"),
    Option("minOffsetsPerTrigger", parse_positive_int,
           help="wait for at least this many offsets before a micro-batch (at most maxTriggerDelay)"),
    Option("maxTriggerDelay", parse_duration_ms, 900_000,
           help="with minOffsetsPerTrigger: the longest a batch waits for them (default 15m)"),
    Option("minPartitions", parse_positive_int,
           help="at least this many Spark partitions per batch: larger offset ranges are cut in pieces"),
    Option("includeHeaders", parse_bool, False, help="add the headers column (array<struct<key, value>>)"),
    Option("kafkaConsumer.pollTimeoutMs", parse_positive_int,
           help="give up reading a range after this long (default 120000)"),
    Option("pollTimeoutMs", parse_positive_int, help="the same as kafkaConsumer.pollTimeoutMs (Spark's name)"),
    Option("fetchOffset.numRetries", _parse_non_negative_int, 3,
           help="retries of a driver offset query that failed with a transient error"),
    Option("fetchOffset.retryIntervalMs", _parse_non_negative_int, 10,
           help="milliseconds between the retries of a driver offset query"),
    Option("groupIdPrefix", str, help="prefix of the generated group.id (ignored when kafka.group.id is set)"),
    Option("kafkaClient", parse_choice(*CLIENTS), "librdkafka",
           help="the executors' consumer: 'librdkafka' (confluent-kafka, the default; ~11x faster into Arrow) "
                "or 'kafka-python'"),
)

_RESERVED = {
    "enable.auto.commit": "the source tracks offsets itself; no consumer group is used",
    "auto.offset.reset": "use option 'startingOffsets'",
    "key.deserializer": "key and value are returned as binary; cast them in Spark",
    "value.deserializer": "key and value are returned as binary; cast them in Spark",
}

#: ``kafka.*`` names kafka-python's argument table does not list but :func:`twophase._kafka.kafka_python_config`
#: takes (mapped by it: JAAS, OAUTHBEARER / MSK IAM, PEM stores, bootstrap servers)
_MAPPED_NAMES = ("bootstrap.servers", "sasl.jaas.config", "sasl.login.callback.handler.class",
                 "sasl.client.callback.handler.class", "ssl.key.password")
_MAPPED_PREFIXES = ("sasl.oauthbearer.", "ssl.keystore.", "ssl.truststore.")
#: librdkafka consumer properties the source sets itself (its reader's contract), never the user's
_RDKAFKA_SOURCE_OWN = {
    "group.id": "use option 'kafka.group.id' or 'groupIdPrefix'",
    "enable.auto.offset.store": "the source tracks offsets itself; no consumer group is used",
    "enable.partition.eof": "the source's reader needs the end-of-partition events",
    "auto.offset.reset": "use option 'startingOffsets'",
}


def _kafka_python_takes(name: str, defaults: Mapping[str, Any]) -> bool:
    """Whether option ``kafka.<name>`` is one kafka-python's consumer settings (or twophase's mapping) take."""
    return (name in _MAPPED_NAMES or name.startswith(_MAPPED_PREFIXES) or name in _RESERVED
            or name.replace(".", "_") in defaults)


def split_client_options(kraw: Mapping[str, Any], defaults: Mapping[str, Any], client: str
                         ) -> tuple[dict[str, Any], dict[str, str]]:
    """``kafka.*`` options checked against the reader actually used (option kafkaClient): (the options kafka-python
    takes, for :func:`~twophase._kafka.kafka_python_config`; the librdkafka-only consumer properties, passed to the
    librdkafka reader as given).

    With kafkaClient=librdkafka, an option kafka-python does not know (``kafka.queued.min.messages``,
    ``kafka.fetch.wait.max.ms``) is taken when librdkafka takes it as a consumer property (asked of the installed
    library: name and value); it configures the executors' readers only (the driver's offset queries run on
    kafka-python). Refused, the option, the client and the fix named: a name or value librdkafka refuses, a
    producer property, a property the source sets itself, and librdkafka-only connection / security names (the
    driver's connections need them too: give their Spark names). With kafkaClient=kafka-python, an option
    kafka-python does not know is refused, and when librdkafka knows it the error says so (set
    kafkaClient=librdkafka)."""
    return _split(kraw, client, what=SOURCE, role="consumer",
                  kafka_python_takes=lambda n: _kafka_python_takes(n, defaults),
                  reserved_librdkafka=_RDKAFKA_SOURCE_OWN, driver_connections="kafka-python")


#: options of a stream only: a batch read (spark.read) ignores them, as Spark does, with a warning
_STREAM_ONLY = ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay")

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


def _topic_pattern(value: str) -> "re.Pattern[str]":
    """Option subscribePattern as a Python regex (Java's syntax for the common constructs); matched against
    whole topic names, as Java's ``Pattern.matcher(name).matches()``."""
    try:
        return re.compile(value)
    except re.error as e:
        raise ConfigurationError(f"{SOURCE}: option 'subscribePattern'={value!r} is not a valid regular expression "
                                 f"({e}); e.g. 'events-.*' reads every topic whose name starts with 'events-'") from None


@safe_repr
@dataclass(frozen=True)
class KafkaSourceOptions:
    """Validated options of the Kafka source; its repr masks secrets in ``consumer_config`` (:mod:`twophase._redact`)."""

    consumer_config: Mapping[str, Any]
    subscribe: tuple[str, ...] = ()
    assign: Optional[Mapping[str, tuple[int, ...]]] = None
    #: option subscribePattern (a regex matched against whole topic names)
    subscribe_pattern: Optional[str] = None
    #: "earliest", "latest", offsets JSON, or :class:`StartByTimestamp` (startingTimestamp, ...ByTimestamp)
    starting_offsets: Any = "latest"
    #: batch reads only: "latest" or offsets JSON (-1 latest)
    ending_offsets: Any = "latest"
    max_offsets_per_trigger: Optional[int] = None
    min_offsets_per_trigger: Optional[int] = None
    max_trigger_delay_ms: int = 900_000
    min_partitions: Optional[int] = None
    include_headers: bool = False
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    fail_on_data_loss: bool = True
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 10
    #: kafka.group.id, or groupIdPrefix plus a short uuid: given to both clients (None: kafka-python uses none)
    group_id: Optional[str] = None
    #: librdkafka's group.id (it needs one): :attr:`group_id`, or ``spark-kafka-source-<short uuid>``
    librdkafka_group_id: str = DEFAULT_GROUP_ID_PREFIX
    #: the executors' consumer library (option kafkaClient): "librdkafka" or "kafka-python"
    client: str = "librdkafka"
    #: a batch read (spark.read): startingOffsets defaults to earliest, endingOffsets applies
    batch: bool = False
    #: librdkafka-only consumer properties (``kafka.queued.min.messages``, ...) given with kafkaClient=librdkafka:
    #: the executors' librdkafka readers take them as given (:func:`split_client_options`)
    librdkafka_extra: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], *, batch: bool = False) -> "KafkaSourceOptions":
        """Validate Spark's option names (``batch=True`` for ``spark.read``); every problem is a
        :class:`ConfigurationError` naming the option and the fix."""
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
                                     "readStream takes subscribe, subscribePattern or assign")
        o = parse_options(raw, SOURCE_OPTIONS, sink=SOURCE, prefixes=("kafka.",))
        for common in ("sink.id", "guarantee", "log.location", "log.retain"):
            o.pop(common, None)
        kraw = {k: v for k, v in o.items() if k.startswith("kafka.")}
        if not str(kraw.get("kafka.bootstrap.servers") or "").strip():
            raise ConfigurationError(f"{SOURCE}: option 'kafka.bootstrap.servers' is required, e.g. "
                                     ".option('kafka.bootstrap.servers', 'host1:9092')")
        kraw, librdkafka_extra = split_client_options(kraw, KafkaConsumer.DEFAULT_CONFIG, o["kafkaClient"])
        cfg = kafka_python_config(kraw, KafkaConsumer.DEFAULT_CONFIG, what=SOURCE, reserved=_RESERVED)
        cfg.setdefault("isolation_level", "read_committed")
        if cfg["isolation_level"] not in ("read_committed", "read_uncommitted"):
            raise ConfigurationError(f"{SOURCE}: kafka.isolation.level must be read_committed or read_uncommitted")
        group_id, librdkafka_group_id = cls._group_ids(cfg.pop("group_id", None), o["groupIdPrefix"])
        if o["kafkaClient"] == "librdkafka":
            mapped = librdkafka_config(cfg, what=SOURCE, consumer=True)  # every setting needs a librdkafka counterpart
            for name, value in librdkafka_extra.items():
                if name in mapped and str(mapped[name]) != value:
                    from twophase._kafka import _RDKAFKA_CONSUMER_NAMES, _RDKAFKA_NAMES
                    spark = {v: k for k, v in {**_RDKAFKA_NAMES, **_RDKAFKA_CONSUMER_NAMES}.items()}.get(name)
                    other = f"kafka.{spark.replace('_', '.')}" if spark else "another kafka.* option"
                    raise ConfigurationError(f"{SOURCE}: options 'kafka.{name}' (librdkafka's name) and {other!r} "
                                             "(its Spark / kafka-python name) set the same librdkafka property to "
                                             f"different values ({value!r}, {mapped[name]!r}); give one of them")
        chosen = [k for k in ("subscribe", "subscribePattern", "assign") if o[k]]
        if len(chosen) != 1:
            raise ConfigurationError(f"{SOURCE}: give exactly one of options 'subscribe' (topics), 'subscribePattern' "
                                     "(a Java regex of topic names) or 'assign' (JSON topic -> partitions)"
                                     + (f"; got {chosen}" if chosen else ""))
        assign = None
        if o["assign"]:
            try:
                parsed = json.loads(o["assign"])
                assign = {str(t): tuple(sorted(int(p) for p in ps)) for t, ps in parsed.items()}
            except (ValueError, TypeError, AttributeError):
                raise ConfigurationError(f"{SOURCE}: option 'assign' must be JSON like {{\"topic\": [0, 1]}}") from None
        subscribe = tuple(t.strip() for t in (o["subscribe"] or "").split(",") if t.strip())
        if o["subscribePattern"]:
            _topic_pattern(o["subscribePattern"])
        for ending in ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp"):
            if not batch and o[ending] is not None:
                raise ConfigurationError(f"{SOURCE}: option {ending!r} is for batch reads (spark.read); a stream "
                                         "has no end: drop it, or run the stream with trigger(availableNow=True)")
        if batch:
            ignored = [k for k in _STREAM_ONLY if k.lower() in given]
            if ignored:
                _log.warning("kafka_stream_options_ignored", options=ignored,
                             reason="a batch read (spark.read) reads [startingOffsets, endingOffsets) at once")
        starting = parse_starting_offsets(o["startingOffsets"], batch=batch,
                                          default="earliest" if batch else "latest")
        start = choose_start(
            starting,
            timestamp=parse_timestamp(o["startingTimestamp"]) if o["startingTimestamp"] is not None else None,
            by_timestamp=(parse_timestamps(o["startingOffsetsByTimestamp"])
                          if o["startingOffsetsByTimestamp"] is not None else None),
            strategy=o["startingOffsetsByTimestampStrategy"])
        return cls(consumer_config=cfg, subscribe=subscribe, assign=assign, subscribe_pattern=o["subscribePattern"],
                   starting_offsets=start,
                   ending_offsets=cls._ending(o) if batch else "latest",
                   max_offsets_per_trigger=o["maxOffsetsPerTrigger"],
                   min_offsets_per_trigger=o["minOffsetsPerTrigger"], max_trigger_delay_ms=o["maxTriggerDelay"],
                   min_partitions=o["minPartitions"], include_headers=o["includeHeaders"],
                   poll_timeout_ms=cls._poll_timeout(o), fail_on_data_loss=o["failOnDataLoss"],
                   fetch_offset_retries=o["fetchOffset.numRetries"],
                   fetch_offset_retry_interval_ms=o["fetchOffset.retryIntervalMs"],
                   group_id=group_id, librdkafka_group_id=librdkafka_group_id, client=o["kafkaClient"], batch=batch,
                   librdkafka_extra=librdkafka_extra)

    @staticmethod
    def _ending(o: Mapping[str, Any]) -> Any:
        """The end of a batch read in Spark's precedence: endingTimestamp, endingOffsetsByTimestamp, endingOffsets."""
        if o["endingTimestamp"] is not None:
            return EndByTimestamp(all_partitions=parse_timestamp(o["endingTimestamp"], option="endingTimestamp"))
        if o["endingOffsetsByTimestamp"] is not None:
            return EndByTimestamp(per_partition=parse_timestamps(o["endingOffsetsByTimestamp"],
                                                                 option="endingOffsetsByTimestamp"))
        return parse_ending_offsets(o["endingOffsets"])

    @staticmethod
    def _poll_timeout(o: Mapping[str, Any]) -> int:
        spark_name, ours = o["kafkaConsumer.pollTimeoutMs"], o["pollTimeoutMs"]
        if spark_name is not None and ours is not None and spark_name != ours:
            raise ConfigurationError(f"{SOURCE}: options 'kafkaConsumer.pollTimeoutMs'={spark_name} and "
                                     f"'pollTimeoutMs'={ours} disagree; they are the same setting: give one")
        return spark_name or ours or DEFAULT_POLL_TIMEOUT_MS

    @staticmethod
    def _group_ids(given: Optional[str], prefix: Optional[str]) -> tuple[Optional[str], str]:
        """(group id for both clients or None, librdkafka's group id): kafka.group.id wins over groupIdPrefix,
        as in Spark; a prefix gets a short uuid, so two queries never share a generated id."""
        if given is not None:
            if not str(given).strip():
                raise ConfigurationError(f"{SOURCE}: option 'kafka.group.id' is empty; give a group id, or drop it")
            if prefix:
                _log.info("kafka_group_id_prefix_ignored", group_id=given, groupIdPrefix=prefix)
            return str(given).strip(), str(given).strip()
        suffix = uuid.uuid4().hex[:8]
        if prefix:
            gid = f"{prefix.strip()}-{suffix}"
            return gid, gid
        return None, f"{DEFAULT_GROUP_ID_PREFIX}-{suffix}"

    def connection_config(self) -> dict[str, Any]:
        """kafka-python consumer settings: no auto commit; group_id only when one was given (it names the
        consumer to the brokers; the source never joins the group nor commits to it)."""
        cfg = dict(self.consumer_config)
        cfg.update(enable_auto_commit=False, group_id=self.group_id)
        cfg.setdefault("bootstrap_timeout_ms", 15_000)
        return cfg

    def reader_config(self) -> dict[str, Any]:
        """kafka-python settings of an executor reader: an offset out of range raises (never a silent jump)."""
        cfg = self.connection_config()
        cfg.setdefault("max_partition_fetch_bytes", 8 << 20)
        cfg.setdefault("fetch_max_bytes", 64 << 20)
        cfg["auto_offset_reset"] = "none"
        return cfg

    def librdkafka_consumer_config(self) -> dict[str, Any]:
        """librdkafka consumer properties of an executor reader (see :class:`_RdKafkaPartition`)."""
        # applied in this order: the user's librdkafka-only properties before the mapped settings and the source's
        # own, so that a librdkafka alias (auto.commit.enable, ...) never overrides what those set
        return {**RDKAFKA_CONSUMER_DEFAULTS, **self.librdkafka_extra,
                **librdkafka_config(self.consumer_config, what=SOURCE, consumer=True), "group.id": self.librdkafka_group_id, "enable.auto.commit": False,
                "enable.auto.offset.store": False, "enable.partition.eof": True, "auto.offset.reset": "error",
                "logger": logging.getLogger(LIBRDKAFKA_LOGGER)}


#: librdkafka consumer defaults of the source (a ``kafka.*`` option overrides any of them).
#: ``queued.min.messages``: librdkafka (2.x) stops fetching a partition once 100,000 messages (its default) are
#: queued and waits ``fetch.queue.backoff.ms`` (1 s) before the next fetch; a reader draining the queue faster
#: than that then waits on the fetcher: 155,000 records/s per partition from Apache Kafka 4.4.0, 1.16-1.33 M/s
#: with 1,000,000 (bench/bench_kafka_read.py, docs/benchmarks.md). The queue stays bounded by
#: ``queued.max.messages.kbytes`` (64 MiB).
RDKAFKA_CONSUMER_DEFAULTS: dict[str, Any] = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 8 << 20,
                                             "queued.min.messages": 1_000_000}
#: the logger librdkafka's own log lines go to (served inside consume)
LIBRDKAFKA_LOGGER = "twophase.sources.kafka.librdkafka"
