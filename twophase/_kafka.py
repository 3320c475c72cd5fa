"""Spark-style ``kafka.*`` options to kafka-python keyword arguments (shared by the Kafka sink and source), and
those to librdkafka properties (the sink's default producer)."""

from __future__ import annotations

import re
from typing import Any, Mapping, Optional

from twophase._redact import MASK, is_secret_name, redact_text
from twophase.errors import ConfigurationError


def kafka_python_config(raw: Mapping[str, Any], defaults: Mapping[str, Any], *, what: str,
                        reserved: Mapping[str, str] = {}) -> dict[str, Any]:
    """Map ``kafka.a.b`` options to kafka-python ``a_b`` arguments, typed like ``defaults``.

    A key in ``reserved`` (``a.b`` -> why and what to use instead) or a key kafka-python does not
    know is a :class:`ConfigurationError` naming the option.
    """
    out: dict[str, Any] = {}
    jaas: Optional[str] = None
    for key, value in raw.items():
        if not key.startswith("kafka."):
            continue
        name = key[len("kafka."):]
        if name == "sasl.jaas.config":
            jaas = str(value)
            continue
        if name in reserved:
            raise ConfigurationError(f"{what}: option {key!r} cannot be set: {reserved[name]}")
        if name.startswith(("ssl.keystore.", "ssl.truststore.")):
            raise ConfigurationError(
                f"{what}: option {key!r}: JKS / PKCS12 key and trust stores are not read by twophase's Kafka clients; "
                "convert them to PEM files (keytool -importkeystore -deststoretype PKCS12, then openssl pkcs12) and give "
                "kafka.ssl.cafile (the CA certificates), kafka.ssl.certfile and kafka.ssl.keyfile (the client's "
                "certificate and key) and kafka.ssl.password (the key's password, if it is encrypted)")
        arg = name.replace(".", "_")
        if arg == "bootstrap_servers":
            out[arg] = [s.strip() for s in str(value).split(",") if s.strip()]
            continue
        if arg not in defaults:
            raise ConfigurationError(f"{what}: option {key!r} is not a kafka-python setting ({arg!r}); "
                                     "see kafka-python's KafkaProducer / KafkaConsumer for the settings they take")
        default = defaults.get(arg)
        try:
            if isinstance(default, bool):
                out[arg] = str(value).strip().lower() in ("true", "1", "yes")
            elif isinstance(default, int) or (default is None and arg.endswith(("_ms", "_bytes", "_size", "_records"))):
                out[arg] = int(str(value).strip())
            elif isinstance(default, float):
                out[arg] = float(value)
            else:
                out[arg] = str(value)
        except ValueError:
            shown = MASK if is_secret_name(key) else redact_text(repr(value))
            raise ConfigurationError(f"{what}: option {key!r}={shown} must be a number") from None
    if jaas is not None:
        _apply_jaas(out, jaas, what=what)
    return out


_JAAS = re.compile(r"\s*(?P<module>[\w.$]+)\s+(?:required|requisite|sufficient|optional)\b(?P<opts>.*?)\s*;?\s*", re.S)
_JAAS_OPTION = re.compile(r"""\s*(?P<name>\w+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))""", re.S)
_JAAS_MODULES = {"PlainLoginModule": "PLAIN", "ScramLoginModule": None}


