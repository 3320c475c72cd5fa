"""The Kafka sink's options: ``.option(...)``s parsed and checked into :class:`KafkaSinkOptions` (the producer's settings
in kafka-python's names, the transaction timeout, the id prefix, the log and prefix registry's places), refused
early with the option named. Its one concern: what the user asked for; the invariants the options serve are stated
in :mod:`twophase.sinks.kafka`."""

from __future__ import annotations

from dataclasses import dataclass, field
import hashlib
import os
import re
from typing import Any, Mapping, Optional

from twophase._kafka import CLIENTS, kafka_python_config, librdkafka_config
from twophase._kafka_client_options import librdkafka_verdict, split_client_options as _split
from twophase._logging import get_logger
from twophase._redact import safe_repr
from twophase.errors import ConfigurationError
from twophase.log_s3 import S3_CLIENT_OPTIONS, S3Config, parse_s3_url, s3_config_from
from twophase.options import Option, parse_choice, parse_duration_ms, parse_positive_int, parse_options
from twophase.sink import Guarantee
from twophase.sinks._kafka_timeout import check_delivery_timeout, check_timeout_against_trigger

_log = get_logger('twophase.sinks.kafka')  # the public module's logger name: users' log filters keep working


SINK = "twophase-kafka"

#: default kafka.transaction.timeout.ms: 1 hour, as Flink (the broker's transaction.max.timeout.ms must allow it)
DEFAULT_TRANSACTION_TIMEOUT_MS = 3_600_000
#: invariant 5: where the prefix registry lives in the log's bucket when the log is on S3
S3_REGISTRY_PREFIX = "_twophase/kafka-prefixes"

#: Kafka settings the sink owns; setting them through kafka.* is an error that names the replacement
_RESERVED = {
    "transactional.id": "use option 'transactionalIdPrefix' (the sink derives one id per partition)",
    "key.serializer": "write a binary or string 'key' column",
    "value.serializer": "write a binary or string 'value' column",
    "partitioner": "the sink places keyed records as Spark's Kafka sink does (Java's murmur2; librdkafka's "
                   "murmur2_random); to choose partitions write a 'partition' column",
}

#: ``kafka.*`` names kafka-python's argument table does not list but :func:`twophase._kafka.kafka_python_config`
#: takes (mapped by it: JAAS, OAUTHBEARER / MSK IAM, PEM stores, bootstrap servers)
_MAPPED_NAMES = ("bootstrap.servers", "sasl.jaas.config", "sasl.login.callback.handler.class",
                 "sasl.client.callback.handler.class", "ssl.key.password")
_MAPPED_PREFIXES = ("sasl.oauthbearer.", "ssl.keystore.", "ssl.truststore.")
_STATS = "the sink reads the producer id and epoch from librdkafka's statistics and sets their interval itself"
_CALLBACKS = ("the sink registers its own callbacks and delivery reports (every record's report is counted before a "
              "transaction may commit)")
