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
}


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
            librdkafka_config(cfg, what=SINK)  # every setting must have a librdkafka counterpart
        if guarantee is Guarantee.EXACTLY_ONCE:
            if cfg.get("enable_idempotence") is False:
                raise ConfigurationError(f"{SINK}: kafka.enable.idempotence=false cannot be exactly-once; drop it "
                                         "or set guarantee=at-least-once")
            if str(cfg.get("acks", "all")) not in ("all", "-1"):
                raise ConfigurationError(f"{SINK}: kafka.acks must be 'all' for exactly-once (got {cfg['acks']!r})")
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
                   columns=tuple(names), s3=s3_config_from(o), client=o["kafkaClient"])

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