def _apply_jaas(out: dict[str, Any], jaas: str, *, what: str) -> None:
    """``kafka.sasl.jaas.config`` (as Spark's Kafka source takes it) for the PLAIN and SCRAM login modules
    -> kafka-python's ``sasl_plain_username`` / ``sasl_plain_password``. Errors never show the value
    (it holds a password); see :mod:`twophase._redact`."""
    key = "kafka.sasl.jaas.config"
    m = _JAAS.fullmatch(jaas)
    opts: dict[str, str] = {}
    if m:
        rest = m.group("opts")
        while rest.strip():
            o = _JAAS_OPTION.match(rest)
            if o is None:
                m = None
                break
            opts[o.group("name")] = o.group("quoted").replace('\\"', '"') if o.group("quoted") is not None \
                else o.group("bare")
            rest = rest[o.end():]
    if m is None:
        raise ConfigurationError(f"{what}: option {key!r} is not a JAAS login module entry like "
                                 "'org.apache.kafka.common.security.plain.PlainLoginModule required "
                                 "username=\"...\" password=\"...\";' (value not shown: it holds a secret)")
    module = m.group("module").rsplit(".", 1)[-1]
    if module not in _JAAS_MODULES:
        raise ConfigurationError(f"{what}: option {key!r} names the login module {module!r}; kafka-python takes "
                                 "only PlainLoginModule or ScramLoginModule here (use kafka.sasl.mechanism and its "
                                 "own kafka.* settings for GSSAPI / OAUTHBEARER)")
    if "username" not in opts or "password" not in opts:
        raise ConfigurationError(f"{what}: option {key!r} needs username=\"...\" and password=\"...\"")
    for arg, value in (("sasl_plain_username", opts["username"]), ("sasl_plain_password", opts["password"])):
        if arg in out and out[arg] != value:
            raise ConfigurationError(f"{what}: options {key!r} and 'kafka.{arg.replace('_', '.')}' disagree; "
                                     "give one of them")
        out[arg] = value
    mechanism = _JAAS_MODULES[module]
    if mechanism is None and not str(out.get("sasl_mechanism") or "").upper().startswith("SCRAM-"):
        raise ConfigurationError(f"{what}: option {key!r} uses ScramLoginModule: set kafka.sasl.mechanism to "
                                 "SCRAM-SHA-256 or SCRAM-SHA-512")
    out.setdefault("sasl_mechanism", mechanism)


#: kafka-python producer argument -> librdkafka property (the names are Kafka's/Java's for almost all)
_RDKAFKA_NAMES = {
    "client_id": "client.id", "acks": "acks", "compression_type": "compression.type", "linger_ms": "linger.ms",
    "batch_size": "batch.size", "request_timeout_ms": "request.timeout.ms",
    "delivery_timeout_ms": "delivery.timeout.ms", "retries": "retries", "retry_backoff_ms": "retry.backoff.ms",
    "max_in_flight_requests_per_connection": "max.in.flight.requests.per.connection",
    "max_request_size": "message.max.bytes", "receive_buffer_bytes": "socket.receive.buffer.bytes",
    "send_buffer_bytes": "socket.send.buffer.bytes", "connections_max_idle_ms": "connections.max.idle.ms",
    "reconnect_backoff_ms": "reconnect.backoff.ms", "reconnect_backoff_max_ms": "reconnect.backoff.max.ms",
    "metadata_max_age_ms": "metadata.max.age.ms", "security_protocol": "security.protocol",
    "sasl_mechanism": "sasl.mechanisms", "sasl_plain_username": "sasl.username",
    "sasl_plain_password": "sasl.password", "sasl_kerberos_service_name": "sasl.kerberos.service.name",
    "ssl_cafile": "ssl.ca.location", "ssl_certfile": "ssl.certificate.location", "ssl_keyfile": "ssl.key.location",
    "ssl_password": "ssl.key.password", "ssl_crlfile": "ssl.crl.location", "ssl_ciphers": "ssl.cipher.suites",
    "enable_idempotence": "enable.idempotence",
}
#: settings only the driver's kafka-python connections use (bootstrap, topic checks); the producer ignores them
_DRIVER_ONLY = {"bootstrap_timeout_ms", "api_version", "allow_auto_create_topics", "max_block_ms", "client_dns_lookup"}


def librdkafka_config(cfg: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    """The librdkafka (confluent-kafka) producer properties of validated kafka-python settings ``cfg``
    (what :func:`kafka_python_config` returned). A setting librdkafka has no counterpart for is a
    :class:`ConfigurationError` naming the option and ``kafkaClient=kafka-python``."""
    out: dict[str, Any] = {}
    for arg, value in cfg.items():
        if arg == "bootstrap_servers":
            out["bootstrap.servers"] = ",".join(value) if isinstance(value, (list, tuple)) else str(value)
        elif arg == "ssl_check_hostname":
            out["ssl.endpoint.identification.algorithm"] = "https" if value else "none"
        elif arg in _RDKAFKA_NAMES:
            out[_RDKAFKA_NAMES[arg]] = value
        elif arg in _DRIVER_ONLY or arg == "transaction_timeout_ms":
            continue
        else:
            raise ConfigurationError(f"{what}: option 'kafka.{arg.replace('_', '.')}' has no librdkafka counterpart "
                                     "in twophase; drop it, or set option kafkaClient=kafka-python")
    return out