#: librdkafka producer properties the sink sets itself or whose value exactly-once depends on, under librdkafka's
#: own names and aliases (their kafka-python names, e.g. kafka.acks, kafka.retries, kafka.delivery.timeout.ms, are
#: taken and checked by :meth:`KafkaSinkOptions.from_options`): never the user's, whatever the guarantee
_RDKAFKA_SINK_OWN = {
    "request.required.acks": "librdkafka's name of acks; use option 'kafka.acks' (exactly-once needs acks=all, "
                             "which the sink checks)",
    "max.in.flight": "librdkafka's alias of max.in.flight.requests.per.connection; use option "
                     "'kafka.max.in.flight.requests.per.connection' (at most 5 for exactly-once, which the sink checks)",
    "message.timeout.ms": "librdkafka's name of delivery.timeout.ms; use option 'kafka.delivery.timeout.ms', which "
                          "the sink checks against kafka.transaction.timeout.ms (a record may not outlive its "
                          "transaction)",
    "message.send.max.retries": "librdkafka's name of retries; use option 'kafka.retries' (at least 1 for "
                                "exactly-once, which the sink checks)",
    "enable.gapless.guarantee": "the sink's transactional producer sets it (a gap fails the task's transaction, "
                                "which is aborted and retried)",
    "enable.sparse.connections": "the sink sets it to false (init_transactions takes ~6 ms instead of ~505 ms)",
    "statistics.interval.ms": _STATS,
    "stats_cb": _STATS,
    "delivery.report.only.error": _CALLBACKS,
    **{cb: _CALLBACKS for cb in ("dr_cb", "dr_msg_cb", "on_delivery", "error_cb", "throttle_cb", "log_cb", "logger",
                                 "oauth_cb", "oauthbearer_token_refresh_cb", "partitioner_cb", "opaque",
                                 "background_event_cb")},
    "default.topic.config": "give topic properties as kafka.<property> options",
    "transactional.id": _RESERVED["transactional.id"],
    "partitioner": _RESERVED["partitioner"],
}
#: librdkafka-only names of properties a kafka-python setting also sets (librdkafka's aliases): both given must agree
_RDKAFKA_ALIASES = {"queue.buffering.max.ms": "linger.ms", "compression.codec": "compression.type"}


def _kafka_python_takes(name: str, defaults: Mapping[str, Any]) -> bool:
    """Whether option ``kafka.<name>`` is one of kafka-python's producer settings (or twophase's mapping) takes."""
    return (name in _MAPPED_NAMES or name.startswith(_MAPPED_PREFIXES) or name in _RESERVED
            or name.replace(".", "_") in defaults)


def librdkafka_producer_verdict(name: str, value: str) -> Optional[str]:
    """What the installed librdkafka says of producer property ``name=value`` in a transactional producer (as the
    sink's): :func:`twophase._kafka_client_options.librdkafka_verdict`."""
    return librdkafka_verdict(name, value, "producer")


def split_client_options(kraw: Mapping[str, Any], defaults: Mapping[str, Any], client: str
                         ) -> tuple[dict[str, Any], dict[str, str]]:
    """``kafka.*`` options checked against the writer actually used (option kafkaClient): (the options kafka-python
    takes, for :func:`~twophase._kafka.kafka_python_config`; the librdkafka-only producer properties, given to the
    executors' librdkafka producers as given, before the mapped settings and the sink's own).

    With kafkaClient=librdkafka, an option kafka-python does not know (``kafka.queue.buffering.max.messages``,
    ``kafka.compression.codec``, ``kafka.batch.num.messages``) is taken when the installed librdkafka takes it as a
    property of a transactional producer (asked of a producer configured, never connected: name and value).
    Refused, naming the option, the client and the fix: the properties exactly-once depends on or the sink sets
    itself under any librdkafka name (:data:`_RDKAFKA_SINK_OWN`: acks, in-flight requests, delivery timeout,
    retries, gapless guarantee, sparse connections, statistics, partitioner, callbacks; refused with either
    client), librdkafka-only connection / security names (the driver's kafka-python connections need them: give the
    Spark name), a name or value librdkafka refuses, and a consumer property. With kafkaClient=kafka-python, an
    option kafka-python does not know is refused, and when librdkafka takes it the error says to set
    kafkaClient=librdkafka. No error shows the value of a secret-named option."""
    own = {k: v for k, v in _RDKAFKA_SINK_OWN.items() if k not in _RESERVED}
    return _split(kraw, client, what=SINK, role="producer", kafka_python_takes=lambda n: _kafka_python_takes(n, defaults),
                  reserved_any_client=own, driver_connections="kafka-python: EndTxn, fencing, topic checks")


def check_librdkafka_twins(extra: Mapping[str, str], mapped: Mapping[str, Any]) -> None:
    """A librdkafka-only option and the Spark / kafka-python option that sets the same librdkafka property (by the
    same name or an alias: ``kafka.queue.buffering.max.ms`` and ``kafka.linger.ms``) must agree: the one applied
    last would silently win."""
    from twophase._kafka import _RDKAFKA_NAMES
    spark = {v: k for k, v in _RDKAFKA_NAMES.items()}
    for name, value in extra.items():
        target = _RDKAFKA_ALIASES.get(name, name)
        if target not in mapped:
            continue
        theirs = mapped[target]
        if str(theirs).lower() != str(value).lower():
            other = f"kafka.{spark[target].replace('_', '.')}" if target in spark else "another kafka.* option"
            raise ConfigurationError(f"{SINK}: options 'kafka.{name}' (librdkafka's name) and {other!r} (its Spark / "
                                     f"kafka-python name) set the same librdkafka property to different values "
                                     f"({value!r}, {str(theirs)!r}); give one of them")


KAFKA_SINK_OPTIONS: tuple[Option[Any], ...] = (
    Option("topic", str, help="the topic to write to (or a 'topic' column in the stream)"),
    Option("transactionalIdPrefix", str, help="prefix of the producers' transactional ids; default: the sink id"),
    Option("transactionalIdAttempts", parse_positive_int, 8,
           help="transactional id slots per partition and generation: more than the attempts of one partition "
                "that can hold an open transaction at once (retries, speculative copies, a resubmitted stage)"),
    Option("triggerInterval", parse_duration_ms,
           help="the query's trigger interval (e.g. '10 seconds'); checked against kafka.transaction.timeout.ms"),
    Option("prefixRegistry", str, help="where queries claim transactional prefixes: a directory or s3://bucket/prefix. "
           "Default: s3://<bucket>/" + S3_REGISTRY_PREFIX + " when the log (checkpointLocation or log.location) is "
           "on S3, else $TWOPHASE_STATE_DIR/kafka-prefixes or ~/.twophase/kafka-prefixes, which is on the driver "
           "host's disk: on a cluster put the checkpoint or log on S3 or a shared filesystem, and this with it"),
    Option("commitParallelism", parse_positive_int, 8, help="threads committing the transactions of a checkpoint"),
    Option("kafkaClient", parse_choice(*CLIENTS), "librdkafka",
           help="the executors' producer: 'librdkafka' (confluent-kafka, the default) or 'kafka-python'"),
    # how to reach S3 for a log and prefix registry on S3 (as the twophase-s3 and twophase-delta sinks)
    *S3_CLIENT_OPTIONS,
)




def owner_key(checkpoint_location: str) -> str:
    """A checkpoint location as the same string on every host: a URI as given (no trailing ``/``), a
    local path made absolute (``os.path.abspath`` of ``s3://b/ck`` would depend on the working directory)."""
    if "://" in checkpoint_location:
        return checkpoint_location.rstrip("/")
    return os.path.abspath(checkpoint_location)


@safe_repr
@dataclass(frozen=True)
class KafkaSinkOptions:
    """Validated options of the Kafka sink (see :data:`KAFKA_SINK_OPTIONS` and any ``kafka.*``).

    Its repr masks secrets (SASL / SSL passwords in ``producer_config``, S3 keys): :mod:`twophase._redact`."""

    bootstrap_servers: tuple[str, ...]
    topic: Optional[str]
    producer_config: Mapping[str, Any]
    transactional_id_prefix: str
    attempt_slots: int = 8
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    #: False when the user gave no kafka.transaction.timeout.ms: the driver's start check then chooses the largest
    #: timeout the brokers accept, up to the 1-hour default, and pins it here before the sink reaches an executor
    transaction_timeout_explicit: bool = True
    trigger_interval_ms: Optional[int] = None
    sink_id: str = ""
    guarantee: Guarantee = Guarantee.EXACTLY_ONCE
    log_location: Optional[str] = None
    log_retain: int = 100
    owner: Optional[str] = None
    prefix_registry: Optional[str] = None
    commit_parallelism: int = 8
    columns: tuple[str, ...] = ()
    #: the executors' producer library (option kafkaClient): "librdkafka" or "kafka-python"
    client: str = "librdkafka"
    #: endpoint and credentials of a log / prefix registry on S3 (``s3.*`` options); its repr masks the secrets
    s3: S3Config = field(default_factory=S3Config)
    #: librdkafka-only producer properties (``kafka.queue.buffering.max.messages``, ``kafka.compression.codec``, ...)
    #: given with kafkaClient=librdkafka: the executors' producers take them as given, before the mapped settings
    #: and the sink's own (:func:`split_client_options`)
    librdkafka_extra: Mapping[str, str] = field(default_factory=dict)
    #: the spec of one batch write (:meth:`KafkaSink.write_job_spec`): its log's ids are runs, never re-run
    write_job: bool = False

    @classmethod
    def from_options(cls, raw: Mapping[str, Any], schema: Any = None) -> "KafkaSinkOptions":
        """Parse Spark's string options; ``schema`` (with ``.names`` / fields) checks the columns."""
        from twophase._versions import require
        require("kafka-python", what=SINK)
        from kafka import KafkaProducer
        source_only = {"subscribe", "assign", "subscribepattern", "startingoffsets", "maxoffsetspertrigger",
                       "includeheaders", "polltimeoutms", "endingoffsets"}
        given = {str(k).lower() for k in raw}
        if given & source_only:
            raise ConfigurationError(f"{SINK}: option(s) {sorted(given & source_only)} are for readStream, "
                                     "not writeStream")
        o = parse_options(raw, KAFKA_SINK_OPTIONS, sink=SINK, prefixes=("kafka.",))
        kraw = {k: v for k, v in o.items() if k.startswith("kafka.")}
        servers = kraw.get("kafka.bootstrap.servers")
        if not servers or not str(servers).strip():
            raise ConfigurationError(f"{SINK}: option 'kafka.bootstrap.servers' is required, e.g. "
                                     ".option('kafka.bootstrap.servers', 'host1:9092,host2:9092')")
        kraw, librdkafka_extra = split_client_options(kraw, KafkaProducer.DEFAULT_CONFIG, o["kafkaClient"])
        cfg = kafka_python_config(kraw, KafkaProducer.DEFAULT_CONFIG, what=SINK, reserved=_RESERVED)
        guarantee = Guarantee.parse(o["guarantee"])
        names = list(getattr(schema, "names", []) or [])
        if schema is not None:
            if "value" not in names:
                raise ConfigurationError(f"{SINK}: the stream needs a 'value' column (binary or string); "
                                         f"it has {', '.join(names)}")
            unknown = [c for c in names if c not in ("key", "value", "topic", "partition", "headers")]
            if unknown:  # Spark's Kafka sink ignores them too; said once, on the driver
                _log.warning("kafka_columns_not_written", columns=unknown,
                             hint="only key, value, topic, partition and headers are written to Kafka")
            if o["topic"] and "topic" in names:
                _log.info("kafka_topic_option_overrides_column", topic=o["topic"],
                          hint="as in Spark's Kafka sink, option 'topic' wins over the 'topic' column")
            if not o["topic"] and "topic" not in names:
                raise ConfigurationError(f"{SINK}: no topic: set .option('topic', 'name') or add a 'topic' column")
        elif not o["topic"]:
            raise ConfigurationError(f"{SINK}: option 'topic' is required (or a 'topic' column in the stream)")
        owner = o["checkpointlocation"]
        sink_id = o["sink.id"] or (
            "twophase-" + hashlib.sha1(owner_key(owner).encode()).hexdigest()[:12] if owner
            else f"twophase-{o['topic'] or 'multi'}")
        for key in ("prefixRegistry", "log.location"):
            where = o[key]
            if where and "://" in where and not where.startswith("file://"):
                parse_s3_url(where, option=key)  # a local path, file:// or s3://bucket/prefix
        prefix = o["transactionalIdPrefix"] or sink_id
        if not re.fullmatch(r"[A-Za-z0-9._\-]{1,200}", prefix):
            raise ConfigurationError(f"{SINK}: option 'transactionalIdPrefix'={prefix!r} may use only letters, "
                                     "digits, '.', '_' and '-' (at most 200 characters)")
        timeout_explicit = "transaction_timeout_ms" in cfg
        timeout = int(cfg.pop("transaction_timeout_ms", DEFAULT_TRANSACTION_TIMEOUT_MS))
        if o["kafkaClient"] == "librdkafka":
            mapped = librdkafka_config(cfg, what=SINK)  # every setting must have a librdkafka counterpart
            check_librdkafka_twins(librdkafka_extra, mapped)
        if guarantee is Guarantee.EXACTLY_ONCE:
            if cfg.get("enable_idempotence") is False:
                raise ConfigurationError(f"{SINK}: kafka.enable.idempotence=false cannot be exactly-once; drop it "
                                         "or set guarantee=at-least-once")
            if str(cfg.get("acks", "all")) not in ("all", "-1"):
                raise ConfigurationError(f"{SINK}: kafka.acks must be 'all' for exactly-once (got {cfg['acks']!r})")
            if int(cfg.get("retries", 1)) < 1:
                raise ConfigurationError(f"{SINK}: kafka.retries={cfg['retries']!r}: exactly-once's idempotent "
                                         "producer needs at least 1; drop it or set guarantee=at-least-once")
            if int(cfg.get("max_in_flight_requests_per_connection", 5)) > 5:
                raise ConfigurationError(f"{SINK}: kafka.max.in.flight.requests.per.connection="
                                         f"{cfg['max_in_flight_requests_per_connection']!r}: exactly-once's idempotent "
                                         "producer takes at most 5; drop it or set guarantee=at-least-once")
        interval = o["triggerInterval"]
        if interval is not None and guarantee is Guarantee.EXACTLY_ONCE and timeout_explicit:
            check_timeout_against_trigger(timeout, interval)
        if guarantee is Guarantee.EXACTLY_ONCE and timeout_explicit and "delivery_timeout_ms" in cfg:
            check_delivery_timeout(cfg["delivery_timeout_ms"], timeout)
        return cls(bootstrap_servers=tuple(cfg["bootstrap_servers"]), topic=o["topic"], producer_config=cfg,
                   transactional_id_prefix=prefix, attempt_slots=o["transactionalIdAttempts"],
                   transaction_timeout_ms=timeout, transaction_timeout_explicit=timeout_explicit,
                   trigger_interval_ms=interval, sink_id=sink_id,
                   guarantee=guarantee, log_location=o["log.location"], log_retain=o["log.retain"], owner=owner,
                   prefix_registry=o["prefixRegistry"], commit_parallelism=o["commitParallelism"],
                   columns=tuple(names), s3=s3_config_from(o), client=o["kafkaClient"],
                   librdkafka_extra=librdkafka_extra)

    def connection_config(self) -> dict[str, Any]:
        """The kafka-python settings that matter for a connection (security, timeouts, client id)."""
        keep = ("bootstrap_servers", "client_id", "security_protocol", "request_timeout_ms", "bootstrap_timeout_ms",
                "api_version", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password", "ssl_cafile",
                "ssl_certfile", "ssl_keyfile", "ssl_password", "ssl_check_hostname", "ssl_crlfile", "ssl_ciphers",
                "sasl_kerberos_service_name", "sasl_kerberos_domain_name", "connections_max_idle_ms",
                "retry_backoff_ms", "reconnect_backoff_ms", "reconnect_backoff_max_ms", "client_dns_lookup",
                # OAUTHBEARER (OIDC client credentials, MSK IAM): without it the driver's TxnClient had no token and
                # every EndTxn / InitProducerId failed ('sasl_oauth_token_provider must implement ...')
                "sasl_oauth_token_provider")
        cfg = {k: v for k, v in self.producer_config.items() if k in keep}
        cfg.setdefault("bootstrap_timeout_ms", 15_000)
        return cfg
